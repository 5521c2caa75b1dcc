// Starts the fauxqs SQS emulator on 127.0.0.1 only (its own CLI binds 0.0.0.0).
import { buildApp } from "fauxqs";

const app = buildApp({ logger: false });
await app.listen({ port: Number(process.env.FAUXQS_PORT ?? 4566), host: "127.0.0.1" });

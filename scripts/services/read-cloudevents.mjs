// Reads CloudEvents with the official CloudEvents JavaScript SDK (npm "cloudevents", pinned in
// package.json), as a consumer in another language would: stdin is a JSON array of messages
// {"headers": {...}, "body": "..."} in the HTTP binding (binary or structured mode); stdout is
// a JSON array with, for each, the event's attributes and data as the SDK read them, or the
// SDK's error. outboxtest's TestJavaScriptSDKReadsOurMessages runs it.
import { HTTP } from "cloudevents";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const out = JSON.parse(input).map(({ headers, body, body_base64 }) => {
  try {
    const ev = HTTP.toEvent({ headers, body: body_base64 === undefined ? body : Buffer.from(body_base64, "base64") });
    ev.validate();
    const { data, data_base64, ...attributes } = ev.toJSON();
    return { attributes, data: data === undefined ? null : data, data_base64: data_base64 ?? (Buffer.isBuffer(ev.data) ? ev.data.toString("base64") : null) };
  } catch (err) {
    return { error: String(err?.message ?? err) + " " + JSON.stringify(err?.errors ?? "") };
  }
});
process.stdout.write(JSON.stringify(out) + "\n");

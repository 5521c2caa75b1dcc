// Writes outboxtest/testdata/cloudevents-js.json: CloudEvents written by the official
// CloudEvents JavaScript SDK (npm "cloudevents", pinned in package.json), as the messages a
// foreign producer puts on a broker. The transport conformance suite (outboxtest) sends them
// through every transport and checks what the consumer gets.
//
// Regenerate (after scripts/services/up.sh installed node_modules):
//   node scripts/services/foreign-cloudevents.mjs > outboxtest/testdata/cloudevents-js.json
// outboxtest's TestForeignGoldenIsSDKOutput fails when the file and this script disagree.
//
// Every message is the SDK's own output (HTTP binding: binary or structured mode; Kafka
// binding: "ce_" headers), except where a comment says what was changed and why.
import { createRequire } from "node:module";
import { CloudEvent, HTTP, Kafka } from "cloudevents";

const sdkVersion = createRequire(import.meta.url)("cloudevents/package.json").version;

const order = {
  type: "shop.order.created",
  source: "/shop/orders",
  subject: "order-42",
  dataschema: "https://shop.example/schemas/order-created.json",
  partitionkey: "order-42",
  time: "2026-11-22T10:00:00.123Z",
  data: { order: 42, note: "crème brûlée" },
};

// Each message has its own id, so the suite can tell them apart.
const event = (id, attrs) => new CloudEvent({ ...order, id, ...attrs });

// The SDK leaves non-string header values (integer and boolean extensions) for the HTTP
// stack to print, and unset ones undefined; brokers carry strings.
const strings = (headers) =>
  Object.fromEntries(Object.entries(headers).filter(([, v]) => v !== undefined).map(([k, v]) => [k, String(v)]));

const binary = (ev) => {
  const m = HTTP.binary(ev);
  return { headers: strings(m.headers), body: m.body };
};
const structured = (ev) => {
  const m = HTTP.structured(ev);
  return { headers: strings(m.headers), body: m.body };
};

const messages = [];
const add = (name, about, m) => messages.push({ name, about, ...m });

add("http-binary", "HTTP binary mode: content-type \"application/json; charset=utf-8\", subject, dataschema, partitionkey",
  binary(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a01")));
add("http-structured", "HTTP structured mode: the whole event as JSON, data embedded",
  structured(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a02")));

// A legal id that is not a UUID; the same id from another source is another event.
add("http-binary-string-id", "binary mode, id \"order-42-created\" (not a UUID)",
  binary(event("order-42-created")));
add("http-structured-string-id", "structured mode, the same id and source as http-binary-string-id",
  structured(event("order-42-created")));
add("http-binary-string-id-other-source", "binary mode, the same id from source /shop/returns",
  binary(event("order-42-created", { source: "/shop/returns" })));
add("http-structured-string-id-other-source", "structured mode, the same id from source /shop/returns",
  structured(event("order-42-created", { source: "/shop/returns" })));

// A +json media type and extensions of other CloudEvents types than string.
const typed = { datacontenttype: "application/vnd.shop.order+json", retrycount: 3, urgent: true };
add("http-binary-typed-extensions", "binary mode, a +json content type, integer and boolean extensions",
  binary(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a03", typed)));
add("http-structured-typed-extensions", "structured mode, a +json datacontenttype, \"retrycount\":3 and \"urgent\":true",
  structured(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a04", typed)));

{
  const m = Kafka.binary(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a05"));
  // The Kafka binding writes the data as the record value and partitionkey also as the
  // record key; a broker message carries the value as its body.
  add("kafka-binary", "Kafka binding: \"ce_\" headers (ce_id, ce_type…), as several SDKs write them",
    { headers: strings(m.headers), body: JSON.stringify(m.value) });
}

{
  const { partitionkey, ...noKey } = order;
  const ev = new CloudEvent({ ...noKey, id: "5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a06" });
  const m = binary(ev);
  // Added: bare attributes next to the "ce-" ones, as tracing instrumentation (W3C trace
  // context propagators) and producers that set attributes by hand write them.
  m.headers.partitionkey = "order-7";
  m.headers.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  m.headers.tracestate = "congo=t61rcWkgMzE";
  add("http-binary-bare-extensions", "binary mode plus bare partitionkey, traceparent and tracestate", m);
}

{
  // Changed: the SDK writes time with upper-case T and Z; RFC 3339 allows lower case,
  // which other producers write.
  const lower = (t) => t.replace("T", "t").replace("Z", "z");
  const b = binary(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a07"));
  b.headers["ce-time"] = lower(b.headers["ce-time"]);
  add("http-binary-lowercase-time", "binary mode, ce-time in lower case (2026-11-22t10:00:00.123z)", b);
  const s = structured(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a08"));
  const doc = JSON.parse(s.body);
  doc.time = lower(doc.time);
  s.body = JSON.stringify(doc);
  add("http-structured-lowercase-time", "structured mode, time in lower case", s);
}

{
  // Changed: header names in canonical MIME case ("Ce-Id", "Content-Type"), as Go's
  // net/http and other clients that canonicalise header names send them on.
  const b = binary(event("5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a09"));
  const canonical = (k) => k.split("-").map((w) => w.charAt(0).toUpperCase() + w.slice(1)).join("-");
  b.headers = Object.fromEntries(Object.entries(b.headers).map(([k, v]) => [canonical(k), v]));
  add("http-binary-header-case", "binary mode, header names in canonical case (Ce-Id, Content-Type)", b);
}

{
  const note = { type: "shop.note.added", source: "/shop/notes", datacontenttype: "text/plain", data: "hello, world" };
  add("http-binary-text", "binary mode, text/plain data",
    binary(new CloudEvent({ ...note, id: "5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a10", time: order.time })));
  add("http-structured-text", "structured mode, text/plain data as a JSON string",
    structured(new CloudEvent({ ...note, id: "5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a11", time: order.time })));
  const bytes = new CloudEvent({ type: "shop.blob.stored", source: "/shop/blobs", id: "5f0b6a52-7d1e-4c3b-9a8f-2e6d4c1b0a12",
    time: order.time, datacontenttype: "application/octet-stream", data: Buffer.from([0, 1, 2, 254, 255]) });
  add("http-structured-base64", "structured mode, binary data as data_base64", structured(bytes));
}

process.stdout.write(JSON.stringify({
  generator: "scripts/services/foreign-cloudevents.mjs",
  sdk: `cloudevents@${sdkVersion} (npm)`,
  messages,
}, null, 2) + "\n");

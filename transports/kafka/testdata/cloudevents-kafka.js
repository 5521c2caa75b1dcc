// Reads Kafka records that txoutbox produced with the CloudEvents JavaScript SDK's Kafka
// binding, and writes one with it for txoutbox to read. Used by interop_test.go.
//
// stdin:  {"records": [{"key": "...", "headers": {"ce_id": "..."}, "value_base64": "..."}],
//          "write": {"id": "<uuid>", "type": "...", "partitionkey": "...", "data": {...}}}
// stdout: {"events": [<each record as the SDK reads it, validated>],
//          "written": {"key": "...", "headers": {...}, "value": "..."}}
"use strict";
const { Kafka, CloudEvent } = require("cloudevents");

let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const req = JSON.parse(input);
  const events = req.records.map((r) => {
    const value = Buffer.from(r.value_base64, "base64").toString("utf8");
    const event = Kafka.toEvent({ key: r.key, headers: r.headers, value, body: value });
    event.validate(); // throws on anything the spec forbids
    return JSON.parse(JSON.stringify(event));
  });
  const written = Kafka.binary(new CloudEvent({ source: "/js-sdk", datacontenttype: "application/json", ...req.write }));
  process.stdout.write(JSON.stringify({ events, written: { key: written.key, headers: written.headers, value: JSON.stringify(written.value) } }));
});

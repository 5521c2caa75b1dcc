// Interop check for the RabbitMQ transport: the official CloudEvents JavaScript SDK
// (npm "cloudevents") on one side, amqplib (an AMQP 0-9-1 client) on the wire, mapped as
// the CloudEvents AMQP binding says: attributes are application properties (0-9-1 headers)
// prefixed "cloudEvents_" (the spelling the binding says SHOULD be preferred), datacontenttype
// is the content-type property, data is the body.
//
//   node cloudevents-amqp.cjs read AMQP_URL QUEUE
//     takes one message from QUEUE, builds a CloudEvent from it with the SDK in strict
//     mode (which validates every attribute), acks it, prints the event as JSON.
//   node cloudevents-amqp.cjs write AMQP_URL EXCHANGE ROUTING_KEY ID
//     builds a CloudEvent with the SDK and publishes it (persistent, confirmed).
//
// The modules come from scripts/services/node_modules (NODE_PATH), installed by up.sh.
const amqp = require("amqplib");
const { CloudEvent } = require("cloudevents");

const prefix = "cloudEvents_";

async function read(url, queue) {
  const conn = await amqp.connect(url);
  try {
    const ch = await conn.createChannel();
    let msg = false;
    for (let i = 0; i < 200 && !msg; i++) {
      msg = await ch.get(queue, { noAck: false });
      if (!msg) await new Promise((r) => setTimeout(r, 50));
    }
    if (!msg) throw new Error(`no message in ${queue}`);
    const attrs = {};
    for (const [k, v] of Object.entries(msg.properties.headers || {})) {
      if (k.startsWith(prefix)) attrs[k.slice(prefix.length)] = v;
    }
    const type = msg.properties.contentType;
    if (type) attrs.datacontenttype = type;
    const data = type && type.startsWith("application/json") ? JSON.parse(msg.content.toString("utf8")) : msg.content;
    const event = new CloudEvent({ ...attrs, data }, true); // strict: throws on an invalid event
    ch.ack(msg);
    await ch.close();
    process.stdout.write(JSON.stringify(event.toJSON()) + "\n");
  } finally {
    await conn.close();
  }
}

async function write(url, exchange, key, id) {
  const event = new CloudEvent({
    id, type: "orders.placed", source: "/js-shop", partitionkey: "customer-js",
    datacontenttype: "application/json", data: { order_id: "js-1", note: "from JavaScript" },
  }, true);
  const headers = {};
  for (const [k, v] of Object.entries(event.toJSON())) {
    if (k !== "data" && k !== "data_base64" && k !== "datacontenttype") headers[prefix + k] = v;
  }
  const conn = await amqp.connect(url);
  try {
    const ch = await conn.createConfirmChannel();
    ch.publish(exchange, key, Buffer.from(JSON.stringify(event.data)), {
      headers, contentType: event.datacontenttype, messageId: event.id, persistent: true, mandatory: true,
    });
    await ch.waitForConfirms();
    await ch.close();
  } finally {
    await conn.close();
  }
}

const [mode, ...args] = process.argv.slice(2);
(mode === "read" ? read(...args) : mode === "write" ? write(...args) : Promise.reject(new Error(`unknown mode ${mode}`)))
  .catch((err) => { console.error(err.stack || String(err)); process.exit(1); });

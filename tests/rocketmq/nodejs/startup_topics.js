// Starts a Producer of the official Node.js client with N topics against chronomq's
// RocketMQ front and reports how long startup() took.  Usage:
//   node startup_topics.js <host:port> <N>
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
const endpoints = process.argv[2];
const n = Number(process.argv[3] || 9);
const topics = Array.from({ length: n }, (_, i) => `t${i}`);
const logger = {
  info() {}, debug() {},
  warn(...a) { if (process.env.ROCKETMQ_DEBUG) console.error('WARN', ...a); },
  error(...a) { if (process.env.ROCKETMQ_DEBUG) console.error('ERROR', ...a); },
};
async function main() {
  const producer = new Producer({ endpoints, logger, topics });
  const t0 = Date.now();
  const timer = setTimeout(() => {
    console.log(JSON.stringify({ topics: n, started: false, after_ms: Date.now() - t0 }));
    process.exit(3);
  }, 20000);
  await producer.startup();
  clearTimeout(timer);
  const sent = await producer.send({ topic: topics[n - 1], body: Buffer.from('x') });
  console.log(JSON.stringify({ topics: n, started: true, startup_ms: Date.now() - t0,
                               sent: sent.messageId }));
  await producer.shutdown();
  process.exit(0);
}
main().catch(e => { console.log(JSON.stringify({ topics: n, error: String(e) })); process.exit(2); });

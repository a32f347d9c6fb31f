// The official RocketMQ 5 Node.js client as a load generator for bench/bench_rocketmq.py.
// Usage: node bench/rocketmq_node.js <produce|consume> <host:port> <topic> <seconds>
// (the client is installed under tests/rocketmq/nodejs; the caller sets NODE_PATH).
// Prints {"count": N, "seconds": S}.
'use strict';

const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const [ mode, endpoints, topic, secondsText ] = process.argv.slice(2);
const seconds = Number(secondsText);
const quiet = { info() {}, debug() {}, warn() {}, error() {} };
const IN_FLIGHT = 256;

async function produce() {
  const producer = new Producer({ endpoints, logger: quiet, topics: [ topic ] });
  await producer.startup();
  const body = Buffer.alloc(200, 'x');
  const stopAt = Date.now() + seconds * 1000;
  const started = Date.now();
  let count = 0;
  async function lane() {
    while (Date.now() < stopAt) {
      await producer.send({ topic, body });
      count++;
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, lane));
  const elapsed = (Date.now() - started) / 1000;
  await producer.shutdown();
  return { count, seconds: elapsed };
}

async function consume() {
  const consumer = new SimpleConsumer({ endpoints, logger: quiet, consumerGroup: 'bench-node',
    awaitDuration: 1000, subscriptions: new Map([[ topic, '*' ]]) });
  await consumer.startup();
  const stopAt = Date.now() + seconds * 1000;
  const started = Date.now();
  let count = 0;
  async function lane() {
    while (Date.now() < stopAt) {
      const got = await consumer.receive(32, 30000);
      if (got.length === 0) return;
      await Promise.all(got.map(m => consumer.ack(m)));
      count += got.length;
    }
  }
  await Promise.all(Array.from({ length: 4 }, lane));
  const elapsed = (Date.now() - started) / 1000;
  await consumer.shutdown();
  return { count, seconds: elapsed };
}

(mode === 'produce' ? produce() : consume()).then(r => {
  console.log(JSON.stringify(r));
  process.exit(0);
}, err => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});

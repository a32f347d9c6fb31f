// Drives the official RocketMQ 5 Node.js client (rocketmq-client-nodejs) against chronomq's
// RocketMQ front.  Usage: node scenario.js <host:port> [--clock-on-stdin]
//
// With --clock-on-stdin the broker runs on a manual clock owned by the caller: where the
// scenario needs time to pass it prints {"advance_ms": N} and waits for a line on stdin.
// Without it, it waits in real time.  The last line printed is {"result": {...}}.
'use strict';

const readline = require('node:readline');
const { ConsumeResult, Producer, PushConsumer, SimpleConsumer } = require('rocketmq-client-nodejs');

const endpoints = process.argv[2];
const manualClock = process.argv.includes('--clock-on-stdin');
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const quiet = {
  info() {}, debug() {},
  warn(...args) { if (process.env.ROCKETMQ_DEBUG) console.error(...args); },
  error(...args) { if (process.env.ROCKETMQ_DEBUG) console.error(...args); },
};

async function advance(ms) {
  if (!manualClock) {
    await new Promise(resolve => setTimeout(resolve, ms));
    return;
  }
  console.log(JSON.stringify({ advance_ms: ms }));
  await lines.next();
}

function view(m) {
  return {
    id: m.messageId, body: m.body.toString(), tag: m.tag || '', keys: m.keys,
    attempt: m.deliveryAttempt, corrupted: Boolean(m.corrupted),
    deliveryTimestamp: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : 0,
  };
}

async function receiveAndAck(consumer, invisibleMs) {
  const got = await consumer.receive(16, invisibleMs);
  for (const m of got) await consumer.ack(m);
  return got.map(view);
}

async function main() {
  const topic = 'orders';
  const result = {};
  const producer = new Producer({ endpoints, logger: quiet, topics: [ topic ] });
  await producer.startup();
  const consumer = new SimpleConsumer({
    endpoints, logger: quiet, consumerGroup: 'node-workers', awaitDuration: 1000,
    subscriptions: new Map([[ topic, '*' ]]),
  });
  await consumer.startup();

  // a normal message: receive, change its invisible duration, ack
  const sent = await producer.send({ topic, tag: 'paid', keys: [ 'order-7' ],
    body: Buffer.from('hello from node') });
  result.sent = sent.messageId;
  const first = await consumer.receive(16, 30000);
  result.first = first.map(view);
  const handle = first[0].receiptHandle;
  await consumer.changeInvisibleDuration(first[0], 60000);
  result.handleChanged = first[0].receiptHandle !== handle;
  await consumer.ack(first[0]);

  // not acknowledged: back after its invisible duration, attempt 2
  const unacked = await producer.send({ topic, body: Buffer.from('not acked') });
  result.unacked = unacked.messageId;
  result.leased = (await consumer.receive(16, 10000)).map(view);
  await advance(11000);
  result.again = await receiveAndAck(consumer, 10000);

  // delayed one minute; a second delayed message is recalled
  const delayed = await producer.send({ topic, body: Buffer.from('one minute later'),
    delay: 60000 });
  const recalled = await producer.send({ topic, body: Buffer.from('never'), delay: 60000 });
  result.delayed = delayed.messageId;
  result.recallReturned = (await producer.recallMessage(topic, recalled.recallHandle))
    .messageId;
  result.recalled = recalled.messageId;
  result.early = (await consumer.receive(16, 30000)).map(view);
  await advance(75000);
  result.due = await receiveAndAck(consumer, 30000);
  result.afterwards = (await consumer.receive(16, 30000)).map(view);

  await consumer.shutdown();

  // a PushConsumer: the client receives (auto_renew) and acks for its listener
  const pushed = [];
  const push = new PushConsumer({
    endpoints, logger: quiet, consumerGroup: 'node-push',
    subscriptions: new Map([[ topic, '*' ]]),
    messageListener: {
      async consume(m) {
        pushed.push(view(m));
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await push.startup();
  result.pushSent = [];
  for (let i = 0; i < 10; i++) {
    result.pushSent.push((await producer.send({ topic, body: Buffer.from(`push ${i}`) }))
      .messageId);
  }
  const waitUntil = Date.now() + 30000;  // a bound, not a measurement
  while (pushed.filter(m => result.pushSent.includes(m.id)).length < 10 &&
         Date.now() < waitUntil) {
    await new Promise(resolve => setTimeout(resolve, 50));
  }
  await push.shutdown();
  result.pushed = pushed;

  await producer.shutdown();
  console.log(JSON.stringify({ result }));
}

main().then(() => process.exit(0), err => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});

// Node unit tests of web/jitter.js: the player's jitter buffer, underrun
// counting and position reporting, driven quantum by quantum as the
// AudioWorklet drives it (128 samples per render quantum).
import assert from "node:assert/strict";
import { test } from "node:test";

import { contextKey, JitterBuffer } from "../../gateway/web/jitter.js";

const RATE = 1000; // 1 sample per ms keeps the arithmetic readable
const QUANTUM = 128;
const A = contextKey(null);
const B = contextKey("b");

const tone = (n, value = 0.5) => new Float32Array(n).fill(value);

function run(buffer, quanta) {
  const outs = [];
  for (let i = 0; i < quanta; i++) {
    const out = new Float32Array(QUANTUM);
    buffer.render(out);
    outs.push(out);
  }
  return outs;
}

test("context keys tell null from the empty string", () => {
  assert.notEqual(contextKey(null), contextKey(""));
  assert.equal(contextKey(undefined), contextKey(null));
});

test("audio comes out in order, then silence", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 0 });
  // sample i holds i/256: exact in float32
  b.push(A, Float32Array.from({ length: 100 }, (_, i) => (i + 1) / 256));
  b.push(A, Float32Array.from({ length: 100 }, (_, i) => (i + 101) / 256));
  const [first, second] = run(b, 2);
  assert.equal(first[0], 1 / 256);
  assert.equal(first[127], 128 / 256);
  assert.equal(second[71], 200 / 256);
  assert.equal(second[72], 0);
  assert.equal(b.rendered, 200);
  assert.equal(b.clock, 256);
  assert.equal(b.buffered, 0);
});

test("playback waits for the start threshold while audio is owed", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 60 });
  b.setOwed(true);
  b.push(A, tone(40));
  run(b, 1);
  assert.equal(b.rendered, 0, "40 ms < 60 ms threshold: not started");
  b.push(A, tone(40));
  run(b, 1);
  assert.equal(b.rendered, 80);
});

test("nothing owed: a short tail plays at once", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 60 });
  b.push(A, tone(20));
  run(b, 1);
  assert.equal(b.rendered, 20);
  assert.equal(b.underruns, 0);
});

test("a synthetic gap mid-sentence counts one underrun and its starved time", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 0 });
  b.setOwed(true); // audio.start: a sentence is open
  b.push(A, tone(200));
  run(b, 2); // 200 played, runs dry inside the second quantum
  assert.equal(b.underruns, 1);
  run(b, 3); // the gap goes on: still one underrun, more starved time
  assert.equal(b.underruns, 1);
  assert.equal(b.starvedSamples, 256 - 200 + 3 * QUANTUM);
  b.push(A, tone(300)); // the stream resumes
  run(b, 2);
  assert.equal(b.underruns, 1);
  b.setOwed(false); // audio.done: the sentence is closed
  run(b, 3);
  assert.equal(b.underruns, 1, "running dry after the sentence is not an underrun");
  assert.equal(b.rendered, 500);
});

test("waiting for the first audio is not an underrun", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 40 });
  b.setOwed(true);
  run(b, 10);
  assert.equal(b.underruns, 0);
  assert.equal(b.starvedSamples, 0);
});

test("a second gap is a second underrun", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 0 });
  b.setOwed(true);
  for (let i = 0; i < 2; i++) {
    b.push(A, tone(64));
    run(b, 2);
  }
  assert.equal(b.underruns, 2);
});

test("positions: played_ms per context, monotonic, discarded audio counts as consumed", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 0 });
  b.push(A, tone(100), 0, 0);
  b.push(B, tone(100), 0, 0);
  b.push(A, tone(100), 1, 0);
  run(b, 1); // 100 of A, 28 of B
  assert.equal(b.playedMs(A), 100);
  assert.equal(b.playedMs(B), 28);
  assert.deepEqual(b.head, { key: B, utterance: 0, offset: 28 });
  const { heard, discarded } = b.cancel(A);
  assert.deepEqual(heard, { [A]: 100, [B]: 28 }, "what was heard, for the report before cancel");
  assert.deepEqual(discarded, { [A]: 100 });
  assert.equal(b.playedMs(A), 200, "the discarded utterance counts as consumed");
  b.discard(A, 40); // a frame that arrived after the cancel
  assert.equal(b.playedMs(A), 240);
  run(b, 1);
  assert.equal(b.playedMs(B), 100, "the other context plays on");
  b.forget(A);
  assert.equal(b.playedMs(A), 0);
});

test("cancel silences at once: no sample of the context after it", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 0 });
  b.setOwed(true);
  b.push(A, tone(1000));
  run(b, 2);
  b.cancel(null);
  const before = b.nonSilent;
  const outs = run(b, 5);
  assert.equal(b.nonSilent, before);
  assert.ok(outs.every((o) => o.every((x) => x === 0)));
  assert.equal(b.underruns, 0, "a cancel is not an underrun");
  assert.deepEqual(b.lastCancel, { clock: 256, nonSilent: 256 });
});

test("the head tracks the utterance offset for word highlighting", () => {
  const b = new JitterBuffer({ sampleRate: RATE, startThresholdMs: 0 });
  b.push(A, tone(100), 3, 500); // the second sentence of utterance 3 starts at 500 ms
  run(b, 1);
  assert.deepEqual(b.head, { key: A, utterance: 3, offset: 600 });
});

// Node unit tests of web/client.js against a scripted fake WebSocket: the
// subprotocol key, config round trips, frame routing, reconnect (text in
// flight fails, never re-sent) and a clean close.
import assert from "node:assert/strict";
import { test } from "node:test";

import { backoffDelay, lowLatencyConfig, TtsClient } from "../../gateway/web/client.js";

class FakeSocket {
  static instances = [];
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.sent = [];
    this.readyState = 1;
    FakeSocket.instances.push(this);
  }
  send(data) {
    this.sent.push(JSON.parse(data));
    if (this.autoClose && JSON.parse(data).type === "session.close") this.serverClose(1000);
  }
  close(code = 1000) {
    this.serverClose(code);
  }
  // the server's side
  message(msg) {
    this.onmessage({ data: JSON.stringify(msg) });
  }
  binary(buffer) {
    this.onmessage({ data: buffer });
  }
  serverClose(code, reason = "") {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose({ code, reason });
  }
  sentOf(type) {
    return this.sent.filter((m) => m.type === type);
  }
}

const CREATED = {
  type: "session.created",
  session_id: "0123456789ab",
  protocol_version: "2.0.0",
  engine: "piper",
  voices: [{ name: "joe", sample_rate: 22050 }],
  defaults: { framing: "raw", sample_rate: 22050 },
  limits: {},
};
const tick = (ms = 0) => new Promise((r) => setTimeout(r, ms));

async function connected(options = {}) {
  FakeSocket.instances = [];
  const client = new TtsClient("ws://gw/v1/audio/speech/stream", { WebSocket: FakeSocket, ...options });
  const opening = client.connect();
  const ws = FakeSocket.instances.at(-1);
  ws.message(CREATED);
  await opening;
  return { client, ws };
}

const s16 = (...values) => new Int16Array(values).buffer;

test("the API key travels as a subprotocol beside tts.v1", async () => {
  const { ws } = await connected({ apiKey: "sk-1" });
  assert.deepEqual(ws.protocols, ["tts.v1", "tts.key.sk-1"]);
  const { ws: plain } = await connected();
  assert.deepEqual(plain.protocols, ["tts.v1"]);
});

test("lowLatencyConfig is the protocol's recommended set with the player's rate", () => {
  assert.deepEqual(lowLatencyConfig({ sampleRate: 48000 }), {
    type: "session.config",
    response_format: "pcm",
    encoding: "pcm_s16le",
    stream_audio: true,
    frame_ms: 20,
    flow_control: "ack",
    sample_rate: 48000,
  });
});

test("configure resolves with session.updated and rejects with the server's error", async () => {
  const { client, ws } = await connected();
  const ok = client.configure({ voice: "joe", speed: 1.5 });
  ws.message({ type: "session.updated", config: { voice: "joe", speed: 1.5, framing: "raw" } });
  assert.equal((await ok).speed, 1.5);
  const bad = client.configure({ voice: "nobody" });
  ws.message({ type: "error", code: "unknown_voice", message: "unknown voice nobody", fatal: false });
  await assert.rejects(bad, /unknown_voice/);
  // the config fields are merged for the next send
  assert.deepEqual(ws.sentOf("session.config").at(-1), { type: "session.config", voice: "nobody", speed: 1.5 });
});

test("a fatal refusal rejects connect with the server's reason and does not reconnect", async () => {
  FakeSocket.instances = [];
  const client = new TtsClient("ws://gw/x", { WebSocket: FakeSocket, backoff: { initialMs: 1, maxMs: 1 } });
  const opening = client.connect();
  const ws = FakeSocket.instances[0];
  ws.message({ type: "error", code: "unauthorized", message: "missing API key", fatal: true });
  ws.serverClose(1008);
  await assert.rejects(opening, /unauthorized: missing API key/);
  await tick(5);
  assert.equal(FakeSocket.instances.length, 1);
  assert.equal(client.state, "closed");
});

test("raw frames belong to the last audio.start; offsets run across sentences", async () => {
  const { client, ws } = await connected();
  const audio = [];
  client.on("audio", (a) => audio.push(a));
  client.sendText("Hi there. Bye.", { contextId: "c" });
  const start = { type: "audio.start", context_id: "c", utterance_index: 0, format: "pcm",
    encoding: "pcm_s16le", sample_rate: 22050, context_number: 1 };
  ws.message({ ...start, sentence_index: 0 });
  ws.binary(s16(100, 200));
  ws.binary(s16(300));
  ws.message({ type: "audio.done", context_id: "c", utterance_index: 0, sentence_index: 0 });
  ws.message({ ...start, sentence_index: 1 });
  ws.binary(s16(400, 500, 600));
  assert.deepEqual(audio.map((a) => [a.contextId, a.sentenceIndex, a.offset, a.samples.length]), [
    ["c", 0, 0, 2],
    ["c", 0, 2, 1],
    ["c", 1, 3, 3],
  ]);
  assert.equal(audio[0].samples[0], 100 / 32768);
});

test("tagged frames are routed by context number", async () => {
  const { client, ws } = await connected();
  client.config = { framing: "tagged" };
  const audio = [];
  client.on("audio", (a) => audio.push(a));
  for (const [id, number] of [["a", 3], ["b", 4]]) {
    ws.message({ type: "audio.start", context_id: id, utterance_index: 0, sentence_index: 0, format: "pcm",
      encoding: "pcm_s16le", sample_rate: 16000, context_number: number });
  }
  const frame = new ArrayBuffer(22);
  const view = new DataView(frame);
  view.setUint8(0, 1);
  view.setUint16(2, 3, true);
  view.setBigUint64(12, 960n, true);
  view.setInt16(20, 1000, true);
  ws.binary(frame);
  assert.equal(audio[0].contextId, "a");
  assert.equal(audio[0].offset, 960);
});

test("losing the connection: text in flight fails, is never re-sent, config is re-applied", async () => {
  const { client, ws } = await connected({ backoff: { initialMs: 1, maxMs: 1 } });
  const failed = [];
  const events = [];
  client.on("text.failed", (f) => failed.push(f));
  for (const type of ["close", "reconnecting", "reconnected"]) client.on(type, () => events.push(type));
  const configured = client.configure({ speed: 1.25 });
  ws.message({ type: "session.updated", config: { speed: 1.25, framing: "raw" } });
  await configured;
  client.sendText("Hello ", { contextId: "t" });
  client.sendText("world", { contextId: "t" });
  client.sendText("Other. ");
  client.done();
  ws.message({ type: "session.done", context_id: null, utterance_index: 1, total_sentences: 1 });
  ws.serverClose(1006);
  assert.deepEqual(failed.map((f) => [f.contextId, f.text]), [["t", "Hello world"]]);
  assert.equal(client.sendText("lost "), false, "no session: the text is refused, not queued");
  assert.equal(failed.at(-1).text, "lost ");
  await tick(10);
  const second = FakeSocket.instances.at(-1);
  assert.notEqual(second, ws);
  second.message({ ...CREATED, session_id: "ba9876543210" });
  await tick();
  assert.deepEqual(second.sent, [{ type: "session.config", speed: 1.25 }]);
  second.message({ type: "session.updated", config: { speed: 1.25, framing: "raw" } });
  await tick();
  assert.deepEqual(events, ["close", "reconnecting", "reconnected"]);
  assert.equal(client.state, "open");
  assert.equal(second.sentOf("input.text").length, 0);
});

test("reconnect attempts back off and give up after maxAttempts", async () => {
  const { client, ws } = await connected({ backoff: { initialMs: 1, maxMs: 2 }, maxAttempts: 3 });
  const delays = [];
  client.on("reconnecting", ({ delayMs }) => delays.push(delayMs));
  ws.serverClose(1011);
  for (let i = 0; i < 3; i++) {
    await tick(10);
    FakeSocket.instances.at(-1).serverClose(1006);
  }
  await tick(10);
  assert.equal(delays.length, 3);
  assert.equal(client.state, "closed");
  for (let attempt = 0; attempt < 10; attempt++) {
    const d = backoffDelay(attempt, { initialMs: 250, maxMs: 8000 }, () => 1);
    assert.equal(d, Math.min(8000, 250 * 2 ** attempt));
    assert.equal(backoffDelay(attempt, { initialMs: 250, maxMs: 8000 }, () => 0), d / 2);
  }
});

test("close stops now: cancel, then session.close, waits for the server, and does not reconnect", async () => {
  const { client, ws } = await connected();
  ws.autoClose = true;
  const closes = [];
  client.on("close", (detail) => closes.push(detail));
  await client.close();
  // protocol 2.0.0: session.close alone would finish what was flushed
  assert.deepEqual(ws.sent.slice(-2), [{ type: "cancel", context_id: "*" }, { type: "session.close" }]);
  assert.equal(client.state, "closed");
  assert.equal(FakeSocket.instances.at(-1), ws);
  assert.equal(closes.length, 1);
  assert.equal(closes[0].finished, false);
});

test("close({finish: true}) lets the server speak what was flushed, still cancels and reports", async () => {
  const { client, ws } = await connected();
  const closes = [];
  client.on("close", (detail) => closes.push(detail));
  const audio = [];
  client.on("audio", (a) => audio.push(a));
  client.sendText("Hello there.");
  client.done();
  const closing = client.close({ finish: true });
  assert.deepEqual(ws.sent.at(-1), { type: "session.close" });
  assert.equal(ws.sentOf("cancel").length, 0);
  assert.equal(client.state, "closing");
  // the server goes on: audio still arrives and is routed
  ws.message({ type: "audio.start", context_id: null, utterance_index: 0, sentence_index: 0, format: "pcm",
    encoding: "pcm_s16le", sample_rate: 22050, context_number: 0 });
  ws.binary(new Int16Array([1, 2, 3, 4]).buffer);
  assert.equal(audio.length, 1);
  // what the server still reads is sent; new text is not
  assert.equal(client.playback(10), true);
  assert.equal(client.ping(), true);
  const failed = [];
  client.on("text.failed", (f) => failed.push(f));
  assert.equal(client.sendText("More."), false);
  assert.equal(failed.length, 1);
  ws.message({ type: "audio.done", context_id: null, utterance_index: 0, sentence_index: 0 });
  ws.message({ type: "session.done", context_id: null, utterance_index: 0, total_sentences: 1 });
  ws.serverClose(1000);
  await closing;
  assert.equal(client.state, "closed");
  assert.deepEqual(closes.map((c) => [c.code, c.finished, c.willReconnect]), [[1000, true, false]]);
  assert.deepEqual(ws.sentOf("playback").at(-1), { type: "playback", played_ms: 10, context_id: null });
  // a cancel while finishing is the barge-in, as before the close
  const again = await connected();
  const finishing = again.client.close({ finish: true });
  assert.equal(again.client.cancel({ contextId: "*" }), true);
  assert.deepEqual(again.ws.sent.slice(-2), [{ type: "session.close" }, { type: "cancel", context_id: "*" }]);
  again.ws.serverClose(1000);
  await finishing;
});

test("owesAudio: an open sentence or a finished utterance not yet done", async () => {
  const { client, ws } = await connected();
  client.sendText("Hello ");
  assert.equal(client.owesAudio(), false, "still typing: nothing owed");
  ws.message({ type: "audio.start", context_id: null, utterance_index: 0, sentence_index: 0, format: "pcm",
    encoding: "pcm_s16le", sample_rate: 22050, context_number: 0 });
  assert.equal(client.owesAudio(), true);
  ws.message({ type: "audio.done", context_id: null, utterance_index: 0, sentence_index: 0 });
  assert.equal(client.owesAudio(), false);
  client.done();
  assert.equal(client.owesAudio(), true);
  ws.message({ type: "session.done", context_id: null, utterance_index: 0, total_sentences: 1 });
  assert.equal(client.owesAudio(), false);
  assert.deepEqual(client.activeContexts(), []);
});

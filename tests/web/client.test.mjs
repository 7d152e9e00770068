// Node unit tests of web/client.js against a scripted fake WebSocket: the
// subprotocol key, config round trips, frame routing, resume (counts, token
// rotation, text the server lacks sent again, fallback), reconnect (text in
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
    this.onclose?.({ code, reason });
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

async function connected(options = {}, created = CREATED) {
  FakeSocket.instances = [];
  const client = new TtsClient("ws://gw/v1/audio/speech/stream", { WebSocket: FakeSocket, ...options });
  const opening = client.connect();
  const ws = FakeSocket.instances.at(-1);
  ws.message(created);
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

// ---- resume (protocol 2.1.0) ------------------------------------------------

const RESUMABLE = { ...CREATED, protocol_version: "2.1.0", resume_token: "token-1", resume_window_s: 30 };
const start = (contextId, number, extra = {}) => ({ type: "audio.start", context_id: contextId, utterance_index: 0,
  sentence_index: 0, format: "pcm", encoding: "pcm_s16le", sample_rate: 16000, context_number: number, ...extra });

/** A tagged frame: header (<BBHIIQ) and 16-bit samples. */
function tagged(contextNumber, sequence, sampleOffset, samples, utterance = 0) {
  const frame = new ArrayBuffer(20 + 2 * samples.length);
  const view = new DataView(frame);
  view.setUint8(0, 1);
  view.setUint16(2, contextNumber, true);
  view.setUint32(4, utterance, true);
  view.setUint32(8, sequence, true);
  view.setBigUint64(12, BigInt(sampleOffset), true);
  samples.forEach((s, i) => view.setInt16(20 + 2 * i, s, true));
  return frame;
}

/** The server's side of a resume on the client's next socket: its own
 * session.created, then (after the client's session.resume) the resumed
 * session's, then session.resumed.  Returns the socket and the request. */
async function answerResume(resumed, token = "token-2", defaults = RESUMABLE.defaults) {
  await tick(5);
  const ws = FakeSocket.instances.at(-1);
  ws.message({ ...RESUMABLE, session_id: "ffffffffffff", resume_token: "placeholder" });
  const [request] = ws.sent;
  ws.message({ ...RESUMABLE, resume_token: token, defaults }); // the config in force
  ws.message({ type: "session.resumed", session_id: RESUMABLE.session_id, replayed_messages: 0, ...resumed });
  return { ws, request };
}

test("a dropped connection resumes: per-context counts, events, a new token, the audio goes on", async () => {
  const { client, ws } = await connected({}, RESUMABLE);
  const seen = [];
  for (const type of ["resuming", "resumed", "close", "text.failed", "reconnecting"]) {
    client.on(type, (detail) => seen.push([type, detail]));
  }
  const audio = [];
  client.on("audio", (a) => audio.push(a));
  const configured = client.configure({ framing: "tagged" });
  ws.message({ type: "session.updated", config: { framing: "tagged", sample_rate: 16000 } });
  await configured;
  client.sendText("One. ", { contextId: "a" });
  client.done({ contextId: "a" });
  client.sendText("Two. ", { contextId: "b" });
  client.done({ contextId: "b" });
  ws.message(start("a", 1));
  ws.message(start("b", 2));
  ws.binary(tagged(1, 0, 0, [1, 2]));
  ws.binary(tagged(2, 0, 0, [3]));
  ws.binary(tagged(1, 1, 2, [4, 5, 6]));
  ws.serverClose(1006);
  assert.equal(client.state, "resuming");
  assert.deepEqual(seen.map(([type]) => type), ["resuming"], "a drop is not a close: nothing failed");
  assert.equal(seen[0][1].delayMs, 0, "the first try is at once");
  assert.equal(client.sendText("Three.", { contextId: "a" }), true, "kept while resuming");

  const tagging = { framing: "tagged", sample_rate: 16000 };
  const { ws: second, request } = await answerResume(
    { contexts: [{ context_id: "a", text_chars: 0, next_sequence: 2 }, { context_id: "b", text_chars: 0, next_sequence: 1 }] },
    "token-2",
    tagging,
  );
  assert.notEqual(second, ws);
  assert.deepEqual(request, {
    type: "session.resume",
    resume_token: "token-1",
    received: [{ context_id: "a", messages: 2 }, { context_id: "b", messages: 1 }],
    events: 3, // session.updated and two audio.start
  });
  assert.equal(client.state, "open");
  assert.equal(client.session.resume_token, "token-2", "the token rotates with every session.created");
  assert.equal(client.session.session_id, RESUMABLE.session_id);
  assert.deepEqual(seen.map(([type]) => type), ["resuming", "resumed"]);
  // the kept text goes out after the resume, into the open utterance
  assert.deepEqual(second.sentOf("input.text"), [{ type: "input.text", text: "Three.", context_id: "a" }]);
  // the audio continues where it stopped, in the same context and utterance
  second.binary(tagged(1, 2, 5, [7]));
  assert.deepEqual(audio.map((a) => [a.contextId, a.sequence, a.offset, a.samples.length]), [
    ["a", 0, 0, 2], ["b", 0, 0, 1], ["a", 1, 2, 3], ["a", 2, 5, 1],
  ]);
  const done = [];
  client.on("session.done", (m) => done.push(m.text));
  second.message({ type: "audio.done", context_id: "a", utterance_index: 0, sentence_index: 0 });
  second.message({ type: "session.done", context_id: "a", utterance_index: 0, total_sentences: 1 });
  assert.deepEqual(done, ["One. "]);

  // a second drop: the new token, and the events since session.resumed
  second.serverClose(1006);
  const { request: again } = await answerResume({ contexts: [] }, "token-3", tagging);
  assert.equal(again.resume_token, "token-2");
  assert.equal(again.events, 2);
  assert.deepEqual(again.received, [{ context_id: "a", messages: 3 }, { context_id: "b", messages: 1 }]);
  assert.equal(client.session.resume_token, "token-3");
});

test("raw framing counts every binary message under null", async () => {
  const { client, ws } = await connected({}, RESUMABLE);
  client.sendText("Hi.", { contextId: "x" });
  ws.message(start("x", 1, { sample_rate: 22050 }));
  ws.binary(s16(1, 2));
  ws.binary(new ArrayBuffer(0)); // an empty message is a message
  ws.serverClose(1005);
  const { request } = await answerResume({ contexts: [{ context_id: "x", text_chars: 3, next_sequence: 0 }] });
  assert.deepEqual(request.received, [{ context_id: null, messages: 2 }]);
  assert.equal(request.events, 1);
  assert.equal(client.state, "open");
});

test("after a resume only the text the server lacks is sent: text_chars, then what was kept", async () => {
  const { client, ws } = await connected({}, RESUMABLE);
  client.sendText("Hello ");
  client.sendText("wörld 🙂 "); // the server counts code points
  client.sendText("and ");
  ws.serverClose(1006);
  client.sendText("more.");
  client.flush();
  client.done();
  client.sendText("Next ", { contextId: "n" });
  const { ws: second } = await answerResume({ contexts: [{ context_id: null, text_chars: 14, next_sequence: 0 }] });
  assert.deepEqual(second.sent.slice(1), [
    { type: "input.text", text: "and more.", context_id: null },
    { type: "input.done", context_id: null },
    { type: "input.text", text: "Next ", context_id: "n" },
  ]);
  // the flush is not sent for an utterance ended meanwhile; done() said it all
  assert.equal(second.sentOf("input.flush").length, 0);
});

test("the server got none of an utterance's text: all of it is sent again", async () => {
  const { client, ws } = await connected({}, RESUMABLE);
  client.sendText("Lost ", { contextId: "c" });
  client.sendText("words ", { contextId: "c" });
  client.flush({ contextId: "c" });
  ws.serverClose(1006);
  client.flush({ contextId: "c" });
  const { ws: second } = await answerResume({ contexts: [] });
  assert.deepEqual(second.sent.slice(1), [
    { type: "input.text", text: "Lost words ", context_id: "c" },
    { type: "input.flush", context_id: "c" },
  ]);
});

test("a cancel while resuming goes out after the text the server lacks, so each utterance is reported", async () => {
  const { client, ws } = await connected({}, RESUMABLE);
  client.sendText("Speak this.");
  client.done();
  ws.serverClose(1006);
  client.sendText("Unsaid ");
  assert.equal(client.cancel({ contextId: "*" }), true);
  client.sendText("After."); // a new utterance, not cancelled
  const { ws: second } = await answerResume({ contexts: [{ context_id: null, text_chars: 0, next_sequence: 0 }] });
  assert.deepEqual(second.sent.slice(1), [
    { type: "input.text", text: "Unsaid ", context_id: null },
    { type: "cancel", context_id: "*" },
    { type: "input.text", text: "After.", context_id: null },
  ]);
});

test("a refused resume falls back: the text fails, close, a new session", async () => {
  const { client, ws } = await connected({ backoff: { initialMs: 1, maxMs: 1 } }, RESUMABLE);
  const seen = [];
  for (const type of ["resuming", "resume_failed", "close", "reconnecting", "reconnected"]) {
    client.on(type, (detail) => seen.push([type, detail]));
  }
  const failed = [];
  client.on("text.failed", (f) => failed.push(f.text));
  client.sendText("In flight ");
  ws.serverClose(1006);
  client.sendText("kept.");
  await tick(5);
  const refused = FakeSocket.instances.at(-1);
  refused.message({ ...RESUMABLE, resume_token: "placeholder" });
  assert.equal(refused.sentOf("session.resume").length, 1);
  refused.message({ type: "error", code: "resume_expired", message: "too late", fatal: true });
  refused.serverClose(1008);
  assert.deepEqual(failed, ["In flight kept."]);
  assert.deepEqual(seen.map(([type]) => type), ["resuming", "resume_failed", "close", "reconnecting"]);
  assert.equal(seen[1][1].code, "resume_expired");
  assert.deepEqual([seen[2][1].code, seen[2][1].willReconnect], [1006, true]);
  await tick(10);
  const fresh = FakeSocket.instances.at(-1);
  assert.notEqual(fresh, refused);
  fresh.message({ ...RESUMABLE, session_id: "0000000000ff", resume_token: "token-new" });
  await tick();
  assert.equal(fresh.sentOf("session.resume").length, 0, "a new session, not a resume");
  assert.equal(client.state, "open");
  assert.equal(client.session.resume_token, "token-new");
});

test("tries that cannot reach the server go on within the window, then fall back", async () => {
  const { client, ws } = await connected({ reconnect: false }, { ...RESUMABLE, resume_window_s: 0.6 });
  const attempts = [];
  client.on("resuming", ({ attempt, delayMs }) => attempts.push([attempt, delayMs]));
  const failures = [];
  client.on("resume_failed", (f) => failures.push(f.code));
  ws.serverClose(1006);
  const started = Date.now();
  while (failures.length === 0 && Date.now() - started < 3000) {
    await tick(5);
    const last = FakeSocket.instances.at(-1);
    if (last !== ws && last.readyState === 1) last.serverClose(1006); // not reached
  }
  assert.deepEqual(failures, ["resume_expired"]);
  assert.ok(attempts.length >= 3, `${attempts.length} tries`);
  assert.deepEqual(attempts[0], [1, 0]);
  assert.ok(attempts.every(([, delay]) => delay <= 2000));
  assert.ok(Date.now() - started < 1200, "no try starts past the window");
  assert.equal(client.state, "closed");
});

test("no resume after a close frame, a polite close, or from a server without a token", async () => {
  for (const code of [1000, 1001, 1011]) {
    const { client, ws } = await connected({ reconnect: false }, RESUMABLE);
    const resuming = [];
    client.on("resuming", () => resuming.push(code));
    ws.serverClose(code);
    assert.deepEqual(resuming, []);
    assert.equal(client.state, "closed");
  }
  const { client, ws } = await connected({ reconnect: false }, RESUMABLE);
  const closing = client.close({ finish: true });
  ws.serverClose(1006); // dropped while finishing: the server ends the session
  await closing;
  assert.equal(client.state, "closed");
  assert.equal(FakeSocket.instances.at(-1), ws);
  const { client: off, ws: offWs } = await connected({ reconnect: false, resume: false }, RESUMABLE);
  offWs.serverClose(1006);
  assert.equal(off.state, "closed");
});

test("close() while resuming stops trying and reports the text not spoken", async () => {
  const { client, ws } = await connected({}, RESUMABLE);
  const failed = [];
  client.on("text.failed", (f) => failed.push(f.text));
  client.sendText("Unfinished ");
  ws.serverClose(1006);
  await client.close();
  await tick(5);
  assert.equal(client.state, "closed");
  assert.deepEqual(failed, ["Unfinished "]);
});

// The browser player: an AudioWorklet fed with the client's PCM frames
// through a jitter buffer (jitter.js), reporting the playback position to
// the server for `ack` flow control and stopping at once on barge-in.
//
//   const player = await Player.create();
//   player.attach(client);                  // frames in, playback reports out
//   await client.configure(lowLatencyConfig({ sampleRate: player.sampleRate }));
//   ...
//   await player.stop();                    // barge-in: silence now, then cancel
//   await client.close({ finish: true });   // the rest plays out, then the close
import { encodeWav } from "./frames.js";
import { contextKey } from "./jitter.js";

export class Player {
  /**
   * @param {{context?:AudioContext, startThresholdMs?:number, reportMs?:number,
   *   capture?:boolean, maxCaptureS?:number}} options
   *   capture: keep what was heard, for heardWav()
   */
  static async create(options = {}) {
    const context = options.context ?? new AudioContext({ latencyHint: "interactive" });
    await context.audioWorklet.addModule(new URL("./player-worklet.js", import.meta.url));
    return new Player(context, options);
  }

  constructor(context, { startThresholdMs = 40, reportMs = 50, capture = true, maxCaptureS = 600 } = {}) {
    this.context = context;
    this.node = new AudioWorkletNode(context, "tts-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { startThresholdMs, reportMs, capture },
    });
    this.node.connect(context.destination);
    this.handlers = new Map();
    this.stats = null; // the worklet's last report
    this.heard = []; // Float32Array chunks of what was played
    this.heardSamples = 0;
    this.maxCaptureSamples = maxCaptureS * context.sampleRate;
    this.withholdReports = false; // testing: stop telling the server the position
    this.cancelling = new Set(); // context keys whose late frames are dropped
    this.reported = new Map(); // key -> played samples last reported
    this.client = null;
    this._cancelId = 0;
    this._cancelWaiters = new Map();
    this.node.port.onmessage = (event) => this._onWorklet(event.data);
  }

  /** The output rate; configure the server's `sample_rate` to it. */
  get sampleRate() {
    return this.context.sampleRate;
  }

  /** Browsers start audio only after a user gesture: call this from one. */
  resume() {
    return this.context.state === "running" ? Promise.resolve() : this.context.resume();
  }

  on(type, handler) {
    if (!this.handlers.has(type)) this.handlers.set(type, new Set());
    this.handlers.get(type).add(handler);
    return () => this.handlers.get(type)?.delete(handler);
  }

  _emit(type, detail) {
    for (const handler of [...(this.handlers.get(type) ?? [])]) handler(detail);
  }

  /** Play a client's audio and report positions through it.  Returns a
   * function that detaches. */
  attach(client) {
    this.client = client;
    const offs = [
      client.on("audio", (a) => this.push(a)),
      client.on("audio.start", () => this._updateOwed()),
      client.on("audio.done", () => this._updateOwed()),
      client.on("session.done", (m) => {
        // Nothing left in progress: no frame of the cancelled audio can follow.
        const key = contextKey(m.context_id);
        if (!client.activeContexts().some((id) => contextKey(id) === key)) this.cancelling.delete(key);
        this._updateOwed();
      }),
      client.on("audio.cancelled", (m) => this.cancelling.delete(contextKey(m.context_id))),
      client.on("context.reset", ({ contextId }) => this._forget(contextKey(contextId))),
      // A reconnect is a new session: its contexts count from 0.  After a
      // polite close (`finished`, protocol 2.0.0) the audio already queued
      // plays out; it is forgotten when the next session starts.
      client.on("close", ({ finished }) => (finished ? (this._resetOnConnect = true) : this.reset())),
      client.on("state", (state) => {
        if (state === "connecting" && this._resetOnConnect) this.reset();
      }),
      // input.done makes audio owed before any event arrives
      client.on("sent", (m) => m.type === "input.done" && this._updateOwed()),
      // A resume (protocol 2.1.0) keeps the session: the audio goes on into
      // the same buffer, and the positions reported while the connection was
      // down are told again (the server paces against them).
      client.on("resumed", () => this._reportAgain()),
    ];
    return () => {
      offs.forEach((off) => off());
      this.client = null;
    };
  }

  /** Queue decoded samples (the client's "audio" event). */
  push({ key, contextId, samples, sampleRate, utteranceIndex = 0, offset = 0 }) {
    key ??= contextKey(contextId);
    if (sampleRate !== this.sampleRate) {
      throw new Error(`audio at ${sampleRate} Hz, player at ${this.sampleRate} Hz: configure sample_rate`);
    }
    if (this.cancelling.has(key)) {
      // sent before the server saw the cancel: consumed, never played
      this.node.port.postMessage({ type: "discard", key, samples: samples.length });
      return;
    }
    this.node.port.postMessage({ type: "push", key, samples, utterance: utteranceIndex, offset }, [samples.buffer]);
  }

  _updateOwed() {
    const owed = this.client?.owesAudio() ?? false;
    if (owed !== this._owed) {
      this._owed = owed;
      this.node.port.postMessage({ type: "owed", value: owed });
    }
  }

  /**
   * Barge-in: silence the context now (`"*"`, every context), report what
   * was heard, cancel it on the server, and drop its frames still in flight.
   * Resolves with the worklet's {heard, discarded} (samples per key).
   */
  async stop(contextId = "*") {
    const client = this.client;
    const all = contextId === "*";
    const key = all ? null : contextKey(contextId);
    const active = client ? client.activeContexts().filter((id) => all || contextKey(id) === key) : [];
    for (const id of active) this.cancelling.add(contextKey(id));
    const result = await this._cancelLocal(key);
    if (client) {
      // The heard position first, so audio.cancelled says what was heard;
      // the next report adds the discarded audio, as the protocol counts it.
      if (!this.withholdReports) {
        for (const [k, samples] of Object.entries(result.heard)) this._report(k, samples);
      }
      client.cancel({ contextId });
    }
    return result;
  }

  _cancelLocal(key) {
    const id = ++this._cancelId;
    return new Promise((resolve) => {
      this._cancelWaiters.set(id, resolve);
      this.node.port.postMessage({ type: "cancel", key, id });
    });
  }

  /** Drop everything and forget positions (a new session). */
  reset() {
    this._resetOnConnect = false;
    this.cancelling.clear();
    this.reported.clear();
    this._owed = false;
    this.node.port.postMessage({ type: "reset" });
  }

  _forget(key) {
    this.reported.delete(key);
    this.node.port.postMessage({ type: "forget", key });
  }

  _report(key, samples) {
    if (!this.client || (this.reported.get(key) ?? -1) >= samples) return;
    this.reported.set(key, samples);
    this._sendPosition(key, samples);
  }

  _reportAgain() {
    if (this.withholdReports) return;
    for (const [key, samples] of this.reported) this._sendPosition(key, samples);
  }

  _sendPosition(key, samples) {
    const playedMs = Math.floor(((samples * 1000) / this.sampleRate) * 10) / 10;
    this.client.playback(playedMs, { contextId: JSON.parse(key) });
  }

  _onWorklet(msg) {
    if (msg.type === "cancelled") {
      this._cancelWaiters.get(msg.id)?.({ heard: msg.heard, discarded: msg.discarded });
      this._cancelWaiters.delete(msg.id);
      return;
    }
    if (msg.type !== "report") return;
    this.stats = msg;
    if (msg.heard && this.heardSamples < this.maxCaptureSamples) {
      this.heard.push(msg.heard);
      this.heardSamples += msg.heard.length;
    }
    if (!this.withholdReports) {
      for (const [key, samples] of msg.consumed) this._report(key, samples);
    }
    this._emit("report", msg);
  }

  /** What was played so far, as a 16-bit WAV file. */
  heardWav() {
    return new Blob([encodeWav(this.heard, this.sampleRate)], { type: "audio/wav" });
  }

  clearHeard() {
    this.heard = [];
    this.heardSamples = 0;
  }
}

// The gateway's browser client: one WebSocket session of
// docs/protocol.md, with typed events, contexts and reconnect.  It sends and
// receives; it does not play audio (player.js does) and never re-sends text.
//
//   const client = new TtsClient(defaultUrl(), { apiKey });
//   client.on("audio", ({ samples }) => ...);
//   await client.connect();
//   await client.configure(lowLatencyConfig({ sampleRate: 48000 }));
//   client.sendText("Hello "); client.sendText("there."); client.done();
import { decodePcm, parseTaggedFrame, stripWavHeader } from "./frames.js";
import { contextKey } from "./jitter.js";

export { contextKey };

/** The subprotocol the gateway speaks; offered on every connection. */
export const SUBPROTOCOL = "tts.v1";

/** The stream endpoint on the page's own server. */
export function defaultUrl(location = globalThis.location) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/v1/audio/speech/stream`;
}

/**
 * The protocol's recommended low-latency settings for a client that plays
 * the audio itself: 20 ms PCM frames as they are decoded, `ack` flow
 * control, and `sample_rate` set to the player's rate so the server
 * resamples (the browser then never does).
 */
export function lowLatencyConfig({ sampleRate, ...extra } = {}) {
  const config = {
    type: "session.config",
    response_format: "pcm",
    encoding: "pcm_s16le",
    stream_audio: true,
    frame_ms: 20,
    flow_control: "ack",
    ...extra,
  };
  if (sampleRate) config.sample_rate = Math.round(sampleRate);
  return config;
}

/** The subprotocols to offer: `tts.v1`, and the key in its browser-safe form. */
export function subprotocols(apiKey) {
  return apiKey ? [SUBPROTOCOL, `tts.key.${apiKey}`] : [SUBPROTOCOL];
}

const CONFIG_ERRORS = new Set(["invalid_config", "unknown_voice", "unsupported_option", "invalid_state"]);
// Closes after which reconnecting cannot help or is not wanted: a normal
// close, a policy refusal (bad key, Origin, rejected first config), and the
// server's config and idle timeouts (the app was quiet; connect again on demand).
const NO_RECONNECT = new Set([1000, 1008, 4001, 4002]);
// What the server still reads after `session.close` (protocol 2.0.0).
const WHILE_CLOSING = new Set(["cancel", "playback", "ping"]);

/** Backoff delay before reconnect attempt `attempt` (0-based), with jitter. */
export function backoffDelay(attempt, { initialMs = 250, maxMs = 8000, factor = 2 } = {}, random = Math.random) {
  const base = Math.min(maxMs, initialMs * factor ** attempt);
  return Math.round(base * (0.5 + 0.5 * random()));
}

export class TtsClient {
  /**
   * @param {string} url ws:// or wss:// URL of /v1/audio/speech/stream
   * @param {{apiKey?:string, reconnect?:boolean, backoff?:object, maxAttempts?:number,
   *   keepAliveMs?:number, WebSocket?:typeof WebSocket}} options
   */
  constructor(url, options = {}) {
    this.url = url;
    this.apiKey = options.apiKey ?? null;
    this.reconnect = options.reconnect ?? true;
    this.backoff = options.backoff ?? {};
    this.maxAttempts = options.maxAttempts ?? 8;
    this.keepAliveMs = options.keepAliveMs ?? 0;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.state = "idle"; // idle | connecting | open | reconnecting | closing | closed
    this.session = null; // the session.created message
    this.config = null; // the effective config from the last session.updated
    this.requested = {}; // every field configured so far, re-applied on reconnect
    this.handlers = new Map();
    this.ws = null;
    this.pendingConfigs = [];
    this._resetSessionState();
  }

  // ---- events -------------------------------------------------------------

  /** Subscribe to an event type (a server message type, or "audio", "open",
   * "close", "reconnecting", "reconnected", "text.failed", "first.audio", "context.reset",
   * "state", "message" (every server message), "sent" (every client message));
   * returns the function that unsubscribes. */
  on(type, handler) {
    if (!this.handlers.has(type)) this.handlers.set(type, new Set());
    this.handlers.get(type).add(handler);
    return () => this.handlers.get(type)?.delete(handler);
  }

  emit(type, detail) {
    for (const handler of [...(this.handlers.get(type) ?? [])]) {
      try {
        handler(detail);
      } catch (error) {
        // An app handler's bug must not break the protocol state; report it
        // as an uncaught error instead of swallowing it.
        queueMicrotask(() => {
          throw error;
        });
      }
    }
  }

  _setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.emit("state", state);
  }

  // ---- connection ---------------------------------------------------------

  /** Open a session; resolves with `session.created`, rejects with the
   * server's fatal `error` (or the close) if the connection is refused. */
  connect() {
    if (this.state === "open" || this.state === "connecting") {
      return this._opening ?? Promise.resolve(this.session);
    }
    this._userClosed = false;
    this._finishing = false;
    this._attempt = 0;
    this._setState("connecting");
    this._opening = this._open();
    return this._opening;
  }

  _open() {
    return new Promise((resolve, reject) => {
      let ws;
      try {
        ws = new this.WebSocket(this.url, subprotocols(this.apiKey));
      } catch (error) {
        this._setState("closed");
        reject(error);
        return;
      }
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let created = false;
      let fatal = null;
      ws.onmessage = (event) => {
        if (ws !== this.ws) return;
        if (typeof event.data !== "string") {
          this._onBinary(event.data);
          return;
        }
        const msg = JSON.parse(event.data);
        if (msg.type === "session.created") {
          created = true;
          this.session = msg;
          this.config = msg.defaults;
          this._attempt = 0;
          this._setState("open");
          this._startKeepAlive();
          resolve(msg);
        } else if (msg.type === "error" && msg.fatal) {
          fatal = msg;
        }
        this._onMessage(msg);
      };
      ws.onclose = (event) => {
        if (ws !== this.ws) return;
        this._onClose(event, created);
        if (!created) {
          const error = new Error(
            fatal ? `${fatal.code}: ${fatal.message}` : `connection closed (${event.code}) before session.created`,
          );
          error.code = fatal?.code ?? "closed";
          error.closeCode = event.code;
          reject(error);
        }
      };
      ws.onerror = () => {}; // a close event always follows, with the code
    });
  }

  _onClose(event, created) {
    this._stopKeepAlive();
    this._failInFlight(`connection closed (${event.code})`);
    for (const pending of this.pendingConfigs.splice(0)) {
      pending.reject(new Error(`connection closed (${event.code}) before session.updated`));
    }
    const again =
      this.reconnect &&
      !this._userClosed &&
      (created || this.state === "reconnecting") &&
      !NO_RECONNECT.has(event.code) &&
      this._attempt < this.maxAttempts;
    // finished: the server closed after speaking what was flushed (close({finish: true}))
    const finished = Boolean(this._finishing) && event.code === 1000;
    this.emit("close", { code: event.code, reason: event.reason, willReconnect: again, finished });
    this._resetSessionState();
    if (again) this._scheduleReconnect();
    else this._setState("closed");
  }

  _scheduleReconnect() {
    this._setState("reconnecting");
    const delayMs = backoffDelay(this._attempt, this.backoff);
    this._attempt += 1;
    this.emit("reconnecting", { attempt: this._attempt, delayMs });
    this._reconnectTimer = setTimeout(async () => {
      if (this._userClosed) return;
      try {
        const created = await this._open();
        // A reconnect is a new session: apply the config again, nothing else.
        if (Object.keys(this.requested).length > 0) {
          await this.configure({}).catch((error) => this.emit("error", { code: "client", message: String(error) }));
        }
        this.emit("reconnected", created);
      } catch {
        // _onClose has already scheduled the next attempt, or given up.
      }
    }, delayMs);
  }

  _startKeepAlive() {
    this._stopKeepAlive();
    if (this.keepAliveMs > 0) {
      this._keepAlive = setInterval(() => this._send({ type: "ping", id: "keepalive" }), this.keepAliveMs);
    }
  }

  _stopKeepAlive() {
    clearInterval(this._keepAlive);
    this._keepAlive = null;
  }

  /** End the session.  By default stop now: `cancel` of every context, then
   * `session.close`, then wait for the server's close (the cancelled work is
   * reported first).  `finish: true` ends it politely (protocol 2.0.0): only
   * `session.close`, so the server speaks what was flushed (`done`, `flush`)
   * before it closes; audio and `session.done` keep arriving meanwhile, and
   * `cancel`, `playback` and `ping` still work (a `stop()` of the player
   * cancels).  Resolves when the connection is closed, or after `timeoutMs`
   * (then the socket is closed here). */
  close({ finish = false, timeoutMs = finish ? 30000 : 2000 } = {}) {
    this._userClosed = true;
    clearTimeout(this._reconnectTimer);
    const ws = this.ws;
    if (!ws || ws.readyState >= 2) {
      this._setState("closed");
      return Promise.resolve();
    }
    const open = ws.readyState === 1;
    if (open && !finish) this._send({ type: "cancel", context_id: "*" });
    this._finishing = finish;
    this._setState("closing");
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        ws.close(1000);
        resolve();
      }, timeoutMs);
      const off = this.on("close", () => {
        off();
        done();
      });
      if (open) ws.send(JSON.stringify({ type: "session.close" }));
      else ws.close(1000);
    });
  }

  // ---- sending ------------------------------------------------------------

  _send(message) {
    // while closing politely (close({finish: true})) the server still reads these
    const finishing = this.state === "closing" && this._finishing && WHILE_CLOSING.has(message.type);
    if ((this.state !== "open" && !finishing) || this.ws?.readyState !== 1) return false;
    this.ws.send(JSON.stringify(message));
    this.emit("sent", message);
    return true;
  }

  /** Send `session.config` (only the fields given; the server merges).
   * Resolves with the effective config of `session.updated`; rejects with
   * the server's error.  The fields are remembered and re-applied after a
   * reconnect. */
  configure(fields = {}) {
    const { type: _type, ...rest } = fields;
    Object.assign(this.requested, rest);
    const message = { type: "session.config", ...this.requested };
    return new Promise((resolve, reject) => {
      if (!this._send(message)) {
        reject(new Error(`not connected (${this.state})`));
        return;
      }
      this.pendingConfigs.push({ resolve, reject });
    });
  }

  /** Send text to speak (whitespace is significant).  Returns false, and
   * reports the text with "text.failed", when it cannot be sent. */
  sendText(text, { contextId = null } = {}) {
    const ctx = this._context(contextId);
    let utterance = ctx.utterances.at(-1);
    if (!utterance || utterance.done) {
      utterance = { text: "", done: false, startedAt: now() };
      ctx.utterances.push(utterance);
    }
    if (!this._send({ type: "input.text", text, context_id: contextId })) {
      ctx.utterances.splice(ctx.utterances.indexOf(utterance), utterance.text ? 0 : 1);
      this.emit("text.failed", { contextId, text, reason: `not connected (${this.state})` });
      return false;
    }
    utterance.text += text;
    return true;
  }

  /** Speak everything buffered now; the utterance stays open. */
  flush({ contextId = null } = {}) {
    return this._send({ type: "input.flush", context_id: contextId });
  }

  /** End the utterance: speak the rest, then `session.done`. */
  done({ contextId = null } = {}) {
    if (this.state !== "open") return false;
    const ctx = this._context(contextId);
    const last = ctx.utterances.at(-1);
    if (last && !last.done) last.done = true;
    else ctx.utterances.push({ text: "", done: true, startedAt: now() });
    return this._send({ type: "input.done", context_id: contextId });
  }

  /** Barge-in: stop a context's audio (`"*"`: every context).  The server
   * answers with `audio.cancelled` for each utterance in progress. */
  cancel({ contextId = null } = {}) {
    return this._send({ type: "cancel", context_id: contextId });
  }

  /** Report the playback position of a context (`ack` flow control). */
  playback(playedMs, { contextId = null } = {}) {
    return this._send({ type: "playback", played_ms: playedMs, context_id: contextId });
  }

  ping(id = null) {
    return this._send({ type: "ping", id });
  }

  /** A handle bound to one context: `ctx.sendText("Hi ")`, `ctx.done()`. */
  context(contextId) {
    return {
      contextId,
      sendText: (text) => this.sendText(text, { contextId }),
      flush: () => this.flush({ contextId }),
      done: () => this.done({ contextId }),
      cancel: () => this.cancel({ contextId }),
      playback: (ms) => this.playback(ms, { contextId }),
    };
  }

  /** Contexts with an utterance the server has not finished (ids). */
  activeContexts() {
    return [...this.contexts.values()].filter((c) => c.utterances.length > 0).map((c) => c.contextId);
  }

  /** True while the server owes audio that the listener is waiting for: a
   * sentence is open, or an utterance was ended (input.done) and is not done. */
  owesAudio() {
    for (const ctx of this.contexts.values()) {
      if (ctx.openSentence || ctx.utterances.some((u) => u.done)) return true;
    }
    return false;
  }

  // ---- receiving ----------------------------------------------------------

  _resetSessionState() {
    this.contexts = new Map(); // key -> {contextId, utterances, openSentence, contextNumber}
    this.byNumber = new Map(); // context_number -> context_id (tagged frames)
    this.current = null; // the sentence that raw binary messages belong to
    this.offsets = new Map(); // `${key}/${utterance}` -> samples received
  }

  _context(contextId) {
    const key = contextKey(contextId);
    let ctx = this.contexts.get(key);
    if (!ctx) {
      ctx = { contextId, key, utterances: [], openSentence: null, contextNumber: null };
      this.contexts.set(key, ctx);
    }
    return ctx;
  }

  _onMessage(msg) {
    const ctx = "context_id" in msg ? this._context(msg.context_id) : null;
    switch (msg.type) {
      case "session.updated":
        this.config = msg.config;
        this.pendingConfigs.shift()?.resolve(msg.config);
        break;
      case "audio.start": {
        if (ctx.contextNumber !== null && ctx.contextNumber !== msg.context_number) {
          this.emit("context.reset", { contextId: msg.context_id }); // the server forgot it
        }
        ctx.contextNumber = msg.context_number;
        this.byNumber.set(msg.context_number, msg.context_id);
        ctx.openSentence = msg;
        this.current = msg;
        const first = ctx.utterances[0];
        if (first && first.firstAudioAt === undefined) first.firstAudioAt = null;
        break;
      }
      case "audio.done":
        ctx.openSentence = null;
        if (this.current && contextKey(this.current.context_id) === ctx.key) this.current = null;
        break;
      case "session.done": {
        const utterance = ctx.utterances.shift();
        this.offsets.delete(`${ctx.key}/${msg.utterance_index}`);
        msg.text = utterance?.text ?? "";
        break;
      }
      case "error":
        if (CONFIG_ERRORS.has(msg.code) && this.pendingConfigs.length > 0) {
          const error = new Error(`${msg.code}: ${msg.message}`);
          error.code = msg.code;
          this.pendingConfigs.shift().reject(error);
        }
        break;
    }
    this.emit("message", msg);
    this.emit(msg.type, msg);
  }

  _onBinary(buffer) {
    let sentence = this.current;
    let payload = buffer;
    let offset = null;
    if (this.config?.framing === "tagged") {
      const frame = parseTaggedFrame(buffer);
      if (frame.wavHeader) return;
      const contextId = this.byNumber.get(frame.contextNumber) ?? null;
      sentence = this._context(contextId).openSentence;
      payload = frame.payload;
      offset = frame.sampleOffset;
    }
    if (!sentence) return; // cannot happen under the ordering invariants
    if (sentence.format === "wav") payload = stripWavHeader(payload);
    const samples = decodePcm(payload, sentence.encoding);
    if (samples.length === 0) return;
    const key = contextKey(sentence.context_id);
    const slot = `${key}/${sentence.utterance_index}`;
    if (offset === null) offset = this.offsets.get(slot) ?? 0;
    this.offsets.set(slot, offset + samples.length);
    const ctx = this._context(sentence.context_id);
    const first = ctx.utterances[0];
    if (first && !first.firstAudioAt) {
      first.firstAudioAt = now();
      this.emit("first.audio", {
        contextId: sentence.context_id,
        utteranceIndex: sentence.utterance_index,
        ttfaMs: first.firstAudioAt - first.startedAt,
      });
    }
    this.emit("audio", {
      contextId: sentence.context_id,
      key,
      utteranceIndex: sentence.utterance_index,
      sentenceIndex: sentence.sentence_index,
      sampleRate: sentence.sample_rate,
      offset,
      samples,
    });
  }

  _failInFlight(reason) {
    for (const ctx of this.contexts.values()) {
      for (const utterance of ctx.utterances) {
        if (utterance.text) this.emit("text.failed", { contextId: ctx.contextId, text: utterance.text, reason });
      }
      ctx.utterances = [];
    }
  }
}

const now = () => globalThis.performance?.now() ?? Date.now();

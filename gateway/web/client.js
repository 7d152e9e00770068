// The gateway's browser client: one WebSocket session of
// docs/protocol.md, with typed events, contexts, resume and reconnect.  It
// sends and receives; it does not play audio (player.js does).  After a
// drop it resumes the session (protocol 2.1.0, resume.js): the audio goes
// on where it stopped and the text the server never got is sent then; a
// reconnect (a new session) never re-sends text.
//
//   const client = new TtsClient(defaultUrl(), { apiKey });
//   client.on("audio", ({ samples }) => ...);
//   await client.connect();
//   await client.configure(lowLatencyConfig({ sampleRate: 48000 }));
//   client.sendText("Hello "); client.sendText("there."); client.done();
import { decodePcm, parseTaggedFrame, stripWavHeader } from "./frames.js";
import { contextKey } from "./jitter.js";
import { chars, DROPPED, missingText, REFUSALS, ReceivedCounts, resumeDelay, resumeUrl } from "./resume.js";

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
   * @param {{apiKey?:string, reconnect?:boolean, resume?:boolean, backoff?:object, maxAttempts?:number,
   *   keepAliveMs?:number, maxQueuedChars?:number, WebSocket?:typeof WebSocket}} options
   *   resume: take the session back after a drop (default true, when the server offers it);
   *   maxQueuedChars: text kept while resuming, to send after it (beyond: "text.failed")
   */
  constructor(url, options = {}) {
    this.url = url;
    this.apiKey = options.apiKey ?? null;
    this.reconnect = options.reconnect ?? true;
    this.resume = options.resume ?? true;
    this.maxQueuedChars = options.maxQueuedChars ?? 65536;
    this.backoff = options.backoff ?? {};
    this.maxAttempts = options.maxAttempts ?? 8;
    this.keepAliveMs = options.keepAliveMs ?? 0;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.state = "idle"; // idle | connecting | open | resuming | reconnecting | closing | closed
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
   * "close", "resuming", "resumed", "resume_failed", "reconnecting", "reconnected",
   * "text.failed", "first.audio", "context.reset", "state", "message" (every
   * server message), "sent" (every client message)); returns the function
   * that unsubscribes. */
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
    if (this.state === "open" || this.state === "connecting" || this.state === "resuming") {
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
        if (created) {
          this._receive(event.data);
          return;
        }
        const msg = JSON.parse(event.data);
        if (msg.type === "session.created") {
          created = true;
          this.session = msg;
          this.config = msg.defaults;
          this.received.newConnection();
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
        if (created && this._resumable(event)) {
          this._suspend(event);
          return;
        }
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

  // ---- resume (protocol 2.1.0) ----------------------------------------------

  /** A drop the server suspends the session for, and a session it offered to resume. */
  _resumable(event) {
    return (
      this.resume &&
      !this._userClosed &&
      this.state === "open" &&
      DROPPED.has(event.code) &&
      Boolean(this.session?.resume_token) &&
      (this.session.resume_window_s ?? 0) > 0
    );
  }

  /** The connection dropped: keep the session (contexts, counts, text) and
   * take it back on a new connection within the server's window. */
  _suspend(event) {
    this._stopKeepAlive();
    // whether it arrived cannot be known: configure() again after "resumed"
    for (const pending of this.pendingConfigs.splice(0)) {
      pending.reject(new Error(`connection dropped (${event.code}) before session.updated; configure again`));
    }
    const at = now();
    this._resuming = {
      code: event.code,
      reason: event.reason,
      since: at,
      deadline: at + this.session.resume_window_s * 1000,
      attempt: 0,
      ws: null,
      timer: null,
      refusal: null,
    };
    this._setState("resuming");
    this._tryResume();
  }

  _tryResume() {
    const r = this._resuming;
    const delayMs = resumeDelay(r.attempt, { now: now(), deadline: r.deadline });
    if (delayMs === null) {
      this._resumeFailed({ code: "resume_expired", message: "the server's resume_window_s passed" });
      return;
    }
    r.attempt += 1;
    this.emit("resuming", { attempt: r.attempt, delayMs, code: r.code, reason: r.reason });
    r.timer = setTimeout(() => this._openResume(), delayMs);
  }

  /** One try: a new connection, whose first message is `session.resume`. */
  _openResume() {
    const r = this._resuming;
    if (!r || this._userClosed) return;
    let ws;
    try {
      ws = new this.WebSocket(resumeUrl(this.url, this.session.resume_token), subprotocols(this.apiKey));
    } catch {
      this._tryResume();
      return;
    }
    ws.binaryType = "arraybuffer";
    r.ws = ws;
    let phase = "connected"; // connected -> asked -> answered -> resumed
    ws.onmessage = (event) => {
      if (phase === "resumed") {
        if (ws === this.ws) this._receive(event.data);
        return;
      }
      if (r !== this._resuming || typeof event.data !== "string") return; // no audio before session.resumed
      const msg = JSON.parse(event.data);
      if (msg.type === "error") {
        if (msg.fatal) r.refusal = msg;
      } else if (msg.type === "session.created" && phase === "connected") {
        // this connection's own session, given up for the one resumed
        phase = "asked";
        const request = this.received.request(this.session.resume_token);
        ws.send(JSON.stringify(request));
        this.emit("sent", request);
      } else if (msg.type === "session.created" && phase === "asked") {
        // the resumed session: its new token replaces the used one at once,
        // and the server counts this connection's events from here
        phase = "answered";
        this.session = msg;
        this.config = msg.defaults;
        this.received.newConnection();
      } else if (msg.type === "session.resumed" && phase === "answered") {
        phase = "resumed";
        this._resumed(ws, msg);
      }
    };
    ws.onclose = (event) => {
      if (phase === "resumed") {
        if (ws !== this.ws) return;
        if (this._resumable(event)) this._suspend(event);
        else this._onClose(event, true);
        return;
      }
      if (r !== this._resuming) return;
      r.ws = null;
      const refusal = r.refusal;
      r.refusal = null;
      if (refusal && REFUSALS.has(refusal.code)) this._resumeFailed(refusal);
      else this._tryResume(); // not reached, busy, or cut again: within the window
    };
    ws.onerror = () => {};
  }

  /** `session.resumed`: the connection is the session's again. */
  _resumed(ws, msg) {
    const r = this._resuming;
    this._resuming = null;
    this.ws = ws;
    this._setState("open");
    this._startKeepAlive();
    this._onMessage(msg);
    const resent = this._sendMissing(msg.contexts ?? []);
    this.emit("resumed", {
      sessionId: msg.session_id,
      offlineMs: now() - r.since,
      attempts: r.attempt,
      replayedMessages: msg.replayed_messages,
      resentChars: resent,
    });
  }

  /** Send what the server does not hold (resume.js, missingText): per
   * context the text after its `text_chars` and the `input.done`s not
   * received, those of utterances cancelled meanwhile first, then the
   * cancels (so the server reports each utterance it cancels), then the
   * rest and the flushes asked for.  Returns the characters sent. */
  _sendMissing(contexts) {
    const held = new Map(contexts.map((c) => [contextKey(c.context_id), c.text_chars]));
    const plans = [...this.contexts.values()].map((ctx) => [ctx, missingText(ctx.utterances, held.get(ctx.key) ?? 0)]);
    let resent = 0;
    const send = (ctx, from, kept, { index, text, done }) => {
      const u = ctx.utterances[index];
      if (text) {
        this._send({ type: "input.text", text, context_id: ctx.contextId });
        resent += chars(text);
      }
      u.sentChars = chars(u.text);
      u.cuts = [...u.cuts.filter((c) => index === from && c <= kept), u.sentChars];
      if (done) u.doneSent = this._send({ type: "input.done", context_id: ctx.contextId });
    };
    for (const cancelled of [true, false]) {
      for (const [ctx, { from, held: kept, resend }] of plans) {
        for (const item of resend) {
          if (Boolean(ctx.utterances[item.index].cancelled) === cancelled) send(ctx, from, kept, item);
        }
      }
      if (cancelled) {
        for (const contextId of this._queuedCancels.splice(0)) this._send({ type: "cancel", context_id: contextId });
      }
    }
    for (const ctx of this.contexts.values()) {
      const last = ctx.utterances.at(-1);
      if (ctx.flushQueued && last && !last.done) this._send({ type: "input.flush", context_id: ctx.contextId });
      ctx.flushQueued = false;
    }
    this._queuedChars = 0;
    return resent;
  }

  /** Past the window, or refused: what a drop did before resume existed
   * (text in flight reported by "text.failed", "close", a new session). */
  _resumeFailed(detail) {
    const r = this._stopResuming();
    this.emit("resume_failed", { code: detail.code, message: detail.message, offlineMs: now() - r.since });
    this._onClose({ code: r.code, reason: r.reason }, true);
  }

  _stopResuming() {
    const r = this._resuming;
    this._resuming = null;
    clearTimeout(r.timer);
    if (r.ws) {
      r.ws.onclose = null;
      r.ws.onmessage = null;
      r.ws.close(1000);
    }
    return r;
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
    if (this._resuming) {
      // not resumed: the suspended session ends with the server's window
      const r = this._stopResuming();
      this._onClose({ code: r.code, reason: r.reason }, true);
      return Promise.resolve();
    }
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

  /** Send text to speak (whitespace is significant).  While resuming it is
   * kept and sent after the resume (up to `maxQueuedChars`).  Returns false,
   * and reports the text with "text.failed", when it cannot be sent. */
  sendText(text, { contextId = null } = {}) {
    const ctx = this._context(contextId);
    let utterance = ctx.utterances.at(-1);
    if (!utterance || utterance.done || utterance.cancelled) {
      utterance = newUtterance();
      ctx.utterances.push(utterance);
    }
    const size = chars(text);
    const kept = this.state === "resuming" && this._queuedChars + size <= this.maxQueuedChars;
    if (kept) {
      this._queuedChars += size;
    } else if (!this._send({ type: "input.text", text, context_id: contextId })) {
      ctx.utterances.splice(ctx.utterances.indexOf(utterance), utterance.text ? 0 : 1);
      const reason = this.state === "resuming" ? "over maxQueuedChars while resuming" : `not connected (${this.state})`;
      this.emit("text.failed", { contextId, text, reason });
      return false;
    } else {
      utterance.sentChars += size;
      utterance.cuts.push(utterance.sentChars);
    }
    utterance.text += text;
    return true;
  }

  /** Speak everything buffered now; the utterance stays open. */
  flush({ contextId = null } = {}) {
    if (this.state === "resuming") {
      this._context(contextId).flushQueued = true;
      return true;
    }
    return this._send({ type: "input.flush", context_id: contextId });
  }

  /** End the utterance: speak the rest, then `session.done`. */
  done({ contextId = null } = {}) {
    if (this.state !== "open" && this.state !== "resuming") return false;
    const ctx = this._context(contextId);
    let last = ctx.utterances.at(-1);
    if (last && !last.done && !last.cancelled) last.done = true;
    else ctx.utterances.push((last = { ...newUtterance(), done: true }));
    if (this.state === "resuming") return true; // sent after the resume
    last.doneSent = this._send({ type: "input.done", context_id: contextId });
    return last.doneSent;
  }

  /** Barge-in: stop a context's audio (`"*"`: every context).  The server
   * answers with `audio.cancelled` for each utterance in progress.  While
   * resuming it is sent after the resume, once the server holds every
   * utterance it cancels (each then ends with its `session.done`). */
  cancel({ contextId = null } = {}) {
    if (this.state === "resuming") {
      for (const ctx of this.contexts.values()) {
        if (contextId === "*" || ctx.key === contextKey(contextId)) {
          for (const u of ctx.utterances) u.cancelled = true;
        }
      }
      this._queuedCancels.push(contextId);
      return true;
    }
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
    this.contexts = new Map(); // key -> {contextId, utterances, openSentence, contextNumber, flushQueued}
    this.byNumber = new Map(); // context_number -> context_id (tagged frames)
    this.current = null; // the sentence that raw binary messages belong to
    this.offsets = new Map(); // `${key}/${utterance}` -> samples received
    this.received = new ReceivedCounts(); // what session.resume reports
    this._resuming = null; // the resume in progress (state "resuming")
    this._queuedChars = 0; // text kept while resuming
    this._queuedCancels = []; // cancels asked for while resuming
  }

  /** A message of the session's connection (after its session.created). */
  _receive(data) {
    if (typeof data === "string") {
      this.received.event();
      this._onMessage(JSON.parse(data));
    } else {
      this._onBinary(data);
    }
  }

  _context(contextId) {
    const key = contextKey(contextId);
    let ctx = this.contexts.get(key);
    if (!ctx) {
      ctx = { contextId, key, utterances: [], openSentence: null, contextNumber: null, flushQueued: false };
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
    let sequence = null;
    if (this.config?.framing === "tagged") {
      const frame = parseTaggedFrame(buffer);
      const contextId = this.byNumber.get(frame.contextNumber) ?? null;
      this.received.audio(contextId); // every binary message counts, a WAV header's too
      if (frame.wavHeader) return;
      sentence = this._context(contextId).openSentence;
      payload = frame.payload;
      offset = frame.sampleOffset;
      sequence = frame.sequence;
    } else {
      this.received.audio(null);
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
      sequence,
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

/** An utterance as the client tracks it: the text the app gave, how much of
 * it went out on a socket (`cuts`: the count after each input.text), and
 * whether its input.done was given and sent (resume.js, missingText). */
const newUtterance = () => ({ text: "", sentChars: 0, cuts: [], done: false, doneSent: false, startedAt: now() });

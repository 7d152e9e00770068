// Session resume (protocol 2.1.0) without I/O: what the browser client
// counts on a connection, the `session.resume` it sends after a drop, how
// long it waits between tries, and which of its text the server never got.
// client.js does the sockets; Node's test runner drives this directly.
import { contextKey } from "./jitter.js";

/** Close codes of a dropped connection (lost without a close frame, or a
 * proxy restarting): the server suspends the session for `resume_window_s`. */
export const DROPPED = new Set([1005, 1006, 1012, 1013, 1014]);

/** The server's refusals of `session.resume`: trying again cannot help
 * (`resume_elsewhere`: the try already carried the gateway's id for the
 * proxy, and it still reached another gateway). */
export const REFUSALS = new Set(["resume_invalid", "resume_expired", "resume_forbidden", "resume_elsewhere"]);

/**
 * `url` with `resume=<gateway id>` (the token's prefix, protocol 2.2.0), so
 * a proxy can route the resume to the gateway holding the session
 * (docs/deployment.md); the token itself stays out of the URL.
 */
export function resumeUrl(url, token) {
  const dot = token.lastIndexOf(".");
  if (dot < 0) return url; // a 2.1.0 server's token names no gateway
  let parsed;
  try {
    parsed = new URL(url);
  } catch {
    return url; // not an absolute URL: the socket resolves it, unrouted
  }
  parsed.searchParams.set("resume", token.slice(0, dot));
  return parsed.toString();
}

/** Characters as the server counts them (Python's `len`: code points). */
export const chars = (text) => {
  let n = 0;
  for (const _ of text) n++;
  return n;
};

/** `text` after its first `n` characters (code points). */
export const afterChars = (text, n) => (n <= 0 ? text : Array.from(text).slice(n).join(""));

/**
 * Delay before resume try `attempt` (0-based): the first at once, then a
 * short backoff with jitter.  null when the try would start past `deadline`
 * (the server's window has passed, or nearly: resuming cannot work).
 */
export function resumeDelay(attempt, { now, deadline, initialMs = 100, maxMs = 2000 }, random = Math.random) {
  const delay = attempt === 0 ? 0 : Math.round(Math.min(maxMs, initialMs * 2 ** (attempt - 1)) * (0.5 + 0.5 * random()));
  return now + delay < deadline ? delay : null;
}

/**
 * What the client received, counted as `session.resume` reports it:
 * binary messages per context over the whole session (under `raw` framing
 * every one under `null`: raw messages carry no context), and JSON messages
 * since this connection's `session.created` (a resumed one's `session.resumed`).
 */
export class ReceivedCounts {
  constructor() {
    this.binary = new Map(); // key -> {contextId, messages}
    this.events = 0;
  }

  /** One binary message of `contextId` (`null` under raw framing). */
  audio(contextId) {
    const key = contextKey(contextId);
    const entry = this.binary.get(key) ?? { contextId: contextId ?? null, messages: 0 };
    entry.messages += 1;
    this.binary.set(key, entry);
  }

  event() {
    this.events += 1;
  }

  /** A new connection of the same session: its events count from 0. */
  newConnection() {
    this.events = 0;
  }

  /** The `session.resume` message. */
  request(resumeToken) {
    return {
      type: "session.resume",
      resume_token: resumeToken,
      received: [...this.binary.values()].map((e) => ({ context_id: e.contextId, messages: e.messages })),
      events: this.events,
    };
  }
}

/**
 * The text of one context that the server does not hold, to send again
 * after a resume.
 *
 * `utterances`: the context's utterances without `session.done`, oldest
 * first, each `{text, sentChars, cuts, done, doneSent}`: `text` all the app
 * gave, `sentChars` the characters of it handed to a socket, `cuts` the
 * character count after each `input.text` handed to a socket, `doneSent`
 * whether its `input.done` was.  `textChars`: the server's `text_chars` for
 * the context (`session.resumed`; 0 when it is not listed).
 *
 * Over one TCP connection the server got a prefix of what was sent.  Its
 * open utterance holds `textChars` characters, which fall on a cut of the
 * utterance they belong to: the newest one that can hold them is taken (the
 * least lost), everything before it was received, nothing after it.  With
 * `textChars` 0 the first utterance whose `input.done` was not sent got
 * nothing (had it, the server would hold its text).  What was never handed
 * to a socket (written while disconnected) is never held.
 *
 * Returns `{from, held, resend}`: the first utterance not wholly held, the
 * characters of it held, and the messages that complete what the server
 * holds: `{index, text, done}` per utterance from `from` on (`text` may be
 * "", `done` true when its `input.done` must be sent).
 */
export function missingText(utterances, textChars) {
  const n = utterances.length;
  let from = utterances.findIndex((u) => !u.doneSent);
  if (from < 0) from = n;
  let held = 0;
  if (textChars > 0) {
    // candidates: utterances up to the first without input.done sent
    let found = -1;
    for (let i = Math.min(from, n - 1); i >= 0; i--) {
      if (utterances[i].cuts.includes(textChars)) {
        found = i;
        break;
      }
    }
    if (found >= 0) from = found;
    held = found >= 0 ? textChars : Math.min(textChars, from < n ? utterances[from].sentChars : 0);
  }
  const resend = [];
  for (let i = from; i < n; i++) {
    const u = utterances[i];
    resend.push({ index: i, text: afterChars(u.text, i === from ? held : 0), done: u.done });
  }
  return { from, held, resend };
}

// Node unit tests of web/resume.js: the pure parts of session resume
// (protocol 2.1.0): what is counted, when to try, and which text the
// server never got.
import assert from "node:assert/strict";
import { test } from "node:test";

import { afterChars, chars, missingText, REFUSALS, ReceivedCounts, resumeDelay, resumeUrl } from "../../gateway/web/resume.js";

/** An utterance whose text was sent as `chunks`, then `queued` kept while disconnected. */
function utterance(chunks, { queued = "", done = false, doneSent = false } = {}) {
  const cuts = [];
  let sent = 0;
  for (const c of chunks) cuts.push((sent += chars(c)));
  return { text: chunks.join("") + queued, sentChars: sent, cuts, done, doneSent };
}

test("characters are counted as the server counts them: code points", () => {
  assert.equal(chars("héllo 🙂"), 7);
  assert.equal(afterChars("a🙂bc", 2), "bc");
  assert.equal(afterChars("abc", 0), "abc");
});

test("missingText: the server's text_chars place what it holds", () => {
  const cases = [
    // [utterances, text_chars, expected resend [index, text, done]]
    [[utterance(["Hello ", "there "])], 6, [[0, "there ", false]]],
    [[utterance(["Hello ", "there "])], 12, [[0, "", false]]],
    [[utterance(["Hello "], { queued: "again." })], 6, [[0, "again.", false]]],
    // nothing held: the open utterance's text never arrived
    [[utterance(["Hello "])], 0, [[0, "Hello ", false]]],
    // an ended utterance whose input.done went out: taken as received
    [[utterance(["One."], { done: true, doneSent: true })], 0, []],
    // ... unless the server still holds its text open: the done was lost
    [[utterance(["One."], { done: true, doneSent: true })], 4, [[0, "", true]]],
    // two utterances: the text held belongs to the second; the first was received
    [
      [utterance(["One."], { done: true, doneSent: true }), utterance(["Two ", "more"])],
      4,
      [[1, "more", false]],
    ],
    // text held that only the first can hold: the second never arrived
    [
      [utterance(["Alpha. "], { done: true, doneSent: true }), utterance(["Two"], { done: true, queued: "" })],
      7,
      [[0, "", true], [1, "Two", true]],
    ],
    // ended while disconnected: its done is sent after its text
    [[utterance(["Hi "], { queued: "you.", done: true })], 3, [[0, "you.", true]]],
  ];
  for (const [utterances, textChars, expected] of cases) {
    const { resend } = missingText(utterances, textChars);
    assert.deepEqual(
      resend.map((r) => [r.index, r.text, r.done]),
      expected,
      JSON.stringify([utterances.map((u) => u.text), textChars]),
    );
  }
});

test("ReceivedCounts: binary per context over the session, events per connection", () => {
  const counts = new ReceivedCounts();
  counts.audio("a");
  counts.audio(null);
  counts.audio("a");
  counts.audio(undefined);
  counts.event();
  counts.event();
  assert.deepEqual(counts.request("t"), {
    type: "session.resume",
    resume_token: "t",
    received: [{ context_id: "a", messages: 2 }, { context_id: null, messages: 2 }],
    events: 2,
  });
  counts.newConnection();
  assert.equal(counts.request("t").events, 0);
  assert.equal(counts.request("t").received.length, 2);
});

test("resumeDelay: the first try at once, a short bounded backoff, none past the window", () => {
  const at = (attempt, now = 0, deadline = 30000) => resumeDelay(attempt, { now, deadline }, () => 1);
  assert.equal(at(0), 0);
  assert.deepEqual([1, 2, 3, 4, 5, 6, 9].map((a) => at(a)), [100, 200, 400, 800, 1600, 2000, 2000]);
  assert.equal(resumeDelay(3, { now: 0, deadline: 30000 }, () => 0), 200);
  assert.equal(at(5, 29000), null, "1.6 s from now is past the window");
  assert.equal(at(0, 30000), null);
});

test("resumeUrl: the token's gateway id in the URL for the proxy, the token itself never", () => {
  const token = "gw-a.abcDEF_123";
  assert.equal(resumeUrl("ws://h:8000/v1/audio/speech/stream", token), "ws://h:8000/v1/audio/speech/stream?resume=gw-a");
  assert.equal(resumeUrl("wss://h/s?x=1&resume=old", token), "wss://h/s?x=1&resume=gw-a");
  assert.ok(!resumeUrl("ws://h/s", token).includes("abcDEF"));
  assert.equal(resumeUrl("ws://h/s", "no-prefix-token"), "ws://h/s"); // a 2.1.0 server's token
  assert.equal(resumeUrl("/relative", token), "/relative");
  assert.ok(REFUSALS.has("resume_elsewhere"));
});

// The demo page: type and hear the voice start while you type.  Wires the
// client and the player to the page; the protocol lives in client.js, the
// audio in player.js.  `window.demo` exposes the parts for the browser tests.
import { TtsClient, contextKey, defaultUrl, lowLatencyConfig } from "./client.js";
import { Player } from "./player.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search); // ?voice=&speed=&max_lead_ms=&start_ms=
const secrets = new URLSearchParams(location.hash.slice(1)); // #key=API_KEY, kept out of server logs

const TYPED = "typed"; // context of the text box
const LLM = "llm"; // context of the streamed paragraph
const PARAGRAPH =
  "Streaming speech works best when the voice starts before the text is finished. " +
  "This paragraph arrives a few tokens at a time, the way a language model writes it, " +
  "and the gateway speaks each sentence as soon as it can. Press stop at any moment " +
  "to cut the voice off mid-word, just as a listener would interrupt.";
const TOKENS_PER_SECOND = 25;
const PAUSE_FLUSH_MS = 900;

const log = []; // {t, type, ...}: every server event and what the page sent
const demo = { log, ready: false };
window.demo = demo;

const note = (type, extra = {}) => log.push({ t: performance.now(), type, ...extra });

// ---- errors, shown as sentences a person can act on ----------------------------
function showError(title, detail = "") {
  const div = document.createElement("div");
  const code = document.createElement("code");
  code.textContent = title;
  div.append(code, detail ? ` ${detail}` : "");
  $("errors").prepend(div);
  while ($("errors").children.length > 4) $("errors").lastChild.remove();
}

// ---- audio and session -------------------------------------------------------
const player = await Player.create({
  startThresholdMs: Number(params.get("start_ms") ?? 40),
});
const client = new TtsClient(defaultUrl(), { apiKey: secrets.get("key") || undefined, keepAliveMs: 15000 });
player.attach(client);
Object.assign(demo, { client, player });

const wantConfig = () => {
  const extra = { timestamps: true, speed: Number($("speed").value) };
  if (params.get("voice")) extra.voice = params.get("voice");
  if (params.get("max_lead_ms")) extra.max_lead_ms = Number(params.get("max_lead_ms"));
  return lowLatencyConfig({ sampleRate: player.sampleRate, ...extra });
};

if (params.get("speed")) $("speed").value = params.get("speed");
$("speed-value").textContent = `${Number($("speed").value).toFixed(2)}×`;

client.on("message", (msg) => note(msg.type, { context_id: msg.context_id, utterance_index: msg.utterance_index }));
client.on("sent", (msg) => note(`sent:${msg.type}`, { context_id: msg.context_id, text: msg.text }));
client.on("state", (state) => {
  const resuming = state === "resuming";
  $("status").textContent = resuming ? "connection lost, resuming…" : state;
  $("status").className = `pill ${state === "open" ? "open" : state === "closed" ? "bad" : resuming ? "warn" : ""}`;
});
// A network blip (protocol 2.1.0 resume): the session waits on the server,
// the client takes it back and the audio goes on where it stopped.
client.on("resuming", ({ attempt }) => {
  $("link").textContent = attempt > 1 ? `resuming, try ${attempt}…` : "";
  note("resuming", { attempt });
});
client.on("resumed", ({ offlineMs, replayedMessages, resentChars }) => {
  const resent = resentChars ? `, ${resentChars} characters sent again` : "";
  $("link").textContent = `resumed after ${(offlineMs / 1000).toFixed(1)} s offline (${replayedMessages} messages replayed${resent})`;
  note("resumed", { offline_ms: offlineMs, replayed: replayedMessages, resent: resentChars });
});
client.on("resume_failed", ({ code, message }) => {
  $("link").textContent = "";
  showError("resume failed", `${code}: ${message}`);
  note("resume_failed", { code });
});
client.on("error", (msg) => showError(msg.code, msg.message + (msg.fatal ? " (the connection was closed)" : "")));
client.on("text.failed", ({ text, reason }) => showError("not spoken", `${reason}: “${text.trim().slice(0, 80)}”`));
client.on("close", ({ code, reason, willReconnect }) => {
  if (code !== 1000) showError(`closed ${code}`, `${reason || "connection lost"}${willReconnect ? "; reconnecting…" : ""}`);
  resetTyping();
});
client.on("reconnected", (created) => fillVoices(created));
client.on("session.updated", ({ config }) => {
  $("lead-sub").textContent = `lead bound ${config.max_lead_ms} ms · ${config.sample_rate} Hz`;
  $("voice").value = config.voice;
});

function fillVoices(created) {
  const select = $("voice");
  select.replaceChildren(
    ...created.voices.map((v) => new Option(`${v.name} · ${v.language} · ${v.quality}`, v.name)),
  );
  select.disabled = created.voices.length < 2;
  $("session").textContent = `session ${created.session_id} · ${created.engine} · protocol ${created.protocol_version}`;
}

async function start() {
  try {
    const created = await client.connect();
    fillVoices(created);
    await client.configure(wantConfig());
  } catch (error) {
    // a server error was shown when it arrived
    if (!error.code || error.code === "closed") showError("connection failed", error.message);
  }
  demo.ready = true;
}

$("voice").addEventListener("change", () =>
  client.configure({ voice: $("voice").value }).catch((e) => e.code || showError("config", e.message)),
);
$("speed").addEventListener("input", () => ($("speed-value").textContent = `${Number($("speed").value).toFixed(2)}×`));
$("speed").addEventListener("change", () =>
  client.configure({ speed: Number($("speed").value) }).catch((e) => e.code || showError("config", e.message)),
);
// Browsers start audio only after a gesture.
for (const type of ["keydown", "pointerdown"]) addEventListener(type, () => player.resume(), { capture: true });

// ---- typing: words leave as they are typed ----------------------------------------
let typedSent = ""; // the box's text already sent in this turn
let pauseTimer = null;

function resetTyping() {
  typedSent = $("text").value;
  clearTimeout(pauseTimer);
}

function sendTyped({ all = false } = {}) {
  const text = $("text").value;
  if (!text.startsWith(typedSent)) {
    // An edit before the sent part: what was said stays said; go on from the edit.
    let i = 0;
    while (i < text.length && text[i] === typedSent[i]) i++;
    typedSent = text.slice(0, i);
  }
  const pending = text.slice(typedSent.length);
  const complete = all ? pending : (pending.match(/^[\s\S]*\s/)?.[0] ?? "");
  if (complete && client.sendText(complete, { contextId: TYPED })) typedSent += complete;
}

$("text").addEventListener("input", () => {
  sendTyped();
  clearTimeout(pauseTimer);
  pauseTimer = setTimeout(() => {
    sendTyped({ all: true });
    client.flush({ contextId: TYPED });
  }, PAUSE_FLUSH_MS);
});
$("text").addEventListener("keydown", (event) => {
  if (event.key !== "Enter" || event.shiftKey) return;
  event.preventDefault();
  clearTimeout(pauseTimer);
  sendTyped({ all: true });
  client.done({ contextId: TYPED });
  $("text").value = "";
  typedSent = "";
});

// ---- the paragraph, at an LLM's pace ----------------------------------------------
let streaming = null;

function tokens(text) {
  // Roughly how a tokenizer cuts English: words with their leading space,
  // long words in two pieces.
  return (text.match(/\s*\S+/g) ?? []).flatMap((w) =>
    w.trim().length > 7 ? [w.slice(0, Math.ceil(w.length / 2)), w.slice(Math.ceil(w.length / 2))] : [w],
  );
}

function streamParagraph(text = PARAGRAPH, rate = TOKENS_PER_SECOND) {
  stopStreaming();
  const queue = tokens(text);
  let i = 0;
  const next = () => {
    if (i >= queue.length) {
      client.done({ contextId: LLM });
      streaming = null;
      return;
    }
    client.sendText(queue[i++], { contextId: LLM });
    // jitter as a model server shows it: 0.5x to 1.5x the mean interval
    streaming = setTimeout(next, (1000 / rate) * (0.5 + Math.random()));
  };
  next();
}

function stopStreaming() {
  clearTimeout(streaming);
  streaming = null;
}

$("paragraph").addEventListener("click", () => streamParagraph());
client.on("close", () => stopStreaming()); // the rest would only fail
$("stop").addEventListener("click", async () => {
  stopStreaming();
  resetTyping();
  note("stop");
  await player.stop("*");
});

// ---- per-utterance figures ---------------------------------------------------------
const rows = new Map(); // `${key}/${utterance}` -> {tr, cells}
function row(contextId, utteranceIndex) {
  const id = `${contextKey(contextId)}/${utteranceIndex}`;
  if (!rows.has(id)) {
    const tr = document.createElement("tr");
    const cells = ["n", "text", "first", "server", "audio", "status"].map((name) => {
      const td = document.createElement("td");
      td.className = name;
      tr.append(td);
      return td;
    });
    cells[0].textContent = `${utteranceIndex}`;
    cells[5].textContent = "speaking";
    $("utterances").tBodies[0].prepend(tr);
    while ($("utterances").tBodies[0].rows.length > 6) $("utterances").tBodies[0].lastChild.remove();
    rows.set(id, { tr, cells, text: "" });
  }
  return rows.get(id);
}

client.on("audio.start", (m) => {
  const r = row(m.context_id, m.utterance_index);
  r.text = `${r.text} ${m.sentence_text}`.trim();
  r.cells[1].textContent = r.text;
  r.cells[1].title = r.text;
});
client.on("first.audio", ({ contextId, utteranceIndex, ttfaMs }) => {
  row(contextId, utteranceIndex).cells[2].textContent = `${Math.round(ttfaMs)} ms`;
  $("ttfa").textContent = `${Math.round(ttfaMs)}`;
  note("ttfa", { ttfa_ms: ttfaMs });
});
client.on("session.done", (m) => {
  const r = row(m.context_id, m.utterance_index);
  const server = m.metrics?.first_audio_ms;
  r.cells[3].textContent = server == null ? "–" : `${Math.round(server)} ms`;
  r.cells[4].textContent = `${((m.metrics?.audio_ms ?? 0) / 1000).toFixed(1)} s`;
  if (m.cancelled) r.cells[5].textContent = "stopped";
  else r.cells[5].textContent = "done";
  if (server != null) $("ttfa-sub").textContent = `server: ${Math.round(server)} ms`;
});
client.on("audio.cancelled", (m) => {
  const r = row(m.context_id, m.utterance_index);
  r.cells[5].textContent = `stopped at ${(m.played_ms / 1000).toFixed(2)} s`;
  r.cells[5].title = `heard: “${m.spoken_text}”`;
});

// ---- the spoken word, from alignment -------------------------------------------------
const words = new Map(); // `${key}/${utterance}` -> [{word, start_ms, end_ms}]
let shown = null; // the utterance the transcript shows
let spans = [];
client.on("alignment", (m) => {
  const id = `${contextKey(m.context_id)}/${m.utterance_index}`;
  if (!words.has(id)) words.set(id, []);
  words.get(id).push(...m.words);
  if (id === shown) renderTranscript(id);
});
// A new session numbers its utterances from 0 again: forget the words.  After
// a polite close (`finished`) the queued audio still plays and lights them up;
// they go when the next session starts.
let clearWordsOnConnect = false;
client.on("close", ({ finished }) => (finished ? (clearWordsOnConnect = true) : words.clear()));
client.on("state", (state) => {
  if (state === "connecting" && clearWordsOnConnect) {
    clearWordsOnConnect = false;
    words.clear();
  }
});

function renderTranscript(id) {
  shown = id;
  spans = (words.get(id) ?? []).map((w) => {
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = w.word;
    return span;
  });
  const parts = spans.flatMap((s) => [s, " "]);
  $("transcript").replaceChildren(...parts);
}

function highlight(stats) {
  const head = stats.head;
  if (!head) return;
  const id = `${head.key}/${head.utterance}`;
  if (id !== shown && words.has(id)) renderTranscript(id);
  if (id !== shown) return;
  const ms = (head.offset * 1000) / player.sampleRate;
  const list = words.get(id) ?? [];
  let spoken = 0;
  while (spoken < list.length && list[spoken].start_ms <= ms) spoken++;
  const audible = stats.playing || stats.buffered > 0;
  spans.forEach((span, i) => {
    span.classList.toggle("spoken", i < spoken);
    span.classList.toggle("current", audible && i === spoken - 1);
  });
  if (audible && spoken > 0) demo.highlighted = list[spoken - 1].word;
}
$("transcript").innerHTML = '<span class="placeholder">The words appear here and light up as they are spoken.</span>';

// ---- live figures from the worklet's reports -----------------------------------------
const plot = $("plot");
const history = []; // {ms, underrun}
let lastUnderruns = 0;
player.on("report", (stats) => {
  const ms = (stats.buffered * 1000) / player.sampleRate;
  history.push({ ms, underrun: stats.underruns > lastUnderruns });
  lastUnderruns = stats.underruns;
  while (history.length > 200) history.shift(); // 10 s at one report per 50 ms
  $("buffered").textContent = `${Math.round(ms)}`;
  $("underruns").textContent = `${stats.underruns}`;
  $("underruns").closest(".card").classList.toggle("alert", stats.underruns > 0);
  $("starved-sub").textContent = `${Math.round((stats.starvedSamples * 1000) / player.sampleRate)} ms starved`;
  $("heard").textContent = `${(player.heardSamples / player.sampleRate).toFixed(1)} s heard`;
  highlight(stats);
  drawPlot();
});

function drawPlot() {
  const dpr = devicePixelRatio || 1;
  const width = plot.clientWidth * dpr;
  const height = plot.clientHeight * dpr;
  if (plot.width !== width || plot.height !== height) Object.assign(plot, { width, height });
  const g = plot.getContext("2d");
  g.clearRect(0, 0, width, height);
  const top = Math.max(client.config?.max_lead_ms ?? 1000, ...history.map((p) => p.ms));
  const x = (i) => (i / 199) * width;
  const y = (ms) => height - 4 * dpr - (ms / top) * (height - 10 * dpr);
  g.fillStyle = "rgba(58,109,240,0.15)";
  g.strokeStyle = "#3a6df0";
  g.lineWidth = 1.5 * dpr;
  g.beginPath();
  g.moveTo(x(200 - history.length), height);
  history.forEach((p, i) => g.lineTo(x(200 - history.length + i), y(p.ms)));
  g.lineTo(x(199), height);
  g.fill();
  g.beginPath();
  history.forEach((p, i) => (i ? g.lineTo : g.moveTo).call(g, x(200 - history.length + i), y(p.ms)));
  g.stroke();
  g.fillStyle = "#d9453b";
  history.forEach((p, i) => p.underrun && g.fillRect(x(200 - history.length + i) - dpr, 0, 2 * dpr, height));
  g.fillStyle = "#6b7385";
  g.font = `${11 * dpr}px system-ui`;
  g.fillText(`${Math.round(top)} ms`, 6 * dpr, 13 * dpr);
}

$("download").addEventListener("click", () => {
  const url = URL.createObjectURL(player.heardWav());
  const a = Object.assign(document.createElement("a"), { href: url, download: "heard.wav" });
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
});

Object.assign(demo, { streamParagraph, stopStreaming, tokens });
await start();

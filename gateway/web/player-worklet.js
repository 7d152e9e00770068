// The AudioWorklet side of the player (loaded by player.js with
// audioWorklet.addModule).  It runs on the audio thread: it only moves
// samples from the jitter buffer to the output and posts a report every
// `reportMs` of audio-clock time.  It must not allocate per quantum beyond
// the report, nor block.
import { JitterBuffer } from "./jitter.js";

class PlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { startThresholdMs = 40, reportMs = 50, capture = true } = options.processorOptions ?? {};
    this.options = { startThresholdMs };
    this.buffer = new JitterBuffer({ sampleRate, ...this.options });
    this.reportEvery = Math.round((reportMs * sampleRate) / 1000);
    this.sinceReport = 0;
    this.capture = capture;
    this.heard = capture ? new Float32Array(this.reportEvery + 256) : null;
    this.heardLength = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    const b = this.buffer;
    switch (msg.type) {
      case "push":
        b.push(msg.key, msg.samples, msg.utterance, msg.offset);
        break;
      case "owed":
        b.setOwed(msg.value);
        break;
      case "cancel": {
        const result = b.cancel(msg.key);
        this.port.postMessage({ type: "cancelled", id: msg.id, ...result });
        this.report();
        break;
      }
      case "discard":
        b.discard(msg.key, msg.samples);
        break;
      case "forget":
        b.forget(msg.key);
        break;
      case "reset":
        this.buffer = new JitterBuffer({ sampleRate, ...this.options });
        this.report();
        break;
      case "report":
        this.report();
        break;
    }
  }

  report() {
    const b = this.buffer;
    let heard = null;
    if (this.capture && this.heardLength > 0) {
      heard = this.heard.slice(0, this.heardLength);
      this.heardLength = 0;
    }
    this.port.postMessage(
      {
        type: "report",
        clock: b.clock,
        buffered: b.buffered,
        playing: b.playing,
        owed: b.owed,
        underruns: b.underruns,
        starvedSamples: b.starvedSamples,
        rendered: b.rendered,
        nonSilent: b.nonSilent,
        lastCancel: b.lastCancel,
        head: b.head,
        consumed: [...b.consumed],
        heard,
      },
      heard ? [heard.buffer] : [],
    );
    this.sinceReport = 0;
  }

  process(inputs, outputs) {
    const channels = outputs[0];
    const out = channels[0];
    const n = this.buffer.render(out);
    for (let c = 1; c < channels.length; c++) channels[c].set(out);
    if (this.capture && n > 0) {
      if (this.heardLength + n > this.heard.length) this.report();
      this.heard.set(out.subarray(0, n), this.heardLength);
      this.heardLength += n;
    }
    this.sinceReport += out.length;
    if (this.sinceReport >= this.reportEvery) this.report();
    return true;
  }
}

registerProcessor("tts-player", PlayerProcessor);

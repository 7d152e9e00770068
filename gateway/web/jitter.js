// The jitter buffer behind the AudioWorklet player, as a pure class: PCM
// chunks in, render quanta out, with the counts the protocol's `playback`
// report and the demo's figures need.  It does no I/O and knows nothing of
// Web Audio, so Node's test runner drives it directly (tests/web/).
//
// Positions are counted in samples at the output rate, per context key:
// `consumed` is what the protocol calls played_ms (played, or discarded by a
// cancel), and only ever grows.

/** Output samples whose magnitude reaches one 16-bit step count as sound. */
export const SILENCE_FLOOR = 1 / 32768;

/** The context key of a protocol `context_id` (`null` and `""` differ). */
export const contextKey = (contextId) => JSON.stringify(contextId ?? null);

export class JitterBuffer {
  /**
   * @param {{sampleRate:number, startThresholdMs?:number}} options
   *   startThresholdMs: audio buffered before playback starts (or resumes after
   *   an underrun) while the server still owes audio; lower is earlier first
   *   audio, higher rides out more network jitter.
   */
  constructor({ sampleRate, startThresholdMs = 40 }) {
    this.sampleRate = sampleRate;
    this.startThreshold = Math.round((startThresholdMs * sampleRate) / 1000);
    this.chunks = []; // {key, samples, read, utterance, offset}
    this.buffered = 0; // samples not yet rendered
    this.consumed = new Map(); // key -> samples played or discarded
    this.owed = false; // the server owes audio (a sentence is open, or the utterance is flushed)
    this.playing = false;
    this.starving = false; // ran dry while audio was owed, not yet recovered
    this.underruns = 0;
    this.starvedSamples = 0; // output samples of silence while starving
    this.clock = 0; // output samples rendered, silence included: the audio clock
    this.rendered = 0; // samples rendered from the buffer
    this.nonSilent = 0; // output samples at or above SILENCE_FLOOR
    this.head = null; // {key, utterance, offset} just past the last sample rendered
    this.lastCancel = null; // {clock, nonSilent} when the last cancel was applied
  }

  get bufferedMs() {
    return (this.buffered * 1000) / this.sampleRate;
  }

  /**
   * Queue samples of one context.
   * @param {string} key contextKey(context_id)
   * @param {Float32Array} samples
   * @param {number} utterance utterance_index
   * @param {number} offset the first sample's offset from the utterance's start
   */
  push(key, samples, utterance = 0, offset = 0) {
    if (samples.length === 0) return;
    this.chunks.push({ key, samples, read: 0, utterance, offset });
    this.buffered += samples.length;
  }

  /** Tell the buffer whether the server still owes audio (for underrun counting). */
  setOwed(owed) {
    this.owed = owed;
    if (!owed) this.starving = false;
  }

  /**
   * Fill one render quantum.  Buffered audio always comes first and is
   * contiguous: `out[0, n)` is audio, the rest silence, and `n` is returned.
   * @param {Float32Array} out
   */
  render(out) {
    if (!this.playing && this.buffered > 0) {
      // Start (or resume) once enough is buffered, or at once when nothing
      // more is owed (the end of a sentence must not wait for a threshold).
      if (!this.owed || this.buffered >= this.startThreshold) {
        this.playing = true;
        this.starving = false;
      }
    }
    let n = 0;
    if (this.playing) {
      while (n < out.length && this.chunks.length > 0) {
        const chunk = this.chunks[0];
        const take = Math.min(out.length - n, chunk.samples.length - chunk.read);
        out.set(chunk.samples.subarray(chunk.read, chunk.read + take), n);
        chunk.read += take;
        n += take;
        this._consume(chunk.key, take);
        this.head = { key: chunk.key, utterance: chunk.utterance, offset: chunk.offset + chunk.read };
        if (chunk.read === chunk.samples.length) this.chunks.shift();
      }
      this.buffered -= n;
      if (this.buffered === 0) {
        this.playing = false;
        if (this.owed && !this.starving) {
          this.starving = true;
          this.underruns += 1;
        }
      }
    }
    out.fill(0, n);
    if (this.starving && this.owed) this.starvedSamples += out.length - n;
    for (let i = 0; i < n; i++) {
      if (out[i] >= SILENCE_FLOOR || out[i] <= -SILENCE_FLOOR) this.nonSilent += 1;
    }
    this.clock += out.length;
    this.rendered += n;
    return n;
  }

  /**
   * Barge-in: drop the buffered audio of one context (`null`: every
   * context) at once, counting it as consumed.  Returns what each context
   * had consumed *before* the drop (what was heard) and what was dropped.
   * @param {string|null} key
   */
  cancel(key = null) {
    const heard = Object.fromEntries(this.consumed);
    const discarded = {};
    const kept = [];
    for (const chunk of this.chunks) {
      if (key === null || chunk.key === key) {
        const rest = chunk.samples.length - chunk.read;
        discarded[chunk.key] = (discarded[chunk.key] ?? 0) + rest;
        this._consume(chunk.key, rest);
        this.buffered -= rest;
      } else {
        kept.push(chunk);
      }
    }
    this.chunks = kept;
    if (this.buffered === 0) {
      this.playing = false;
      this.starving = false;
    }
    this.lastCancel = { clock: this.clock, nonSilent: this.nonSilent };
    return { heard, discarded };
  }

  /** Count audio that was never queued (frames arriving after a cancel) as consumed. */
  discard(key, samples) {
    this._consume(key, samples);
  }

  /** Forget a context's position (the server created the context afresh). */
  forget(key) {
    this.consumed.delete(key);
  }

  /** Played (or discarded) milliseconds of a context: `playback.played_ms`. */
  playedMs(key) {
    return ((this.consumed.get(key) ?? 0) * 1000) / this.sampleRate;
  }

  _consume(key, samples) {
    this.consumed.set(key, (this.consumed.get(key) ?? 0) + samples);
  }
}

// Pure audio helpers shared by the client, the player and the Node tests:
// decoding binary audio messages, reading the tagged frame header, writing
// WAV files.  No DOM, no Web Audio, no I/O: everything here runs in Node too.

/** Size of the tagged binary header (docs/protocol.md, `framing: "tagged"`). */
export const TAGGED_HEADER_BYTES = 20;

export const FLAG_FIRST = 0x01;
export const FLAG_LAST = 0x02;
export const FLAG_WAV_HEADER = 0x04;

/**
 * Read the 20-byte little-endian tagged header (`<BBHIIQ`).
 * @param {ArrayBuffer} buffer a whole binary message
 * @returns {{version:number, flags:number, contextNumber:number, utteranceIndex:number,
 *   sequence:number, sampleOffset:number, first:boolean, last:boolean, wavHeader:boolean,
 *   payload:ArrayBuffer}}
 */
export function parseTaggedFrame(buffer) {
  if (buffer.byteLength < TAGGED_HEADER_BYTES) {
    throw new RangeError(`tagged frame of ${buffer.byteLength} bytes: shorter than its header`);
  }
  const view = new DataView(buffer);
  const version = view.getUint8(0);
  if (version !== 1) throw new RangeError(`tagged frame header version ${version}, expected 1`);
  const flags = view.getUint8(1);
  return {
    version,
    flags,
    contextNumber: view.getUint16(2, true),
    utteranceIndex: view.getUint32(4, true),
    sequence: view.getUint32(8, true),
    // u64: exact below 2^53 samples (about 6,000 years at 48 kHz)
    sampleOffset: Number(view.getBigUint64(12, true)),
    first: (flags & FLAG_FIRST) !== 0,
    last: (flags & FLAG_LAST) !== 0,
    wavHeader: (flags & FLAG_WAV_HEADER) !== 0,
    payload: buffer.slice(TAGGED_HEADER_BYTES),
  };
}

/** Bytes per sample of each `encoding`. */
export const BYTES_PER_SAMPLE = { pcm_s16le: 2, pcm_f32le: 4, mulaw: 1, alaw: 1 };

function mulawToLinear(byte) {
  const u = ~byte & 0xff;
  const t = (((u & 0x0f) << 3) + 0x84) << ((u & 0x70) >> 4);
  return (u & 0x80 ? 0x84 - t : t - 0x84) / 32768;
}

function alawToLinear(byte) {
  const a = byte ^ 0x55;
  const exponent = (a & 0x70) >> 4;
  let t = (a & 0x0f) << 4;
  t = exponent === 0 ? t + 8 : (t + 0x108) << (exponent - 1);
  return (a & 0x80 ? t : -t) / 32768;
}

const MULAW_TABLE = Float32Array.from({ length: 256 }, (_, i) => mulawToLinear(i));
const ALAW_TABLE = Float32Array.from({ length: 256 }, (_, i) => alawToLinear(i));

/**
 * Decode headerless mono samples to float32 in [-1, 1).
 * A trailing partial sample (never sent by the gateway) is an error.
 * @param {ArrayBuffer} buffer
 * @param {string} encoding one of BYTES_PER_SAMPLE's keys
 * @returns {Float32Array}
 */
export function decodePcm(buffer, encoding = "pcm_s16le") {
  const width = BYTES_PER_SAMPLE[encoding];
  if (!width) throw new RangeError(`unknown encoding ${encoding}`);
  if (buffer.byteLength % width !== 0) {
    throw new RangeError(`${buffer.byteLength} bytes is not a whole number of ${encoding} samples`);
  }
  const n = buffer.byteLength / width;
  const view = new DataView(buffer);
  const out = new Float32Array(n);
  if (encoding === "pcm_s16le") {
    for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true) / 32768;
  } else if (encoding === "pcm_f32le") {
    for (let i = 0; i < n; i++) out[i] = view.getFloat32(4 * i, true);
  } else {
    const bytes = new Uint8Array(buffer);
    const table = encoding === "mulaw" ? MULAW_TABLE : ALAW_TABLE;
    for (let i = 0; i < n; i++) out[i] = table[bytes[i]];
  }
  return out;
}

/**
 * A 16-bit mono WAV file of the given float32 chunks.
 * @param {Float32Array[]} chunks
 * @param {number} sampleRate Hz
 * @returns {ArrayBuffer}
 */
export function encodeWav(chunks, sampleRate) {
  const samples = chunks.reduce((n, c) => n + c.length, 0);
  const buffer = new ArrayBuffer(44 + 2 * samples);
  const view = new DataView(buffer);
  const ascii = (offset, text) => {
    for (let i = 0; i < text.length; i++) view.setUint8(offset + i, text.charCodeAt(i));
  };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + 2 * samples, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, 2 * sampleRate, true); // byte rate
  view.setUint16(32, 2, true); // block align
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, 2 * samples, true);
  let offset = 44;
  for (const chunk of chunks) {
    for (let i = 0; i < chunk.length; i++, offset += 2) {
      const s = Math.max(-1, Math.min(1, chunk[i]));
      view.setInt16(offset, s < 0 ? Math.round(s * 32768) : Math.round(s * 32767), true);
    }
  }
  return buffer;
}

/**
 * The samples of a binary message that may carry a WAV header
 * (`response_format: "wav"`): the bytes after the `data` chunk's header, or
 * the message as it is when it does not start with `RIFF`.
 * @param {ArrayBuffer} buffer
 * @returns {ArrayBuffer}
 */
export function stripWavHeader(buffer) {
  const bytes = new Uint8Array(buffer);
  const tag = (offset) => String.fromCharCode(...bytes.subarray(offset, offset + 4));
  if (bytes.length < 12 || tag(0) !== "RIFF" || tag(8) !== "WAVE") return buffer;
  const view = new DataView(buffer);
  let offset = 12;
  while (offset + 8 <= bytes.length) {
    const size = view.getUint32(offset + 4, true);
    if (tag(offset) === "data") return buffer.slice(offset + 8);
    offset += 8 + size + (size % 2);
  }
  return new ArrayBuffer(0);
}

// Node unit tests of web/frames.js: binary frame parsing, sample decoding, WAV.
// Reference values come from the gateway's Python encoders
// (gateway/audio/encoding.py) and, for the tagged header, the fixture shared
// with voice_gateway_wire.frames.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  FLAG_FIRST,
  FLAG_LAST,
  FLAG_WAV_HEADER,
  TAGGED_HEADER_BYTES,
  decodePcm,
  encodeWav,
  parseTaggedFrame,
  stripWavHeader,
} from "../../gateway/web/frames.js";

const bytes = (...values) => new Uint8Array(values).buffer;

test("s16le decodes little-endian samples to [-1, 1)", () => {
  // 0, 16384, -16384, 8192, -29490 as sent by the gateway for 0, .5, -.5, .25, -.9
  const out = decodePcm(bytes(0, 0, 0, 64, 0, 192, 0, 32, 206, 140));
  assert.deepEqual([...out], [0, 0.5, -0.5, 0.25, -29490 / 32768]);
});

test("f32le decodes as it is", () => {
  const f = new Float32Array([0.25, -1, 0.125]);
  assert.deepEqual([...decodePcm(f.buffer.slice(0), "pcm_f32le")], [0.25, -1, 0.125]);
});

test("G.711 tables match the gateway's decoder", () => {
  assert.deepEqual(
    [...decodePcm(bytes(255, 143, 15, 159, 3, 227), "mulaw")],
    [0.0, 0.5115966796875, -0.5115966796875, 0.2537841796875, -0.8865966796875, 0.0098876953125],
  );
  assert.deepEqual(
    [...decodePcm(bytes(213, 165, 58, 181, 41, 193), "alaw")],
    [0.000244140625, 0.515625, -0.4921875, 0.2578125, -0.890625, 0.010009765625],
  );
});

test("a partial sample or an unknown encoding is an error", () => {
  assert.throws(() => decodePcm(bytes(1, 2, 3)), RangeError);
  assert.throws(() => decodePcm(bytes(1, 2), "opus"), RangeError);
});

test("tagged header <BBHIIQ is read field by field", () => {
  const buffer = new ArrayBuffer(24);
  const view = new DataView(buffer);
  view.setUint8(0, 1);
  view.setUint8(1, 0x03);
  view.setUint16(2, 7, true);
  view.setUint32(4, 2, true);
  view.setUint32(8, 5, true);
  view.setBigUint64(12, 12345678901n, true);
  view.setInt16(20, 16384, true);
  view.setInt16(22, -16384, true);
  const frame = parseTaggedFrame(buffer);
  assert.equal(frame.contextNumber, 7);
  assert.equal(frame.utteranceIndex, 2);
  assert.equal(frame.sequence, 5);
  assert.equal(frame.sampleOffset, 12345678901);
  assert.equal(frame.first, true);
  assert.equal(frame.last, true);
  assert.equal(frame.wavHeader, false);
  assert.deepEqual([...decodePcm(frame.payload)], [0.5, -0.5]);
});

test("tagged header: wrong version or short message is rejected", () => {
  const buffer = new ArrayBuffer(20);
  new DataView(buffer).setUint8(0, 2);
  assert.throws(() => parseTaggedFrame(buffer), /version 2/);
  assert.throws(() => parseTaggedFrame(new ArrayBuffer(19)), /shorter than its header/);
});

test("the last frame may be a header with an empty payload", () => {
  const buffer = new ArrayBuffer(20);
  new DataView(buffer).setUint8(0, 1);
  new DataView(buffer).setUint8(1, 0x02);
  const frame = parseTaggedFrame(buffer);
  assert.equal(frame.last, true);
  assert.equal(decodePcm(frame.payload).length, 0);
});

test("WAV round trip: encodeWav then stripWavHeader gives the samples back", () => {
  const wav = encodeWav([new Float32Array([0, 0.5]), new Float32Array([-0.5, 1, -1])], 44100);
  const view = new DataView(wav);
  assert.equal(String.fromCharCode(...new Uint8Array(wav, 0, 4)), "RIFF");
  assert.equal(view.getUint32(24, true), 44100);
  assert.equal(view.getUint32(40, true), 10);
  const samples = decodePcm(stripWavHeader(wav));
  assert.deepEqual([...samples], [0, 16384 / 32768, -0.5, 32767 / 32768, -1]);
  // plain PCM passes through untouched
  const pcm = bytes(1, 0, 2, 0);
  assert.equal(stripWavHeader(pcm), pcm);
});

// The shared fixture of encoded frames (integrations/wire/tests/tagged_frames.json):
// the Python implementation (voice_gateway_wire.frames, which the gateway
// sends with) is checked against the same file, so the two cannot drift.
const FIXTURE = JSON.parse(
  readFileSync(new URL("../../integrations/wire/tests/tagged_frames.json", import.meta.url)),
);
const fromHex = (hex) => new Uint8Array(hex.match(/../g)?.map((b) => parseInt(b, 16)) ?? []).buffer;

test("every frame of the shared fixture parses to its fields and payload", () => {
  assert.equal(TAGGED_HEADER_BYTES, FIXTURE.header_bytes);
  assert.deepEqual(
    { first: FLAG_FIRST, last: FLAG_LAST, wav_header: FLAG_WAV_HEADER },
    FIXTURE.flags,
  );
  assert.ok(FIXTURE.frames.length >= 5);
  for (const frame of FIXTURE.frames) {
    const parsed = parseTaggedFrame(fromHex(frame.hex));
    assert.deepEqual(
      {
        version: parsed.version,
        flags: parsed.flags,
        context: parsed.contextNumber,
        utterance_index: parsed.utteranceIndex,
        sequence: parsed.sequence,
        sample_offset: parsed.sampleOffset,
        first: parsed.first,
        last: parsed.last,
        wavHeader: parsed.wavHeader,
      },
      {
        version: frame.version,
        flags: frame.flags,
        context: frame.context,
        utterance_index: frame.utterance_index,
        sequence: frame.sequence,
        sample_offset: frame.sample_offset,
        first: (frame.flags & FIXTURE.flags.first) !== 0,
        last: (frame.flags & FIXTURE.flags.last) !== 0,
        wavHeader: (frame.flags & FIXTURE.flags.wav_header) !== 0,
      },
      frame.name,
    );
    assert.deepEqual(new Uint8Array(parsed.payload), new Uint8Array(fromHex(frame.payload_hex)));
  }
});

test("every invalid frame of the shared fixture is refused", () => {
  assert.ok(FIXTURE.invalid.length >= 2);
  for (const frame of FIXTURE.invalid) {
    assert.throws(() => parseTaggedFrame(fromHex(frame.hex)), RangeError, frame.name);
  }
});

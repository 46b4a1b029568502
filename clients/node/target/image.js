'use strict';
// fortis.common.v1.Image -> pixels. The proxy forwards images exactly as the caller sent them;
// Fortis's own evaluation runner and perturbation service send lossless PNG
// (`Image.encoded`), and any caller may send a raw uint8 tensor [height, width, channels]
// (`Image.tensor`, Open Inference Protocol style). Both are handled here in pure JavaScript
// (pngjs: no native code). JPEG is refused with INVALID_ARGUMENT naming the field.

const { PNG } = require('pngjs');
const { InvalidArgument } = require('../lib/rpcstatus');

/** Largest image accepted, pixels (the same guard against decompression bombs as Fortis). */
const MAX_PIXELS = 40_000_000;
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/**
 * A decoded image: row-major uint8 pixels, `channels` per pixel (1 = grey, 3 = RGB).
 * @typedef {{height: number, width: number, channels: number, data: Uint8Array}} Pixels
 */

/** Pixels of PNG bytes (grey when the PNG is grey, else RGB; alpha dropped). */
function decodePng(buf, field) {
  if (!buf || buf.length === 0) throw new InvalidArgument(field, 'empty image bytes');
  if (buf.length >= 3 && buf[0] === 0xff && buf[1] === 0xd8 && buf[2] === 0xff) {
    throw new InvalidArgument(field, 'JPEG is not supported by this target; send PNG or a raw uint8 tensor');
  }
  if (buf.length < 24 || !buf.subarray(0, 8).equals(PNG_MAGIC)) {
    throw new InvalidArgument(field, `not a decodable PNG image (${buf.length} bytes)`);
  }
  const width = buf.readUInt32BE(16);
  const height = buf.readUInt32BE(20);
  if (width * height > MAX_PIXELS) {
    throw new InvalidArgument(field, `image too large: ${width}x${height} pixels`);
  }
  let png;
  try {
    png = PNG.sync.read(Buffer.from(buf));        // RGBA, 8 bits per sample
  } catch (e) {
    throw new InvalidArgument(field, `not a decodable PNG image (${buf.length} bytes): ${e.message}`);
  }
  const n = png.width * png.height;
  const rgba = png.data;
  let grey = true;
  for (let i = 0; i < n && grey; i++) {
    const o = 4 * i;
    grey = rgba[o] === rgba[o + 1] && rgba[o] === rgba[o + 2];
  }
  const channels = grey ? 1 : 3;
  const data = new Uint8Array(n * channels);
  for (let i = 0; i < n; i++) {
    for (let c = 0; c < channels; c++) data[i * channels + c] = rgba[4 * i + c];
  }
  return { height: png.height, width: png.width, channels, data };
}

/** Pixels of a raw fortis.common.v1.Tensor (uint8, [H, W] or [H, W, 1|3]). */
function decodeTensor(t, field) {
  if (t.dtype !== 'D_TYPE_UINT8') {
    throw new InvalidArgument(`${field}.dtype`, `images must be uint8 tensors, got '${t.dtype}'`);
  }
  const shape = (t.shape || []).map(Number);
  if (shape.length === 2) shape.push(1);
  if (shape.length !== 3 || !(shape[2] === 1 || shape[2] === 3) || shape[0] <= 0 || shape[1] <= 0) {
    throw new InvalidArgument(`${field}.shape`, `expected [height, width, 1|3], got [${(t.shape || []).join(', ')}]`);
  }
  const [height, width, channels] = shape;
  if (height * width > MAX_PIXELS) throw new InvalidArgument(`${field}.shape`, 'image too large');
  const data = t.data || Buffer.alloc(0);
  if (data.length !== height * width * channels) {
    throw new InvalidArgument(`${field}.data`, `${data.length} bytes do not match shape [${shape.join(', ')}] of uint8`);
  }
  return { height, width, channels, data: new Uint8Array(data.buffer, data.byteOffset, data.length) };
}

/** Pixels of a fortis.common.v1.Image (proto-loader object, `oneofs: true`). */
function decodeImage(msg, field) {
  const kind = msg.content || (msg.encoded && msg.encoded.length ? 'encoded' : (msg.tensor ? 'tensor' : ''));
  if (kind === 'encoded') return decodePng(msg.encoded, `${field}.encoded`);
  if (kind === 'tensor') return decodeTensor(msg.tensor, `${field}.tensor`);
  throw new InvalidArgument(field, "image has no content: set 'encoded' or 'tensor'");
}

module.exports = { decodeImage, decodePng, decodeTensor, MAX_PIXELS };

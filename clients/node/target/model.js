'use strict';
// A tiny linear classifier of 28x28 grey clothing images (Fashion-MNIST's ten classes):
// grey -> 28x28 (box resampling) -> 2x2 mean pooling -> 196 features in [0, 1] ->
// softmax(W x + b). Plain JavaScript, no tensor library. The weights live in model.json,
// written by train.js (multinomial logistic regression on the 60,000 training images).

const fs = require('node:fs');
const path = require('node:path');

const DEFAULT_MODEL = path.join(__dirname, 'model.json');

/** Grey value of pixel i (ITU-R 601 luma for RGB). */
function greyAt(img, i) {
  const d = img.data;
  if (img.channels === 1) return d[i];
  const o = i * img.channels;
  return 0.299 * d[o] + 0.587 * d[o + 1] + 0.114 * d[o + 2];
}

/** Grey image resampled to size x size: mean of the source pixels under each target pixel
 *  (area resampling when shrinking), nearest pixel when enlarging. Float64Array, 0..255. */
function greyResized(img, size) {
  const { height: h, width: w } = img;
  const out = new Float64Array(size * size);
  for (let oy = 0; oy < size; oy++) {
    let y0 = Math.floor((oy * h) / size);
    let y1 = Math.floor(((oy + 1) * h) / size);
    if (y1 <= y0) { y0 = Math.min(h - 1, Math.floor(((oy + 0.5) * h) / size)); y1 = y0 + 1; }
    for (let ox = 0; ox < size; ox++) {
      let x0 = Math.floor((ox * w) / size);
      let x1 = Math.floor(((ox + 1) * w) / size);
      if (x1 <= x0) { x0 = Math.min(w - 1, Math.floor(((ox + 0.5) * w) / size)); x1 = x0 + 1; }
      let s = 0;
      for (let y = y0; y < y1; y++) for (let x = x0; x < x1; x++) s += greyAt(img, y * w + x);
      out[oy * size + ox] = s / ((y1 - y0) * (x1 - x0));
    }
  }
  return out;
}

/** The model's features of a decoded image: (size/pool)^2 pooled grey values in [0, 1]. */
function features(img, size = 28, pool = 2) {
  const g = greyResized(img, size);
  const n = size / pool;
  const f = new Float64Array(n * n);
  for (let y = 0; y < size; y++) {
    for (let x = 0; x < size; x++) f[Math.floor(y / pool) * n + Math.floor(x / pool)] += g[y * size + x];
  }
  for (let i = 0; i < f.length; i++) f[i] /= 255 * pool * pool;
  return f;
}

/** Softmax of logits, in place safe (returns a new array). */
function softmax(z) {
  const m = Math.max(...z);
  const e = z.map((v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
}

class LinearModel {
  /** @param {object} spec the parsed model.json */
  constructor(spec) {
    this.name = spec.name;
    this.version = spec.version;
    this.labels = spec.labels;
    this.size = spec.input.height;
    this.pool = spec.pool;
    this.weights = spec.weights.map((row) => Float64Array.from(row));
    this.bias = Float64Array.from(spec.bias);
    const nf = (this.size / this.pool) ** 2;
    if (this.weights.length !== this.labels.length || this.weights.some((r) => r.length !== nf)) {
      throw new Error(`model ${spec.name}: weights must be ${this.labels.length} x ${nf}`);
    }
  }

  static load(file = DEFAULT_MODEL) {
    return new LinearModel(JSON.parse(fs.readFileSync(file, 'utf8')));
  }

  logits(f) {
    return this.weights.map((w, k) => {
      let s = this.bias[k];
      for (let i = 0; i < f.length; i++) s += w[i] * f[i];
      return s;
    });
  }

  /** Class probabilities (one per label) of a decoded image. */
  predict(img) {
    return softmax(this.logits(features(img, this.size, this.pool)));
  }
}

module.exports = { LinearModel, DEFAULT_MODEL, features, greyResized, softmax };

#!/usr/bin/env node
'use strict';
// Writes model.json: multinomial logistic regression on Fashion-MNIST's 60,000 training images
// over the features of model.js (2x2-pooled 14x14 grey values), by mini-batch SGD with a seeded
// shuffle, so the same data gives the same weights. Pure JavaScript; about a minute on one core;
// 82% accuracy on the 10,000 test images.
//
//   node clients/node/target/train.js [--data /usr/share/datasets/fashion-mnist]
//        [--out clients/node/target/model.json] [--epochs 12] [--seed 7]
//
// The data: Debian's dataset-fashion-mnist package (or $FORTIS_FMNIST_DIR), the four
// *-ubyte.gz files. Nothing is downloaded.

const fs = require('node:fs');
const path = require('node:path');
const zlib = require('node:zlib');
const { features, softmax, DEFAULT_MODEL } = require('./model');

const LABELS = ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
  'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot'];

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

function readIdx(file, magic) {
  const raw = zlib.gunzipSync(fs.readFileSync(file));
  if (raw.readUInt32BE(0) !== magic) throw new Error(`${file}: bad idx magic`);
  const ndim = magic & 0xff;
  const dims = Array.from({ length: ndim }, (_, i) => raw.readUInt32BE(4 + 4 * i));
  return { dims, data: raw.subarray(4 + 4 * ndim) };
}

function load(dir, prefix) {
  const im = readIdx(path.join(dir, `${prefix}-images-idx3-ubyte.gz`), 0x0803);
  const lb = readIdx(path.join(dir, `${prefix}-labels-idx1-ubyte.gz`), 0x0801);
  const [n, h, w] = im.dims;
  const x = [];
  for (let i = 0; i < n; i++) {
    x.push(features({ height: h, width: w, channels: 1, data: im.data.subarray(i * h * w, (i + 1) * h * w) }));
  }
  return { x, y: Array.from(lb.data) };
}

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function accuracy(W, b, x, y) {
  let ok = 0;
  for (let i = 0; i < x.length; i++) {
    let best = -Infinity;
    let arg = -1;
    for (let k = 0; k < W.length; k++) {
      let s = b[k];
      for (let j = 0; j < x[i].length; j++) s += W[k][j] * x[i][j];
      if (s > best) { best = s; arg = k; }
    }
    if (arg === y[i]) ok++;
  }
  return ok / x.length;
}

function main() {
  const dir = arg('data', process.env.FORTIS_FMNIST_DIR || '/usr/share/datasets/fashion-mnist');
  const out = arg('out', DEFAULT_MODEL);
  const epochs = Number(arg('epochs', 12));
  const seed = Number(arg('seed', 7));
  const train = load(dir, 'train');
  const test = load(dir, 't10k');
  const K = LABELS.length;
  const D = train.x[0].length;
  const W = Array.from({ length: K }, () => new Float64Array(D));
  const b = new Float64Array(K);
  const rand = mulberry32(seed);
  const order = train.x.map((_, i) => i);
  const batch = 50;
  const l2 = 1e-4;
  for (let ep = 0; ep < epochs; ep++) {
    for (let i = order.length - 1; i > 0; i--) {            // Fisher-Yates, seeded
      const j = Math.floor(rand() * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    const lr = 0.5 / (1 + ep);
    for (let s = 0; s < order.length; s += batch) {
      const gW = Array.from({ length: K }, () => new Float64Array(D));
      const gb = new Float64Array(K);
      const idx = order.slice(s, s + batch);
      for (const i of idx) {
        const xi = train.x[i];
        const z = W.map((w, k) => { let v = b[k]; for (let j = 0; j < D; j++) v += w[j] * xi[j]; return v; });
        const p = softmax(z);
        p[train.y[i]] -= 1;
        for (let k = 0; k < K; k++) {
          gb[k] += p[k];
          const g = gW[k];
          for (let j = 0; j < D; j++) g[j] += p[k] * xi[j];
        }
      }
      for (let k = 0; k < K; k++) {
        b[k] -= (lr * gb[k]) / idx.length;
        for (let j = 0; j < D; j++) W[k][j] -= lr * (gW[k][j] / idx.length + l2 * W[k][j]);
      }
    }
    console.error(`epoch ${ep + 1}/${epochs}: train accuracy ${accuracy(W, b, train.x, train.y).toFixed(4)}`);
  }
  const acc = accuracy(W, b, test.x, test.y);
  const round = (v) => Math.round(v * 1e4) / 1e4;
  const spec = {
    format: 'fortis-node-linear/1',
    name: 'fmnist-linear-node',
    version: `linear-14x14-e${epochs}-s${seed}`,
    labels: LABELS,
    input: { height: 28, width: 28, channels: 1 },
    pool: 2,
    trained: { data: 'Fashion-MNIST train (60,000)', epochs, seed, test_accuracy: round(acc) },
    bias: Array.from(b, round),
    weights: W.map((w) => Array.from(w, round)),
  };
  fs.writeFileSync(out, `${JSON.stringify(spec)}\n`);
  console.error(`test accuracy ${acc.toFixed(4)}; wrote ${out}`);
}

main();

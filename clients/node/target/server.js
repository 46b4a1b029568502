#!/usr/bin/env node
'use strict';
// fortis.target.v1.TargetService in Node.js: a Fashion-MNIST classifier (model.js, a linear
// model over 28x28 grey images, ten classes, full scores) that Fortis's target proxy can query
// like any built-in target:
//
//   node clients/node/target/server.js --address 127.0.0.1:50061
//   fortis serve --target node-target=grpc://127.0.0.1:50061
//
// It prints one JSON line when it is serving, e.g. {"address":"127.0.0.1:50061",...}
// (--address 127.0.0.1:0 picks a free port). SIGTERM/SIGINT stop it gracefully.
//
// Options: --model FILE (model.json), --name NAME (reported name), --output
// full_scores|top_k|label_only, --top-k K, --max-batch N, --log-calls (one JSON line per
// Predict call or stream batch on stderr: {"rpc","images","ok","ms"}; the images this
// target actually received, to set beside the proxy's ledger).

const grpc = require('@grpc/grpc-js');
const { load } = require('../lib/protos');
const { InvalidArgument, toServiceError, toStatusMessage } = require('../lib/rpcstatus');
const { decodeImage } = require('./image');
const { LinearModel, DEFAULT_MODEL } = require('./model');

const OUTPUTS = {
  full_scores: 'OUTPUT_KIND_FULL_SCORES',
  top_k: 'OUTPUT_KIND_TOP_K_SCORES',
  label_only: 'OUTPUT_KIND_LABEL_ONLY',
};

/**
 * The TargetService handlers for a classifier.
 * @param {{labels: string[], name: string, version: string, size: number,
 *          predict: (img: import('./image').Pixels) => number[]}} model
 * @param {{name?: string, output?: string, topK?: number, maxBatch?: number,
 *          onCall?: (rpc: string, images: number, ok: boolean, ms: number) => void}} opts
 */
function targetHandlers(model, opts = {}) {
  const output = opts.output || 'full_scores';
  if (!OUTPUTS[output]) throw new Error(`--output must be one of ${Object.keys(OUTPUTS).join(', ')}`);
  const topK = Math.max(1, Math.min(opts.topK || 5, model.labels.length));
  const maxBatch = opts.maxBatch || 256;
  const info = {
    name: opts.name || model.name,
    task_type: 'TASK_TYPE_CLASSIFICATION',
    labels: model.labels,
    output_kind: OUTPUTS[output],
    top_k: output === 'top_k' ? topK : 0,
    input: { height: model.size, width: model.size, channels: 1, max_batch_size: maxBatch },
    version: `node ${process.versions.node}; ${model.version}`,
  };

  const onCall = opts.onCall || (() => {});

  /** One batch, timed and reported to onCall. */
  function answer(rpc, images) {
    const t0 = process.hrtime.bigint();
    let ok = false;
    try {
      const out = classify(images, 'images');
      ok = true;
      return out;
    } finally {
      onCall(rpc, images.length, ok, Number(process.hrtime.bigint() - t0) / 1e6);
    }
  }

  /** One batch of fortis.common.v1.Image -> fortis.common.v1.Prediction, in order. */
  function classify(images, field) {
    if (images.length > maxBatch) {
      throw new InvalidArgument(field, `at most ${maxBatch} images per call, got ${images.length}`);
    }
    // Decode every image first: a bad one fails the whole call, naming its index.
    const pixels = images.map((im, i) => decodeImage(im, `${field}[${i}]`));
    return pixels.map((img, i) => {
      const p = model.predict(img);
      const order = p.map((_, k) => k).sort((a, b) => p[b] - p[a] || a - b);
      const keep = output === 'full_scores' ? order : order.slice(0, output === 'top_k' ? topK : 1);
      return {
        image_id: images[i].image_id,
        classification: {
          classes: keep.map((k) => (output === 'label_only'
            ? { label: k, name: model.labels[k] }
            : { label: k, name: model.labels[k], score: p[k] })),
        },
      };
    });
  }

  return {
    GetTargetInfo(call, callback) {
      callback(null, { info });
    },
    Predict(call, callback) {
      try {
        callback(null, { predictions: answer('Predict', call.request.images) });
      } catch (err) {
        callback(toServiceError(err));
      }
    },
    PredictStream(call) {
      // One response per request, in order; a bad batch answers with its error in-band and
      // the stream stays open.
      call.on('data', (req) => {
        try {
          call.write({ request_id: req.request_id, predictions: answer('PredictStream', req.images) });
        } catch (err) {
          call.write({ request_id: req.request_id, predictions: [], error: toStatusMessage(err) });
        }
      });
      call.on('end', () => call.end());
      call.on('error', () => { /* the caller went away */ });
    },
  };
}

/** A grpc-js Server with TargetService registered (not yet bound). */
function createTargetServer(model, opts = {}) {
  const pkg = load(['fortis/target/v1/target.proto']);
  const server = new grpc.Server({
    'grpc.max_receive_message_length': 64 * 1024 * 1024,
    'grpc.max_send_message_length': 64 * 1024 * 1024,
  });
  server.addService(pkg.fortis.target.v1.TargetService.service, targetHandlers(model, opts));
  return server;
}

function parseArgs(argv) {
  const o = { address: '127.0.0.1:50061', model: DEFAULT_MODEL };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--address') o.address = val();
    else if (a === '--model') o.model = val();
    else if (a === '--name') o.name = val();
    else if (a === '--output') o.output = val();
    else if (a === '--top-k') o.topK = Number(val());
    else if (a === '--max-batch') o.maxBatch = Number(val());
    else if (a === '--log-calls') o.logCalls = true;
    else if (a === '-h' || a === '--help') o.help = true;
    else throw new Error(`unknown argument '${a}'`);
  }
  return o;
}

function main() {
  let o;
  try {
    o = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`fortis-node-target: ${e.message}`);
    process.exit(2);
  }
  if (o.help) {
    console.log('usage: node target/server.js [--address HOST:PORT] [--model model.json] [--name NAME]\n'
      + '                           [--output full_scores|top_k|label_only] [--top-k K] [--max-batch N]\n'
      + '                           [--log-calls]');
    return;
  }
  const model = LinearModel.load(o.model);
  if (o.logCalls) {
    o.onCall = (rpc, images, ok, ms) => process.stderr.write(
      `${JSON.stringify({ rpc, images, ok, ms: Math.round(ms * 1000) / 1000 })}\n`);
  }
  const server = createTargetServer(model, o);
  server.bindAsync(o.address, grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) {
      console.error(`fortis-node-target: cannot bind ${o.address}: ${err.message}`);
      process.exit(1);
    }
    const host = o.address.slice(0, o.address.lastIndexOf(':'));
    process.stdout.write(`${JSON.stringify({
      address: `${host}:${port}`, name: o.name || model.name, labels: model.labels.length,
      output: o.output || 'full_scores', pid: process.pid,
    })}\n`);
  });
  const stop = () => {
    server.tryShutdown(() => process.exit(0));
    setTimeout(() => { server.forceShutdown(); process.exit(0); }, 5000).unref();  // open streams
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (require.main === module) main();

module.exports = { createTargetServer, targetHandlers };

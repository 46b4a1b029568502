'use strict';
// Loads the Fortis contracts at run time from the repository's protos/ folder (one copy of
// each .proto; nothing generated is checked in). google/rpc/status.proto is vendored there;
// google/protobuf/*.proto (timestamp, struct, any) come with @grpc/proto-loader.

const path = require('node:path');
const fs = require('node:fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

/** The protos/ folder: $FORTIS_PROTOS, else <repo>/protos (this file is clients/node/lib/). */
function protoRoot() {
  const root = process.env.FORTIS_PROTOS || path.resolve(__dirname, '..', '..', '..', 'protos');
  if (!fs.existsSync(path.join(root, 'fortis'))) {
    throw new Error(`Fortis protos not found under ${root}; set FORTIS_PROTOS to the repository's protos/ folder`);
  }
  return root;
}

/**
 * Options for @grpc/proto-loader. Field names stay as written in the .proto files
 * (snake_case), enums travel as their names ('TASK_TYPE_CLASSIFICATION'), 64-bit integers as
 * JavaScript numbers (exact up to 2^53, which every Fortis count and shape stays below), and
 * `oneofs: true` adds a virtual field naming the member that is set (e.g. image.content).
 */
const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});

/** grpc.loadPackageDefinition of the given proto files (paths relative to protos/). */
function load(files) {
  const def = protoLoader.loadSync(files, { ...LOADER_OPTIONS, includeDirs: [protoRoot()] });
  return grpc.loadPackageDefinition(def);
}

module.exports = { load, protoRoot, LOADER_OPTIONS };

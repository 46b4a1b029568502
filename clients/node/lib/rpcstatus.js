'use strict';
// google.rpc.Status with a google.rpc.BadRequest detail, in and out of the
// "grpc-status-details-bin" trailer: the richer error model every Fortis service uses
// (DESIGN.md section 1: INVALID_ARGUMENT carries a BadRequest naming the field).
//
// The messages are tiny and stable, so they are written and read here in protobuf wire format
// directly (about fifty lines) rather than pulling in a second protobuf runtime:
//   Status         { int32 code = 1; string message = 2; repeated Any details = 3; }
//   Any            { string type_url = 1; bytes value = 2; }
//   BadRequest     { repeated FieldViolation field_violations = 1; }
//   FieldViolation { string field = 1; string description = 2; }

const grpc = require('@grpc/grpc-js');

const DETAILS_KEY = 'grpc-status-details-bin';
const BAD_REQUEST_URL = 'type.googleapis.com/google.rpc.BadRequest';

// -- writing ---------------------------------------------------------------------------------

function varint(n) {
  const out = [];
  let v = BigInt.asUintN(64, BigInt(n));     // negative int32 -> ten bytes, as protobuf does
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
  return Buffer.from(out);
}

function lenField(num, buf) {
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(String(buf), 'utf8');
  return Buffer.concat([varint((num << 3) | 2), varint(b.length), b]);
}

function varintField(num, n) {
  return Buffer.concat([varint(num << 3), varint(n)]);
}

/** Serialized google.rpc.BadRequest of [{field, description}, ...]. */
function encodeBadRequest(violations) {
  return Buffer.concat(violations.map((v) => lenField(1, Buffer.concat([
    lenField(1, v.field || ''), lenField(2, v.description || '')]))));
}

/** Serialized google.rpc.Status; details: [{type_url, value: Buffer}, ...]. */
function encodeStatus({ code, message, details = [] }) {
  const parts = [];
  if (code) parts.push(varintField(1, code));
  if (message) parts.push(lenField(2, message));
  for (const d of details) parts.push(lenField(3, Buffer.concat([lenField(1, d.type_url), lenField(2, d.value)])));
  return Buffer.concat(parts);
}

// -- reading ---------------------------------------------------------------------------------

/** Fields of one serialized message: Map(number -> [number | Buffer, ...]). */
function fields(buf) {
  const out = new Map();
  let i = 0;
  const readVarint = () => {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      if (i >= buf.length) throw new Error('truncated varint');
      const b = buf[i++];
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
      shift += 7n;
    }
  };
  while (i < buf.length) {
    const key = Number(readVarint());
    const num = key >>> 3;
    const wire = key & 7;
    let value;
    if (wire === 0) value = Number(BigInt.asIntN(32, readVarint()));
    else if (wire === 2) {
      const n = Number(readVarint());
      value = buf.subarray(i, i + n);
      i += n;
    } else if (wire === 1) { value = buf.subarray(i, i + 8); i += 8; }
    else if (wire === 5) { value = buf.subarray(i, i + 4); i += 4; }
    else throw new Error(`unsupported wire type ${wire}`);
    if (!out.has(num)) out.set(num, []);
    out.get(num).push(value);
  }
  return out;
}

/** {code, message, details: [{type_url, value}]} of a serialized google.rpc.Status. */
function decodeStatus(buf) {
  const f = fields(buf);
  return {
    code: (f.get(1) || [0])[0],
    message: (f.get(2) || []).map((b) => b.toString('utf8')).join(''),
    details: (f.get(3) || []).map((b) => {
      const a = fields(b);
      return { type_url: ((a.get(1) || [])[0] || Buffer.alloc(0)).toString('utf8'), value: (a.get(2) || [Buffer.alloc(0)])[0] };
    }),
  };
}

/** [{field, description}] of a serialized google.rpc.BadRequest. */
function decodeBadRequest(buf) {
  return (fields(buf).get(1) || []).map((b) => {
    const v = fields(b);
    return { field: ((v.get(1) || [])[0] || '').toString('utf8'), description: ((v.get(2) || [])[0] || '').toString('utf8') };
  });
}

/** The field violations a failed call carried in its trailers ([] when none). */
function fieldViolations(err) {
  const md = err && err.metadata;
  const raw = md && typeof md.get === 'function' ? md.get(DETAILS_KEY) : [];
  const out = [];
  for (const b of raw) {
    try {
      for (const d of decodeStatus(Buffer.from(b)).details) {
        if (d.type_url === BAD_REQUEST_URL) out.push(...decodeBadRequest(d.value));
      }
    } catch { /* malformed details: fall back to the message */ }
  }
  return out;
}

// -- errors for servers ----------------------------------------------------------------------

/** A domain error: a field of the request is invalid. */
class InvalidArgument extends Error {
  constructor(field, description) {
    super(`${field}: ${description}`);
    this.field = field;
    this.description = description;
  }
}

/** The grpc-js ServiceError for an InvalidArgument: INVALID_ARGUMENT + BadRequest trailer. */
function toServiceError(err) {
  if (err instanceof InvalidArgument) {
    const md = new grpc.Metadata();
    const violations = [{ field: err.field, description: err.description }];
    md.set(DETAILS_KEY, encodeStatus({
      code: grpc.status.INVALID_ARGUMENT, message: err.message,
      details: [{ type_url: BAD_REQUEST_URL, value: encodeBadRequest(violations) }],
    }));
    return { code: grpc.status.INVALID_ARGUMENT, details: err.message, metadata: md };
  }
  // Unknown failures: INTERNAL without internals (the stack stays in this process's log).
  console.error(err);
  return { code: grpc.status.INTERNAL, details: 'internal error' };
}

/** The google.rpc.Status message (proto-loader object form) for an in-stream error. */
function toStatusMessage(err) {
  if (err instanceof InvalidArgument) {
    return {
      code: grpc.status.INVALID_ARGUMENT, message: err.message,
      details: [{ type_url: BAD_REQUEST_URL, value: encodeBadRequest([{ field: err.field, description: err.description }]) }],
    };
  }
  console.error(err);
  return { code: grpc.status.INTERNAL, message: 'internal error', details: [] };
}

module.exports = {
  BAD_REQUEST_URL, DETAILS_KEY, InvalidArgument, decodeBadRequest, decodeStatus,
  encodeBadRequest, encodeStatus, fieldViolations, toServiceError, toStatusMessage,
};

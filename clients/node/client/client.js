'use strict';
// A small Fortis client for Node.js over fortis.evaluation.v1.EvaluationService (and the
// proxy's ListTargets), with the contracts loaded at run time from protos/. Promise-based:
//
//   const { FortisClient } = require('./client');
//   const fc = new FortisClient('127.0.0.1:50051', { apiKey: process.env.FORTIS_API_KEY });
//   const ev = await fc.submit(fs.readFileSync('plan.yaml', 'utf8'));
//   const final = await fc.wait(ev.evaluation_id, (e) => console.log(e.progress));
//   if (final.state === 'EVALUATION_STATE_SUCCEEDED') await fc.writeReport(ev.evaluation_id, 'out');
//   fc.close();

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const { load } = require('../lib/protos');
const { fieldViolations } = require('../lib/rpcstatus');

const FINAL_STATES = new Set(['EVALUATION_STATE_SUCCEEDED', 'EVALUATION_STATE_FAILED', 'EVALUATION_STATE_CANCELLED']);
const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

/** A failed call: gRPC code, the server's message and its field violations (BadRequest). */
class FortisError extends Error {
  constructor(err) {
    super(err.details || err.message);
    this.code = err.code;
    this.codeName = CODE_NAMES[err.code] || String(err.code);
    this.violations = fieldViolations(err);
  }
}

/** Short state name: 'EVALUATION_STATE_SUCCEEDED' -> 'SUCCEEDED'. */
function stateName(state) {
  return String(state).replace(/^EVALUATION_STATE_/, '');
}

class FortisClient {
  /**
   * @param {string} address host:port of a Fortis server (`fortis serve`)
   * @param {{apiKey?: string, tls?: boolean, ca?: Buffer, timeoutMs?: number}} opts
   */
  constructor(address, opts = {}) {
    const pkg = load(['fortis/evaluation/v1/evaluation.proto', 'fortis/proxy/v1/proxy.proto']);
    const creds = opts.tls ? grpc.credentials.createSsl(opts.ca || null) : grpc.credentials.createInsecure();
    const options = { 'grpc.max_receive_message_length': -1, 'grpc.max_send_message_length': 64 * 1024 * 1024 };
    this.evaluations = new pkg.fortis.evaluation.v1.EvaluationService(address, creds, options);
    // Share the channel between the two stubs.
    this.proxy = new pkg.fortis.proxy.v1.TargetProxyService(address, creds,
      { ...options, channelOverride: this.evaluations.getChannel() });
    this.metadata = new grpc.Metadata();
    if (opts.apiKey) this.metadata.set('x-api-key', opts.apiKey);
    this.timeoutMs = opts.timeoutMs || 60_000;
  }

  _unary(stub, method, request, timeoutMs = this.timeoutMs) {
    return new Promise((resolve, reject) => {
      stub[method](request, this.metadata, { deadline: Date.now() + timeoutMs }, (err, resp) => {
        if (err) reject(new FortisError(err));
        else resolve(resp);
      });
    });
  }

  /** Validates and starts a plan (YAML or JSON text, sent as-is). Resolves to the Evaluation. */
  async submit(planText, { format = '', evaluationId = '' } = {}) {
    const fmt = { yaml: 'PLAN_FORMAT_YAML', json: 'PLAN_FORMAT_JSON' }[format] || 'PLAN_FORMAT_UNSPECIFIED';
    const r = await this._unary(this.evaluations, 'CreateEvaluation',
      { plan: planText, format: fmt, evaluation_id: evaluationId });
    return r.evaluation;
  }

  async get(evaluationId) {
    return (await this._unary(this.evaluations, 'GetEvaluation', { evaluation_id: evaluationId })).evaluation;
  }

  async list(pageSize = 50) {
    return (await this._unary(this.evaluations, 'ListEvaluations', { page_size: pageSize })).evaluations;
  }

  async cancel(evaluationId) {
    return (await this._unary(this.evaluations, 'CancelEvaluation', { evaluation_id: evaluationId })).evaluation;
  }

  /** {report_json, report_html} of a finished evaluation. */
  async report(evaluationId) {
    return this._unary(this.evaluations, 'GetEvaluationReport', { evaluation_id: evaluationId }, 300_000);
  }

  /** Targets this tenant may query (the proxy's ListTargets). */
  async listTargets() {
    return (await this._unary(this.proxy, 'ListTargets', {})).targets;
  }

  /** Follows WatchEvaluation once; resolves to the last Evaluation seen (null if none). */
  watchOnce(evaluationId, onUpdate) {
    return new Promise((resolve, reject) => {
      let last = null;
      const call = this.evaluations.WatchEvaluation({ evaluation_id: evaluationId }, this.metadata);
      call.on('data', (r) => {
        last = r.evaluation;
        if (onUpdate) onUpdate(last);
      });
      call.on('error', (err) => {
        if (err.code === grpc.status.UNAVAILABLE) resolve(last);   // dropped: the caller re-watches
        else reject(new FortisError(err));
      });
      call.on('end', () => resolve(last));
    });
  }

  /** Follows the evaluation until it ends (re-watching after a dropped stream); resolves to
   *  the final Evaluation. onUpdate gets every Evaluation the stream sends. */
  async wait(evaluationId, onUpdate) {
    let delay = 200;
    for (;;) {
      let last = await this.watchOnce(evaluationId, onUpdate);
      if (last && FINAL_STATES.has(last.state)) return last;
      try {
        last = await this.get(evaluationId);
        if (FINAL_STATES.has(last.state)) return last;
      } catch (e) {
        if (e.code !== grpc.status.UNAVAILABLE) throw e;
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5_000);
    }
  }

  /** Writes report.json and report.html into dir; resolves to their paths. */
  async writeReport(evaluationId, dir) {
    const r = await this.report(evaluationId);
    fs.mkdirSync(dir, { recursive: true });
    const json = path.join(dir, 'report.json');
    const html = path.join(dir, 'report.html');
    fs.writeFileSync(json, r.report_json);
    fs.writeFileSync(html, r.report_html);
    return { json, html };
  }

  close() {
    this.evaluations.close();
  }
}

module.exports = { FortisClient, FortisError, FINAL_STATES, stateName };

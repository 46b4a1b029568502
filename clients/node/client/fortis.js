#!/usr/bin/env node
'use strict';
// Drive Fortis from Node.js.
//
//   node clients/node/client/fortis.js run PLAN.yaml --address 127.0.0.1:50051 --api-key KEY --out DIR
//   node clients/node/client/fortis.js get|cancel ID     --address ... --api-key ...
//   node clients/node/client/fortis.js report ID --out DIR --address ... --api-key ...
//   node clients/node/client/fortis.js list|targets      --address ... --api-key ...
//
// `run` sends the plan text as-is (YAML or JSON; the server parses and validates it), follows
// the evaluation's WatchEvaluation stream printing one progress line per change on stderr,
// then writes report.json and report.html into --out and prints one JSON line on stdout.
// --api-key defaults to $FORTIS_API_KEY and --address to $FORTIS_ADDRESS or 127.0.0.1:50051.
//
// Exit status: 0 done; 1 the evaluation failed or was cancelled, or the server failed;
// 2 bad input (unreadable plan, INVALID_ARGUMENT from the server, bad usage).

const fs = require('node:fs');
const path = require('node:path');
const { FortisClient, FortisError, stateName } = require('./client');

const EXIT_FAILED = 1;
const EXIT_BAD_INPUT = 2;

const USAGE = `usage: fortis.js COMMAND [ARGS] [--address HOST:PORT] [--api-key KEY] [--tls]
commands:
  run PLAN --out DIR [--id ID] [--format yaml|json] [--quiet]   submit, follow, download the report
  get ID                  print an evaluation (JSON)
  list                    list evaluations, newest first (JSON lines)
  cancel ID               cancel a pending or running evaluation
  report ID --out DIR     download report.json and report.html
  targets                 list the targets this API key may query`;

class UsageError extends Error {}

function parseArgs(argv) {
  const o = {
    positional: [],
    address: process.env.FORTIS_ADDRESS || '127.0.0.1:50051',
    apiKey: process.env.FORTIS_API_KEY || '',
    out: '',
    id: '',
    format: '',
    quiet: false,
    tls: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new UsageError(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--address') o.address = val();
    else if (a === '--api-key') o.apiKey = val();
    else if (a === '--out') o.out = val();
    else if (a === '--id') o.id = val();
    else if (a === '--format') o.format = val();
    else if (a === '--quiet' || a === '-q') o.quiet = true;
    else if (a === '--tls') o.tls = true;
    else if (a === '-h' || a === '--help') o.help = true;
    else if (a.startsWith('--')) throw new UsageError(`unknown option '${a}'`);
    else o.positional.push(a);
  }
  return o;
}

function say(msg) {
  process.stderr.write(`${msg}\n`);
}

/** One progress line per change of the evaluation's state or progress. */
function progressPrinter(quiet) {
  let last = '';
  return (ev) => {
    const p = ev.progress || {};
    const stage = p.stage && p.stage !== 'STAGE_UNSPECIFIED'
      ? p.stage.replace(/^STAGE_/, '').toLowerCase() : stateName(ev.state).toLowerCase();
    const line = `[${stage}] ${p.items_done}/${p.items_total} items, `
      + `${p.queries} queries${p.message ? ` (${p.message})` : ''}`;
    if (!quiet && line !== last) say(line);
    last = line;
  };
}

function need(o, n, what) {
  if (o.positional.length < n + 1) throw new UsageError(`missing ${what}`);
  return o.positional[n];
}

async function cmdRun(fc, o) {
  const planPath = need(o, 1, 'PLAN');
  if (!o.out) throw new UsageError('run needs --out DIR');
  let text;
  try {
    text = fs.readFileSync(planPath, 'utf8');
  } catch (e) {
    say(`fortis: cannot read plan: ${e.message}`);
    return EXIT_BAD_INPUT;
  }
  const format = o.format || { '.json': 'json', '.yaml': 'yaml', '.yml': 'yaml' }[path.extname(planPath).toLowerCase()] || '';
  const ev = await fc.submit(text, { format, evaluationId: o.id });
  if (!o.quiet) say(`Evaluation ${ev.evaluation_id} submitted (plan '${ev.plan_name}')`);
  const final = await fc.wait(ev.evaluation_id, progressPrinter(o.quiet));
  const state = stateName(final.state);
  if (state !== 'SUCCEEDED') {
    const err = final.error || {};
    say(`fortis: evaluation ${ev.evaluation_id} ended ${state}${err.message ? `: ${err.message}` : ''}`);
    return EXIT_FAILED;
  }
  const files = await fc.writeReport(ev.evaluation_id, o.out);
  // EvaluationSummary: unset optional values stay out; int64 m arrives as a string.
  const s = final.summary || {};
  const summary = { m: Number(s.m || 0) };
  for (const k of ['accuracy', 'average_robustness_corr', 'average_robustness_adv']) {
    if (s[k] !== undefined && s[k] !== null) summary[k] = s[k];
  }
  if (!o.quiet) say(`Report: ${files.json}, ${files.html}`);
  process.stdout.write(`${JSON.stringify({
    evaluation_id: ev.evaluation_id, state, report_json: files.json, report_html: files.html,
    queries: (final.progress || {}).queries, summary,
  })}\n`);
  return 0;
}

function evaluationJson(ev) {
  return JSON.stringify({
    evaluation_id: ev.evaluation_id, state: stateName(ev.state), plan_name: ev.plan_name,
    progress: ev.progress, error: ev.error ? { code: ev.error.code, message: ev.error.message } : null,
    resumed_count: ev.resumed_count,
  });
}

async function run(argv) {
  let o;
  try {
    o = parseArgs(argv);
  } catch (e) {
    say(`fortis: ${e.message}\n${USAGE}`);
    return EXIT_BAD_INPUT;
  }
  const cmd = o.positional[0];
  if (o.help || !cmd) {
    (o.help ? console.log : say)(USAGE);
    return o.help ? 0 : EXIT_BAD_INPUT;
  }
  const fc = new FortisClient(o.address, { apiKey: o.apiKey, tls: o.tls });
  try {
    switch (cmd) {
      case 'run':
        return await cmdRun(fc, o);
      case 'get':
        console.log(evaluationJson(await fc.get(need(o, 1, 'ID'))));
        return 0;
      case 'cancel':
        console.log(evaluationJson(await fc.cancel(need(o, 1, 'ID'))));
        return 0;
      case 'list':
        for (const ev of await fc.list()) console.log(evaluationJson(ev));
        return 0;
      case 'report': {
        const id = need(o, 1, 'ID');
        if (!o.out) throw new UsageError('report needs --out DIR');
        console.log(JSON.stringify(await fc.writeReport(id, o.out)));
        return 0;
      }
      case 'targets':
        for (const t of await fc.listTargets()) console.log(JSON.stringify(t));
        return 0;
      default:
        throw new UsageError(`unknown command '${cmd}'`);
    }
  } catch (e) {
    if (e instanceof UsageError) {
      say(`fortis: ${e.message}\n${USAGE}`);
      return EXIT_BAD_INPUT;
    }
    if (e instanceof FortisError) {
      if (e.codeName === 'INVALID_ARGUMENT') {
        // The server's BadRequest names each offending field; its message joins them.
        const what = cmd === 'run' ? 'the plan is invalid' : 'invalid request';
        if (e.violations.length) {
          say(`fortis: ${what} (INVALID_ARGUMENT):`);
          for (const v of e.violations) say(`  ${v.field}: ${v.description}`);
        } else {
          say(`fortis: ${what} (INVALID_ARGUMENT): ${e.message}`);
        }
        return EXIT_BAD_INPUT;
      }
      say(`fortis: ${e.codeName}: ${e.message}`);
      return EXIT_FAILED;
    }
    throw e;
  } finally {
    fc.close();
  }
}

if (require.main === module) {
  process.on('SIGINT', () => {
    say('fortis: interrupted; a submitted evaluation keeps running on the server (cancel it with `fortis.js cancel ID`)');
    process.exit(130);
  });
  run(process.argv.slice(2)).then((code) => { process.exitCode = code; }, (e) => {
    say(`fortis: ${e.stack || e}`);
    process.exitCode = EXIT_FAILED;
  });
}

module.exports = { run };

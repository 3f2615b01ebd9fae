// The declarations (src/index.d.ts) name every field the server answers,
// no more and no fewer: each answer's keys, read through the SDK, are
// compared with its declared interface's (QA: getRun, getEffect and the
// rest were declared Promise<any>, so nothing said what they held).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { readFileSync } from 'node:fs';
import { RatchetError } from '../src/index.js';
import { Workspace, needsServer, unique } from './support.js';

const dts = readFileSync(new URL('../src/index.d.ts', import.meta.url), 'utf8');

/** The declared fields of interface name (its own and those it extends):
 * { field: optional }. */
function declared(name) {
  const m = dts.match(new RegExp(`^export interface ${name}(?:<\\w+>)?(?: extends (\\w+))? \\{\\n([\\s\\S]*?)^\\}`, 'm'));
  assert.ok(m, `no interface ${name} in the declarations`);
  const fields = m[1] ? declared(m[1]) : {};
  for (const f of m[2].matchAll(/^ {2}(\w+)(\??):/gm)) fields[f[1]] = f[2] === '?';
  return fields;
}

/** Requires that value has exactly the fields interface name declares
 * (an optional one may be absent). */
function matches(value, name, where = name) {
  const fields = declared(name);
  for (const key of Object.keys(value)) assert.ok(key in fields, `${where}: the server sent ${key}, which ${name} does not declare`);
  for (const [key, optional] of Object.entries(fields)) {
    assert.ok(optional || key in value, `${where}: ${name} declares ${key}, which the server did not send`);
  }
}

test('run, step, job and replay answers have the declared fields', needsServer, async () => {
  const ws = await Workspace.create();
  const tool = unique('wire');
  const run = await ws.operator.startRun('wire', { idempotencyKey: unique('run') });
  matches(run, 'Run', 'startRun');
  const step = await ws.operator.enqueue({ a: 1 }, { name: tool, version: '1' });
  matches(step, 'EnqueueResult', 'enqueue');
  const worker = await ws.client('WORKER', [`${tool}@1`]);
  const { workerId } = await worker.request('POST', '/workers/register', { tools: [{ name: tool, version: '1' }] });
  const { jobs } = await worker.request('POST', `/workers/${workerId}/claim`, { limit: 1, waitSeconds: 0 });
  assert.equal(jobs.length, 1);
  await worker.request('POST', `/jobs/${jobs[0].jobId}/report`, {
    leaseToken: jobs[0].leaseToken, status: 'FAILED', error: { message: 'no', retryable: false } });

  const read = await ws.operator.getRun(run.id);
  matches(read, 'Run', 'getRun');
  const [s] = read.steps;
  matches(s, 'Step', 'getRun step');
  matches(s.durableJob, 'DurableJob', 'getRun durableJob');
  matches(s.durableJob.policy, 'RetryPolicySnapshot', 'getRun policy');
  matches(s.durableJob.attempts[0], 'JobAttempt', 'getRun attempt');
  matches(await ws.operator.getStep(step.stepId), 'Step', 'getStep');
  const steps = await ws.operator.listRunSteps(run.id, { limit: 1 });
  matches(steps, 'Page', 'listRunSteps');
  assert.equal(steps.data[0].id, step.stepId);
  const runs = await ws.operator.listRuns({ status: 'FAILED' });
  matches(runs, 'Page', 'listRuns');
  assert.deepEqual(runs.data.map((r) => r.id), [run.id]);
  matches(runs.data[0], 'RunSummary', 'listRuns run');

  const preview = await ws.operator.replayPreview(step.stepId);
  matches(preview, 'ReplayPreview');
  const replayed = await ws.operator.replay(step.stepId, { reason: 'wire' });
  matches(replayed, 'ReplayResult');
  const after = await ws.operator.getStep(step.stepId);
  matches(after.durableJob.replays[0], 'JobReplay');
  matches(await ws.operator.finishRun(run.id), 'Run', 'finishRun');
  const second = await ws.operator.enqueue({ a: 2 }, { name: tool, version: '1', runId: (await ws.operator.startRun('c')).id });
  matches(await ws.operator.cancelStep(second.stepId), 'Step', 'cancelStep');
});

test('effect answers have the declared fields, and an indeterminate one is listed and resolved', needsServer, async () => {
  const ws = await Workspace.create();
  const type = unique('wire.send');
  await ws.operator.request('PUT', `/policies/${type}`, { lease_seconds: 5 });
  const begun = await ws.operator.begin({ effectType: type, idempotencyKey: 'k1', payload: { to: 'u' } });
  assert.equal(begun.decision, 'execute');
  matches(begun, 'BeginResponse', 'begin execute');
  const reported = await ws.operator.reportEffect(begun.effect_id, begun.lease_token, 'succeeded', { id: 'm1' });
  matches(reported, 'Effect', 'reportEffect');
  const read = await ws.operator.getEffect(begun.effect_id);
  matches(read, 'Effect', 'getEffect');
  matches(read.attempts[0], 'EffectAttempt');

  // A lease that lapses unreported: listed as indeterminate, then resolved.
  const lost = await ws.operator.begin({ effectType: type, idempotencyKey: 'k2', payload: { to: 'u' }, leaseSeconds: 1 });
  assert.equal(lost.decision, 'execute');
  let page;
  const deadline = Date.now() + 30_000;
  do {
    await new Promise((r) => setTimeout(r, 250));
    page = await ws.operator.listEffects({ state: 'indeterminate', effectType: type, limit: 10 });
  } while (page.data.length === 0 && Date.now() < deadline);
  matches(page, 'GatePage', 'listEffects');
  assert.deepEqual(page.data.map((e) => e.id), [lost.effect_id]);
  matches(page.data[0], 'Effect', 'listEffects effect');
  const blocked = await ws.operator.begin({ effectType: type, idempotencyKey: 'k2', payload: { to: 'u' } });
  assert.equal(blocked.decision, 'blocked');
  matches(blocked, 'BeginResponse', 'begin blocked');
  matches(blocked.prior_attempt, 'PriorAttempt');
  const resolved = await ws.operator.resolveEffect(lost.effect_id, { outcome: 'succeeded', result: { id: 'v1' }, note: 'found' });
  assert.equal(resolved.state, 'succeeded');
  assert.equal(resolved.attempts[0].resolve_note, 'found');
  const dup = await ws.operator.begin({ effectType: type, idempotencyKey: 'k2', payload: { to: 'u' } });
  assert.deepEqual([dup.decision, dup.result], ['duplicate', { id: 'v1' }]);
  await assert.rejects(ws.operator.resolveEffect(lost.effect_id, { outcome: 'maybe' }), TypeError);
});

test('a denial detail reads through RatchetError: resets_at, dimension, required', needsServer, async () => {
  const ws = await Workspace.create();
  const type = unique('wire.pay');
  await ws.operator.request('PUT', `/policies/${type}`, { dimension_limits: { payee: { daily_count: 1 } } });
  const pay = (key) => ws.operator.begin({ effectType: type, idempotencyKey: key, payload: {}, costMicros: 1, dimensions: { payee: 'p1' } });
  assert.equal((await pay('p:1')).decision, 'execute');
  const denied = await pay('p:2');
  assert.equal(denied.decision, 'denied');
  const err = new RatchetError(403, denied.error.code, denied.error.message, denied.error.detail);
  assert.equal(err.code, 'dimension_limit_exceeded');
  assert.equal(err.dimension, 'payee');
  assert.ok(Date.parse(err.resetsAt) > Date.now(), err.resetsAt);
  assert.equal(new Date(err.resetsAt).getUTCHours(), 0);
  const agent = await ws.client('AGENT');
  const refused = await agent.getEffect(denied.effect_id).catch((e) => e);
  assert.ok(refused instanceof RatchetError);
  assert.deepEqual(refused.required, ['effects:read']);
  assert.equal(refused.resetsAt, null);
  assert.equal(refused.dimension, null);
});

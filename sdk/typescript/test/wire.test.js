// The declarations (src/index.d.ts) name every field the server answers,
// no more and no fewer: each answer's keys, read through the SDK, are
// compared with its declared interface's (QA: getRun, getEffect and the
// rest were declared Promise<any>, so nothing said what they held).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { RatchetError } from '../src/index.js';
import { BASE_URL, Workspace, hangGuard, needsServer, unique, waitFor } from './support.js';

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
  assert.deepEqual([after.durableJob.attemptsTruncated, after.durableJob.replaysTruncated], [false, false]);
  const attempts = await ws.operator.listStepAttempts(step.stepId);
  pageOf(attempts, 'Page', 'JobAttempt', 'listStepAttempts');
  assert.deepEqual([attempts.data.map((a) => a.attempt), attempts.nextCursor], [[1], null]);
  const replays = await ws.operator.listStepReplays(step.stepId, { limit: 1 });
  pageOf(replays, 'Page', 'JobReplay', 'listStepReplays');
  assert.deepEqual([replays.data.map((r) => r.reason), replays.nextCursor], [['wire'], null]);
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
  // Naming another attempt than the unknown one is refused, naming it.
  await assert.rejects(ws.operator.resolveEffect(lost.effect_id, { outcome: 'succeeded', attempt: 2 }),
    (err) => err instanceof RatchetError && err.code === 'invalid_state' && err.detail.unresolved_attempt === 1);
  const resolved = await ws.operator.resolveEffect(lost.effect_id, { outcome: 'succeeded', result: { id: 'v1' }, note: 'found', attempt: blocked.prior_attempt.attempt });
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

/** Requires a page whose items each have interface name's fields. */
function pageOf(page, pageName, name, where) {
  matches(page, pageName, where);
  for (const item of page.data) matches(item, name, `${where} item`);
}

test('policy, approval, circuit and group calls answer the declared fields', needsServer, async () => {
  const ws = await Workspace.create();
  const op = ws.operator;
  const type = unique('wire.ops');
  const fresh = await op.getEffectPolicy(type);
  matches(fresh, 'EffectPolicy', 'getEffectPolicy');
  assert.deepEqual([fresh.version, fresh.updated_at], [0, null]);
  const set = await op.updateEffectPolicy(type, { mode: 'require_approval' }, { expectedVersion: 0 });
  matches(set, 'EffectPolicy', 'updateEffectPolicy');
  assert.deepEqual([set.version, set.mode], [1, 'require_approval']);
  const stale = await op.updateEffectPolicy(type, { mode: 'allow' }, { expectedVersion: 0 }).catch((e) => e);
  assert.equal(stale.code, 'version_conflict');
  const policies = await op.listEffectPolicies({ limit: 1 });
  pageOf(policies, 'GatePage', 'EffectPolicy', 'listEffectPolicies');
  assert.equal(policies.data.length, 1);
  assert.ok(policies.next_cursor, 'the starter policies and this one make more than a page of 1');
  const next = await op.listEffectPolicies({ limit: 1, cursor: policies.next_cursor });
  assert.notEqual(next.data[0].effect_type, policies.data[0].effect_type);

  // Approvals: one approved, one rejected, as begin then answers.
  const ask = (key) => op.begin({ effectType: type, idempotencyKey: key, payload: {} });
  const [a1, a2] = [await ask('a1'), await ask('a2')];
  assert.deepEqual([a1.decision, a2.decision], ['approval_required', 'approval_required']);
  const pending = await op.listApprovals({ state: 'pending' });
  pageOf(pending, 'GatePage', 'Approval', 'listApprovals');
  assert.deepEqual(pending.data.map((a) => a.id).sort(), [a1.approval_id, a2.approval_id].sort());
  matches(await op.getApproval(a1.approval_id), 'Approval', 'getApproval');
  const approved = await op.approve(a1.approval_id, { note: 'fine' });
  matches(approved, 'Approval', 'approve');
  assert.deepEqual([approved.state, approved.note], ['approved', 'fine']);
  assert.equal((await op.reject(a2.approval_id)).state, 'rejected');
  assert.equal((await ask('a1')).decision, 'execute');
  assert.equal((await ask('a2')).error.code, 'approval_rejected');
  assert.deepEqual((await op.listApprovals({ state: 'pending' })).data, []);

  // Circuits and the emergency stop.
  await op.updateEffectPolicy(type, { mode: 'allow' });
  const opened = await op.openCircuit(type, { action: 'deny', reason: 'wire' });
  matches(opened, 'Circuit', 'openCircuit');
  assert.deepEqual([opened.state, opened.opened_by, opened.action], ['open', 'manual', 'deny']);
  assert.equal((await ask('c1')).error.code, 'circuit_open');
  const circuits = await op.listCircuits();
  pageOf(circuits, 'GatePage', 'Circuit', 'listCircuits');
  assert.ok(circuits.data.some((c) => c.effect_type === type && c.state === 'open'));
  assert.equal((await op.closeCircuit(type)).state, 'closed');
  const stopped = await op.emergencyStop({ reason: 'wire' });
  pageOf(stopped, 'GatePage', 'Circuit', 'emergencyStop');
  const stop = await op.getEmergencyStop();
  matches(stop, 'EmergencyStop', 'getEmergencyStop');
  assert.deepEqual([stop.state, stop.action, stop.reason], ['open', 'require_approval', 'wire']);
  assert.equal((await ask('c2')).decision, 'approval_required');
  const released = await op.releaseEmergencyStop();
  pageOf(released, 'GatePage', 'Circuit', 'releaseEmergencyStop');
  assert.equal((await op.getEmergencyStop()).state, 'closed');

  // Groups: one committed, one unwound.
  const key = unique('checkout');
  const group = await op.createGroup('checkout', { idempotencyKey: key });
  matches(group, 'Group', 'createGroup');
  assert.equal(group.deduplicated, false);
  const again = await op.createGroup('checkout', { idempotencyKey: key });
  assert.deepEqual([again.id, again.deduplicated], [group.id, true]);
  const step = await op.begin({ effectType: type, idempotencyKey: 'g1', payload: {}, groupId: group.id,
    compensation: { effect_type: `${type}.undo`, payload: { undo: 1 } } });
  assert.equal(step.decision, 'execute');
  await op.reportEffect(step.effect_id, step.lease_token, 'succeeded', {});
  const read = await op.getGroup(group.id);
  matches(read, 'Group', 'getGroup');
  matches(read.steps[0], 'GroupStep');
  assert.equal(read.steps_truncated, false);
  const steps = await op.listGroupSteps(group.id);
  pageOf(steps, 'GatePage', 'GroupStep', 'listGroupSteps');
  assert.deepEqual([steps.data.map((s) => s.effect_id), steps.next_cursor], [[step.effect_id], null]);
  const unwind = await op.unwindGroup(group.id);
  matches(unwind, 'Unwind', 'unwindGroup');
  matches(unwind.plan[0], 'PlanItem', 'unwindGroup plan');
  assert.equal(unwind.plan[0].compensates_effect_id, step.effect_id);
  const other = await op.createGroup('empty');
  const committed = await op.commitGroup(other.id);
  matches(committed, 'GroupCommit', 'commitGroup');
  assert.deepEqual([committed.state, committed.group_id], ['committed', other.id]);
});

test('webhook and key calls answer the declared fields', needsServer, async (t) => {
  assert.ok(process.env.RATCHET_TEST_CRON_SECRET, 'RATCHET_TEST_CRON_SECRET is not set: run `go test ./lib/sdktest -run TestTypeScriptSDK`');
  const ws = await Workspace.create();
  const op = ws.operator;
  let received = 0;
  const receiver = createServer((req, res) => {
    req.resume();
    req.on('end', () => { received++; res.statusCode = 204; res.end(); });
  });
  await new Promise((ok) => receiver.listen(0, '127.0.0.1', ok));
  t.after(() => hangGuard(new Promise((ok) => { receiver.closeAllConnections(); receiver.close(ok); }), 'the receiver never closed'));
  const hook = await op.createWebhook(`http://127.0.0.1:${receiver.address().port}/h`, ['circuit.tripped']);
  matches(hook, 'NewWebhook', 'createWebhook');
  assert.match(hook.secret, /^whsec_/);
  matches(await op.getWebhook(hook.id), 'Webhook', 'getWebhook');
  pageOf(await op.listWebhooks(), 'GatePage', 'Webhook', 'listWebhooks');
  await op.openCircuit(unique('wire.hook'), { action: 'monitor' });
  const delivered = await waitFor('a delivery', async () => {
    const res = await fetch(`${BASE_URL}/api/cron/sweep`, { method: 'POST', headers: { Authorization: `Bearer ${process.env.RATCHET_TEST_CRON_SECRET}` } });
    assert.equal(res.status, 200);
    const page = await op.listWebhookDeliveries(hook.id, { limit: 10 });
    return page.data[0]?.state === 'delivered' ? page : null;
  });
  pageOf(delivered, 'GatePage', 'WebhookDelivery', 'listWebhookDeliveries');
  assert.ok(received >= 1);
  const retried = await op.retryWebhookDeliveries(hook.id, [delivered.data[0].id]);
  assert.deepEqual(Object.keys(retried), ['deliveries']);
  matches(retried.deliveries[0], 'WebhookDelivery', 'retryWebhookDeliveries');
  assert.equal(retried.deliveries[0].state, 'pending');
  const rotated = await op.rotateWebhookSecret(hook.id, { previousExpiresInSeconds: 60 });
  matches(rotated, 'NewWebhook', 'rotateWebhookSecret');
  assert.notEqual(rotated.secret, hook.secret);
  assert.ok(rotated.previous_secret_expires_at);
  const disabled = await op.updateWebhook(hook.id, { disabled: true });
  matches(disabled, 'Webhook', 'updateWebhook');
  assert.deepEqual([disabled.disabled, typeof disabled.disabled_at], [true, 'string']);
  assert.deepEqual(await op.getWebhook(hook.id), disabled);
  const moved = await op.updateWebhook(hook.id, { disabled: false, url: hook.url + '/moved', events: ['circuit.tripped', 'run.finished'] });
  assert.deepEqual([moved.disabled, moved.disabled_at, moved.url, moved.events], [false, null, hook.url + '/moved', ['circuit.tripped', 'run.finished']]);
  assert.equal((await op.updateWebhook(hook.id, {}).catch((e) => e)).code, 'invalid_request');
  matches(await op.deleteWebhook(hook.id), 'Webhook', 'deleteWebhook');
  assert.equal((await op.getWebhook(hook.id).catch((e) => e)).code, 'not_found');

  const key = await op.createKey({ name: 'agent', preset: 'AGENT', rateLimitPerMinute: 100 });
  matches(key, 'NewApiKey', 'createKey');
  assert.deepEqual([key.scopes, key.rate_limit_per_minute], [['effects:begin', 'effects:report'], 100]);
  pageOf(await op.listKeys({ limit: 1 }), 'GatePage', 'ApiKey', 'listKeys');
  // Each names the key that minted it, whose mints list it.
  const opKey = await op.currentKey();
  assert.deepEqual([opKey.created_by_key_id, key.created_by_key_id], [null, opKey.id]);
  const minted = await op.listKeys({ createdBy: opKey.id, limit: 200 });
  pageOf(minted, 'GatePage', 'ApiKey', 'listKeys');
  assert.ok(minted.data.some((k) => k.id === key.id));
  assert.ok(minted.data.every((k) => k.created_by_key_id === opKey.id));
  assert.deepEqual((await op.listKeys({ createdBy: key.id })).data, []);
  assert.equal((await op.listKeys({ createdBy: '' }).catch((e) => e)).code, 'invalid_request');
  const agent = new (op.constructor)({ baseUrl: BASE_URL, apiKey: key.secret });
  const me = await agent.currentKey();
  matches(me, 'ApiKey', 'currentKey');
  assert.equal(me.id, key.id);
  const revoked = await op.revokeKey(key.id);
  matches(revoked, 'ApiKey', 'revokeKey');
  assert.ok(revoked.revoked_at);
  assert.equal((await agent.currentKey().catch((e) => e)).status, 401);
  assert.equal('minted_revoked' in revoked, false);
  // A key found compromised, revoked with every key minted from it.
  const leaky = await op.createKey({ name: 'leaky', scopes: ['keys:write', 'effects:begin'] });
  const child = await new (op.constructor)({ baseUrl: BASE_URL, apiKey: leaky.secret })
    .createKey({ name: 'child', scopes: ['effects:begin'] });
  const tree = await op.revokeKey(leaky.id, { includeMinted: true });
  assert.equal(tree.id, leaky.id);
  assert.deepEqual(tree.minted_revoked, [child.id]);
  const orphan = new (op.constructor)({ baseUrl: BASE_URL, apiKey: child.secret });
  assert.equal((await orphan.currentKey().catch((e) => e)).status, 401);
});

test('endpoint, contract, tool test, reconcile and queue health calls answer the declared fields', needsServer, async () => {
  const ws = await Workspace.create();
  const op = ws.operator;
  const tool = unique('wire_ops');
  const name = unique('Endpoint');
  const endpoint = await op.createEndpoint(name, { preset: 'RELAXED' });
  matches(endpoint, 'Endpoint', 'createEndpoint');
  matches(endpoint.circuit, 'EndpointCircuit');
  assert.equal((await op.createEndpoint(name)).id, endpoint.id, 'an existing name answers the endpoint');
  pageOf(await op.listEndpoints(), 'Page', 'Endpoint', 'listEndpoints');
  matches(await op.getEndpoint(endpoint.id), 'Endpoint', 'getEndpoint');
  const updated = await op.updateEndpointPolicy(endpoint.id, { preset: 'CUSTOM', maxAttempts: 2, initialDelayMs: 1000,
    multiplier: 1, maxDelayMs: 1000, jitterPercent: 0 }, { expectedVersion: endpoint.version });
  matches(updated.retryPolicy, 'RetrySchedule', 'updateEndpointPolicy');
  assert.equal(updated.version, endpoint.version + 1);
  const stale = await op.updateEndpointPolicy(endpoint.id, { maxConcurrent: 1 }, { expectedVersion: endpoint.version }).catch((e) => e);
  assert.equal(stale.code, 'version_conflict');
  assert.equal((await op.pauseEndpoint(endpoint.id)).paused, true);
  assert.equal((await op.resumeEndpoint(endpoint.id)).paused, false);
  assert.equal((await op.closeEndpointCircuit(endpoint.id)).circuit.state, 'closed');

  const contract = await op.publishContract(tool, { handlerVersion: '1', inputSchema: { type: 'object' } });
  matches(contract, 'Contract', 'publishContract');
  assert.equal(contract.contractVersion, 1);
  pageOf(await op.listContracts(tool), 'Page', 'Contract', 'listContracts');
  const probe = await op.testTool(tool, '1', { a: 1 });
  matches(probe, 'ToolTest', 'testTool');
  assert.deepEqual([probe.maxAttempts, probe.contractVersion], [1, 1]);
  const queues = await op.listQueueHealth();
  pageOf(queues, 'Page', 'QueueHealth', 'listQueueHealth');
  assert.ok(queues.data.some((q) => q.name === tool && q.queued >= 1 && q.message));

  // One attempt on the endpoint, failed: listed by outcome.
  await op.startRun('wire');
  await op.enqueue({ a: 2 }, { name: tool, version: '1', endpoint: name });
  const worker = await ws.client('WORKER', [`${tool}@1`]);
  const { workerId } = await worker.request('POST', '/workers/register', { tools: [{ name: tool, version: '1' }] });
  // Claims and fails every job (the tool test's too) until the endpoint's attempt is listed.
  const attempts = await waitFor('a failed attempt on the endpoint', async () => {
    const { jobs } = await worker.request('POST', `/workers/${workerId}/claim`, { limit: 10, waitSeconds: 0 });
    for (const job of jobs) {
      await worker.request('POST', `/jobs/${job.jobId}/report`, { leaseToken: job.leaseToken, status: 'FAILED', error: { message: 'no', retryable: false } });
    }
    const page = await op.listEndpointAttempts(endpoint.id, { outcome: 'FAILED' });
    return page.data.length ? page : null;
  });
  pageOf(attempts, 'Page', 'EndpointAttempt', 'listEndpointAttempts');
  assert.equal(attempts.data.length, 1);
  assert.deepEqual((await op.listEndpointAttempts(endpoint.id, { outcome: 'SUCCEEDED' })).data, []);

  // Reconcile: one match, one the gate does not know.
  const type = unique('wire.rec');
  const begun = await op.begin({ effectType: type, idempotencyKey: 'r1', payload: {}, costMicros: 5 });
  await op.reportEffect(begun.effect_id, begun.lease_token, 'succeeded', {});
  const rec = await op.reconcile({ effectType: type, from: new Date(Date.now() - 3_600_000), to: new Date(Date.now() + 60_000),
    records: [{ idempotencyKey: 'r1', status: 'succeeded', amountMicros: 5 }, { idempotencyKey: 'r9', status: 'succeeded' }] });
  matches(rec, 'Reconciliation', 'reconcile');
  matches(rec.counts, 'ReconcileCounts');
  matches(rec.matched[0], 'ReconcileItem', 'reconcile matched');
  assert.deepEqual([rec.counts.matched, rec.counts.unknown_to_ratchet], [1, 1]);
});

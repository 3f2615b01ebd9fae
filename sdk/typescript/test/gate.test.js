// The effect gate helper against a real server: every decision.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  ApprovalRequiredError, EffectBlockedError, EffectDeniedError, EffectInFlightError, NotPerformedError, RatchetError,
  ResultNotStoredError,
} from '../src/index.js';
import { Workspace, needsServer, unique } from './support.js';

async function setup() {
  const ws = await Workspace.create();
  return { ws, agent: await ws.client('AGENT') };
}

async function policy(ws, effectType, fields) {
  const current = await ws.operator.request('GET', `/policies/${effectType}`);
  await ws.operator.request('PUT', `/policies/${effectType}`, { ...fields, expected_version: current.version });
}

test('execute, then duplicate returns the recorded result', needsServer, async () => {
  const { ws, agent } = await setup();
  const key = unique('welcome-email:user');
  const calls = [];
  const send = (lease) => { calls.push(lease.attempt); assert.equal(lease.probe, false); return { message_id: 'm_1' }; };
  const request = { effectType: 'email.send', idempotencyKey: key, payload: { to: 'user_123' } };
  const first = await agent.doEffect(request, send);
  assert.deepEqual([first.result, first.duplicate, first.attempt], [{ message_id: 'm_1' }, false, 1]);
  const again = await agent.doEffect(request, send);
  assert.deepEqual([again.result, again.duplicate, again.effectId], [{ message_id: 'm_1' }, true, first.effectId]);
  assert.deepEqual(calls, [1]);
  assert.equal((await ws.operator.getEffect(first.effectId)).state, 'succeeded');
});

test('a deeply nested payload and result are sent and read back', needsServer, async () => {
  // The gate takes values nested nearly 10 000 levels deep: JSON.stringify
  // threw RangeError on such a payload or result (near 4 500 levels).
  const { agent } = await setup();
  const levels = 9_990;
  let value = ['leaf'];
  for (let i = 1; i < levels; i++) value = [value];
  const request = { effectType: 'deep.write', idempotencyKey: unique('deep'), payload: { payload: value } };
  const first = await agent.doEffect(request, () => value);
  const again = await agent.doEffect(request, () => null);
  assert.deepEqual([first.duplicate, again.duplicate, again.effectId], [false, true, first.effectId]);
  let read = again.result;
  for (let i = 1; i < levels; i++) {
    assert.equal(read.length, 1);
    read = read[0];
  }
  assert.deepEqual(read, ['leaf']);
});

test('NotPerformedError reports failed and allows a new attempt', needsServer, async () => {
  const { ws, agent } = await setup();
  const request = { effectType: 'payment.charge', idempotencyKey: unique('charge'), payload: { amount: 1 }, costMicros: 1_000_000 };
  await assert.rejects(agent.doEffect(request, () => { throw new NotPerformedError('card declined before the charge'); }), NotPerformedError);
  const effect = await agent.doEffect(request, (lease) => ({ charged: lease.attempt }));
  assert.deepEqual([effect.result, effect.attempt], [{ charged: 2 }, 2]);
  assert.deepEqual((await ws.operator.getEffect(effect.effectId)).attempts.map((a) => a.outcome), ['failed', 'succeeded']);
});

test('an unsure failure reports nothing', needsServer, async () => {
  const { ws, agent } = await setup();
  const key = unique('unsure');
  const request = { effectType: 'email.send', idempotencyKey: key, payload: { to: 'x' } };
  await assert.rejects(agent.doEffect({ ...request, leaseSeconds: 5 }, () => { throw new Error('vendor did not answer'); }), /vendor did not answer/);
  assert.equal((await agent.begin(request)).decision, 'in_flight');
  await new Promise((r) => setTimeout(r, 5500));
  // The lease lapsed unreported: an honest indeterminate, and the default
  // policy (on_indeterminate: block) blocks the key.
  await assert.rejects(agent.doEffect(request, () => null), (err) => {
    assert.ok(err instanceof EffectBlockedError);
    assert.equal(err.priorAttempt.attempt, 1);
    return true;
  });
  assert.equal((await ws.operator.getEffect((await agent.begin(request)).effect_id)).state, 'indeterminate');
});

test('in_flight waits, then gives up', needsServer, async () => {
  const { agent } = await setup();
  const request = { effectType: 'email.send', idempotencyKey: unique('held'), payload: { to: 'y' } };
  const held = await agent.begin(request);
  assert.equal(held.decision, 'execute');
  await assert.rejects(agent.doEffect(request, () => null, { inFlightTimeoutMs: 600 }), EffectInFlightError);
  await agent.reportEffect(held.effect_id, held.lease_token, 'succeeded', { sent: true });
  const done = await agent.doEffect(request, () => null, { inFlightTimeoutMs: 5000 });
  assert.deepEqual([done.duplicate, done.result], [true, { sent: true }]);
});

test('denied and approval_required', needsServer, async () => {
  const { ws, agent } = await setup();
  const deniedType = unique('vendor.call');
  const heldType = unique('wire.send');
  await policy(ws, deniedType, { mode: 'deny' });
  await policy(ws, heldType, { mode: 'require_approval' });
  await assert.rejects(agent.doEffect({ effectType: deniedType, idempotencyKey: unique('k'), payload: {} }, () => null),
    // With the 403's X-Request-Id, to quote to support (SDK QA: it was empty).
    (err) => err instanceof EffectDeniedError && err.code === 'policy_denied' && err.requestId.startsWith('req_') &&
      err.error.requestId === err.requestId);
  await assert.rejects(agent.doEffect({ effectType: heldType, idempotencyKey: unique('k'), payload: {} }, () => null),
    (err) => err instanceof ApprovalRequiredError && err.approvalId.startsWith('apr_'));
});

test('a refused result is replaced by a placeholder', needsServer, async () => {
  const { ws, agent } = await setup();
  const cases = {
    big: [{ blob: 'x'.repeat(300 * 1024) }, 'payload_too_large'],
    huge: [{ blob: 'x'.repeat(2 * 1024 * 1024) }, 'payload_too_large'],
    not_json: [{ amount: 10n }, 'result_not_json'],
  };
  for (const [name, [result, reason]] of Object.entries(cases)) {
    const request = { effectType: 'report.export', idempotencyKey: unique(name), payload: {} };
    let effectId;
    await assert.rejects(agent.doEffect(request, () => result), (err) => {
      assert.ok(err instanceof ResultNotStoredError, name);
      assert.deepEqual([err.reason, err.result], [reason, result]);
      effectId = err.effectId;
      return true;
    });
    // The key is settled: a later caller does not act again, and is told
    // the recorded result is a placeholder.
    await assert.rejects(agent.doEffect(request, () => assert.fail('acted again')),
      (err) => err instanceof ResultNotStoredError && err.reason === reason);
    assert.equal((await ws.operator.getEffect(effectId)).state, 'succeeded');
  }
});

test('a lease outlives its length while the action runs', needsServer, async () => {
  const { ws, agent } = await setup();
  const effect = await agent.doEffect({ effectType: 'email.send', idempotencyKey: unique('long'), payload: { to: 'z' }, leaseSeconds: 5 },
    async (lease) => {
      await new Promise((r) => setTimeout(r, 7000)); // longer than the 5 s lease: the heartbeats keep it
      assert.equal(lease.signal.aborted, false);
      return { done: true };
    });
  assert.equal((await ws.operator.getEffect(effect.effectId)).state, 'succeeded');
});

test('reusing a key for another payload is refused', needsServer, async () => {
  const { agent } = await setup();
  const key = unique('reuse');
  await agent.doEffect({ effectType: 'email.send', idempotencyKey: key, payload: { to: 'a' } }, () => ({ ok: 1 }));
  await assert.rejects(agent.doEffect({ effectType: 'email.send', idempotencyKey: key, payload: { to: 'b' } }, () => ({ ok: 1 })),
    (err) => err instanceof RatchetError && err.status === 409 && err.code === 'idempotency_key_reuse');
});

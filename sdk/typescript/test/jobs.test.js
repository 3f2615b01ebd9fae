// The producer and the worker runtime against a real server.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  AFTER_FAILED, InvalidDecisionError, NonRetryableError, Ratchet, RatchetError, ReportNotRecordedError, RetryableError,
} from '../src/index.js';
import { BASE_URL, Workspace, hangGuard, needsServer, startWorker, stopWorker, unique, waitFor, waitRunEnded } from './support.js';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function setup() {
  const ws = await Workspace.create();
  return { ws, producer: await ws.client('INGEST') };
}

/** Serves handler as a new tool on a worker of its own, starts a run and
 * enqueues one step of it; returns the step and the worker's errors. */
async function serveOne(t, { ws, producer }, prefix, handler, options = {}, classifyError) {
  const tool = unique(prefix);
  const worker = await ws.client('WORKER', [`${tool}@1`]);
  worker.registerTool({ name: tool, version: '1', handler, classifyError });
  const errors = startWorker(t, worker);
  await producer.startRun(prefix);
  return { step: await producer.enqueue({}, { name: tool, version: '1', ...options }), errors };
}

// registerWorker, claim, heartbeatJob, reportJob and reportJobs, as the Go
// SDK's RegisterWorker... (parity QA), against the server.
test('the low-level worker calls run jobs by hand', needsServer, async () => {
  const { ws, producer } = await setup();
  const tool = unique('by_hand');
  const worker = await ws.client('WORKER', [`${tool}@1`]);
  const boot = unique('boot');
  const workerId = await worker.registerWorker([{ name: tool, version: '1' }], { idempotencyKey: boot });
  assert.equal(await worker.registerWorker([{ name: tool, version: '1' }], { idempotencyKey: boot }), workerId);
  const run = await producer.startRun('by hand');
  const steps = new Set();
  for (const n of [1, 2]) steps.add((await producer.enqueue({ n }, { name: tool, version: '1' })).stepId);
  const jobs = [];
  await waitFor('two claimed jobs', async () => {
    jobs.push(...await worker.claim(workerId, { limit: 2, waitSeconds: 1 }));
    return jobs.length === 2;
  });
  assert.deepEqual(new Set(jobs.map((j) => j.stepId)), steps);
  const [first, second] = jobs;
  const beat = await worker.heartbeatJob(first.jobId, first.leaseToken);
  assert.equal(beat.cancelRequested, false);
  assert.ok(beat.leaseExpiresAt);
  const done = await worker.reportJob(first.jobId, { leaseToken: first.leaseToken, status: 'SUCCEEDED', output: { n: first.input.n } });
  assert.deepEqual([done.jobId, done.status], [first.jobId, 'SUCCEEDED']);
  const results = await worker.reportJobs([
    { jobId: second.jobId, leaseToken: second.leaseToken, status: 'SUCCEEDED', output: {} },
    { jobId: first.jobId, leaseToken: second.leaseToken, status: 'SUCCEEDED' },
  ]);
  assert.deepEqual([results[0].status, results[0].error], ['SUCCEEDED', null]);
  assert.ok(results[1].error instanceof RatchetError);
  assert.equal(results[1].error.status, 409);
  await producer.finishRun();
  assert.equal((await waitRunEnded(producer, run.id)).status, 'SUCCEEDED');
});

test('the seed\'s onboarding run succeeds and an enqueue is deduplicated', needsServer, async (t) => {
  const s = await setup();
  const tool = unique('send_welcome_email');
  const worker = await s.ws.client('WORKER', [`${tool}@1`]);
  const seen = [];
  worker.registerTool({
    name: tool, version: '1',
    handler: async (input, { idempotencyKey, attempt, maxAttempts, signal }) => {
      assert.ok(signal instanceof AbortSignal);
      seen.push([input, idempotencyKey, attempt, maxAttempts]);
      return { messageId: 'msg_' + input.customerId };
    },
  });
  startWorker(t, worker, 4);
  const run = await s.producer.startRun('Customer onboarding');
  assert.equal(run.status, 'RUNNING');
  const options = { name: tool, version: '1', endpoint: 'Email service', idempotencyKey: 'welcome:cus_2048', timeoutMs: 30_000, maxAttempts: 5 };
  const step = await s.producer.enqueue({ customerId: 'cus_2048' }, options);
  assert.equal(step.deduplicated, false);
  const again = await s.producer.enqueue({ customerId: 'cus_2048' }, options);
  assert.deepEqual([again.deduplicated, again.stepId], [true, step.stepId]);
  await s.producer.finishRun();
  const done = await waitRunEnded(s.producer, run.id);
  assert.equal(done.status, 'SUCCEEDED');
  assert.deepEqual(seen, [[{ customerId: 'cus_2048' }, 'welcome:cus_2048', 1, 5]]);
  const job = done.steps.find((st) => st.id === step.stepId).durableJob;
  assert.deepEqual([job.status, job.attempt, job.maxAttempts], ['SUCCEEDED', 1, 5]);
});

test('a deeply nested input runs beside the other job of its claim', needsServer, async (t) => {
  // The API takes a body nested 10 000 levels deep: JSON.stringify threw
  // RangeError near 4 500 levels, so such an input could not be enqueued
  // and such an output was reported as not JSON.
  const s = await setup();
  const tool = unique('deep');
  const levels = 9_990;
  let deep = { leaf: true };
  for (let i = 0; i < levels; i++) deep = { a: deep };
  await s.producer.startRun('deep input');
  const steps = [await s.producer.enqueue(deep, { name: tool, version: '1' }),
    await s.producer.enqueue({ a: { leaf: true } }, { name: tool, version: '1' })];
  await s.producer.finishRun();
  const seen = [];
  const worker = await s.ws.client('WORKER', [`${tool}@1`]);
  worker.registerTool({
    name: tool, version: '1',
    handler: (input) => {
      let depth = 0;
      while ('a' in input) { input = input.a; depth++; }
      seen.push(depth);
      let output = { depth };
      for (let i = 0; i < depth; i++) output = { a: output };
      return output;
    },
  });
  const errors = startWorker(t, worker, 2); // both jobs in one claim
  const done = await waitRunEnded(s.producer, s.producer.runId);
  assert.equal(done.status, 'SUCCEEDED', String(errors.items));
  assert.deepEqual(seen.sort((x, y) => x - y), [1, levels]);
  for (const step of steps) {
    const job = done.steps.find((st) => st.id === step.stepId).durableJob;
    assert.deepEqual([job.status, job.attempt], ['SUCCEEDED', 1]);
  }
  assert.deepEqual(errors.items, []);
});

test('generated keys deduplicate the same operation', needsServer, async () => {
  const { producer } = await setup();
  const tool = unique('tool');
  const run = await producer.startRun('keys');
  const first = await producer.enqueue({ b: 1, a: [1, 2] }, { name: tool, version: '1' });
  const same = await producer.enqueue({ a: [1, 2], b: 1 }, { name: tool, version: '1' });
  const other = await producer.enqueue({ a: [2, 1], b: 1 }, { name: tool, version: '1' });
  assert.deepEqual([same.deduplicated, same.idempotencyKey, other.deduplicated], [true, first.idempotencyKey, false]);
  assert.equal(producer.runId, run.id);
});

test('a RetryableError, then success', needsServer, async (t) => {
  const s = await setup();
  await s.ws.fastEndpoint('fast');
  const { step } = await serveOne(t, s, 'flaky', (input, ctx) => {
    if (ctx.attempt === 1) throw new RetryableError('provider busy', { retryAfterMs: 1000 });
    return { ok: true };
  }, { endpoint: 'fast' });
  await s.producer.finishRun();
  assert.equal((await waitRunEnded(s.producer, s.producer.runId)).status, 'SUCCEEDED');
  const attempts = (await s.ws.operator.getStep(step.stepId)).durableJob.attempts;
  assert.deepEqual(attempts.map((a) => a.outcome), ['FAILED', 'SUCCEEDED']);
  assert.deepEqual([attempts[0].retryable, attempts[0].retryAfterMs, attempts[0].errorMessage], [true, 1000, 'provider busy']);
});

test('a NonRetryableError exhausts the job and fails the run', needsServer, async (t) => {
  const s = await setup();
  const { step } = await serveOne(t, s, 'strict', () => { throw new NonRetryableError('Invalid recipient bob@example.com'); }, { maxAttempts: 5 });
  await s.producer.finishRun();
  assert.equal((await waitRunEnded(s.producer, s.producer.runId)).status, 'FAILED');
  const job = await s.ws.jobWhen(step.stepId, 'EXHAUSTED');
  // Only a redacted message leaves the process.
  assert.deepEqual(job.attempts.map((a) => [a.retryable, a.errorMessage]), [[false, 'Invalid recipient [email]']]);
});

test('the classifier\'s precedence and fallback', needsServer, async (t) => {
  const s = await setup();
  await s.ws.fastEndpoint('fast');
  const cases = {
    says_no: [() => ({ retryable: false }), new Error('bad input'), 1, false], // the classifier decides an unknown error
    explicit: [() => ({ retryable: false }), new RetryableError('busy'), 3, true], // an explicit SDK error is not classified
    throws: [() => { throw new Error('classifier broke'); }, new Error('x'), 3, true], // a classifier that throws: retryable
    invalid: [() => ({ retryable: false, retryAfterMs: 5000 }), new Error('x'), 3, true], // an invalid decision too
  };
  const names = Object.fromEntries(Object.keys(cases).map((c) => [c, unique(c)]));
  const worker = await s.ws.client('WORKER', Object.values(names).map((n) => `${n}@1`));
  for (const [c, [classifyError, error]] of Object.entries(cases)) {
    worker.registerTool({ name: names[c], version: '1', handler: () => { throw error; }, classifyError });
  }
  const errors = startWorker(t, worker, 4);
  await s.producer.startRun('classify');
  const steps = {};
  for (const c of Object.keys(cases)) steps[c] = (await s.producer.enqueue({}, { name: names[c], version: '1', endpoint: 'fast' })).stepId;
  for (const [c, [, , attempts, retryable]] of Object.entries(cases)) {
    const job = await s.ws.jobWhen(steps[c], 'EXHAUSTED');
    assert.equal(job.attempts.length, attempts, c);
    assert.deepEqual(new Set(job.attempts.map((a) => a.retryable)), new Set([retryable]), c);
  }
  await waitFor('onError', () => errors.items.some((e) => e.message === 'classifier broke') && errors.of(InvalidDecisionError).length > 0);
});

test('a classifier hint out of range is clamped and told', needsServer, async (t) => {
  const s = await setup();
  const { step, errors } = await serveOne(t, s, 'hinted', () => { throw new Error('rate limited'); }, {},
    () => ({ retryable: true, retryAfterMs: 3 * 86_400_000 }));
  const job = await s.ws.jobWhen(step.stepId, 'RETRY_SCHEDULED');
  assert.equal(job.attempts[0].retryAfterMs, 86_400_000);
  const told = await waitFor('onError', () => errors.of(InvalidDecisionError));
  assert.equal(told[0].clamped, true);
});

test('a timeout aborts the handler\'s signal', needsServer, async (t) => {
  const s = await setup();
  const reasons = [];
  const { step } = await serveOne(t, s, 'slow', (input, ctx) => new Promise((_, reject) => {
    ctx.signal.addEventListener('abort', () => { reasons.push(ctx.cancelReason); reject(ctx.signal.reason); });
  }), { timeoutMs: 1000, maxAttempts: 1 });
  const job = await s.ws.jobWhen(step.stepId, 'EXHAUSTED');
  assert.deepEqual(reasons, ['timeout']);
  assert.deepEqual([job.attempts[0].errorMessage, job.attempts[0].retryable], ['handler timed out after 1000ms', true]);
});

test('a handler that ignores its timeout is reported without it', needsServer, async (t) => {
  const s = await setup();
  let release;
  const held = new Promise((r) => { release = r; });
  t.after(() => release());
  const { step } = await serveOne(t, s, 'stubborn', () => held.then(() => ({ late: true })), { timeoutMs: 1000, maxAttempts: 1 });
  const job = await s.ws.jobWhen(step.stepId, 'EXHAUSTED');
  assert.equal(job.attempts[0].errorMessage, 'handler timed out after 1000ms');
});

test('cancelStep reaches the handler', needsServer, async (t) => {
  const s = await setup();
  const reasons = [];
  const classified = [];
  let running;
  const started = new Promise((r) => { running = r; });
  // Seed 000: cancellation remains non-retryable and takes priority over the
  // classifier, which would have called this failure retryable.
  const { step } = await serveOne(t, s, 'cancellable', (input, ctx) => new Promise((_, reject) => {
    running();
    ctx.signal.addEventListener('abort', () => { reasons.push(ctx.cancelReason); reject(new Error('stopped')); });
  }), { timeoutMs: 3000 }, (error) => { classified.push(error.message); return { retryable: true }; });
  await hangGuard(started, 'the handler never ran');
  assert.equal((await s.producer.cancelStep(step.stepId)).status, 'CANCELLED');
  const job = await waitFor('reported', async () => {
    const j = (await s.ws.operator.getStep(step.stepId)).durableJob;
    return j.attempts[0].outcome ? j : null;
  });
  assert.deepEqual(reasons, ['cancelled']);
  assert.deepEqual([job.status, job.attempts[0].retryable, job.attempts[0].errorMessage], ['CANCELLED', false, "cancelled at the server's request"]);
  assert.deepEqual(classified, [], 'a cancellation is not given to the classifier');
});

test('a handler that succeeds is not given to the classifier', needsServer, async (t) => {
  // Seed 000: "successful handlers do not run the classifier".
  const s = await setup();
  const classified = [];
  const { step } = await serveOne(t, s, 'succeeds', () => ({ sent: true }), {},
    (error) => { classified.push(error); return { retryable: false }; });
  const job = await s.ws.jobWhen(step.stepId, 'SUCCEEDED');
  assert.deepEqual([job.attempts.length, job.attempts[0].outcome], [1, 'SUCCEEDED']);
  assert.deepEqual(classified, []);
});

test('a graceful stop lets running handlers report', needsServer, async () => {
  const s = await setup();
  const tool = unique('graceful');
  const worker = await s.ws.client('WORKER', [`${tool}@1`]);
  let running;
  const isRunning = new Promise((r) => { running = r; });
  worker.registerTool({ name: tool, version: '1', handler: async () => { running(); await sleep(500); return { done: true }; } });
  const started = worker.worker.start({ concurrency: 2, pollIntervalMs: 100 });
  await s.producer.startRun('graceful');
  const step = await s.producer.enqueue({}, { name: tool, version: '1' });
  await hangGuard(isRunning, 'the handler never ran');
  assert.equal(await stopWorker(worker.worker, started, 10_000), true);
  const job = (await s.ws.operator.getStep(step.stepId)).durableJob;
  assert.deepEqual([job.status, job.attempts[0].outcome], ['SUCCEEDED', 'SUCCEEDED']);
});

// onError is told of the job left unreported, by its id: it runs again once
// its lease lapses.
test('stop leaves a handler that will not return unreported', needsServer, async () => {
  const s = await setup();
  const tool = unique('stuck');
  const worker = await s.ws.client('WORKER', [`${tool}@1`]);
  let running;
  const isRunning = new Promise((r) => { running = r; });
  const reasons = [];
  worker.registerTool({
    name: tool, version: '1',
    handler: (input, ctx) => { running(); ctx.signal.addEventListener('abort', () => reasons.push(ctx.cancelReason)); return new Promise(() => {}); },
  });
  const errors = [];
  const started = worker.worker.start({ concurrency: 1, pollIntervalMs: 100, stopGraceMs: 100, onError: (err) => errors.push(err) });
  await s.producer.startRun('stuck');
  const step = await s.producer.enqueue({}, { name: tool, version: '1', timeoutMs: 60_000 });
  await hangGuard(isRunning, 'the handler never ran');
  assert.equal(await stopWorker(worker.worker, started, 200), false);
  assert.deepEqual(reasons, ['stopping']);
  const job = (await s.ws.operator.getStep(step.stepId)).durableJob;
  // Nothing reported: the lease lapses and another worker runs it again.
  assert.deepEqual([job.status, job.attempts[0].outcome], ['RUNNING', null]);
  assert.deepEqual(errors.map((e) => [e.name, e.jobId, e.attempt]), [['ReportNotRecordedError', job.id, 1]]);
});

test('an output refused by the contract ends the job once', needsServer, async (t) => {
  const s = await setup();
  const tool = unique('contracted');
  const contract = await s.ws.operator.request('POST', `/tools/${tool}/contracts`, {
    handlerVersion: '1', inputSchema: { type: 'object' }, outputSchema: { type: 'object', required: ['id'] },
    timeoutMs: 5000, retryPreset: 'STANDARD', status: 'ACTIVE',
  });
  const worker = await s.ws.client('WORKER', [`${tool}@1`]);
  worker.registerTool({ name: tool, version: '1', handler: () => ({ no_id: true }) });
  const errors = startWorker(t, worker);
  await s.producer.startRun('contract');
  const step = await s.producer.enqueue({}, { name: tool, version: '1', contractVersion: contract.contractVersion });
  const job = await s.ws.jobWhen(step.stepId, 'EXHAUSTED');
  // The server records the rejection itself: one attempt, reported.
  assert.deepEqual(job.attempts.map((a) => [a.outcome, a.retryable]), [['FAILED', false]]);
  assert.match(job.attempts[0].warning, /output/);
  assert.deepEqual(errors.of(ReportNotRecordedError), []);
});

test('an output the server can never record is reported failed once', needsServer, async (t) => {
  const s = await setup();
  const nul = unique('nul');
  const notJson = unique('notjson');
  const nan = unique('nan');
  const worker = await s.ws.client('WORKER', [`${nul}@1`, `${notJson}@1`, `${nan}@1`]);
  const runs = [];
  worker.registerTool({ name: nul, version: '1', handler: () => { runs.push(nul); return { id: 'has\u0000nul' }; } });
  worker.registerTool({ name: notJson, version: '1', handler: () => { runs.push(notJson); return { big: 10n }; } });
  // Not null, which JSON.stringify would make of it: an output never returned.
  worker.registerTool({ name: nan, version: '1', handler: () => { runs.push(nan); return { ratio: [1, NaN] }; } });
  const errors = startWorker(t, worker, 3);
  await s.producer.startRun('unrecordable');
  const messages = {};
  for (const tool of [nul, notJson, nan]) {
    const step = await s.producer.enqueue({}, { name: tool, version: '1', maxAttempts: 3 });
    const job = await s.ws.jobWhen(step.stepId, 'EXHAUSTED');
    assert.equal(job.attempts.length, 1, tool);
    assert.equal(job.attempts[0].retryable, false, tool);
    messages[tool] = job.attempts[0].errorMessage;
  }
  assert.deepEqual(messages, { [nul]: 'handler output refused by the server at output.id', [notJson]: 'handler output is not JSON', [nan]: 'handler output is not JSON' });
  assert.deepEqual(runs.sort(), [nul, notJson, nan].sort());
  await waitFor('onError', () => errors.of(ReportNotRecordedError).length === 1 && errors.of(TypeError).length === 2);
});

test('jobs finishing together are reported in batches', needsServer, async (t) => {
  const s = await setup();
  const tool = unique('batch');
  const sent = [];
  const worker = new Ratchet({
    baseUrl: BASE_URL, apiKey: await s.ws.key('WORKER', [`${tool}@1`]),
    fetch: (url, init) => { sent.push(new URL(url).pathname); return fetch(url, init); },
  });
  let arrived = 0;
  let release;
  const together = new Promise((r) => { release = r; });
  worker.registerTool({
    name: tool, version: '1',
    handler: async (input) => {
      if (++arrived === 10) release();
      await together;
      return { n: input.n };
    },
  });
  const errors = startWorker(t, worker, 10);
  await s.producer.startRun('batched reports');
  const steps = [];
  for (let n = 0; n < 10; n++) steps.push((await s.producer.enqueue({ n }, { name: tool, version: '1' })).stepId);
  for (const stepId of steps) await s.ws.jobWhen(stepId, 'SUCCEEDED');
  const reports = sent.filter((path) => path.endsWith('/report'));
  assert.ok(reports.includes('/api/v1/jobs/report'), reports.join(' '));
  assert.ok(reports.length < 10, reports.join(' '));
  assert.deepEqual(errors.items, []);
});

test('a dependency, and a replay after exhaustion', needsServer, async (t) => {
  const s = await setup();
  const charge = unique('charge');
  const notify = unique('notify');
  const worker = await s.ws.client('WORKER', [`${charge}@1`, `${notify}@1`]);
  let fail = true;
  worker.registerTool({ name: charge, version: '1', handler: () => { if (fail) throw new NonRetryableError('card declined'); return { charged: true }; } });
  worker.registerTool({ name: notify, version: '1', handler: () => ({ notified: true }) });
  await s.producer.startRun('replay');
  const first = await s.producer.enqueue({ amount: 100 }, { name: charge, version: '1' });
  const branch = await s.producer.enqueue({}, { name: notify, version: '1', afterStepId: first.stepId, afterStatus: AFTER_FAILED });
  // The worker starts only now: started earlier, it could fail the charge
  // before the branch is enqueued, and the branch would be born QUEUED.
  assert.equal(branch.status, 'WAITING');
  startWorker(t, worker, 2);
  await waitFor('branch ran', async () => (await s.ws.operator.getStep(branch.stepId)).status === 'SUCCEEDED');
  const preview = await s.ws.operator.replayPreview(first.stepId);
  assert.equal(preview.eligible, true);
  fail = false;
  const replayed = await s.ws.operator.replay(first.stepId, { reason: 'card updated', maxAttempts: 1, expectedAttempt: preview.attempt });
  assert.equal(replayed.status, 'QUEUED');
  await waitFor('replay ran', async () => (await s.ws.operator.getStep(first.stepId)).status === 'SUCCEEDED');
  await assert.rejects(s.ws.operator.replay(first.stepId, { reason: 'again' }), (err) => err instanceof RatchetError && err.code === 'invalid_state');
});

test('a worker key must list the tool', needsServer, async () => {
  const { ws } = await setup();
  const worker = await ws.client('WORKER', ['other@1']);
  worker.registerTool({ name: 'mine', version: '1', handler: () => null });
  await assert.rejects(hangGuard(worker.worker.start(), 'start() never ended'), (err) => err instanceof RatchetError && err.status === 403 && err.code === 'forbidden');
});

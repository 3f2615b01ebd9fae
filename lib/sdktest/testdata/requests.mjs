// Calls every Ratchet method of the TypeScript SDK that sends a request,
// each option set, against RATCHET_RECORDER_URL, which answers {} to all:
// requests_test.go compares what was sent with the OpenAPI document. An
// answer of {} may not satisfy a method; only the request matters here.
import { Ratchet } from '../../../sdk/typescript/src/index.js';

const r = new Ratchet({ baseUrl: process.env.RATCHET_RECORDER_URL, apiKey: 'rk_test', maxRetries: 0 });
const k = { idempotencyKey: 'k' };
const list = { limit: 1, cursor: 'c' };
const report = { leaseToken: 'lt', status: 'FAILED', output: {}, error: { message: 'm', retryable: true, retryAfterMs: 2000 } };
const calls = [
  () => r.startRun('run', { idempotencyKey: 'k', budgetMicros: 5 }),
  () => r.enqueue({ a: 1 }, { name: 'n', version: '1', endpoint: 'e', idempotencyKey: 'k', timeoutMs: 1000, maxAttempts: 2,
    contractVersion: 1, afterStepId: 's', afterStatus: 'SUCCEEDED', delayMs: 1000, runId: 'r' }),
  () => r.finishRun('r'),
  () => r.getRun('r'),
  () => r.listRuns({ status: 'FAILED', ...list }),
  () => r.listRunSteps('r', { status: 'EXHAUSTED', ...list }),
  () => r.getStep('s'),
  () => r.listStepAttempts('s', list),
  () => r.listStepReplays('s', list),
  () => r.cancelStep('s', k),
  () => r.replayPreview('s'),
  () => r.replay('s', { reason: 'r', maxAttempts: 1, acknowledgeDuplicateRisk: true, targetContractVersion: 2,
    expectedHandlerVersion: '1', acknowledgeVersionChange: true, expectedAttempt: 2 }),
  () => r.begin({ effectType: 'e', idempotencyKey: 'k', payload: 1, costMicros: 1, dimensions: { d: 'v' }, runId: 'r',
    groupId: 'g', compensation: { effect_type: 'u', payload: 1 }, compensatesEffectId: 'x', leaseSeconds: 5,
    requestId: '0123456789abcdef' }),
  () => r.reportEffect('e', 'lt', 'succeeded', 1),
  () => r.heartbeatEffect('e', 'lt'),
  () => r.getEffect('e'),
  () => r.resolveEffect('e', { outcome: 'succeeded', result: 1, note: 'n', attempt: 1 }),
  () => r.listEffects({ state: 'indeterminate', effectType: 'e', ...list }),
  () => r.listEffectPolicies(list),
  () => r.getEffectPolicy('e'),
  () => r.getPolicyStructuring('e'),
  () => r.updateEffectPolicy('e', { max_attempts: 3 }, { expectedVersion: 3 }, k),
  () => r.listApprovals({ state: 'pending', ...list }),
  () => r.getApproval('a'),
  () => r.approve('a', { note: 'n' }),
  () => r.reject('a', { note: 'n' }),
  () => r.listCircuits(list),
  () => r.openCircuit('e', { action: 'deny', reason: 'r' }, k),
  () => r.closeCircuit('e', k),
  () => r.emergencyStop({ action: 'deny', reason: 'r' }, k),
  () => r.getEmergencyStop(),
  () => r.releaseEmergencyStop(k),
  () => r.createGroup('g', k),
  () => r.getGroup('g'),
  () => r.listGroupSteps('g', list),
  () => r.commitGroup('g'),
  () => r.unwindGroup('g'),
  () => r.createWebhook('https://example.com/hook', ['run.finished'], k),
  () => r.listWebhooks(list),
  () => r.getWebhook('w'),
  () => r.updateWebhook('w', { url: 'https://example.com/hook', events: ['run.finished'], disabled: true }, k),
  () => r.deleteWebhook('w'),
  () => r.listWebhookDeliveries('w', list),
  () => r.retryWebhookDeliveries('w', ['d'], k),
  () => r.rotateWebhookSecret('w', { previousExpiresInSeconds: 90, replacePrevious: true, idempotencyKey: 'k' }),
  () => r.createKey({ name: 'n', preset: 'WORKER', scopes: ['jobs:work'], tools: ['t@1'], dailySpendCeilingMicros: 1,
    rateLimitPerMinute: 2, idempotencyKey: 'k' }),
  () => r.listKeys({ createdBy: 'k', ...list }),
  () => r.currentKey(),
  () => r.revokeKey('k', { includeMinted: true }),
  () => r.listEndpoints(list),
  () => r.createEndpoint('e', { maxAttempts: 3 }),
  () => r.getEndpoint('e'),
  () => r.updateEndpointPolicy('e', { maxAttempts: 3 }, { expectedVersion: 1 }),
  () => r.pauseEndpoint('e', k),
  () => r.resumeEndpoint('e', k),
  () => r.closeEndpointCircuit('e', k),
  () => r.listEndpointAttempts('e', { outcome: 'FAILED', ...list }),
  () => r.publishContract('t', { handlerVersion: '1', inputSchema: {}, outputSchema: {}, timeoutMs: 1000, retryPreset: 'CUSTOM',
    retryPolicy: { maxAttempts: 2, initialDelayMs: 1, multiplier: 2, maxDelayMs: 2, jitterPercent: 1 }, status: 'ACTIVE',
    idempotencyKey: 'k' }),
  () => r.listContracts('t', list),
  () => r.testTool('t', '1', 1, k),
  () => r.reconcile({ effectType: 'e', from: new Date(), to: new Date(),
    records: [{ idempotencyKey: 'k', status: 'succeeded', amountMicros: 1 }], idempotencyKey: 'k' }),
  () => r.listQueueHealth(list),
  () => r.registerWorker([{ name: 't', version: '1' }], k),
  () => r.claim('w', { limit: 1, waitSeconds: 1, claimId: 'c' }),
  () => r.heartbeatJob('j', 'lt'),
  () => r.reportJob('j', report),
  () => r.reportJobs([{ jobId: 'j', ...report }]),
];
for (const call of calls) {
  try {
    await call();
  } catch {
    // An answer of {} may not satisfy the method: the request was sent.
  }
}

// @getratchet/sdk: the JavaScript and TypeScript client of the Ratchet API
// (no dependencies, Node.js 18+). Produce durable jobs (startRun, enqueue,
// finishRun), work them (registerTool, worker.start) and wrap an agent's
// side effects in the effect gate (doEffect, blindKey), and verify webhook
// deliveries (verifyWebhook).

export { AFTER_FAILED, AFTER_SUCCEEDED, Ratchet, blindKey, createRatchet } from './client.js';
export {
  ApprovalRequiredError, ConnectionLostError, EffectBlockedError, EffectDeniedError, EffectInFlightError,
  InvalidDecisionError, LeaseLostError, MAX_RETRY_AFTER_MS, MIN_RETRY_AFTER_MS, NoWebhookSecretError, NonRetryableError, NotPerformedError,
  OutcomeNotReportedError, RatchetError,
  ReportNotRecordedError, ResultNotStoredError, RetryableError, WebhookSignatureError,
} from './errors.js';
export { MAX_ERROR_MESSAGE_BYTES, redactMessage } from './redact.js';
export { VERSION } from './transport.js';
export { verifyWebhook } from './webhooks.js';
export { CancelledError, Worker } from './worker.js';

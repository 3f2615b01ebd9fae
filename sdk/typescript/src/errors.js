// Errors the SDK throws, and the ones handlers throw to decide a retry.

/** The shortest and longest retry hint the API takes, in milliseconds. */
export const MIN_RETRY_AFTER_MS = 1_000;
export const MAX_RETRY_AFTER_MS = 86_400_000;


// Errors that ended the retries of a call an earlier attempt of which may
// have been applied (its answer lost, a 5xx): the Go SDK's unconfirmed.
const unconfirmed = new WeakSet();

/** Marks err as ending the retries of a call that may have been applied. */
export function markUnconfirmed(err) {
  if (err instanceof RatchetError) unconfirmed.add(err);
  return err;
}

const detailStrings = (v) => (Array.isArray(v) ? v.filter((s) => typeof s === 'string') : []);

/** The text of a RatchetError, as the Go SDK's: what a 403's key lacks
 * (detail.any_of or detail.required) and the request id to quote. */
function errorText(status, code, message, detail, requestId) {
  // Empty parts are left out, as the Go SDK's text leaves them.
  let text = `ratchet: ${status}${code ? ` ${code}` : ''}${message ? `: ${message}` : ''}`;
  const anyOf = detailStrings(detail.any_of);
  const required = detailStrings(detail.required);
  if (anyOf.length > 0) text += ` (requires one of ${anyOf.join(', ')})`;
  else if (required.length > 0) text += ` (requires ${required.join(', ')})`;
  if (requestId) text += ` (request ${requestId})`;
  return text;
}

/**
 * A failure the API answered: its HTTP status and the stable `code`
 * (`invalid_request`, `lease_lost`, `rate_limited`...), the envelope's
 * `detail` and the response's `requestId`.
 */
export class RatchetError extends Error {
  constructor(status, code, message, detail = {}, requestId = '', body = undefined) {
    super(errorText(status, code, message, detail ?? {}, requestId));
    this.name = 'RatchetError';
    this.status = status;
    this.code = code;
    // The server's own words, alone (message is the whole text, as Go's
    // Error(); Go's Message and Python's message are these).
    this.serverMessage = message ?? '';
    this.detail = detail ?? {};
    this.requestId = requestId;
    this.body = body;
  }

  /** The wait the server asked for (a 429's or a retry_request's), or 0. */
  get retryAfterSeconds() {
    const v = this.detail.retry_after_seconds;
    return Number.isSafeInteger(v) && v > 0 ? v : 0;
  }

  /** detail.required of a 403 forbidden: the scopes (or `tool:name@version`) the key lacks. */
  get required() {
    return detailStrings(this.detail.required);
  }

  /** detail.any_of of a 403 forbidden from a route that any one of several
   * scopes opens (holding one is enough), as Go's AnyOf(); [] otherwise. */
  get anyOf() {
    return detailStrings(this.detail.any_of);
  }

  /** detail.resets_at of a budget_exceeded, key_budget_exceeded or
   * dimension_limit_exceeded denial (when its UTC day window rolls over), or null. */
  get resetsAt() {
    const v = this.detail.resets_at;
    return typeof v === 'string' && v !== '' ? v : null;
  }

  /** detail.dimension of a dimension_limit_exceeded denial, or null. */
  get dimension() {
    const v = this.detail.dimension;
    return typeof v === 'string' && v !== '' ? v : null;
  }

  /** The fields a 400 invalid_request refused. */
  get validation() {
    return Array.isArray(this.detail.validation) ? this.detail.validation : [];
  }

  /** Whether the call may have been applied despite this answer: a 5xx
   * other than a database_unavailable that says nothing was applied, or any
   * answer that ended the retries of a call an earlier attempt of which may
   * have been applied (its answer lost, such a 5xx), as the Go SDK's
   * MayHaveApplied says. */
  get mayHaveApplied() {
    if (unconfirmed.has(this)) return true;
    return this.status >= 500 && !(this.code === 'database_unavailable' && this.detail.outcome === 'not_applied');
  }
}

/** The answer to a call was lost (a network failure or a timeout): it may
 * have been applied. Calls safe to repeat are retried before this is thrown. */
export class ConnectionLostError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'ConnectionLostError';
  }
}

/** A hint moved into the API's range: a shorter one waits 1 s, a longer one 24 h. */
export function clampRetryAfterMs(ms) {
  return Math.min(Math.max(ms, MIN_RETRY_AFTER_MS), MAX_RETRY_AFTER_MS);
}

/**
 * Throw from a handler: the attempt failed and the job should run again.
 * `retryAfterMs` asks for at least that long before the next attempt; the
 * server waits the longer of it and the policy's delay, never bypassing a
 * pause, an open circuit or the attempt limit. It is rounded up to whole
 * milliseconds and clamped into 1 000 to 86 400 000 (as the Go SDK does),
 * so constructing one never throws (Infinity too); anything but a number, or
 * NaN, is no hint.
 */
export class RetryableError extends Error {
  constructor(message, { retryAfterMs } = {}) {
    super(message);
    this.name = 'RetryableError';
    // Infinity ("not before long") is clamped as a huge hint is (SDK QA:
    // dropped, it was retried sooner than a finite one); NaN is no hint.
    this.retryAfterMs = typeof retryAfterMs === 'number' && !Number.isNaN(retryAfterMs)
      ? clampRetryAfterMs(Math.ceil(retryAfterMs)) : undefined;
  }
}

/** Throw from a handler: the attempt failed for good, the job ends EXHAUSTED. */
export class NonRetryableError extends Error {
  constructor(message) {
    super(message);
    this.name = 'NonRetryableError';
  }
}

/** Given to a worker's onError when a tool's classifyError returned a
 * decision the API cannot take as it is: the job is reported retryable
 * without a hint or, when only the hint was out of range (`clamped`), with
 * the hint clamped into 1 s to 24 h. */
export class InvalidDecisionError extends Error {
  constructor(tool, decision, clamped = false) {
    super(`ratchet: classifyError of ${tool} returned ${clamped
      ? 'a retry hint outside 1000-86400000 ms; sent clamped'
      : 'an invalid decision; treated as retryable'}`);
    this.name = 'InvalidDecisionError';
    this.tool = tool;
    this.decision = decision;
    this.clamped = clamped;
  }
}

/** Given to a worker's onError when a job's report was refused or could not
 * be delivered, or was never sent because a stop left the job's handler
 * running past the stop grace (no cause then): its lease lapses and it runs
 * again (or, on its last attempt, ends EXHAUSTED). */
export class ReportNotRecordedError extends Error {
  /** what is 'not_recorded', or 'output_refused' when the server refused a
   * success's output and a failure is reported instead, or 'retrying' when
   * nothing is lost yet: the report's delivery has kept failing for a reason
   * that may pass (an outage, 429s) and is still retried, told every 30 s
   * while it does (the Go SDK's OnError is told the same); jobId and attempt
   * name the attempt, and cause is the call's error, when there is one. */
  constructor(message, { jobId = '', attempt = 0, what = 'not_recorded', cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'ReportNotRecordedError';
    this.jobId = jobId;
    this.attempt = attempt;
    this.what = what;
  }
}

/** Given to a worker's onError when a job's attempt lost its lease while its
 * handler ran, which is then aborted as 'lease_lost': a heartbeat was
 * refused for good (cause is the RatchetError: 409 lease_lost or
 * invalid_state, 404, 403), or the lease passed its end by this process's
 * clock while heartbeats failed (no cause). The job runs again once its
 * lease lapses, unless the refusal says it ended. */
export class LeaseLostError extends Error {
  /** jobId, attempt and tool ('name@version') name the attempt (the Go SDK's
   * LeaseLostError, the Python SDK's LeaseLost). */
  constructor({ jobId, attempt, tool, cause }) {
    super(`ratchet: job ${jobId} attempt ${attempt} (${tool}): ${cause === undefined
      ? 'no heartbeat extended its lease before it lapsed' : 'no longer holds its lease'}`, cause === undefined ? undefined : { cause });
    this.name = 'LeaseLostError';
    this.jobId = jobId;
    this.attempt = attempt;
    this.tool = tool;
  }
}

// The effect gate's decisions other than execute and duplicate, thrown by
// doEffect.

/** A prior attempt's outcome is unknown: verify at the vendor, then have an
 * operator resolve the effect. */
export class EffectBlockedError extends Error {
  constructor(effectId, priorAttempt) {
    super(`ratchet: effect ${effectId} is blocked: a prior attempt's outcome is unknown`);
    this.name = 'EffectBlockedError';
    this.effectId = effectId;
    this.priorAttempt = priorAttempt ?? null;
  }
}

/** An operator decision is pending: poll, or wait for the webhook. */
export class ApprovalRequiredError extends Error {
  constructor(effectId, approvalId) {
    super(`ratchet: effect ${effectId} awaits approval ${approvalId}`);
    this.name = 'ApprovalRequiredError';
    this.effectId = effectId;
    this.approvalId = approvalId;
  }
}

/** Policy, budget, breaker or rejection: report the reason, do not work
 * around it. `code` is the denial's error code, `error` the RatchetError. */
export class EffectDeniedError extends Error {
  constructor(effectId, error) {
    super(`ratchet: effect ${effectId} denied: ${error.code}`);
    this.name = 'EffectDeniedError';
    this.effectId = effectId;
    this.code = error.code;
    this.error = error;
    /** The answer's X-Request-Id, to quote to support. */
    this.requestId = error.requestId;
  }
}

/** Another caller still held the effect's lease when doEffect stopped
 * waiting (its inFlightTimeoutMs, or its signal aborted: the reason is the
 * cause). */
export class EffectInFlightError extends Error {
  constructor(effectId, options) {
    super(`ratchet: effect ${effectId} is still in flight elsewhere`, options);
    this.name = 'EffectInFlightError';
    this.effectId = effectId;
  }
}

/** Throw from a doEffect action when the action surely did not reach the
 * outside world: the attempt is reported `failed` and a later caller may
 * try again. Any other error reports nothing, so the lease lapses and the
 * outcome is honestly indeterminate. */
export class NotPerformedError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'NotPerformedError';
  }
}

/** The action succeeded but the gate refused its result (too large, or a
 * refused field): a placeholder was recorded instead, so the key is
 * settled. `result` is the action's own result. */
export class ResultNotStoredError extends Error {
  constructor(effectId, reason, result) {
    super(`ratchet: effect ${effectId} succeeded, but the gate refused its result (${reason}); a placeholder was recorded`);
    this.name = 'ResultNotStoredError';
    this.effectId = effectId;
    this.reason = reason;
    this.result = result;
  }
}

/** The action succeeded but its report failed (refused, or its answers lost
 * while the lease stood): `result` is the action's result, `cause` why. If
 * the report's answer was lost it may have been recorded; if not, the lease
 * lapses and the outcome is indeterminate (the key's next begin says which). */
export class OutcomeNotReportedError extends Error {
  constructor(effectId, result, cause) {
    super(`ratchet: effect ${effectId} succeeded, but its report failed: ${cause?.message ?? cause}`, { cause });
    this.name = 'OutcomeNotReportedError';
    this.effectId = effectId;
    this.result = result;
  }
}

// Verifying a webhook delivery (verifyWebhook).

/** verifyWebhook's answer to a delivery whose Ratchet-Signature is missing,
 * malformed, wrong or outside the tolerance: not Ratchet's, or replayed
 * (answer it 401). `reason` says which; it never holds the secret. */
export class WebhookSignatureError extends Error {
  constructor(reason) {
    super(`ratchet: webhook signature does not verify: ${reason}`);
    this.name = 'WebhookSignatureError';
    this.reason = reason;
  }
}

/** verifyWebhook's answer when the receiver has no secret to check with (an
 * unset variable, say): with an empty key anyone could sign, so nothing is
 * accepted. A misconfiguration, not a forged delivery, so it is not a
 * WebhookSignatureError. */
export class NoWebhookSecretError extends Error {
  constructor() {
    super('ratchet: no webhook secret to verify with');
    this.name = 'NoWebhookSecretError';
  }
}

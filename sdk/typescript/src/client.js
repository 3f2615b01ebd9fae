// The client: producer calls, the effect gate, and the worker's registry.

import { createHmac } from 'node:crypto';
import {
  ApprovalRequiredError, ConnectionLostError, EffectBlockedError, EffectDeniedError, EffectInFlightError,
  NotPerformedError, OutcomeNotReportedError, RatchetError, ResultNotStoredError, markUnconfirmed,
} from './errors.js';
import { stringifyFinite } from './json.js';
import { hideSecrets } from './secrets.js';
import { Transport, newRequestId, pathId, sleep } from './transport.js';
import { Worker, batchResults, isGeneratorFunction, leaseLength } from './worker.js';

export const AFTER_SUCCEEDED = 'SUCCEEDED';
export const AFTER_FAILED = 'FAILED';

// How often doEffect asks again while another caller holds the lease: from
// the first wait (gateTimes.firstInFlightWaitMs, 250 ms), doubling to the
// last, never past retry_after_seconds.
const MAX_IN_FLIGHT_WAIT_MS = 5_000;
// The "ratchet" field of the result recorded in place of one the gate refused.
const PLACEHOLDER_MARK = 'result_not_recorded';
// The server refuses request bodies over 1 MiB (and results over 256 KiB).
const MAX_RESULT_BYTES = 1024 * 1024 - 1024;
// How long doEffect keeps sending a report the server cannot take for now
// (as Go's DoEffect): the heartbeats keep the lease meanwhile, so without a
// bound a report route failing for good held the call, and the key's
// waiters, for ever. Exported for the tests.
// beginPatienceMs is how long doEffect asks again for a begin whose answers
// were all lost, from its first failure (as Go's DoEffect).
// gateTimes.leaseMarginMs is how long before an effect lease's end (as last
// extended, by this process's clock) doEffect tells an action whose
// heartbeats have not extended it that the lease is lost: at most a quarter
// of the lease as granted, as the Go SDK's effectLeaseMargin (a lease of 2 s
// was given up a second early, half of it, where Go gives it up half a
// second early). gateTimes.pause is how a heartbeat waits for the next (ms,
// or until signal aborts): a test seam.
export const gateTimes = {
  reportTimeoutMs: 30_000, beginPatienceMs: 30_000, firstInFlightWaitMs: 250, leaseMarginMs: 1_000,
  pause: (ms, signal) => sleep(ms, signal),
};

// The clock doEffect measures its leases and waits by: monotonic, as the
// worker's (a wall clock stepped back during a heartbeat read the lease as
// minutes longer, and the next heartbeat came a minute later, after a
// short lease had lapsed under the action).
const now = () => performance.now();

/** Returns a Ratchet client: createRatchet({ baseUrl, apiKey }). */
export function createRatchet(options) {
  return new Ratchet(options);
}

/** An idempotency key that is still deterministic but no longer guessable:
 * HMAC-SHA-256 of key under a secret only your system holds, hex, 32 characters. */
export function blindKey(secret, key) {
  return createHmac('sha256', secret).update(key).digest('hex').slice(0, 32);
}

/** A method's RequestOptions as the transport takes them: timeoutMs bounds
 * the whole call (checked there, so a bad one rejects), signal aborts it. */
function perCall(options) {
  const { timeoutMs, signal } = options ?? {};
  return { callTimeoutMs: timeoutMs, signal };
}

function defined(fields) {
  return Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined && v !== null));
}

/** A list's query string ('' without parameters): the defined fields of params. */
function query(params) {
  const q = new URLSearchParams(Object.entries(defined(params)).map(([k, v]) => [k, String(v)])).toString();
  return q ? `?${q}` : '';
}

/**
 * A client of the Ratchet API. Calls that are idempotent (every gate and job
 * call, by key, lease token or Idempotency-Key) are repeated after a lost
 * answer or a 5xx with capped backoff and jitter, up to maxRetries times; a
 * 429 after the server's retry_after_seconds; updateEndpointPolicy is never
 * repeated after an ambiguous failure (updateEffectPolicy is, under an
 * Idempotency-Key of its own, as startRun and createGroup are).
 */
export class Ratchet {
  #transport;
  #runId = null;
  #worker = null;

  constructor({ baseUrl, apiKey, timeoutMs, maxRetries, userAgent, fetch } = {}) {
    this.#transport = new Transport({ baseUrl, apiKey, timeoutMs, maxRetries, userAgent, fetch });
  }

  /** Calls any route (path under /api/v1); `safe: true` lets it be repeated
   * after a lost answer. Its options are a RequestOptions too (timeoutMs,
   * signal), as every method's last argument. */
  request(method, path, body, { safe = false, idempotencyKey, timeoutMs, signal } = {}) {
    return this.#transport.call(method, path, body, { ...perCall({ timeoutMs, signal }), safe, idempotencyKey });
  }

  // Every method below but doEffect (whose options hold a signal of its
  // own) takes, after its own arguments, an optional RequestOptions
  // { timeoutMs, signal }, as a Go method takes a context: timeoutMs bounds
  // the whole call, its retries and the waits between them included, in
  // place of the client's timeoutMs (cut mid-attempt, it rejects
  // ConnectionLostError 'timed out'; a retry's wait that would end past it
  // is not begun, the call rejecting with its last failure at once), and
  // signal aborts it (it rejects with the signal's reason). A separate
  // argument, never merged into a method's own options: enqueue's timeoutMs
  // is the job's.

  // -- producer -------------------------------------------------------------

  /** The run startRun started, which enqueue and finishRun default to. */
  get runId() {
    return this.#runId;
  }

  /** Starts a run and makes it this client's current run. It is repeated
   * after an ambiguous failure under an Idempotency-Key of its own, made
   * once per call, so a retry after a lost answer is answered the run the
   * first attempt started, never a second run. idempotencyKey (derived from
   * the work) is the run's own key, sent in the body: starting it again,
   * from this process or another, answers the same run (deduplicated). */
  async startRun(name, { idempotencyKey, budgetMicros } = {}, options) {
    const body = defined({ name, idempotencyKey, budgetMicros });
    const run = await this.#keyed('POST', '/runs', body, undefined, options);
    this.#runId = run.id;
    return run;
  }

  #run(runId) {
    const id = runId ?? this.#runId;
    if (!id) throw new Error('ratchet: no run: call startRun first or pass runId');
    return pathId(id);
  }

  /** Adds a step to the run: the exact handler name@version, its JSON input
   * and options. Without idempotencyKey the server derives one from the run,
   * name, version, contract version, endpoint, dependency and canonical
   * input, so an identical enqueue is deduplicated. */
  async enqueue(input, { name, version, endpoint, idempotencyKey, timeoutMs, maxAttempts, contractVersion, afterStepId,
    afterStatus, delayMs, runId } = {}, options) {
    if (!name || !version) throw new TypeError('ratchet: enqueue needs a tool name and version');
    const body = { name, version, input, ...defined({ endpoint, idempotencyKey, timeoutMs, maxAttempts, contractVersion, afterStepId, afterStatus, delayMs }) };
    return this.#transport.call('POST', `/runs/${this.#run(runId)}/steps`, body, { ...perCall(options), safe: true });
  }

  /** Requests the run's completion. Enqueue every branch before this. */
  async finishRun(runId, options) {
    return this.#transport.call('POST', `/runs/${this.#run(runId)}/finish`, {}, { ...perCall(options), safe: true });
  }

  /** Reads a run with its steps. */
  async getRun(runId, options) {
    return this.#transport.call('GET', `/runs/${this.#run(runId)}`, undefined, { ...perCall(options), safe: true });
  }

  /** Reads one step with its job's last 50 executions and last 50 replays
   * (durableJob.attemptsTruncated and replaysTruncated say earlier ones are
   * left out). */
  getStep(stepId, options) {
    return this.#transport.call('GET', `/steps/${pathId(stepId)}`, undefined, { ...perCall(options), safe: true });
  }

  /** Pages every execution of a step's job in attempt order, where a step
   * holds its last 50 (attemptsTruncated). Pass nextCursor as cursor. */
  listStepAttempts(stepId, { limit, cursor } = {}, options) {
    return this.#transport.call('GET', `/steps/${pathId(stepId)}/attempts` + query({ limit, cursor }), undefined, { ...perCall(options), safe: true });
  }

  /** Pages every replay of a step's job oldest first, where a step holds
   * its last 50 (replaysTruncated). Pass nextCursor as cursor. */
  listStepReplays(stepId, { limit, cursor } = {}, options) {
    return this.#transport.call('GET', `/steps/${pathId(stepId)}/replays` + query({ limit, cursor }), undefined, { ...perCall(options), safe: true });
  }

  /** Cancels a step's job; a running handler learns of it at its next
   * heartbeat. Retried under an Idempotency-Key of its own (#action), so a
   * retry after a lost answer never cancels a replay of the step made since. */
  cancelStep(stepId, options) {
    return this.#action('POST', `/steps/${pathId(stepId)}/cancel`, {}, options);
  }

  /** Whether an exhausted or cancelled step may be replayed, and its upgrades. */
  replayPreview(stepId, options) {
    return this.#transport.call('GET', `/steps/${pathId(stepId)}/replay`, undefined, { ...perCall(options), safe: true });
  }

  /** Queues an exhausted or cancelled step again (scope steps:replay). The
   * previous worker may have completed a side effect whose result was never
   * recorded: confirm destination-side idempotency first. One
   * Idempotency-Key spans the call's retries. */
  async replay(stepId, { reason, maxAttempts = 1, acknowledgeDuplicateRisk = true, targetContractVersion, expectedHandlerVersion,
    acknowledgeVersionChange = false, expectedAttempt } = {}, options) {
    if (acknowledgeDuplicateRisk !== true) throw new TypeError('ratchet: a replay must acknowledge the duplicate risk');
    const body = {
      acknowledgeDuplicateRisk: true, maxAttempts,
      ...defined({ reason, targetContractVersion, expectedHandlerVersion, expectedAttempt }),
      ...(acknowledgeVersionChange ? { acknowledgeVersionChange: true } : {}),
    };
    return this.#transport.call('POST', `/steps/${pathId(stepId)}/replay`, body, { ...perCall(options), safe: true, idempotencyKey: newRequestId() });
  }

  // -- worker ---------------------------------------------------------------

  /** Registers the handler for the exact tool name@version (the WORKER key
   * must list it): handler(input, context) returns the output. */
  registerTool({ name, version, handler, classifyError }) {
    this.worker.addTool({ name, version, handler, classifyError });
  }

  /** This client's worker runtime: start(), stop(). */
  get worker() {
    this.#worker ??= new Worker(this.#transport);
    return this.#worker;
  }

  // -- the effect gate ------------------------------------------------------

  /** Asks before acting (POST /effects/begin); a denial is answered, not
   * thrown (its `error` holds the code). A request_id (random when not
   * given) spans the call's retries. */
  async begin(request, options) {
    return hideSecrets((await this.#begin(request, options))[0]);
  }

  /** begin's answer and, for an execute, the lease's length in ms by the
   * server's clock (its expiry less the answer's Date, whole seconds).
   * retryCutoff, once aborted, ends the waits between the transport's
   * retries, never an attempt already sent (doEffect's signal). */
  async #begin({ effectType, idempotencyKey, payload = null, costMicros, dimensions, runId, groupId, compensation,
    compensatesEffectId, leaseSeconds, requestId }, options, retryCutoff) {
    const body = {
      effect_type: effectType, idempotency_key: idempotencyKey, payload, request_id: requestId ?? newRequestId(),
      ...defined({ cost_micros: costMicros, dimensions, run_id: runId, group_id: groupId, compensation,
        compensates_effect_id: compensatesEffectId, lease_seconds: leaseSeconds }),
    };
    try {
      const [answer, date] = await this.#transport.call('POST', '/effects/begin', body, { ...perCall(options), safe: true, withDate: true, retryCutoff });
      return [answer, leaseLength(answer.lease_expires_at, date), ''];
    } catch (err) {
      // A denial is an answer; its X-Request-Id is the error's (its body has none).
      if (err instanceof RatchetError && err.status === 403 && err.body?.decision === 'denied') return [err.body, 0, err.requestId];
      throw err;
    }
  }

  /** Reports an execute's outcome: 'succeeded' with its result, or 'failed'
   * only when the action surely did not reach the outside world. */
  reportEffect(effectId, leaseToken, outcome, result, options) {
    return this.#transport.call('POST', `/effects/${pathId(effectId)}/report`, effectReport(leaseToken, outcome, result), { ...perCall(options), safe: true });
  }

  /** Extends an execute's lease. */
  heartbeatEffect(effectId, leaseToken, options) {
    return this.#transport.call('POST', `/effects/${pathId(effectId)}/heartbeat`, { lease_token: leaseToken }, { ...perCall(options), safe: true });
  }

  /** Reads an effect with its attempts. */
  getEffect(effectId, options) {
    return this.#transport.call('GET', `/effects/${pathId(effectId)}`, undefined, { ...perCall(options), safe: true });
  }

  /** Records what an operator found at the vendor for an indeterminate
   * effect (scope effects:resolve): 'succeeded' with the vendor's result,
   * which a duplicate begin then answers, or 'failed' (it did not happen).
   * Repeating the same resolve answers the effect, so it is retried.
   * attempt, the attempt verified (the effect's latest whose outcome reads
   * 'indeterminate'), makes it apply only to that attempt: naming another
   * is 409 invalid_state, so a retried resolve never settles a later one.
   * Left out, the effect is read first (scope effects:read) and its latest
   * attempt reading 'indeterminate' is sent (none when no attempt does, or
   * the key may not read effects). */
  async resolveEffect(effectId, { outcome, result, note, attempt } = {}, options) {
    if (outcome !== 'succeeded' && outcome !== 'failed') throw new TypeError("ratchet: resolveEffect needs outcome 'succeeded' or 'failed'");
    if (attempt === undefined) {
      // The call is retried: without attempt, a repeat landing after the
      // resolve to failed freed the key, the key ran again and that attempt
      // lapsed would settle that unverified attempt (retry QA). Name the
      // attempt unknown now (none when the key may not read effects).
      try {
        attempt = latestUnknown(await this.getEffect(effectId, options));
      } catch (err) {
        if (!(err instanceof RatchetError) || err.code !== 'forbidden') throw err;
      }
    }
    return this.#transport.call('POST', `/effects/${pathId(effectId)}/resolve`, { outcome, ...defined({ result, note, attempt }) }, { ...perCall(options), safe: true });
  }

  /** Pages effects newest first (scope effects:read), results as redacted
   * previews: say, { state: 'indeterminate' } to verify at the vendor.
   * Pass the answer's next_cursor as cursor for the next page. */
  listEffects({ state, effectType, limit, cursor } = {}, options) {
    return this.#transport.call('GET', '/effects' + query({ state, effect_type: effectType, limit, cursor }), undefined, { ...perCall(options), safe: true });
  }

  /** Pages the workspace's runs newest first, without their steps (scope
   * runs:read); status RUNNING, SUCCEEDED or FAILED. Pass nextCursor as cursor. */
  listRuns({ status, limit, cursor } = {}, options) {
    return this.#transport.call('GET', '/runs' + query({ status, limit, cursor }), undefined, { ...perCall(options), safe: true });
  }

  /** Pages a run's steps in id order, each as getStep reads it, for runs
   * larger than getRun's first steps (1000, or fewer where more would pass about 4 MB). Pass nextCursor as cursor. */
  async listRunSteps(runId, { status, limit, cursor } = {}, options) {
    return this.#transport.call('GET', `/runs/${this.#run(runId)}/steps` + query({ status, limit, cursor }), undefined, { ...perCall(options), safe: true });
  }

  // -- operator calls -------------------------------------------------------
  // Thin calls for the operator routes, as the Go SDK's (answers are the
  // API's JSON: snake_case on gate routes, camelCase on job routes). Reads,
  // and changes whose repeat answers the same state, are repeated after a
  // lost answer; creating calls are sent under an Idempotency-Key (random
  // unless given) that spans their retries; a policy update is not
  // repeated (its repeat would meet the version it made).

  /** Pages the effect types' policies (scope policies:read). Pass next_cursor as cursor. */
  listEffectPolicies({ limit, cursor } = {}, options) {
    return this.#get('/policies' + query({ limit, cursor }), options);
  }

  /** Reads an effect type's policy (the safe default, version 0, for a type never configured). */
  getEffectPolicy(effectType, options) {
    return this.#get(`/policies/${pathId(effectType)}`, options);
  }

  /** How closely the costs declared for an effect type over the last 24
   * hours and 7 days crowd its watch line (structuring_threshold_micros,
   * else max_cost_micros): declarations by band and the share just below
   * it. A measure, never enforced. */
  getPolicyStructuring(effectType, options) {
    return this.#get(`/policies/${pathId(effectType)}/structuring`, options);
  }

  /** Merges update (the API's snake_case fields: mode, max_cost_micros, …;
   * null clears a nullable one; a list or map sent, required_dimensions or
   * dimension_limits, replaces the stored one whole: a dimension left out
   * of dimension_limits loses its limit) into an effect type's policy
   * (scope policies:write). With expectedVersion it merges only while that is
   * still the policy's version (0 for the safe default), otherwise 409
   * version_conflict. Retried under an Idempotency-Key of its own (#action),
   * so a retry after a lost answer never writes over another operator's
   * update made since. */
  updateEffectPolicy(effectType, update = {}, { expectedVersion } = {}, options) {
    const body = { ...update, ...defined({ expected_version: expectedVersion }) };
    return this.#action('PUT', `/policies/${pathId(effectType)}`, body, options);
  }

  /** Pages approvals newest first; state 'pending', 'approved' or 'rejected'. */
  listApprovals({ state, limit, cursor } = {}, options) {
    return this.#get('/approvals' + query({ state, limit, cursor }), options);
  }

  /** Reads one approval. */
  getApproval(approvalId, options) {
    return this.#get(`/approvals/${pathId(approvalId)}`, options);
  }

  /** Approves a pending approval (scope approvals:write): the next begin of its key executes. */
  approve(approvalId, { note } = {}, options) {
    return this.#transport.call('POST', `/approvals/${pathId(approvalId)}/approve`, defined({ note }), { ...perCall(options), safe: true });
  }

  /** Rejects a pending approval: the next begin of its key is denied approval_rejected. */
  reject(approvalId, { note } = {}, options) {
    return this.#transport.call('POST', `/approvals/${pathId(approvalId)}/reject`, defined({ note }), { ...perCall(options), safe: true });
  }

  /** Pages the effect types' breakers (scope policies:read). */
  listCircuits({ limit, cursor } = {}, options) {
    return this.#get('/circuits' + query({ limit, cursor }), options);
  }

  /** Opens a manual breaker for an effect type (scope policies:write);
   * action 'monitor', 'require_approval' or 'deny'. Retried under an
   * Idempotency-Key of its own, as the other breaker calls are (#action):
   * a retry never opens again a breaker another operator closed since. */
  openCircuit(effectType, { action, reason } = {}, options) {
    return this.#action('POST', `/circuits/${pathId(effectType)}/open`, defined({ action, reason }), options);
  }

  /** Closes an effect type's breaker, granting a fresh allowance. A retry
   * never closes a breaker that tripped again since. */
  closeCircuit(effectType, options) {
    return this.#action('POST', `/circuits/${pathId(effectType)}/close`, {}, options);
  }

  /** Opens the emergency stop over every effect type (default action
   * 'require_approval'); it stays open until releaseEmergencyStop. Answers
   * the breakers it opened as a page. A retry never stops again after
   * another operator's release. */
  emergencyStop({ action, reason } = {}, options) {
    return this.#action('POST', '/circuits/stop', defined({ action, reason }), options);
  }

  /** Reads the emergency stop's state. */
  getEmergencyStop(options) {
    return this.#get('/circuits/stop', options);
  }

  /** Lifts the emergency stop; answers the breakers it closed as a page.
   * A retry never lifts a stop another operator put on since. */
  releaseEmergencyStop(options) {
    return this.#action('POST', '/circuits/release', {}, options);
  }

  /** Opens a compensation group; begins with its id as groupId join it.
   * It is repeated after an ambiguous failure under an Idempotency-Key of
   * its own, made once per call, so a retry after a lost answer is answered
   * the group the first attempt opened, never a second group. With an
   * idempotencyKey derived from the work ("checkout:order_123"), sent in the
   * body, a later call, from this process or another, answers the same
   * group (deduplicated: true). */
  createGroup(name, { idempotencyKey } = {}, options) {
    const body = defined({ name, idempotency_key: idempotencyKey });
    return this.#keyed('POST', '/groups', body, undefined, options);
  }

  /** Reads a group with its steps: all of them, or the first that fit in
   * one answer (steps_truncated; listGroupSteps pages the rest). */
  getGroup(groupId, options) {
    return this.#get(`/groups/${pathId(groupId)}`, options);
  }

  /** Pages every step of a group in effect id order, each as getGroup shows
   * it, where a group's read, commit and repeated keyed create hold the
   * first that fit in one answer (steps_truncated): pass the last one shown's
   * effect_id as cursor to read the rest, then next_cursor. */
  listGroupSteps(groupId, { limit, cursor } = {}, options) {
    return this.#get(`/groups/${pathId(groupId)}/steps` + query({ limit, cursor }), options);
  }

  /** Commits a group whose steps all succeeded (409 invalid_state otherwise). */
  commitGroup(groupId, options) {
    return this.#transport.call('POST', `/groups/${pathId(groupId)}/commit`, undefined, { ...perCall(options), safe: true });
  }

  /** Starts unwinding a group: answers the compensation plan, newest success first. */
  unwindGroup(groupId, options) {
    return this.#transport.call('POST', `/groups/${pathId(groupId)}/unwind`, undefined, { ...perCall(options), safe: true });
  }

  /** Registers a webhook (scope webhooks:write); the answer holds its
   * secret, shown once. Sent under an Idempotency-Key (random unless given)
   * that spans its retries, so a lost answer does not register it twice. */
  createWebhook(url, events, { idempotencyKey } = {}, options) {
    return this.#keyed('POST', '/webhooks', { url, events }, idempotencyKey, options).then(hideSecrets);
  }

  /** Pages the workspace's webhooks (no secrets). */
  listWebhooks({ limit, cursor } = {}, options) {
    return this.#get('/webhooks' + query({ limit, cursor }), options);
  }

  /** Reads one webhook (no secret). */
  getWebhook(webhookId, options) {
    return this.#get(`/webhooks/${pathId(webhookId)}`, options);
  }

  /** Changes a webhook without deleting it, so it keeps its secret and
   * its deliveries: any of url (every delivery not yet sent goes to it),
   * events (in place of the current ones: the events fanned out from then
   * on are matched against them, and pending deliveries of a type left out
   * end failed) and disabled (true: it is sent nothing, its pending
   * deliveries wait and the events recorded meanwhile are skipped; false:
   * enabled again). A field left out (or null) is kept; give at least one.
   * Answers it as getWebhook reads it. Repeated after a lost answer under
   * an Idempotency-Key of its own, so a retry never undoes another update
   * made since (a disable retried after an enable). */
  updateWebhook(webhookId, { url, events, disabled } = {}, options) {
    return this.#action('PATCH', `/webhooks/${pathId(webhookId)}`, defined({ url, events, disabled }), options);
  }

  /** Deletes a webhook; answers it. */
  deleteWebhook(webhookId, options) {
    return this.#transport.call('DELETE', `/webhooks/${pathId(webhookId)}`, undefined, { ...perCall(options), safe: true });
  }

  /** Pages a webhook's deliveries newest first. */
  listWebhookDeliveries(webhookId, { limit, cursor } = {}, options) {
    return this.#get(`/webhooks/${pathId(webhookId)}/deliveries` + query({ limit, cursor }), options);
  }

  /** Queues failed deliveries again, now: answers { deliveries }. */
  retryWebhookDeliveries(webhookId, deliveryIds, { idempotencyKey } = {}, options) {
    return this.#keyed('POST', `/webhooks/${pathId(webhookId)}/deliveries/retry`, { delivery_ids: deliveryIds }, idempotencyKey, options);
  }

  /** Gives a webhook a new secret, shown once. The previous one keeps
   * verifying for previousExpiresInSeconds, rounded up to whole seconds as
   * the route takes them and as Python's does (the server's default when
   * omitted); replacePrevious drops an earlier previous secret. */
  rotateWebhookSecret(webhookId, { previousExpiresInSeconds, replacePrevious, idempotencyKey } = {}, options) {
    const seconds = typeof previousExpiresInSeconds === 'number' ? Math.max(Math.ceil(previousExpiresInSeconds), 0) : previousExpiresInSeconds;
    const body = defined({ previous_secret_expires_in_seconds: seconds,
      replace_previous: replacePrevious ? true : undefined });
    return this.#keyed('POST', `/webhooks/${pathId(webhookId)}/rotate-secret`, body, idempotencyKey, options).then(hideSecrets);
  }

  /** Mints an API key (scope keys:write): a preset ('OPERATOR', 'AGENT',
   * 'INGEST', 'WORKER') or scopes; a WORKER key's tools list the
   * name@version pairs it may serve. The answer holds the secret, shown
   * once. Sent under an Idempotency-Key (random unless given). */
  createKey({ name, preset, scopes, tools, dailySpendCeilingMicros, rateLimitPerMinute, idempotencyKey } = {}, options) {
    const body = { name, tools: tools ?? null, ...defined({ preset, scopes, daily_spend_ceiling_micros: dailySpendCeilingMicros,
      rate_limit_per_minute: rateLimitPerMinute }) };
    return this.#keyed('POST', '/keys', body, idempotencyKey, options).then(hideSecrets);
  }

  /** Pages the workspace's keys (no secrets); createdBy, a key id, lists
   * only the keys that key minted (revoking a key leaves them live). */
  listKeys({ createdBy, limit, cursor } = {}, options) {
    return this.#get('/keys' + query({ created_by: createdBy, limit, cursor }), options);
  }

  /** Reads the calling key (any scope). */
  currentKey(options) {
    return this.#get('/keys/current', options);
  }

  /** Revokes a key for good; answers it with revoked_at. With
   * { includeMinted: true } (a key found compromised) every live key minted
   * from it, down the tree, is revoked with it, in one transaction, listed
   * in minted_revoked; a key of the tree this key may not revoke, or the
   * workspace's last root key, refuses it all (error.detail.key_id names
   * it), nothing revoked. Sent again, it revokes what of the tree is still
   * live, so it is retried as a revoke is. */
  revokeKey(keyId, options) {
    const includeMinted = options?.includeMinted;
    if (includeMinted !== undefined && typeof includeMinted !== 'boolean') {
      throw new TypeError('includeMinted must be true or false');
    }
    const path = `/keys/${pathId(keyId)}` + (includeMinted ? '?include_minted=true' : '');
    return this.#transport.call('DELETE', path, undefined, { ...perCall(options), safe: true });
  }

  /** Pages the workspace's endpoints. Pass nextCursor as cursor. */
  listEndpoints({ limit, cursor } = {}, options) {
    return this.#get('/endpoints' + query({ limit, cursor }), options);
  }

  /** Creates an endpoint named name with a policy (the API's camelCase
   * fields: preset, maxAttempts, defaultTimeoutMs, …); creating one that
   * exists answers it. */
  createEndpoint(name, policy = {}, options) {
    return this.#transport.call('POST', '/endpoints', { ...policy, name }, { ...perCall(options), safe: true });
  }

  /** Reads an endpoint with its policy (GET /endpoints/{id}/policy). */
  getEndpoint(endpointId, options) {
    return this.#get(`/endpoints/${pathId(endpointId)}/policy`, options);
  }

  /** Merges update into the endpoint's policy while expectedVersion is
   * still its version (otherwise 409 version_conflict: read it again).
   * Jobs already enqueued keep their snapshot. Not repeated after a lost
   * answer: read the endpoint to see whether it was applied. */
  async updateEndpointPolicy(endpointId, update = {}, { expectedVersion } = {}, options) {
    if (!Number.isInteger(expectedVersion)) throw new TypeError('ratchet: updateEndpointPolicy needs expectedVersion (getEndpoint reads it)');
    return this.#transport.call('PUT', `/endpoints/${pathId(endpointId)}/policy`, { ...update, expectedVersion }, { ...perCall(options), safe: false });
  }

  /** Pauses an endpoint: its jobs are not claimed until resumeEndpoint.
   * A retry never pauses again an endpoint another operator resumed since. */
  pauseEndpoint(endpointId, options) {
    return this.#action('POST', `/endpoints/${pathId(endpointId)}/pause`, {}, options);
  }

  /** Resumes a paused endpoint; a retry never resumes it again once
   * another operator paused it since. */
  resumeEndpoint(endpointId, options) {
    return this.#action('POST', `/endpoints/${pathId(endpointId)}/resume`, {}, options);
  }

  /** Closes an endpoint's circuit breaker; a retry never closes it again
   * once it opened again since. */
  closeEndpointCircuit(endpointId, options) {
    return this.#action('POST', `/endpoints/${pathId(endpointId)}/circuit/close`, {}, options);
  }

  /** Pages an endpoint's job attempts newest first, optionally by outcome. */
  listEndpointAttempts(endpointId, { outcome, limit, cursor } = {}, options) {
    return this.#get(`/endpoints/${pathId(endpointId)}/attempts` + query({ outcome, limit, cursor }), options);
  }

  /** Publishes a tool's next contract (scope contracts:write): the API's
   * camelCase fields (handlerVersion, inputSchema, outputSchema, timeoutMs,
   * retryPreset, retryPolicy, status). Sent under an Idempotency-Key
   * (random unless given), so a lost answer does not publish it twice. */
  publishContract(name, { idempotencyKey, ...contract } = {}, options) {
    return this.#keyed('POST', `/tools/${pathId(name)}/contracts`, contract, idempotencyKey, options);
  }

  /** Pages a tool's contracts. */
  listContracts(name, { limit, cursor } = {}, options) {
    return this.#get(`/tools/${pathId(name)}/contracts` + query({ limit, cursor }), options);
  }

  /** Enqueues a synthetic one-attempt job of name@version with input.
   * Sent under an Idempotency-Key (random unless given). */
  testTool(name, version, input, { idempotencyKey } = {}, options) {
    return this.#keyed('POST', `/tools/${pathId(name)}/test`, { version, ...defined({ input }) }, idempotencyKey, options);
  }

  /** Compares the vendor's records of an effect type between from and to
   * (Dates or RFC 3339 strings) with the gate's (scope reconcile:write):
   * records are { idempotencyKey, status, amountMicros }. Sent under an
   * Idempotency-Key (random unless given), so a retry after a lost answer
   * learns what the first call resolved. */
  async reconcile({ effectType, from, to, records = [], idempotencyKey } = {}, options) {
    const body = {
      effect_type: effectType, from: timestamp(from), to: timestamp(to),
      records: records.map(({ idempotencyKey: key, status, amountMicros }) => ({ idempotency_key: key, status,
        ...defined({ amount_micros: amountMicros }) })),
    };
    return this.#keyed('POST', '/reconcile', body, idempotencyKey, options);
  }

  /** Pages the queues by name@version: queued and due counts, the oldest
   * queued age, workers seen, and why nothing claims them. */
  listQueueHealth({ limit, cursor } = {}, options) {
    return this.#get('/queue/health' + query({ limit, cursor }), options);
  }

  // -- worker, low level (jobs:work) ---------------------------------------
  // The routes the worker runtime (`worker`) calls, for a loop of your own,
  // as the Go SDK's RegisterWorker, ClaimKeyed, HeartbeatJob, ReportJob and
  // ReportJobs. Most code uses the worker.

  /** Registers a worker for the exact tools it serves ({ name, version };
   * a WORKER key must list each name@version) and resolves to its workerId,
   * bound to this key. Sent under an Idempotency-Key (random unless given). */
  async registerWorker(tools, { idempotencyKey } = {}, options) {
    const body = { tools: tools.map(({ name, version }) => ({ name, version })) };
    return (await this.#keyed('POST', '/workers/register', body, idempotencyKey, options)).workerId;
  }

  /** Leases up to limit (1-100) due jobs for workerId, waiting up to
   * waitSeconds (0-20) for one. claimId (random unless given) spans the
   * retries: a call whose answer may have been lost can be made again with
   * it, and the server answers the jobs the first call leased, with the
   * same lease tokens. The call's timeout is at least waitSeconds plus 10 s;
   * a RequestOptions timeoutMs replaces it (one shorter than waitSeconds
   * cuts the wait). */
  async claim(workerId, { limit = 1, waitSeconds = 0, claimId } = {}, options) {
    const body = { limit, waitSeconds, claimId: claimId ?? newRequestId() };
    const answer = await this.#transport.call('POST', `/workers/${pathId(workerId)}/claim`, body, {
      ...perCall(options), safe: true, timeoutMs: Math.max(this.#transport.timeoutMs, waitSeconds * 1000 + 10_000),
    });
    return (answer?.jobs ?? []).map(hideSecrets);
  }

  /** Extends a job's lease: { leaseExpiresAt, cancelRequested }. A
   * superseded token rejects with 409 lease_lost. */
  heartbeatJob(jobId, leaseToken, options) {
    return this.#transport.call('POST', `/jobs/${pathId(jobId)}/heartbeat`, { leaseToken }, { ...perCall(options), safe: true });
  }

  /** Records an attempt's outcome: status 'SUCCEEDED' with its output, or
   * 'FAILED' with error { message, retryable, retryAfterMs }. The same
   * report with the same token answers the same, so it is repeated after a
   * lost answer. */
  reportJob(jobId, { leaseToken, status, output, error } = {}, options) {
    return this.#transport.call('POST', `/jobs/${pathId(jobId)}/report`, jobReport(leaseToken, status, output, error), { ...perCall(options), safe: true });
  }

  /** Records several outcomes in one call (1-100, one commit), each
   * { jobId, leaseToken, status, output, error } fenced by its own token.
   * Resolves to one result per report, in order: { jobId, status, attempt,
   * nextDueAt, error }, error null or the RatchetError the single report
   * would have thrown (its requestId the batch response's). Repeated after
   * a lost answer, as reportJob; an answer whose results do not name the
   * reports' jobs in their order is one. */
  async reportJobs(reports, options) {
    const body = { reports: reports.map(({ jobId, leaseToken, status, output, error }) => ({ jobId, ...jobReport(leaseToken, status, output, error) })) };
    const jobIds = reports.map((r) => r.jobId);
    const answer = await this.#transport.call('POST', '/jobs/report', body, {
      ...perCall(options), safe: true, read: (answer, requestId) => batchResults(answer, jobIds, requestId),
    });
    return answer.map(([result, error]) => ({ ...result, error }));
  }

  #get(path, options) {
    return this.#transport.call('GET', path, undefined, { ...perCall(options), safe: true });
  }

  #keyed(method, path, body, idempotencyKey, options) {
    return this.#transport.call(method, path, body, { ...perCall(options), safe: true, idempotencyKey: idempotencyKey ?? newRequestId() });
  }

  /* An action that sets a state another actor may set back (a breaker's
   * open or close, the emergency stop and its release, a step's cancel, an
   * endpoint's pause, resume or circuit close, a webhook's update, a
   * policy update), sent under the caller's Idempotency-Key
   * (options.idempotencyKey, for a retry from another process) or a fresh
   * one, reused on its retries: retried without
   * one after a lost answer, a close closed a breaker that had tripped again
   * since, a cancel cancelled a replay made since. */
  #action(method, path, body, options) {
    return this.#keyed(method, path, body, options?.idempotencyKey, options);
  }

  /**
   * Wraps a side effect in the gate's protocol. execute: runs
   * action(lease) under a heartbeated lease and reports 'succeeded' with
   * what it returns; a NotPerformedError reports 'failed' and is rethrown;
   * any other error reports nothing (the lease lapses: an honest
   * indeterminate) and is rethrown. duplicate: returns the recorded result
   * without acting. A begin whose answers are all lost (network failures,
   * a 5xx after which the server may have granted execute) is asked again
   * under its request_id past maxRetries, for up to 30 s from the first
   * failure, so that a lease one of them granted is given back rather than
   * left to lapse. in_flight: asks again until inFlightTimeoutMs. blocked,
   * approval_required and denied throw EffectBlockedError,
   * ApprovalRequiredError and EffectDeniedError. signal (an AbortSignal)
   * ends the call as Go's ctx does: before a begin it throws its reason,
   * during an in_flight wait EffectInFlightError (its cause the reason), and
   * during the action it aborts lease.signal; between a begin's retries it
   * sends no more (the last failure thrown); a begin already sent is
   * awaited (its lease would be nobody's), an execute it brings after the
   * abort is reported 'failed' without calling the action (which surely did
   * not run) and the reason thrown, and an outcome is still reported.
   */
  async doEffect(request, action, { inFlightTimeoutMs, signal } = {}) {
    // Refused before a lease is taken: after, the call's failure would leave
    // the key indeterminate, an operator's to resolve.
    if (typeof action !== 'function') throw new TypeError(`ratchet: doEffect's action must be a function, not ${typeof action}`);
    // A generator function's body never runs when it is called: its
    // generator was recorded as a success with the result {} (JSON of a
    // generator), an effect that never happened (SDK review; Python refuses
    // one before begin too).
    if (isGeneratorFunction(action)) {
      throw new TypeError("ratchet: doEffect's action must perform the effect and return its result, not be a generator function");
    }
    // One request id for the whole call: a begin whose answer was lost is
    // answered again by the next, whichever retry asks.
    const req = { ...request, requestId: request.requestId ?? newRequestId() };
    const giveUp = inFlightTimeoutMs === undefined ? Infinity : now() + inFlightTimeoutMs;
    let wait = gateTimes.firstInFlightWaitMs;
    for (;;) {
      signal?.throwIfAborted();
      const sent = now();
      const [answer, leaseMs, requestId] = await this.#beginAnswered(req, signal);
      const effectId = answer.effect_id ?? '';
      switch (answer.decision) {
        case 'execute':
          if (signal?.aborted) {
            // Granted after the signal aborted: the action is not called, so
            // the attempt surely did not act and is released for the next
            // caller rather than left to lapse indeterminate (sdk QA: the
            // action was called with an aborted lease.signal, and one that
            // honoured it reported nothing).
            await this.#reportEffect(effectId, answer.lease_token, 'failed', undefined, { end: sent + leaseMs }).catch(() => {});
            throw signal.reason;
          }
          return this.#runLeased(answer, sent + leaseMs, action, signal);
        case 'duplicate': {
          const reason = placeholderReason(answer.result);
          if (reason !== null) {
            // The attempt that acted could not record its result.
            throw new ResultNotStoredError(effectId, reason, undefined);
          }
          return { effectId, attempt: answer.attempt, result: answer.result, duplicate: true };
        }
        case 'in_flight': {
          // The last pause ends at the timeout, which asks once more (QA: a
          // pause that would pass it gave up at once, up to 5 s early).
          const left = giveUp - now();
          if (left <= 0) throw new EffectInFlightError(effectId);
          const pause = Math.min(wait, Math.max(answer.retry_after_seconds || 1, 1) * 1000, left);
          wait = Math.min(2 * wait, MAX_IN_FLIGHT_WAIT_MS);
          try {
            await sleep(pause, signal);
          } catch (reason) {
            throw new EffectInFlightError(effectId, { cause: reason });
          }
          continue;
        }
        case 'blocked':
          throw new EffectBlockedError(effectId, answer.prior_attempt);
        case 'approval_required':
          throw new ApprovalRequiredError(effectId, answer.approval_id);
        case 'denied': {
          const e = answer.error ?? {};
          throw new EffectDeniedError(effectId, new RatchetError(403, String(e.code ?? ''), String(e.message ?? ''), e.detail ?? {}, requestId, answer));
        }
        default:
          throw new RatchetError(200, 'unknown_decision', `unknown begin decision ${JSON.stringify(answer.decision)}`);
      }
    }
  }

  /** #begin, asked again under the same request_id past the transport's
   * retries while every answer was lost (a network failure, a 5xx after
   * which the server may have granted execute: a database failover, an
   * ended connection), for up to gateTimes.beginPatienceMs from the first
   * failure: a lease one of them granted is given back to the repeat while
   * it is live. Given up after the transport's retries, the lease lapsed
   * held by nobody, and the key turned indeterminate (blocked under the
   * default policy) though the action never ran (chaos QA). A failure that
   * surely granted nothing (not_applied, a refusal) is thrown at once; so
   * is the last failure when signal aborts a wait. */
  async #beginAnswered(req, signal) {
    let giveUp = null;
    for (let attempt = 0; ; attempt++) {
      let wait;
      try {
        // The signal ends the transport's waits between retries too, as
        // Go's sentRunsOn: given none, a doEffect aborted during a begin's
        // backoff went on sending begins for up to maxRetries more, and the
        // execute one brought was only released (sdk QA).
        return await this.#begin(req, undefined, signal);
      } catch (err) {
        if (err instanceof RatchetError) {
          if (attempt > 0) markUnconfirmed(err); // an earlier call's answers were lost
          if (!err.mayHaveApplied) throw err;
          wait = this.#transport.retryDelay(err, attempt, true);
          if (wait === null) throw err;
        } else if (err instanceof ConnectionLostError) {
          wait = this.#transport.backoff(attempt);
        } else {
          throw err; // an error of ours
        }
        giveUp ??= now() + gateTimes.beginPatienceMs;
        if (now() + wait >= giveUp) throw err;
        try {
          await this.#transport.sleep(wait, signal);
        } catch {
          throw err;
        }
      }
    }
  }

  async #runLeased(answer, leaseEnd, action, signal) {
    const { effect_id: effectId, lease_token: token } = answer;
    // Aborted when the lease is lost or the caller's signal aborts: the
    // action must stop either way (what it did is still reported).
    const lost = new AbortController();
    const onAbort = () => lost.abort(signal.reason);
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
    const lease = {
      effectId, attempt: answer.attempt, probe: Boolean(answer.probe), priorAttempt: answer.prior_attempt ?? null,
      leaseExpiresAt: answer.lease_expires_at, signal: lost.signal,
    };
    // The heartbeats run until the outcome is reported, not only while the
    // action runs: a report retried through a server blip must still find
    // the lease. state.end is this process's clock's view of the lease's
    // end, as last extended.
    const state = { end: leaseEnd };
    const stop = new AbortController();
    const beats = this.#heartbeat(effectId, token, state, stop.signal, lost);
    try {
      let result;
      try {
        result = await action(lease);
      } catch (err) {
        if (err instanceof NotPerformedError) {
          try {
            await this.#reportEffect(effectId, token, 'failed', undefined, state);
          } catch (reportError) {
            // Thrown all the same, with why its failure may not be recorded
            // (the lease then lapses: indeterminate).
            err.reportError = reportError;
          }
        }
        throw err;
      }
      let reason = unsendableResult(result);
      if (reason === null) {
        try {
          await this.#reportEffect(effectId, token, 'succeeded', result, state);
          // undefined was recorded as null, which a duplicate answers: the
          // same here (it was undefined, so a caller that told the two
          // apart by === null took a duplicate of nothing for a result).
          return { effectId, attempt: answer.attempt, result: result === undefined ? null : result, duplicate: false };
        } catch (err) {
          reason = err instanceof RatchetError ? unrecordableResult(err) : null;
          if (reason === null) throw new OutcomeNotReportedError(effectId, result, err);
        }
      }
      // The action happened; only its result cannot be kept. Recording the
      // success without it settles the key.
      try {
        await this.#reportEffect(effectId, token, 'succeeded', { ratchet: PLACEHOLDER_MARK, reason }, state);
      } catch (err) {
        throw new OutcomeNotReportedError(effectId, result, err);
      }
      throw new ResultNotStoredError(effectId, reason, result);
    } finally {
      signal?.removeEventListener('abort', onAbort);
      stop.abort();
      await beats;
    }
  }

  /** Reports, repeating through lost answers and server failures while the
   * lease stands (the heartbeats keep it). */
  #reportEffect(effectId, token, outcome, result, state) {
    const giveUp = now() + gateTimes.reportTimeoutMs;
    return this.#transport.callUntil('POST', `/effects/${pathId(effectId)}/report`, effectReport(token, outcome, result),
      // Each attempt within the give-up time too (review: one that hung took
      // the transport's 60 s, where Go's is cut at its 30 s).
      { mayWait: (wait) => now() + wait < Math.min(state.end, giveUp),
        timeoutMs: Math.min(this.#transport.timeoutMs, gateTimes.reportTimeoutMs),
        // A bare 4xx (a proxy's during a deploy) says nothing of the report,
        // as for a job's (sdk QA: given up at once, the lease lapsed and the
        // performed action read indeterminate); a bare 413 is a body refused
        // for good (unrecordableResult).
        bareMayPass: true }).catch((err) => {
      // An earlier send of this report landed (its answer was lost) and a
      // newer attempt began before the retry: lease_lost names the outcome
      // it recorded (QA: said not recorded), as Go's reads it.
      if (err instanceof RatchetError && err.code === 'lease_lost' && err.detail.reported_outcome === outcome) return undefined;
      throw err;
    });
  }

  // Paced at a third of the lease left, within 1 s to 1 min; the action is
  // told the lease is lost on a refusal, or a second (at most a quarter of
  // the lease as granted: gateTimes.leaseMarginMs) before its end by this
  // process's clock when heartbeats keep failing. A heartbeat is always
  // tried before the lease is given up (as Go's): a lease of 3 s or less was
  // given up unbeaten, and lapsed under an action still running (sdk QA).
  async #heartbeat(effectId, token, state, signal, lost) {
    let tried = false; // a heartbeat was sent since the lease was last extended
    let extended = false; // a heartbeat has extended the lease
    const margin = Math.max(Math.min(gateTimes.leaseMarginMs, (state.end - now()) / 4), 0);
    for (;;) {
      const left = state.end - now();
      let pause = Math.min(Math.max(left / 3, 1_000), 60_000, Math.max(left - margin, 0));
      // Just extended: not a beat in a loop on a short estimate.
      if (extended && !tried) pause = Math.max(pause, 1_000);
      try {
        await gateTimes.pause(pause, signal);
      } catch {
        return; // the outcome was reported
      }
      if (tried && now() >= state.end - margin) {
        lost.abort(new Error('ratchet: the lease lapsed while heartbeats failed'));
        return;
      }
      // The first try since the lease was extended gets its second even
      // past the point the action must be told.
      const floor = tried ? 100 : 1_000;
      tried = true;
      const sent = now();
      try {
        const [beat, date] = await this.#transport.call('POST', `/effects/${pathId(effectId)}/heartbeat`, { lease_token: token },
          // No retries inside the call (a 429's wait could outlast the lease):
          // this loop beats again, and watches the lease's end.
          // Nor may a hung heartbeat outlast the moment the action must be
          // told (QA: with 10 s, one unanswered beat told it long after the
          // lease lapsed and another caller could act).
          { safe: true, maxRetries: 0, signal, withDate: true,
            timeoutMs: Math.min(this.#transport.timeoutMs, 10_000, Math.max(state.end - margin - sent, floor)) });
        const ms = leaseLength(beat?.lease_expires_at, date);
        if (ms > 0) state.end = sent + ms;
        tried = false;
        extended = true;
      } catch (err) {
        if (err instanceof RatchetError && (err.status === 404 || err.status === 409) && err.code) {
          lost.abort(err);
          return;
        }
        if (signal.aborted) return;
        // A lost answer, a server failure, or a bare 4xx without Ratchet's
        // error envelope (a proxy's, a load balancer's or a platform's
        // answer during a deploy or a misroute), which says nothing of the
        // lease, as the worker reads a job's heartbeat (sdk QA: a bare 404
        // aborted lease.signal and ended the heartbeats, so the lease then
        // lapsed for real): the next beat tries again.
      }
    }
  }
}

/** An RFC 3339 string for a Date; anything else as given. */
function timestamp(value) {
  return value instanceof Date ? value.toISOString() : value;
}

function effectReport(token, outcome, result) {
  return { lease_token: token, outcome, ...defined({ result }) };
}

/** Why a result cannot even be sent (not JSON, or over the server's request
 * size limit), or null. */
function unsendableResult(result) {
  let json;
  try {
    json = stringifyFinite(result === undefined ? null : result);
  } catch {
    return 'result_not_json'; // a NaN too, as Go and Python read it (it was recorded as null)
  }
  if (typeof json !== 'string') return 'result_not_json';
  return Buffer.byteLength(json) > MAX_RESULT_BYTES ? 'payload_too_large' : null;
}

/** Why a success's result cannot be recorded (its size, a bare 413's too, or a field under
 * result the gate refused: "invalid_request at <field>", the reason the Go
 * and Python SDKs record; the body, which only the result can make
 * unreadable: nested more levels deep than the gate reads), or null for
 * other refusals. */
function unrecordableResult(err) {
  // A bare 413 (a proxy's body limit before the server, without Ratchet's
  // envelope) refuses it for good too, as Go's DoEffect reads it (sdk QA:
  // thrown as not reported, the lease lapsed, and under on_indeterminate
  // retry the next caller acted again).
  if (err.code === 'payload_too_large' || (err.status === 413 && !err.code)) return 'payload_too_large';
  if (err.code === 'invalid_request') {
    for (const item of err.validation) {
      const field = String(item?.field ?? '');
      if (field === 'result' || field === 'body' || field.startsWith('result.')) return `invalid_request at ${field}`;
    }
  }
  return null;
}

/** Why a recorded result is the placeholder a success whose result could
 * not be kept was recorded with, or null when it is a result: the
 * placeholder is exactly {ratchet: 'result_not_recorded', reason: string},
 * as the Go and Python SDKs read it (an action's own result that merely has
 * such a field is returned). */
function placeholderReason(recorded) {
  if (recorded === null || typeof recorded !== 'object' || Array.isArray(recorded)) return null;
  const keys = Object.keys(recorded);
  if (keys.length !== 2 || recorded.ratchet !== PLACEHOLDER_MARK || typeof recorded.reason !== 'string') return null;
  return recorded.reason;
}

/** A job report's body, leaving out what was not given. */
function jobReport(leaseToken, status, output, error) {
  return { leaseToken, status, ...defined({ output, error }) };
}

// latestUnknown is the latest of effect's attempts whose outcome reads
// indeterminate: the attempt a resolve settles now (undefined for none).
function latestUnknown(effect) {
  let latest;
  for (const a of effect?.attempts ?? []) {
    if (a.outcome === 'indeterminate' && (latest === undefined || a.attempt > latest)) latest = a.attempt;
  }
  return latest;
}

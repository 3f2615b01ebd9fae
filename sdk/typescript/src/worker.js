// The worker runtime: claims jobs for registered tools and runs them.

import {
  ConnectionLostError, InvalidDecisionError, LeaseLostError, MAX_RETRY_AFTER_MS, MIN_RETRY_AFTER_MS, NonRetryableError, RatchetError,
  ReportNotRecordedError, RetryableError, clampRetryAfterMs,
} from './errors.js';
import { FailureLog } from './failurelog.js';
import { stringify, stringifyFinite } from './json.js';
import { redactMessage } from './redact.js';
import { newRequestId, pathId, sleep, spreadRetryAfter, timerMs } from './transport.js';

/** Whether fn is a generator function (function* or async function*), whose
 * body does not run when it is called. */
export function isGeneratorFunction(fn) {
  const tag = Object.prototype.toString.call(fn);
  return tag === '[object GeneratorFunction]' || tag === '[object AsyncGeneratorFunction]';
}

// Heartbeat pacing: a third of the lease left, within these bounds.
const MIN_HEARTBEAT_MS = 1_000;
const MAX_HEARTBEAT_MS = 60_000;
// How long a handler whose timeout passed has to return before the worker
// reports the timeout without it (the Go SDK's timeoutGrace). An object so
// that tests can shorten it, as reportTimes; not exported by the package.
export const graceTimes = { timeoutMs: 1_000 };
// The deadline (ms) of a stop that stop() did not ask for (start's signal
// aborted): stop()'s default. An object so that tests can shorten it, as
// reportTimes; not exported by the package.
export const stopTimes = { implicitTimeoutMs: 30_000 };
// start()'s default stopGraceMs (the Go SDK's DefaultStopGrace): once a
// stop's deadline passed, how long aborted handlers have to return and be
// reported, and then how much longer the reports are sent. It was 1 s here,
// and 10 s in Go; a handler whose call outlasted a second was left running
// unreported beside the attempt another worker began once its lease lapsed.
export const DEFAULT_STOP_GRACE_MS = 10_000;
const MAX_CLAIM = 100;
// Caps the wait after registrations or claims that keep failing for a reason
// that may pass, unless the poll interval is longer (the Go SDK's
// maxFailureWait): a worker never gives up on a server that is down or
// shedding load, and finds it again within about this long once it is back.
const MAX_FAILURE_WAIT_MS = 60_000;
// The server refuses request bodies over 1 MiB: an output that large (with
// the report around it) can never be recorded.
export const MAX_OUTPUT_BYTES = 1024 * 1024 - 1024;
// Reports of jobs that finish while another report is being sent go out
// together (POST /jobs/report): at most the API's 100 a batch, and about
// half its 1 MiB request limit in bytes (a report larger than that goes
// alone).
const REPORT_BATCH_MAX = 100;
const REPORT_BATCH_BYTES = 512 * 1024;
// No claim while a report waits to be recorded and its lease (as last
// extended) lapses within this margin plus a long poll's wait: the claim
// could hand this worker its own job again (the Go SDK's reportLeaseMargin).
const REPORT_LEASE_MARGIN_MS = 5_000;
// One delivery of a report or a batch waits at most this long for its
// answer before it is repeated (the Go SDK's reportTimeout): a connection
// that hangs must not hold every report behind it for the client's timeout.
// An object so that tests can shorten them; not exported by the package.
// reportTimes.inFlight is how many deliveries may be in flight at once (the
// Go SDK's reportInFlight).
// reportTimes.singlesInFlight is how many single reports of a batch sent
// again report by report (see Reporter) may be in flight at once (the Go
// SDK's singleReportsInFlight).
// reportTimes.retryingNoticeMs is how often onError is told that one
// delivery of a report or a batch still fails for a reason that may pass (an
// outage, 429s) and is retried (a ReportNotRecordedError, what 'retrying'),
// as the Go SDK's reporter tells OnError every reportTimeout: an operator
// sees an outage that holds the worker's claims before a stop gives its
// reports up.
// reportTimes.queued is how many reports may wait in the reporter's queue
// with their jobs' slots freed (the Go SDK's reporter queue holds a batch's
// worth): one queued behind as many keeps its slot until it moves up.
export const reportTimes = { deliveryMs: 30_000, inFlight: 3, singlesInFlight: 8, retryingNoticeMs: 30_000, queued: REPORT_BATCH_MAX };
// How a heartbeat waits for the next (ms, or until signal aborts): a test
// seam, as reportTimes; not exported by the package.
export const heartbeatTimes = { pause: (ms, signal) => sleep(ms, signal) };
// How often the claim loop looks again while a slot is missing or a report
// holds the claims. Each change it waits for (a slot freed, a report
// recorded, given up or found failing on its own, the stop) wakes it at
// once; this only bounds a change that could come unannounced. A test
// seam, as reportTimes; not exported by the package.
export const claimTimes = { checkMs: 1_000 };

/** Why a handler's signal was aborted: context.cancelReason. */
export class CancelledError extends Error {
  constructor(reason) {
    super(`ratchet: handler cancelled (${reason})`);
    this.name = reason === 'timeout' ? 'TimeoutError' : 'AbortError';
    this.reason = reason;
  }
}

const jittered = (ms) => ms * (0.9 + Math.random() * 0.2);

/** err's Retry-After (detail.retry_after_seconds, or a 429's or 503's
 * header) in ms, up to limitMs, then lengthened by up to a fifth, drawn at
 * random, as the transport's own retry of a 429 or a 503 is (the Go SDK's
 * retryAfter): the workers of a fleet that the limiter (or a proxy's 503)
 * refused together were all told to come back at one instant, and came back
 * together, most to be refused again; 0 when it has none. */
function retryAfterMs(err, limitMs) {
  if (!(err instanceof RatchetError)) return 0;
  return spreadRetryAfter(Math.min(err.retryAfterSeconds * 1000, limitMs), Math.random());
}

/** The wait after the nth failure in a row (from 1) of the worker's
 * registration or claims, when the failure may pass (and of a job's
 * heartbeats, from MIN_HEARTBEAT_MS: beatWait; the Go SDK's failureWait): pollIntervalMs doubled n-1 times, at most
 * MAX_FAILURE_WAIT_MS (or pollIntervalMs when longer), half of it drawn at
 * random so that a fleet of workers does not come back at once; and at
 * least the server's Retry-After, within the same cap. */
function failureWait(pollIntervalMs, n, err) {
  const limit = Math.max(pollIntervalMs, MAX_FAILURE_WAIT_MS);
  let step = pollIntervalMs;
  for (let i = 1; i < n && step < limit; i++) step *= 2;
  step = Math.min(step, limit);
  return Math.max(step / 2 + Math.random() * (step / 2), retryAfterMs(err, limit));
}

/** Whether a failure is an answer that is not Ratchet's own (the Go SDK's
 * notRatchets): an HTTP status without the API's error envelope (no error
 * code), as a proxy, a load balancer or a platform answers during a deploy
 * or a misroute (a bare 404, 408, 400, 401). It says nothing of the
 * worker's key or claims, and passes as a 5xx does: it never stops the
 * worker, which asks again after backoff. */
const notRatchets = (err) => err instanceof RatchetError && !err.code;
/** Whether a call's failure says the worker's key no longer works at all
 * (the Go SDK's keyRefused): a 401 (the key was revoked, or never was
 * valid), whichever call meets it first. A 403 on a heartbeat or a report is
 * not: it is that job's alone (the key may not work its tool). Nor is a 401
 * without Ratchet's error envelope (notRatchets). Exported for the tests;
 * not by the package. */
export const keyRefused = (err) => err instanceof RatchetError && err.status === 401 && !notRatchets(err);
/** Whether a claim's failure says the server no longer knows the worker id
 * (it deletes registrations not seen for JOB_RETENTION_DAYS): registering
 * again mends it, once. */
const workerUnknown = (err) => err instanceof RatchetError && err.status === 404 && err.code === 'not_found';
const now = () => performance.now();

function withResolvers() {
  let resolve;
  const promise = new Promise((res) => { resolve = res; });
  return { promise, resolve };
}

/** Resolves after ms or when `wake` resolves, whichever comes first. */
function nap(ms, wake) {
  if (ms === Infinity) return wake;
  let timer;
  return Promise.race([wake, new Promise((r) => { timer = setTimeout(r, timerMs(ms)); })]).finally(() => clearTimeout(timer));
}

const reportPath = (jobId) => `/jobs/${pathId(jobId)}/report`;

/**
 * Delivers the worker's job reports, batching those that finish together,
 * as the Go SDK's reporter does. A report made while fewer than three
 * deliveries are in flight goes at once, on the single-report route when it
 * is alone; reports made while three are in flight gather and go as one
 * batch (POST /jobs/report, up to 100) when one ends. Three, as in the Go
 * SDK, so that a delivery that hangs (up to its 30 s) does not hold every
 * other report behind it while their leases lapse (QA: another worker ran
 * such a job again). Each report in a batch is fenced
 * by its own lease token and answered in its own slot, which is handed to
 * its job as the single report's answer would be. A batch is repeated
 * through failures as one report is, each report's callbacks told (so no
 * claim is made while it fails, and a stop's deadline ends it), except
 * that a batch the server refuses whole (an older server, a body it will
 * not read) and one that meets a 500 twice running (which one report could
 * cause) are sent again report by report, each on its own, at most
 * reportTimes.singlesInFlight of a batch at once (as the Go and Python SDKs
 * send them: a server that just answered "too much" is not sent a hundred
 * requests at once), so that one report the server chokes on holds back
 * only itself; so is one whose
 * answer twice running does not line up with its reports (batchResults): a
 * protocol error, not an outage, which the batch sent again whole would
 * meet for ever (its reports never drained, no claim was made meanwhile,
 * and a stop gave them all up at its deadline), as in the Go and Python SDKs.
 */
export class Reporter { // exported for the tests; not by the package
  #transport;
  #queue = [];
  #inFlight = 0; // deliveries being sent
  #cutoff;
  #tell;

  /** cutoff aborts every delivery in flight (the stop's deadline and twice
   * its grace passed): one that hangs then ends as one
   * given up, as in the Go SDK, instead of holding stop() for its time.
   * tell is onError's: a delivery still failing (retrying). */
  constructor(transport, cutoff, tell = () => {}) {
    this.#transport = transport;
    this.#cutoff = cutoff;
    this.#tell = tell;
  }

  /** Delivers jobId's report (of attempt); rejects as Transport.callUntil
   * would for the single report: with its refusal, or the failure mayWait
   * gave up on. onQueued is called once the report is queued (the worker
   * then frees its job's slot, as the Go SDK's does once its reporter took
   * the report): at once while fewer than reportTimes.queued reports wait
   * in the queue before it, else once it has moved up or into a delivery,
   * so that a slow server slows claiming instead of piling up reports; at
   * the latest as the call ends. */
  async deliver(jobId, body, { mayWait, onRetry, onAttempt = () => {}, attempt = 0, onQueued = () => {} }) {
    let size;
    try {
      size = Buffer.byteLength(stringify(body));
    } catch {
      size = REPORT_BATCH_BYTES; // alone: its own send fails as it did before
    }
    let settle;
    const settled = new Promise((resolve) => { settle = resolve; });
    const report = { jobId, attempt, body, mayWait, onRetry, onAttempt, onQueued, queued: false, size, settle, outcome: {} };
    this.#queue.push(report);
    this.#pump();
    this.#admit();
    const outcome = await settled;
    admitted(report);
    if (outcome.alone) {
      const told = retrying([report], this.#tell);
      await outcome.alone.run(() => this.#transport.callUntil('POST', reportPath(jobId), body, {
        mayWait, onAttempt, timeoutMs: this.#deliveryTimeout(), signal: this.#cutoff, bareMayPass: true,
        stopOn: told.failed,
        onRetry: () => { onRetry(); told.retrying(); },
      }));
    } else if (outcome.error) {
      throw outcome.error;
    }
  }

  #pump() {
    if (this.#inFlight >= reportTimes.inFlight || this.#queue.length === 0) return;
    const batch = [];
    const jobs = new Set();
    const later = []; // a second report of a job already in the batch (a newer attempt): the server refuses it there
    let size = 0;
    while (this.#queue.length > 0 && batch.length < REPORT_BATCH_MAX) {
      if (jobs.has(this.#queue[0].jobId)) {
        later.push(this.#queue.shift());
        continue;
      }
      if (batch.length > 0 && size + this.#queue[0].size > REPORT_BATCH_BYTES) break;
      const report = this.#queue.shift();
      batch.push(report);
      jobs.add(report.jobId);
      size += report.size;
    }
    this.#queue.unshift(...later);
    for (const report of batch) admitted(report);
    this.#inFlight++;
    this.#send(batch).finally(() => {
      this.#inFlight--;
      this.#pump();
      this.#admit();
    });
    this.#pump(); // what is left, while a delivery may start
  }

  /** Tells the reports waiting within reportTimes.queued of the queue's
   * head that they are queued (admitted). */
  #admit() {
    for (const report of this.#queue.slice(0, reportTimes.queued)) admitted(report);
  }

  async #send(batch) {
    try {
      await this.#deliverBatch(batch);
    } catch (err) {
      for (const report of batch) report.outcome.error ??= err;
    } finally {
      for (const report of batch) report.settle(report.outcome);
    }
  }

  #deliveryTimeout() {
    return Math.min(this.#transport.timeoutMs, reportTimes.deliveryMs);
  }

  async #deliverBatch(batch) {
    const [path, body] = batch.length === 1
      ? [reportPath(batch[0].jobId), batch[0].body]
      : ['/jobs/report', { reports: batch.map((r) => ({ jobId: r.jobId, ...r.body })) }];
    let failed500 = 0; // 500s running
    let mismatched = 0; // answers running that do not line up with the reports (batchResults)
    let misread = false; // the answer to the attempt that just failed did not
    const told = retrying(batch, this.#tell);
    let answer;
    try {
      answer = await this.#transport.callUntil('POST', path, body, {
        timeoutMs: this.#deliveryTimeout(),
        signal: this.#cutoff,
        bareMayPass: batch.length === 1, // a batch's bare 4xx sends it report by report (below)
        // Every report is told: each keeps whether it gave up.
        mayWait: (wait) => batch.map((r) => r.mayWait(wait)).every(Boolean),
        onRetry: () => {
          for (const r of batch) r.onRetry();
          told.retrying();
        },
        onAttempt: () => { for (const r of batch) r.onAttempt(); },
        stopOn: (err) => {
          told.failed(err);
          failed500 = err.status === 500 ? failed500 + 1 : 0;
          mismatched = misread ? mismatched + 1 : 0;
          misread = false;
          return failed500 >= 2 || mismatched >= 2;
        },
        read: batch.length === 1 ? undefined : (answer, requestId) => {
          try {
            return batchResults(answer, batch.map((r) => r.jobId), requestId);
          } catch (err) {
            misread = true; // the transport rejects it as an answer lost
            throw err;
          }
        },
      });
    } catch (err) {
      if (mismatched >= 2 || (err instanceof RatchetError
        && (failed500 >= 2 || (batch.length > 1 && err.status >= 400 && err.status < 500 && err.status !== 429)))) {
        const slots = new Slots(reportTimes.singlesInFlight);
        for (const r of batch) r.outcome.alone = slots;
        return;
      }
      throw err;
    }
    if (batch.length === 1) return;
    answer.forEach(([, error], i) => {
      if (error) batch[i].outcome.error = error;
    });
  }
}

/** Calls report's onQueued, once. */
function admitted(report) {
  if (report.queued) return;
  report.queued = true;
  report.onQueued();
}

/** Tells tell, every reportTimes.retryingNoticeMs while one delivery (of a
 * report, or a batch: named by its first report) keeps failing for a reason
 * that may pass, that it is still retried, as the Go SDK's reporter.send
 * does: a ReportNotRecordedError (what 'retrying') naming the job and
 * attempt, how many more the batch holds and for how long it has failed,
 * its cause the last failure; never a report's body. failed is the
 * delivery's stopOn (it records the failure and never stops it), retrying
 * its onRetry. */
function retrying(batch, tell) {
  let since = null;
  let toldAt = 0;
  let last;
  return {
    failed(err) {
      last = err;
      return false;
    },
    retrying() {
      const t = now();
      if (since === null) {
        since = toldAt = t;
        return;
      }
      if (t - toldAt < reportTimes.retryingNoticeMs) return;
      toldAt = t;
      const [first] = batch;
      const why = last instanceof RatchetError ? last.code : errorName(last);
      tell(new ReportNotRecordedError(`ratchet: the report of job ${first.jobId} attempt ${first.attempt} (and ${batch.length - 1} more in its batch) `
        + `not recorded for ${Math.round((t - since) / 1000)}s (${why}); still retrying`,
      { jobId: first.jobId, attempt: first.attempt, what: 'retrying', cause: last }));
    },
  };
}

/** Slots runs at most size of the functions given to run at once, the
 * others in turn as those end. */
class Slots {
  #free;
  #waiting = [];

  constructor(size) {
    this.#free = size;
  }

  async run(fn) {
    if (this.#free > 0) this.#free--;
    else await new Promise((resolve) => this.#waiting.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next) next(); // the slot passes on
      else this.#free++;
    }
  }
}

/** Each report's result in a batch report's answer (POST /jobs/report), in
 * the reports' order (jobIds), with its error: null, or the refusal the
 * single report would have thrown (itemError), its requestId the batch
 * response's; [result, error]. An answer without one result per report,
 * each naming the job of the report sent in its slot, throws: it cannot be
 * matched to the reports, not even those whose slots agree, and is read as
 * an answer lost (Transport.call's read: ConnectionLostError, repeated as
 * one), as the Go and Python SDKs read it. The worker's batches and
 * Ratchet.reportJobs read the answer alike. */
export function batchResults(answer, jobIds, requestId = '') {
  const results = answer.results;
  if (!Array.isArray(results) || results.length !== jobIds.length) throw new TypeError('not one result per report');
  return results.map((result, i) => {
    if (result === null || typeof result !== 'object' || result.jobId !== jobIds[i]) {
      throw new TypeError('a result for another job');
    }
    return [result, result.error && typeof result.error === 'object' ? itemError(result.error, requestId) : null];
  });
}

const ITEM_ERROR_STATUS = { not_found: 404, forbidden: 403, lease_lost: 409, lease_expired: 409, invalid_state: 409 };

/** A batch's refusal of one report, as the single report's refusal (the
 * status it would have answered: 409 lease_lost, 404 not_found...), with
 * the batch response's requestId. */
export function itemError(envelope, requestId = '') {
  const code = String(envelope.code ?? '');
  const detail = envelope.detail && typeof envelope.detail === 'object' ? { ...envelope.detail } : {};
  return new RatchetError(ITEM_ERROR_STATUS[code] ?? 400, code, String(envelope.message ?? ''), detail, requestId);
}

/**
 * Claims jobs of its registered tools and runs them (`ratchet.worker`).
 * Claims in batches sized to its free slots, again at once after a full
 * batch and every pollIntervalMs (±10 %) when idle; heartbeats each job
 * well inside its lease (independently of the handler's timeout); aborts
 * the handler's signal at its timeout and when the server asks; reports
 * each outcome (those finishing together in one batch, each answered as
 * its own report), retried until the server answers, and makes no new claim
 * while a report is failing. Only a bounded, redacted message leaves the
 * process for a failure.
 */
export class Worker {
  #transport;
  #reporter;
  #tools = new Map();
  #slots = 0; // taken: a slot is freed once its job's report is queued (#freeSlotOf)
  #active = new Set(); // supervisors not yet ended
  #jobs = new Set(); // each running job's record
  #reporting = new Set(); // the records of jobs whose outcome is being reported
  #stragglers = 0;
  // The reports whose delivery met a failure, each with when it first did;
  // and when the server last recorded one. A failing report holds the
  // claims until the server records another after its failure began: the
  // server takes reports then, and this one fails for a reason of its own
  // (the Go SDK's holding()).
  #failing = new Map();
  #ownFailures = new Set(); // the keys of #failing whose reports fail on their own: see #report
  #recordedSent = -Infinity; // the send time of the latest-sent delivery the server recorded
  #recordedAt = -Infinity; // and when it did
  #started = false;
  #stopping = new AbortController();
  #claimCutoff = new AbortController(); // aborted at the stop's deadline
  #reportCutoff = new AbortController(); // aborted when reports are given up (the deadline and twice the stop grace)
  #stopTimers = []; // the timers that abort those two: cleared once the worker is done
  #stopGraceMs = DEFAULT_STOP_GRACE_MS; // start()'s stopGraceMs
  #stopAt = null;
  #stopDeadlinePassed = false;
  // A stop() without a deadline (Infinity) was asked for: a handler that
  // ignores a lost lease or a cancel request gets the grace from then (the
  // Go SDK's undated).
  #undated = false;
  #changed = withResolvers(); // a slot freed, a report settled, or the stop
  #done = null;
  #onError = null;
  #failureLog = new FailureLog(); // without onError: the default failure log
  #errors = Promise.resolve();
  #lostReports = 0;
  #leftUnreported = 0;
  #claimId = null; // a claim whose answer was lost, to ask again
  #claimLimit = 1; // the limit that claim asked for
  #abandonedClaims = 0; // claims whose answers were lost and never asked again in time
  #refused = null; // the claim's 401 or 403 that stopped the worker

  constructor(transport) {
    this.#transport = transport;
    this.#reporter = new Reporter(transport, this.#reportCutoff.signal, (error) => this.#notify(error));
    this.workerId = null;
  }

  addTool({ name, version, handler, classifyError }) {
    if (!name || !version) throw new TypeError('ratchet: a tool needs a name and a version');
    if (typeof handler !== 'function' || (classifyError !== undefined && typeof classifyError !== 'function')) {
      throw new TypeError('ratchet: handler and classifyError must be functions');
    }
    if (isGeneratorFunction(handler)) {
      // Its body never runs when called: the generator was reported as the
      // output {} (its JSON), a success that never happened (SDK review).
      throw new TypeError('ratchet: a handler must return its output (or a promise of it), not be a generator function');
    }
    if (this.#started) throw new Error('ratchet: register tools before start()');
    const ref = `${name}@${version}`;
    if (this.#tools.has(ref)) throw new Error(`ratchet: ${ref} is already registered`);
    this.#tools.set(ref, { name, version, ref, handler, classifyError });
  }

  /**
   * Registers the worker and polls for jobs until stop() or until `signal`
   * aborts. Resolves once the worker has stopped, its running jobs
   * ended and onError been told what the stop gave up (waited for up to a
   * second, as stop() waits); rejects when Ratchet refuses the registration (401, 403, 400
   * in its error envelope: a proxy's bare 400, 401 or 404 is waited out as a
   * 5xx is), or,
   * once stopped, with the RatchetError of a claim refused 401 (the key was
   * revoked) or 403 (the key may not claim), or of a registration refused
   * so after a claim answered 404, which stops the worker as stop() would
   * (once onError has been told it, waited for up to a second).
   * A registration or claim that fails for a reason that may pass (the
   * server unreachable, a 5xx, a 429, once the transport's maxRetries ran
   * out) goes to onError and is tried again for as long as the worker runs:
   * after the nth failure in a row the worker waits pollIntervalMs doubled
   * n-1 times, at most a minute (or pollIntervalMs when longer), half of it
   * jittered, and never less than the server's Retry-After within that cap
   * (and up to a fifth of it more, drawn at random, as after a 429 or a 503); so the registration waits out an outage (under one Idempotency-Key),
   * and a stop meanwhile resolves start() having run nothing. stopGraceMs
   * (10 000 by default, as the Go and Python workers') is how long, once a
   * stop's deadline passed, aborted handlers have to return and be
   * reported, and then how much longer the reports are sent (see stop()).
   * Without onError the worker writes each problem to console.warn as one
   * line holding none of the error's text (see FailureLog): the first at
   * once, then at most a line a minute counting those left out, and one
   * line when a registration or claim succeeds after a logged failure to
   * reach the server.
   */
  async start({ concurrency = 1, pollIntervalMs = 30_000, waitSeconds = 0, onError, signal, stopGraceMs = DEFAULT_STOP_GRACE_MS } = {}) {
    if (!Number.isSafeInteger(concurrency) || concurrency < 1) throw new RangeError('ratchet: concurrency must be a positive integer');
    if (!Number.isSafeInteger(waitSeconds) || waitSeconds < 0 || waitSeconds > 20) throw new RangeError('ratchet: waitSeconds must be an integer from 0 to 20');
    if (!Number.isFinite(pollIntervalMs) || pollIntervalMs <= 0) throw new RangeError('ratchet: pollIntervalMs must be a positive number');
    if (typeof stopGraceMs !== 'number' || !Number.isFinite(stopGraceMs) || stopGraceMs < 0) {
      throw new RangeError('ratchet: stopGraceMs must be a number of milliseconds, 0 or more');
    }
    if (this.#tools.size === 0) throw new Error('ratchet: register at least one tool before start()');
    if (this.#started) throw new Error('ratchet: the worker was already started');
    this.#started = true;
    this.#stopGraceMs = stopGraceMs;
    this.#onError = onError ?? null;
    const tools = [...this.#tools.values()].map(({ name, version }) => ({ name, version }));
    // A stop (or the signal) while the worker waits for the server to
    // register it ends the wait.
    const onAbort = () => this.#requestStop(stopTimes.implicitTimeoutMs);
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
    let registered = false;
    this.#done = (async () => {
      try {
        const workerId = await this.#registerUntil(tools, pollIntervalMs);
        if (workerId === null) return; // stopped while waiting for the server: nothing ran
        this.workerId = workerId;
        registered = true;
        await this.#loop(concurrency, pollIntervalMs, waitSeconds, tools);
      } finally {
        signal?.removeEventListener('abort', onAbort);
        // Done: nothing is left to cut, and the stop's timers go now rather
        // than at the deadline and twice the grace (review: unref'd, they
        // kept nothing alive, but a test runner's open-handle check
        // flagged them).
        for (const timer of this.#stopTimers) clearTimeout(timer);
        // Without onError, the default log counts the problems it left out
        // since its last line, if any.
        if (!this.#onError) this.#warn(this.#failureLog.stopped());
      }
    })();
    try {
      await this.#done;
    } catch (err) {
      if (!registered) [this.#started, this.#done] = [false, null]; // start() may be called again
      throw err;
    }
    // onError (or the default log) is told what the stop gave up, for at
    // most a second, before start() settles, as stop() waits: start's
    // signal resolved it while the reports it lost were still being told,
    // and a program that ended then (process.exit()) never heard of them
    // (review: start() rejected while a slow onError had yet to be told the
    // refusal; Go's Stop and Python's start() wait alike).
    await nap(1_000, this.#errors);
    // A worker that stopped because its key was refused must not resolve as
    // a clean stop would (QA: it polled on for ever, each claim refused 401).
    if (this.#refused) throw this.#refused;
  }

  /**
   * Stops polling and lets running handlers finish within timeoutMs; then
   * their signals abort ('stopping') and those that do not return within
   * start()'s stopGraceMs (10 s by default) are left unreported (their
   * leases lapse and another worker runs them), each told to onError once
   * as a ReportNotRecordedError naming the job (one whose lease was lost or
   * whose job the server cancelled, before or during the grace, is left
   * running after the same grace, from the deadline too, nothing told: its job does not run again
   * for this worker's leaving it; with no deadline, Infinity, the grace
   * runs from the stop's call, or from the loss if later, as under Go's
   * Stop without a deadline); the reports are sent until
   * the deadline and twice the grace at most, as the Go SDK's Stop. Resolves to whether every job this worker claimed ended with its
   * outcome recorded or settled elsewhere (a report refused because a newer
   * attempt holds the job, it ended or no longer exists loses nothing, as Go's
   * Stop) and no handler is still running. A stop before start()
   * does nothing and resolves to true. It may be called from onError.
   */
  async stop({ timeoutMs = 30_000 } = {}) {
    if (typeof timeoutMs !== 'number' || Number.isNaN(timeoutMs)) {
      throw new RangeError('ratchet: stop timeoutMs must be a number of milliseconds (Infinity: no deadline)');
    }
    if (!this.#started) return true;
    this.#requestStop(timeoutMs);
    if (timeoutMs === Infinity && !this.#undated) {
      // No deadline to start their grace at: a handler ignoring a lost
      // lease or a cancel request, which has nothing left to report, gets
      // it from now (or from the loss, if later), as under Go's Stop
      // without a deadline (review: stop() waited for it for ever).
      this.#undated = true;
      for (const job of this.#jobs) job.nudge();
    }
    if (this.#done) await this.#done.catch(() => {}); // a refused registration is start()'s to throw
    // onError is told what is queued, for at most a second (stop may be
    // awaited by an onError call in that very queue).
    await nap(1_000, this.#errors);
    return this.#lostReports === 0 && this.#leftUnreported === 0 && this.#stragglers === 0 && this.#abandonedClaims === 0;
  }

  #requestStop(timeoutMs) {
    if (this.#stopAt === null) {
      this.#stopAt = now() + Math.max(0, timeoutMs);
      this.#stopTimers = [
        // A deadline past setTimeout's 2^31-1 ms, Infinity ("no deadline")
        // included, fired these at once: the claim was cut, and every report
        // given up unsent, the job run again (timerMs).
        setTimeout(() => this.#claimCutoff.abort(new Error('stopping')), timerMs(timeoutMs)),
        this.#reportCutoffIn(Math.max(0, timeoutMs) + 2 * this.#stopGraceMs),
      ];
      this.#stopTimers[0].unref?.();
    }
    this.#stopping.abort();
    this.#signal();
  }

  /** The timer that gives every report up (cuts the deliveries in flight)
   * ms from now: the stop's deadline and twice the grace. */
  #reportCutoffIn(ms) {
    const timer = setTimeout(() => this.#reportCutoff.abort(new Error('ratchet: the worker stopped before the report was answered')), timerMs(ms));
    timer.unref?.();
    return timer;
  }

  #signal() {
    this.#changed.resolve();
    this.#changed = withResolvers();
  }

  #register(tools, key = newRequestId()) {
    // A stop ends a wait between attempts, and its deadline cuts one in
    // flight, as a claim's.
    return this.#transport.call('POST', '/workers/register', { tools }, {
      safe: true, idempotencyKey: key, signal: this.#claimCutoff.signal, retryCutoff: this.#stopping.signal,
    }).then((answer) => answer.workerId);
  }

  /** Registers for start(), under one Idempotency-Key (a repeat after a
   * lost answer gets the worker id the first attempt registered), trying
   * again after each failure that may pass, told to onError, with
   * failureWait's backoff: a worker started while the server is down waits
   * for it, as a River or Temporal worker does (worker QA: start() gave up
   * after maxRetries; review: it rejected with a proxy's bare 4xx,
   * notRatchets, at once). Rejects with Ratchet's own refusal; resolves to
   * null when the worker was stopped first. */
  async #registerUntil(tools, pollIntervalMs) {
    const key = newRequestId();
    for (let failures = 1; ; failures++) {
      if (this.#stopping.signal.aborted) return null;
      try {
        const workerId = await this.#register(tools, key);
        this.#recovered();
        return workerId;
      } catch (err) {
        if (this.#stopping.signal.aborted) return null;
        if (!this.#transient(err) && !notRatchets(err)) throw err; // a proxy's bare 400, 401 or 404 may pass
        this.#notify(err);
        await this.#pause(failureWait(pollIntervalMs, failures, err));
      }
    }
  }

  /** Registers under a new worker id, for a server that forgot the old one;
   * resolves to the failure (the loop tells it: a refusal stops the worker,
   * as at start(); after a failure that may pass, the next claim, answered
   * 404 again, registers again), or null. */
  async #registerAgain(tools) {
    try {
      this.workerId = await this.#register(tools);
      this.#recovered();
    } catch (again) {
      return again;
    }
    return null;
  }

  /** Whether a claim's failure, or the failure of the registration made
   * again after a claim answered 404, stops the worker (the Go SDK's
   * refusedForGood): any refusal that asking again cannot mend. A 401 (the
   * key was revoked) and a 403 (the key may not claim, or not these tools),
   * but also a 400, a 409 other than retry_request, a 422 or any other 4xx:
   * a claim's body is the worker's own, so every claim it would ever send is
   * refused alike (API.md names no other refusal of a claim). A claim's 404
   * not_found is the one refusal that registering again mends
   * (workerUnknown). Only Ratchet's own refusal, in its error envelope,
   * stops the worker: an answer without one (a proxy's, notRatchets) may
   * pass, as do the failures #transient names. */
  #refusedForGood(err) {
    return err instanceof RatchetError && !notRatchets(err) && !workerUnknown(err) && !this.#transient(err);
  }

  /** Stops the worker for good after a refusal no retry mends: a 401 met by
   * any call (keyRefused), or a claim's or registration's refusal
   * (#refusedForGood), whichever call met it first. It stops as a stop whose
   * deadline has passed: no more claims (a claim in flight is cut), and the
   * running handlers are aborted at once ('stopping'; those that return
   * within stopGraceMs are reported as they returned, which a revoked key's
   * server refuses too). notice goes to onError, or without it to the
   * default log at once, whatever its pacing; err is what start() rejects
   * with (the first refusal's; a later one is only told). */
  #refuse(err, notice = err) {
    if (this.#refused) {
      this.#notify(notice);
      return;
    }
    this.#refused = err;
    if (this.#onError) this.#notify(notice);
    else this.#warn(this.#failureLog.refusal(notice));
    this.#requestStop(0);
    if (this.#stopAt > now()) {
      // A stop asked for before: its deadline is now, and its reports are
      // cut twice the grace from now, not from its own deadline, as the
      // Python worker cuts them (review: only their retries ended then; a
      // delivery in flight ran on to the stop's own cut-off).
      this.#stopAt = now();
      clearTimeout(this.#stopTimers[1]);
      this.#stopTimers[1] = this.#reportCutoffIn(2 * this.#stopGraceMs);
    }
    this.#claimCutoff.abort(new Error('stopping'));
    this.#signal();
  }

  /** Whether a failure may pass: what the transport repeats for a call safe
   * to repeat (a lost answer, a 5xx, a 429, a 408, retry_request). */
  #transient(err) {
    if (err instanceof ConnectionLostError) return true;
    return err instanceof RatchetError && this.#transport.retryDelay(err, 0, true) !== null;
  }

  /** Waits ms, or until the worker stops (the transport's sleep: a test
   * seam). */
  async #pause(ms) {
    try {
      await this.#transport.sleep(ms, this.#stopping.signal);
    } catch {
      // stopping
    }
  }

  async #loop(concurrency, pollIntervalMs, waitSeconds, tools) {
    const stopping = this.#stopping.signal;
    let lost = 0; // claims running whose answers were lost
    let failed = 0; // claims running that failed otherwise
    let registeredAgain = false; // the last claim answered 404 and the worker registered again
    try {
      while (!stopping.aborted) {
        // No claim while a slot is missing, or while a report is failing:
        // the job it reports may lapse and come back to this very worker,
        // which would run it again.
        while ((this.#slots >= concurrency || this.#reportsHolding() || this.#reportLapsing(waitSeconds)) && !stopping.aborted) {
          await nap(claimTimes.checkMs, this.#changed.promise);
        }
        if (stopping.aborted) break;
        const limit = Math.min(concurrency - this.#slots, MAX_CLAIM);
        const sent = now();
        let jobs;
        let date;
        try {
          [jobs, date] = await this.#claim(limit, waitSeconds);
        } catch (err) {
          if (this.#claimCutoff.signal.aborted) break;
          if (!stopping.aborted) {
            // A claim the stop cut (a 429's wait) is no failure to tell.
            if (workerUnknown(err) && !registeredAgain) {
              // The server forgot the worker: register again, once.
              this.#notify(err);
              const again = await this.#registerAgain(tools);
              if (again !== null && !stopping.aborted) {
                if (!this.#transient(again) && !notRatchets(again)) {
                  this.#refuse(again);
                  break;
                }
                this.#notify(again);
              }
              registeredAgain = again === null;
            } else if (workerUnknown(err) || this.#refusedForGood(err)) {
              // No claim will ever succeed (the key was revoked, may not
              // claim, or every claim is refused; or the server forgot the
              // worker again right after it registered again): stop rather
              // than ask for ever.
              this.#refuse(err);
              break;
            } else {
              this.#notify(err);
            }
          }
          if (!workerUnknown(err)) registeredAgain = false;
          // A claim whose answer was lost is asked again under its id after
          // the transport's backoff (never before the server's
          // Retry-After): the jobs it may have leased are this worker's
          // while their leases hold, which a whole interval would outlast
          // (Go SDK QA: jobs with a 15 s lease lapsed unseen while the
          // worker waited its 30 s). Other failures back off from the poll
          // interval (worker QA: one poll interval followed every failure,
          // however long they lasted, and a 429's Retry-After was heeded
          // only within maxRetries).
          if (this.#claimId !== null) {
            lost++;
            await this.#pause(Math.max(Math.min(this.#transport.backoff(lost), pollIntervalMs), retryAfterMs(err, MAX_FAILURE_WAIT_MS)));
          } else {
            lost = 0;
            failed++;
            await this.#pause(failureWait(pollIntervalMs, failed, err));
          }
          continue;
        }
        lost = failed = 0;
        registeredAgain = false;
        this.#recovered();
        for (const job of jobs) this.#dispatch(job, sent, date);
        if (jobs.length >= limit || (jobs.length > 0 && waitSeconds > 0)) continue; // work is waiting
        // A long poll already waited part of the interval.
        await this.#pause(jittered(pollIntervalMs) - (waitSeconds > 0 ? now() - sent : 0));
      }
      await this.#askAgainWhileStopping();
    } finally {
      await this.#drain();
    }
  }

  /** Once the worker stops, asks again under the id of a claim whose answer
   * was lost, until it is answered or the stop's deadline: the jobs it may
   * have leased run within the stop's time like those of a claim in flight
   * when the stop came (Go SDK QA: the stop ended the asking, and the jobs
   * lapsed unseen). Asked again, a claim that had leased nothing leases
   * afresh, at most its own limit, without a long poll. */
  async #askAgainWhileStopping() {
    if (this.#refused) return; // a refused key's claim would be refused too; the handlers stop at once
    for (let attempt = 0; this.#claimId !== null; attempt++) {
      const cutoff = this.#claimCutoff.signal;
      if (attempt > 0) {
        try {
          await sleep(this.#transport.backoff(attempt), cutoff);
        } catch {
          // the stop's deadline
        }
      }
      if (cutoff.aborted) {
        this.#abandonedClaims++;
        this.#notify(new ConnectionLostError('ratchet: the worker stopped before a claim whose answer was lost was ' +
          'answered; the jobs it leased, if any, run again once their leases lapse'));
        return;
      }
      const sent = now();
      let jobs;
      let date;
      try {
        [jobs, date] = await this.#claim(this.#claimLimit, 0);
      } catch (err) {
        if (this.#claimId === null) this.#notify(err); // answered: refused
        continue;
      }
      for (const job of jobs) this.#dispatch(job, sent, date);
    }
  }

  #reportsHolding() {
    for (const key of this.#failing.keys()) if (!this.#ownFailures.has(key)) return true;
    return false;
  }

  #reportLapsing(waitSeconds) {
    const horizon = now() + REPORT_LEASE_MARGIN_MS + waitSeconds * 1000;
    for (const record of this.#reporting) if (!record.ownFailure && record.leaseEnd <= horizon) return true;
    return false;
  }

  async #claim(limit, waitSeconds) {
    // One claim id across the call's retries, and across claims until one
    // is answered: a claim whose answer was lost is answered again with the
    // jobs it leased, instead of leaving them to lapse. Cut at the stop's
    // deadline.
    if (this.#claimId === null) [this.#claimId, this.#claimLimit] = [newRequestId(), limit];
    const body = { limit, waitSeconds, claimId: this.#claimId };
    let answer;
    let date;
    try {
      [answer, date] = await this.#transport.call('POST', `/workers/${pathId(this.workerId)}/claim`, body, {
        safe: true, withDate: true, timeoutMs: Math.max(this.#transport.timeoutMs, waitSeconds * 1000 + 10_000), signal: this.#claimCutoff.signal,
        // A stop ends a wait between attempts (a 429's minute, QA): a claim
        // whose answer was lost is asked again while stopping instead.
        retryCutoff: this.#stopping.signal,
      });
    } catch (err) {
      if (err instanceof RatchetError && !err.mayHaveApplied) this.#claimId = null; // answered: nothing was leased under it
      throw err;
    }
    this.#claimId = null;
    return [answer?.jobs ?? [], date]; // the answer's Date: its jobs' leases are read by it
  }

  #dispatch(job, sent, date) {
    this.#slots++;
    const run = this.#supervise(job, sent, date).catch((err) => this.#notify(err)).finally(() => {
      this.#active.delete(run);
      this.#signal();
    });
    this.#active.add(run);
  }

  #freeSlot() {
    this.#slots--;
    this.#signal();
  }

  /** Frees the slot record holds, if it still does: once its report is
   * queued (the reporter retries it meanwhile, its deliveries bounded by
   * the queue's room and, while they fail, by no claim being made), or as
   * its supervisor ends, as the Go worker frees a job's slot once its report
   * is queued (a report failing on its own, which the server keeps
   * refusing, kept the slot of a worker of one until the stop gave it up).
   * Not a straggler's: its slot is kept until its handler returns. */
  #freeSlotOf(record) {
    if (!record.holdsSlot) return;
    record.holdsSlot = false;
    this.#freeSlot();
  }

  async #drain() {
    // Running jobs until the stop deadline, then abort the rest and wait
    // for their supervisors (which report what returned within the grace).
    while (this.#active.size > 0) {
      const left = this.#stopAt === null ? Infinity : this.#stopAt - now();
      if (left <= 0) break;
      await nap(left, this.#changed.promise);
    }
    this.#stopDeadlinePassed = true;
    for (const job of this.#jobs) job.stop();
    while (this.#active.size > 0) await Promise.allSettled([...this.#active]);
  }

  async #supervise(job, sent, date) {
    const tool = this.#tools.get(`${job.name}@${job.version}`);
    const timeoutMs = Number(job.timeoutMs) || 0;
    const label = { jobId: job.jobId, attempt: job.attempt, token: job.leaseToken };
    if (!tool) {
      // The server only hands out registered pairs; if it ever does not,
      // give the job back for a worker that has it.
      try {
        await this.#report(label, { status: 'FAILED', error: { message: 'worker has no handler for this name@version', retryable: true } });
      } finally {
        this.#freeSlot();
      }
      return;
    }
    const leaseMs = claimedLeaseMs(job, timeoutMs, date);
    const aborter = new AbortController();
    let reason = null;
    let wake = withResolvers();
    const record = {
      leaseEnd: sent + leaseMs, // by this process's clock, as last extended
      lostCode: null, // why the lease was lost: the server's code, or '' for a local lapse
      holdsSlot: true, // until its report is queued (#freeSlotOf), or a straggler's until its handler returns
      stopRequested: false,
      // The lease was lost or the server cancelled the job, even after the
      // stop aborted the handler: its job does not run again for this
      // worker's leaving it.
      settledElsewhere: false,
      cancel(why) {
        if (why === 'lease_lost' || why === 'cancelled') record.settledElsewhere = true;
        if (reason === null) {
          reason = why;
          aborter.abort(new CancelledError(why));
        }
        wake.resolve();
      },
      stop() {
        record.stopRequested = true;
        record.cancel('stopping');
      },
      nudge() {
        wake.resolve();
      },
    };
    label.record = record;
    this.#jobs.add(record);
    if (this.#stopDeadlinePassed) record.stop();
    const context = {
      jobId: job.jobId, stepId: job.stepId, runId: job.runId, name: job.name, version: job.version,
      attempt: job.attempt, maxAttempts: job.maxAttempts ?? 0, idempotencyKey: job.idempotencyKey, timeoutMs, signal: aborter.signal,
      get cancelReason() { return reason; },
    };
    const deadline = timeoutMs > 0 ? now() + timeoutMs : Infinity;
    let settled = null;
    let straggler = false;
    (async () => tool.handler(job.input, context))()
      .then((output) => ({ output }), (error) => ({ error }))
      .then((result) => {
        settled = { ...result, reason }; // why it was cancelled when it returned
        wake.resolve();
        if (straggler) {
          // Its slot was kept until now.
          this.#stragglers--;
          this.#freeSlot();
        }
      });
    const beatsDone = new AbortController();
    const beats = this.#heartbeats(label, tool.ref, record, leaseMs, timeoutMs, beatsDone.signal);
    try {
      let graceEnd = null;
      while (settled === null) {
        if (graceEnd === null && (record.stopRequested || (record.settledElsewhere && this.#undated))) graceEnd = now() + this.#stopGraceMs;
        const until = Math.min(graceEnd ?? Infinity, reason === null ? deadline : Infinity);
        await nap(until - now(), wake.promise);
        wake = withResolvers();
        if (settled !== null) break;
        const t = now();
        if (graceEnd !== null && t >= graceEnd) break;
        if (reason === null && t >= deadline) {
          record.cancel('timeout');
          graceEnd = t + graceTimes.timeoutMs;
        }
      }
    } finally {
      beatsDone.abort();
      await beats;
      this.#jobs.delete(record);
    }
    this.#reporting.add(record);
    try {
      await this.#finish(tool, label, record, context, settled, reason, timeoutMs, () => { straggler = true; });
    } finally {
      this.#reporting.delete(record);
    }
  }

  async #finish(tool, label, record, context, settled, reason, timeoutMs, markStraggler) {
    if (settled === null) {
      // The handler ignored its signal; whatever it returns later is
      // dropped, and its slot stays taken until it does. A timeout is
      // recorded now; a stopping worker leaves the job unreported. A
      // handler whose lease was lost (onError was told) or whose job the
      // server cancelled (it runs no more), before the stop or during its
      // grace, is left running with nothing to report or tell: stop()
      // resolves false (QA: a lease lost during the grace was told "it
      // runs again").
      markStraggler();
      record.holdsSlot = false; // freed as its handler returns
      this.#stragglers++;
      if (reason === 'timeout') {
        await this.#report(label, { status: 'FAILED', error: { message: `handler timed out after ${timeoutMs}ms`, retryable: true } });
      } else if (reason === 'stopping' && !record.settledElsewhere) {
        // Its lease lapses and the job runs again elsewhere: onError is
        // told, naming the job (QA: only stop()'s false said so, and not
        // which job would run again).
        this.#leftUnreported++;
        this.#notify(new ReportNotRecordedError(`ratchet: job ${label.jobId} attempt ${label.attempt} was left unreported, its handler `
          + `still running when the stop grace (${this.#stopGraceMs} ms) ended; its lease lapses and it runs again`,
        { jobId: label.jobId, attempt: label.attempt }));
      }
      return;
    }
    try {
      await this.#reportOutcome(tool, label, record, context, settled);
    } finally {
      this.#freeSlotOf(record);
    }
  }

  async #reportOutcome(tool, label, record, context, settled) {
    if (settled.reason === 'lease_lost') {
      // A success is reported all the same unless the job ended: the server
      // records a lapsed attempt that no claim superseded. A failure is not.
      if (!('error' in settled) && (record.lostCode === 'lease_lost' || record.lostCode === '')) {
        await this.#reportSuccess(label, tool, settled.output);
      }
      return;
    }
    if (!('error' in settled)) {
      await this.#reportSuccess(label, tool, settled.output);
      return;
    }
    let decision;
    try {
      decision = this.#judge(tool, settled.error, context, settled.reason);
    } catch (failure) {
      this.#notify(failure);
      decision = { message: 'handler failed with an error that could not be inspected', retryable: true };
    }
    const { message, retryable, hint } = decision;
    await this.#report(label, { status: 'FAILED', error: { message, retryable, ...(hint === undefined ? {} : { retryAfterMs: hint }) } });
  }

  /** Extends the lease well before it lapses until `done` aborts, and
   * cancels the handler when the server asks or the lease is gone (a
   * refusal, or its end passing by this process's clock while heartbeats
   * fail, one at least tried since the lease was granted or last extended,
   * as the Go and Python workers do). Never delays the supervisor's own
   * timing. */
  async #heartbeats(label, ref, record, leaseMs, timeoutMs, done) {
    let failed = null; // the last heartbeat's failure
    let failures = 0; // heartbeats failed in a row
    let tried = false; // a heartbeat was sent since the lease was granted or last extended
    for (;;) {
      try {
        await heartbeatTimes.pause(beatWait(beatEvery(record.leaseEnd, timeoutMs), failed, failures), done);
      } catch {
        return;
      }
      failed = null;
      if (now() >= record.leaseEnd && tried) {
        // Not before one heartbeat was tried, as doEffect tries one: a
        // lease measured from a long-polling claim's sending runs from when
        // the server answered it, up to waitSeconds later, and may look
        // lapsed before the handler starts (review: a 1 s timeout's lease,
        // 11 s, under waitSeconds 20, was aborted as lost a second in, never
        // heartbeated, and its job ran again).
        record.lostCode = '';
        record.cancel('lease_lost');
        this.#notify(new LeaseLostError({ jobId: label.jobId, attempt: label.attempt, tool: ref }));
        return;
      }
      const beatSent = now();
      tried = true;
      try {
        const beat = await this.#transport.call('POST', `/jobs/${pathId(label.jobId)}/heartbeat`, { leaseToken: label.token },
          { safe: true, maxRetries: 0, timeoutMs: Math.min(this.#transport.timeoutMs, beatCutoff(record.leaseEnd - beatSent)), signal: done });
        failures = 0;
        tried = false;
        if (beat?.cancelRequested) {
          record.cancel('cancelled'); // the lease is not extended for a cancelled job
          return;
        }
        record.leaseEnd = beatSent + leaseMs;
      } catch (err) {
        if (done.aborted) return;
        if (err instanceof RatchetError && [403, 404, 409].includes(err.status) && !notRatchets(err)) {
          // The lease is lost (a newer claim) or the job ended. Not so a
          // bare one (notRatchets: a proxy's answer during a deploy or a
          // misroute), which says nothing of the lease and is tried again
          // as a 5xx is, as in the Go and Python workers.
          record.lostCode = err.code;
          record.cancel('lease_lost');
          this.#notify(new LeaseLostError({ jobId: label.jobId, attempt: label.attempt, tool: ref, cause: err }));
          return;
        }
        if (keyRefused(err)) {
          // The key was revoked: the worker stops, as after a claim's 401,
          // and this handler is aborted with the others.
          this.#refuse(err);
          return;
        }
        this.#notify(err);
        failed = err;
        failures++;
      }
    }
  }

  /** Maps a failed attempt to the error the API is told. Order:
   * server-requested cancellation; explicit SDK errors; timeout and worker
   * stop; the tool's classifier; retryable by default. */
  #judge(tool, error, context, reason) {
    if (reason === 'cancelled') return { message: "cancelled at the server's request", retryable: false };
    if (error instanceof RetryableError) return { message: redactMessage(describe(error.message)), retryable: true, hint: error.retryAfterMs };
    if (error instanceof NonRetryableError) return { message: redactMessage(describe(error.message)), retryable: false };
    if (reason === 'timeout') return { message: `handler timed out after ${context.timeoutMs}ms`, retryable: true };
    if (reason === 'stopping') return { message: 'worker stopped before the handler finished', retryable: true };
    const message = redactMessage(`${errorName(error)}: ${describe(error instanceof Error ? error.message : error)}`);
    if (!tool.classifyError) return { message, retryable: true };
    let decision;
    try {
      decision = tool.classifyError(error, context);
    } catch (failure) {
      this.#notify(failure);
      return { message, retryable: true };
    }
    const verdict = readDecision(decision);
    if (verdict === null) {
      this.#notify(new InvalidDecisionError(tool.ref, decision));
      return { message, retryable: true };
    }
    let { retryable, hint } = verdict;
    if (hint !== undefined && (hint < MIN_RETRY_AFTER_MS || hint > MAX_RETRY_AFTER_MS)) {
      this.#notify(new InvalidDecisionError(tool.ref, decision, true));
      hint = clampRetryAfterMs(hint);
    }
    return { message, retryable, hint };
  }

  async #reportSuccess(label, tool, output) {
    let json;
    try {
      // NaN and the infinities are no JSON numbers: JSON.stringify would
      // send them as null, an output the handler never returned (the Go
      // and Python SDKs refuse them too). Written at any depth the API
      // takes (JSON.stringify's RangeError past about 4 500 levels was
      // reported as an output that is not JSON).
      json = stringifyFinite(output === undefined ? null : output);
    } catch (failure) {
      this.#notify(new TypeError(`ratchet: ${tool.ref} returned an output that is not JSON (${errorName(failure)}); reported as a non-retryable failure`));
    }
    if (typeof json !== 'string') {
      // A BigInt, a cycle, NaN or an infinity, or a function or symbol as
      // the whole output.
      await this.#report(label, { status: 'FAILED', error: { message: 'handler output is not JSON', retryable: false } });
      return;
    }
    const refusal = Buffer.byteLength(json) > MAX_OUTPUT_BYTES
      // Over the server's request size limit: sending it could only be
      // refused (or cut off by a proxy), and the job would run again.
      ? new RatchetError(413, 'payload_too_large', 'output too large')
      : await this.#report(label, { status: 'SUCCEEDED', output: JSON.parse(json) }, false);
    if (refusal === null) return;
    const why = unrecordableOutput(refusal);
    if (why === null) {
      this.#lost(label, refusal);
      return;
    }
    // The server can never record this output: report the attempt failed
    // for good instead, so the handler runs once.
    this.#notify(new ReportNotRecordedError(`ratchet: job ${label.jobId} attempt ${label.attempt}: the server refuses the output (${refusal.code}); reporting it failed`,
      { jobId: label.jobId, attempt: label.attempt, what: 'output_refused', cause: refusal }));
    await this.#report(label, { status: 'FAILED', error: { message: why, retryable: false } });
  }

  /** Sends a report, repeating it through lost answers and server failures
   * until the server answers (once stopping, at most until the stop's
   * deadline and twice the stop grace), and counting it as failing meanwhile,
   * so that no claim is made. Resolves to the refusal, or null when
   * recorded or given up (then told to onError). */
  async #report(label, report, notify = true) {
    const body = { leaseToken: label.token, ...report };
    const failing = {}; // this report's key in #failing while it is
    let gaveUp = false;
    let sent = 0;
    try {
      await this.#reporter.deliver(label.jobId, body, {
        attempt: label.attempt,
        onQueued: () => { if (label.record) this.#freeSlotOf(label.record); },
        mayWait: (wait) => {
          gaveUp = this.#stopAt !== null && now() + wait > this.#stopAt + 2 * this.#stopGraceMs;
          return !gaveUp;
        },
        onAttempt: () => { sent = now(); },
        // After a failed delivery. The report fails on its own when the
        // server, after its first failure, recorded a report of a delivery
        // sent since, and this delivery, sent after that, failed again: the
        // server takes reports and refuses or chokes on this one, which
        // pausing the worker would not mend (not even once its lease
        // lapsed: one bad output stalled the worker). When an outage ends,
        // the first report recorded says nothing of the others still
        // waiting out their backoff (Go SDK QA: taken as failing on their
        // own, their jobs ran again). Found failing on its own, it no
        // longer holds the claims: the claim loop is woken, not left to its
        // next check (up to a second late).
        onRetry: () => {
          if (!this.#failing.has(failing)) this.#failing.set(failing, now());
          else if (!this.#ownFailures.has(failing) && this.#recordedSent > this.#failing.get(failing) && sent > this.#recordedAt) {
            this.#ownFailures.add(failing);
            if (label.record) label.record.ownFailure = true; // no longer held by its lease's end (#reportLapsing)
            this.#signal();
          }
        },
      });
      if (sent > this.#recordedSent) [this.#recordedSent, this.#recordedAt] = [sent, now()];
      return null;
    } catch (err) {
      if (err instanceof RatchetError && err.code === 'lease_lost' && err.detail.reportedOutcome === body.status) return null; // an earlier send landed
      if (!(err instanceof RatchetError) || gaveUp) {
        this.#lost(label, err);
        return null;
      }
      if (notify) this.#lost(label, err);
      return err;
    } finally {
      this.#failing.delete(failing);
      this.#ownFailures.delete(failing);
      this.#signal();
    }
  }

  #lost(label, error) {
    // A refusal that settles the job elsewhere (a newer attempt holds it,
    // say) loses nothing stop() answers for, as Go's Stop.
    if (!settledRefusal(error)) this.#lostReports++;
    const why = error instanceof RatchetError ? error.code : errorName(error);
    const notice = new ReportNotRecordedError(`ratchet: the report of job ${label.jobId} attempt ${label.attempt} was not recorded (${why}); ${whatFollows(error)}`,
      { jobId: label.jobId, attempt: label.attempt, cause: error });
    if (keyRefused(error)) this.#refuse(error, notice); // the key was revoked: the worker stops, as after a claim's 401
    else this.#notify(notice);
  }

  // onError runs in order, never on the poll loop, a heartbeat or a report.
  // Without it, the default failure log's line for error (if any) is
  // written in that order instead.
  #notify(error) {
    const onError = this.#onError;
    if (!onError) {
      this.#warn(this.#failureLog.failure(error));
      return;
    }
    this.#errors = this.#errors.then(async () => {
      try {
        await onError(error);
      } catch {
        // onError's own failure has nowhere to go
      }
    });
  }

  /** Tells the default failure log that a registration or claim succeeded
   * (nothing with onError). */
  #recovered() {
    if (!this.#onError) this.#warn(this.#failureLog.recovered());
  }

  #warn(line) {
    if (line === null) return;
    this.#errors = this.#errors.then(() => {
      try {
        console.warn(line);
      } catch {
        // a console that fails has nowhere to go either
      }
    });
  }
}

/** A claimed job's lease length in ms: its leaseMs, which the server of
 * this repository always sends; from a server that does not, its
 * leaseExpiresAt less the claim answer's Date (less a second: Date has
 * whole seconds), as the Go worker and a gate lease read it, so that a
 * server clock ahead of or behind this process's neither lengthens nor
 * cuts the lease; without a Date, what is left of it by this process's
 * clock; the timeout plus 10 s (the server's default grace) only when it
 * says neither. */
function claimedLeaseMs(job, timeoutMs, date) {
  const given = Number(job.leaseMs);
  if (given > 0) return given;
  const left = leaseLength(job.leaseExpiresAt, date);
  return left > 0 ? left : timeoutMs + 10_000;
}

/** A lease's length in ms by the server's clock: its expiry less the
 * answer's Date (whole seconds, so less a second), or by this process's
 * clock without one; 0 when unknown. The gate's leases and a claimed job's
 * without leaseMs are read by it. */
export function leaseLength(expiresAt, date) {
  const end = Date.parse(expiresAt ?? '');
  if (!Number.isFinite(end)) return 0;
  return Math.max(Number.isFinite(date) ? end - date - 1_000 : end - Date.now(), 0);
}

function beatEvery(leaseEnd, timeoutMs) {
  let left = leaseEnd - now();
  if (timeoutMs > 0) left = Math.min(left, timeoutMs);
  return Math.min(Math.max(left / 3, MIN_HEARTBEAT_MS), MAX_HEARTBEAT_MS);
}

/** The wait before the next heartbeat (the Go SDK's heartbeatWait): every
 * (beatEvery) after one that worked; after the nth failure in a row
 * failureWait's backoff from MIN_HEARTBEAT_MS, as after failed claims: 1, 2,
 * 4, 8 s... (doubled n-1 times), half of it drawn at random, so that the
 * workers of a fleet do not all try again at the same marks after an
 * outage, and at least the server's Retry-After (a 429's, a 503's, and up
 * to a fifth of it more, drawn at random); either
 * never past every, a third of the lease left, so that at least two more
 * tries fit before it lapses (sdk QA: this SDK waited a third of the lease
 * left at once, Go retried inside its client; the backoff had no jitter). */
export function beatWait(every, failed, failures) {
  if (failed === null) return every;
  return Math.min(every, failureWait(MIN_HEARTBEAT_MS, failures, failed));
}

/** How long one heartbeat may take (the Go SDK's heartbeatCutoff), leftMs
 * being what the lease has to run by this process's clock: a third of it,
 * at least MIN_HEARTBEAT_MS, within the client's timeout, so that a hung
 * call leaves two thirds of the lease for the paced tries after it and
 * never hides the lapse (sdk QA: this SDK cut it at 10 s, past the end of a
 * short lease; Go let it run to the lease's end). */
export function beatCutoff(leftMs) {
  return Math.max(leftMs / 3, MIN_HEARTBEAT_MS);
}

function errorName(error) {
  try {
    const name = error?.name ?? error?.constructor?.name;
    return typeof name === 'string' && name ? name : typeof error;
  } catch {
    return 'Error';
  }
}

function describe(value) {
  try {
    return String(value);
  } catch {
    return 'an error that could not be described';
  }
}

/** A classifier's decision as {retryable, hint}, or null when invalid: not
 * {retryable: boolean[, retryAfterMs: number]}, or a hint with retryable
 * false (the API never takes one). A fractional hint is rounded up (a hint
 * is a minimum wait). */
export function readDecision(decision) {
  if (decision === null || typeof decision !== 'object' || Array.isArray(decision)) return null;
  if (!Object.keys(decision).every((k) => k === 'retryable' || k === 'retryAfterMs')) return null;
  const { retryable, retryAfterMs } = decision;
  if (typeof retryable !== 'boolean') return null;
  if (retryAfterMs === undefined || retryAfterMs === null) return { retryable, hint: undefined };
  // An infinite hint is read as any huge one is: the worker clamps it to
  // 24 h and says so (review: refused, the job was retried at the policy's
  // delay, sooner than a finite hint). NaN is no number.
  if (!retryable || typeof retryAfterMs !== 'number' || Number.isNaN(retryAfterMs)) return null;
  return { retryable: true, hint: Math.ceil(retryAfterMs) };
}

/** Whether a report's refusal is the server's last word on the job, so that
 * nothing is lost by it (Go's settledRefusal): a newer claim holds the job,
 * the job ended or has another outcome recorded, or it no longer exists. A
 * job that ended because this attempt, its last, lapsed before the report got
 * through is not settled by it: the outcome was lost. */
function settledRefusal(error) {
  if (!(error instanceof RatchetError)) return false;
  if (error.code === 'invalid_state') return error.detail?.leaseLapsed !== true;
  return error.code === 'lease_lost' || error.code === 'not_found';
}

/** What becomes of a job whose report was not recorded, by the refusal (Go's
 * settledRefusal): only a refusal that does not settle the job leaves it to
 * run again (QA: a lease_lost was told "its lease lapses and it runs again",
 * though a newer attempt already held the job). */
function whatFollows(error) {
  const code = error instanceof RatchetError ? error.code : null;
  if (code === 'lease_lost') return 'a newer attempt holds the job';
  if (code === 'invalid_state' && error.detail?.leaseLapsed === true) {
    return "this attempt, the job's last, lapsed before it got through, which ended the job";
  }
  if (code === 'invalid_state') return 'the job already ended or has another outcome recorded';
  if (code === 'not_found') return 'the job no longer exists';
  return 'its lease lapses and it runs again';
}

/** What to report instead of a success whose output the server refused: 413
 * for its size, or 400 naming a field under output (never the value), or
 * the body, which only the output can make unreadable (nested more levels
 * deep than the server reads). */
function unrecordableOutput(err) {
  // A bare 413 (no error envelope) is a proxy's body limit before the
  // server (nginx refuses bodies over 1 MB by default), and a success
  // report's body is its output (the Go SDK's unrecordableOutput; review:
  // given up, the job ran again at every lapse).
  if (err.status === 413 && !err.code) return 'handler output exceeds the request size limit of a proxy before the server';
  if (err.code === 'payload_too_large') return "handler output exceeds the server's request size limit";
  if (err.code === 'invalid_request') {
    for (const item of err.validation) {
      const field = String(item?.field ?? '');
      if (field === 'output' || field === 'body' || field.startsWith('output.')) return 'handler output refused by the server at ' + field;
    }
  }
  return null;
}

// The worker runtime: claims jobs for registered tools and runs them.

import {
  ConnectionLostError, InvalidDecisionError, MAX_RETRY_AFTER_MS, MIN_RETRY_AFTER_MS, NonRetryableError, RatchetError,
  ReportNotRecordedError, RetryableError,
} from './errors.js';
import { redactMessage } from './redact.js';
import { newRequestId, pathId, sleep } from './transport.js';

// Heartbeat pacing: a third of the lease left, within these bounds.
const MIN_HEARTBEAT_MS = 1_000;
const MAX_HEARTBEAT_MS = 60_000;
// How long a handler whose timeout (or whose worker's stop deadline) passed
// has to return before the worker goes on without it.
const GRACE_MS = 1_000;
// How long a report is retried after its lease lapses at the latest: the
// server still records a lapsed attempt's report until a newer claim.
const REPORT_PATIENCE_MS = 30_000;
const MAX_CLAIM = 100;

/** Why a handler's signal was aborted: context.cancelReason. */
export class CancelledError extends Error {
  constructor(reason) {
    super(`ratchet: handler cancelled (${reason})`);
    this.name = reason === 'timeout' ? 'TimeoutError' : 'AbortError';
    this.reason = reason;
  }
}

const jittered = (ms) => ms * (0.9 + Math.random() * 0.2);
const now = () => performance.now();

/**
 * Claims jobs of its registered tools and runs them (`ratchet.worker`).
 * Claims in batches sized to its free slots, again at once after a full
 * batch and every pollIntervalMs (±10 %) when idle; heartbeats each job
 * well inside its lease; aborts the handler's signal at its timeout and
 * when the server asks; reports each outcome, retried until the server
 * answers. Only a bounded, redacted message leaves the process for a failure.
 */
export class Worker {
  #transport;
  #tools = new Map();
  #running = 0;
  #active = new Set();
  #started = false;
  #stopping = new AbortController();
  #stopAt = null;
  #slotFreed = null;
  #done = null;
  #onError = null;
  #errors = Promise.resolve();
  #lostReports = 0;
  #leftUnreported = 0;
  #cancels = new Set(); // each running job's cancel(reason)
  #stopDeadlinePassed = false;

  constructor(transport) {
    this.#transport = transport;
    this.workerId = null;
  }

  addTool({ name, version, handler, classifyError }) {
    if (!name || !version) throw new TypeError('ratchet: a tool needs a name and a version');
    if (typeof handler !== 'function' || (classifyError !== undefined && typeof classifyError !== 'function')) {
      throw new TypeError('ratchet: handler and classifyError must be functions');
    }
    if (this.#started) throw new Error('ratchet: register tools before start()');
    const ref = `${name}@${version}`;
    if (this.#tools.has(ref)) throw new Error(`ratchet: ${ref} is already registered`);
    this.#tools.set(ref, { name, version, ref, handler, classifyError });
  }

  /**
   * Registers the worker and polls for jobs until stop() or until `signal`
   * aborts. Resolves once the worker has stopped and its running jobs
   * ended; rejects when the registration fails.
   */
  async start({ concurrency = 1, pollIntervalMs = 30_000, waitSeconds = 0, onError, signal } = {}) {
    if (!Number.isSafeInteger(concurrency) || concurrency < 1) throw new RangeError('ratchet: concurrency must be a positive integer');
    if (!(waitSeconds >= 0 && waitSeconds <= 20)) throw new RangeError('ratchet: waitSeconds must be from 0 to 20');
    if (this.#tools.size === 0) throw new Error('ratchet: register at least one tool before start()');
    if (this.#started) throw new Error('ratchet: the worker was already started');
    this.#started = true;
    this.#onError = onError ?? null;
    const tools = [...this.#tools.values()].map(({ name, version }) => ({ name, version }));
    try {
      this.workerId = await this.#register(tools);
    } catch (err) {
      this.#started = false;
      throw err;
    }
    if (signal) {
      if (signal.aborted) this.#requestStop(30_000);
      else signal.addEventListener('abort', () => this.#requestStop(30_000), { once: true });
    }
    this.#done = this.#loop(concurrency, pollIntervalMs, waitSeconds, tools);
    await this.#done;
  }

  /**
   * Stops polling and lets running handlers finish within timeoutMs; then
   * their signals abort ('stopping') and those that do not return within a
   * second are left unreported (their leases lapse and another worker runs
   * them). Resolves to whether every job this worker claimed ended with its
   * outcome recorded.
   */
  async stop({ timeoutMs = 30_000 } = {}) {
    this.#requestStop(timeoutMs);
    if (!this.#done) return false;
    await this.#done;
    await this.#errors;
    return this.#lostReports === 0 && this.#leftUnreported === 0;
  }

  #requestStop(timeoutMs) {
    this.#stopAt ??= now() + Math.max(0, timeoutMs);
    this.#stopping.abort();
    this.#slotFreed?.resolve();
  }

  #register(tools) {
    return this.#transport.call('POST', '/workers/register', { tools }, { safe: true, idempotencyKey: newRequestId() })
      .then((answer) => answer.workerId);
  }

  async #pause(ms) {
    try {
      await sleep(ms, this.#stopping.signal);
    } catch {
      // stopping
    }
  }

  async #loop(concurrency, pollIntervalMs, waitSeconds, tools) {
    const stopping = this.#stopping.signal;
    while (!stopping.aborted) {
      while (this.#running >= concurrency && !stopping.aborted) {
        this.#slotFreed = withResolvers();
        await this.#slotFreed.promise;
      }
      if (stopping.aborted) break;
      const limit = Math.min(concurrency - this.#running, MAX_CLAIM);
      const sent = now();
      let jobs;
      try {
        jobs = await this.#claim(limit, waitSeconds);
      } catch (err) {
        if (err instanceof RatchetError && err.status === 404 && err.code === 'not_found') {
          // The worker id is unknown: register again under a new one.
          try {
            this.workerId = await this.#register(tools);
          } catch (again) {
            this.#notify(again);
          }
        }
        this.#notify(err);
        await this.#pause(jittered(pollIntervalMs));
        continue;
      }
      for (const job of jobs) this.#dispatch(job, sent);
      if (jobs.length < limit) await this.#pause(jittered(pollIntervalMs));
    }
    await this.#drain();
  }

  async #claim(limit, waitSeconds) {
    // One claim id across the call's retries: a claim whose answer was lost
    // is answered again with the jobs it leased.
    const body = { limit, waitSeconds, claimId: newRequestId() };
    const answer = await this.#transport.call('POST', `/workers/${pathId(this.workerId)}/claim`, body,
      { safe: true, timeoutMs: Math.max(this.#transport.timeoutMs, waitSeconds * 1000 + 10_000) });
    return answer?.jobs ?? [];
  }

  #dispatch(job, sent) {
    this.#running++;
    const run = this.#execute(job, sent).finally(() => this.#active.delete(run));
    this.#active.add(run);
  }

  #releaseSlot() {
    this.#running--;
    this.#slotFreed?.resolve();
  }

  async #drain() {
    // Running jobs until the stop deadline, then abort the rest and wait
    // for their supervisors (which report what returned within the grace).
    const left = this.#stopAt === null ? Infinity : this.#stopAt - now();
    if (this.#active.size > 0 && left > 0) {
      let timer;
      await Promise.race([Promise.allSettled([...this.#active]), new Promise((r) => { timer = setTimeout(r, left); })]);
      clearTimeout(timer);
    }
    this.#stopDeadlinePassed = true;
    for (const cancel of this.#cancels) cancel('stopping');
    while (this.#active.size > 0) await Promise.allSettled([...this.#active]);
  }

  async #execute(job, sent) {
    let slotHeld = true;
    const release = () => {
      if (slotHeld) {
        slotHeld = false;
        this.#releaseSlot();
      }
    };
    try {
      await this.#supervise(job, sent, release);
    } catch (err) {
      this.#notify(err);
    } finally {
      release();
    }
  }

  async #supervise(job, sent, release) {
    const tool = this.#tools.get(`${job.name}@${job.version}`);
    const timeoutMs = Number(job.timeoutMs) || 0;
    const leaseMs = Number(job.leaseMs) || timeoutMs + 10_000;
    let leaseEnd = sent + leaseMs;
    const token = job.leaseToken;
    const label = { jobId: job.jobId, attempt: job.attempt };
    if (!tool) {
      // The server only hands out registered pairs; if it ever does not,
      // give the job back for a worker that has it.
      await this.#report(label, token, leaseEnd, { status: 'FAILED', error: { message: 'worker has no handler for this name@version', retryable: true } });
      return;
    }
    const aborter = new AbortController();
    let reason = null;
    let wake = withResolvers();
    const cancel = (why) => {
      if (reason === null) {
        reason = why;
        aborter.abort(new CancelledError(why));
      }
      wake.resolve();
    };
    this.#cancels.add(cancel);
    if (this.#stopDeadlinePassed) cancel('stopping');
    const context = {
      jobId: job.jobId, stepId: job.stepId, runId: job.runId, name: job.name, version: job.version,
      attempt: job.attempt, idempotencyKey: job.idempotencyKey, timeoutMs, signal: aborter.signal,
      get cancelReason() { return reason; },
    };
    const started = now();
    const deadline = timeoutMs > 0 ? started + timeoutMs : Infinity;
    let settled = null;
    (async () => tool.handler(job.input, context))().then(
      (output) => { settled = { output, reason }; wake.resolve(); },
      (error) => { settled = { error, reason }; wake.resolve(); },
    );
    let heartbeating = true;
    let graceEnd = null;
    let lostCode = null;
    let nextBeat = now() + beatEvery(leaseEnd, timeoutMs);
    try {
      while (settled === null) {
        if (reason === 'stopping' && graceEnd === null) graceEnd = now() + GRACE_MS;
        const marks = [graceEnd ?? Infinity, heartbeating ? nextBeat : Infinity, reason === null ? deadline : Infinity];
        const until = Math.min(...marks);
        let timer;
        await Promise.race([wake.promise, ...(until === Infinity ? [] : [new Promise((r) => { timer = setTimeout(r, until - now()); })])]);
        clearTimeout(timer);
        wake = withResolvers();
        if (settled !== null) break;
        const t = now();
        if (graceEnd !== null && t >= graceEnd) break;
        if (reason === null && t >= deadline) {
          cancel('timeout');
          graceEnd = t + GRACE_MS;
        }
        if (heartbeating && t >= nextBeat) {
          const beatSent = now();
          try {
            const beat = await this.#transport.call('POST', `/jobs/${pathId(job.jobId)}/heartbeat`, { leaseToken: token },
              { safe: true, maxRetries: 1, timeoutMs: Math.min(this.#transport.timeoutMs, 10_000) });
            if (beat?.cancelRequested) {
              // The lease is not extended for a cancelled job.
              cancel('cancelled');
              heartbeating = false;
            } else {
              leaseEnd = beatSent + leaseMs;
            }
          } catch (err) {
            if (err instanceof RatchetError && [403, 404, 409].includes(err.status)) {
              // The lease is lost (a newer claim) or the job ended.
              lostCode = err.code;
              cancel('lease_lost');
              heartbeating = false;
            } else {
              this.#notify(err);
            }
          }
          if (heartbeating) nextBeat = now() + beatEvery(leaseEnd, timeoutMs);
        }
      }
    } finally {
      this.#cancels.delete(cancel);
    }
    if (settled === null) {
      // The handler ignored its signal; whatever it returns later is
      // dropped. A timeout is recorded now and its slot freed; a stopping
      // worker leaves the job unreported, its lease lapses.
      release();
      if (reason === 'timeout') {
        await this.#report(label, token, leaseEnd, { status: 'FAILED', error: { message: `handler timed out after ${timeoutMs}ms`, retryable: true } });
      } else if (reason === 'stopping') {
        this.#leftUnreported++;
      }
      return;
    }
    if (settled.reason === 'lease_lost') {
      // A success is reported all the same: the server records a lapsed
      // attempt that no claim superseded. A failure is not.
      if (!('error' in settled) && lostCode === 'lease_lost') await this.#reportSuccess(label, token, tool, leaseEnd, settled.output);
      return;
    }
    if (!('error' in settled)) {
      await this.#reportSuccess(label, token, tool, leaseEnd, settled.output);
      return;
    }
    const { message, retryable, hint } = this.#judge(tool, settled.error, context, settled.reason);
    await this.#report(label, token, leaseEnd, { status: 'FAILED', error: { message, retryable, ...(hint === undefined ? {} : { retryAfterMs: hint }) } });
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
    const message = redactMessage(`${errorName(error)}: ${describe(error?.message ?? error)}`);
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
      hint = Math.min(Math.max(hint, MIN_RETRY_AFTER_MS), MAX_RETRY_AFTER_MS);
    }
    return { message, retryable, hint };
  }

  async #reportSuccess(label, token, tool, leaseEnd, output) {
    let json;
    try {
      json = JSON.stringify(output === undefined ? null : output);
    } catch (failure) {
      json = undefined;
      this.#notify(new TypeError(`ratchet: ${tool.ref} returned an output that is not JSON (${errorName(failure)}); reported as a non-retryable failure`));
    }
    if (json === undefined) {
      await this.#report(label, token, leaseEnd, { status: 'FAILED', error: { message: 'handler output is not JSON', retryable: false } });
      return;
    }
    const refusal = await this.#report(label, token, leaseEnd, { status: 'SUCCEEDED', output: JSON.parse(json) }, false);
    if (refusal === null) return;
    const why = unrecordableOutput(refusal);
    if (why === null) {
      this.#lost(label, refusal);
      return;
    }
    // The server can never record this output (its size, or its rules):
    // report the attempt failed for good instead.
    this.#notify(new ReportNotRecordedError(`ratchet: job ${label.jobId} attempt ${label.attempt}: the server refused the output (${refusal.code}); reporting it failed`));
    await this.#report(label, token, leaseEnd, { status: 'FAILED', error: { message: why, retryable: false } });
  }

  /** Sends a report, repeating it through lost answers and server failures
   * until the server answers or the lease is long gone. Resolves to the
   * refusal, or null when recorded (or lost for good, then told to onError). */
  async #report(label, token, leaseEnd, report, notify = true) {
    const body = { leaseToken: token, ...report };
    const giveUp = Math.max(leaseEnd, now()) + REPORT_PATIENCE_MS;
    for (let attempt = 0; ; attempt++) {
      let wait;
      try {
        await this.#transport.call('POST', `/jobs/${pathId(label.jobId)}/report`, body, { safe: true, maxRetries: 0 });
        return null;
      } catch (err) {
        if (err instanceof RatchetError) {
          if (err.code === 'lease_lost' && err.detail.reportedOutcome === body.status) return null; // an earlier send landed
          wait = this.#transport.retryDelay(err, attempt, true);
          if (wait === null || now() + wait > giveUp) {
            if (notify) this.#lost(label, err);
            return err;
          }
        } else if (err instanceof ConnectionLostError) {
          wait = this.#transport.backoff(attempt);
          if (now() + wait > giveUp) {
            this.#lost(label, err);
            return null;
          }
        } else {
          throw err;
        }
      }
      await sleep(wait);
    }
  }

  #lost(label, error) {
    this.#lostReports++;
    const why = error instanceof RatchetError ? error.code : errorName(error);
    this.#notify(new ReportNotRecordedError(`ratchet: the report of job ${label.jobId} attempt ${label.attempt} was not recorded (${why}); its lease lapses and it runs again`));
  }

  // onError runs in order, never on the poll loop, a heartbeat or a report.
  #notify(error) {
    const onError = this.#onError;
    if (!onError) return;
    this.#errors = this.#errors.then(async () => {
      try {
        await onError(error);
      } catch {
        // onError's own failure has nowhere to go
      }
    });
  }
}

function withResolvers() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
  return { promise, resolve, reject };
}

function beatEvery(leaseEnd, timeoutMs) {
  let left = leaseEnd - now();
  if (timeoutMs > 0) left = Math.min(left, timeoutMs);
  return Math.min(Math.max(left / 3, MIN_HEARTBEAT_MS), MAX_HEARTBEAT_MS);
}

function errorName(error) {
  try {
    return error?.name || error?.constructor?.name || typeof error;
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
 * {retryable: boolean[, retryAfterMs: integer]}, or a hint with
 * retryable false (the API never takes one). */
export function readDecision(decision) {
  if (decision === null || typeof decision !== 'object' || Array.isArray(decision)) return null;
  if (!Object.keys(decision).every((k) => k === 'retryable' || k === 'retryAfterMs')) return null;
  const { retryable, retryAfterMs } = decision;
  if (typeof retryable !== 'boolean') return null;
  if (retryAfterMs === undefined || retryAfterMs === null) return { retryable, hint: undefined };
  if (!retryable || !Number.isSafeInteger(retryAfterMs)) return null;
  return { retryable: true, hint: retryAfterMs };
}

function unrecordableOutput(err) {
  if (err.code === 'payload_too_large') return "handler output exceeds the server's request size limit";
  if (err.code === 'invalid_request') {
    for (const item of err.validation) {
      const field = String(item?.field ?? '');
      if (field === 'output' || field.startsWith('output.')) return 'handler output refused by the server at ' + field;
    }
  }
  return null;
}

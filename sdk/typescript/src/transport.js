// One HTTP call to the API, with the retries that are safe for it.

import { randomBytes } from 'node:crypto';
import { STATUS_CODES } from 'node:http';
import { ConnectionLostError, RatchetError, markUnconfirmed } from './errors.js';
import { called } from './failurelog.js';
import { stringifyFinite } from './json.js';

export const VERSION = '0.2.7';
export const DEFAULT_BASE_URL = 'https://getratchet.app';

// Capped exponential backoff with equal jitter, as the Go SDK's: from
// baseMs, doubled, to capMs. An object so that tests can shorten them; not
// exported by the package.
export const backoffTimes = { baseMs: 500, capMs: 8_000 };
// A 429's wait is cut to the rate windows' minute, and lengthened by up to a
// fifth of it, drawn at random (never shortened), as the Go SDK's
// retryAfterSpread: the limiter tells every client it refused in one of its
// one-minute windows to come back at that window's end, and waiting exactly
// that long brought them all back at the same instant, most to be refused
// again. A 503's Retry-After (a proxy's maintenance page, a host shedding
// load) is spread the same: every client it turned away was told the same
// instant (it was waited exactly).
const MAX_RATE_LIMIT_WAIT_S = 60;
const RETRY_AFTER_SPREAD = 5;

/** The wait (ms) after a Retry-After that asked for ms (a 429's or a
 * 503's): never less, and up to a fifth more, drawn (in [0, 1)). The
 * transport's retries and the worker's waits spread theirs alike. */
export function spreadRetryAfter(ms, drawn) {
  return ms + drawn * (ms / RETRY_AFTER_SPREAD);
}
// How often a call sent under an Idempotency-Key waits while the server
// still holds the key for an earlier attempt (409 retry_request).
const MAX_KEY_HELD_WAITS = 40;

// Why a key is refused that no HTTP header can carry; never the key itself.
const KEY_UNSENDABLE = 'ratchet: the API key holds a line break, a control character or a character beyond ASCII, '
  + 'which no key holds and no Authorization header can carry (read it without its line end)';

// Printable ASCII (tabs allowed), what a header carries, as the Go and
// Python SDKs check it: the key, an Idempotency-Key and a User-Agent.
const SENDABLE = /^[\t\x20-\x7e]*$/;

/** Why an Idempotency-Key or a User-Agent is refused that no header can
 * carry, before anything is sent; never the value itself. */
function headerUnsendable(header) {
  return `ratchet: the ${header} holds a line break, a control character or a character beyond ASCII, which no header can carry`;
}

// Why an id or a name of "." or ".." is refused: a URL resolves it as a path
// step, so the call would reach another route (GET /runs/.. is GET /api/v1).
const DOT_SEGMENT = 'ratchet: an id or a name of "." or ".." cannot be sent: a URL reads it as a path step, calling another route';

/** Whether path (its query aside) has a "." or ".." step. */
function dotSegment(path) {
  return String(path).split('?', 1)[0].split('/').some((seg) => seg === '.' || seg === '..');
}

/** A random id for an Idempotency-Key, a begin's request_id or a claimId. */
export function newRequestId() {
  return randomBytes(16).toString('hex');
}

/** A path segment with everything but letters, digits and - . _ ~ percent-encoded. */
export function pathId(value) {
  return encodeURIComponent(String(value)).replace(/[!'()*]/g, (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase());
}

/** ms as a setTimeout delay: at least 0, and at most 2^31-1 (about 24.8
 * days), past which setTimeout fires at once: a longer wait, Infinity
 * ("no deadline") included, waits that long instead of none. */
export function timerMs(ms) {
  return Math.min(Math.max(ms, 0), 2 ** 31 - 1);
}

/** Resolves after ms, or rejects with the signal's reason once it aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, timerMs(ms));
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** Sends calls to one API base URL with one key. */
export class Transport {
  constructor({ baseUrl, apiKey, timeoutMs = 60_000, maxRetries = 3, userAgent = '', fetch: fetchImpl, sleep: sleepImpl } = {}) {
    if (!apiKey) throw new TypeError('ratchet: an API key is required (read it from the environment)');
    // Printable ASCII only (spaces and tabs allowed: the server trims them
    // around it), as the Go and Python SDKs check it: each call failed, as a
    // lost answer repeated (a worker's registration for ever), never sent.
    if (!SENDABLE.test(String(apiKey))) throw new TypeError(KEY_UNSENDABLE);
    // Refused as the key is: fetch refused it at each call, a lost answer
    // repeated, with a TypeError that printed it.
    if (!SENDABLE.test(String(userAgent))) throw new TypeError(headerUnsendable('user agent'));
    // A trailing /api/v1 is accepted, as the Go SDK accepts it (a base URL
    // copied from the API's own paths went to /api/v1/api/v1/..., every
    // call 404 not_found, where a Go client of the same setting worked).
    const base = String(baseUrl || DEFAULT_BASE_URL).replace(/\/+$/, '').replace(/\/api\/v1$/, '');
    let parsed;
    try {
      parsed = new URL(base);
    } catch {
      throw new TypeError('ratchet: baseUrl must be an http(s) URL');
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new TypeError('ratchet: baseUrl must be an http(s) URL');
    // fetch refuses a URL holding credentials (https://user:pass@host) at
    // each call, a TypeError read as a lost answer and retried (a worker's
    // registration for ever); the API key is the credential. The message
    // never holds them.
    if (parsed.username !== '' || parsed.password !== '') {
      throw new TypeError('ratchet: baseUrl must not hold credentials (user:password@); the API key is the credential');
    }
    this.base = base;
    this.#host = parsed.host;
    this.#prefix = parsed.pathname.replace(/\/+$/, '') + '/api/v1';
    // Refused as a method's timeoutMs is: 0, a negative number or NaN timed
    // every call out at once (a lost answer, repeated: a worker's
    // registration for ever).
    if (!(Number.isFinite(Number(timeoutMs)) && Number(timeoutMs) > 0)) {
      throw new TypeError('ratchet: timeoutMs must be a positive number of milliseconds');
    }
    this.timeoutMs = Number(timeoutMs);
    this.maxRetries = maxRetries;
    this.userAgent = (userAgent ? userAgent + ' ' : '') + `getratchet-node/${VERSION}`;
    this.fetch = fetchImpl ?? globalThis.fetch;
    this.sleep = sleepImpl ?? sleep;
    // Draws a backoff's and a 429's random part, in [0, 1) (a test's seam;
    // Math.random read at each draw, as a test may mock it).
    this.jitter = () => Math.random();
    this.#key = apiKey;
  }

  #key;
  #host;
  #prefix;

  /** err, marked with the call it answered (method, host and path, never
   * the query) and, for a lost answer, its kind: what a worker's default
   * failure log says of it instead of its text. */
  #called(err, method, path, kind) {
    return called(err, { method, host: this.#host, path: this.#prefix + path.split('?')[0], kind });
  }

  /**
   * Sends method path (under /api/v1) and returns the decoded answer.
   * `safe` says whether the call may be repeated after an answer was lost
   * (network failure, timeout, 5xx): true for calls made idempotent by a
   * key, an Idempotency-Key or a lease token. Failures the server says
   * changed nothing (429, retry_request, 408, a database_unavailable with
   * outcome not_applied) are repeated for any call. withDate resolves to
   * [answer, the response's Date in ms or NaN], for lease lengths measured
   * by the server's own clock. retryCutoff, once aborted, ends the waits
   * between attempts (a stopping worker's claim waiting out a 429): the call
   * then rejects with its last failure, or a ConnectionLostError when an
   * attempt may have been applied. callTimeoutMs (a caller's per-call
   * timeoutMs) bounds the whole call, its retries and the waits between
   * them included, as a Go context's deadline does, in place of the
   * per-attempt timeoutMs: each attempt is given the time left (cut, it
   * rejects ConnectionLostError 'timed out'), and a wait that would end
   * past the bound is not begun: the call rejects with its last failure at
   * once (marked unconfirmed when an attempt may have been applied). read,
   * when given, reads a 2xx answer against the request (with the response's
   * X-Request-Id) and gives what the call resolves to; what it throws makes
   * the answer unreadable, a lost answer as one cut short (a batch report's
   * results naming other jobs).
   */
  async call(method, path, body, { safe, idempotencyKey, timeoutMs, callTimeoutMs, maxRetries, signal, retryCutoff, withDate = false, read } = {}) {
    // Refused before sending: fetch refused such a key at each attempt, a
    // lost answer repeated, and a ".." id reached another route.
    if (idempotencyKey && !SENDABLE.test(String(idempotencyKey))) throw new TypeError(headerUnsendable('Idempotency-Key'));
    if (dotSegment(path)) throw new TypeError(DOT_SEGMENT);
    // NaN and the infinities are refused (a RangeError), not sent as null.
    const data = body === undefined ? undefined : stringifyFinite(body);
    const retries = maxRetries ?? this.maxRetries;
    if (callTimeoutMs !== undefined && !(Number.isFinite(callTimeoutMs) && callTimeoutMs > 0)) {
      throw new TypeError('ratchet: timeoutMs must be a positive number of milliseconds');
    }
    const deadline = callTimeoutMs === undefined ? null : performance.now() + callTimeoutMs;
    let attempt = 0;
    let held = 0;
    let unsure = false; // an attempt may have been applied
    let failure;
    for (;;) {
      let wait;
      let polled = false; // a wait for a held key, not a retry
      try {
        const attemptMs = deadline === null ? timeoutMs ?? this.timeoutMs : timerMs(deadline - performance.now());
        const [answer, date] = await this.#once(method, path, data, idempotencyKey, attemptMs, signal, read);
        return withDate ? [answer, date] : answer;
      } catch (err) {
        failure = err;
        if (err instanceof RatchetError) {
          unsure ||= err.mayHaveApplied;
          if (idempotencyKey && err.code === 'retry_request' && held < MAX_KEY_HELD_WAITS && retries > 0) {
            // The server still acts on an earlier attempt under this key:
            // wait as asked, outside the retry bound (but not with retries
            // off, as the Go SDK's).
            held++;
            polled = true;
            wait = Math.max(err.retryAfterSeconds, 1) * 1000;
          } else {
            wait = this.retryDelay(err, attempt, safe);
            // An earlier attempt may have acted: this answer only says why
            // the retries stopped (Go's unconfirmed).
            if (wait === null || attempt >= retries) throw unsure ? markUnconfirmed(err) : err;
          }
        } else if (err instanceof ConnectionLostError) {
          unsure = true;
          if (!safe || attempt >= retries) throw err;
          wait = this.backoff(attempt);
        } else {
          throw err; // the caller's signal aborted, or an error of ours
        }
      }
      // Waiting would outlive the call's bound: its last failure now, as
      // Go's (a serverless caller gets its time back instead of a sleep).
      if (deadline !== null && performance.now() + wait >= deadline) {
        throw unsure && failure instanceof RatchetError ? markUnconfirmed(failure) : failure;
      }
      // A wait for a held key is no retry, but ends as a retry's wait does:
      // at retryCutoff too (a stopping worker's registration; it waited on,
      // where Go's ends at the cut-off).
      if (!polled) attempt++;
      if (!retryCutoff) {
        await this.sleep(wait, signal);
        continue;
      }
      const either = new AbortController();
      const forward = () => either.abort();
      for (const s of [signal, retryCutoff]) s?.addEventListener('abort', forward, { once: true });
      try {
        if (signal?.aborted || retryCutoff.aborted) either.abort();
        await this.sleep(wait, either.signal);
      } catch {
        if (signal?.aborted) throw signal.reason;
        if (unsure && !(failure instanceof ConnectionLostError)) {
          throw this.#called(new ConnectionLostError(`ratchet: ${method} ${path.split('?')[0]}: given up`), method, path, 'given up');
        }
        throw failure;
      } finally {
        for (const s of [signal, retryCutoff]) s?.removeEventListener('abort', forward);
      }
    }
  }

  /**
   * Sends a call that is safe to repeat (a report), repeating it through
   * every failure worth repeating for as long as mayWait(waitMs) allows the
   * next wait; onAttempt runs before each attempt is sent, onRetry before
   * each wait. Rejects with the last
   * failure: a refusal, one mayWait gave up on, or a failure worth
   * repeating (a RatchetError, a ConnectionLostError) that stopOn(err),
   * told of each, says to hand back. read as call's. bareMayPass repeats a
   * 4xx without Ratchet's error envelope (no code: a proxy's or a load
   * balancer's answer during a deploy or a misroute, a 404, a 408) as a 5xx,
   * but a bare 413 (a body refused for good): a job's report (the Go SDK's
   * reporter.retryDelay). signal, once aborted, cuts an attempt and ends a
   * wait between them, rejecting with its reason.
   */
  async callUntil(method, path, body, { mayWait, onRetry = () => {}, onAttempt = () => {}, stopOn = () => false, timeoutMs, signal, read, bareMayPass = false }) {
    let unsure = false; // an attempt may have been applied
    for (let attempt = 0; ; attempt++) {
      let wait;
      onAttempt();
      try {
        return await this.call(method, path, body, { safe: true, maxRetries: 0, timeoutMs, signal, read });
      } catch (err) {
        if (err instanceof RatchetError) {
          unsure ||= err.mayHaveApplied;
          wait = this.retryDelay(err, attempt, true);
          if (wait === null && bareMayPass && !err.code && err.status >= 400 && err.status < 500 && err.status !== 413) {
            wait = this.backoff(attempt);
          }
          if (wait !== null && stopOn(err)) throw unsure ? markUnconfirmed(err) : err;
        } else if (err instanceof ConnectionLostError) {
          unsure = true;
          wait = this.backoff(attempt);
          if (stopOn(err)) throw err;
        } else throw err;
        if (wait === null || !mayWait(wait)) throw unsure ? markUnconfirmed(err) : err;
      }
      onRetry();
      // signal ends the wait as it cuts an attempt (a stopping worker's
      // report cut-off; review: a wait begun before the stop, a 429's
      // minute, was waited out, holding stop() past the cut-off).
      await this.sleep(wait, signal);
    }
  }

  /** How long to wait (ms) before repeating a call that failed with err,
   * or null when it must not be repeated. */
  retryDelay(err, attempt, safe) {
    if (err.status === 429) return this.retryAfterWait(Math.min(Math.max(err.retryAfterSeconds, 1), MAX_RATE_LIMIT_WAIT_S) * 1000);
    if (err.code === 'retry_request') return err.retryAfterSeconds * 1000;
    if (err.code === 'request_timeout' || (err.code === 'database_unavailable' && err.detail.outcome === 'not_applied')) {
      return this.backoff(attempt);
    }
    if (err.status >= 500 && safe) {
      // A 503's Retry-After is heeded up to the backoff's cap, so a
      // heartbeat does not sleep its lease away, and then spread as a
      // 429's is.
      return Math.max(this.backoff(attempt), this.retryAfterWait(Math.min(err.retryAfterSeconds * 1000, backoffTimes.capMs)));
    }
    return null;
  }

  /** The wait (ms) after a 429 or a 503 that asked for ms: never less, and
   * up to a fifth more, drawn at random (spreadRetryAfter). */
  retryAfterWait(ms) {
    return spreadRetryAfter(ms, this.jitter());
  }

  /** Capped exponential backoff (ms), half fixed and half random. */
  backoff(attempt) {
    const step = Math.min(backoffTimes.baseMs * 2 ** Math.min(attempt, 10), backoffTimes.capMs);
    return step / 2 + this.jitter() * (step / 2);
  }

  async #once(method, path, data, idempotencyKey, timeoutMs, signal, read) {
    const headers = { Authorization: 'Bearer ' + this.#key, Accept: 'application/json', 'User-Agent': this.userAgent };
    if (data !== undefined) headers['Content-Type'] = 'application/json';
    if (idempotencyKey) headers['Idempotency-Key'] = idempotencyKey;
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(new Error('timed out')), timerMs(timeoutMs));
    const onAbort = () => timeout.abort(signal.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    const name = `${method} ${path.split('?')[0]}`;
    try {
      // A listener added to a signal already aborted never fires: the call
      // is not sent (QA: a report batch queued behind one in flight went out
      // after the stop's cut-off and hung for its whole delivery timeout).
      if (signal?.aborted) throw signal.reason;
      let response;
      let raw;
      try {
        response = await this.fetch(this.base + '/api/v1' + path, { method, headers, body: data, signal: timeout.signal });
        raw = await response.text();
      } catch (failure) {
        if (signal?.aborted) throw signal.reason;
        // Connection refused, reset, timed out, or an answer cut short.
        const why = timeout.signal.aborted ? 'timed out' : failure?.cause?.code ?? failure?.cause?.name ?? failure?.name ?? 'network error';
        throw this.#called(new ConnectionLostError(`ratchet: ${name}: ${why}`, { cause: failure }), method, path, why);
      }
      if (!response.ok) throw this.#called(decodeError(response, raw), method, path);
      const date = Date.parse(response.headers.get('date') ?? '');
      try {
        const answer = JSON.parse(raw);
        if (answer === null || typeof answer !== 'object' || Array.isArray(answer)) throw new TypeError('not an object');
        return [read ? read(answer, response.headers.get('x-request-id') ?? '') : answer, date];
      } catch {
        // A 2xx whose body is not the object every route answers (cut
        // short by a proxy, or empty, or another JSON value): the call was
        // applied, and its answer lost as by a dropped connection (it was
        // handed on as null, as the Python and Go SDKs read it now).
        throw this.#called(new ConnectionLostError(`ratchet: ${name}: unreadable answer`), method, path, 'unreadable answer');
      }
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    }
  }
}

function decodeError(response, raw) {
  const requestId = response.headers.get('x-request-id') ?? '';
  let body;
  try {
    body = raw ? JSON.parse(raw) : undefined;
  } catch {
    body = undefined;
  }
  let envelope = body && typeof body === 'object' ? body.error : undefined;
  if (!envelope || typeof envelope !== 'object') {
    // Not the API's envelope (a proxy's page): no code, and the status's
    // reason phrase as the message, as the Go and Python SDKs read it (an
    // invented 'http_502' read as an API code, differently in each SDK).
    envelope = { code: '', message: STATUS_CODES[response.status] ?? '' };
  }
  // An object only, as the Go SDK decodes it: a list is no detail (it was
  // spread into {"0": ...}).
  const detail = envelope.detail && typeof envelope.detail === 'object' && !Array.isArray(envelope.detail) ? { ...envelope.detail } : {};
  if ((response.status === 429 || response.status === 503) && detail.retry_after_seconds === undefined) {
    const seconds = retryAfterHeader(response.headers.get('retry-after'), Date.parse(response.headers.get('date') ?? ''));
    if (seconds > 0) detail.retry_after_seconds = seconds;
  }
  return new RatchetError(response.status, String(envelope.code ?? ''), String(envelope.message ?? ''), detail, requestId, body);
}

/** A Retry-After header in whole seconds from now: delay-seconds, or an
 * HTTP date measured against the server's own clock (the answer's Date, as
 * the Go SDK measures it) when it sent one; 0 when absent, unreadable or past. */
function retryAfterHeader(value, date) {
  const v = (value ?? '').trim();
  if (/^\d+$/.test(v)) return Number(v);
  const at = Date.parse(v);
  const now = Number.isFinite(date) ? date : Date.now();
  return Number.isFinite(at) ? Math.max(0, Math.ceil((at - now) / 1000)) : 0;
}

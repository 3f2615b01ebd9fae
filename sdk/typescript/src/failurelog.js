// What a worker without onError does with its problems: one safe line each
// to console.warn, paced (the Go SDK's failureLog).

import { ConnectionLostError, LeaseLostError, RatchetError, ReportNotRecordedError } from './errors.js';

// everyMs is the least time between two failure lines: a server down for
// hours costs a line a minute, not one a failed claim, heartbeat and report
// (the Go SDK's failureLogEvery); now is the clock that paces them. An
// object so that tests can set the clock; not exported by the package.
export const failureLogTimes = { everyMs: 60_000, now: () => performance.now() };

// The call an error answered ({ method, host, path }, never the query), and
// a lost answer's kind: set by the transport, read by the failure log
// instead of the error's text.
const calls = new WeakMap();

/** err, marked with the call it answered (and, for a lost answer, its kind). */
export function called(err, call) {
  calls.set(err, call);
  return err;
}

const HINT = '(set onError to see it)';

/**
 * Decides the default log's lines (worker QA: a worker retrying against a
 * dead or misconfigured server was silent for ever): the first failure at
 * once, then at most one line every failureLogTimes.everyMs, which counts the
 * failures left out since the line before; and, once a registration or claim
 * succeeds after a line told of a failed call to the server, one line saying
 * after how many such failures it recovered. A line holds none of an error's
 * text, which may hold payload details (see summary).
 */
export class FailureLog {
  #last = null; // when the last failure line was logged
  #left = 0; // failures since then that were not logged
  #failures = 0; // failed calls to the server since the last recovery
  #outage = false; // a line told of a failed call, and no recovery line followed

  /** The line to log for error, or null when it is left out. */
  failure(error) {
    let [text, call] = summary(error);
    if (call) this.#failures++;
    const now = failureLogTimes.now();
    if (this.#last !== null && now - this.#last < failureLogTimes.everyMs) {
      this.#left++;
      return null;
    }
    if (this.#left > 0) text += ` more_since_last_line=${this.#left}`;
    [this.#last, this.#left] = [now, 0];
    this.#outage ||= call;
    return 'ratchet worker: ' + text;
  }

  /** The line to log for error, a refusal that stopped the worker: logged
   * whatever the pacing, since it says why the worker claims no more, with
   * the count of those left out before it. */
  refusal(error) {
    let [text, call] = summary(error);
    if (call) this.#failures++;
    if (this.#left > 0) text += ` more_since_last_line=${this.#left}`;
    [this.#last, this.#left] = [failureLogTimes.now(), 0];
    return 'ratchet worker refused: ' + text;
  }

  /** The line to log when the worker stops: the count of the problems left
   * out since the last line (worker QA: they were dropped), or null when
   * none was. */
  stopped() {
    if (this.#left === 0) return null;
    const left = this.#left;
    this.#left = 0;
    return `ratchet worker stopped: more_since_last_line=${left}`;
  }

  /** The line to log when a registration or claim succeeded: null unless a
   * line told of a failed call since the last recovery. */
  recovered() {
    const failures = this.#failures;
    this.#failures = 0;
    if (!this.#outage) return null;
    this.#outage = false;
    return `ratchet worker: recovered after ${failures} failures`;
  }
}

/**
 * [text, call]: error without its text, and whether it is a failed call to
 * the server. An API error by its status, code and request id (never its
 * message or detail) and the call it answered; a network failure by its kind
 * (a fetch failure's cause.code, an abort or timeout) and the call it failed
 * on (method, host and path, never the query or a body); anything else (a
 * classifier's exception, an invalid decision, an output that is not JSON)
 * by its name alone, with a hint. A report not recorded is named by what
 * became of it, its job id and attempt, then its cause as above (the Go
 * SDK's shape), and a lost lease by lease=lapsed or lost, its job id,
 * attempt and tool (name@version), then the heartbeat's refusal as above;
 * neither is a failed call to the server (the recovery line counts none).
 */
export function summary(error) {
  if (error instanceof ReportNotRecordedError && error.what === 'retrying' && error.cause !== undefined) {
    // A report still retried is logged as its delivery's failure, a failed
    // call to the server, as the Go SDK logs its notice (which wraps that
    // failure).
    return summary(error.cause);
  }
  if (error instanceof ReportNotRecordedError && error.jobId) {
    const [text] = error.cause !== undefined ? summary(error.cause) : [`error=ReportNotRecordedError ${HINT}`];
    return [`report=${token(error.what)} job_id=${token(error.jobId)} attempt=${Number(error.attempt)} ${text}`, false];
  }
  if (error instanceof LeaseLostError && error.jobId) {
    // Nor is a lost lease: the server answered the heartbeat that lost it,
    // or the failures that let it lapse were counted already.
    const [what, text] = error.cause !== undefined ? ['lost', ` ${summary(error.cause)[0]}`] : ['lapsed', ''];
    return [`lease=${what} job_id=${token(error.jobId)} attempt=${Number(error.attempt)} tool=${token(error.tool, 200)}${text}`, false];
  }
  const call = error !== null && typeof error === 'object' ? calls.get(error) : undefined;
  if (error instanceof RatchetError) {
    let text = `error=api status=${error.status}`;
    if (error.code) text += ` code=${token(error.code)}`;
    if (error.requestId) text += ` request_id=${token(error.requestId)}`;
    return [text + callText(call), true];
  }
  if (error instanceof ConnectionLostError) {
    return [`error=network kind=${quote(netKind(call?.kind ?? 'ConnectionLostError'))}` + callText(call), true];
  }
  const name = errorName(error);
  if (name === 'AbortError' || name === 'TimeoutError') return [`error=network kind=${quote(netKind(name))}`, true];
  const code = safely(() => error.cause?.code);
  if (name === 'TypeError' && typeof code === 'string') return [`error=network kind=${quote(netKind(code))}`, true];
  return [`error=${token(name)} ${HINT}`, false];
}

const KINDS = {
  ECONNREFUSED: 'connection refused',
  ENOTFOUND: 'dns',
  EAI_AGAIN: 'dns',
  ECONNRESET: 'connection reset',
  ETIMEDOUT: 'timeout',
  'timed out': 'timeout',
  TimeoutError: 'timeout',
  UND_ERR_CONNECT_TIMEOUT: 'timeout',
  UND_ERR_HEADERS_TIMEOUT: 'timeout',
  UND_ERR_BODY_TIMEOUT: 'timeout',
  UND_ERR_SOCKET: 'connection closed',
  EPIPE: 'connection closed',
  ECONNABORTED: 'connection closed',
};

/** A transport failure's code or name as the kind the three SDKs log
 * ('connection refused', 'dns', 'timeout' ...), or as it is. */
export function netKind(why) {
  const kind = KINDS[why];
  if (kind) return kind;
  return /CERT|TLS|SSL/.test(why) ? 'tls' : String(why);
}

function callText(call) {
  if (!call) return '';
  return ` method=${token(call.method)} host=${token(call.host)} path=${token(call.path, 200)}`;
}

/** A code, request id, host or path as one word: cut, and printable ASCII
 * only, as a server (or a proxy posing as one) may send anything. */
function token(value, most = 64) {
  return String(value).slice(0, most).replace(/[^!-~]/g, '?');
}

function quote(kind) {
  return kind.includes(' ') ? `"${kind.slice(0, 64).replace(/[^ -~]|"/g, '?')}"` : token(kind);
}

function errorName(error) {
  const name = safely(() => error?.name ?? error?.constructor?.name);
  return typeof name === 'string' && name ? name : typeof error;
}

function safely(read) {
  try {
    return read();
  } catch {
    return undefined;
  }
}

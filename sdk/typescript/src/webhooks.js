// Verifying a webhook delivery's Ratchet-Signature, as the Go SDK's
// VerifyWebhook does (the same header limits, checks and order).

import { createHmac, timingSafeEqual } from 'node:crypto';
import { NoWebhookSecretError, WebhookSignatureError } from './errors.js';

// How far a delivery's signed time may be from the receiver's clock, in
// seconds: every attempt is signed as it is sent, so a delivery captured and
// replayed later fails.
const DEFAULT_TOLERANCE_SECONDS = 300;
// The header read is bounded, and so are the v1 entries in it (the server
// sends one, two while a rotated secret still signs).
const MAX_SIGNATURE_HEADER = 4096;
const MAX_SIGNATURES = 8;
// A timestamp further than this from now (one in milliseconds, say) is as
// far off as any, and said so.
const FAR_SECONDS = 2n ** 32n;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;
// What Go's strings.TrimSpace trims (unicode.IsSpace), which is not quite
// String.prototype.trim's set: a part is trimmed exactly as the Go SDK trims it.
const SPACE = '[\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const TRIM = new RegExp(`^${SPACE}+|${SPACE}+$`, 'g');
// The white space read off the ends of a secret: ASCII's, none of which a
// secret the server makes holds (whsec_ and hex digits).
const SECRET_EDGES = /^[\t\n\v\f\r ]+|[\t\n\v\f\r ]+$/g;
const DECIMAL = /^[+-]?[0-9]+$/;
const HEX = /^(?:[0-9a-fA-F]{2})*$/;
const MALFORMED = 'malformed Ratchet-Signature';

/**
 * Checks a delivery's `Ratchet-Signature` header (`signature`) over its raw
 * `body` with the subscription's `secret` (without the ASCII white space
 * around it: one read from a file with its line end verifies), refuses a
 * signed time more than
 * `toleranceSeconds` (300; the default too when 0 or less) from `now` (a
 * Date or milliseconds since 1970; the clock by default), and returns the
 * decoded event `{ id, type, created_at, workspace_id, subject_id, data }`.
 *
 * `body` is the bytes received (a Buffer, Uint8Array or ArrayBuffer) or,
 * as a string, the raw body text exactly as received: never JSON.stringify
 * of a parsed body, which is not the bytes that were signed. A header with
 * several `v1` (a rotation's) verifies when any of them does.
 *
 * Throws WebhookSignatureError for a delivery whose signature is missing,
 * malformed, wrong or outside the tolerance (answer it 401), and
 * NoWebhookSecretError when `secret` is empty, white space or missing (nothing is
 * accepted with no key: a misconfiguration, not a forgery). A verified body
 * that is not an event as the three SDKs read one, strictly (one JSON object
 * in UTF-8, no name twice, no number beyond float64, nesting at most 64
 * levels, the event's fields typed: decodeEvent), throws a plain Error.
 */
export function verifyWebhook(secret, signature, body, { toleranceSeconds = DEFAULT_TOLERANCE_SECONDS, now } = {}) {
  const bytes = bodyBytes(body);
  if (secret !== undefined && secret !== null && typeof secret !== 'string') {
    throw new TypeError(`ratchet: verifyWebhook takes the secret as a string, not ${typeof secret}`);
  }
  // A header given as a list (a framework's repeated header) is read as Node
  // reads a repeated header: joined, so that two of them are two t, refused.
  const header = Array.isArray(signature) && signature.every((v) => typeof v === 'string') ? signature.join(',') : signature ?? '';
  if (typeof header !== 'string') {
    throw new TypeError('ratchet: verifyWebhook takes the Ratchet-Signature header as a string '
      + '(req.headers[\'ratchet-signature\'])');
  }
  if (typeof toleranceSeconds !== 'number' || Number.isNaN(toleranceSeconds)) {
    throw new TypeError('ratchet: verifyWebhook\'s toleranceSeconds is a number of seconds');
  }
  let nowMs;
  if (now === undefined || now === null) nowMs = Date.now();
  else if (now instanceof Date) nowMs = now.getTime();
  else if (typeof now === 'number') nowMs = now;
  if (!Number.isFinite(nowMs)) {
    throw new TypeError('ratchet: verifyWebhook\'s now is a Date or milliseconds since 1970');
  }

  // A secret read from a file with its line end, or pasted with spaces
  // around it, verified no delivery at all: its ASCII white space is not
  // the secret's, as in the Go and Python SDKs.
  const key = secret ? secret.replace(SECRET_EDGES, '') : '';
  if (!key) throw new NoWebhookSecretError();
  const tolerance = toleranceSeconds > 0 ? toleranceSeconds : DEFAULT_TOLERANCE_SECONDS;
  // Bounded as the Go SDK bounds it: by its UTF-8 length.
  if (header.length > MAX_SIGNATURE_HEADER || Buffer.byteLength(header, 'utf8') > MAX_SIGNATURE_HEADER) {
    throw new WebhookSignatureError(MALFORMED);
  }
  let ts = '';
  const signed = [];
  for (const part of header.split(',')) {
    const trimmed = part.replace(TRIM, '');
    const eq = trimmed.indexOf('=');
    if (eq === -1) throw new WebhookSignatureError(MALFORMED);
    const key = trimmed.slice(0, eq);
    const value = trimmed.slice(eq + 1);
    if (key === 't') {
      if (ts !== '') throw new WebhookSignatureError(MALFORMED); // two times: which one was signed is ambiguous
      ts = value;
    } else if (key === 'v1') {
      if (!HEX.test(value) || signed.length === MAX_SIGNATURES) throw new WebhookSignatureError(MALFORMED);
      signed.push(Buffer.from(value, 'hex'));
    }
  }
  if (!DECIMAL.test(ts) || signed.length === 0) throw new WebhookSignatureError(MALFORMED);
  const unix = BigInt(ts);
  if (unix < INT64_MIN || unix > INT64_MAX) throw new WebhookSignatureError(MALFORMED);
  const nowUnix = BigInt(Math.floor(nowMs / 1000));
  if (unix > nowUnix + FAR_SECONDS || unix < nowUnix - FAR_SECONDS) {
    throw new WebhookSignatureError('its timestamp is not a time near now (seconds since 1970)');
  }
  const age = nowMs / 1000 - Number(unix);
  if (age > tolerance) {
    throw new WebhookSignatureError(`signed ${goDuration(roundSeconds(age))} ago, beyond ${goDuration(tolerance)}`);
  }
  if (age < -tolerance) {
    throw new WebhookSignatureError(`signed ${goDuration(roundSeconds(-age))} in the future, beyond ${goDuration(tolerance)}`);
  }
  const want = createHmac('sha256', Buffer.from(key, 'utf8')).update(`${ts}.`).update(bytes).digest();
  for (const mac of signed) {
    // timingSafeEqual throws on a length mismatch: a v1 of another length matches nothing.
    if (mac.length === want.length && timingSafeEqual(mac, want)) return decodeEvent(bytes);
  }
  throw new WebhookSignatureError('no v1 signature matches');
}

function bodyBytes(body) {
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  if (body instanceof ArrayBuffer) return Buffer.from(body);
  throw new TypeError('ratchet: verifyWebhook takes the body as received: a Buffer, Uint8Array, ArrayBuffer '
    + `or the raw body text, not ${body === null ? 'null' : typeof body}`);
}

// The body of a delivery is read alike by the three SDKs (the shared vectors
// in sdk/webhook_vectors.json hold them to it), and strictly: the server
// sends an event as Go's encoding/json writes it, so anything odd is no event
// of Ratchet's. A body is one JSON object in UTF-8 (no byte-order mark; JSON
// whitespace around it), nesting at most MAX_NESTING levels, with no name
// twice in any object, no number beyond float64 and no lone UTF-16 surrogate
// escape; id, type, workspace_id and subject_id are strings (or null),
// created_at an RFC 3339 time (or null) as RFC3339 reads it.

// How deep arrays and objects nest in an event (the event object is the
// first level): an event carries ids and states, and Python's json module
// recurses once a level.
const MAX_NESTING = 64;
const STRING_FIELDS = ['id', 'type', 'workspace_id', 'subject_id'];
// RFC 3339 as the server writes it: upper-case T and Z, at most nine
// fraction digits (the fields' ranges are checked apart).
const RFC3339 = /^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?(Z|[+-]([0-9]{2}):([0-9]{2}))$/;
const LONE_SURROGATE = /[\ud800-\udfff]/u; // with the u flag, a pair is one code point: only a lone one matches

// The event a verified body carries, read by the shared rules above.
function decodeEvent(bytes) {
  let event;
  try {
    // fatal: bytes that are not UTF-8 throw; ignoreBOM: a byte-order mark
    // is kept, and refused by JSON.parse.
    const text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
    scanText(text);
    event = JSON.parse(text, (name, value) => {
      if (typeof value === 'number' && !Number.isFinite(value)) throw new Error('a number beyond float64');
      if (LONE_SURROGATE.test(name) || (typeof value === 'string' && LONE_SURROGATE.test(value))) {
        throw new Error('a lone surrogate escape');
      }
      return value;
    });
  } catch (error) {
    throw new Error(`ratchet: decode webhook event: ${error.message}`, { cause: error });
  }
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    throw new Error(`ratchet: decode webhook event: a JSON ${event === null ? 'null' : Array.isArray(event) ? 'array' : typeof event}, not an object`);
  }
  for (const name of STRING_FIELDS) {
    if (event[name] !== undefined && event[name] !== null && typeof event[name] !== 'string') {
      throw new Error(`ratchet: decode webhook event: "${name}" is not a string`);
    }
  }
  const created = event.created_at;
  if (created !== undefined && created !== null && !(typeof created === 'string' && validTime(created))) {
    throw new Error('ratchet: decode webhook event: "created_at" is not an RFC 3339 time');
  }
  return event;
}

// Bounds the nesting and refuses a name twice in one object (JSON.parse keeps
// the last), on text JSON.parse then reads: its syntax is JSON.parse's to
// refuse. Each object's names are compared as decoded ("\u0069d" is "id").
function scanText(text) {
  const stack = []; // per open array or object: null, or the object's names and whether a name is next
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let end = i + 1;
      while (end < text.length && text[end] !== '"') end += text[end] === '\\' ? 2 : 1;
      const top = stack[stack.length - 1];
      if (top && top.nameNext) {
        let name;
        try {
          name = JSON.parse(text.slice(i, end + 1));
        } catch {
          return; // not JSON: JSON.parse says why
        }
        if (top.names.has(name)) throw new Error(`the name ${JSON.stringify(name)} twice in one object`);
        top.names.add(name);
        top.nameNext = false;
      }
      i = end;
    } else if (c === '{' || c === '[') {
      stack.push(c === '{' ? { names: new Set(), nameNext: true } : null);
      if (stack.length > MAX_NESTING) throw new Error(`nests deeper than ${MAX_NESTING} levels`);
    } else if (c === '}' || c === ']') {
      stack.pop();
    } else if (c === ',' && stack[stack.length - 1]) {
      stack[stack.length - 1].nameNext = true;
    }
  }
}

// Whether value is an RFC 3339 time as RFC3339 says, its fields in range and
// its date one of the calendar's.
function validTime(value) {
  const m = RFC3339.exec(value);
  if (!m) return false;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number);
  if (month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || second > 59) return false;
  if (m[8] !== 'Z' && (Number(m[9]) > 23 || Number(m[10]) > 59)) return false;
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  return day <= [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1];
}

// seconds to the nearest whole second, halves away from zero (Go's
// Duration.Round(time.Second)).
function roundSeconds(seconds) {
  return seconds >= 0 ? Math.floor(seconds + 0.5) : -Math.floor(-seconds + 0.5);
}

// seconds as Go's time.Duration prints it ("6m40s", "5m0s", "1.5s",
// "500ms"), so that the SDKs word a refusal alike.
function goDuration(seconds) {
  if (!Number.isFinite(seconds)) return 'forever';
  const ns = BigInt(Math.round(seconds * 1e9));
  if (ns === 0n) return '0s';
  const sign = ns < 0n ? '-' : '';
  const u = ns < 0n ? -ns : ns;
  const fixed = (value, digits) => {
    const scale = 10n ** BigInt(digits);
    const frac = (value % scale).toString().padStart(digits, '0').replace(/0+$/, '');
    return `${value / scale}${frac ? `.${frac}` : ''}`;
  };
  if (u < 1_000_000_000n) {
    if (u < 1_000n) return `${sign}${u}ns`;
    if (u < 1_000_000n) return `${sign}${fixed(u, 3)}µs`;
    return `${sign}${fixed(u, 6)}ms`;
  }
  const minute = 60n * 1_000_000_000n;
  let out = `${fixed(u % minute, 9)}s`;
  const minutes = u / minute;
  if (minutes > 0n) {
    out = `${minutes % 60n}m${out}`;
    if (minutes >= 60n) out = `${minutes / 60n}h${out}`;
  }
  return sign + out;
}

// Answers that carry a secret, printed with it masked.

// The fields of an answer that hold a credential: a begin's or a claimed
// job's lease token, a minted key's or a webhook's signing secret.
const SECRET_FIELDS = ['secret', 'lease_token', 'leaseToken'];

// util.inspect.custom, by its registered name (no node:util import: the
// SDK runs wherever fetch does).
const INSPECT = Symbol.for('nodejs.util.inspect.custom');

function inspectMasked() {
  const masked = { ...this };
  for (const name of SECRET_FIELDS) {
    if (typeof masked[name] === 'string' && masked[name] !== '') masked[name] = '[redacted]';
  }
  return masked;
}

/** answer (an object the API answered) made to print its secret as
 * '[redacted]' under util.inspect (console.log, a logger that inspects);
 * its fields, JSON.stringify and deep equality are unchanged: the method
 * is a non-enumerable symbol property. Anything else as it is. */
export function hideSecrets(answer) {
  if (answer !== null && typeof answer === 'object' && !Array.isArray(answer)) {
    Object.defineProperty(answer, INSPECT, { value: inspectMasked, enumerable: false, configurable: true, writable: true });
  }
  return answer;
}

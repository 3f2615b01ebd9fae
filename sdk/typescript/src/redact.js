// The form of an error message that may leave the worker's process.

/** Bounds the error message a worker sends to the API, in UTF-8 bytes. */
export const MAX_ERROR_MESSAGE_BYTES = 500;

// What commonly leaks into error text: credentials, e-mail addresses, URL
// query strings, long tokens and long digit runs (card or phone numbers).
// Specific patterns run before generic ones; the same list as the Go SDK's.
const REDACTIONS = [
  [/\b((?:proxy-)?authorization)(\\?["']?\s*[=:]\s*)[^\r\n,;]+/gi, '$1$2[redacted]'],
  [/\b(bearer|basic|token|apikey|digest)\s+[^\s,;]+/gi, '$1 [redacted]'],
  [/\b([\w.-]*(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|private[_-]?key|access[_-]?key|credential|cookie)[\w.-]*)(\\?["']?\s*[=:]\s*)(\\"(?:[^"\\]|\\[^"])*\\"|"[^"]*"|'[^']*'|[^\s,;&]+)/gi, '$1$2[redacted]'],
  [/:\/\/[^/\s:@]+:[^/\s@]+@/g, '://[redacted]@'],
  [/\?[^\s"']+/g, '?[redacted]'],
  [/[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+/g, '[email]'],
  [/(^|[^A-Za-z0-9])(?:(?:sk|rk|pk)_(?:live|test)_|whsec_|gh[pousr]_|xox[abposr]-)[A-Za-z0-9_-]+/g, '$1[redacted]'],
  [/\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bAIza[0-9A-Za-z_-]{20,}/g, '[redacted]'],
  [/\beyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]*)?/g, '[redacted]'],
  [/[A-Za-z0-9_\-+/=]{32,}/g, '[redacted]'],
  [/\(?\d[\d \-().]{7,}\d/g, '[number]'],
];

/**
 * Control characters flattened, likely secrets and personal data masked,
 * at most MAX_ERROR_MESSAGE_BYTES of UTF-8. Workers apply it to every error
 * message they report; use it for your own logs too.
 */
export function redactMessage(message) {
  let out = String(message).toWellFormed?.() ?? String(message);
  out = out.replace(/\p{Cc}/gu, ' ');
  for (const [pattern, replacement] of REDACTIONS) out = out.replace(pattern, replacement);
  out = out.split(/\s+/).filter(Boolean).join(' ');
  const bytes = new TextEncoder().encode(out);
  if (bytes.length > MAX_ERROR_MESSAGE_BYTES) {
    const ellipsis = '…';
    let cut = MAX_ERROR_MESSAGE_BYTES - new TextEncoder().encode(ellipsis).length;
    while (cut > 0 && (bytes[cut] & 0xc0) === 0x80) cut--; // never split a character
    out = new TextDecoder().decode(bytes.subarray(0, cut)) + ellipsis;
  }
  return out || 'error';
}

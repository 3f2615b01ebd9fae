// The form of an error message that may leave the worker's process.

/** Bounds the error message a worker sends to the API, in UTF-8 bytes. */
export const MAX_ERROR_MESSAGE_BYTES = 500;
// How much of a message is looked at: JavaScript's regular expressions
// backtrack (the Go SDK's RE2 does not), and the secret-name pattern is
// quadratic in a long run of name characters. A thousand characters take
// milliseconds and still fill the 500 bytes that are sent.
const MAX_SCANNED_CHARS = 1000;

// What commonly leaks into error text: credentials, e-mail addresses, URL
// query strings, long tokens and long digit runs (card or phone numbers).
// Specific patterns run before generic ones; the same list as the Go SDK's.
// White space in them is ASCII's ([\t\n\v\f\r ]), as RE2's \s is: a
// JavaScript \s also takes a no-break space, which ended a secret's value
// early and left the rest of it in the message.
// unicode.IsSpace's characters, runs of which Go's strings.Fields splits on.
const GO_SPACE = /[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/;
const REDACTIONS = [
  [/\b((?:proxy-)?authorization)(\\?["']?[\t\n\v\f\r ]*[=:][\t\n\v\f\r ]*)[^\r\n,;]+/gi, '$1$2[redacted]'],
  [/\b(bearer|basic|token|apikey|digest)[\t\n\v\f\r ]+[^\t\n\v\f\r ,;]+/gi, '$1 [redacted]'],
  [/\b([\w.-]*(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|private[_-]?key|access[_-]?key|credential|cookie)[\w.-]*)(\\?["']?[\t\n\v\f\r ]*[=:][\t\n\v\f\r ]*)(\\"(?:[^"\\]|\\[^"])*\\"|"[^"]*"|'[^']*'|[^\t\n\v\f\r ,;&]+)/gi, '$1$2[redacted]'],
  [/:\/\/[^/\t\n\v\f\r :@]+:[^/\t\n\v\f\r @]+@/g, '://[redacted]@'],
  [/\?[^\t\n\v\f\r "']+/g, '?[redacted]'],
  // An e-mail address in any script, also URL-encoded (%40) in a path.
  [/[\p{L}\p{M}\p{N}._%+-]+(?:@|%40)[\p{L}\p{M}\p{N}-]+(?:\.[\p{L}\p{M}\p{N}-]+)+/gu, '[email]'],
  [/(^|[^A-Za-z0-9])(?:(?:sk|rk|pk)_(?:live|test)_|whsec_|gh[pousr]_|xox[abposr]-|ya29\.)[A-Za-z0-9_-]+/g, '$1[redacted]'],
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
  let out = String(message);
  const cut = out.length > MAX_SCANNED_CHARS;
  if (cut) {
    out = out.slice(0, MAX_SCANNED_CHARS);
    // Drop the word the cut went through, so no fragment of a secret too
    // short for the patterns to recognise is left at the end.
    // Any white space: a newline or a tab separates a secret as well as a space.
    const space = out.search(/\s\S*$/);
    if (space > 0) out = out.slice(0, space);
  }
  // Control characters, lone surrogates (half a character, as an invalid
  // UTF-8 byte is to the Go SDK) and U+FFFD (which Go reads an invalid byte
  // as) become spaces.
  out = out.replace(/[\p{Cc}\p{Cs}\uFFFD]/gu, ' ');
  for (const [pattern, replacement] of REDACTIONS) out = out.replace(pattern, replacement);
  // White space as Go's strings.Fields reads it (unicode.IsSpace): a
  // JavaScript \s also takes U+FEFF, which Go and Python keep.
  out = out.split(GO_SPACE).filter(Boolean).join(' ');
  const bytes = new TextEncoder().encode(out);
  if (cut || bytes.length > MAX_ERROR_MESSAGE_BYTES) {
    const ellipsis = '…';
    let keep = MAX_ERROR_MESSAGE_BYTES - new TextEncoder().encode(ellipsis).length;
    while (keep > 0 && (bytes[keep] & 0xc0) === 0x80) keep--; // never split a character
    out = new TextDecoder().decode(bytes.subarray(0, keep)) + ellipsis;
  }
  return out || 'error';
}

package ratchet

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxErrorMessageBytes bounds the error message a worker sends to the API.
const MaxErrorMessageBytes = 500

// redactions mask what commonly leaks into error text: credentials, e-mail
// addresses, URL query strings, long tokens and long digit runs (card or
// phone numbers). Order matters: specific patterns before generic ones.
var redactions = []struct {
	re   *regexp.Regexp
	with string
}{
	// An Authorization header's whole value, whatever its scheme (Bearer,
	// Basic, Token, ApiKey, Digest...).
	{regexp.MustCompile(`(?i)\b((?:proxy-)?authorization)(\\?["']?\s*[=:]\s*)[^\r\n,;]+`), "$1$2[redacted]"},
	{regexp.MustCompile(`(?i)\b(bearer|basic|token|apikey|digest)\s+[^\s,;]+`), "$1 [redacted]"},
	// A name that contains a secret's word, prefixed or suffixed
	// (client_secret, access_token, AWS_SECRET_ACCESS_KEY, private_key),
	// also as JSON quoted inside a message ({\"password\":\"hunter2\"}).
	{regexp.MustCompile(`(?i)\b([\w.-]*(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|private[_-]?key|access[_-]?key|credential|cookie)[\w.-]*)(\\?["']?\s*[=:]\s*)(\\"(?:[^"\\]|\\[^"])*\\"|"[^"]*"|'[^']*'|[^\s,;&]+)`), "$1$2[redacted]"},
	{regexp.MustCompile(`://[^/\s:@]+:[^/\s@]+@`), "://[redacted]@"},
	{regexp.MustCompile(`\?[^\s"']+`), "?[redacted]"},
	// An e-mail address in any script, also URL-encoded (%40) in a path.
	{regexp.MustCompile(`[\p{L}\p{M}\p{N}._%+\-]+(?:@|%40)[\p{L}\p{M}\p{N}\-]+(?:\.[\p{L}\p{M}\p{N}\-]+)+`), "[email]"},
	// Credentials known by their form, however short: Stripe-style keys
	// (sk_live_…, rk_test_…, whsec_…), GitHub, Slack, Google OAuth access
	// tokens (ya29.…), AWS access key ids,
	// Google API keys, and JWTs (base64url segments joined by dots, the
	// first starting with a JSON object's "eyJ").
	// (Anchored on anything but a letter or digit, not \b: a key glued to
	// a word by "_", as in stripe_sk_live_…, must not escape.)
	{regexp.MustCompile(`(^|[^A-Za-z0-9])(?:(?:sk|rk|pk)_(?:live|test)_|whsec_|gh[pousr]_|xox[abposr]-|ya29\.)[A-Za-z0-9_\-]+`), "$1[redacted]"},
	{regexp.MustCompile(`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bAIza[0-9A-Za-z_\-]{20,}`), "[redacted]"},
	{regexp.MustCompile(`\beyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]*)?`), "[redacted]"},
	{regexp.MustCompile(`[A-Za-z0-9_\-+/=]{32,}`), "[redacted]"},
	{regexp.MustCompile(`\(?\d[\d \-().]{7,}\d`), "[number]"},
}

// RedactText is RedactMessage without its bound: control characters
// flattened, runs of spaces made one, likely secrets and personal data
// masked. The server applies it to every error message a worker reports,
// so one that reports over plain HTTP, without this SDK, stores no token
// it let slip either.
func RedactText(msg string) string {
	msg = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(msg, " "))
	for _, r := range redactions {
		msg = r.re.ReplaceAllString(msg, r.with)
	}
	return strings.Join(strings.Fields(msg), " ")
}

// RedactMessage returns the form of msg that may leave the process: control
// characters flattened, likely secrets and personal data masked, and at most
// MaxErrorMessageBytes long. Workers apply it to every error message they
// report; use it for your own logs too.
func RedactMessage(msg string) string {
	msg = RedactText(msg)
	if len(msg) > MaxErrorMessageBytes {
		cut := MaxErrorMessageBytes - len("…")
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	if msg == "" {
		msg = "error"
	}
	return msg
}

// Package idemkey is the one rule for a client's idempotency key, on the
// effect gate and on durable jobs alike: 1-255 printable characters. A key
// names an operation in logs, dashboards and reconciliations, so control
// characters (a stray newline from a template, say) are refused rather than
// stored.
package idemkey

import (
	"unicode"
	"unicode/utf8"
)

// MaxRunes is the longest key, in characters.
const MaxRunes = 255

// Rule is the validation message for a key field (a constant, for Problems'
// format; TestRuleNamesTheLimit keeps it in step with MaxRunes).
const Rule = "must be 1-255 printable characters"

// Valid reports whether k is a well-formed idempotency key.
func Valid(k string) bool { return Printable(k, MaxRunes) }

// Problem is the validation message for a key that is not Valid: one left
// out (or empty) is required, any other is told Rule (MCP QA: a begin
// without its key was told the rule, an id left out that it is required).
func Problem(k string) string {
	if k == "" {
		return "is required"
	}
	return Rule
}

// Printable reports whether s is 1-maxRunes printable characters of valid
// UTF-8: no control or format character, no space but the plain one. It is
// the key's rule, for other names that follow it with a length of their
// own (an endpoint's).
func Printable(s string, maxRunes int) bool {
	n := utf8.RuneCountInString(s)
	if n < 1 || n > maxRunes || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

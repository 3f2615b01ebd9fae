// Package idemkey is the one rule for a client's idempotency key, on the
// effect gate and on durable jobs alike: 1-255 printable characters. A key
// names an operation in logs, dashboards and reconciliations, so control
// characters (a stray newline from a template, say) are refused rather than
// stored.
package idemkey

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxRunes is the longest key, in characters.
const MaxRunes = 255

// Rule is the validation message for a key field (a constant, for Problems'
// format; TestRuleNamesTheLimit keeps it in step with MaxRunes).
const Rule = "must be 1-255 printable characters"

// Pattern is the rule as a JSON Schema pattern, for the documents a client
// reads (the openapi tag rule printable): no control, format or private-use
// character and no white space but the plain space. It names the
// characters of the Basic Multilingual Plane Printable refuses, as
// themselves but for the ASCII and C1 controls (\xHH), so that every
// validator's dialect reads it alike; a character that is unassigned, or a
// format or private-use one beyond that plane, passes it and is still
// refused.
var Pattern = ClassPattern(func(r rune) bool {
	return r != ' ' && unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Zs, unicode.Zl, unicode.Zp)
})

// ClassPattern is the JSON Schema pattern of the strings holding no
// character refused refuses, written as Pattern is: the ASCII and C1
// controls (always refused) and any other ASCII character refused as
// \xHH, the Basic Multilingual Plane's others as themselves. A refused
// character beyond that plane passes it. A tool's name and version state
// their rule with it (lib/toolname).
func ClassPattern(refused func(rune) bool) string {
	var b strings.Builder
	b.WriteString(`^[^\x00-\x1f\x7f-\x9f`)
	for r := rune(0x20); r < 0x7f; r++ {
		if refused(r) {
			fmt.Fprintf(&b, `\x%02x`, r)
		}
	}
	for lo := rune(0xa0); lo <= 0xffff; lo++ {
		if !refused(lo) {
			continue
		}
		hi := lo
		for hi < 0xffff && refused(hi+1) {
			hi++
		}
		b.WriteRune(lo)
		if hi > lo {
			b.WriteByte('-')
			b.WriteRune(hi)
		}
		lo = hi
	}
	b.WriteString(`]*$`)
	return b.String()
}

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

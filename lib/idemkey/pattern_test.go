package idemkey_test

import (
	"regexp"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/idemkey"
)

// Pattern states the rule to a client (the OpenAPI document, the MCP tools'
// schemas): agent QA, a key holding a newline, a no-break space or a
// zero-width space was valid by the published schema (1-255 characters)
// and refused 400 by the handler. Every assigned character of the Basic
// Multilingual Plane is allowed by Pattern exactly when Valid takes it; the
// pattern is written with no escape but \xHH, which every regular
// expression dialect of a schema validator reads alike (Go's RE2 has no
// \uHHHH, and ECMA-262 without the u flag no \p{…} nor astral ranges).
func TestPatternIsTheRule(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(idemkey.Pattern)
	for r := rune(0); r <= 0xffff; r++ {
		if unicode.Is(unicode.Cs, r) || !assigned(r) {
			continue
		}
		s := string(r)
		require.Equal(t, idemkey.Valid(s), re.MatchString(s), "U+%04X", r)
		require.Equal(t, idemkey.Valid("key"+s+"key"), re.MatchString("key"+s+"key"), "U+%04X", r)
	}
	require.True(t, re.MatchString("refund:order_551:full"))
	require.True(t, re.MatchString("welcome email: user 123 ключ 😀"))
	for _, bad := range []string{"a\nb", "a\tb", "\u00a0x", "a\u200bb", "x\u2028", "\ufeffk", "\u0085"} {
		require.False(t, re.MatchString(bad), "%q", bad)
		require.False(t, idemkey.Valid(bad), "%q", bad)
	}
	require.Regexp(t, `^[\x20-\x7e]*$`, idemkey.Pattern[:len(`^[^\x00-\x1f\x7f-\x9f`)])
}

func assigned(r rune) bool {
	return unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z,
		unicode.Cc, unicode.Cf, unicode.Co)
}

package toolname

import (
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

func TestValid(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"send_welcome_email": true, "émail.send-v2": true, "a/b": true, strings.Repeat("é", MaxName): true,
		"": false, "a b": false, "a@b": false, "a\x01b": false, "a\rb": false, "a\u200bb": false,
		"a\u00a0b": false, "a\u2028b": false, "\xff": false, strings.Repeat("x", MaxName+1): false,
		".": false, "..": false, "/": false, "//": true, "...": true, "x/..": true, "../x": true, ".x": true,
	} {
		if got := ValidName(s); got != want {
			t.Errorf("ValidName(%q) = %v", s, got)
		}
	}
	if ValidVersion(strings.Repeat("1", MaxVersion+1)) || !ValidVersion(strings.Repeat("1", MaxVersion)) {
		t.Error("version length")
	}
	for s, want := range map[string]bool{"send@1": true, "send@": false, "@1": false, "send": false,
		"send@1@2": false, "se\x01nd@1": false, "send@1\r": false, "..@1": false, ".@1": false, "/@1": false, "send@..": true} {
		if got := ValidRef(s); got != want {
			t.Errorf("ValidRef(%q) = %v", s, got)
		}
	}
}

// Pattern states the rule's characters to a client (the OpenAPI document,
// the MCP tools' schemas): contract QA, "send email" and "send@email" were
// names by the published schema (1-200 characters) and refused 400 by the
// handler. Every assigned character of the Basic Multilingual Plane is
// allowed by Pattern exactly when a version may hold it.
func TestPatternIsTheRule(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(Pattern)
	for r := rune(0); r <= 0xffff; r++ {
		if unicode.Is(unicode.Cs, r) || !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S,
			unicode.Z, unicode.Cc, unicode.Cf, unicode.Co) {
			continue
		}
		s := "v" + string(r) + "1"
		if got := re.MatchString(s); got != ValidVersion(s) || got != ValidName(s) {
			t.Fatalf("U+%04X: the pattern takes it %v, ValidVersion %v, ValidName %v", r, got, ValidVersion(s), ValidName(s))
		}
	}
	for _, s := range []string{"send_welcome_email", "émail.send-v2", "a/b", "\ue000"} {
		require.Regexp(t, re, s)
	}
	for _, s := range []string{"send email", "send@email", "a\tb", "a\u00a0b", "a\u200bb", "a\u2028b", "\u0085"} {
		require.NotRegexp(t, re, s)
	}
}

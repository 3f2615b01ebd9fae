package toolname

import (
	"strings"
	"testing"
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

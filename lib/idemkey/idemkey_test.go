package idemkey

import (
	"strconv"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	t.Parallel()
	for k, want := range map[string]bool{
		"refund:order_551:full":   true,
		"order 551":               true,
		strings.Repeat("é", 255):  true,
		strings.Repeat("é", 256):  false,
		"":                        false,
		"a\nb":                    false,
		"\u0001":                  false,
		"tab\there":               false,
		string([]byte{0xff, 'a'}): false,
		"emoji:\U0001F600":        true,
		"zero\u200bwidth":         false,
	} {
		if got := Valid(k); got != want {
			t.Errorf("Valid(%q) = %v, want %v", k, got, want)
		}
	}
}

func TestRuleNamesTheLimit(t *testing.T) {
	if !strings.Contains(Rule, "1-"+strconv.Itoa(MaxRunes)+" ") {
		t.Fatalf("Rule %q does not say %d", Rule, MaxRunes)
	}
}

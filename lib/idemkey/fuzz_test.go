package idemkey

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzValid: a valid key is 1-255 characters of valid UTF-8 with no
// control, format or separator character other than the space, and it
// survives a JSON round trip unchanged.
func FuzzValid(f *testing.F) {
	for _, s := range []string{"", "k", "welcome-email:user_123", "a\nb", "a\x00b", "\xff", "é", "\u2028",
		"\u200b", "\ufeff", "\ufffd", strings.Repeat("x", 255), strings.Repeat("x", 256), strings.Repeat("é", 255)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		if !Valid(k) {
			return
		}
		n := utf8.RuneCountInString(k)
		if n < 1 || n > MaxRunes || !utf8.ValidString(k) || len(k) > 4*MaxRunes {
			t.Fatalf("valid %q: %d runes, %d bytes", k, n, len(k))
		}
		for _, r := range k {
			if unicode.IsControl(r) || (r != ' ' && (unicode.Is(unicode.Cf, r) || unicode.IsSpace(r))) || r == 0 {
				t.Fatalf("valid %q holds %U", k, r)
			}
		}
		b, _ := json.Marshal(k)
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != k {
			t.Fatalf("%q does not round-trip: %s", k, b)
		}
	})
}

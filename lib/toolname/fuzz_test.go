package toolname

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzNames: a valid name or version is 1-200 (1-100) characters of valid
// UTF-8 with no white space, '@', control or format character, the name
// not . or ..; each is Stored; name@version is a valid ref exactly when
// both are valid, and splits back into them; and a valid name, sent
// path-escaped as the SDKs send it, reaches a /api/v1/tools/{name} route
// as itself.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"send_welcome_email", "émail.send-v2", "a/b", "a%2Fb", "%", "?", "#", ".", "..",
		"...", "x/..", "../x", ".x", "a b", "a@b", "a\x01b", "a\u200bb", "a\u00a0b", "\xff", "\ufeff", "\ue000",
		"😀", "a\\b", "a;b", strings.Repeat("é", MaxName)} {
		f.Add(s, "1")
		f.Add("send", s)
	}
	mux := http.NewServeMux()
	var got string
	mux.HandleFunc("POST /api/v1/tools/{name}/contracts", func(_ http.ResponseWriter, r *http.Request) {
		got = r.PathValue("name")
	})
	f.Fuzz(func(t *testing.T, name, version string) {
		for _, c := range []struct {
			s     string
			valid bool
			max   int
		}{{name, ValidName(name), MaxName}, {version, ValidVersion(version), MaxVersion}} {
			if !c.valid {
				continue
			}
			if n := utf8.RuneCountInString(c.s); n < 1 || n > c.max || !utf8.ValidString(c.s) || !Stored(c.s) {
				t.Fatalf("valid %q: %d runes, stored %v", c.s, n, Stored(c.s))
			}
			for _, r := range c.s {
				if r == '@' || unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
					t.Fatalf("valid %q holds %U", c.s, r)
				}
			}
		}
		ref := name + "@" + version
		if ValidRef(ref) != (ValidName(name) && ValidVersion(version)) {
			t.Fatalf("ValidRef(%q) = %v, name %v, version %v", ref, ValidRef(ref), ValidName(name), ValidVersion(version))
		}
		if Stored(name) && Stored(version) {
			if n, v, ok := strings.Cut(ref, "@"); !ok || n != name || v != version {
				t.Fatalf("%q splits as %q, %q", ref, n, v)
			}
		}
		if !ValidName(name) {
			return
		}
		got = "\x00unset"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("POST", "/api/v1/tools/"+url.PathEscape(name)+"/contracts", nil))
		if rec.Code != http.StatusOK || got != name {
			t.Fatalf("%q: %d, the route read %q", name, rec.Code, got)
		}
	})
}

// Package toolname is the one rule for a tool's name and version: the
// name@version pairs workers register, keys are restricted to, and steps,
// contracts and queue health name. A name or version is printable: no white
// space, no '@' (which joins the two), no control or format character (a
// "\x01" in a name made a tool no one could type, and a key's tools list
// took what registration refused). A name is one segment of the
// /api/v1/tools/{name} routes (a '/' in it is sent as %2F), so it is not
// "." or "..": clients send those as they are, and a dot segment names no
// route (security QA: such a tool could be enqueued, registered and put in
// a key, but its contracts could be neither published nor read). Nor is it
// "/" alone: Go's router reads a segment that decodes to "/" (%2F) as the
// mark of a trailing slash, and matches no {name} with it (fuzz QA: the
// same unreachable contracts); "a/", "/a" and "//" reach their routes.
package toolname

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/getratchet/ratchet/lib/idemkey"
)

// MaxPairs is the most name@version pairs one worker registers, and so the
// most a key's tools list names: it bounds the key object every list,
// authentication and mint carries (edge QA: a key listing 60 000 pairs was
// answered 650 KB on each read, and minting another like it took 3 s of
// comparisons).
const MaxPairs = 100

// The longest name and version, in characters, and the rules that say so.
const (
	MaxName     = 200
	MaxVersion  = 100
	NameRule    = "must be 1-200 printable characters without spaces or '@', and not ., .. or /"
	VersionRule = "must be 1-100 printable characters without spaces or '@'"
	RefRule     = "must be name@version: a name of 1-200 and a version of 1-100 printable characters without spaces or '@' (the name not ., .. or /)"
)

// ValidName reports whether s can name a tool.
func ValidName(s string) bool { return s != "." && s != ".." && s != "/" && valid(s, MaxName) }

// Stored reports whether s may be a name or version some release took,
// which jobs queued then still carry: earlier releases took white space,
// control and format characters, ".", ".." and "/", but never '@' (which
// joins the two) or nothing. It reads names back (a queue health cursor),
// never admits one.
func Stored(s string) bool {
	return s != "" && !strings.Contains(s, "@") && utf8.ValidString(s) && utf8.RuneCountInString(s) <= MaxName
}

// ValidVersion reports whether s can be a tool's handler version.
func ValidVersion(s string) bool { return valid(s, MaxVersion) }

// ValidRef reports whether s is name@version with a valid name and version.
func ValidRef(s string) bool {
	name, version, ok := strings.Cut(s, "@")
	return ok && ValidName(name) && ValidVersion(version)
}

func valid(s string, maxLen int) bool {
	if s == "" || !utf8.ValidString(s) || utf8.RuneCountInString(s) > maxLen {
		return false
	}
	for _, r := range s {
		if refused(r) {
			return false
		}
	}
	return true
}

// refused is a character no name or version may hold.
func refused(r rune) bool {
	return r == '@' || unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}

// Pattern states the characters of a name or a version to a client (the
// openapi tag rule toolname), as lib/idemkey.Pattern does a key's: none
// refused; the length and a name's ., .. and / are stated or told apart.
var Pattern = idemkey.ClassPattern(refused)

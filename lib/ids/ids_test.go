package ids

import (
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNewIsPrefixedValidAndTimeOrdered(t *testing.T) {
	t.Parallel()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var got []string
	for i := 0; i < 100; i++ {
		id := NewAt(Effect, base.Add(time.Duration(i)*time.Millisecond))
		require.True(t, Valid(Effect, id), id)
		require.False(t, Valid(Run, id))
		got = append(got, id)
	}
	require.True(t, sort.StringsAreSorted(got), "ids sort by creation time")
	require.NotEqual(t, NewAt(Effect, base), NewAt(Effect, base), "random tail differs")
}

func TestValidRejectsMalformed(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "eff_", "eff_abc", "eff-0000000000000000000000000a", "eff_000000000000000000000000ui", "EFF_00000000000000000000000000"} {
		require.False(t, Valid(Effect, s), s)
	}
}

func TestRandomIsHex(t *testing.T) {
	t.Parallel()
	r := Random(16)
	require.Len(t, r, 32)
	require.Regexp(t, `^[0-9a-f]+$`, r)
}

// None is an id of its kind (so lookups take it) that New never makes: it
// sorts before every id made since the epoch.
func TestNoneIsValidAndBeforeEveryMadeID(t *testing.T) {
	t.Parallel()
	none := None(Group)
	require.True(t, Valid(Group, none))
	require.Less(t, none, NewAt(Group, time.UnixMilli(1)))
	require.False(t, Valid(Run, none))
}

// Floor sorts after every id made in an earlier millisecond and at or
// before every one made in its own or a later one.
func TestFloorBoundsIDsByMillisecond(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 1, 0, 0, 0, 500_000, time.UTC)
	floor := Floor(Effect, at)
	require.True(t, Valid(Effect, floor))
	require.Equal(t, floor, Floor(Effect, at.Add(400*time.Microsecond)), "one millisecond, one floor")
	for range 100 {
		require.Less(t, NewAt(Effect, at.Add(-time.Millisecond)), floor)
		require.LessOrEqual(t, floor, NewAt(Effect, at))
		require.LessOrEqual(t, floor, NewAt(Effect, at.Truncate(time.Millisecond)))
		require.Less(t, NewAt(Effect, at), Floor(Effect, at.Add(time.Millisecond)))
	}
}

// Lookup keeps an id of its kind and turns anything else into None.
func TestLookup(t *testing.T) {
	t.Parallel()
	id := New(Run)
	require.Equal(t, id, Lookup(Run, id))
	for _, s := range []string{"run_missing", New(Group), "", "x"} {
		require.Equal(t, None(Run), Lookup(Run, s), s)
	}
}

// legacyValid is Valid as it was: each character searched for in alphabet.
func legacyValid(prefix, s string) bool {
	if len(s) != len(prefix)+27 || !strings.HasPrefix(s, prefix) || s[len(prefix)] != '_' {
		return false
	}
	for _, c := range s[len(prefix)+1:] {
		if !strings.ContainsRune(alphabet, c) {
			return false
		}
	}
	return true
}

// Valid answers as it did for an id with any one byte replaced by any
// other (multi-byte characters and invalid UTF-8 included), or any two
// bytes by a two-byte character.
func TestValidAnswersAsBefore(t *testing.T) {
	t.Parallel()
	id := NewAt(Run, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	require.True(t, Valid(Run, id))
	for i := range len(id) {
		for c := range 256 {
			s := id[:i] + string([]byte{byte(c)}) + id[i+1:]
			require.Equal(t, legacyValid(Run, s), Valid(Run, s), "%q", s)
		}
		if i+2 <= len(id) {
			for _, r := range []string{"é", "\u00ff", "\xc3\xa9", "\xff\xfe"} {
				s := id[:i] + r + id[i+2:]
				require.Equal(t, legacyValid(Run, s), Valid(Run, s), "%q", s)
			}
		}
	}
}

// Every request with an id in its path checks it (httpapi's PathID).
func BenchmarkValid(b *testing.B) {
	id := New(Run)
	for b.Loop() {
		if !Valid(Run, id) {
			b.Fatal(id)
		}
	}
}

// Pattern, which the API document states for an id given in a query
// (GET /api/v1/keys?created_by=), and Len accept what Valid accepts: each
// byte in each place, a made id, and no other length.
func TestPatternAndLenAgreeWithValid(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(Pattern(Key))
	id := NewAt(Key, time.Now())
	require.Len(t, id, Len(Key))
	require.True(t, re.MatchString(id))
	for b := range 256 {
		for _, at := range []int{len(Key) + 1, Len(Key) - 1} {
			s := id[:at] + string([]byte{byte(b)}) + id[at+1:]
			require.Equal(t, Valid(Key, s), re.MatchString(s), "byte %#x at %d", b, at)
		}
	}
	for _, s := range []string{id + "0", id[:len(id)-1], "", "key_", "eff" + id[3:], "xkey" + id[3:]} {
		require.Equal(t, Valid(Key, s), re.MatchString(s), s)
		require.False(t, re.MatchString(s), s)
	}
}

package seal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func TestSealOpenRoundTrip(t *testing.T) {
	t.Parallel()
	s, err := New(key(1))
	require.NoError(t, err)
	ct := s.Seal([]byte(`{"card":"4242"}`), []byte("eff_1/result"))
	require.NotContains(t, string(ct), "4242")
	pt, err := s.Open(ct, []byte("eff_1/result"))
	require.NoError(t, err)
	require.Equal(t, `{"card":"4242"}`, string(pt))
}

func TestOpenRejectsOtherAssociatedData(t *testing.T) {
	t.Parallel()
	s, err := New(key(1))
	require.NoError(t, err)
	ct := s.Seal([]byte("x"), []byte("eff_1/result"))
	_, err = s.Open(ct, []byte("eff_2/result"))
	require.Error(t, err)
	id := KeyID(key(1))
	require.ErrorContains(t, err, fmt.Sprintf("failed authentication (key id %x)", id[:]), "the key it names")
	require.NotErrorIs(t, err, ErrUnknownKey)
}

func TestRotationOpensOldAndSealsNew(t *testing.T) {
	t.Parallel()
	old, err := New(key(1))
	require.NoError(t, err)
	ct := old.Seal([]byte("secret"), nil)

	rotated, err := New(key(2), key(1))
	require.NoError(t, err)
	pt, err := rotated.Open(ct, nil)
	require.NoError(t, err)
	require.Equal(t, "secret", string(pt))
	require.False(t, rotated.IsCurrent(ct))
	require.True(t, rotated.IsCurrent(rotated.Seal([]byte("n"), nil)))

	require.True(t, rotated.CanOpen(ct[:5]), "the header alone names the key")
	require.Equal(t, KeyID(key(2)), rotated.CurrentKeyID())

	withoutOld, err := New(key(2))
	require.NoError(t, err)
	_, err = withoutOld.Open(ct, nil)
	require.ErrorIs(t, err, ErrUnknownKey)
	oldID := KeyID(key(1))
	require.ErrorContains(t, err, fmt.Sprintf("key id %x", oldID[:]), "the error names the missing key")
	require.False(t, withoutOld.CanOpen(ct))
	require.False(t, rotated.CanOpen(ct[:4]))
	require.False(t, rotated.CanOpen(append([]byte{2}, ct[1:]...)), "another format version")
}

func TestNilStaysNil(t *testing.T) {
	t.Parallel()
	s, err := New(key(1))
	require.NoError(t, err)
	require.Nil(t, s.Seal(nil, nil))
	pt, err := s.Open(nil, nil)
	require.NoError(t, err)
	require.Nil(t, pt)
}

func TestNewRejectsShortKey(t *testing.T) {
	t.Parallel()
	_, err := New([]byte("short"))
	require.Error(t, err)
}

// Headers are what CanOpen accepts: a statement comparing a column's first
// five bytes with them leaves alone exactly what the Sealer cannot open.
func TestHeadersAreWhatCanOpenAccepts(t *testing.T) {
	t.Parallel()
	old, err := New(key(1))
	require.NoError(t, err)
	rotated, err := New(key(2), key(1))
	require.NoError(t, err)
	other, err := New(key(3))
	require.NoError(t, err)
	headers := rotated.Headers()
	require.Len(t, headers, 2)
	require.Negative(t, bytes.Compare(headers[0], headers[1]), "in byte order")
	for _, ct := range [][]byte{old.Seal([]byte("a"), nil), rotated.Seal([]byte("b"), nil), other.Seal([]byte("c"), nil),
		{0}, {1, 2, 3}} {
		listed := false
		for _, h := range headers {
			listed = listed || bytes.HasPrefix(ct, h)
		}
		require.Equal(t, rotated.CanOpen(ct), listed, "%x", ct)
	}

	ct := other.Seal([]byte("c"), nil)
	id := KeyID(key(3))
	require.Equal(t, fmt.Sprintf("%x", id[:]), KeyIDOf(ct))
	require.Equal(t, KeyIDOf(ct), KeyIDOf(ct[:5]), "the header alone")
	require.Empty(t, KeyIDOf([]byte{0}))
	require.Empty(t, KeyIDOf(append([]byte{2}, ct[1:]...)), "another format version")
}

// OpenTo authenticates into a caller's buffer, so a list can tell each
// row's value opens without allocating for each: a reused buffer opens
// every value, and a value damaged under a configured key (its header
// intact, so CanOpen says yes) fails as Open does.
func TestOpenToReusesItsBufferAndFailsAsOpenDoes(t *testing.T) {
	t.Parallel()
	s, err := New(key(1))
	require.NoError(t, err)
	aad := []byte("eff_1/result")
	long, short := s.Seal(bytes.Repeat([]byte("a"), 100), aad), s.Seal([]byte("bb"), aad)
	buf := make([]byte, 0, 128)
	pt, err := s.OpenTo(buf[:0], long, aad)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte("a"), 100), pt)
	require.Same(t, &buf[:1][0], &pt[0], "opened into the buffer given")
	pt, err = s.OpenTo(pt[:0], short, aad)
	require.NoError(t, err)
	require.Equal(t, "bb", string(pt))

	damaged := bytes.Clone(short)
	damaged[len(damaged)-1] ^= 1
	require.True(t, s.CanOpen(damaged), "the header names a configured key")
	_, err = s.OpenTo(buf[:0], damaged, aad)
	_, openErr := s.Open(damaged, aad)
	require.ErrorContains(t, err, "failed authentication")
	require.Equal(t, openErr.Error(), err.Error())

	pt, err = s.OpenTo(buf[:0], nil, aad)
	require.NoError(t, err)
	require.Empty(t, pt, "a nil ciphertext opens to nothing")
}

// Two different keys whose ids collide are refused (one of them would seal
// what the other is asked to open, and every instance would read those
// values as damaged); the same key twice is one key (review: the later one
// silently took the id over, the current key's included).
func TestNewRefusesTwoKeysSharingAnID(t *testing.T) {
	t.Parallel()
	// A pair of keys whose SHA-256 begins alike: about 2^16 tries (birthday).
	seen := map[[4]byte][]byte{}
	var a, b []byte
	for i := uint64(0); b == nil; i++ {
		k := make([]byte, 32)
		binary.BigEndian.PutUint64(k, i)
		id := KeyID(k)
		if other, ok := seen[id]; ok {
			a, b = other, k
		}
		seen[id] = k
	}
	require.Equal(t, KeyID(a), KeyID(b))
	for _, keys := range [][2][]byte{{a, b}, {b, a}} {
		_, err := New(keys[0], keys[1])
		require.ErrorContains(t, err, fmt.Sprintf("share the key id %x", KeyID(a)))
		_, err = New(key(1), keys[0], keys[1])
		require.ErrorContains(t, err, "share the key id")
	}
	s, err := New(a, key(2), a)
	require.NoError(t, err, "the same key twice is one key")
	require.Len(t, s.Headers(), 2)
	ct := s.Seal([]byte("v"), []byte("aad"))
	pt, err := s.Open(ct, []byte("aad"))
	require.NoError(t, err)
	require.Equal(t, "v", string(pt))
}

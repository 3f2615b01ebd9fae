package keyedhash

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func plain(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// Every sum is hmac.New's, whatever was hashed before with the same Key,
// for keys shorter and longer than SHA-256's block.
func TestSumIsHMACSHA256(t *testing.T) {
	t.Parallel()
	for _, key := range [][]byte{nil, []byte("k"), []byte("test-key-hash-secret-0123456789"), bytes.Repeat([]byte{7}, 64),
		bytes.Repeat([]byte("long"), 100)} {
		k := New(key)
		for _, parts := range [][][]byte{nil, {nil}, {[]byte("")}, {[]byte("rk_live_abc.def")},
			{[]byte("ratchet step key\n"), []byte(`["run",null]`)}, {bytes.Repeat([]byte("x"), 1000)},
			{[]byte("a"), []byte("b"), []byte("c")}} {
			for range 3 {
				require.Equal(t, plain(key, parts...), k.Sum(parts...), "key %q parts %q", key, parts)
			}
		}
		require.Equal(t, plain(key, []byte("ab")), k.Sum([]byte("a"), []byte("b")))
	}
}

// Concurrent sums under one Key do not mix (run with -race).
func TestSumConcurrently(t *testing.T) {
	t.Parallel()
	key := []byte("test-key-hash-secret-0123456789")
	k := New(key)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				v := []byte(fmt.Sprintf("value %d %d", g, i))
				if got := k.Sum(v); !bytes.Equal(got, plain(key, v)) {
					t.Errorf("%s: %x", v, got)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A request hashes a few values under the instance's secret: an enqueue
// three fingerprint-sized ones, every request its key's secret.
func BenchmarkSum(b *testing.B) {
	key := []byte("test-key-hash-secret-0123456789")
	v := bytes.Repeat([]byte("x"), 150)
	b.Run("hmac.New", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			plain(key, v)
		}
	})
	b.Run("Key", func(b *testing.B) {
		k := New(key)
		b.ReportAllocs()
		for b.Loop() {
			k.Sum(v)
		}
	})
	b.Run("SumString", func(b *testing.B) {
		k := New(key)
		s := string(v)
		b.ReportAllocs()
		for b.Loop() {
			k.SumString(s)
		}
	})
}

// The key is New's copy: a caller's slice changed afterwards changes no
// sum, though the pool makes its HMACs later (after a GC empties it).
func TestTheKeyIsCopied(t *testing.T) {
	secret := []byte("instance-secret-0123456789")
	k := New(secret)
	want := k.Sum([]byte("value"))
	copy(secret, "XXXXXXXXXXXXXXXX")
	runtime.GC() // a pool's items survive one GC (its victim cache), not two
	runtime.GC()
	require.Equal(t, want, k.Sum([]byte("value")))
}

// SumString is Sum of the string's bytes, for short values and for one
// past what a mac's buffer keeps, and after it.
func TestSumStringIsSum(t *testing.T) {
	key := []byte("test-key-hash-secret-0123456789")
	k := New(key)
	for _, v := range []string{"", "rk_abc_0123", string(bytes.Repeat([]byte("y"), 3*maxScratch)), "short after long"} {
		require.Equal(t, plain(key, []byte(v)), k.SumString(v), "%.20q", v)
		require.Equal(t, k.Sum([]byte(v)), k.SumString(v))
	}
}

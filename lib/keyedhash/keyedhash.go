// Package keyedhash is HMAC-SHA-256 under one key, the key's part of the
// work done once. hmac.New hashes the key's two pads (two SHA-256 blocks)
// and allocates two digests for every value; the service hashes a few
// values per request under the same secret (a key's secret, an enqueue's
// request hashes and generated key, a begin's dimensions), so each Key
// keeps prepared HMACs to reuse. The sums are hmac.New's, byte for byte.
package keyedhash

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
)

// Key computes HMAC-SHA-256 under one key; safe for concurrent use.
type Key struct {
	macs sync.Pool // of *mac, each Reset: ready for a new value
}

// mac is a prepared HMAC with a buffer for SumString: a string given to
// Write as []byte(s) is copied to the heap, the HMAC being an interface.
type mac struct {
	hash.Hash
	scratch []byte
}

// maxScratch bounds the buffer a mac keeps: a long value's is let go.
const maxScratch = 1 << 10

// New is a Key for key. The key is copied: the pool makes its HMACs
// later, and a caller's slice changed after New must not change them.
func New(key []byte) *Key {
	key = bytes.Clone(key)
	k := &Key{}
	k.macs.New = func() any {
		m := hmac.New(sha256.New, key)
		// The first Reset saves the pads' hashed state, which every later
		// Reset and Sum restore instead of hashing the pads again.
		m.Reset()
		return &mac{Hash: m}
	}
	return k
}

// Sum is the HMAC-SHA-256 of the concatenation of parts.
func (k *Key) Sum(parts ...[]byte) []byte {
	m := k.macs.Get().(*mac)
	for _, p := range parts {
		m.Write(p)
	}
	return k.done(m)
}

// SumString is Sum([]byte(s)) without copying s to the heap first (a
// key's secret, hashed on every request).
func (k *Key) SumString(s string) []byte {
	m := k.macs.Get().(*mac)
	m.scratch = append(m.scratch[:0], s...)
	m.Write(m.scratch)
	if cap(m.scratch) > maxScratch {
		m.scratch = nil
	}
	return k.done(m)
}

// done is m's sum, m given back Reset.
func (k *Key) done(m *mac) []byte {
	out := m.Sum(make([]byte, 0, sha256.Size))
	m.Reset()
	k.macs.Put(m)
	return out
}

package auth

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/ids"
)

// A lookup that read a key before this instance revoked it does not cache
// what it read (security review: it could, and the revoking instance then
// accepted the revoked key for KEY_CACHE_TTL); one that read after does.
func TestARevocationDuringALookupIsNotCachedOver(t *testing.T) {
	s := &Service{cacheTTL: time.Minute, cache: map[string]cachedKey{}}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	hash, p := []byte("h"), &Principal{KeyID: "key_a"}

	epoch := s.forgets // the lookup begins
	s.forget("key_a")  // the revocation commits meanwhile
	s.store("key_a", hash, p, now, epoch)
	if s.cached([]byte("key_a"), hash, now) != nil {
		t.Fatal("a key read before its revocation was cached after it")
	}

	s.store("key_a", hash, p, now, s.forgets) // a lookup that began after
	if s.cached([]byte("key_a"), hash, now) != p {
		t.Fatal("a key read after every revocation was not cached")
	}
}

// A key answered from the cache is the same principal, and a revocation
// still takes it out of the cache. What it costs is
// BenchmarkCachedKeyAuthentication's to say (one allocation, its secret's
// sum: no string of its id, no copy of its secret); counted here, the race
// detector's own allocations failed the fresh-clone CI's -race run.
func TestACachedKeyIsTheSamePrincipalUntilRevoked(t *testing.T) {
	s, secret, p := oneCachedKey()
	got, err := s.authenticate(context.Background(), secret, true, true)
	if err != nil || got != p {
		t.Fatalf("cached key: %v, %v", got, err)
	}
	s.forget(p.KeyID)
	if s.cached([]byte(p.KeyID), s.Hash(secret), s.now()) != nil {
		t.Fatal("a revoked key was still cached")
	}
}

func BenchmarkCachedKeyAuthentication(b *testing.B) {
	s, secret, _ := oneCachedKey()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.authenticate(ctx, secret, true, true)
	}
}

// oneCachedKey is a service holding one key in its cache, its secret and its
// principal.
func oneCachedKey() (*Service, string, *Principal) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := NewService(nil, "test-key-hash-secret", time.Minute, func() time.Time { return now })
	id := ids.New(ids.Key)
	secret := secretPrefix + strings.TrimPrefix(id, "key_") + "_" + ids.Random(32)
	p := &Principal{KeyID: id}
	s.store(id, s.Hash(secret), p, now, s.forgets)
	return s, secret, p
}

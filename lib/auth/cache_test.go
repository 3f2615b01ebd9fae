package auth

import (
	"testing"
	"time"
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
	if s.cached("key_a", hash, now) != nil {
		t.Fatal("a key read before its revocation was cached after it")
	}

	s.store("key_a", hash, p, now, s.forgets) // a lookup that began after
	if s.cached("key_a", hash, now) != p {
		t.Fatal("a key read after every revocation was not cached")
	}
}

// Package seal encrypts payloads, inputs, outputs and results at rest with
// AES-256-GCM. Each ciphertext names the key that sealed it, so keys can be
// rotated: the current key seals, every configured key opens.
//
// Format: 1 version byte (1) | 4-byte key id | 12-byte nonce | ciphertext+tag.
// The key id is the first 4 bytes of SHA-256 over the key. Callers pass
// associated data (for example the row id and column) so a ciphertext copied
// into another row fails to open instead of disclosing the wrong record.
package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
)

const version = 1

// ErrUnknownKey means the ciphertext was sealed with a key that is no longer
// configured (see the rotation procedure in README.md). Open wraps it with
// the key's id: test for it with errors.Is.
var ErrUnknownKey = errors.New("seal: ciphertext sealed with a key that is not configured")

// Sealer seals with the current key and opens with any configured key.
type Sealer struct {
	current [4]byte
	aeads   map[[4]byte]cipher.AEAD
}

// New builds a Sealer. current seals; older keys only open.
//
// Two different keys with the same id (the first 4 bytes of their SHA-256:
// one pair in some four billion) are refused: a ciphertext is opened by the
// key its id names, so one of them would seal what the other is asked to
// open, and every instance would read those values as damaged. The same key
// given twice (as RESULT_ENCRYPTION_KEY and in RESULT_ENCRYPTION_KEYS) is
// one key.
func New(current []byte, older ...[]byte) (*Sealer, error) {
	s := &Sealer{aeads: map[[4]byte]cipher.AEAD{}}
	sums := map[[4]byte][sha256.Size]byte{}
	add := func(k []byte) ([4]byte, error) {
		if len(k) != 32 {
			return [4]byte{}, fmt.Errorf("seal: key must be 32 bytes, got %d", len(k))
		}
		sum := sha256.Sum256(k)
		id := [4]byte(sum[:4])
		if seen, ok := sums[id]; ok && seen != sum {
			// The id is not secret (reseal reports ids); the keys are.
			return [4]byte{}, fmt.Errorf("seal: two different keys share the key id %x: replace one of them", id)
		}
		sums[id] = sum
		block, err := aes.NewCipher(k)
		if err != nil {
			return [4]byte{}, fmt.Errorf("seal: %w", err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return [4]byte{}, fmt.Errorf("seal: %w", err)
		}
		s.aeads[id] = aead
		return id, nil
	}
	id, err := add(current)
	if err != nil {
		return nil, err
	}
	s.current = id
	for _, k := range older {
		if _, err := add(k); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AAD is the associated data every sealed column uses: the row's id and the
// column's name, so a ciphertext moved to another row or column fails to
// open. The rotation command (lib/reseal) derives it the same way.
func AAD(rowID, column string) []byte { return []byte(rowID + "/" + column) }

// KeyID identifies a key without revealing it.
func KeyID(key []byte) [4]byte {
	sum := sha256.Sum256(key)
	return [4]byte(sum[:4])
}

// Seal encrypts plaintext bound to aad. A nil plaintext seals to nil, so
// optional columns stay NULL.
func (s *Sealer) Seal(plaintext, aad []byte) []byte {
	if plaintext == nil {
		return nil
	}
	aead := s.aeads[s.current]
	out := make([]byte, 5+aead.NonceSize(), 5+aead.NonceSize()+len(plaintext)+aead.Overhead())
	out[0] = version
	copy(out[1:5], s.current[:])
	if _, err := rand.Read(out[5:]); err != nil {
		panic("seal: crypto/rand failed: " + err.Error())
	}
	return aead.Seal(out, out[5:5+aead.NonceSize()], plaintext, aad)
}

// Open decrypts a value sealed by Seal with the same aad. A nil ciphertext
// opens to nil.
func (s *Sealer) Open(ciphertext, aad []byte) ([]byte, error) {
	return s.OpenTo(nil, ciphertext, aad)
}

// OpenTo is Open appending the plaintext to dst, as cipher.AEAD's Open does:
// a caller that only needs to know whether values open (a list answering
// each row's unreadable flag without the value) passes the same scratch
// buffer for each, so that authenticating a page allocates once. On error
// dst's storage, up to its capacity, may have been overwritten. A nil
// ciphertext opens to dst unchanged.
func (s *Sealer) OpenTo(dst, ciphertext, aad []byte) ([]byte, error) {
	if ciphertext == nil {
		return dst, nil
	}
	if len(ciphertext) < 5 || ciphertext[0] != version {
		return nil, errors.New("seal: malformed ciphertext")
	}
	id := [4]byte(ciphertext[1:5])
	aead, ok := s.aeads[id]
	if !ok {
		// The key id (not secret: lib/reseal reports ids) tells the
		// operator which key to configure again.
		return nil, fmt.Errorf("%w (key id %x)", ErrUnknownKey, id)
	}
	ns := aead.NonceSize()
	if len(ciphertext) < 5+ns+aead.Overhead() {
		return nil, errors.New("seal: malformed ciphertext")
	}
	pt, err := aead.Open(dst, ciphertext[5:5+ns], ciphertext[5+ns:], aad)
	if err != nil {
		return nil, fmt.Errorf("seal: ciphertext failed authentication (key id %x)", id)
	}
	return pt, nil
}

// KeyIDOf is the id, in hex, of the key ciphertext names ("1a2b3c4d", as
// Open's errors and the reseal command write it), or "" when it is not a
// ciphertext of this format. It reads the header only: the id is not secret.
func KeyIDOf(ciphertext []byte) string {
	if len(ciphertext) < 5 || ciphertext[0] != version {
		return ""
	}
	return hex.EncodeToString(ciphertext[1:5])
}

// CurrentKeyID is the id of the key that seals.
func (s *Sealer) CurrentKeyID() [4]byte { return s.current }

// CanOpen reports whether ciphertext names a configured key. It reads only
// the header, so it also answers for a ciphertext's first five bytes.
func (s *Sealer) CanOpen(ciphertext []byte) bool {
	if len(ciphertext) < 5 || ciphertext[0] != version {
		return false
	}
	_, ok := s.aeads[[4]byte(ciphertext[1:5])]
	return ok
}

// Headers are the first five bytes (version and key id) of what each
// configured key seals, in byte order: a ciphertext that begins with none of
// them is one this Sealer cannot open (CanOpen), so a statement can leave
// such rows alone by their first bytes, without reading them whole.
func (s *Sealer) Headers() [][]byte {
	out := make([][]byte, 0, len(s.aeads))
	for id := range s.aeads {
		out = append(out, append([]byte{version}, id[:]...))
	}
	slices.SortFunc(out, bytes.Compare)
	return out
}

// IsCurrent reports whether ciphertext was sealed with the current key; the
// rotation command re-seals the rest.
func (s *Sealer) IsCurrent(ciphertext []byte) bool {
	return len(ciphertext) >= 5 && [4]byte(ciphertext[1:5]) == s.current
}

package ratchet

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// webhookVectors is ../webhook_vectors.json, which the server's tests
// (lib/webhooks: Sign) and the three SDKs' tests share.
type webhookVectors struct {
	Signed []struct {
		Name    string
		T       int64
		Body    string
		Secrets []string
		Header  string
	}
	Verify []struct {
		Name, Secret, Header, Body string
		Now, Tolerance             float64
		Outcome, Reason, ID        string
	}
}

// The shared vectors: what the server signs verifies with each of its
// secrets, and each header, body, secret, clock and tolerance is answered
// as the Python and TypeScript SDKs answer it.
func TestVerifyWebhookSharedVectors(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../webhook_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file webhookVectors
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Signed) == 0 || len(file.Verify) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range file.Signed {
		for _, secret := range v.Secrets {
			if _, err := VerifyWebhookAt(secret, v.Header, []byte(v.Body), 0, time.Unix(v.T, 0)); err != nil {
				t.Errorf("%s: with %s: %v", v.Name, secret, err)
			}
		}
	}
	const prefix = "ratchet: webhook signature does not verify: "
	for _, v := range file.Verify {
		whole, frac := math.Modf(v.Now)
		now := time.Unix(int64(whole), int64(math.Round(frac*1e9)))
		tolerance := time.Duration(v.Tolerance * float64(time.Second))
		ev, err := VerifyWebhookAt(v.Secret, v.Header, []byte(v.Body), tolerance, now)
		var got string
		switch {
		case err == nil:
			got = "ok"
			if ev.ID != v.ID {
				t.Errorf("%s: event id %q, want %q", v.Name, ev.ID, v.ID)
			}
		case errors.Is(err, ErrNoWebhookSecret):
			got = "no_secret"
		case errors.Is(err, ErrWebhookSignature):
			got = "signature"
			if reason := strings.TrimPrefix(err.Error(), prefix); reason != v.Reason {
				t.Errorf("%s: reason %q, want %q", v.Name, reason, v.Reason)
			}
		default:
			got = "decode"
		}
		if got != v.Outcome {
			t.Errorf("%s: %s (%v), want %s", v.Name, got, err, v.Outcome)
		}
	}
}

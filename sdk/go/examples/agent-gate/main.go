// Command agent-gate performs one agent tool call, "send a welcome e-mail",
// through the effect gate: it asks before acting, acts only on execute,
// reports what happened, and returns the recorded result on a duplicate.
// Run it twice: the second run does not send again.
//
//	RATCHET_BASE_URL=http://localhost:8787 RATCHET_AGENT_KEY=... go run ./examples/agent-gate
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

type emailResult struct {
	MessageID string `json:"message_id"`
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	apiKey, err := keyFrom("RATCHET_AGENT_KEY")
	if err != nil {
		return err
	}
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: envOr("RATCHET_BASE_URL", "http://localhost:8787"),
		APIKey:  apiKey, // an AGENT key; never in source
	})
	if err != nil {
		return err
	}
	// Not the README's curl quickstart's user: its key, begun there with
	// another payload, would answer idempotency_key_reuse here.
	user := envOr("USER_ID", "user_456")
	key := "welcome-email:" + user
	if secret := os.Getenv("RATCHET_BLIND_SECRET"); secret != "" {
		// Deterministic but not guessable: the recorded result stays private
		// from anyone who merely knows the user id.
		key = ratchet.BlindKey(secret, key)
	}

	out, err := ratchet.DoEffect(ctx, client, ratchet.BeginRequest{
		EffectType:     "email.send",
		IdempotencyKey: key,
		Payload:        map[string]string{"to": user, "template": "welcome"},
		CostMicros:     ratchet.Micros(0),
		Dimensions:     map[string]string{"recipient": user},
	}, func(ctx context.Context, lease ratchet.Lease) (emailResult, error) {
		if lease.Probe {
			// A prior attempt's outcome is unknown: look it up at the vendor
			// first and return what it recorded instead of sending again.
			log.Printf("probe: checking the vendor for attempt %d", lease.PriorAttempt.Attempt)
		}
		return sendEmail(ctx, user)
	})

	var (
		blocked  *ratchet.BlockedError
		approval *ratchet.ApprovalRequiredError
		denied   *ratchet.DeniedError
	)
	switch {
	case err == nil && out.Duplicate:
		fmt.Printf("already sent earlier as %s (effect %s): not sending again\n", out.Result.MessageID, out.EffectID)
	case err == nil:
		fmt.Printf("sent %s (effect %s, attempt %d)\n", out.Result.MessageID, out.EffectID, out.Attempt)
	case errors.As(err, &blocked):
		fmt.Printf("blocked: attempt %d of effect %s has an unknown outcome; check the vendor, then resolve it\n",
			blocked.PriorAttempt.Attempt, blocked.EffectID)
	case errors.As(err, &approval):
		fmt.Printf("waiting for an operator to decide approval %s; run again afterwards\n", approval.ApprovalID)
	case errors.As(err, &denied):
		fmt.Printf("denied (%s): not working around it\n", denied.Code)
	case errors.Is(err, ratchet.ErrInFlight):
		fmt.Println("another caller is sending this e-mail right now")
	default:
		return err
	}
	return nil
}

// sendEmail stands in for the vendor call. An error the vendor returns
// before accepting the message is wrapped with NotPerformed, which lets the
// gate record "failed" and allow a retry; any other error (a timeout, a
// dropped connection) leaves the outcome honestly unknown.
func sendEmail(ctx context.Context, user string) (emailResult, error) {
	if user == "" {
		return emailResult{}, ratchet.NotPerformed(errors.New("no recipient"))
	}
	select {
	case <-time.After(100 * time.Millisecond):
	case <-ctx.Done():
		return emailResult{}, ctx.Err()
	}
	return emailResult{MessageID: fmt.Sprintf("msg_%d", time.Now().UnixNano())}, nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// keyFrom reads the API key from the environment variable name, saying which
// variable is unset rather than only that a key is missing.
func keyFrom(name string) (string, error) {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("%s is not set: export the key's secret in this shell (see sdk/go/README.md's quickstart)", name)
}

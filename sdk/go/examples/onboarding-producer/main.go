// Command onboarding-producer starts a "Customer onboarding" run, enqueues
// the send_welcome_email@1 step and requests completion, then follows the run
// until it ends. Run onboarding-worker alongside it.
//
//	RATCHET_BASE_URL=http://localhost:8787 RATCHET_INGEST_KEY=... go run ./examples/onboarding-producer
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	apiKey, err := keyFrom("RATCHET_INGEST_KEY")
	if err != nil {
		return err
	}
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: envOr("RATCHET_BASE_URL", "http://localhost:8787"),
		APIKey:  apiKey, // an INGEST key; never in source
	})
	if err != nil {
		return err
	}
	customer := envOr("CUSTOMER_ID", "cus_2048")

	r, err := client.StartRun(ctx, "Customer onboarding")
	if err != nil {
		return err
	}
	step, err := client.Enqueue(ctx, r.ID, map[string]string{"customerId": customer}, ratchet.EnqueueOptions{
		Name: "send_welcome_email", Version: "1", Endpoint: "Email service",
		// A stable key derived from the work: an enqueue retried after a
		// timeout or a lost answer deduplicates instead of sending twice.
		// Keys are unique in the workspace and a step belongs to its run, so
		// the key names the run too: re-running this program starts a new
		// run, whose step is new work (the same key in another run would be
		// 409 idempotency_key_reuse).
		IdempotencyKey: "welcome:" + customer + ":" + r.ID,
		Timeout:        30 * time.Second, MaxAttempts: 5,
	})
	if err != nil {
		return err
	}
	fmt.Printf("run %s: step %s (%s, deduplicated=%v)\n", r.ID, step.StepID, step.Status, step.Deduplicated)
	if _, err := client.FinishRun(ctx, r.ID); err != nil {
		return err
	}

	// Follow the run until a worker has finished it.
	for {
		cur, err := client.GetRun(ctx, r.ID)
		if err != nil {
			return err
		}
		if cur.Status != ratchet.RunRunning {
			fmt.Printf("run %s finished: %s\n", cur.ID, cur.Status)
			for _, s := range cur.Steps {
				fmt.Printf("  %s@%s %s after %d attempt(s)\n", s.Name, s.Version, s.Status, s.DurableJob.Attempt)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
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

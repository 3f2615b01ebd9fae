// Command onboarding-worker serves send_welcome_email@1 until interrupted,
// then stops gracefully: it claims nothing more and lets running handlers
// finish (up to 30 seconds) and report.
//
//	RATCHET_BASE_URL=http://localhost:8787 RATCHET_WORKER_KEY=... go run ./examples/onboarding-worker
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

type welcomeInput struct {
	CustomerID string `json:"customerId"`
}

type welcomeOutput struct {
	MessageID string `json:"messageId"`
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	apiKey, err := keyFrom("RATCHET_WORKER_KEY")
	if err != nil {
		return err
	}
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: envOr("RATCHET_BASE_URL", "http://localhost:8787"),
		// A WORKER key whose tools list "send_welcome_email@1"; never in source.
		APIKey: apiKey,
	})
	if err != nil {
		return err
	}
	worker := ratchet.NewWorker(client)
	err = ratchet.RegisterTool(worker, ratchet.Tool[welcomeInput, welcomeOutput]{
		Name: "send_welcome_email", Version: "1",
		Handler: sendWelcomeEmail,
	})
	if err != nil {
		return err
	}
	err = worker.Start(context.Background(), ratchet.StartOptions{
		Concurrency: 4,
		// A long-polling claim (held up to 20 s, answered as soon as a job is
		// due) starts a job enqueued meanwhile within a second. With the
		// interval equal to the wait a claim is nearly always waiting (the
		// interval's ±10% jitter leaves gaps of up to 2 s; about 30 claims
		// per idle 10 minutes; the default 30 s interval would leave 10 s
		// gaps, when a new job waits for the next claim).
		// On serverless hosting each idle claim is a request held open, so
		// weigh it there.
		WaitSeconds:  20,
		PollInterval: 20 * time.Second,
		OnError: func(err error) {
			// Local diagnostics only. Errors can carry payload details, so keep
			// them out of shared logs; RedactMessage bounds and masks the text.
			log.Printf("worker: %s", ratchet.RedactMessage(err.Error()))
		},
	})
	if err != nil {
		return err
	}
	log.Printf("worker %s serving send_welcome_email@1; Ctrl-C to stop", worker.ID())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	select {
	case <-sig:
		log.Print("stopping: finishing running jobs and the claim in flight (held up to 20 s)")
	case <-worker.Done(): // the server refused the key (401): Stop's error says so
		log.Print("the worker stopped claiming: finishing running jobs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return worker.Stop(ctx)
}

// sendWelcomeEmail stands in for a call to an e-mail provider. It passes the
// job's idempotency key on, so a repeated attempt (execution is at least
// once) is deduplicated by the provider, and it honours ctx, which ends at
// the job's timeout or when the step is cancelled.
func sendWelcomeEmail(ctx context.Context, in welcomeInput, job ratchet.JobContext) (welcomeOutput, error) {
	if in.CustomerID == "" {
		return welcomeOutput{}, ratchet.NonRetryable("customerId is required")
	}
	select {
	case <-time.After(200 * time.Millisecond): // the provider call
	case <-ctx.Done():
		return welcomeOutput{}, ctx.Err()
	}
	status := providerStatus(in.CustomerID)
	switch {
	case status == 429:
		return welcomeOutput{}, ratchet.Retryable("provider rate limited", 30*time.Second)
	case status == 503:
		return welcomeOutput{}, ratchet.Retryable("provider unavailable", 0)
	case status == 400:
		return welcomeOutput{}, ratchet.NonRetryable("provider rejected validation")
	case status >= 300:
		return welcomeOutput{}, errors.New("provider request failed") // unknown: retryable
	}
	log.Printf("sent welcome e-mail for job %s (attempt %d)", job.JobID, job.Attempt)
	return welcomeOutput{MessageID: "msg_" + job.IdempotencyKey}, nil
}

// providerStatus fakes the provider's answer; CUSTOMER_ID=fail-<status> in
// the producer lets you try the error paths. fail-400 exhausts the step at
// once; fail-429 and fail-503 are retried under the endpoint's policy
// (STANDARD: 5 attempts, 30 s, 1, 2 and 4 minutes apart), so their run ends
// about 8 minutes later.
func providerStatus(customerID string) int {
	switch customerID {
	case "fail-429":
		return 429
	case "fail-503":
		return 503
	case "fail-400":
		return 400
	}
	return 200
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

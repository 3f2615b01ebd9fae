package ratchet_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// A worker serves exact name@version tools: it claims due jobs, runs their
// handlers (heartbeating their leases) and reports the outcomes. Stop it on
// a shutdown signal, or when it stopped on its own (Done): Stop claims
// nothing more, lets the running handlers finish and sends their reports.
func Example_worker() {
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: os.Getenv("RATCHET_BASE_URL"),
		APIKey:  os.Getenv("RATCHET_WORKER_KEY"), // a WORKER key listing send_welcome_email@1
	})
	if err != nil {
		log.Fatal(err)
	}

	type welcomeInput struct {
		CustomerID string `json:"customerId"`
	}
	type welcomeOutput struct {
		MessageID string `json:"messageId"`
	}
	// send stands in for the e-mail provider's client.
	send := func(ctx context.Context, customerID, idempotencyKey string) (string, int, error) {
		return "msg_1", http.StatusOK, ctx.Err()
	}

	worker := ratchet.NewWorker(client)
	err = ratchet.RegisterTool(worker, ratchet.Tool[welcomeInput, welcomeOutput]{
		Name: "send_welcome_email", Version: "1",
		Handler: func(ctx context.Context, in welcomeInput, job ratchet.JobContext) (welcomeOutput, error) {
			if in.CustomerID == "" {
				return welcomeOutput{}, ratchet.NonRetryable("customerId is required")
			}
			// Execution is at least once: pass the step's key on, so the
			// provider deduplicates a repeated attempt. Honour ctx: it ends at
			// the job's timeout, on cancellation and when the worker stops.
			id, status, err := send(ctx, in.CustomerID, job.IdempotencyKey)
			switch {
			case err != nil:
				return welcomeOutput{}, err // retryable, unless ClassifyError says otherwise
			case status == http.StatusTooManyRequests:
				return welcomeOutput{}, ratchet.Retryable("provider rate limited", 30*time.Second)
			case status >= 400 && status < 500:
				return welcomeOutput{}, ratchet.NonRetryable("provider refused the message")
			}
			return welcomeOutput{MessageID: id}, nil
		},
	})
	if err != nil {
		log.Fatal(err) // the tool itself is malformed or registered twice
	}

	// Not a signal context: the end of Start's context cancels running
	// handlers at once. Start returns once registered; a key that may not
	// work the tool is refused here (403).
	err = worker.Start(context.Background(), ratchet.StartOptions{
		Concurrency: 4,
		// Claims long-poll, one nearly always waiting, so a job enqueued
		// while the worker is idle starts within a second or two. Each idle
		// claim is a request held open: weigh it on serverless hosting.
		WaitSeconds:  20,
		PollInterval: 20 * time.Second,
		OnError: func(err error) {
			// Errors may carry payload details: keep them out of shared logs.
			log.Printf("ratchet worker: %s", ratchet.RedactMessage(err.Error()))
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	sig, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	select {
	case <-sig.Done():
	case <-worker.Done(): // stopped on its own: the server refused it for good (a revoked key, say)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if err := worker.Stop(ctx); err != nil {
		log.Print(err) // what was cut off at the deadline, or reports not recorded
	}
}

// ClassifyError decides the retry of errors a handler returns as they come
// from a third-party library, without wrapping each one. Its zero Decision
// is the default, retryable.
func ExampleRegisterTool() {
	var worker *ratchet.Worker // NewWorker(client), before Start

	// The errors of many vendor SDKs say the HTTP status they met.
	type statusError interface {
		error
		HTTPStatus() int
	}

	err := ratchet.RegisterTool(worker, ratchet.Tool[map[string]any, map[string]any]{
		Name: "sync_crm", Version: "2",
		Handler: func(ctx context.Context, in map[string]any, job ratchet.JobContext) (map[string]any, error) {
			return nil, errors.New("call the CRM here")
		},
		ClassifyError: func(err error, job ratchet.JobContext) ratchet.Decision {
			var se statusError
			if !errors.As(err, &se) {
				return ratchet.Decision{} // not the vendor's: retryable
			}
			switch status := se.HTTPStatus(); {
			case status == http.StatusTooManyRequests:
				return ratchet.Decision{RetryAfter: time.Minute} // no sooner than that
			case status >= 400 && status < 500:
				return ratchet.Decision{NonRetryable: true} // EXHAUSTED at once
			}
			return ratchet.Decision{}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A handler decides the retry itself by returning a *RetryableError or a
// *NonRetryableError; wrapping them with %w is fine. The message is sent to
// the API (bounded and redacted): keep payloads out of it.
func ExampleRetryable() {
	err := fmt.Errorf("send welcome e-mail: %w", ratchet.Retryable("provider rate limited", time.Minute))

	var retry *ratchet.RetryableError
	if errors.As(err, &retry) {
		fmt.Printf("retry no sooner than %s: %s\n", retry.RetryAfter, retry.Message)
	}
	// Output:
	// retry no sooner than 1m0s: provider rate limited
}

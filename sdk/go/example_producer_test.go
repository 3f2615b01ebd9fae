package ratchet_test

import (
	"context"
	"log"
	"os"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// A producer starts a run, enqueues its steps and asks for the run to
// finish; workers do the steps. Every call is safe to repeat: the run's key
// and the step's key are derived from the work, so a producer that crashed
// and runs again gets the same run and step instead of new ones.
func Example_producer() {
	ctx := context.Background()
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: os.Getenv("RATCHET_BASE_URL"),
		APIKey:  os.Getenv("RATCHET_INGEST_KEY"), // an INGEST key
	})
	if err != nil {
		log.Fatal(err)
	}
	customer := "cus_2048"

	// The same key, name and budget answer the run the key started
	// (run.Deduplicated), as a Temporal workflow id would.
	run, err := client.StartRun(ctx, "Customer onboarding", ratchet.WithIdempotencyKey("onboarding:"+customer))
	if err != nil {
		log.Fatal(err)
	}
	step, err := client.Enqueue(ctx, run.ID, map[string]string{"customerId": customer}, ratchet.EnqueueOptions{
		Name: "send_welcome_email", Version: "1", Endpoint: "Email service",
		// Step keys are unique per workspace, not per run, and the run is
		// part of what a key stands for: "welcome:cus_2048" alone would make
		// the next run's enqueue 409 idempotency_key_reuse.
		IdempotencyKey: "welcome:" + customer + ":" + run.ID,
		Timeout:        30 * time.Second,
		MaxAttempts:    5,
	})
	if err != nil {
		log.Fatal(err)
	}
	// Deduplicated means "the step exists", possibly made by this very call
	// when its first answer was lost and the client asked again.
	log.Printf("step %s: %s (deduplicated: %v)", step.StepID, step.Status, step.Deduplicated)

	// The run ends (SUCCEEDED or FAILED) once its steps do.
	if _, err := client.FinishRun(ctx, run.ID); err != nil {
		log.Fatal(err)
	}
}

// Steps can wait for another step of the run: AfterStepID with
// AfterSucceeded or AfterFailed releases a step on that ending and skips it
// on the other, so a run can branch. Enqueue the branches before FinishRun.
func ExampleClient_Enqueue() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with an INGEST key, as in the producer example

	// One run per order (its key), so the step keys may name the order alone.
	order := "ord_551"
	run, err := client.StartRun(ctx, "Checkout", ratchet.WithIdempotencyKey("checkout:"+order))
	if err != nil {
		log.Fatal(err)
	}
	charge, err := client.Enqueue(ctx, run.ID, map[string]string{"orderId": order}, ratchet.EnqueueOptions{
		Name: "charge_card", Version: "3", IdempotencyKey: "charge:" + order,
	})
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.Enqueue(ctx, run.ID, map[string]string{"orderId": order}, ratchet.EnqueueOptions{
		Name: "send_receipt", Version: "1", IdempotencyKey: "receipt:" + order,
		AfterStepID: charge.StepID, AfterStatus: ratchet.AfterSucceeded,
	})
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.Enqueue(ctx, run.ID, map[string]string{"orderId": order}, ratchet.EnqueueOptions{
		Name: "notify_support", Version: "1", IdempotencyKey: "charge-failed:" + order,
		AfterStepID: charge.StepID, AfterStatus: ratchet.AfterFailed,
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := client.FinishRun(ctx, run.ID); err != nil {
		log.Fatal(err)
	}
}

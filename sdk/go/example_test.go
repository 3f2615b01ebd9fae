package ratchet_test

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// A client for your own deployment, its origin and key read from the
// environment. Keys belong in the environment or a secret store, never in
// source. With RATCHET_BASE_URL unset the client talks to the hosted
// service, DefaultBaseURL.
func ExampleNewClient() {
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: os.Getenv("RATCHET_BASE_URL"), // e.g. http://localhost:8787 for scripts/dev
		APIKey:  os.Getenv("RATCHET_INGEST_KEY"),
	})
	if err != nil {
		log.Fatal(err) // an empty key or a base URL that is not an http(s) origin
	}
	log.Println("using", client) // prints the origin, never the key
}

// The other options: an HTTP client of your own (proxies, tracing, test
// transports), a retry bound and a User-Agent prefix. A transport of your
// own should keep as many idle connections as the calls you make at once.
func ExampleNewClient_options() {
	client, err := ratchet.NewClient(ratchet.Config{
		BaseURL: "https://ratchet.internal.example.com",
		APIKey:  os.Getenv("RATCHET_WORKER_KEY"),
		HTTPClient: &http.Client{
			// Leave room for long-polling claims (StartOptions.WaitSeconds):
			// the worker keeps each wait 5 s shorter than this timeout.
			Timeout:   30 * time.Second,
			Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 16},
		},
		MaxRetries: 5,                  // 0 means 3; negative disables retries
		UserAgent:  "billing-worker/2", // sent before the SDK's own
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = client
}

// A Config prints with its key masked, so logging the settings at startup
// does not leak the secret (%#v and log/slog mask it too).
func ExampleConfig_String() {
	cfg := ratchet.Config{
		BaseURL: "http://localhost:8787",
		APIKey:  "a-secret-read-from-the-environment",
	}
	fmt.Println(cfg)
	// Output:
	// ratchet.Config{BaseURL: "http://localhost:8787", APIKey: [redacted], HTTPClient: default, MaxRetries: 0, UserAgent: ""}
}

// API failures are *Error values carrying the stable error code: branch on
// the code (the Code constants), never on the message. IsCode and ErrorCode
// look through wrapping. The error here is built by hand, as a call
// answered 409 would return it.
func ExampleError() {
	var err error = &ratchet.Error{
		StatusCode: http.StatusConflict,
		Code:       ratchet.CodeIdempotencyKeyReuse,
		Message:    "the key was used with another request",
		RequestID:  "req_123",
	}
	err = fmt.Errorf("enqueue welcome e-mail: %w", err)

	var apiErr *ratchet.Error
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.StatusCode, apiErr.Code)
	}
	fmt.Println(ratchet.IsCode(err, ratchet.CodeIdempotencyKeyReuse))
	fmt.Println(ratchet.ErrorCode(err))
	// A refusal is an answer: the call surely did not apply.
	fmt.Println(ratchet.MayHaveApplied(err))
	// Output:
	// 409 idempotency_key_reuse
	// true
	// idempotency_key_reuse
	// false
}

// Package ratchet is the Go SDK for Ratchet: a producer for durable runs and
// steps, a worker runtime that claims and executes jobs, a helper that wraps
// an agent's side effect in the effect gate's begin/report protocol, an
// operator's calls (endpoints, queue health, contracts, approvals, policies,
// breakers, webhooks, keys) and VerifyWebhook for webhook receivers.
//
// The package uses only the standard library. Every call takes a context,
// failures from the API are *Error values carrying the stable error code, and
// calls are retried only when repeating them is safe (see Client).
//
// Keys belong in the environment, never in source:
//
//	client, err := ratchet.NewClient(ratchet.Config{
//		BaseURL: os.Getenv("RATCHET_BASE_URL"),
//		APIKey:  os.Getenv("RATCHET_INGEST_KEY"),
//	})
package ratchet

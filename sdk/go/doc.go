// Package ratchet is the Go SDK for Ratchet, a reliability layer for side
// effects and durable jobs: code whose action on the outside world must not
// happen twice (send an e-mail, charge a card, an agent's tool call) asks
// Ratchet before acting, and work that must survive crashes runs as durable
// steps that workers claim, retry and report.
//
// The package has three halves, all on one [Client]:
//
//   - The producer starts a run ([Client.StartRun]), enqueues its steps
//     with idempotency keys ([Client.Enqueue]) and asks for the run to
//     finish ([Client.FinishRun]). See the producer example.
//   - The worker ([NewWorker], [RegisterTool], [Worker.Start],
//     [Worker.Stop]) serves exact name@version tools: it claims due steps'
//     jobs, runs their typed handlers under heartbeated leases and reports
//     each outcome, retried as the handler's error decides ([Retryable],
//     [NonRetryable], [Tool].ClassifyError). See the worker example.
//   - The gate helper [DoEffect] wraps an agent's side effect in the effect
//     gate's begin/report protocol: it acts only when the gate says execute,
//     answers a repeat of the key with the recorded result, and returns the
//     policy's decisions (approval, denial, blocked) as typed errors.
//     [BlindKey] makes a key unguessable.
//
// Beside them are an operator's calls (approvals, effect policies and
// breakers, endpoints, queue health, contracts, replays, keys, webhook
// subscriptions) and [VerifyWebhook] and [WebhookHandler] for a receiver of
// Ratchet's webhooks.
//
// # Where to start
//
// Make a [Client] with [NewClient], one per key: producers use an INGEST
// key, workers a WORKER key listing their tools, agents an AGENT key,
// operators an operator key. Keys belong in the environment, never in
// source, and BaseURL names your deployment (empty means the hosted
// service, [DefaultBaseURL]):
//
//	client, err := ratchet.NewClient(ratchet.Config{
//		BaseURL: os.Getenv("RATCHET_BASE_URL"),
//		APIKey:  os.Getenv("RATCHET_INGEST_KEY"),
//	})
//
// Then follow the examples: the producer and worker examples, [DoEffect]'s,
// and [VerifyWebhook]'s. The README (sdk/go/README.md) walks through a
// local server and each call's guarantees.
//
// # Errors and retries
//
// The package uses only the standard library. Every call takes a context.
// Failures the API answers are [*Error] values carrying the stable error
// code (the Code constants; match with [IsCode]). Calls are retried only
// when repeating them is safe (see [Client]); [MayHaveApplied] says whether
// a failed call may still have been applied. Jobs run at least once: pass
// [JobContext].IdempotencyKey to the service a handler calls.
package ratchet

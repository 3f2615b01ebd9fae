// Package jobs is Ratchet's durable job queue on Postgres: runs and their
// steps, endpoints with retry policies and gates, workers that claim jobs
// under leases, and the transitions between job statuses. It knows nothing
// of HTTP; lib/httpapi/routes_jobs.go is its thin HTTP door.
//
// Correctness under concurrency comes from Postgres: a batch is claimed by
// one statement with FOR UPDATE SKIP LOCKED, every report is fenced by its
// lease token under the job's row lock, endpoint gates are counters changed
// under the endpoint's row lock, and idempotency keys are unique per
// workspace. All SQL lives in sql.go and, for tool contracts, synthetic
// tests and replay, in sql_contracts.go, except the enqueue's, which is the
// PL/pgSQL function jobs_enqueue (migrations/0009_jobs_enqueue.sql).
package jobs

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/keyedhash"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/seal"
)

// Job statuses (API.md §3).
const (
	StatusWaiting        = "WAITING"
	StatusQueued         = "QUEUED"
	StatusRunning        = "RUNNING"
	StatusRetryScheduled = "RETRY_SCHEDULED"
	StatusSucceeded      = "SUCCEEDED"
	StatusExhausted      = "EXHAUSTED"
	StatusCancelled      = "CANCELLED"
	StatusSkipped        = "SKIPPED"
)

// OutcomeFailed is the status a report gives a failed attempt (a success
// reports StatusSucceeded).
const OutcomeFailed = "FAILED"

// Statuses lists every job status, in the order a job may pass through them.
var Statuses = []string{StatusWaiting, StatusQueued, StatusRunning, StatusRetryScheduled,
	StatusSucceeded, StatusExhausted, StatusCancelled, StatusSkipped}

// validStatus reports whether s is a job status.
func validStatus(s string) bool { return slices.Contains(Statuses, s) }

// Run statuses.
const (
	RunRunning   = "RUNNING"
	RunSucceeded = "SUCCEEDED"
	RunFailed    = "FAILED"
)

// Event types written to the outbox.
const (
	EventStepExhausted = "step.exhausted"
	EventRunFinished   = "run.finished"
)

// LapseWarning is recorded on an execution whose lease lapsed without a report.
const LapseWarning = "Lease expired without a report; the worker may have completed an external side effect before it stopped."

// Service is the durable job domain.
type Service struct {
	pool       *pgxpool.Pool
	sealer     *seal.Sealer
	hashKey    *keyedhash.Key
	now        func() time.Time
	leaseGrace time.Duration
	// jitter returns a uniform value in [0,1) for retry jitter.
	jitter func() float64
	// Long-poll pacing (pollMin, pollMax) and the wake-up of parked
	// long polls when this process queues work (wake.go).
	pollMin, pollMax time.Duration
	wake             *waker
	waits            *waitSlots // the long polls each key has waiting here
	// purgeSteps bounds the steps one retention pass deletes
	// (purgeStepsPerPass; tests lower it).
	purgeSteps int
	// sweepBatch bounds each sweeper task's work per pass (sweepBatch;
	// tests lower it).
	sweepBatch int
	// claimInputBudget bounds the sealed input one claim answers
	// (ClaimInputBudget; tests lower it).
	claimInputBudget int64
	// noDeadlockRetry turns off the retry of a deadlock's victim, so that
	// a test can see whether a deadlock happens at all.
	noDeadlockRetry bool
	// looked, when set, is told of every look a claim makes (claimOrWait),
	// so that a test can wait for one: a look writes nothing a test could
	// wait for (a claim marks its worker seen once a minute at most).
	looked func(workerID string)
	// onOlderTargets, when set, is told of each page of older contracts
	// a replay preview reads (olderUpgradeRuns), for a test of what it
	// reads.
	onOlderTargets func([]Contract)
	// onSchemasRead, when set, is told of the contracts each read of a
	// replay preview's listed targets carried the input schemas of
	// (sqlReplayTargets, sqlReplaySchemas), for a test of what it reads.
	onSchemasRead func(versions []int)
	// logger says which jobs a claim passed over (claimOnce); never an
	// input or a key.
	logger *slog.Logger
}

// retrying runs work, again when Postgres rolled it back as a deadlock's
// victim (db.RetryDeadlocks).
func (s *Service) retrying(ctx context.Context, work func() error) error {
	if s.noDeadlockRetry {
		return work()
	}
	return db.RetryDeadlocks(ctx, work)
}

// txRetrying runs fn in a transaction (db.Tx), in a new one when the last
// was a deadlock's victim (db.TxRetryingDeadlocks).
func (s *Service) txRetrying(ctx context.Context, fn func(pgx.Tx) error) error {
	if s.noDeadlockRetry {
		return db.Tx(ctx, s.pool, fn)
	}
	return db.TxRetryingDeadlocks(ctx, s.pool, fn)
}

// ClaimInputBudget is how many bytes of (sealed) input one claim answers at
// most: it stops adding jobs before their inputs pass it, though it always
// answers one. Every job's input is answered whole, and an answer refused
// by its platform loses the claim, leaving its jobs leased until their
// leases lapse. Three quarters of answer.Budget leave the rest for the
// other fields of up to 100 jobs (ids, names, keys: a few KB each).
const ClaimInputBudget = answer.Budget * 3 / 4

// New builds the service. hashSecret keys the HMAC of stored operation
// fingerprints; leaseGraceMs is JOB_LEASE_GRACE_MS.
func New(pool *pgxpool.Pool, sealer *seal.Sealer, hashSecret string, leaseGraceMs int64, now func() time.Time,
	logger *slog.Logger) *Service {
	if now == nil {
		now = time.Now
	}
	// Postgres keeps microseconds: a write answers the time a read returns.
	clock := func() time.Time { return now().UTC().Truncate(time.Microsecond) }
	return &Service{pool: pool, sealer: sealer, hashKey: keyedhash.New([]byte(hashSecret)), now: clock,
		leaseGrace: time.Duration(leaseGraceMs) * time.Millisecond, jitter: rand.Float64,
		pollMin: pollMin, pollMax: pollMax, wake: newWaker(), waits: newWaitSlots(maxWaitingClaimsPerKey),
		purgeSteps: purgeStepsPerPass, sweepBatch: sweepBatch, claimInputBudget: ClaimInputBudget, logger: redact.Logger(logger)}
}

// mac is the keyed hash (HMAC-SHA-256 under the hash secret) of the
// concatenation of parts.
func (s *Service) mac(parts ...[]byte) []byte { return s.hashKey.Sum(parts...) }

// open decrypts a sealed JSON column, answering null for an empty one.
func (s *Service) open(jobID, column string, sealed []byte) (json.RawMessage, error) {
	if sealed == nil {
		return json.RawMessage("null"), nil
	}
	b, err := s.sealer.Open(sealed, seal.AAD(jobID, column))
	if err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}

// utc normalises a time read from Postgres (the driver answers in the local
// zone) so that a repeated answer equals the first one.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// Package gate is the effect gate (API.md §2): an agent asks before a side
// effect (begin), holds a lease while acting, and reports what happened.
// Every decision is made by Postgres from the rows of this workspace, with
// unique constraints and row locks; nothing is remembered in process memory,
// so any number of instances agree. Time is always the service's injected
// clock passed into SQL, so a lapsed lease is detected by comparison at read
// time and tests move the clock instead of sleeping.
//
// The package knows nothing of HTTP; its SQL lives in queries.go.
package gate

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/seal"
)

// Effect states (API.md §2.2). A stored 'leased' whose lease lapsed reads as
// indeterminate.
const (
	StateLeased           = "leased"
	StateSucceeded        = "succeeded"
	StateFailed           = "failed"
	StateIndeterminate    = "indeterminate"
	StateAwaitingApproval = "awaiting_approval"
	StateDenied           = "denied"
)

// States lists every effect state, for validating ?state=.
var States = []string{StateLeased, StateSucceeded, StateFailed, StateIndeterminate, StateAwaitingApproval, StateDenied}

// Decisions of begin (API.md §2.1).
const (
	DecisionExecute          = "execute"
	DecisionDuplicate        = "duplicate"
	DecisionInFlight         = "in_flight"
	DecisionBlocked          = "blocked"
	DecisionApprovalRequired = "approval_required"
	DecisionDenied           = "denied"
)

// MaxResultBytes is the published limit on a reported or resolved result.
const MaxResultBytes = 256 << 10

// MaxGroupSteps is the most forward steps one effect group takes (the
// manifest's limits.group_steps_max): a begin that would add another is
// refused 409 invalid_state, nothing changed; its compensations are not
// counted (a step takes at most one, and a rollback never stalls on a
// full group). A group's answers list its steps whole where a list
// cannot be cut without misleading (an unwind's unresolved, irreversible
// and reversed ids, a refused commit's detail.steps, a refused
// compensation's detail.unresolved), and every settle of a group reads
// all its steps: the bound keeps each such answer well within
// answer.Budget (a refused commit naming every step of a full group is
// about 0.75 MB; 70 000 steps would pass 4 MB) and each settle's work bounded,
// as Temporal bounds a workflow's pending activities. Ten thousand steps
// are far more than a unit of work that is rolled back whole needs; more
// work is more groups.
const MaxGroupSteps = 10_000

// Service is the gate over one pool. It is safe for concurrent use and holds
// no per-effect state.
type Service struct {
	pool   *pgxpool.Pool
	sealer *seal.Sealer
	hash   func(string) []byte
	now    func() time.Time
	logger *slog.Logger
	// maxGroupSteps is MaxGroupSteps (tests make it smaller).
	maxGroupSteps int
	// walletMoves is maxWalletMoves (tests make it smaller).
	walletMoves int
	// datingBatch and datingBatches bound a policy write's dating of the
	// groups a lowered retention shortens (shortenKeptGroups): its batch
	// and how many batches (tests make them smaller).
	datingBatch, datingBatches int
	// checkEveryPass: effects.retention checks every pair with an ended,
	// ungrouped effect at each run (CheckRetentionEveryPass).
	checkEveryPass bool
	// discoveryPairs is retentionDiscoveryPairs (tests make it smaller).
	discoveryPairs int
}

// New returns the gate. hash is the keyed hash used for dimension values
// (auth.Service.Hash); now is the clock every decision uses; logger hears
// of stored values a read cannot open (nil: slog.Default()), its errors
// as redact.ErrorText has them.
func New(pool *pgxpool.Pool, sealer *seal.Sealer, hash func(string) []byte, now func() time.Time,
	logger *slog.Logger) *Service {
	if now == nil {
		now = time.Now
	}
	// Through redact.Logger, as the jobs', webhooks' and sweeper's are:
	// every error the gate logs is written as redact.ErrorText has it, on
	// whatever logger it was given (logs QA: one given a plain logger, or
	// nil, logged a data exception's message, which quotes the value).
	return &Service{pool: pool, sealer: sealer, hash: hash, now: now, logger: redact.Logger(logger), maxGroupSteps: MaxGroupSteps,
		walletMoves: maxWalletMoves, datingBatch: datingBatch, datingBatches: datingBatchesPerWrite,
		discoveryPairs: retentionDiscoveryPairs}
}

// clock is now in UTC at Postgres' precision, so a time written and read back
// compares equal to the one the service decided with.
func (s *Service) clock() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

// tokenHash is how a lease token is stored: a holder proves the lease by
// presenting the token, and a database reader cannot forge a report.
func tokenHash(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// sealJSON seals a JSON document (nil stays nil, so the column stays NULL).
func (s *Service) sealJSON(effectID, column string, doc json.RawMessage) []byte {
	if doc == nil {
		return nil
	}
	return s.sealer.Seal(doc, seal.AAD(effectID, column))
}

// openJSON opens effect effectID's sealed column. Its error names the
// effect and, through seal's, the key (the 500 it becomes is logged with it:
// the operator learns which row and which key, never the value). Only what
// must use the value fails so (a duplicate's result, a compensation to
// plan or to compare); a read shows an unopenable result as
// result_unreadable instead (view).
func (s *Service) openJSON(effectID, column string, ct []byte) (json.RawMessage, error) {
	pt, err := s.sealer.Open(ct, seal.AAD(effectID, column))
	if err != nil {
		return nil, fmt.Errorf("open %s of effect %s: %w", column, effectID, err)
	}
	return pt, nil
}

// nullJSON treats an absent document and JSON null alike.
func nullJSON(doc json.RawMessage) json.RawMessage {
	if len(doc) == 0 || string(doc) == "null" {
		return nil
	}
	return doc
}

// lapsed reports whether a lease that expires at exp has lapsed at now.
func lapsed(exp *time.Time, now time.Time) bool { return exp != nil && !exp.After(now) }

// retryRequest is begin's answer to a lost optimistic race.
func retryRequest() error {
	return apierr.Conflict(apierr.CodeRetryRequest, "The effect changed concurrently; retry at once.")
}

// eventIDsAt answers n event ids made at now, in order: a sweep's statement
// takes the ones it needs in turn, so that the events it records list in
// the order it made them.
func eventIDsAt(now time.Time, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = ids.NewAt(ids.Event, now)
	}
	slices.Sort(out)
	return out
}

// Package events writes the outbox: one row per domain event, in the same
// transaction as the change it describes, so an event is recorded if and only
// if its change committed. Webhook delivery reads the outbox later.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/getratchet/ratchet/lib/ids"
)

// Event types (API.md §2.7).
const (
	EffectIndeterminate = "effect.indeterminate"
	CircuitTripped      = "circuit.tripped"
	CircuitClosed       = "circuit.closed"
	ApprovalRequested   = "approval.requested"
	ApprovalDecided     = "approval.decided"
	ReconciliationDue   = "reconciliation.due"
	RunFinished         = "run.finished"
	StepExhausted       = "step.exhausted"
	StepReplayed        = "step.replayed"
)

// Types lists every event type a webhook may subscribe to.
var Types = []string{EffectIndeterminate, CircuitTripped, CircuitClosed, ApprovalRequested,
	ApprovalDecided, ReconciliationDue, RunFinished, StepExhausted, StepReplayed}

// Execer is satisfied by a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Event is one outbox row. Data must hold ids and states only: it is sent to
// webhook endpoints, so never payloads, inputs, outputs or results.
type Event struct {
	WorkspaceID string
	Type        string
	SubjectID   string
	Data        map[string]any
	// DedupeKey makes recording idempotent: the same (type, subject,
	// dedupe key) is recorded once, so a sweeper racing an inline transition
	// cannot emit an event twice.
	DedupeKey string
	At        time.Time
}

// Record inserts e unless an event with the same identity exists.
func Record(ctx context.Context, q Execer, e Event) error {
	data, err := json.Marshal(e.Data)
	if err != nil {
		return fmt.Errorf("encode event data: %w", err)
	}
	if e.Data == nil {
		data = []byte("{}")
	}
	_, err = q.Exec(ctx, `
		INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
		VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)
		ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING`,
		ids.NewAt(ids.Event, e.At), e.WorkspaceID, e.Type, e.SubjectID, string(data), e.At, e.DedupeKey)
	if err != nil {
		return fmt.Errorf("record %s event: %w", e.Type, err)
	}
	return nil
}

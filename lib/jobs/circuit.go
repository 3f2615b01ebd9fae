package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/ids"
)

// The endpoint circuit breaker (migration 0018). Claims keep it shut
// (jobs_claim skips an open endpoint but for one probe per cooldown); the
// report path below counts what workers report, since only a report says
// how the service answered. It is off until a policy sets
// circuitFailureThreshold, so endpoints without one pay nothing: the report
// lock reads, once per endpoint of the batch, whether its breaker is on
// (circuitHint), and only a batch with such an endpoint runs
// sqlCircuitRecord.

// circuitTally is one endpoint's share of a report batch, read in the
// batch's order: whether a success came, and the retryable failures after
// the last success (all of them when none came).
type circuitTally struct {
	succeeded bool
	failures  int
}

// counts says how a recorded report moves its endpoint's count: a success
// resets it, a retryable failure adds one; a non-retryable failure (the
// handler's verdict on its input, a refused output) and a report on a
// cancelled job leave it.
func (r applyRow) counts() (success, failure bool) {
	if !r.updateJob || r.rejected {
		return false, false
	}
	if r.outcome == StatusSucceeded {
		return true, false
	}
	return false, r.retryable == nil || *r.retryable
}

// tallyCircuits sums rows per hinted endpoint.
func tallyCircuits(rows []applyRow, locked map[string]*lockedJob) map[string]*circuitTally {
	var out map[string]*circuitTally
	for _, r := range rows {
		j := locked[r.jobID]
		success, failure := r.counts()
		if !j.circuitHint || (!success && !failure) {
			continue
		}
		if out == nil {
			out = map[string]*circuitTally{}
		}
		t := out[j.endpointID]
		if t == nil {
			t = &circuitTally{}
			out[j.endpointID] = t
		}
		if success {
			t.succeeded, t.failures = true, 0
		} else {
			t.failures++
		}
	}
	return out
}

// recordCircuits counts tallies on their endpoints, opening and closing
// circuits, and records their events. sqlReportLock has locked their rows
// already, in an earlier statement (so that this one sees their latest
// versions); it locks, in id order, those it counts on and every one the
// rest of the report will lock (the gated endpoints of slotted, the jobs
// whose concurrency slots it may change) again, which costs nothing for
// rows already held and keeps the order claims lock endpoints in for any
// that became gated since. closed says a circuit closed: claims held back
// by it are worth waking once the transaction commits.
func (s *Service) recordCircuits(ctx context.Context, tx pgx.Tx, workspaceID string, tallies map[string]*circuitTally,
	slotted []string, now time.Time) (closed bool, err error) {
	if len(tallies) == 0 {
		return false, nil
	}
	var (
		endpointIDs = make([]string, 0, len(tallies))
		succeeded   = make([]bool, 0, len(tallies))
		failures    = make([]int32, 0, len(tallies))
	)
	for id, t := range tallies {
		endpointIDs, succeeded, failures = append(endpointIDs, id), append(succeeded, t.succeeded), append(failures, int32(t.failures))
	}
	rows, err := tx.Query(ctx, sqlCircuitRecord, endpointIDs, succeeded, failures, slotted, now)
	if err != nil {
		return false, fmt.Errorf("record circuits: %w", err)
	}
	changes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[circuitChange])
	if err != nil {
		return false, fmt.Errorf("record circuits: %w", err)
	}
	var evs []event
	for _, c := range changes {
		if c.WasOpen && (c.Succeeded || !c.OpenNow) {
			closed = true
			openedAt := now
			if c.PrevOpenedAt != nil {
				openedAt = *c.PrevOpenedAt
			}
			evs = append(evs, closedEvent(workspaceID, c.ID, c.Name, openedAt, now, "success"))
		}
		if c.OpenNow && (!c.WasOpen || c.Succeeded) {
			evs = append(evs, trippedEvent(workspaceID, c, now))
		}
	}
	return closed, s.recordEvents(ctx, tx, evs)
}

// circuitChange is one endpoint sqlCircuitRecord counted on.
type circuitChange struct {
	ID, Name                    string
	WasOpen, Succeeded, OpenNow bool
	PrevOpenedAt, ProbeAt       *time.Time
	Failures                    int32
}

// trippedEvent and closedEvent are of the gate breakers' types, so a
// subscriber to circuit.tripped hears of both kinds; an endpoint's carry
// endpointId where a gate breaker's carry effect_type.
//
// Each is a transition of the endpoint's row (closed to open, open to
// closed) read under its lock (sqlCircuitRecord, sqlLockCircuit), so none
// repeats another, and each has a key of its own: its event id, as the
// gate's breaker events have. Keyed by an instant alone (when it opened),
// a second open-close cycle whose clock read the instant the first read
// (another instance's reading, lagging by the time between them) took the
// first cycle's keys and was not announced (events QA).
func trippedEvent(workspaceID string, c circuitChange, now time.Time) event {
	data, _ := json.Marshal(map[string]any{"endpointId": c.ID, "endpoint": c.Name, "state": CircuitOpen,
		"openedAt": now.UTC(), "probeAt": utc(c.ProbeAt), "consecutiveFailures": c.Failures})
	id := ids.NewAt(ids.Event, now)
	return event{id: id, workspaceID: workspaceID, typ: events.CircuitTripped, subject: c.ID, data: string(data),
		dedupe: "endpoint-open:" + now.UTC().Format(time.RFC3339Nano) + ":" + id}
}

// closedEvent records the closing of a circuit opened at openedAt; by says
// what closed it: a reported success, an operator, or a policy that
// turned the breaker off.
func closedEvent(workspaceID, id, name string, openedAt, now time.Time, by string) event {
	data, _ := json.Marshal(map[string]any{"endpointId": id, "endpoint": name, "state": CircuitClosed,
		"openedAt": openedAt.UTC(), "closedAt": now.UTC(), "closedBy": by})
	eventID := ids.NewAt(ids.Event, now)
	return event{id: eventID, workspaceID: workspaceID, typ: events.CircuitClosed, subject: id, data: string(data),
		dedupe: "endpoint-closed:" + openedAt.UTC().Format(time.RFC3339Nano) + ":" + eventID}
}

// CloseCircuit closes the endpoint's circuit breaker (API.md §3.2) and
// forgets its count of failures; claims take its jobs again at once.
// Closing a closed circuit is not an error: it answers the endpoint as it
// is.
func (s *Service) CloseCircuit(ctx context.Context, workspaceID, id string) (Endpoint, error) {
	var (
		e   Endpoint
		was Circuit
	)
	err := s.txRetrying(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlLockCircuit, workspaceID, id).Scan(&was.State, &was.OpenedAt); err != nil {
			return err
		}
		// Read once the row is held, as a report reads its clock: read
		// before the wait, a close that waited for a report opening the
		// circuit recorded circuit.closed before its openedAt, and moved
		// the endpoint's updatedAt back (review).
		now := s.now()
		var err error
		if e, err = scanEndpoint(tx.QueryRow(ctx, sqlCloseCircuit, workspaceID, id, now)); err != nil {
			return err
		}
		if was.State != CircuitOpen || was.OpenedAt == nil {
			return nil
		}
		return s.recordEvents(ctx, tx, []event{closedEvent(workspaceID, e.ID, e.Name, *was.OpenedAt, now, "operator")})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, apierr.NotFound("endpoint")
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("close endpoint circuit: %w", err)
	}
	if was.State == CircuitOpen {
		db.AfterCommit(ctx, func() { s.wake.wakeAll(workspaceID) })
	}
	return e, nil
}

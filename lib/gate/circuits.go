package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
)

// Circuits (API.md §2.5): surge containment per effect type and the
// workspace's emergency stop. Begin evaluates them in its own statement
// (breakerCTEs, tripCTEs in risk_queries.go): the breaker row and the stop
// are two primary-key probes, and the surge volume is counted from the
// effects index only when the policy configures surge and the key is new.

// Circuit states, openers and actions.
const (
	CircuitClosed = "closed"
	CircuitOpen   = "open"

	OpenedBySurge  = "surge"
	OpenedByManual = "manual"
	OpenedByStop   = "stop"

	ActionMonitor         = "monitor"
	ActionRequireApproval = "require_approval"
	ActionDeny            = "deny"
)

// stopType is the gate_circuits row of the emergency stop ('*' is never a
// valid effect type).
const stopType = "*"

const maxReasonRunes = 500

// Circuit is one effect type's breaker as it reads now (API.md §5). Every
// field is always present, null where not applicable.
type Circuit struct {
	EffectType           string     `json:"effect_type"`
	State                string     `json:"state" openapi:"enum=closed|open"`
	OpenedBy             *string    `json:"opened_by" openapi:"enum=surge|manual|stop"`
	Action               *string    `json:"action" openapi:"enum=monitor|require_approval|deny"`
	Reason               *string    `json:"reason"`
	VolumeLastHour       int64      `json:"volume_last_hour"`
	BaselineMedianHourly *float64   `json:"baseline_median_hourly"`
	Threshold            *int64     `json:"threshold"`
	OpenedAt             *time.Time `json:"opened_at"`
	ClosesAt             *time.Time `json:"closes_at"`
}

// OpenCircuitRequest is the body of POST /api/v1/circuits/{type}/open and of
// POST /api/v1/circuits/stop; action defaults to require_approval.
type OpenCircuitRequest struct {
	Action *string `json:"action" openapi:"enum=monitor|require_approval|deny"`
	Reason *string `json:"reason" openapi:"maxLength=500"` // maxReasonRunes
}

// actionRank orders actions by strictness: the strictest breaker holding a
// type is the one it reads as (and the one begin applies).
func actionRank(a *string) int {
	if a == nil {
		return -1
	}
	return slices.Index([]string{ActionMonitor, ActionRequireApproval, ActionDeny}, *a)
}

func scanCircuit(row pgx.Row) (Circuit, error) {
	var (
		c                        Circuit
		ownOpen                  *bool
		ownBy, ownAction, ownWhy *string
		ownAt, ownCloses         *time.Time
		stopAction, stopWhy      *string
		stopAt                   *time.Time
	)
	err := row.Scan(&c.EffectType, &ownOpen, &ownBy, &ownAction, &ownWhy, &ownAt, &ownCloses,
		&stopAction, &stopWhy, &stopAt, &c.VolumeLastHour, &c.BaselineMedianHourly, &c.Threshold)
	if err != nil {
		return c, err
	}
	c.State = CircuitClosed
	if ownOpen != nil && *ownOpen && actionRank(ownAction) > actionRank(stopAction) {
		c.State, c.OpenedBy, c.Action, c.Reason, c.OpenedAt, c.ClosesAt =
			CircuitOpen, ownBy, ownAction, ownWhy, ownAt, ownCloses
	} else if stopAction != nil {
		by := OpenedByStop
		c.State, c.OpenedBy, c.Action, c.Reason, c.OpenedAt = CircuitOpen, &by, stopAction, stopWhy, stopAt
	}
	return c, nil
}

// withBreaker adds to a circuit_open denial which breaker denied (opened_by,
// opened_at) and when it closes by itself (closes_at: a surge's cooldown;
// null for a manual breaker or the stop, which only an operator lifts), so
// a caller can tell whether waiting helps. It is read after the decision
// committed: a breaker closed since adds nothing, and a failed read leaves
// the denial as it was, since the decision stands either way.
func (s *Service) withBreaker(ctx context.Context, workspaceID, effectType string, e *apierr.Error) *apierr.Error {
	c, err := scanCircuit(s.pool.QueryRow(ctx, sqlDenyingCircuit, workspaceID, effectType, s.clock()))
	if err != nil || c.State != CircuitOpen {
		return e
	}
	if c.Action == nil || *c.Action != ActionDeny {
		// A surge over its ceiling under an operator's weaker breaker,
		// which is left as set: the surge denies without a breaker of
		// its own, until the hour's volume is back under the ceiling.
		return e.WithDetail("opened_by", OpenedBySurge)
	}
	return e.WithDetail("opened_by", *c.OpenedBy).WithDetail("opened_at", c.OpenedAt).
		WithDetail("closes_at", c.ClosesAt)
}

// ListCircuits pages through the circuits of every effect type seen or
// configured, by type.
func (s *Service) ListCircuits(ctx context.Context, workspaceID, cursor string, limit int) ([]Circuit, error) {
	return s.circuits(ctx, s.pool, workspaceID, cursor, limit, "", s.clock())
}

// circuits reads up to limit circuits after cursor (only one's, when set)
// as they read at now, through q: the pool, or the transaction of the
// change an action answers with.
func (s *Service) circuits(ctx context.Context, q db.Querier, workspaceID, cursor string, limit int, one string,
	now time.Time) ([]Circuit, error) {
	rows, err := q.Query(ctx, sqlListCircuits, workspaceID, cursor, limit, now, one)
	if err != nil {
		return nil, fmt.Errorf("list circuits: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Circuit, error) { return scanCircuit(r) })
	if err != nil {
		return nil, fmt.Errorf("list circuits: %w", err)
	}
	return out, nil
}

// GetCircuit reads one effect type's circuit.
func (s *Service) GetCircuit(ctx context.Context, workspaceID, effectType string) (Circuit, error) {
	if err := checkEffectType(effectType); err != nil {
		return Circuit{}, err
	}
	return s.circuit(ctx, s.pool, workspaceID, effectType, s.clock())
}

func (s *Service) circuit(ctx context.Context, q db.Querier, workspaceID, effectType string, now time.Time) (Circuit, error) {
	cs, err := s.circuits(ctx, q, workspaceID, "", 1, effectType, now)
	if err != nil {
		return Circuit{}, err
	}
	return cs[0], nil
}

func (r *OpenCircuitRequest) validate() (action string, reason *string, err error) {
	var pr apierr.Problems
	action = ActionRequireApproval
	if r.Action != nil {
		action = *r.Action
		if !slices.Contains(surgeActions, action) {
			pr.Add("action", "must be one of %s", strings.Join(surgeActions, ", "))
		}
	}
	if r.Reason != nil && utf8.RuneCountInString(*r.Reason) > maxReasonRunes {
		pr.Add("reason", "must be at most %d characters", maxReasonRunes)
	}
	return action, r.Reason, pr.Err()
}

// OpenCircuit opens an effect type's breaker by hand. It has no cooldown:
// it stays open until closed.
func (s *Service) OpenCircuit(ctx context.Context, p *auth.Principal, effectType string, req OpenCircuitRequest) (Circuit, error) {
	if err := checkEffectType(effectType); err != nil {
		return Circuit{}, err
	}
	var c Circuit
	err := s.open(ctx, p, effectType, OpenedByManual, req, func(tx pgx.Tx, now time.Time) (err error) {
		c, err = s.circuit(ctx, tx, p.WorkspaceID, effectType, now)
		return err
	})
	return c, err
}

// Stop opens the emergency stop: every effect type, including types first
// seen while it is on, is held until Release.
func (s *Service) Stop(ctx context.Context, p *auth.Principal, req OpenCircuitRequest) ([]Circuit, error) {
	var cs []Circuit
	err := s.open(ctx, p, stopType, OpenedByStop, req, func(tx pgx.Tx, now time.Time) (err error) {
		cs, err = s.circuits(ctx, tx, p.WorkspaceID, "", MaxCircuitsAnswered+1, "", now)
		return err
	})
	return cs, err
}

// EmergencyStop is whether the workspace's emergency stop is on (GET
// /api/v1/circuits/stop): the one question the circuits list cannot answer
// when no effect type has been seen yet, or when every type is held by a
// stricter breaker of its own. Every field is always present, null while
// the stop is off.
type EmergencyStop struct {
	State    string     `json:"state" openapi:"enum=closed|open"`
	Action   *string    `json:"action" openapi:"enum=monitor|require_approval|deny"`
	Reason   *string    `json:"reason"`
	OpenedAt *time.Time `json:"opened_at"`
}

// GetEmergencyStop reads the emergency stop.
func (s *Service) GetEmergencyStop(ctx context.Context, workspaceID string) (EmergencyStop, error) {
	st := EmergencyStop{State: CircuitClosed}
	err := s.pool.QueryRow(ctx, sqlEmergencyStop, workspaceID).Scan(&st.Action, &st.Reason, &st.OpenedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return st, nil
	case err != nil:
		return st, fmt.Errorf("read emergency stop: %w", err)
	}
	st.State = CircuitOpen
	return st, nil
}

// MaxCircuitsAnswered bounds the list stop and release answer with: they
// read one more, so that the answer's next_cursor says when the workspace
// has more types (GET /api/v1/circuits?cursor= reads the rest).
const MaxCircuitsAnswered = 200

// answerIn reads what an action answers with, in the action's transaction
// after its change and with its clock, so that it answers the state it made
// (race QA: read after the commit, an open racing a close of the same type
// answered "closed", a stop racing a release a list the stop no longer held).
type answerIn func(tx pgx.Tx, now time.Time) error

func (s *Service) open(ctx context.Context, p *auth.Principal, effectType, by string, req OpenCircuitRequest,
	answer answerIn) error {
	action, reason, err := req.validate()
	if err != nil {
		return err
	}
	return db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockCircuitTurns(ctx, tx, p.WorkspaceID, effectType); err != nil {
			return fmt.Errorf("open circuit: %w", err)
		}
		now := s.clock()
		// A surge breaker whose cooldown ended is closed first, as the
		// sweeper would have: this opening is a new one. The close starts
		// an allowance, in the surge turn as every close does (close).
		if _, err := tx.Exec(ctx, sqlCloseLapsedCircuit, p.WorkspaceID, effectType, now,
			[]string{ids.NewAt(ids.Event, now)}); err != nil {
			return fmt.Errorf("open circuit: close lapsed: %w", err)
		}
		var wasBy, wasAction *string
		err := tx.QueryRow(ctx, sqlLockOpenCircuit, p.WorkspaceID, effectType, now).Scan(&wasBy, &wasAction)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("open circuit: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, sqlOpenCircuit, p.WorkspaceID, effectType, by, action, reason, now,
			ids.NewAt(ids.Event, now), wasBy, wasAction); err != nil {
			return fmt.Errorf("open circuit: %w", err)
		}
		return answer(tx, now)
	})
}

// CloseCircuit closes an effect type's breaker (surge or manual). The next
// surge count starts from here, a fresh allowance; the breaker stays armed.
// It does not lift the emergency stop. Closing a closed breaker is a no-op.
func (s *Service) CloseCircuit(ctx context.Context, p *auth.Principal, effectType string) (Circuit, error) {
	if err := checkEffectType(effectType); err != nil {
		return Circuit{}, err
	}
	var c Circuit
	err := s.close(ctx, p.WorkspaceID, effectType, func(tx pgx.Tx, now time.Time) (err error) {
		c, err = s.circuit(ctx, tx, p.WorkspaceID, effectType, now)
		return err
	})
	return c, err
}

// Release lifts the emergency stop; breakers of single types stay as they are.
func (s *Service) Release(ctx context.Context, p *auth.Principal) ([]Circuit, error) {
	var cs []Circuit
	err := s.close(ctx, p.WorkspaceID, stopType, func(tx pgx.Tx, now time.Time) (err error) {
		cs, err = s.circuits(ctx, tx, p.WorkspaceID, "", MaxCircuitsAnswered+1, "", now)
		return err
	})
	return cs, err
}

// close closes effectType's breaker ('*' lifts the stop). A type's close
// takes the type's surge turn first and only then reads the clock that the
// fresh allowance is measured from: begins that count the surge hold the
// turn for their whole transaction and are stamped as of when they got it
// (gate_begin_in_turn), so every begin stamped after the allowance's start
// is one that saw the breaker closed (race QA: read before waiting for the
// breaker's row, behind a burst the breaker was refusing, the clock put
// those refusals inside the new allowance, which they used up at once, and
// the next begin tripped it again). The converse holds because every close
// takes the turn (the sweeper's and an opening's of a lapsed breaker too):
// a begin holding it reads the allowance it is counted in for its whole
// transaction, and is stamped after the allowance's start however far
// behind its clock is (afterAllowanceSQL).
func (s *Service) close(ctx context.Context, workspaceID, effectType string, answer answerIn) error {
	return db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockCircuitTurns(ctx, tx, workspaceID, effectType); err != nil {
			return fmt.Errorf("close circuit: %w", err)
		}
		now := s.clock()
		if _, err := tx.Exec(ctx, sqlCloseCircuit, workspaceID, effectType, now,
			[]string{ids.NewAt(ids.Event, now)}); err != nil {
			return fmt.Errorf("close circuit: %w", err)
		}
		return answer(tx, now)
	})
}

// lockCircuitTurns takes effectType's turn among an operator's opens and
// closes, then, for a type (not the stop), its surge turn, in that order
// in both.
func lockCircuitTurns(ctx context.Context, tx pgx.Tx, workspaceID, effectType string) error {
	if _, err := tx.Exec(ctx, sqlLockCircuitTurn, workspaceID, effectType); err != nil {
		return fmt.Errorf("lock turn: %w", err)
	}
	if effectType == stopType {
		return nil
	}
	if _, err := tx.Exec(ctx, sqlLockSurgeTurn, workspaceID, effectType); err != nil {
		return fmt.Errorf("lock surge turn: %w", err)
	}
	return nil
}

// SweepCircuits closes up to limit surge breakers whose cooldown has passed
// and records circuit.closed for each. Begin already reads them as closed;
// this makes it durable and tells subscribers. A breaker whose type's surge
// turn is held is left to the holder or the next pass (sqlSweepCircuits).
func (s *Service) SweepCircuits(ctx context.Context, now time.Time, limit int) (int, error) {
	now = now.UTC().Truncate(time.Microsecond)
	var n int
	if err := s.pool.QueryRow(ctx, sqlSweepCircuits, now, limit, eventIDsAt(now, limit)).Scan(&n); err != nil {
		return 0, fmt.Errorf("sweep circuits: %w", err)
	}
	return n, nil
}

// spendDaysKept is how many past UTC days of ceiling counters are kept, so a
// failure reported a day late still releases its spend.
const spendDaysKept = 2

// SweepSpend deletes up to limit ceiling counters of days past.
func (s *Service) SweepSpend(ctx context.Context, now time.Time, limit int) (int, error) {
	y, m, d := now.UTC().Date()
	oldest := time.Date(y, m, d-spendDaysKept, 0, 0, 0, 0, time.UTC)
	tag, err := s.pool.Exec(ctx, sqlPruneSpend, oldest.Format(time.DateOnly), limit)
	if err != nil {
		return 0, fmt.Errorf("sweep spend counters: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

package jobs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// Endpoint is a service that jobs are sent to, with its retry policy and
// gates (API.md §5). The policy routes read and write this object.
type Endpoint struct {
	ID                 string       `json:"id"`
	Name               string       `json:"name"`
	Version            int64        `json:"version"`
	PolicyPreset       string       `json:"policyPreset" openapi:"enum=STANDARD|AGGRESSIVE|RELAXED|CUSTOM"`
	RetryPolicy        *RetryPolicy `json:"retryPolicy"` // the complete CUSTOM object, null for built-ins
	MaxAttempts        int          `json:"maxAttempts"`
	DefaultTimeoutMs   int64        `json:"defaultTimeoutMs"`
	MaxConcurrent      *int         `json:"maxConcurrent"`
	RateLimitPerMinute *int         `json:"rateLimitPerMinute"`
	Paused             bool         `json:"paused"`
	// CircuitFailureThreshold consecutive retryable failures open the
	// circuit (null: the breaker is off); CircuitCooldownMs later one claim
	// may lease a probe.
	CircuitFailureThreshold *int      `json:"circuitFailureThreshold"`
	CircuitCooldownMs       int64     `json:"circuitCooldownMs"`
	Circuit                 Circuit   `json:"circuit"`
	CreatedAt               time.Time `json:"createdAt"`
	UpdatedAt               time.Time `json:"updatedAt"`

	policy RetryPolicy
}

// Circuit is the endpoint's breaker state (migration 0018): closed, or open
// since OpenedAt, when claims skip the endpoint's jobs but for one probe
// lease at ProbeAt. ConsecutiveFailures counts retryable failures since the
// endpoint's last success.
type Circuit struct {
	State               string     `json:"state" openapi:"enum=closed|open"`
	OpenedAt            *time.Time `json:"openedAt"`
	ProbeAt             *time.Time `json:"probeAt"`
	ConsecutiveFailures int        `json:"consecutiveFailures"`
}

// Circuit states.
const (
	CircuitClosed = "closed"
	CircuitOpen   = "open"
)

// endpointPolicy is everything a policy PUT can change.
type endpointPolicy struct {
	RetryPolicy
	DefaultTimeoutMs        int64
	MaxConcurrent           *int
	RateLimitPerMinute      *int
	CircuitFailureThreshold *int
	CircuitCooldownMs       int64
}

func defaultEndpointPolicy() endpointPolicy {
	return endpointPolicy{RetryPolicy: Presets[PresetStandard], DefaultTimeoutMs: DefaultTimeoutMs,
		CircuitCooldownMs: DefaultCircuitCooldownMs}
}

// PolicyFields are the policy fields shared by POST /endpoints and PUT …/policy.
// Omitted fields keep their value; null clears a nullable field.
type PolicyFields struct {
	Preset             jsonx.Optional[string]  `json:"preset" openapi:"enum=STANDARD|AGGRESSIVE|RELAXED|CUSTOM,notNull"`
	MaxAttempts        jsonx.Optional[int64]   `json:"maxAttempts" openapi:"min=1,max=10,notNull"`
	InitialDelayMs     jsonx.Optional[int64]   `json:"initialDelayMs" openapi:"min=1,max=86400000,notNull"`
	Multiplier         jsonx.Optional[float64] `json:"multiplier" openapi:"min=1,max=10,notNull"`
	MaxDelayMs         jsonx.Optional[int64]   `json:"maxDelayMs" openapi:"min=1,max=86400000,notNull"`
	JitterPercent      jsonx.Optional[float64] `json:"jitterPercent" openapi:"min=0,max=100,notNull"`
	DefaultTimeoutMs   jsonx.Optional[int64]   `json:"defaultTimeoutMs" openapi:"min=1000,max=86400000,notNull"`
	MaxConcurrent      jsonx.Optional[int64]   `json:"maxConcurrent" openapi:"min=1,max=1000"`
	RateLimitPerMinute jsonx.Optional[int64]   `json:"rateLimitPerMinute" openapi:"min=1,max=100000"`
	// null turns the breaker off, closing an open circuit.
	CircuitFailureThreshold jsonx.Optional[int64] `json:"circuitFailureThreshold" openapi:"min=1,max=1000"`
	CircuitCooldownMs       jsonx.Optional[int64] `json:"circuitCooldownMs" openapi:"min=1000,max=86400000,notNull"`
}

// UpdatePolicyRequest is the body of PUT /api/v1/endpoints/{id}/policy.
type UpdatePolicyRequest struct {
	ExpectedVersion jsonx.Optional[int64] `json:"expectedVersion" openapi:"required,min=0"`
	PolicyFields
}

// CreateEndpointRequest is the body of POST /api/v1/endpoints. Its name's
// tag states validEndpointName's length (1-200 characters); the rest of
// that rule (printable, no white space at either end) only the handler
// states.
type CreateEndpointRequest struct {
	Name string `json:"name" openapi:"minLength=1,maxLength=200,printable"`
	PolicyFields
}

// merge applies f to cur and validates the result, naming every problem.
func (f PolicyFields) merge(cur endpointPolicy, p *apierr.Problems) endpointPolicy {
	notNull := func(field string, set, null bool) bool {
		if set && null {
			p.Add(field, "must not be null")
			return false
		}
		return set
	}
	preset, known := cur.Preset, true
	if notNull("preset", f.Preset.Set, f.Preset.Null) {
		switch f.Preset.Value {
		case PresetStandard, PresetAggressive, PresetRelaxed, PresetCustom:
			preset = f.Preset.Value
		default:
			p.Add("preset", "must be one of STANDARD, AGGRESSIVE, RELAXED, CUSTOM")
			known = false
		}
	}
	out := cur
	type custom struct {
		name string
		set  bool
		null bool
	}
	customs := []custom{
		{"maxAttempts", f.MaxAttempts.Set, f.MaxAttempts.Null},
		{"initialDelayMs", f.InitialDelayMs.Set, f.InitialDelayMs.Null},
		{"multiplier", f.Multiplier.Set, f.Multiplier.Null},
		{"maxDelayMs", f.MaxDelayMs.Set, f.MaxDelayMs.Null},
		{"jitterPercent", f.JitterPercent.Set, f.JitterPercent.Null},
	}
	switch {
	case !known:
		// The custom fields belong to a preset the body does not name, so
		// they are not judged; the gates below still are, each rule the
		// body breaks being listed (QA: an unknown preset hid a
		// maxConcurrent of 0, answered once the preset was fixed).
	case preset != PresetCustom:
		for _, c := range customs {
			if c.set {
				p.Add(c.name, "is only allowed with preset CUSTOM; built-in presets take no custom fields")
			}
		}
		out.RetryPolicy = Presets[preset]
	default:
		// A policy becoming CUSTOM must be complete; an existing CUSTOM
		// policy merges field by field.
		for _, c := range customs {
			if notNull(c.name, c.set, c.null) || cur.Preset == PresetCustom {
				continue
			}
			p.Add(c.name, "is required for a CUSTOM policy")
		}
		out.Preset = PresetCustom
		if f.MaxAttempts.Set && !f.MaxAttempts.Null {
			out.MaxAttempts = int(max(min(f.MaxAttempts.Value, math.MaxInt32), math.MinInt32))
			if f.MaxAttempts.Value < MinAttempts || f.MaxAttempts.Value > MaxAttemptsLimit {
				p.Add("maxAttempts", "%s", apierr.IntegerRule(MinAttempts, MaxAttemptsLimit))
			}
		}
		if f.InitialDelayMs.Set && !f.InitialDelayMs.Null {
			out.InitialDelayMs = f.InitialDelayMs.Value
			if out.InitialDelayMs < 1 || out.InitialDelayMs > MaxDelayLimitMs {
				p.Add("initialDelayMs", "%s", apierr.IntegerRule(1, MaxDelayLimitMs))
			}
		}
		if f.Multiplier.Set && !f.Multiplier.Null {
			out.Multiplier = f.Multiplier.Value
			if math.IsNaN(out.Multiplier) || out.Multiplier < 1 || out.Multiplier > MaxMultiplier {
				p.Add("multiplier", "must be a number from 1 to 10")
			}
		}
		if f.MaxDelayMs.Set && !f.MaxDelayMs.Null {
			out.MaxDelayMs = f.MaxDelayMs.Value
			if out.MaxDelayMs < 1 || out.MaxDelayMs > MaxDelayLimitMs {
				p.Add("maxDelayMs", "%s", apierr.IntegerRule(1, MaxDelayLimitMs))
			}
		}
		if f.JitterPercent.Set && !f.JitterPercent.Null {
			out.JitterPercent = f.JitterPercent.Value
			if math.IsNaN(out.JitterPercent) || out.JitterPercent < 0 || out.JitterPercent > MaxJitterPercent {
				p.Add("jitterPercent", "must be a number from 0 to 100")
			}
		}
		if out.MaxDelayMs < out.InitialDelayMs && out.InitialDelayMs > 0 {
			p.Add("maxDelayMs", "must be at least initialDelayMs")
		}
	}
	if notNull("defaultTimeoutMs", f.DefaultTimeoutMs.Set, f.DefaultTimeoutMs.Null) {
		out.DefaultTimeoutMs = f.DefaultTimeoutMs.Value
		if out.DefaultTimeoutMs < MinTimeoutMs || out.DefaultTimeoutMs > MaxTimeoutMs {
			p.Add("defaultTimeoutMs", "%s", apierr.IntegerRule(MinTimeoutMs, MaxTimeoutMs))
		}
	}
	out.MaxConcurrent = nullableInt(p, "maxConcurrent", f.MaxConcurrent, 1, MaxConcurrentMax, cur.MaxConcurrent)
	out.RateLimitPerMinute = nullableInt(p, "rateLimitPerMinute", f.RateLimitPerMinute, 1, RateLimitMax, cur.RateLimitPerMinute)
	out.CircuitFailureThreshold = nullableInt(p, "circuitFailureThreshold", f.CircuitFailureThreshold, 1,
		CircuitThresholdMax, cur.CircuitFailureThreshold)
	if notNull("circuitCooldownMs", f.CircuitCooldownMs.Set, f.CircuitCooldownMs.Null) {
		out.CircuitCooldownMs = f.CircuitCooldownMs.Value
		if out.CircuitCooldownMs < MinCircuitCooldownMs || out.CircuitCooldownMs > MaxDelayLimitMs {
			p.Add("circuitCooldownMs", "%s", apierr.IntegerRule(MinCircuitCooldownMs, MaxDelayLimitMs))
		}
	}
	return out
}

func nullableInt(p *apierr.Problems, field string, o jsonx.Optional[int64], lo, hi int64, cur *int) *int {
	switch {
	case !o.Set:
		return cur
	case o.Null:
		return nil
	case o.Value < lo || o.Value > hi:
		p.Add(field, "%s", apierr.IntegerRule(lo, hi))
		return cur
	}
	v := int(o.Value)
	return &v
}

// endpointNameRule says what validEndpointName takes.
const endpointNameRule = "must be 1-200 printable characters, without white space at either end"

// validEndpointName reports whether name can name an endpoint: unlike a
// tool's name it may hold spaces ("Stripe API"), but only the plain space,
// never at either end, and no other character that prints nothing (a
// control or format character, another space): look-alike names
// ("e\u200bx", " ex", "Stripe\u00a0API") were separate endpoints with their
// own pause, limits and circuit (jobs QA, final read).
func validEndpointName(name string) bool {
	return idemkey.Printable(name, 200) && strings.TrimSpace(name) == name
}

func scanEndpoint(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	var mc, rl, ct *int32
	var failures int32
	err := row.Scan(&e.ID, &e.Name, &e.Version, &e.policy.Preset, &e.policy.MaxAttempts, &e.policy.InitialDelayMs,
		&e.policy.Multiplier, &e.policy.MaxDelayMs, &e.policy.JitterPercent, &e.DefaultTimeoutMs, &mc, &rl,
		&e.Paused, &e.Circuit.State, &e.Circuit.OpenedAt, &e.CreatedAt, &e.UpdatedAt, &ct, &e.CircuitCooldownMs,
		&failures, &e.Circuit.ProbeAt)
	if err != nil {
		return e, err
	}
	e.MaxConcurrent, e.RateLimitPerMinute, e.CircuitFailureThreshold = intPtr(mc), intPtr(rl), intPtr(ct)
	e.Circuit.ConsecutiveFailures = int(failures)
	e.Circuit.OpenedAt, e.Circuit.ProbeAt = utc(e.Circuit.OpenedAt), utc(e.Circuit.ProbeAt)
	e.PolicyPreset = e.policy.Preset
	e.MaxAttempts = e.policy.MaxAttempts
	if e.policy.Preset == PresetCustom {
		rp := e.policy
		e.RetryPolicy = &rp
	}
	return e, nil
}

func intPtr(v *int32) *int {
	if v == nil {
		return nil
	}
	i := int(*v)
	return &i
}

func (e Endpoint) current() endpointPolicy {
	return endpointPolicy{RetryPolicy: e.policy, DefaultTimeoutMs: e.DefaultTimeoutMs,
		MaxConcurrent: e.MaxConcurrent, RateLimitPerMinute: e.RateLimitPerMinute,
		CircuitFailureThreshold: e.CircuitFailureThreshold, CircuitCooldownMs: e.CircuitCooldownMs}
}

// CreateEndpoint creates an endpoint ahead of its first job. An existing name
// answers the endpoint unchanged with created=false.
func (s *Service) CreateEndpoint(ctx context.Context, workspaceID string, req CreateEndpointRequest) (Endpoint, bool, error) {
	var p apierr.Problems
	if !validEndpointName(req.Name) {
		p.Add("name", endpointNameRule)
	}
	pol := req.PolicyFields.merge(defaultEndpointPolicy(), &p)
	if err := p.Err(); err != nil {
		return Endpoint{}, false, err
	}
	if e, err := s.endpointByName(ctx, s.pool, workspaceID, req.Name); err == nil {
		return e, false, nil
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, false, err
	}
	e, err := scanEndpoint(db.Writer(ctx, s.pool).QueryRow(ctx, sqlInsertEndpoint, policyArgs(ids.NewAt(ids.Endpoint, s.now()),
		workspaceID, req.Name, pol, s.now())...))
	if errors.Is(err, pgx.ErrNoRows) { // created concurrently
		e, err = s.endpointByName(ctx, s.pool, workspaceID, req.Name)
		return e, false, err
	}
	if err != nil {
		return Endpoint{}, false, fmt.Errorf("create endpoint: %w", err)
	}
	return e, true, nil
}

func policyArgs(id, workspaceID, name string, pol endpointPolicy, now time.Time) []any {
	return []any{id, workspaceID, name, pol.Preset, pol.MaxAttempts, pol.InitialDelayMs, pol.Multiplier,
		pol.MaxDelayMs, pol.JitterPercent, pol.DefaultTimeoutMs, pol.MaxConcurrent, pol.RateLimitPerMinute, now,
		pol.CircuitFailureThreshold, pol.CircuitCooldownMs}
}

func (s *Service) endpointByName(ctx context.Context, q db.Querier, workspaceID, name string) (Endpoint, error) {
	return scanEndpoint(q.QueryRow(ctx, sqlEndpointByName, workspaceID, name))
}

// endpointForEnqueue returns the named endpoint, creating it with the
// STANDARD preset on first use.
func (s *Service) endpointForEnqueue(ctx context.Context, q db.Querier, workspaceID, name string) (Endpoint, error) {
	for range 2 {
		e, err := s.endpointByName(ctx, q, workspaceID, name)
		if !errors.Is(err, pgx.ErrNoRows) {
			return e, err
		}
		e, err = scanEndpoint(q.QueryRow(ctx, sqlInsertEndpoint, policyArgs(ids.NewAt(ids.Endpoint, s.now()),
			workspaceID, name, defaultEndpointPolicy(), s.now())...))
		if !errors.Is(err, pgx.ErrNoRows) {
			return e, err
		}
	}
	return Endpoint{}, errors.New("enqueue endpoint: neither found nor created")
}

// ListEndpoints pages through the workspace's endpoints by id.
func (s *Service) ListEndpoints(ctx context.Context, workspaceID, cursor string, limit int) ([]Endpoint, error) {
	rows, err := s.pool.Query(ctx, sqlListEndpoints, workspaceID, cursor, limit)
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Endpoint, error) { return scanEndpoint(r) })
}

// GetEndpoint reads one endpoint.
func (s *Service) GetEndpoint(ctx context.Context, workspaceID, id string) (Endpoint, error) {
	e, err := scanEndpoint(s.pool.QueryRow(ctx, sqlEndpointByID, workspaceID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, apierr.NotFound("endpoint")
	}
	return e, err
}

// UpdatePolicy merges req into the endpoint's policy when expectedVersion is
// current, as a new version when that changed it. Existing jobs keep their
// snapshots.
func (s *Service) UpdatePolicy(ctx context.Context, workspaceID, id string, req UpdatePolicyRequest) (Endpoint, error) {
	var p apierr.Problems
	if !req.ExpectedVersion.Set || req.ExpectedVersion.Null {
		p.Add("expectedVersion", "is required (the version you last read)")
	} else if req.ExpectedVersion.Value < 0 {
		p.Add("expectedVersion", "%s", apierr.IntegerRule(0, typeMax))
	}
	cur, err := s.GetEndpoint(ctx, workspaceID, id)
	if err != nil {
		return Endpoint{}, err
	}
	pol := req.PolicyFields.merge(cur.current(), &p)
	if err := p.Err(); err != nil {
		return Endpoint{}, err
	}
	if req.ExpectedVersion.Value != cur.Version {
		return Endpoint{}, versionConflict(cur.Version)
	}
	if reflect.DeepEqual(pol, cur.current()) {
		// Nothing changed: no new version (QA: an empty update made one,
		// and every other writer's read stale with it).
		return cur, nil
	}
	var (
		e   Endpoint
		was Circuit // as the update found it: reports open and close it without a version
	)
	err = s.txRetrying(ctx, func(tx pgx.Tx) error {
		// The gate protocol (sql.go): wait for in-flight transitions out of
		// RUNNING, then recount under the row lock the update takes.
		if _, err := tx.Exec(ctx, sqlEndpointGateExclusive, id); err != nil {
			return fmt.Errorf("lock endpoint gate: %w", err)
		}
		if err := tx.QueryRow(ctx, sqlLockCircuit, workspaceID, id).Scan(&was.State, &was.OpenedAt); err != nil {
			return err
		}
		// Read once the locks are held: the rate window recounted is the
		// minute the write takes effect in (sqlRecountRate). Read before
		// the waits, a write that waited across a minute's end counted
		// the new minute's claims, committed meanwhile, into the old one,
		// and the new minute's first claim then started its window
		// afresh, those attempts uncounted (review).
		now := s.now()
		e, err = scanEndpoint(tx.QueryRow(ctx, sqlUpdatePolicy, id, workspaceID, pol.Preset, pol.MaxAttempts,
			pol.InitialDelayMs, pol.Multiplier, pol.MaxDelayMs, pol.JitterPercent, pol.DefaultTimeoutMs,
			pol.MaxConcurrent, pol.RateLimitPerMinute, now, req.ExpectedVersion.Value,
			pol.CircuitFailureThreshold, pol.CircuitCooldownMs))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlRecountRunning, id); err != nil {
			return fmt.Errorf("recount running: %w", err)
		}
		if pol.RateLimitPerMinute != nil && !reflect.DeepEqual(pol.RateLimitPerMinute, cur.RateLimitPerMinute) {
			// A limit set or changed holds for the minute it is set in.
			if _, err := tx.Exec(ctx, sqlRecountRate, id, now.Truncate(time.Minute)); err != nil {
				return fmt.Errorf("recount rate window: %w", err)
			}
		}
		if was.State == CircuitOpen && e.Circuit.State == CircuitClosed && was.OpenedAt != nil {
			// The breaker was turned off (null circuitFailureThreshold).
			return s.recordEvents(ctx, tx, []event{closedEvent(workspaceID, e.ID, e.Name, *was.OpenedAt,
				now, "policy")})
		}
		return nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		latest, gerr := s.GetEndpoint(ctx, workspaceID, id)
		if gerr != nil {
			return Endpoint{}, gerr
		}
		return Endpoint{}, versionConflict(latest.Version)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("update endpoint policy: %w", err)
	}
	if (was.State == CircuitOpen && e.Circuit.State == CircuitClosed) || loosened(cur.MaxConcurrent, e.MaxConcurrent) ||
		loosened(cur.RateLimitPerMinute, e.RateLimitPerMinute) {
		// The jobs the circuit or the limit held are claimable at once,
		// as after a resume (wake QA: a raised limit left them to the
		// waiting claims' next polls).
		s.wake.wakeAll(workspaceID)
	}
	return e, nil
}

// loosened reports whether a limit went from was to now by being raised or
// removed (nil: no limit).
func loosened(was, now *int) bool { return was != nil && (now == nil || *now > *was) }

// SetPaused pauses or resumes an endpoint. A paused endpoint accepts jobs but
// none is claimed, so no attempt is consumed; in-flight jobs may finish.
func (s *Service) SetPaused(ctx context.Context, workspaceID, id string, paused bool) (Endpoint, error) {
	var e Endpoint
	// In the request's transaction under an Idempotency-Key (db.Tx: in a
	// savepoint, which a deadlock's victim rolls back to), so that the
	// change commits with its kept answer.
	err := s.txRetrying(ctx, func(tx pgx.Tx) (err error) {
		e, err = scanEndpoint(tx.QueryRow(ctx, sqlSetPaused, workspaceID, id, paused, s.now()))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, apierr.NotFound("endpoint")
	}
	if err == nil && !paused {
		db.AfterCommit(ctx, func() { s.wake.wakeAll(workspaceID) }) // its held jobs are claimable again
	}
	return e, err
}

// versionConflict is apierr.VersionConflict with its detail in this route's
// camelCase (currentVersion): API.md never mixes the two within a route.
func versionConflict(current int64) *apierr.Error {
	e := apierr.VersionConflict(current)
	e.Detail = map[string]any{"currentVersion": current}
	return e
}

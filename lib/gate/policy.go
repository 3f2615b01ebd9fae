package gate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/money"
)

// Policy modes, indeterminate handling and surge actions (seed 003, "Policy").
const (
	ModeAllow           = "allow"
	ModeRequireApproval = "require_approval"
	ModeDeny            = "deny"

	OnIndeterminateBlock = "block"
	OnIndeterminateRetry = "retry"
	OnIndeterminateProbe = "probe"
)

// Limits of the policy table.
const (
	maxRequiredDimensions = 8
	maxDimensionLimits    = 8
)

var (
	modes           = []string{ModeAllow, ModeRequireApproval, ModeDeny}
	onIndeterminate = []string{OnIndeterminateBlock, OnIndeterminateRetry, OnIndeterminateProbe}
	surgeActions    = []string{"monitor", "require_approval", "deny"}

	// Effect types look like email.send or stripe:refund.create; no slash, so
	// that a type is always one path segment of /api/v1/policies/{effect_type}.
	effectTypeRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$`)
	// Dimension names look like recipient or customer_id.
	dimensionRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// EffectTypePattern and EffectTypeMaxLength are effectTypeRe as a JSON
// Schema states it (begin's openapi tags), for an effect type in a path or
// a filter.
const (
	EffectTypePattern   = `^[A-Za-z0-9][A-Za-z0-9._:-]*$`
	EffectTypeMaxLength = 100
)

// effectTypeRule is the message for a malformed effect type.
const effectTypeRule = "must be 1-100 characters: letters, digits, . _ : -"

// ValidEffectType reports whether s is a well-formed effect type.
func ValidEffectType(s string) bool { return effectTypeRe.MatchString(s) }

// DimensionLimit is one per-counterparty ceiling per UTC day.
type DimensionLimit struct {
	DailyMicros *int64 `json:"daily_micros" openapi:"min=0,max=1000000000000000000"`
	DailyCount  *int64 `json:"daily_count" openapi:"min=1"`
}

// DimensionLimitInput is one dimension's limit as a PUT sends it, kept as
// written: decodeDimensionLimit reads it strictly and names each problem at
// its own path (dimension_limits.<name>.daily_microz). The OpenAPI document
// states it as a DimensionLimit either of whose fields may be left out
// (lib/httpapi), not as any value (contract QA: a client generated from the
// document could not tell what a limit is).
type DimensionLimitInput json.RawMessage

// UnmarshalJSON keeps the limit's bytes, as json.RawMessage does.
func (d *DimensionLimitInput) UnmarshalJSON(b []byte) error {
	*d = append((*d)[:0], b...)
	return nil
}

// MarshalJSON writes the limit's bytes back as they were kept, as
// json.RawMessage does (without it a request re-encoded, by a test or a
// client built on these types, carried each limit as base64: the strict
// decoder's fuzz test found it).
func (d DimensionLimitInput) MarshalJSON() ([]byte, error) {
	return json.RawMessage(d).MarshalJSON()
}

// Policy is an effect type's policy. An unconfigured type reads as the safe
// default with version 0.
type Policy struct {
	EffectType                 string                    `json:"effect_type"`
	Version                    int64                     `json:"version"`
	Mode                       string                    `json:"mode" openapi:"enum=allow|require_approval|deny,notNull"`
	OnIndeterminate            string                    `json:"on_indeterminate" openapi:"enum=block|retry|probe,notNull"`
	LeaseSeconds               int                       `json:"lease_seconds" openapi:"min=5,max=3600,notNull"`
	MaxAttempts                int                       `json:"max_attempts" openapi:"min=1,max=50,notNull"`
	MaxCostMicros              *int64                    `json:"max_cost_micros" openapi:"min=0,max=1000000000000000000"`
	ApprovalAboveMicros        *int64                    `json:"approval_above_micros" openapi:"min=0,max=1000000000000000000"`
	DailyBudgetMicros          *int64                    `json:"daily_budget_micros" openapi:"min=0,max=1000000000000000000"`
	ReconcileEveryHours        *int                      `json:"reconcile_every_hours" openapi:"min=1,max=8760"`
	RequireCost                bool                      `json:"require_cost" openapi:"notNull"`
	RequiredDimensions         []string                  `json:"required_dimensions" openapi:"maxItems=8,itemPattern=^[A-Za-z0-9][A-Za-z0-9._-]*$,itemMaxLength=64,uniqueItems,notNull"` // [] for none (scanPolicy)
	DimensionLimits            map[string]DimensionLimit `json:"dimension_limits" openapi:"maxProperties=8,keyPattern=^[A-Za-z0-9][A-Za-z0-9._-]*$,keyMaxLength=64"`
	StructuringThresholdMicros *int64                    `json:"structuring_threshold_micros" openapi:"min=0,max=1000000000000000000"`
	SurgePerHour               *int                      `json:"surge_per_hour" openapi:"min=1,max=1000000000"`
	SurgeMultiplier            *int                      `json:"surge_multiplier" openapi:"min=2,max=1000"`
	SurgeAction                string                    `json:"surge_action" openapi:"enum=monitor|require_approval|deny,notNull"`
	SurgeCooldownSeconds       int                       `json:"surge_cooldown_seconds" openapi:"min=60,max=86400,notNull"`
	RetentionDays              int                       `json:"retention_days" openapi:"min=1,max=400,notNull"`
	UpdatedAt                  *time.Time                `json:"updated_at"`
	// LastReconciledAt is when the type was last reconciled (POST
	// /api/v1/reconcile), null before the first: where its
	// reconcile_every_hours calendar restarts. Read-only: a PUT naming it is
	// refused as an unknown field.
	LastReconciledAt *time.Time `json:"last_reconciled_at"`
}

// PutPolicyRequest is the body of PUT /api/v1/policies/{effect_type}: omitted
// fields keep their value, null clears a nullable field.
type PutPolicyRequest struct {
	ExpectedVersion            *int64                                         `json:"expected_version,omitempty" openapi:"min=0"`
	Mode                       jsonx.Optional[string]                         `json:"mode" openapi:"enum=allow|require_approval|deny,notNull"`
	OnIndeterminate            jsonx.Optional[string]                         `json:"on_indeterminate" openapi:"enum=block|retry|probe,notNull"`
	LeaseSeconds               jsonx.Optional[int]                            `json:"lease_seconds" openapi:"min=5,max=3600,notNull"`
	MaxAttempts                jsonx.Optional[int]                            `json:"max_attempts" openapi:"min=1,max=50,notNull"`
	MaxCostMicros              jsonx.Optional[int64]                          `json:"max_cost_micros" openapi:"min=0,max=1000000000000000000"`
	ApprovalAboveMicros        jsonx.Optional[int64]                          `json:"approval_above_micros" openapi:"min=0,max=1000000000000000000"`
	DailyBudgetMicros          jsonx.Optional[int64]                          `json:"daily_budget_micros" openapi:"min=0,max=1000000000000000000"`
	ReconcileEveryHours        jsonx.Optional[int]                            `json:"reconcile_every_hours" openapi:"min=1,max=8760"`
	RequireCost                jsonx.Optional[bool]                           `json:"require_cost" openapi:"notNull"`
	RequiredDimensions         jsonx.Optional[[]string]                       `json:"required_dimensions" openapi:"maxItems=8,itemPattern=^[A-Za-z0-9][A-Za-z0-9._-]*$,itemMaxLength=64,uniqueItems"`
	DimensionLimits            jsonx.Optional[map[string]DimensionLimitInput] `json:"dimension_limits" openapi:"maxProperties=8,keyPattern=^[A-Za-z0-9][A-Za-z0-9._-]*$,keyMaxLength=64"`
	StructuringThresholdMicros jsonx.Optional[int64]                          `json:"structuring_threshold_micros" openapi:"min=0,max=1000000000000000000"`
	SurgePerHour               jsonx.Optional[int]                            `json:"surge_per_hour" openapi:"min=1,max=1000000000"`
	SurgeMultiplier            jsonx.Optional[int]                            `json:"surge_multiplier" openapi:"min=2,max=1000"`
	SurgeAction                jsonx.Optional[string]                         `json:"surge_action" openapi:"enum=monitor|require_approval|deny,notNull"`
	SurgeCooldownSeconds       jsonx.Optional[int]                            `json:"surge_cooldown_seconds" openapi:"min=60,max=86400,notNull"`
	RetentionDays              jsonx.Optional[int]                            `json:"retention_days" openapi:"min=1,max=400,notNull"`
}

// required sets a non-nullable field: null is refused, omitted keeps.
func required[T any](pr *apierr.Problems, field string, o jsonx.Optional[T], dst *T) {
	switch {
	case !o.Set:
	case o.Null:
		pr.Add(field, "must not be null")
	default:
		*dst = o.Value
	}
}

// merge applies the request onto p and validates the result, naming every
// problem. approval_threshold_above_ceiling is its own error code, reported
// only when the rest is valid.
func (r *PutPolicyRequest) merge(p *Policy) error {
	var pr apierr.Problems
	required(&pr, "mode", r.Mode, &p.Mode)
	required(&pr, "on_indeterminate", r.OnIndeterminate, &p.OnIndeterminate)
	required(&pr, "lease_seconds", r.LeaseSeconds, &p.LeaseSeconds)
	required(&pr, "max_attempts", r.MaxAttempts, &p.MaxAttempts)
	required(&pr, "require_cost", r.RequireCost, &p.RequireCost)
	required(&pr, "surge_action", r.SurgeAction, &p.SurgeAction)
	required(&pr, "surge_cooldown_seconds", r.SurgeCooldownSeconds, &p.SurgeCooldownSeconds)
	required(&pr, "retention_days", r.RetentionDays, &p.RetentionDays)
	r.MaxCostMicros.Apply(&p.MaxCostMicros)
	r.ApprovalAboveMicros.Apply(&p.ApprovalAboveMicros)
	r.DailyBudgetMicros.Apply(&p.DailyBudgetMicros)
	r.ReconcileEveryHours.Apply(&p.ReconcileEveryHours)
	r.StructuringThresholdMicros.Apply(&p.StructuringThresholdMicros)
	r.SurgePerHour.Apply(&p.SurgePerHour)
	r.SurgeMultiplier.Apply(&p.SurgeMultiplier)
	if r.RequiredDimensions.Set {
		p.RequiredDimensions = r.RequiredDimensions.Value // null clears
	}
	if r.DimensionLimits.Set {
		p.DimensionLimits = map[string]DimensionLimit{}
		for _, name := range sortedKeys(r.DimensionLimits.Value) {
			lim, sub, err := decodeDimensionLimit(json.RawMessage(r.DimensionLimits.Value[name]))
			if err != nil {
				pr.Add("dimension_limits."+name+sub, "%s", err.Error())
				continue
			}
			p.DimensionLimits[name] = lim
		}
	}
	if p.RequiredDimensions == nil {
		p.RequiredDimensions = []string{}
	}
	if p.DimensionLimits == nil {
		p.DimensionLimits = map[string]DimensionLimit{}
	}
	p.validate(&pr)
	if err := pr.Err(); err != nil {
		return err
	}
	if p.ApprovalAboveMicros != nil && p.MaxCostMicros != nil && *p.ApprovalAboveMicros > *p.MaxCostMicros {
		return apierr.Of(apierr.CodeApprovalAboveCeiling,
			"approval_above_micros sits above max_cost_micros, so it could never fire.").
			WithDetail("validation", []apierr.FieldError{{Field: "approval_above_micros",
				Message: "must not exceed max_cost_micros"}})
	}
	return nil
}

// setsThresholdAndCeiling says whether the request sends both
// approval_above_micros and max_cost_micros, neither null: whether they
// break their rule is then the request's alone, whatever is stored.
func (r *PutPolicyRequest) setsThresholdAndCeiling() bool {
	return r.ApprovalAboveMicros.Ptr() != nil && r.MaxCostMicros.Ptr() != nil
}

// decodeDimensionLimit reads {"daily_micros": n|null, "daily_count": n|null}
// strictly: an unknown field is a typo that would silently lift a ceiling.
// sub is the offending inner field's path suffix (".bogus"), so the problem
// is named by its dotted path from the body root (API.md §5); "" blames the
// whole limit.
func decodeDimensionLimit(raw json.RawMessage) (lim DimensionLimit, sub string, err error) {
	const shape = `{"daily_micros": integer|null, "daily_count": integer|null}`
	// Names are exact, as everywhere in a body (encoding/json below would
	// take DAILY_MICROS). A repeated key never reaches here: the router's
	// strict check refuses it in any object.
	if sub, err := limitKeys(raw, shape); err != nil {
		return lim, sub, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	derr := dec.Decode(&lim)
	var typ *json.UnmarshalTypeError
	switch {
	case derr == nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")):
		return lim, "", nil
	case derr != nil && strings.HasPrefix(derr.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(derr.Error(), "json: unknown field "))
		return lim, "." + name, errors.New("is not a known field; a limit is " + shape)
	case errors.As(derr, &typ) && typ.Field != "":
		// A number out of the field's range or no integer (1.5) is told
		// the field's bounds, as any other bounded integer's (ops QA: it
		// read only "must be an integer or null"); a string, its type.
		if strings.HasPrefix(typ.Value, "number") {
			switch typ.Field {
			case "daily_micros":
				return lim, "." + typ.Field, errors.New(money.Rule + ", or null")
			case "daily_count":
				return lim, "." + typ.Field, errors.New("must be an integer of at least 1, or null")
			}
		}
		return lim, "." + typ.Field, errors.New("must be an integer or null")
	}
	return lim, "", errors.New("must be " + shape)
}

// limitKeys checks the keys of a limit object as written: each must be one
// of the two fields, spelt exactly. Anything that is not an object is left
// to the decoder's shape check.
func limitKeys(raw json.RawMessage, shape string) (sub string, err error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", nil
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", nil
		}
		if k, _ := tok.(string); k != "daily_micros" && k != "daily_count" {
			return "." + k, errors.New("is not a known field (field names are case-sensitive); a limit is " + shape)
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return "", nil
		}
	}
	return "", nil
}

func (p *Policy) validate(pr *apierr.Problems) {
	oneOf := func(field, v string, allowed []string) {
		for _, a := range allowed {
			if v == a {
				return
			}
		}
		pr.Add(field, "must be one of %s", strings.Join(allowed, ", "))
	}
	between := func(field string, v *int, lo, hi int) {
		if v != nil && (*v < lo || *v > hi) {
			pr.Add(field, "must be an integer from %d to %d", lo, hi) // as 1.5 is told (lib/jsonstrict)
		}
	}
	amount := func(field string, v *int64) {
		if v != nil && !money.Valid(*v) {
			pr.Add(field, money.Rule)
		}
	}
	oneOf("mode", p.Mode, modes)
	oneOf("on_indeterminate", p.OnIndeterminate, onIndeterminate)
	oneOf("surge_action", p.SurgeAction, surgeActions)
	between("lease_seconds", &p.LeaseSeconds, 5, 3600)
	between("max_attempts", &p.MaxAttempts, 1, 50)
	between("reconcile_every_hours", p.ReconcileEveryHours, 1, 8760)
	between("surge_cooldown_seconds", &p.SurgeCooldownSeconds, 60, 86400)
	between("retention_days", &p.RetentionDays, 1, 400)
	// The columns are integers: an unbounded value failed the write (500).
	between("surge_per_hour", p.SurgePerHour, 1, 1_000_000_000)
	between("surge_multiplier", p.SurgeMultiplier, 2, 1000)
	amount("max_cost_micros", p.MaxCostMicros)
	amount("approval_above_micros", p.ApprovalAboveMicros)
	amount("daily_budget_micros", p.DailyBudgetMicros)
	amount("structuring_threshold_micros", p.StructuringThresholdMicros)
	if len(p.RequiredDimensions) > maxRequiredDimensions {
		pr.Add("required_dimensions", "may list at most %d dimensions", maxRequiredDimensions)
	}
	seen := map[string]bool{}
	for i, d := range p.RequiredDimensions {
		if !dimensionRe.MatchString(d) {
			pr.Add(fmt.Sprintf("required_dimensions.%d", i), "must be a dimension name (letters, digits, . _ -; up to 64)")
		}
		if seen[d] {
			pr.Add(fmt.Sprintf("required_dimensions.%d", i), "is listed twice")
		}
		seen[d] = true
	}
	if len(p.DimensionLimits) > maxDimensionLimits {
		pr.Add("dimension_limits", "may hold at most %d dimensions", maxDimensionLimits)
	}
	for _, name := range sortedKeys(p.DimensionLimits) {
		lim := p.DimensionLimits[name]
		if !dimensionRe.MatchString(name) {
			pr.Add("dimension_limits."+name, "must be keyed by a dimension name (letters, digits, . _ -; up to 64)")
		}
		amount("dimension_limits."+name+".daily_micros", lim.DailyMicros)
		if lim.DailyMicros == nil && lim.DailyCount == nil {
			// It would limit nothing, yet make the dimension required
			// (dimension_required) on every begin: a mistake, not a policy.
			pr.Add("dimension_limits."+name, "must set daily_micros or daily_count")
		}
		if lim.DailyCount != nil && *lim.DailyCount < 1 {
			pr.Add("dimension_limits."+name+".daily_count", "must be an integer of at least 1, or null")
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func scanPolicy(row pgx.Row, effectType string) (Policy, error) {
	p := Policy{EffectType: effectType}
	var limits []byte
	err := row.Scan(&p.Version, &p.Mode, &p.OnIndeterminate, &p.LeaseSeconds, &p.MaxAttempts,
		&p.MaxCostMicros, &p.ApprovalAboveMicros, &p.DailyBudgetMicros, &p.ReconcileEveryHours,
		&p.RequireCost, &p.RequiredDimensions, &limits, &p.StructuringThresholdMicros,
		&p.SurgePerHour, &p.SurgeMultiplier, &p.SurgeAction, &p.SurgeCooldownSeconds, &p.RetentionDays,
		&p.UpdatedAt, &p.LastReconciledAt)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(limits, &p.DimensionLimits); err != nil {
		return p, fmt.Errorf("policy dimension_limits: %w", err)
	}
	if p.RequiredDimensions == nil {
		p.RequiredDimensions = []string{}
	}
	return p, nil
}

// checkEffectType refuses a path's effect type that no begin could name:
// a 400 at the field, as PUT /policies/{type} answers (QA: reads answered
// 404 "no such effect type", while any valid type reads as a default).
func checkEffectType(effectType string) error {
	if !ValidEffectType(effectType) {
		return apierr.InvalidField("effect_type", effectTypeRule)
	}
	return nil
}

// GetPolicy returns the effect type's policy, or the safe default (version 0).
func (s *Service) GetPolicy(ctx context.Context, workspaceID, effectType string) (Policy, error) {
	if err := checkEffectType(effectType); err != nil {
		return Policy{}, err
	}
	p, err := scanPolicy(s.pool.QueryRow(ctx, sqlGetPolicy, workspaceID, effectType), effectType)
	if err != nil {
		return Policy{}, fmt.Errorf("get policy: %w", err)
	}
	return p, nil
}

// ListPolicies pages through the configured policies by effect type.
func (s *Service) ListPolicies(ctx context.Context, workspaceID, cursor string, limit int) ([]Policy, error) {
	rows, err := s.pool.Query(ctx, sqlListPolicies, workspaceID, cursor, limit)
	if err != nil {
		return nil, fmt.Errorf("list policies: %w", err)
	}
	defer rows.Close()
	var out []Policy
	for rows.Next() {
		var et string
		p, err := scanPolicy(prefixedRow{rows, &et}, "")
		if err != nil {
			return nil, fmt.Errorf("list policies: %w", err)
		}
		p.EffectType = et
		out = append(out, p)
	}
	return out, rows.Err()
}

// prefixedRow scans a leading column into first, then the rest as usual.
type prefixedRow struct {
	rows  pgx.Rows
	first any
}

func (r prefixedRow) Scan(dest ...any) error { return r.rows.Scan(append([]any{r.first}, dest...)...) }

// PutPolicy merges req into the type's policy (or the default) and bumps its
// version when that changed it. Concurrent writers of one type take turns under a
// transaction-scoped lock, so each reads what the one before it wrote.
func (s *Service) PutPolicy(ctx context.Context, workspaceID, effectType string, req PutPolicyRequest) (Policy, error) {
	if err := checkEffectType(effectType); err != nil {
		return Policy{}, err
	}
	if req.ExpectedVersion != nil && *req.ExpectedVersion < 0 {
		// No policy ever had it: a malformed request, not a stale one (QA),
		// told the rule the decoder tells 1.5 (an int64 from 0).
		return Policy{}, apierr.InvalidField("expected_version", "%s", apierr.IntegerRule(0, "2^63-1"))
	}
	// Concurrent writers of one type take turns: each merges into what the
	// one before it wrote. (Optimistic retries gave up under contention
	// and answered 500; a type's first write has no row to lock.)
	var (
		out       Policy
		shortenTo int // the retention lowered to, if it was
		// spentFrom, spentTo: the attempts from which a failed effect of
		// the type is now spent, and from which it was before, when
		// max_attempts was lowered (settleSpentGroups).
		spentFrom, spentTo int
	)
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLockPolicy, workspaceID, effectType); err != nil {
			return fmt.Errorf("lock policy: %w", err)
		}
		p, err := scanPolicy(tx.QueryRow(ctx, sqlGetPolicy, workspaceID, effectType), effectType)
		if err != nil {
			return fmt.Errorf("read policy: %w", err)
		}
		before, err := json.Marshal(p)
		if err != nil {
			return err
		}
		was := p // merge replaces the dimension limits' map, never edits it
		// API.md §5: expected_version, when sent, must equal the version,
		// even for a PUT that would change nothing. A request invalid
		// whatever the version is refused as such first (fuzz QA:
		// lease_seconds 0 answered version_conflict); one that breaks a
		// rule only with the stored fields it did not read (an approval
		// threshold above a ceiling set since) is stale (review).
		// A threshold above a ceiling the request sends with it is
		// invalid whatever the version (QA: it answered version_conflict,
		// and the PUT sent again at the fresh version was then refused).
		stale := req.ExpectedVersion != nil && *req.ExpectedVersion != p.Version
		if err := req.merge(&p); err != nil &&
			!(stale && apierr.HasCode(err, apierr.CodeApprovalAboveCeiling) && !req.setsThresholdAndCeiling()) {
			return err
		}
		if stale {
			return apierr.VersionConflict(p.Version)
		}
		if after, err := json.Marshal(p); err == nil && p.Version > 0 && bytes.Equal(before, after) {
			// Nothing changed (an empty body, or the values it has): no new
			// version, as a repeated PUT must not make one (QA). A type's
			// first PUT writes even so: it configures the type. The groups
			// are dated again all the same: a repeat is how a client
			// retries a PUT whose dating failed after its policy committed.
			out = p
			if req.RetentionDays.Set {
				shortenTo = p.RetentionDays
				return markGroupsToDate(ctx, tx, workspaceID, effectType, shortenTo, false, s.clock())
			}
			return nil
		}
		if p.RetentionDays < was.RetentionDays {
			shortenTo = p.RetentionDays
		}
		if p.MaxAttempts < was.MaxAttempts {
			spentFrom, spentTo = p.MaxAttempts, was.MaxAttempts
		}
		surgeOn := p.SurgePerHour != nil || p.SurgeMultiplier != nil
		turnedOff := !surgeOn && (was.SurgePerHour != nil || was.SurgeMultiplier != nil)
		retuned := surgeOn && p.SurgeAction != was.SurgeAction
		// Turning surge on, or changing its threshold, takes no surge
		// turn: it changes no breaker, and the policy turn this write holds
		// already orders it with every begin of the type, which holds that
		// turn shared while it reads the policy (twice: sqlBeginFast), so
		// each begin is decided wholly under the policy before or wholly
		// under this one.
		if turnedOff || retuned {
			// Begins that count the surge take this lock for their whole
			// transaction (gate_begin_in_turn): one evaluated under the
			// old policy trips before the close (or the new action) below,
			// and one that waits reads the new policy (review: a trip
			// landing between the close and a begin's evaluation kept a
			// breaker open).
			if _, err := tx.Exec(ctx, sqlLockSurgeTurn, workspaceID, effectType); err != nil {
				return fmt.Errorf("lock surge turn: %w", err)
			}
		}
		now := s.clock()
		out, err = s.writePolicy(ctx, tx, workspaceID, p, now)
		if errors.Is(err, pgx.ErrNoRows) {
			// The version moved under the lock: only a writer that skips
			// it could cause that; answer the conflict, not a 500.
			return apierr.VersionConflict(p.Version)
		}
		if err != nil {
			return err
		}
		if was.ceilingsAdded(p) {
			if err := chargeEarlierGrants(ctx, tx, workspaceID, effectType, now); err != nil {
				return err
			}
		}
		if retuned {
			// The surge's breaker, open, holds with the new action from now.
			if _, err := tx.Exec(ctx, sqlRetuneSurgeCircuit, workspaceID, effectType, p.SurgeAction, now,
				ids.NewAt(ids.Event, now)); err != nil {
				return fmt.Errorf("retune surge breaker: %w", err)
			}
		}
		if turnedOff {
			// Surge turned off: a breaker the surge opened closes with it
			// (QA: it went on denying until its cooldown, up to a day).
			// One an operator opened stays as they set it.
			if _, err := tx.Exec(ctx, sqlCloseSurgeCircuit, workspaceID, effectType, now,
				[]string{ids.NewAt(ids.Event, now)}); err != nil {
				return fmt.Errorf("close surge breaker: %w", err)
			}
		}
		if shortenTo != 0 {
			return markGroupsToDate(ctx, tx, workspaceID, effectType, shortenTo, true, now)
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	if spentFrom != 0 {
		// Failures the lowered max_attempts has spent may end rollbacks:
		// settled now, once the policy has committed, as a step's outcome
		// settles its group (afterStep), not at the next read or sweep:
		// the group's stored state (a list by state reads it) follows
		// the write.
		// Under an Idempotency-Key, once the request's transaction has
		// committed (its locks released), as the dating below.
		if db.InRequest(ctx) {
			db.AfterCommit(ctx, func() {
				s.settleSpentGroups(db.AfterRequest(ctx), workspaceID, effectType, spentFrom, spentTo)
			})
		} else {
			s.settleSpentGroups(db.Unchecked(ctx), workspaceID, effectType, spentFrom, spentTo)
		}
	}
	if shortenTo == 0 {
		return out, nil
	}
	if db.InRequest(ctx) {
		// Under an Idempotency-Key the policy's transaction is the
		// request's, whose locks (the policy and surge turns, the charges)
		// last until it commits: the groups are dated once it has, in a
		// transaction of their own as without the header (joined, they
		// would be locked behind those, the order shortenKeptGroups keeps
		// away from). Never when it rolled back, and not again when the
		// request is answered again from its key. A failure cannot be
		// answered (the answer is kept already): it is logged, and the
		// sweeper dates them (groups.retention_lowered), as the PUT sent
		// again under another key, or none, does.
		db.AfterCommit(ctx, func() {
			if err := s.shortenKeptGroups(db.AfterRequest(ctx), workspaceID, effectType); err != nil {
				s.logger.Warn("kept groups not dated by a lowered retention", "effect_type", effectType, "err", err)
			}
		})
		return out, nil
	}
	// The policy has committed: the dating follows from it, and a key
	// revoked since fails it no more (a 401 would say nothing changed).
	// committedThen: a database failing the dating is answered outcome
	// unknown, never not_applied (the policy stands; the PUT sent again
	// answers it and dates the groups).
	return out, committedThen(s.shortenKeptGroups(db.Unchecked(ctx), workspaceID, effectType))
}

// settleSpentGroups settles up to spentSettles rollbacks of workspaceID
// holding an effect of effectType that failed (or was denied) after from
// attempts or more, fewer than to: spent since max_attempts was lowered
// from to to from, so a compensation that waited for a retry is final,
// and its rollback may end (unwind_failed). The sweeper (SweepGroups)
// settles those past the bound, and any whose settle fails: a failure is
// logged, not answered, as a reconciliation's (endRollbacks), since the
// policy has committed and a repeated PUT, changing nothing, settles
// nothing. One that fails does not stop those after it (sweep.GoOn).
func (s *Service) settleSpentGroups(ctx context.Context, workspaceID, effectType string, from, to int) {
	groups, err := db.CollectIDs(s.pool.Query(ctx, sqlSpentAmongUnwinding, workspaceID, effectType, from, to,
		spentSettles))
	if err != nil {
		s.logger.Warn("rollbacks a lowered max_attempts may end not read", "effect_type", effectType, "err", err)
		return
	}
	s.settleEach(ctx, workspaceID, groups, "lowered max_attempts")
}

// spentSettles bounds the rollbacks a policy write settles (a transaction
// each, after its answer is decided); the sweeper takes the rest.
const spentSettles = 100

// shortenKeptGroups dates again the ended groups holding an effect of a
// type whose retention was just lowered: they were dated by the longest
// retention of their steps' types when they ended, and a shorter one
// applies to them from now, as to every other effect of the type. Batch
// after batch of datingBatch groups (dateGroupsBatch), each in a
// transaction of its own, once the policy is committed: it needs no more
// than that, and the policy's transaction may hold effects (its charges)
// that a step's retry holds before its group, or the surge turn that a
// grouped begin waits for holding its group (review: deadlocks). At most
// datingBatchesPerWrite batches: the sweeper dates what is left
// (groups.retention_lowered), so one write is bounded however many groups
// the type has. Should a batch fail, the policy is written all the same
// and the error is answered (only logged under an Idempotency-Key, whose
// answer is kept already); the same PUT again, under another key or none,
// dates them from where the last batch left off (it runs on a PUT that
// changes nothing too), and so does the sweeper.
func (s *Service) shortenKeptGroups(ctx context.Context, workspaceID, effectType string) error {
	for range s.datingBatches {
		_, more, err := s.dateGroupsBatch(ctx, workspaceID, effectType, s.datingBatch, true, s.clock())
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// datingBatch groups a batch of a policy write's dating, and
// datingBatchesPerWrite batches at most (10 000 groups): the sweeper's
// batches (groups.retention_lowered) date the rest.
const (
	datingBatch           = 100
	datingBatchesPerWrite = 100
)

// markGroupsToDate records in tx, the policy write's, at now, that the
// ended groups of a type whose retention it lowers to days (lowers; else
// it repeats the retention) are to be dated again (sqlMarkGroupsToDate):
// a lowering dates them from the first again. Dating them (dateGroupsBatch) marks the
// record batched, the sweeper dates them should that fail
// (SweepGroupsToDate), and its final pass endsInFlight after now, over the
// groups ended from endsInFlight before it, dates those whose end raced
// the write and deletes the record. The last statement of the write.
func markGroupsToDate(ctx context.Context, tx pgx.Tx, workspaceID, effectType string, days int, lowers bool,
	now time.Time) error {
	if _, err := tx.Exec(ctx, sqlMarkGroupsToDate, workspaceID, effectType, days, now.Add(endsInFlight).UTC(),
		now.Add(-endsInFlight).UTC(), lowers); err != nil {
		return fmt.Errorf("mark groups to date: %w", err)
	}
	return nil
}

// ceilingsAdded says whether next sets a daily ceiling on money or count
// that p did not (a type budget, a dimension's limit, a dimension's money
// limit where it had a count only): begins under p were not charged to it,
// so the day's earlier grants must be (sqlChargeEarlierGrants). Every
// charge of a dimension's limit counts 1, so a count limit added beside a
// money one needs nothing more.
func (p Policy) ceilingsAdded(next Policy) bool {
	if next.DailyBudgetMicros != nil && p.DailyBudgetMicros == nil {
		return true
	}
	for name, lim := range next.DimensionLimits {
		had, ok := p.DimensionLimits[name]
		if !ok || (lim.DailyMicros != nil && had.DailyMicros == nil) {
			return true
		}
	}
	return false
}

// chargeEarlierGrants charges the type's grants of now's UTC day to the
// ceilings its policy now sets (sqlChargeEarlierGrants). Without JIT
// compilation: its plan's cost estimates can pass the threshold at which
// PostgreSQL compiles it, which took longer (over a second) than running
// it.
func chargeEarlierGrants(ctx context.Context, tx pgx.Tx, workspaceID, effectType string, now time.Time) error {
	if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
		return fmt.Errorf("charge the day's earlier grants: turn jit off: %w", err)
	}
	day := now.UTC().Truncate(24 * time.Hour)
	_, err := tx.Exec(ctx, sqlChargeEarlierGrants, workspaceID, effectType, day, day.Add(24*time.Hour))
	if _, refused := refusedCeiling(err); refused {
		return apierr.InvalidState("The type's declared spend granted today is too large to count against " +
			"a daily ceiling (over 8e18 micros); set max_cost_micros, or set the ceiling tomorrow.")
	}
	if err != nil {
		return fmt.Errorf("charge the day's earlier grants: %w", err)
	}
	return nil
}

// writePolicy upserts p as version p.Version+1.
func (s *Service) writePolicy(ctx context.Context, q db.Querier, workspaceID string, p Policy, now time.Time) (Policy, error) {
	limits, err := json.Marshal(p.DimensionLimits)
	if err != nil {
		return Policy{}, err
	}
	var sql = sqlUpdatePolicy
	if p.Version == 0 {
		sql = sqlInsertPolicy
	}
	out, err := scanPolicy(q.QueryRow(ctx, sql, workspaceID, p.EffectType, p.Version, p.Mode, p.OnIndeterminate,
		p.LeaseSeconds, p.MaxAttempts, p.MaxCostMicros, p.ApprovalAboveMicros, p.DailyBudgetMicros,
		p.ReconcileEveryHours, p.RequireCost, p.RequiredDimensions, string(limits),
		p.StructuringThresholdMicros, p.SurgePerHour, p.SurgeMultiplier, p.SurgeAction,
		p.SurgeCooldownSeconds, p.RetentionDays, now), p.EffectType)
	if err != nil {
		return Policy{}, fmt.Errorf("write policy: %w", err)
	}
	return out, nil
}

// starterPolicies are seeded into every new workspace: money-moving types
// must declare their cost, so a spend ceiling set later cannot be bypassed,
// and get fewer attempts than the default.
var starterPolicies = []struct {
	effectType string
	req        PutPolicyRequest
}{
	{"payment.charge", PutPolicyRequest{RequireCost: jsonx.Optional[bool]{Set: true, Value: true},
		MaxAttempts: jsonx.Optional[int]{Set: true, Value: 3}}},
	{"refund.issue", PutPolicyRequest{RequireCost: jsonx.Optional[bool]{Set: true, Value: true},
		MaxAttempts: jsonx.Optional[int]{Set: true, Value: 3}}},
}

// SeedStarterPolicies writes the starter policies inside the signup
// transaction (an auth.Seeder).
func (s *Service) SeedStarterPolicies(ctx context.Context, tx pgx.Tx, workspaceID string) error {
	now := s.clock()
	for _, sp := range starterPolicies {
		p, err := scanPolicy(tx.QueryRow(ctx, sqlGetPolicy, workspaceID, sp.effectType), sp.effectType)
		if err != nil {
			return err
		}
		if err := sp.req.merge(&p); err != nil {
			return err
		}
		if _, err := s.writePolicy(ctx, tx, workspaceID, p, now); err != nil {
			return err
		}
	}
	return nil
}

package gate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/canonjson"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/money"
	"github.com/getratchet/ratchet/lib/redact"
)

// BeginRequest is the body of POST /api/v1/effects/begin.
type BeginRequest struct {
	EffectType          string            `json:"effect_type" openapi:"pattern=^[A-Za-z0-9][A-Za-z0-9._:-]*$,maxLength=100"`
	IdempotencyKey      string            `json:"idempotency_key" openapi:"minLength=1,maxLength=255,printable"`
	Payload             json.RawMessage   `json:"payload"`
	CostMicros          *int64            `json:"cost_micros" openapi:"min=0,max=1000000000000000000"`
	Dimensions          map[string]string `json:"dimensions" openapi:"maxProperties=16,keyPattern=^[A-Za-z0-9][A-Za-z0-9._-]*$,keyMaxLength=64,valueMinLength=1,valueMaxLength=255"`
	RunID               *string           `json:"run_id"`
	GroupID             *string           `json:"group_id"`
	Compensation        *Compensation     `json:"compensation"`
	CompensatesEffectID *string           `json:"compensates_effect_id"`
	LeaseSeconds        *int              `json:"lease_seconds" openapi:"min=1"`
	// RequestID names this request across its retries (16-255 printable
	// characters, random, never stored): a retry by the same key whose
	// first answer was lost gets the same execute, lease token included,
	// instead of in_flight.
	RequestID *string `json:"request_id" openapi:"minLength=16,maxLength=255,printable"`
}

// Compensation is how to undo an effect of a group.
type Compensation struct {
	EffectType string          `json:"effect_type" openapi:"pattern=^[A-Za-z0-9][A-Za-z0-9._:-]*$,maxLength=100"`
	Payload    json.RawMessage `json:"payload"`
}

// PriorAttempt describes the attempt whose outcome is unknown.
type PriorAttempt struct {
	Attempt        int        `json:"attempt"`
	StartedAt      *time.Time `json:"started_at"`
	LeaseExpiredAt *time.Time `json:"lease_expired_at"`
}

// Decision is begin's answer. Denial is set for the denied decision, which
// the API answers with HTTP 403 and the error envelope beside these fields.
type Decision struct {
	Decision          string           `json:"decision" openapi:"enum=execute|duplicate|in_flight|blocked|approval_required|denied"`
	EffectID          string           `json:"effect_id"`
	State             string           `json:"state" openapi:"enum=leased|succeeded|failed|indeterminate|awaiting_approval|denied"`
	Attempt           int              `json:"attempt"`
	LeaseToken        string           `json:"lease_token,omitempty"`
	LeaseExpiresAt    *time.Time       `json:"lease_expires_at,omitempty"`
	Probe             *bool            `json:"probe,omitempty"`
	PriorAttempt      *PriorAttempt    `json:"prior_attempt,omitempty"`
	Result            *json.RawMessage `json:"result,omitempty"`
	RetryAfterSeconds *int             `json:"retry_after_seconds,omitempty"`
	ApprovalID        string           `json:"approval_id,omitempty"`
	Denial            *apierr.Error    `json:"-"`
}

const (
	maxDimensions     = 16
	maxDimensionName  = 64 // dimensionRe's
	maxDimensionValue = 255
)

// beginInput is a validated request with everything begin's SQL needs.
type beginInput struct {
	ws, keyID, effectType, key, fingerprint string
	operation                               []byte // canonical JSON: what the fingerprint hashes
	effectID, approvalID, eventID           string
	now                                     time.Time
	cost                                    *int64
	dimNames                                []string
	dims                                    string          // jsonb: name -> keyed hash
	payload, compensation                   []byte          // sealed
	declaredCompensation                    json.RawMessage // the compensation as sent, nil when none
	payloadHash                             string          // canonical, for a compensating begin only (see admit)
	preview                                 string          // jsonb
	lease                                   *int32
	token                                   string
	tokenHash                               []byte
	requestID                               string // the request's own id across its retries ("" when none)
	runID, groupID, compensates             *string
	groupOwner                              *string // the key the group must be of (groupOwner)
	readsEffects                            bool    // effects:read: told 403, not 404, of groups it reads
	risk                                    riskInput
	// wallet is the run wallet this begin has locked and checked, if any;
	// walletRefused, that its check set risk.refused. effectRun is the run
	// of the key's existing effect (immutable), read before its row lock:
	// the locked path charges that run's wallet (chargeEffectWallet).
	wallet        *wallet
	walletRefused bool
	effectKnown   bool // the key's effect was read: effectRun is its run
	effectRun     *string
	// effectWallet is the wallet of effectRun, found by a grouped begin
	// naming no run once it held its group: it is begun again with that
	// wallet locked first (chargeEffectWallet).
	effectWallet *wallet
	// effectGroup is the group of the key's existing effect (immutable),
	// read before its row lock: the locked path holds it shared first
	// (shareEffectGroup).
	effectGroup *string
	// arrival: the key's effect, as read before its row lock, was refused
	// by a breaker (or a refusal before its, arrivalDenials) before it was
	// ever granted, so the locked path takes the type's surge turn first
	// (takeArrivalTurn).
	arrival bool
	// joinsGroup: admit found the key new to the workspace and the begin a
	// forward step of an open group, which it may join only within
	// MaxGroupSteps (groupHasRoom).
	joinsGroup bool
}

// args are begin's parameters ($1-$20, then the risk's $21-$24), in one
// slice of their length.
func (in *beginInput) args() []any {
	args := make([]any, 0, 20+riskArgs)
	args = append(args, in.ws, in.effectType, in.key, in.cost, in.dimNames, in.lease, in.fingerprint, in.now,
		in.effectID, in.dims, in.payload, in.preview, in.tokenHash, in.keyID, in.approvalID, in.runID,
		in.groupID, in.compensation, in.compensates, in.eventID)
	return in.risk.appendArgs(args)
}

// lockedArgs are the locked path's parameters ($1-$8).
func (in *beginInput) lockedArgs() []any { return in.args()[:8] }

// reference is a body's reference to another object as begin looks it up:
// one that cannot be an id of prefix's kind names nothing, and is looked up
// as ids.None, answered as a well-formed id of no object is (404; contract
// QA: "grp_missing" was a 400 whose message told the ids' form). Only an
// empty one is malformed.
func reference(pr *apierr.Problems, field, prefix string, v *string) *string {
	switch {
	case v == nil:
		return nil
	case *v == "":
		pr.Add(field, "must be an id or null")
		return v
	}
	id := ids.Lookup(prefix, *v)
	return &id
}

// prepare validates the request, fingerprints it and seals what is stored.
func (s *Service) prepare(p *auth.Principal, req BeginRequest) (*beginInput, error) {
	var pr apierr.Problems
	switch {
	case req.EffectType == "":
		pr.Add("effect_type", "is required")
	case !ValidEffectType(req.EffectType):
		pr.Add("effect_type", effectTypeRule)
	}
	if !idemkey.Valid(req.IdempotencyKey) {
		pr.Add("idempotency_key", "%s", idemkey.Problem(req.IdempotencyKey))
	}
	if req.CostMicros != nil && !money.Valid(*req.CostMicros) {
		pr.Add("cost_micros", money.Rule)
	}
	if len(req.Dimensions) > maxDimensions {
		pr.Add("dimensions", "may hold at most %d dimensions", maxDimensions)
	}
	names := sortedKeys(req.Dimensions)
	for _, name := range names {
		if !dimensionRe.MatchString(name) {
			pr.Add("dimensions."+name, "must be keyed by a dimension name (letters, digits, . _ -; up to 64)")
		}
		if v := req.Dimensions[name]; v == "" || utf8.RuneCountInString(v) > maxDimensionValue {
			pr.Add("dimensions."+name, "must be a string of 1-%d characters", maxDimensionValue)
		}
	}
	req.RunID = reference(&pr, "run_id", ids.Run, req.RunID)
	req.GroupID = reference(&pr, "group_id", ids.Group, req.GroupID)
	req.CompensatesEffectID = reference(&pr, "compensates_effect_id", ids.Effect, req.CompensatesEffectID)
	if c := req.Compensation; c != nil && !ValidEffectType(c.EffectType) {
		pr.Add("compensation.effect_type", "must be an effect type")
	}
	if req.Compensation != nil && req.GroupID == nil && req.CompensatesEffectID == nil {
		// Only a group's rollback uses a compensation: stored on an
		// ungrouped effect it would promise an undo nothing performs.
		pr.Add("compensation", "needs group_id: only an effect group's rollback uses it")
	}
	if req.RequestID != nil && (!idemkey.Valid(*req.RequestID) || utf8.RuneCountInString(*req.RequestID) < minRequestID) {
		pr.Add("request_id", "must be 16-255 printable characters, random (a UUID, or 16 random bytes in hex), "+
			"and the same in each retry of this request")
	}
	if req.LeaseSeconds != nil && *req.LeaseSeconds < 1 {
		pr.Add("lease_seconds", "must be a positive number of seconds (the policy's lease caps it)")
	}
	if err := pr.Err(); err != nil {
		return nil, err
	}

	payload := nullJSON(req.Payload)
	dims := req.Dimensions
	if dims == nil {
		dims = map[string]string{}
	}
	operation, err := canonicalOperation(req.EffectType, payload, req.CostMicros, names, dims)
	if err != nil {
		return nil, apierr.InvalidField("payload", "must be valid JSON")
	}
	hashedJSON := s.hashedDimensions(names, dims)

	now := s.clock()
	in := &beginInput{
		ws: p.WorkspaceID, keyID: p.KeyID, effectType: req.EffectType, key: req.IdempotencyKey,
		fingerprint: s.fingerprint(operation), operation: operation,
		effectID: ids.NewAt(ids.Effect, now), approvalID: ids.NewAt(ids.Approval, now),
		eventID: ids.NewAt(ids.Event, now), now: now, cost: req.CostMicros, dimNames: names,
		dims: string(hashedJSON), preview: string(redact.PreviewJSON(payload)),
		runID: req.RunID, groupID: req.GroupID, compensates: req.CompensatesEffectID,
		risk: newRiskInput(p, now), groupOwner: groupOwner(p), readsEffects: groupReader(p) == nil,
	}
	if req.RequestID != nil {
		in.requestID = *req.RequestID
	}
	in.token = s.leaseToken(in, in.effectID, 1)
	if in.dimNames == nil {
		in.dimNames = []string{}
	}
	in.tokenHash = tokenHash(in.token)
	in.payload = s.sealJSON(in.effectID, "payload", payload)
	if in.compensates != nil {
		// Valid JSON: the fingerprint above canonicalised it.
		in.payloadHash, _ = canonjson.Hash(rawOrNull(payload))
	}
	if req.Compensation != nil {
		// Without HTML escapes: json.Marshal wrote each <, > and & of the
		// payload as six bytes, and the plan answered it so (QA: 900 kB of
		// them made a 5.4 MB plan item, past what one answer holds).
		comp, err := jsonx.Marshal(req.Compensation)
		if err != nil {
			return nil, apierr.InvalidField("compensation", "must be valid JSON")
		}
		in.compensation = s.sealJSON(in.effectID, "compensation", comp)
		in.declaredCompensation = comp
	}
	if req.LeaseSeconds != nil {
		// Request options only tighten: a larger lease is capped (API.md
		// §2.1) — here at the policy maximum, in SQL at the type's lease.
		l := int32(min(*req.LeaseSeconds, 3600))
		in.lease = &l
	}
	return in, nil
}

// canonicalOperation is what a begin's fingerprint hashes: the canonical
// JSON of {"cost_micros", "dimensions", "effect_type", "payload"}, the
// bytes canonjson.Marshal writes for a map of them, which every stored
// fingerprint was made of (TestCanonicalOperationAsTheMap). Each value is
// canonicalised on its own and the object written around them in
// canonjson's key order: through the map, encoding/json marshalled the
// payload into the map's JSON (compacting and escaping it) and canonjson
// parsed all of it back, a second pass over the payload. The dimensions
// are written in names' order (dims' names, sorted), each name as it is:
// one that passed prepare's dimensionRe has no character JSON escapes.
func canonicalOperation(effectType string, payload json.RawMessage, cost *int64, names []string,
	dims map[string]string) ([]byte, error) {
	p, err := canonjson.Marshal(rawOrNull(payload))
	if err != nil {
		return nil, err
	}
	size := 2 // the dimensions' object, as long as it is when no value needs an escape
	for _, k := range names {
		size += len(k) + len(dims[k]) + len(`"":"",`)
	}
	d := append(make([]byte, 0, size), '{')
	for i, k := range names {
		v, err := canonjson.Marshal(dims[k])
		if err != nil {
			return nil, err
		}
		if i > 0 {
			d = append(d, ',')
		}
		d = append(append(append(append(d, '"'), k...), `":`...), v...)
	}
	d = append(d, '}')
	t, err := canonjson.Marshal(effectType)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(`{"cost_micros":,"dimensions":,"effect_type":,"payload":}`)+20+len(d)+len(t)+len(p))
	out = append(out, `{"cost_micros":`...)
	if cost == nil {
		out = append(out, "null"...)
	} else {
		out = strconv.AppendInt(out, *cost, 10)
	}
	out = append(append(out, `,"dimensions":`...), d...)
	out = append(append(out, `,"effect_type":`...), t...)
	out = append(append(out, `,"payload":`...), p...)
	return append(out, '}'), nil
}

// hashedDimensions is the dimensions column: a JSON object of each
// dimension's name (names, sorted) to the keyed hash of its value, in hex.
// Written directly, as json.Marshal of a map of them writes it: a name
// passed prepare's dimensionRe and a hex digest, neither has a character
// JSON escapes (TestHashedDimensionsAsJSONMarshal).
func (s *Service) hashedDimensions(names []string, dims map[string]string) []byte {
	const digestHex = 2 * 32 // the keyed hash is HMAC-SHA-256
	out := make([]byte, 0, 2+len(names)*(len(`"":"",`)+maxDimensionName+digestHex))
	out = append(out, '{')
	for i, k := range names {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, k...)
		out = append(out, `":"`...)
		out = hex.AppendEncode(out, s.hash("dimension:"+k+":"+dims[k]))
		out = append(out, '"')
	}
	return append(out, '}')
}

func rawOrNull(doc json.RawMessage) json.RawMessage {
	if doc == nil {
		return json.RawMessage("null")
	}
	return doc
}

// eval is the policy's verdict on a request (evalCTE).
type eval struct {
	onIndeterminate   string
	maxAttempts       int
	maxCost           *int64
	approvalAbove     *int64
	precheck          *string
	missingDimensions []string
	fresh             string
	approvalReason    string
	lease             int
}

// effectRow is an effects row as effectColumns lists it.
type effectRow struct {
	ID, WorkspaceID, EffectType, IdempotencyKey, Fingerprint, State string
	DenialCode                                                      *string
	Attempt, LeaseSeconds                                           int
	LeaseExpiresAt, AttemptStartedAt                                *time.Time
	Probe                                                           bool
	ApprovalID, ApprovalState                                       *string
	Result, ResultPreview, PayloadPreview                           []byte
	CostMicros                                                      *int64
	RunID, GroupID, CompensatesEffectID                             *string
	CreatedAt, UpdatedAt                                            time.Time
}

// effectRowColumns is how many columns effectColumns lists (dest's length).
const effectRowColumns = 23

func (r *effectRow) dest() []any { return r.appendDest(make([]any, 0, effectRowColumns)) }

// destWith is dest followed by extra, in one slice.
func (r *effectRow) destWith(extra any) []any {
	return append(r.appendDest(make([]any, 0, effectRowColumns+1)), extra)
}

// appendDest appends the row's scan targets to dst: a caller scanning
// columns before the row's gives their targets in dst, one slice for all.
func (r *effectRow) appendDest(dst []any) []any {
	return append(dst, &r.ID, &r.WorkspaceID, &r.EffectType, &r.IdempotencyKey, &r.Fingerprint, &r.State,
		&r.DenialCode, &r.Attempt, &r.LeaseSeconds, &r.LeaseExpiresAt, &r.AttemptStartedAt, &r.Probe,
		&r.ApprovalID, &r.ApprovalState, &r.Result, &r.ResultPreview, &r.PayloadPreview, &r.CostMicros,
		&r.RunID, &r.GroupID, &r.CompensatesEffectID, &r.CreatedAt, &r.UpdatedAt)
}

// effectiveState is the state as callers see it: a lapsed lease is
// indeterminate at once, before any sweeper runs.
func (r *effectRow) effectiveState(now time.Time) string {
	if r.State == StateLeased && lapsed(r.LeaseExpiresAt, now) {
		return StateIndeterminate
	}
	return r.State
}

func scanBegin(row pgx.Row) (ev eval, found, inserted bool, e effectRow, err error) {
	dest := append(make([]any, 0, 11+effectRowColumns), &ev.onIndeterminate, &ev.maxAttempts, &ev.maxCost,
		&ev.approvalAbove, &ev.precheck, &ev.missingDimensions, &ev.fresh, &ev.approvalReason, &ev.lease, &found,
		&inserted)
	err = row.Scan(e.appendDest(dest)...)
	return
}

// Begin asks before a side effect (API.md §2.1). A new key and a repeated
// key cost one round trip (one function call); a transition (a new attempt,
// an approval, a re-evaluated denial) one short transaction holding the
// effect row.
func (s *Service) Begin(ctx context.Context, p *auth.Principal, req BeginRequest) (Decision, error) {
	in, err := s.prepare(p, req)
	if err != nil {
		return Decision{}, err
	}
	d, err := s.begin(ctx, in)
	for moves := 1; errors.Is(err, errWalletMoved); moves++ {
		if moves == s.walletMoves {
			return Decision{}, retryRequest()
		}
		// Rolled back: begin again, now charged to the key's run (or, its
		// run deleted meanwhile, to no wallet).
		in.wallet, in.walletRefused, in.effectKnown, in.risk.refused = nil, false, false, nil
		d, err = s.begin(ctx, in)
	}
	if err == nil && d.Denial != nil && d.Denial.Code == apierr.CodeCircuitOpen {
		d.Denial = s.withBreaker(ctx, in.ws, in.effectType, d.Denial)
	}
	return d, err
}

// lockedAt moves a begin's clock reading to now once it holds the locks it
// waited for in statements of its own (a run wallet's, a group's, the
// effect's row): a lease measured from the reading taken before the wait
// would be partly spent when granted, or already lapsed, and the key's
// next begin granted too while this holder acts on its execute.
// gate_begin_in_turn does the same after the surge turn (0028).
func (s *Service) lockedAt(in *beginInput) {
	if now := s.clock(); now.After(in.now) {
		in.now = now
	}
}

// slowGrant is how long a granting statement may take before the lease it
// wrote is measured again from its end. A grant charges its daily ceilings'
// counters last, and may queue there behind other grants' uncommitted
// charges (or the database is slow): a lease measured from before that wait
// could be partly spent, or lapsed, when answered. Shorter waits cost at
// most that much of the lease; measuring every grant would move every
// lease by the statement's own microseconds.
const slowGrant = time.Second

// afterSlowGrant lengthens the lease of row's attempt, just granted by a
// statement sent at sent, by the time the statement took when that was
// longer than slowGrant. The time is real time: in.now may be a test's
// clock, which does not move while a statement waits.
func (s *Service) afterSlowGrant(ctx context.Context, q db.Querier, in *beginInput, row *effectRow, sent time.Time) error {
	took := time.Since(sent)
	if took <= slowGrant || row.State != StateLeased {
		return nil
	}
	exp := in.now.Add(took + time.Duration(row.LeaseSeconds)*time.Second).Truncate(time.Microsecond)
	err := q.QueryRow(ctx, sqlLengthenLease, row.ID, row.Attempt, exp).Scan(&row.LeaseExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		// No longer leased: the sweeper found the lease lapsed while the
		// grant waited (a fast-path grant is committed before this). Its
		// token is worthless, so begin is asked again, and decides on the
		// attempt as the sweeper left it.
		return retryRequest()
	}
	if err != nil {
		return fmt.Errorf("begin: lengthen lease: %w", err)
	}
	return nil
}

// errWalletMoved ends a begin that locked its named run's wallet for a key
// begun meanwhile under another run: locking that run's wallet too could
// deadlock with a begin crossing the other way, so the begin is done again,
// with only the key's run's wallet. It also ends a grouped begin that finds
// its key's run's wallet only once it holds its group (effectWallet), which
// is begun again with the wallet locked first, and a begin that finds its
// wallet's run deleted once it holds the wallet (chargeWallet), which is
// begun again as one sent after the delete.
var errWalletMoved = errors.New("begin: the key's effect belongs to another run's wallet")

// maxWalletMoves bounds the begins one Begin makes when its wallet moves
// (errWalletMoved). Each move is a change another request committed: the
// key begun under another run, or a grouped begin's wallet found late,
// then that wallet's run deleted while the begin waited for it (retention
// QA: the third begin was never made, and the move escaped as a 500).
// Past the bound the caller is asked to begin again (409 retry_request).
const maxWalletMoves = 4

func (s *Service) begin(ctx context.Context, in *beginInput) (Decision, error) {
	w := in.effectWallet
	if in.runID != nil {
		var err error
		if w, err = s.runWallet(ctx, in); err != nil {
			return Decision{}, err
		}
		if in.compensates != nil {
			w = nil // the run's undo, not its spend (money.walletEffect)
		}
	}
	if in.grouped() || w != nil {
		return s.refusingOnce(in, func() (Decision, error) { return s.beginInTx(ctx, in, w) })
	}
	return s.refusingOnce(in, func() (Decision, error) { return s.decide(ctx, s.pool, in, s.beginLocked) })
}

// wallet is a run's budget that a begin is charged to.
type wallet struct {
	runID  string
	budget int64
}

// runWallet checks the begin's run and reads the wallet it is charged to
// (nil: none): the named run's, or, once the key names an effect, that of
// the run the effect was begun under. A run of another workspace, or none,
// is unknown (404), as every id; a run retention deleted is still known to
// the keys begun under it.
func (s *Service) runWallet(ctx context.Context, in *beginInput) (*wallet, error) {
	var (
		run    *string
		budget *int64
	)
	err := s.pool.QueryRow(ctx, sqlRunWallet, *in.runID, in.ws, in.key).Scan(&run, &budget)
	if err == nil {
		if run == nil || budget == nil {
			return nil, nil
		}
		return &wallet{runID: *run, budget: *budget}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("begin: run: %w", err)
	}
	var known bool
	if err := s.pool.QueryRow(ctx, sqlKeyInRun, *in.runID, in.ws, in.key).Scan(&known); err != nil {
		return nil, fmt.Errorf("begin: run: %w", err)
	}
	if !known {
		return nil, apierr.NotFound("run")
	}
	return nil, nil
}

// chargeWallet decides, under the wallet's lock held until tx ends,
// whether a grant of the begin's cost fits its run's budget; when it does
// not, the begin is refused run_budget_exceeded instead of granted (as a
// ceiling's refusal: an answer that grants nothing, a duplicate or a wait,
// is unchanged).
func (s *Service) chargeWallet(ctx context.Context, tx pgx.Tx, in *beginInput, w wallet) error {
	if in.risk.refused != nil {
		return nil // refused already: nothing is granted
	}
	if _, err := tx.Exec(ctx, sqlLockWallet, w.runID); err != nil {
		return fmt.Errorf("begin: lock wallet: %w", err)
	}
	// The run is held until tx ends, so that run retention, which deletes
	// it with what effect retention kept of its spend (run_retired_spend),
	// skips it or has already gone: a begin that read the run before it
	// was deleted, and waited for the wallet meanwhile, read the spend
	// without the kept part and was granted beyond the budget (retention
	// QA). A run gone by now is begun again (errWalletMoved): as a begin
	// sent after the delete, a new key is 404, one begun under the run is
	// charged to no wallet (runWallet).
	if err := tx.QueryRow(ctx, sqlShareWalletRun, w.runID).Scan(new(*int64)); errors.Is(err, pgx.ErrNoRows) {
		if in.effectWallet != nil && in.effectWallet.runID == w.runID {
			in.effectWallet = nil
		}
		return errWalletMoved
	} else if err != nil {
		return fmt.Errorf("begin: hold wallet's run: %w", err)
	}
	in.wallet = &w
	var spent int64
	if err := tx.QueryRow(ctx, sqlRunSpend, in.ws, w.runID).Scan(&spent); err != nil {
		return fmt.Errorf("begin: wallet spend: %w", err)
	}
	var cost int64
	if in.cost != nil {
		cost = *in.cost
	}
	if cost > w.budget-spent {
		in.risk.refused = apierr.Of(apierr.CodeRunBudgetExceeded,
			"This cost does not fit in what is left of the run's own wallet; a new run gets a new wallet.").
			WithDetail("run_id", w.runID).WithDetail("budget_micros", w.budget).WithDetail("spent_micros", spent)
		in.walletRefused = true
	}
	return nil
}

// chargeEffectWallet charges a new attempt of an existing effect to the
// wallet of the run it was begun under, whichever run the begin names (or
// none): that run's spend is what the attempt adds to. The effect's run
// never changes, so it is read before the row lock, and the wallet is
// locked before the row, in the order every begin takes them. A wallet
// checked earlier for another run (the key was begun meanwhile under this
// one) does not decide the attempt: its refusal is dropped, and the begin
// is done again (errWalletMoved) rather than hold two wallets. A grouped
// begin holds its group here already (admit), and a wallet comes before a
// group (a begin naming the run, or none, locks the wallet, then the key's
// group): it is done again too, with this wallet locked first. Locked
// here, after the group, it closed a cycle with a policy PUT dating ended
// groups, which locks them in id order: the PUT held one group and waited
// for this begin's, this begin waited for the wallet, and a begin holding
// the wallet waited for the PUT's group (groups QA: 503 after
// deadlock_timeout).
func (s *Service) chargeEffectWallet(ctx context.Context, tx pgx.Tx, in *beginInput) error {
	run := in.effectRun
	if !in.effectKnown || (run != nil && in.wallet != nil && in.wallet.runID == *run) {
		return nil
	}
	if in.walletRefused {
		in.risk.refused, in.walletRefused = nil, false
	}
	if run == nil {
		return nil // begun under no run: no wallet pays for it
	}
	if in.wallet != nil {
		return errWalletMoved // holding another run's wallet: at most one per begin
	}
	var budget *int64
	err := tx.QueryRow(ctx, sqlWalletBudget, *run).Scan(&budget)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && budget == nil) {
		return nil // no wallet, or its run is gone (retention)
	}
	if err != nil {
		return fmt.Errorf("begin: effect's run wallet: %w", err)
	}
	w := wallet{runID: *run, budget: *budget}
	if in.grouped() && in.risk.refused == nil { // a refused begin locks no wallet (chargeWallet)
		in.effectWallet = &w
		return errWalletMoved
	}
	return s.chargeWallet(ctx, tx, in, w)
}

// refusingOnce runs a begin, and when its grant did not fit a ceiling — the
// statement aborted through gate_refuse() and its transaction kept nothing —
// runs it once more, storing the denial instead of granting.
func (s *Service) refusingOnce(in *beginInput, begin func() (Decision, error)) (Decision, error) {
	d, err := begin()
	// A wallet's refusal stands aside for a probe (transition), whose grant
	// a daily ceiling may still refuse: that refusal takes its place
	// (review: it escaped as a 500).
	if label, ok := refusedCeiling(err); ok && (in.risk.refused == nil || in.walletRefused) {
		in.walletRefused = false
		in.risk.refuse(label, in.now)
		return begin()
	}
	return d, err
}

// decide is begin's decision over q (the pool, or a grouped begin's
// transaction); locked is its locked path.
func (s *Service) decide(ctx context.Context, q db.Querier, in *beginInput,
	locked func(context.Context, *beginInput) (Decision, error)) (Decision, error) {
	sent := time.Now()
	ev, found, inserted, row, err := scanBegin(q.QueryRow(ctx, sqlBeginFast, in.args()...))
	if errors.Is(err, pgx.ErrNoRows) {
		return Decision{}, auth.ErrRevokedKey() // revoked since this instance cached it
	}
	if err != nil {
		return Decision{}, fmt.Errorf("begin: %w", err)
	}
	switch {
	case inserted:
		if err := s.afterSlowGrant(ctx, q, in, &row, sent); err != nil {
			if _, inTx := q.(pgx.Tx); !inTx {
				// On the pool the grant committed with its statement.
				err = committedThen(err)
			}
			return Decision{}, err
		}
		return s.fresh(in, &ev, &row), nil
	case !found && ev.precheck != nil:
		return Decision{}, precheckError(&ev)
	case !found:
		// The insert met the key but the read after it did not find the
		// row (gone in between, e.g. purged by retention): the locked
		// path decides, answering retry_request when the row is gone, so
		// the client's retry inserts the key afresh.
		return locked(ctx, in)
	}
	if err := s.mayAnswerFor(ctx, q, in, &row); err != nil {
		return Decision{}, err
	}
	if d, ok, err := s.settled(ctx, q, in, &row, &ev); ok || err != nil {
		return d, err
	}
	in.effectKnown, in.effectRun, in.effectGroup = true, row.RunID, row.GroupID
	if row.CompensatesEffectID != nil {
		in.effectRun = nil // an undo is no wallet's spend (money.walletEffect)
	}
	in.arrival = row.refusedBeforeGrant()
	return locked(ctx, in)
}

// keyedFingerprint marks a fingerprint made with the service's keyed hash.
// The payload fingerprint (API.md §2.1) is compared, never shown, so it is
// stored keyed (security review): a plain SHA-256 of the effect type,
// payload, cost and dimensions let whoever read the database, a backup
// say, confirm a guessed payload offline although the payload itself is
// sealed. Fingerprints stored before have no mark and are plain SHA-256.
const keyedFingerprint = "k1:"

// fingerprint is how an operation's fingerprint (its canonical JSON) is
// stored.
func (s *Service) fingerprint(operation []byte) string {
	return keyedFingerprint + hex.EncodeToString(s.hash("effect.fingerprint:"+string(operation)))
}

// plainFingerprint is the fingerprint releases before keyedFingerprint
// stored: the SHA-256 of the operation's canonical JSON, in hex.
func plainFingerprint(operation []byte) string {
	sum := sha256.Sum256(operation)
	return hex.EncodeToString(sum[:])
}

// sameOperation says whether the fingerprint stored with a key's effect is
// this request's, whichever way it was stored (the plain hash only for an
// effect an earlier release stored).
func (in *beginInput) sameOperation(stored string) bool {
	if strings.HasPrefix(stored, keyedFingerprint) {
		return stored == in.fingerprint
	}
	return stored == plainFingerprint(in.operation)
}

// mayAnswerFor checks that a begin may be answered by the effect its key
// already names: for a key that acts only on its own groups (groupOwner), not
// a step of another key's group; the same operation; and, when the begin
// declares a compensation, the one the step was first begun with
// (sameCompensation). A begin naming no
// group would otherwise answer such a step (its result, or a new attempt
// and its lease) to a key for which the group does not exist; the key was
// taken by another key's unit of work, as a key used in another group is
// (admit). The owner is checked first, so that the answer does not tell
// whether a guessed payload was the step's (review).
func (s *Service) mayAnswerFor(ctx context.Context, q db.Querier, in *beginInput, row *effectRow) error {
	if in.grouped() && (row.GroupID == nil || *row.GroupID != *in.groupID) {
		// admit refuses a key of another group's (or no group's) effect;
		// one inserted while it ran, committed before this begin's insert,
		// escaped it (groups QA: answered in_flight, another group's step).
		return keyUsedOutsideGroup()
	}
	if in.grouped() && !samePtr(in.compensates, row.CompensatesEffectID) {
		// The fingerprint does not cover what an effect compensates: a
		// compensation of one step answered from another step's
		// compensation, or from a forward step, under a key that happened
		// to be free then (groups QA: duplicate, with the other's result,
		// and the step was never undone).
		return keyNamesAnotherRole(in.compensates)
	}
	if row.GroupID != nil && in.groupOwner != nil && !in.grouped() {
		var ours bool
		if err := q.QueryRow(ctx, sqlGroupOfKey, *row.GroupID, *in.groupOwner).Scan(&ours); err != nil {
			return fmt.Errorf("begin: group owner: %w", err)
		}
		if !ours {
			return apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
				"This idempotency key was used by another key's effect group; choose a key of your own.")
		}
	}
	if !in.sameOperation(row.Fingerprint) {
		return keyReuse()
	}
	if in.declaredCompensation != nil {
		return s.sameCompensation(ctx, q, in, row.ID)
	}
	return nil
}

// sameCompensation checks a begin's compensation against the one stored
// with the key's effect, which is stored once, when the effect is first
// begun (QA: a retry's compensation, or a changed one, was accepted and
// dropped, and the rollback then found the step irreversible, or undid it
// with the first one). A begin that leaves it out is not comparing: it
// keeps the stored one.
func (s *Service) sameCompensation(ctx context.Context, q db.Querier, in *beginInput, effectID string) error {
	var sealed []byte
	if err := q.QueryRow(ctx, sqlEffectCompensation, effectID).Scan(&sealed); err != nil {
		return fmt.Errorf("begin: stored compensation: %w", err)
	}
	if sealed == nil {
		return apierr.Conflict(apierr.CodeIdempotencyKeyReuse, "This idempotency key's step was begun without a "+
			"compensation, and one cannot be added later: begin the step under a new key with its compensation.")
	}
	stored, err := s.openJSON(effectID, "compensation", sealed)
	if err != nil {
		return fmt.Errorf("begin: stored compensation: %w", err)
	}
	want, err := canonjson.Hash(stored)
	if err != nil {
		return fmt.Errorf("begin: stored compensation: %w", err)
	}
	got, err := canonjson.Hash(in.declaredCompensation)
	if err != nil {
		return apierr.InvalidField("compensation", "must be valid JSON")
	}
	if got != want {
		return apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This idempotency key's step was begun with another compensation; a step keeps the one it was first "+
				"begun with.")
	}
	return nil
}

func keyReuse() error {
	return apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
		"This idempotency key was used with a different payload fingerprint.")
}

func precheckError(ev *eval) *apierr.Error {
	if *ev.precheck == apierr.CodeCostRequired {
		return apierr.Of(apierr.CodeCostRequired, "This effect type requires a declared cost_micros.")
	}
	return apierr.Of(apierr.CodeDimensionRequired, "The policy requires dimensions that were not declared: %s.",
		strings.Join(ev.missingDimensions, ", ")).WithDetail("dimensions", ev.missingDimensions)
}

// begunWithout is the precheck's refusal of a key whose effect exists: it
// was begun before its type required what it did not declare (a cost, a
// dimension), and a begin of the key must repeat it as first sent (its
// fingerprint), so declaring it now is 409 idempotency_key_reuse (QA: the
// refusal advised declaring it, as for a new key). It names the effect,
// and says what is left: once the effect is known not to have acted, the
// work under a new key that declares it; while its outcome is unknown,
// finding out and resolving first, since a new key could repeat what it
// did.
func begunWithout(ev *eval, row *effectRow, now time.Time) error {
	advice := "begin the work again under a new idempotency key that declares it"
	if row.effectiveState(now) == StateIndeterminate {
		advice = "its last attempt's outcome is unknown: check the vendor and resolve the effect " +
			"(POST /api/v1/effects/{id}/resolve) before any new idempotency key repeats the work"
	}
	e := precheckError(ev)
	what := "a declared cost_micros"
	if e.Code == apierr.CodeDimensionRequired {
		what = "dimensions (" + strings.Join(ev.missingDimensions, ", ") + ")"
	}
	e.Message = fmt.Sprintf("The policy now requires %s, which this key's effect was begun without; a begin of "+
		"the key must repeat it as first sent (its fingerprint), so it cannot add that now: %s.", what, advice)
	return e.WithDetail("effect_id", row.ID)
}

// minRequestID is the shortest request_id, in characters as its schema's
// minLength and its 255 counts them: one a caller could guess, or that two
// callers could both choose, would let the second rejoin the first's lease.
const minRequestID = 16

// leaseToken is the token of an attempt begun by in: random, or, when the
// request names its request_id, derived from it and the calling key with
// the service's keyed hash, so that the same request retried by the same
// key after its answer was lost can be given the same token (rejoin) and
// no other request can.
func (s *Service) leaseToken(in *beginInput, effectID string, attempt int) string {
	if in.requestID == "" {
		return ids.Random(24)
	}
	sum := s.hash("lease:" + in.ws + ":" + in.keyID + ":" + effectID + ":" + strconv.Itoa(attempt) + ":" +
		in.requestID)
	return hex.EncodeToString(sum[:24])
}

// rejoin answers a retry of the request that was granted the effect's live
// lease (the same request_id): its answer was lost (a dropped connection,
// a client timeout), and without the token nobody could report the attempt,
// so the key would sit in_flight and then turn indeterminate though the
// action never ran. It gets the same execute. ok is false when the lease is
// another request's, or lapsed (its outcome is then unknown, as any other).
func (s *Service) rejoin(ctx context.Context, q db.Querier, in *beginInput, row *effectRow) (d Decision, ok bool, err error) {
	token := s.leaseToken(in, row.ID, row.Attempt)
	if err := q.QueryRow(ctx, sqlRejoin, row.ID, row.Attempt, tokenHash(token), in.now).Scan(&ok); err != nil {
		return d, false, fmt.Errorf("begin: rejoin: %w", err)
	}
	if !ok {
		return d, false, nil
	}
	probe := row.Probe
	d = Decision{Decision: DecisionExecute, EffectID: row.ID, State: StateLeased, Attempt: row.Attempt,
		LeaseToken: token, LeaseExpiresAt: row.LeaseExpiresAt, Probe: &probe}
	if probe {
		// As the grant answered: the unknown attempt before this one.
		unknown := *row
		unknown.State = StateIndeterminate
		d.PriorAttempt, err = s.prior(ctx, q, &unknown)
	}
	return d, true, err
}

// fresh answers for an effect the statement just inserted.
func (s *Service) fresh(in *beginInput, ev *eval, row *effectRow) Decision {
	d := Decision{EffectID: row.ID, State: row.State, Attempt: row.Attempt}
	switch row.State {
	case StateLeased:
		probe := false
		d.Decision, d.LeaseToken, d.LeaseExpiresAt, d.Probe = DecisionExecute, in.token, row.LeaseExpiresAt, &probe
	case StateAwaitingApproval:
		d.Decision, d.ApprovalID = DecisionApprovalRequired, *row.ApprovalID
	default:
		d.Decision, d.Denial = DecisionDenied, in.risk.denial(*row.DenialCode, ev, row)
	}
	return d
}

// settled answers without changing anything when the effect's state decides
// the request by itself; ok is false when begin must take the locked path.
func (s *Service) settled(ctx context.Context, q db.Querier, in *beginInput, row *effectRow, ev *eval) (
	d Decision, ok bool, err error) {
	now := in.now
	d = Decision{EffectID: row.ID, State: row.effectiveState(now), Attempt: row.Attempt}
	switch d.State {
	case StateSucceeded:
		res, err := s.openJSON(row.ID, "result", row.Result)
		if err != nil {
			// The result is what a duplicate hands its caller in place of
			// acting: answered null, it would be taken for the recorded
			// one. Unlike a read (result_unreadable), begin fails, having
			// changed nothing; it never grants execute either.
			return d, true, err
		}
		res = rawOrNull(res)
		d.Decision, d.Result = DecisionDuplicate, &res
		return d, true, nil
	case StateLeased:
		if in.requestID != "" {
			if again, ok, err := s.rejoin(ctx, q, in, row); ok || err != nil {
				return again, true, err
			}
		}
		secs := int(math.Ceil(row.LeaseExpiresAt.Sub(now).Seconds()))
		d.Decision, d.RetryAfterSeconds = DecisionInFlight, &secs
		return d, true, nil
	case StateAwaitingApproval:
		if row.ApprovalState != nil && *row.ApprovalState == "pending" {
			if err := awaitsApproval(ctx, q, row); err != nil {
				return d, true, err
			}
			d.Decision, d.ApprovalID = DecisionApprovalRequired, *row.ApprovalID
			return d, true, nil
		}
	case StateDenied:
		if code := *row.DenialCode; code == apierr.CodeApprovalRejected || code == apierr.CodeMaxAttemptsExceeded {
			d.Decision, d.Denial = DecisionDenied, denial(code, ev, row)
			return d, true, nil
		}
	case StateIndeterminate:
		if ev.onIndeterminate == OnIndeterminateBlock {
			d.Decision = DecisionBlocked
			d.PriorAttempt, err = s.prior(ctx, q, row)
			return d, true, err
		}
	}
	return d, false, nil
}

// prior is the attempt whose outcome is unknown, for blocked and probe
// answers: the current one, unless a retry after it was reported failed
// (migration 0026), when it is the latest unknown attempt before that.
func (s *Service) prior(ctx context.Context, q db.Querier, row *effectRow) (*PriorAttempt, error) {
	p := &PriorAttempt{Attempt: row.Attempt, StartedAt: row.AttemptStartedAt, LeaseExpiredAt: row.LeaseExpiresAt}
	if row.State != StateIndeterminate {
		return p, nil // a lapse not yet recorded: the current attempt's
	}
	var started, ended time.Time
	err := q.QueryRow(ctx, sqlLatestUnknown, row.ID).Scan(&p.Attempt, &started, &ended)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("begin: prior attempt: %w", err)
	}
	p.StartedAt, p.LeaseExpiredAt = &started, &ended
	return p, nil
}

func denial(code string, ev *eval, row *effectRow) *apierr.Error {
	switch code {
	case apierr.CodePolicyDenied:
		return apierr.Of(code, "The policy for this effect type denies it.")
	case apierr.CodeCostCeilingExceeded:
		e := apierr.Of(code, "The declared cost is above the per-effect maximum.")
		if ev.maxCost != nil {
			e = e.WithDetail("max_cost_micros", *ev.maxCost)
		}
		return e
	case apierr.CodeMaxAttemptsExceeded:
		return apierr.Of(code, "This key has used its attempt ceiling.").WithDetail("attempts", row.Attempt)
	case apierr.CodeCircuitOpen:
		return apierr.Of(code, "A circuit breaker holding this effect type is open with action deny.")
	case apierr.CodeApprovalRejected:
		e := apierr.Of(code, "An operator rejected this effect.")
		if row.ApprovalID != nil {
			e = e.WithDetail("approval_id", *row.ApprovalID)
		}
		return e
	}
	return apierr.Of(code, "Denied.")
}

// beginLocked decides under the effect's row lock, so concurrent callers
// serialise: exactly one is granted a new attempt, the rest see its lease.
func (s *Service) beginLocked(ctx context.Context, in *beginInput) (Decision, error) {
	var d Decision
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := sharePolicy(ctx, tx, in); err != nil {
			return err
		}
		var err error
		d, err = s.decideLocked(ctx, tx, in)
		return err
	})
	return d, err
}

// sharePolicy holds the begin's type's policy turn shared until tx ends,
// before any other lock tx takes (sqlLockPolicy): a policy write waits
// for the begin, and the begin's grant reads the policy as it committed.
func sharePolicy(ctx context.Context, tx pgx.Tx, in *beginInput) error {
	if _, err := tx.Exec(ctx, sqlSharePolicy, in.ws, in.effectType); err != nil {
		return fmt.Errorf("begin: share policy: %w", err)
	}
	return nil
}

// decideLocked is the locked path's decision inside tx.
func (s *Service) decideLocked(ctx context.Context, tx pgx.Tx, in *beginInput) (Decision, error) {
	if err := s.chargeEffectWallet(ctx, tx, in); err != nil {
		return Decision{}, err
	}
	if err := shareEffectGroup(ctx, tx, in); err != nil {
		return Decision{}, err
	}
	turn, err := s.takeArrivalTurn(ctx, tx, in)
	if err != nil {
		return Decision{}, err
	}
	ev, _, _, row, err := scanBegin(tx.QueryRow(ctx, sqlBeginLocked, in.lockedArgs()...))
	if errors.Is(err, pgx.ErrNoRows) {
		return Decision{}, retryRequest()
	}
	if err != nil {
		return Decision{}, fmt.Errorf("begin: lock effect: %w", err)
	}
	s.lockedAt(in)
	if err := s.mayAnswerFor(ctx, tx, in, &row); err != nil {
		return Decision{}, err
	}
	if d, ok, err := s.settled(ctx, tx, in, &row, &ev); ok || err != nil {
		return d, err
	}
	if row.refusedBeforeGrant() {
		if err := s.arrive(ctx, tx, in, turn, &ev, &row); err != nil {
			return Decision{}, err
		}
	}
	return s.transition(ctx, tx, in, &ev, &row)
}

// transition re-evaluates a locked effect whose state allows another try.
// Attempts count execute grants only: a denial or an approval wait uses none.
func (s *Service) transition(ctx context.Context, tx pgx.Tx, in *beginInput, ev *eval, row *effectRow) (Decision, error) {
	if ev.precheck != nil {
		return Decision{}, begunWithout(ev, row, in.now)
	}
	if err := admitAttempt(ctx, tx, row); err != nil {
		return Decision{}, err
	}
	wasIndeterminate := row.effectiveState(in.now) == StateIndeterminate
	if wasIndeterminate {
		if err := s.recordLapse(ctx, tx, row, in.now); err != nil {
			return Decision{}, err
		}
	}
	before := *row
	probe := wasIndeterminate && ev.onIndeterminate == OnIndeterminateProbe
	approved := row.ApprovalState != nil && *row.ApprovalState == "approved"
	if approved && ev.fresh == "approval" {
		var err error
		if approved, err = s.approvalStillAnswers(ctx, tx, row, ev, in.now); err != nil {
			return Decision{}, err
		}
	}
	var (
		out  effectRow
		code string
	)
	// A pending approval first, then the final refusals: each answers
	// every later begin on the key, whatever the policy says by then.
	switch {
	case row.ApprovalState != nil && *row.ApprovalState == ApprovalPending:
		// Still waiting on the approval an earlier begin asked for (an
		// indeterminate effect waits in its own state, not
		// awaiting_approval). As for awaiting_approval, it holds the key
		// until an operator decides it: granting past it would leave it
		// pending, and deciding it later would still change the key.
		return Decision{Decision: DecisionApprovalRequired, EffectID: row.ID, State: row.effectiveState(in.now),
			Attempt: row.Attempt, ApprovalID: *row.ApprovalID}, nil
	case row.Attempt >= ev.maxAttempts || (row.DenialCode != nil && *row.DenialCode == apierr.CodeMaxAttemptsExceeded):
		// An effect left indeterminate by this answer keeps the code
		// (sqlDeny), so raising max_attempts later does not lift it.
		code = apierr.CodeMaxAttemptsExceeded
	case row.ApprovalState != nil && *row.ApprovalState == ApprovalRejected:
		// Reached only by an effect a rejection left indeterminate
		// (sqlDecideApproval), or one resolved failed whose approval a
		// group's rollback closed (settledState); the rest are denied.
		code = apierr.CodeApprovalRejected
	case ev.fresh == apierr.CodePolicyDenied || ev.fresh == apierr.CodeCostCeilingExceeded ||
		ev.fresh == apierr.CodeCircuitOpen:
		code = ev.fresh
	case ev.fresh == "approval" && !approved:
		// A compensation of an ended rollback takes no attempt: asked, the
		// approval could never be given, and the effect would leave the
		// state the rollback's final record holds (groups QA).
		if err := admitCompensationGrant(ctx, tx, row, in.now); err != nil {
			return Decision{}, err
		}
		if err := tx.QueryRow(ctx, sqlRequestApproval, row.ID, in.now, in.approvalID, ev.approvalReason,
			in.eventID).Scan(out.dest()...); err != nil {
			return Decision{}, fmt.Errorf("begin: request approval: %w", err)
		}
		return Decision{Decision: DecisionApprovalRequired, EffectID: out.ID, State: out.State,
			Attempt: out.Attempt, ApprovalID: in.approvalID}, nil
	case in.risk.refused != nil && !(probe && in.walletRefused):
		// A probe adds nothing to a run's wallet (money.RunSpendSQL): the
		// wallet's refusal of the begin's cost does not refuse it. A daily
		// ceiling's does: it charged the probe (sqlGrant).
		code = in.risk.refused.Code
	default:
		if err := admitCompensationGrant(ctx, tx, row, in.now); err != nil {
			return Decision{}, err
		}
		if in.requestID != "" {
			in.token = s.leaseToken(in, row.ID, row.Attempt+1) // the attempt sqlGrant begins
			in.tokenHash = tokenHash(in.token)
		}
		sent := time.Now()
		if err := tx.QueryRow(ctx, sqlGrant, row.ID, in.now, in.tokenHash, ev.lease, probe, in.keyID,
			in.risk.keyCeiling).Scan(out.dest()...); err != nil {
			return Decision{}, fmt.Errorf("begin: grant: %w", err)
		}
		if err := s.afterSlowGrant(ctx, tx, in, &out, sent); err != nil {
			return Decision{}, err
		}
		d := Decision{Decision: DecisionExecute, EffectID: out.ID, State: out.State, Attempt: out.Attempt,
			LeaseToken: in.token, LeaseExpiresAt: out.LeaseExpiresAt, Probe: &probe}
		if probe {
			var err error
			if d.PriorAttempt, err = s.prior(ctx, tx, &before); err != nil {
				return Decision{}, err
			}
		}
		return d, nil
	}
	// An indeterminate effect stays so (sqlDeny); each later begin on its
	// key is evaluated afresh, except after max_attempts_exceeded or
	// approval_rejected, until the outcome is settled.
	if err := tx.QueryRow(ctx, sqlDeny, row.ID, in.now, code).Scan(out.dest()...); err != nil {
		return Decision{}, fmt.Errorf("begin: deny: %w", err)
	}
	return Decision{Decision: DecisionDenied, EffectID: out.ID, State: out.State, Attempt: out.Attempt,
		Denial: in.risk.denial(code, ev, &out)}, nil
}

// Why an approval was asked for (approvals.reason; gate_evaluate's
// approval_reason, which names the first of them that holds, in this order).
const (
	reasonPolicy      = "policy_requires_approval"
	reasonCircuitOpen = "circuit_open"
	reasonAmount      = "cost_at_or_above_threshold"
)

// approvalStillAnswers says whether the effect's approvals answer every
// question this begin needs an operator's yes to: the policy's mode, a
// breaker or the emergency stop holding the type with require_approval, and
// an amount at or above approval_above_micros. An approval answers what held
// when it was given (sqlDecideApproval), so the next begin after it executes
// (API.md §2.4; contract QA: a key held by the policy's mode and its amount
// at once was asked twice, the second time only after the first yes). What
// arises after the yes asks again: a require_approval mode or a lower
// threshold set later (QA: a breaker's yes carried a key through a mode set
// afterwards), a breaker or stop opened or given another action after it,
// stricter or weaker (the operator said yes to that incident and that
// hold, not to the next). Every approval the
// effect was given counts. When they do not answer, ev's reason becomes the
// first question still open, to ask next.
func (s *Service) approvalStillAnswers(ctx context.Context, tx pgx.Tx, row *effectRow, ev *eval, now time.Time) (bool, error) {
	var answered []string
	var circuitHolds bool
	if err := tx.QueryRow(ctx, sqlApprovalsAnswer, row.ID, row.WorkspaceID, row.EffectType, now).
		Scan(&answered, &circuitHolds); err != nil {
		return false, fmt.Errorf("begin: read approvals: %w", err)
	}
	var needed []string
	if ev.approvalReason == reasonPolicy {
		needed = append(needed, reasonPolicy)
	}
	if circuitHolds {
		needed = append(needed, reasonCircuitOpen)
	}
	if row.CostMicros != nil && ev.approvalAbove != nil && *row.CostMicros >= *ev.approvalAbove {
		needed = append(needed, reasonAmount)
	}
	if len(needed) == 0 {
		needed = []string{ev.approvalReason} // what gate_evaluate asks for
	}
	for _, reason := range needed {
		if !slices.Contains(answered, reason) {
			ev.approvalReason = reason
			return false, nil
		}
	}
	return true, nil
}

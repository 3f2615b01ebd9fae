package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Errors DoEffect returns for decisions that forbid acting now; match them
// with errors.Is, or errors.As the typed forms for their fields.
var (
	// ErrBlocked: a prior attempt's outcome is unknown. Verify at the vendor,
	// then have an operator resolve the effect.
	ErrBlocked = errors.New("ratchet: effect blocked: a prior attempt is indeterminate")
	// ErrApprovalRequired: an operator decision is pending.
	ErrApprovalRequired = errors.New("ratchet: effect awaits approval")
	// ErrDenied: policy, budget, breaker or rejection. Report the reason;
	// do not work around it.
	ErrDenied = errors.New("ratchet: effect denied")
	// ErrInFlight: another caller held a live lease until ctx ended.
	ErrInFlight = errors.New("ratchet: effect in flight elsewhere")
	// ErrResultNotStored: the action succeeded, but its result could not be
	// recorded (over the gate's size limit, refused by its rules, or not
	// JSON: a NaN, a failing MarshalJSON), so DoEffect
	// recorded the success with a small placeholder result instead
	// ({"ratchet":"result_not_recorded","reason":...}). The key is settled:
	// a later DoEffect with it is a duplicate and returns this error too,
	// with a zero Result, instead of acting again.
	ErrResultNotStored = errors.New("ratchet: the effect succeeded but its result was not stored")
)

// BlockedError is returned for a blocked decision.
type BlockedError struct {
	EffectID     string
	PriorAttempt *PriorAttempt // the attempt whose outcome is unknown
}

// Error implements error.
func (e *BlockedError) Error() string { return ErrBlocked.Error() + " (" + e.EffectID + ")" }

// Is makes errors.Is(err, ErrBlocked) true.
func (e *BlockedError) Is(target error) bool { return target == ErrBlocked }

// ApprovalRequiredError is returned for an approval_required decision. Call
// DoEffect again with the same key after approval to get execute.
type ApprovalRequiredError struct {
	EffectID   string
	ApprovalID string // the pending approval an operator decides
}

// Error implements error.
func (e *ApprovalRequiredError) Error() string {
	return ErrApprovalRequired.Error() + " (approval " + e.ApprovalID + ")"
}

// Is makes errors.Is(err, ErrApprovalRequired) true.
func (e *ApprovalRequiredError) Is(target error) bool { return target == ErrApprovalRequired }

// DeniedError is returned for a denied decision. Code is the reason
// (policy_denied, budget_exceeded, circuit_open, ...); the API error is
// wrapped, so ErrorCode(err) returns it too.
type DeniedError struct {
	EffectID string
	Code     string // the denial reason, an API error code
	Err      *Error // the full error, with Detail (resets_at, dimension, ...)
}

// Error implements error.
func (e *DeniedError) Error() string { return ErrDenied.Error() + ": " + e.Code }

// Is makes errors.Is(err, ErrDenied) true.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// Unwrap returns the API error that carried the denial.
func (e *DeniedError) Unwrap() error {
	if e.Err == nil {
		return nil // not a nil *Error in an interface: errors.As would hand it on (review)
	}
	return e.Err
}

// InFlightError is returned when ctx ended while another caller held the
// lease. It wraps the context's error.
type InFlightError struct {
	EffectID string
	Err      error // the context's error
}

// Error implements error.
func (e *InFlightError) Error() string {
	return ErrInFlight.Error() + " (" + e.EffectID + "): " + e.Err.Error()
}

// Is makes errors.Is(err, ErrInFlight) true.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// Unwrap returns the context error.
func (e *InFlightError) Unwrap() error { return e.Err }

// NotPerformedError marks an action error as certain not to have reached the
// outside world; DoEffect then reports the attempt failed, which allows a
// new attempt.
type NotPerformedError struct {
	Err error // the action's error
}

// Error implements error.
func (e *NotPerformedError) Error() string { return "not performed: " + e.Err.Error() }

// Unwrap returns the action's error.
func (e *NotPerformedError) Unwrap() error { return e.Err }

// NotPerformed wraps err to say the action definitely did not happen (the
// request was never sent, validation failed locally, the vendor refused it
// before acting). Only then is "failed" reported: a false "failed" licenses
// a duplicate. Any other error reports nothing and the effect becomes
// indeterminate when its lease lapses.
func NotPerformed(err error) error {
	if err == nil {
		err = errors.New("action not performed")
	}
	return &NotPerformedError{Err: err}
}

// Lease is what an action knows about its attempt.
type Lease struct {
	EffectID       string
	Attempt        int       // this attempt's number, from 1
	LeaseExpiresAt time.Time // as the grant answered it; DoEffect heartbeats the lease while the action runs, without updating this field
	// Probe is true when a prior attempt's outcome is unknown and the policy
	// is on_indeterminate: probe. Check the vendor for PriorAttempt first:
	// if it happened, return what you found instead of acting again.
	Probe        bool
	PriorAttempt *PriorAttempt
}

// EffectOutcome is the result of DoEffect.
type EffectOutcome[T any] struct {
	EffectID string
	Attempt  int // the attempt that produced Result
	// Result is the action's result, or the recorded one for a duplicate,
	// decoded into T by encoding/json: where T holds an any (T any,
	// map[string]any) a recorded number comes back a float64, and an
	// integer beyond 2^53 rounded, unlike the action's own value. A T typed
	// for the result (a struct with int64 fields, json.Number,
	// json.RawMessage) keeps it exact. (Decoding any's numbers otherwise
	// would change the type callers of 0.x already read.)
	Result T
	// Duplicate is true when the effect had already succeeded: the action
	// was not run and Result is the recorded result.
	Duplicate bool
}

// DoEffect wraps action in the gate's begin/report protocol:
//
//   - execute: run action, then report succeeded with its result. If the
//     action returns an error wrapped by NotPerformed, report failed; any
//     other error reports nothing (the lease lapses and the effect is
//     recorded indeterminate, which is the honest answer when unsure).
//   - duplicate: return the recorded result without acting.
//   - in_flight: ask again until ctx ends (then *InFlightError): after a
//     quarter of a second, doubling to five seconds, and never later than
//     retry_after_seconds (the time left on the holder's lease), since a
//     holder usually reports long before its lease would lapse.
//   - blocked, approval_required, denied: *BlockedError,
//     *ApprovalRequiredError, *DeniedError.
//
// A begin whose answers are all lost (network failures, a 5xx after which
// the server may have granted execute) is asked again under the same
// request_id past the client's retries, for up to 30 seconds from the
// first failure and within ctx: a lease one of them granted is given back
// to the repeat while it is live, instead of lapsing held by nobody. A
// begin already sent when ctx ends runs on to its answer (for up to 10
// seconds); an execute it brings is reported failed without calling the
// action (which surely did not run), and DoEffect returns ctx's error.
//
// While the action runs its lease is heartbeated. ctx passed to the action
// is cancelled with cause ErrLeaseLost if the server says the lease is gone,
// or if no heartbeat has extended it by shortly before it lapses (heartbeats
// failing with 5xx or network errors): after the lapse another caller may be
// granted execute, so the action must stop. When it lapses is measured on
// the local clock from the lease's length (its expiry minus the server's
// Date), not by comparing the server's timestamp with the local clock, and
// at least one heartbeat is tried before the lease is declared lost. The
// report is retried through transient failures while the lease stands
// (heartbeated meanwhile), for up to 30 seconds. If the action succeeded but
// the report was refused (say, 409 lease_expired) or never got through,
// DoEffect returns the outcome and the error. If the gate refused the
// success for its result (413 payload_too_large, or 400 on result), the
// success is reported again with a placeholder result, and DoEffect returns
// the outcome and an error matching ErrResultNotStored; so is a result that
// does not encode as JSON, which is never sent. A panic in the
// action propagates to the caller with nothing reported.
func DoEffect[T any](ctx context.Context, c *Client, req BeginRequest, action func(ctx context.Context, lease Lease) (T, error)) (*EffectOutcome[T], error) {
	if req.RequestID == "" {
		// One for the whole call: a begin whose answer was lost is answered
		// again by the next, whichever retry asks.
		req.RequestID = newRequestID()
	}
	inFlightWait := firstInFlightWait
	for {
		sent := time.Now()
		b, err := beginAnswered(ctx, c, req)
		if err != nil {
			return nil, err
		}
		switch b.Decision {
		case DecisionExecute:
			if ctx.Err() != nil {
				// Granted as ctx ended: the action is not called, so the
				// attempt surely did not act and is released for the next
				// caller rather than left to lapse indeterminate.
				return nil, releaseUnrun(ctx, c, b, sent)
			}
			return runLeased(ctx, c, b, sent, action)
		case DecisionDuplicate:
			out := &EffectOutcome[T]{EffectID: b.EffectID, Attempt: b.Attempt, Duplicate: true}
			if reason, ok := placeholderReason(b.Result); ok {
				return out, fmt.Errorf("%w: effect %s succeeded earlier, but its result could not be recorded (%s) and a placeholder was recorded",
					ErrResultNotStored, b.EffectID, reason)
			}
			if len(b.Result) > 0 {
				if err := json.Unmarshal(b.Result, &out.Result); err != nil {
					return out, fmt.Errorf("ratchet: decode recorded result of %s: %w", b.EffectID, err)
				}
			}
			return out, nil
		case DecisionInFlight:
			// QA: waiting the whole retry_after_seconds kept a concurrent
			// caller a minute behind a holder that finished in a second.
			wait := min(inFlightWait, time.Duration(max(b.RetryAfterSeconds, 1))*time.Second)
			inFlightWait = min(2*inFlightWait, maxInFlightWait)
			if err := c.sleep(ctx, wait); err != nil {
				return nil, &InFlightError{EffectID: b.EffectID, Err: err}
			}
		case DecisionBlocked:
			return nil, &BlockedError{EffectID: b.EffectID, PriorAttempt: b.PriorAttempt}
		case DecisionApprovalRequired:
			return nil, &ApprovalRequiredError{EffectID: b.EffectID, ApprovalID: b.ApprovalID}
		case DecisionDenied:
			d := &DeniedError{EffectID: b.EffectID, Err: b.Denial}
			if b.Denial != nil {
				d.Code = b.Denial.Code
			}
			return nil, d
		default:
			return nil, fmt.Errorf("ratchet: unknown begin decision %q", b.Decision)
		}
	}
}

// beginPatience bounds how long DoEffect asks again for a begin whose
// answers were lost, from its first failure.
const beginPatience = 30 * time.Second

// beginAnswered is Begin, asked again under the same request_id, past the
// client's retries, while every answer was lost (a network failure, a 5xx
// after the server may have acted: a database failover, an ended
// connection), for up to beginPatience and within ctx. A lost answer may
// have granted execute, and only a repeat of its request_id gets that
// lease back while it is live: given up after MaxRetries, the lease was
// held by nobody, and the key turned indeterminate (blocked under the
// default policy) though the action never ran (chaos QA). A failure that
// surely granted nothing (not_applied, a refusal) is returned at once.
func beginAnswered(ctx context.Context, c *Client, req BeginRequest) (*BeginResponse, error) {
	bctx, stop := sentRunsOn(ctx)
	defer stop()
	var horizon time.Time
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil && attempt == 0 {
			// Not sent once ctx has ended: its execute could only be
			// released, spending one of the key's max_attempts.
			return nil, err
		}
		b, err := c.Begin(bctx, req)
		if err != nil && attempt > 0 {
			err = unconfirmedIf(true, err) // an earlier call's answers were lost
		}
		if err == nil || !mayHaveApplied(err) || ctx.Err() != nil {
			return b, err
		}
		if horizon.IsZero() {
			horizon = time.Now().Add(beginPatience)
		}
		wait, retry := c.retryDelay(err, attempt, idempotent)
		if dl, ok := ctx.Deadline(); ok && dl.Before(horizon) {
			horizon = dl
		}
		if !retry || !time.Now().Add(wait).Before(horizon) || c.sleep(ctx, wait) != nil {
			return nil, err
		}
	}
}

// beginGrace is how long a begin already sent may still take to answer
// once the caller's ctx has ended.
const beginGrace = 10 * time.Second

// sentRunsOn returns the context DoEffect's begins are sent under: a begin
// already sent when ctx ends runs on to its answer (for up to beginGrace),
// while waits before a repeat end with ctx. Cut off, a begin that granted
// execute left its lease to lapse held by nobody, and the key turned
// indeterminate (blocked under the default policy) though the action never
// ran (sdk QA; the TypeScript SDK's doEffect awaits a begin already sent,
// and the Python SDK's do_effect_async releases what it answers).
func sentRunsOn(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancel(withRetryCutoff(context.WithoutCancel(ctx), ctx.Done()))
	stopAfter := context.AfterFunc(ctx, func() { time.AfterFunc(beginGrace, cancel) })
	return bctx, func() { stopAfter(); cancel() }
}

// releaseUnrun reports failed an execute granted after ctx ended, whose
// action was never called, and returns ctx's error (joined with the
// report's failure, if any: the lease then lapses, indeterminate).
func releaseUnrun(ctx context.Context, c *Client, b *BeginResponse, sent time.Time) error {
	var expires time.Time
	if b.LeaseExpiresAt != nil {
		expires = *b.LeaseExpiresAt
	}
	err := fmt.Errorf("ratchet: effect %s: the action was not run: %w", b.EffectID, context.Cause(ctx))
	if rerr := reportEffect(ctx, c, b, OutcomeFailed, nil, &leaseExpiry{t: localExpiry(expires, b.serverDate, sent)}); rerr != nil {
		return errors.Join(err, fmt.Errorf("ratchet: release its lease: %w", rerr))
	}
	return err
}

// How often DoEffect asks again while another caller holds the lease: from
// firstInFlightWait, doubling to maxInFlightWait (a begin that finds a live
// lease is one indexed read).
const (
	firstInFlightWait = 250 * time.Millisecond
	maxInFlightWait   = 5 * time.Second
)

// runLeased performs the action under a heartbeated lease and reports. sent
// is when the begin that granted the lease was sent.
func runLeased[T any](ctx context.Context, c *Client, b *BeginResponse, sent time.Time, action func(context.Context, Lease) (T, error)) (*EffectOutcome[T], error) {
	lease := Lease{EffectID: b.EffectID, Attempt: b.Attempt, Probe: b.Probe, PriorAttempt: b.PriorAttempt}
	if b.LeaseExpiresAt != nil {
		lease.LeaseExpiresAt = *b.LeaseExpiresAt
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The heartbeats run until the outcome is reported, not just while the
	// action runs: a report retried through a server blip must still find
	// the lease. Nor do they end with the caller's ctx: an action still at
	// the vendor when ctx ends keeps its lease until it returns (sdk QA:
	// the lease lapsed under it, and under on_indeterminate retry or probe
	// another caller acted alongside it), as in the Python and TypeScript
	// SDKs.
	hbCtx, stopHB := context.WithCancel(context.WithoutCancel(ctx))
	// Deferred too: if the action panics, the heartbeats must stop so the
	// lease lapses (an honest indeterminate) instead of being kept alive.
	defer stopHB()
	expiry := &leaseExpiry{t: localExpiry(lease.LeaseExpiresAt, b.serverDate, sent)}
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		heartbeatEffect(hbCtx, c, b.EffectID, b.LeaseToken, expiry, cancel)
	}()
	stopHeartbeats := func() { stopHB(); <-hbDone }
	result, err := action(actx, lease)

	out := &EffectOutcome[T]{EffectID: b.EffectID, Attempt: b.Attempt}
	if err != nil {
		var np *NotPerformedError
		if !errors.As(err, &np) {
			stopHeartbeats() // report nothing: the lease lapses
			return nil, err
		}
		rerr := reportEffect(ctx, c, b, OutcomeFailed, nil, expiry)
		stopHeartbeats()
		if rerr != nil {
			return nil, errors.Join(err, fmt.Errorf("ratchet: report failed outcome: %w", rerr))
		}
		return nil, err
	}
	out.Result = result
	// Encoded once, here: a result that is not JSON (a NaN, a channel, a
	// failing MarshalJSON) can never be sent, and was retried as if the
	// network had failed until the report gave up, leaving an action that
	// happened to lapse indeterminate (QA: the Python and TypeScript SDKs
	// record it with a placeholder).
	raw, merr := json.Marshal(result)
	rerr := error(&resultNotJSONError{err: merr})
	if merr == nil {
		rerr = reportEffect(ctx, c, b, OutcomeSucceeded, json.RawMessage(raw), expiry)
	}
	if reason, ok := unrecordableResult(rerr); ok {
		// The action happened; only its result cannot be kept. Recording
		// the success without it settles the key: left unreported it would
		// become indeterminate, and with on_indeterminate: retry the next
		// caller would perform the action again.
		perr := reportEffect(ctx, c, b, OutcomeSucceeded, placeholder(reason), expiry)
		stopHeartbeats()
		if perr != nil {
			return out, fmt.Errorf("ratchet: the action succeeded but its result cannot be recorded (%w), "+
				"and the placeholder reported instead was not recorded: %w", rerr, perr)
		}
		return out, fmt.Errorf("%w: the result of %s cannot be recorded (%s), so a placeholder was recorded: %w",
			ErrResultNotStored, b.EffectID, reason, rerr)
	}
	stopHeartbeats()
	if rerr != nil {
		return out, fmt.Errorf("ratchet: the action succeeded but its report %s: %w", reportFate(rerr), rerr)
	}
	return out, nil
}

// reportFate says what became of a report that failed with err: not
// recorded (every attempt refused, or turned away before it acted), or
// unknown (an attempt's answer was lost: the gate may have recorded it, QA).
func reportFate(err error) string {
	if mayHaveApplied(err) {
		return "may have been recorded (an answer was lost; the key's next begin answers duplicate if it was)"
	}
	return "was not recorded"
}

// placeholderMark is the "ratchet" field of the result recorded in place of
// one the gate refused.
const placeholderMark = "result_not_recorded"

// placeholder is the result recorded for a success whose own result the
// gate refused, saying why (an error code, or the refused field).
func placeholder(reason string) map[string]string {
	return map[string]string{"ratchet": placeholderMark, "reason": reason}
}

// placeholderReason says whether a recorded result is a placeholder, and why.
func placeholderReason(raw json.RawMessage) (string, bool) {
	var p struct {
		Ratchet string `json:"ratchet"`
		Reason  string `json:"reason"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &p) != nil || p.Ratchet != placeholderMark {
		return "", false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil || len(fields) != 2 {
		return "", false
	}
	return p.Reason, true
}

// unrecordableResult says whether a success report's refusal is about its
// result (which a report without it would not meet), and names why: 413 for
// its size, or 400 naming a field under result (the path, never a value).
func unrecordableResult(err error) (string, bool) {
	var notJSON *resultNotJSONError
	if errors.As(err, &notJSON) {
		return resultNotJSON, true
	}
	var apiErr *Error
	if !errors.As(err, &apiErr) {
		return "", false
	}
	if apiErr.StatusCode == http.StatusRequestEntityTooLarge {
		return CodePayloadTooLarge, true
	}
	if apiErr.Code == CodeInvalidRequest {
		for _, f := range apiErr.Validation() {
			// The body: only the result can make a report's body
			// unreadable (nested more levels deep than the gate reads).
			if f.Field == "result" || f.Field == "body" || strings.HasPrefix(f.Field, "result.") {
				return "invalid_request at " + f.Field, true
			}
		}
	}
	return "", false
}

// resultNotJSON is the placeholder's reason for a result that does not
// encode as JSON (the Python and TypeScript SDKs' word for it too).
const resultNotJSON = "result_not_json"

// resultNotJSONError is why a result that does not encode as JSON was not
// sent: the gate never saw it.
type resultNotJSONError struct{ err error }

// Error implements error.
func (e *resultNotJSONError) Error() string {
	return "the result does not encode as JSON: " + e.err.Error()
}

// Unwrap returns the encoder's error.
func (e *resultNotJSONError) Unwrap() error { return e.err }

// reportEffect records the action's outcome. What the server cannot take
// for now (a 5xx, a 429, a network failure) is sent again with backoff
// while the lease stands, which the heartbeats keep extending, for at most
// reportTimeout: the client's own few retries last seconds, and a performed
// action whose report is dropped becomes an indeterminate effect that an
// operator must resolve. The report is sent even if the caller's ctx has
// ended, for the same reason.
func reportEffect(ctx context.Context, c *Client, b *BeginResponse, outcome string, result any, expiry *leaseExpiry) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	horizon, _ := rctx.Deadline()
	unsure := false // an attempt may have been recorded though it failed
	for attempt := 0; ; attempt++ {
		_, err := c.ReportEffect(rctx, b.EffectID, b.LeaseToken, outcome, result)
		if err == nil || reportLanded(err, outcome) {
			return nil
		}
		unsure = unsure || mayHaveApplied(err)
		wait, retry := effectReportDelay(c, err, attempt)
		last := horizon
		if exp := expiry.get(); !exp.IsZero() && exp.Before(last) {
			last = exp // a report after the lapse would be refused
		}
		if !retry || !time.Now().Add(wait).Before(last) || c.sleep(rctx, wait) != nil {
			return unconfirmedIf(unsure, err)
		}
	}
}

// effectReportDelay is the client's answer for an effect report, and a bare
// 4xx (notRatchets: a proxy's, a load balancer's or a platform's answer
// during a deploy or a misroute, a 404, a 408) is retried too, as a job's
// report is (reporter.retryDelay): it says nothing of the report (sdk QA:
// given up at once, the lease lapsed and the performed action read
// indeterminate); but not a bare 413, a body the proxy refuses for good
// (unrecordableResult).
func effectReportDelay(c *Client, err error, attempt int) (time.Duration, bool) {
	var apiErr *Error
	if notRatchets(err) && errors.As(err, &apiErr) && apiErr.StatusCode >= 400 && apiErr.StatusCode < 500 &&
		apiErr.StatusCode != http.StatusRequestEntityTooLarge {
		return c.backoff(attempt), true
	}
	return c.retryDelay(err, attempt, idempotent)
}

// reportLanded says whether a report's refusal says an earlier send of the
// same report was recorded: lease_lost naming the outcome its attempt was
// reported (the first send landed, its answer was lost, and a newer attempt
// began before the retry; sdk QA: that landed report was said not to be),
// as the workers read it.
func reportLanded(err error, outcome string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CodeLeaseLost && e.Detail["reported_outcome"] == outcome
}

// effectLeaseMargin is how long before an effect lease's known expiry
// DoEffect cancels an action whose heartbeats have not extended it (at most
// a quarter of the lease granted). Once the lease lapses the server may
// grant execute to another caller, so the action must have been told to
// stop by then.
const effectLeaseMargin = time.Second

// localExpiry turns a lease's expiry on the server's clock into one on the
// local clock: the request that granted it was sent at sent (local), and
// the lease then lasted its expiry minus the server's Date, less a second
// because Date has whole seconds and is read after the grant. That is never
// later than the real lapse, whatever the two clocks say. Without a Date
// header the clocks are assumed to agree.
func localExpiry(expires, serverDate, sent time.Time) time.Time {
	if expires.IsZero() || serverDate.IsZero() {
		return expires
	}
	return sent.Add(expires.Sub(serverDate) - time.Second)
}

// leaseExpiry is an effect lease's expiry as last extended, on the local
// clock (see localExpiry), shared by the heartbeats that extend it and the
// report that must land before it lapses.
type leaseExpiry struct {
	mu sync.Mutex
	t  time.Time
}

func (l *leaseExpiry) get() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t
}

func (l *leaseExpiry) set(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t = t
}

// heartbeatEffect extends the effect lease at a third of what is left. It
// cancels the action (cause matching ErrLeaseLost) when the server says the
// lease is gone, and also when the lease is about to lapse without a
// heartbeat having extended it (5xx, network failures): the server then
// treats the attempt as indeterminate and may let another caller execute,
// so the action must not run on unaware. A heartbeat is always tried before
// the lease is given up for lapsed, however little of it seemed left.
func heartbeatEffect(ctx context.Context, c *Client, id, token string, expiry *leaseExpiry, cancel context.CancelCauseFunc) {
	expires := expiry.get()
	if expires.IsZero() {
		return
	}
	margin := max(min(effectLeaseMargin, time.Until(expires)/4), 0)
	var lastErr error
	tried := false    // a heartbeat was sent since the lease was last extended
	extended := false // a heartbeat has extended the lease
	for {
		deadline := expires.Add(-margin)
		d := min(max(time.Until(expires)/3, minHeartbeat), maxHeartbeat, time.Until(deadline))
		if extended && !tried {
			// Just extended: the server vouches for the lease now, so the
			// next heartbeat waits at least minHeartbeat even if our
			// estimate of the lapse is off (a server without Date and a
			// skewed clock), rather than heartbeating in a loop.
			d = max(d, minHeartbeat)
		}
		if sleepCtx(ctx, d) != nil {
			return
		}
		if tried && !time.Now().Before(deadline) {
			cancel(lapsedLease(lastErr))
			return
		}
		bound := deadline
		if !tried { // the first try gets its chance even past the deadline
			bound = later(deadline, time.Now().Add(minHeartbeat))
		}
		tried = true
		sent := time.Now()
		hb, err := heartbeatBefore(ctx, c, id, token, bound)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if effectLeaseGone(err) {
				cancel(&effectLeaseLostError{reason: ErrorCode(err)})
				return
			}
			lastErr = err
			continue // transient: try again sooner, as the lease shrinks
		}
		expires, lastErr, tried, extended = localExpiry(hb.LeaseExpiresAt, hb.serverDate, sent), nil, false, true
		expiry.set(expires)
	}
}

// effectLeaseGone says whether an effect heartbeat's refusal means the
// lease is gone for good, as the Python and TypeScript SDKs read it: a 409
// (lease_expired, lease_lost, invalid_state: the lease lapsed, a newer
// attempt exists, or the attempt was reported) or a 404 (the effect no
// longer exists; sdk QA: the Go SDK alone took it for a failed heartbeat
// and let the action run on until the lease lapsed), in Ratchet's error
// envelope. A bare one (notRatchets: a proxy's, a load balancer's or a
// platform's answer during a deploy or a misroute) says nothing of the
// lease, as for a job's heartbeat, and is tried again (sdk QA: it
// cancelled the action and ended the heartbeats, so the lease then lapsed
// for real).
func effectLeaseGone(err error) bool {
	var apiErr *Error
	return errors.As(err, &apiErr) && !notRatchets(err) &&
		(apiErr.StatusCode == http.StatusNotFound || apiErr.StatusCode == http.StatusConflict)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// heartbeatBefore sends one heartbeat (with the client's retries) that
// gives up at deadline, so a hung request cannot hold the action past it.
func heartbeatBefore(ctx context.Context, c *Client, id, token string, deadline time.Time) (effectHeartbeat, error) {
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return c.heartbeatEffect(hctx, id, token)
}

// effectLeaseLostError is the cause an action is cancelled with when its
// effect lease is gone or about to lapse unextended; it matches
// ErrLeaseLost (whose own text speaks of jobs).
type effectLeaseLostError struct {
	reason  string // the server's code, or why the SDK gave the lease up
	lastErr error  // the last heartbeat failure, if any
}

// Error implements error.
func (e *effectLeaseLostError) Error() string {
	s := "ratchet: effect lease lost: " + e.reason
	if e.lastErr != nil {
		s += " (last failure: " + e.lastErr.Error() + ")"
	}
	return s
}

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *effectLeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// lapsedLease is the cause an action is cancelled with when its lease is
// about to lapse unextended; it matches ErrLeaseLost.
func lapsedLease(lastErr error) error {
	return &effectLeaseLostError{reason: "no heartbeat extended the effect lease before it lapsed", lastErr: lastErr}
}

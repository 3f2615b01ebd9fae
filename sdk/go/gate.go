package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
func (e *DeniedError) Unwrap() error { return e.Err }

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
	LeaseExpiresAt time.Time // heartbeated by DoEffect while the action runs
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
	// Result is the action's result, or the recorded one for a duplicate.
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
//   - in_flight: wait retry_after_seconds and ask again until ctx ends
//     (then *InFlightError).
//   - blocked, approval_required, denied: *BlockedError,
//     *ApprovalRequiredError, *DeniedError.
//
// While the action runs its lease is heartbeated. ctx passed to the action
// is cancelled with cause ErrLeaseLost if the server says the lease is gone,
// or if no heartbeat has extended it by shortly before it lapses (heartbeats
// failing with 5xx or network errors): after the lapse another caller may be
// granted execute, so the action must stop. The report is retried through
// transient failures while the lease stands (heartbeated meanwhile), for up
// to 30 seconds. If the action succeeded but the report was refused (say,
// 409 lease_expired) or never got through, DoEffect returns the outcome and
// the error. A panic in the action propagates to the caller with nothing
// reported.
func DoEffect[T any](ctx context.Context, c *Client, req BeginRequest, action func(ctx context.Context, lease Lease) (T, error)) (*EffectOutcome[T], error) {
	for {
		b, err := c.Begin(ctx, req)
		if err != nil {
			return nil, err
		}
		switch b.Decision {
		case DecisionExecute:
			return runLeased(ctx, c, b, action)
		case DecisionDuplicate:
			out := &EffectOutcome[T]{EffectID: b.EffectID, Attempt: b.Attempt, Duplicate: true}
			if len(b.Result) > 0 {
				if err := json.Unmarshal(b.Result, &out.Result); err != nil {
					return out, fmt.Errorf("ratchet: decode recorded result of %s: %w", b.EffectID, err)
				}
			}
			return out, nil
		case DecisionInFlight:
			wait := time.Duration(max(b.RetryAfterSeconds, 1)) * time.Second
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

// runLeased performs the action under a heartbeated lease and reports.
func runLeased[T any](ctx context.Context, c *Client, b *BeginResponse, action func(context.Context, Lease) (T, error)) (*EffectOutcome[T], error) {
	lease := Lease{EffectID: b.EffectID, Attempt: b.Attempt, Probe: b.Probe, PriorAttempt: b.PriorAttempt}
	if b.LeaseExpiresAt != nil {
		lease.LeaseExpiresAt = *b.LeaseExpiresAt
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The heartbeats run until the outcome is reported, not just while the
	// action runs: a report retried through a server blip must still find
	// the lease. They end with the caller's ctx, as the action does.
	hbCtx, stopHB := context.WithCancel(ctx)
	// Deferred too: if the action panics, the heartbeats must stop so the
	// lease lapses (an honest indeterminate) instead of being kept alive.
	defer stopHB()
	expiry := &leaseExpiry{t: lease.LeaseExpiresAt}
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
	rerr := reportEffect(ctx, c, b, OutcomeSucceeded, result, expiry)
	stopHeartbeats()
	if rerr != nil {
		return out, fmt.Errorf("ratchet: the action succeeded but its report was not recorded: %w", rerr)
	}
	return out, nil
}

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
	for attempt := 0; ; attempt++ {
		_, err := c.ReportEffect(rctx, b.EffectID, b.LeaseToken, outcome, result)
		if err == nil {
			return nil
		}
		wait, retry := c.retryDelay(err, attempt, idempotent)
		last := horizon
		if exp := expiry.get(); !exp.IsZero() && exp.Before(last) {
			last = exp // a report after the lapse would be refused
		}
		if !retry || !time.Now().Add(wait).Before(last) {
			return err
		}
		if c.sleep(rctx, wait) != nil {
			return err
		}
	}
}

// effectLeaseMargin is how long before an effect lease's known expiry
// DoEffect cancels an action whose heartbeats have not extended it (at most
// a quarter of the lease granted). Once the lease lapses the server may
// grant execute to another caller, so the action must have been told to
// stop by then; the margin covers a server clock running a little ahead.
const effectLeaseMargin = time.Second

// leaseExpiry is an effect lease's expiry as last extended, shared by the
// heartbeats that extend it and the report that must land before it lapses.
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
// cancels the action (cause ErrLeaseLost) when the server says the lease is
// gone, and also when the lease is about to lapse without a heartbeat having
// extended it (5xx, network failures): the server then treats the attempt
// as indeterminate and may let another caller execute, so the action must
// not run on unaware.
func heartbeatEffect(ctx context.Context, c *Client, id, token string, expiry *leaseExpiry, cancel context.CancelCauseFunc) {
	expires := expiry.get()
	if expires.IsZero() {
		return
	}
	margin := min(effectLeaseMargin, time.Until(expires)/4)
	var lastErr error
	for {
		deadline := expires.Add(-margin)
		d := min(max(time.Until(expires)/3, minHeartbeat), maxHeartbeat, time.Until(deadline))
		if sleepCtx(ctx, d) != nil {
			return
		}
		if !time.Now().Before(deadline) {
			cancel(lapsedLease(lastErr))
			return
		}
		next, err := heartbeatBefore(ctx, c, id, token, deadline)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if IsCode(err, CodeLeaseExpired) || IsCode(err, CodeLeaseLost) || IsCode(err, CodeInvalidState) {
				cancel(ErrLeaseLost)
				return
			}
			lastErr = err
			continue // transient: try again sooner, as the lease shrinks
		}
		expires, lastErr = next, nil
		expiry.set(next)
	}
}

// heartbeatBefore sends one heartbeat (with the client's retries) that
// gives up at deadline, so a hung request cannot hold the action past it.
func heartbeatBefore(ctx context.Context, c *Client, id, token string, deadline time.Time) (time.Time, error) {
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return c.HeartbeatEffect(hctx, id, token)
}

// lapsedLease is the cause an action is cancelled with when its lease is
// about to lapse unextended; it matches ErrLeaseLost.
func lapsedLease(lastErr error) error {
	if lastErr == nil {
		return fmt.Errorf("%w: no heartbeat extended the effect lease before it lapsed", ErrLeaseLost)
	}
	return fmt.Errorf("%w: no heartbeat extended the effect lease before it lapsed (last failure: %v)", ErrLeaseLost, lastErr)
}

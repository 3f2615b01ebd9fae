package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeGate answers begin with scripted decisions and records reports.
type fakeGate struct {
	mu         sync.Mutex
	begins     []map[string]any
	answers    []func(w http.ResponseWriter)
	reports    []map[string]any
	report     func(w http.ResponseWriter) // optional: answers reports
	heartbeat  func(w http.ResponseWriter) // optional: answers heartbeats
	heartbeats int
}

func (g *fakeGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case r.URL.Path == "/api/v1/effects/begin":
		g.begins = append(g.begins, body)
		i := min(len(g.begins), len(g.answers)) - 1
		g.answers[i](w)
	case strings.HasSuffix(r.URL.Path, "/heartbeat") && g.heartbeat != nil:
		g.heartbeats++
		g.heartbeat(w)
	case strings.HasSuffix(r.URL.Path, "/report"):
		g.reports = append(g.reports, body)
		if g.report != nil {
			g.report(w)
			return
		}
		writeJSON(w, 200, map[string]any{"id": "eff_1", "state": body["outcome"]})
	default:
		apiError(w, 404, CodeNotFound, nil)
	}
}

func decision(status int, body map[string]any) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) { writeJSON(w, status, body) }
}

func execute() func(w http.ResponseWriter) {
	return decision(200, map[string]any{"decision": "execute", "effect_id": "eff_1", "state": "leased", "attempt": 1,
		"lease_token": "lt_1", "lease_expires_at": time.Now().Add(time.Minute), "probe": false})
}

type sendResult struct {
	MessageID string `json:"message_id"`
}

var beginReq = BeginRequest{EffectType: "email.send", IdempotencyKey: "welcome-email:user_123",
	Payload: map[string]string{"to": "user_123"}, CostMicros: Micros(0), Dimensions: map[string]string{"recipient": "user_123"}}

func TestDoEffectExecuteReportsSucceeded(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	c, _ := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(ctx context.Context, l Lease) (sendResult, error) {
		if l.EffectID != "eff_1" || l.Attempt != 1 || l.Probe {
			t.Errorf("lease %+v", l)
		}
		return sendResult{MessageID: "msg_1"}, nil
	})
	if err != nil || out.Result.MessageID != "msg_1" || out.Duplicate {
		t.Fatalf("out %+v err %v", out, err)
	}
	if len(g.reports) != 1 || g.reports[0]["outcome"] != "succeeded" || g.reports[0]["lease_token"] != "lt_1" ||
		g.reports[0]["result"].(map[string]any)["message_id"] != "msg_1" {
		t.Fatalf("reports %v", g.reports)
	}
	b := g.begins[0]
	if b["effect_type"] != "email.send" || b["idempotency_key"] != "welcome-email:user_123" || b["cost_micros"] != 0.0 ||
		b["dimensions"].(map[string]any)["recipient"] != "user_123" {
		t.Fatalf("begin body %v", b)
	}
	for _, absent := range []string{"run_id", "group_id", "compensation", "lease_seconds"} {
		if _, ok := b[absent]; ok {
			t.Fatalf("sent %s unasked: %v", absent, b)
		}
	}
}

func TestDoEffectNotPerformedReportsFailed(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	c, _ := testClient(t, g)
	cause := errors.New("recipient invalid")
	_, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{}, NotPerformed(cause)
	})
	if !errors.Is(err, cause) {
		t.Fatalf("err %v", err)
	}
	if len(g.reports) != 1 || g.reports[0]["outcome"] != "failed" {
		t.Fatalf("reports %v", g.reports)
	}
}

func TestDoEffectUnsureErrorReportsNothing(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	c, _ := testClient(t, g)
	cause := errors.New("timeout talking to vendor")
	_, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{}, cause
	})
	if !errors.Is(err, cause) || len(g.reports) != 0 {
		t.Fatalf("err %v reports %v", err, g.reports)
	}
}

func TestDoEffectDuplicateReturnsRecordedResult(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "duplicate",
		"effect_id": "eff_1", "state": "succeeded", "attempt": 1, "result": map[string]any{"message_id": "msg_0"}})}}
	c, _ := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		t.Error("acted on a duplicate")
		return sendResult{}, nil
	})
	if err != nil || !out.Duplicate || out.Result.MessageID != "msg_0" || len(g.reports) != 0 {
		t.Fatalf("out %+v err %v", out, err)
	}
}

// A recorded result is decoded into T: typed for it, an integer beyond
// 2^53 comes back exact; into an any, as encoding/json reads it (a float64,
// the type 0.x callers assert), as EffectOutcome.Result documents.
func TestDoEffectDuplicateDecodesTheRecordedResultIntoT(t *testing.T) {
	t.Parallel()
	const big = int64(1)<<53 + 1
	dup := func() *fakeGate {
		return &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "duplicate",
			"effect_id": "eff_1", "state": "succeeded", "attempt": 1, "result": json.RawMessage(`{"id":9007199254740993}`)})}}
	}
	c, _ := testClient(t, dup())
	typed, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (struct{ ID int64 }, error) {
		t.Error("acted on a duplicate")
		return struct{ ID int64 }{}, nil
	})
	if err != nil || typed.Result.ID != big {
		t.Fatalf("typed result %+v err %v, want ID %d", typed, err, big)
	}
	c, _ = testClient(t, dup())
	untyped, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (any, error) {
		t.Error("acted on a duplicate")
		return nil, nil
	})
	if m, ok := untyped.Result.(map[string]any); err != nil || !ok {
		t.Fatalf("untyped result %#v err %v", untyped.Result, err)
	} else if _, isFloat := m["id"].(float64); !isFloat {
		t.Fatalf("untyped id %T, want the float64 encoding/json reads", m["id"])
	}
}

func TestDoEffectInFlightWaitsAndAsksAgain(t *testing.T) {
	t.Parallel()
	inFlight := decision(200, map[string]any{"decision": "in_flight", "effect_id": "eff_1", "state": "leased",
		"attempt": 1, "retry_after_seconds": 7})
	g := &fakeGate{answers: []func(http.ResponseWriter){inFlight, inFlight, inFlight, inFlight, inFlight, inFlight,
		inFlight, decision(200, map[string]any{"decision": "duplicate", "effect_id": "eff_1", "state": "succeeded",
			"attempt": 1, "result": map[string]any{"message_id": "m"}})}}
	c, log := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{}, errors.New("must not run")
	})
	if err != nil || !out.Duplicate {
		t.Fatalf("out %+v err %v", out, err)
	}
	// Soon at first (a holder usually reports long before its lease lapses),
	// then less often, never later than the time left on the lease.
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 5 * time.Second, 5 * time.Second}
	if got := log.all(); !slices.Equal(got, want) || len(g.begins) != 8 {
		t.Fatalf("sleeps %v begins %d", got, len(g.begins))
	}
}

func TestDoEffectInFlightUntilContextEnds(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "in_flight",
		"effect_id": "eff_1", "state": "leased", "attempt": 1, "retry_after_seconds": 4})}}
	c, _ := testClient(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	c.sleep = func(context.Context, time.Duration) error { cancel(); return context.Canceled }
	_, err := DoEffect(ctx, c, beginReq, func(context.Context, Lease) (sendResult, error) { return sendResult{}, nil })
	var ife *InFlightError
	if !errors.Is(err, ErrInFlight) || !errors.As(err, &ife) || !errors.Is(err, context.Canceled) || ife.EffectID != "eff_1" {
		t.Fatalf("err %v", err)
	}
}

func TestDoEffectRefusals(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		answer func(http.ResponseWriter)
		check  func(t *testing.T, err error)
	}{
		{"blocked", decision(200, map[string]any{"decision": "blocked", "effect_id": "eff_1", "state": "indeterminate",
			"attempt": 1, "prior_attempt": map[string]any{"attempt": 1, "started_at": time.Now(), "lease_expired_at": time.Now()}}),
			func(t *testing.T, err error) {
				var be *BlockedError
				if !errors.Is(err, ErrBlocked) || !errors.As(err, &be) || be.PriorAttempt == nil || be.PriorAttempt.Attempt != 1 {
					t.Fatalf("err %v", err)
				}
			}},
		{"approval_required", decision(200, map[string]any{"decision": "approval_required", "effect_id": "eff_1",
			"state": "awaiting_approval", "attempt": 0, "approval_id": "apr_1"}),
			func(t *testing.T, err error) {
				var ae *ApprovalRequiredError
				if !errors.Is(err, ErrApprovalRequired) || !errors.As(err, &ae) || ae.ApprovalID != "apr_1" {
					t.Fatalf("err %v", err)
				}
			}},
		{"denied", decision(403, map[string]any{"decision": "denied", "effect_id": "eff_1", "state": "denied", "attempt": 0,
			"error": map[string]any{"code": "budget_exceeded", "message": "over", "detail": map[string]any{"resets_at": "2026-01-02T00:00:00Z"}}}),
			func(t *testing.T, err error) {
				var de *DeniedError
				if !errors.Is(err, ErrDenied) || !errors.As(err, &de) || de.Code != CodeBudgetExceeded ||
					ErrorCode(err) != CodeBudgetExceeded || de.Err.Detail["resets_at"] == nil {
					t.Fatalf("err %v", err)
				}
			}},
		{"forbidden is an API error, not a denial", func(w http.ResponseWriter) {
			apiError(w, 403, CodeForbidden, map[string]any{"required": []string{"effects:begin"}})
		}, func(t *testing.T, err error) {
			if errors.Is(err, ErrDenied) || !IsCode(err, CodeForbidden) {
				t.Fatalf("err %v", err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := &fakeGate{answers: []func(http.ResponseWriter){tc.answer}}
			c, _ := testClient(t, g)
			_, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
				t.Error("acted")
				return sendResult{}, nil
			})
			tc.check(t, err)
			if len(g.reports) != 0 {
				t.Fatalf("reported %v", g.reports)
			}
		})
	}
}

func TestDoEffectReportRefusedReturnsOutcomeAndError(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()},
		report: func(w http.ResponseWriter) { apiError(w, 409, CodeLeaseExpired, nil) }}
	c, _ := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{MessageID: "msg_late"}, nil
	})
	if !IsCode(err, CodeLeaseExpired) || out == nil || out.Result.MessageID != "msg_late" {
		t.Fatalf("out %+v err %v", out, err)
	}
}

// The error says whether the report was refused or its answer lost: a
// report whose answer never came back may have been recorded (QA: "was not
// recorded" sent an operator looking for an effect that had succeeded).
func TestDoEffectSaysWhetherTheReportWasRefusedOrItsAnswerLost(t *testing.T) {
	t.Parallel()
	// A short lease: the report is retried through 5xx only while it stands.
	short := decision(200, map[string]any{"decision": "execute", "effect_id": "eff_1", "state": "leased",
		"attempt": 1, "lease_token": "lt_1", "lease_expires_at": time.Now().Add(2 * time.Second), "probe": false})
	for status, want := range map[int]string{409: "its report was not recorded", 503: "may have been recorded"} {
		g := &fakeGate{answers: []func(http.ResponseWriter){short},
			report: func(w http.ResponseWriter) { apiError(w, status, CodeLeaseExpired, nil) }}
		c, _ := testClient(t, g)
		c.maxRetries = 0
		_, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
			return sendResult{MessageID: "msg_1"}, nil
		})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%d: err %v", status, err)
		}
	}
}

// A report whose first answer was lost and whose retries were then turned
// away (a 429 at the end) may still have been recorded (review).
func TestDoEffectReportLostThenRefusedIsUnconfirmed(t *testing.T) {
	t.Parallel()
	short := decision(200, map[string]any{"decision": "execute", "effect_id": "eff_1", "state": "leased",
		"attempt": 1, "lease_token": "lt_1", "lease_expires_at": time.Now().Add(2 * time.Second), "probe": false})
	g := &fakeGate{answers: []func(http.ResponseWriter){short}}
	g.report = func(w http.ResponseWriter) {
		if len(g.reports) == 1 {
			apiError(w, 502, CodeInternal, nil)
			return
		}
		apiError(w, 409, CodeLeaseExpired, nil)
	}
	c, _ := testClient(t, g)
	_, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{MessageID: "msg_1"}, nil
	})
	if err == nil || !strings.Contains(err.Error(), "may have been recorded") || !IsCode(err, CodeLeaseExpired) {
		t.Fatalf("err %v", err)
	}
}

func TestDoEffectHeartbeatsAndStopsOnLostLease(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "execute",
		"effect_id": "eff_1", "state": "leased", "attempt": 1, "lease_token": "lt_1",
		"lease_expires_at": time.Now().Add(3 * time.Second)})}}
	g.heartbeat = func(w http.ResponseWriter) {
		if g.heartbeats == 1 {
			writeJSON(w, 200, map[string]any{"effect_id": "eff_1", "lease_expires_at": time.Now().Add(3 * time.Second)})
			return
		}
		apiError(w, 409, CodeLeaseLost, nil)
	}
	c, _ := testClient(t, g)
	var cause error
	_, err := DoEffect(context.Background(), c, beginReq, func(ctx context.Context, _ Lease) (sendResult, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return sendResult{}, ctx.Err()
	})
	if !errors.Is(cause, ErrLeaseLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cause %v err %v", cause, err)
	}
	if g.heartbeats != 2 || len(g.reports) != 0 {
		t.Fatalf("heartbeats %d reports %v", g.heartbeats, g.reports)
	}
}

// A heartbeat answered 404 (the effect no longer exists) ends the lease at
// once, as a 409 does and as in the Python and TypeScript SDKs: the action
// is cancelled then, not at the lease's lapse after more heartbeats.
func TestDoEffectStopsWhenTheEffectIsGone(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "execute",
		"effect_id": "eff_1", "state": "leased", "attempt": 1, "lease_token": "lt_1",
		"lease_expires_at": time.Now().Add(6 * time.Second)})}}
	g.heartbeat = func(w http.ResponseWriter) { apiError(w, 404, CodeNotFound, nil) }
	c, _ := testClient(t, g)
	var cause error
	_, err := DoEffect(context.Background(), c, beginReq, func(ctx context.Context, _ Lease) (sendResult, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return sendResult{}, ctx.Err()
	})
	if !errors.Is(cause, ErrLeaseLost) || !strings.Contains(cause.Error(), CodeNotFound) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cause %v err %v", cause, err)
	}
	if g.heartbeats != 1 || len(g.reports) != 0 {
		t.Fatalf("heartbeats %d reports %v", g.heartbeats, g.reports)
	}
}

func TestDoEffectActionPanicReportsNothing(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	c, _ := testClient(t, g)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the action's panic was swallowed")
			}
		}()
		_, _ = DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
			panic("vendor SDK bug")
		})
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.reports) != 0 {
		t.Fatalf("reported %v", g.reports)
	}
}

// Heartbeats that keep failing with 5xx do not let the action run past its
// lease: once the lease is about to lapse unextended, the server may grant
// execute to another caller, so the action's ctx ends with ErrLeaseLost.
func TestDoEffectCancelsTheActionBeforeAnUnextendedLeaseLapses(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "execute",
		"effect_id": "eff_1", "state": "leased", "attempt": 1, "lease_token": "lt_1",
		"lease_expires_at": time.Now().Add(3 * time.Second)})},
		heartbeat: func(w http.ResponseWriter) { apiError(w, 503, CodeInternal, nil) }}
	c, _ := testClient(t, g)
	var cause error
	_, err := DoEffect(context.Background(), c, beginReq, func(ctx context.Context, _ Lease) (sendResult, error) {
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return sendResult{}, ctx.Err()
		case <-time.After(20 * time.Second):
			return sendResult{MessageID: "sent long after the lease lapsed"}, nil
		}
	})
	if !errors.Is(cause, ErrLeaseLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cause %v err %v", cause, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.heartbeats == 0 || len(g.reports) != 0 {
		t.Fatalf("heartbeats %d reports %v", g.heartbeats, g.reports)
	}
}

// A success report that meets more 5xx than the client's own retries is
// sent again while the lease stands: dropping it would turn a performed
// effect into an indeterminate one.
// A 404 or 409 without Ratchet's error envelope (a proxy's, a load
// balancer's or a platform's, during a deploy or a misroute) cancelled the
// action and ended the heartbeats (the lease then lapsed for real), and gave
// a report up at once (the performed action read indeterminate): as for a
// job's heartbeat and report, and as in the Python and TypeScript SDKs, it
// is a failure that may pass, tried again within the lease.
func TestDoEffectABare4xxSaysNothingOfTheLeaseOrTheReport(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusNotFound, http.StatusConflict} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			bare := func(w http.ResponseWriter) {
				w.WriteHeader(status)
				_, _ = io.WriteString(w, "<html>Not here</html>")
			}
			g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "execute",
				"effect_id": "eff_1", "state": "leased", "attempt": 1, "lease_token": "lt_1",
				"lease_expires_at": time.Now().Add(6 * time.Second)})}}
			beatAgain := make(chan struct{})
			g.heartbeat = func(w http.ResponseWriter) {
				if g.heartbeats == 1 {
					bare(w)
					return
				}
				if g.heartbeats == 2 {
					close(beatAgain)
				}
				writeJSON(w, 200, map[string]any{"effect_id": "eff_1", "lease_expires_at": time.Now().Add(6 * time.Second)})
			}
			refuseFirstReport(g, bare)
			c, _ := testClient(t, g)
			out, err := DoEffect(context.Background(), c, beginReq, func(ctx context.Context, _ Lease) (sendResult, error) {
				select {
				case <-beatAgain:
				case <-ctx.Done():
					return sendResult{}, context.Cause(ctx)
				}
				return sendResult{MessageID: "msg_1"}, nil
			})
			if err != nil || out == nil || out.Result.MessageID != "msg_1" {
				t.Fatalf("out %+v err %v", out, err)
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.reports) != 2 {
				t.Fatalf("%d reports, want 2", len(g.reports))
			}
		})
	}
}

// refuseFirstReport has g answer its first report with refuse, and those
// after it as recorded successes.
func refuseFirstReport(g *fakeGate, refuse func(http.ResponseWriter)) {
	g.report = func(w http.ResponseWriter) {
		if len(g.reports) == 1 {
			refuse(w)
			return
		}
		writeJSON(w, 200, map[string]any{"id": "eff_1", "state": "succeeded"})
	}
}

func TestDoEffectRetriesTheReportThroughAnOutage(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	g.report = func(w http.ResponseWriter) {
		if len(g.reports) <= 8 { // twice the client's retries, and more
			apiError(w, 503, CodeInternal, nil)
			return
		}
		writeJSON(w, 200, map[string]any{"id": "eff_1", "state": "succeeded"})
	}
	c, _ := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{MessageID: "msg_1"}, nil
	})
	if err != nil || out == nil || out.Result.MessageID != "msg_1" {
		t.Fatalf("out %+v err %v", out, err)
	}
	if len(g.reports) != 9 {
		t.Fatalf("%d reports, want 9", len(g.reports))
	}
}

// While the report is being retried the lease is still heartbeated: here
// the server takes the report only once a heartbeat has come in after the
// action returned.
func TestDoEffectHeartbeatsWhileTheReportIsRetried(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "execute",
		"effect_id": "eff_1", "state": "leased", "attempt": 1, "lease_token": "lt_1",
		"lease_expires_at": time.Now().Add(4 * time.Second)})}}
	g.heartbeat = func(w http.ResponseWriter) {
		writeJSON(w, 200, map[string]any{"effect_id": "eff_1", "lease_expires_at": time.Now().Add(time.Minute)})
	}
	g.report = func(w http.ResponseWriter) {
		if g.heartbeats == 0 {
			apiError(w, 503, CodeInternal, nil)
			return
		}
		writeJSON(w, 200, map[string]any{"id": "eff_1", "state": "succeeded"})
	}
	c, _ := testClient(t, g)
	c.sleep = sleepCtx // real backoff: the first heartbeat is due after a third of the lease
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{MessageID: "msg_1"}, nil
	})
	if err != nil || out == nil || out.Result.MessageID != "msg_1" {
		t.Fatalf("out %+v err %v", out, err)
	}
}

// A lease's lapse is measured from its length (expiry minus the server's
// Date), not by comparing the server's expiry with the local clock: with
// the client's clock 10 s ahead, the first heartbeat still comes at about a
// third of a 6 s lease, and the action keeps its lease.
func TestDoEffectMeasuresTheLeaseFromTheServersDate(t *testing.T) {
	t.Parallel()
	const skew = 10 * time.Second // the client's clock runs this far ahead
	serverNow := func() time.Time { return time.Now().Add(-skew) }
	dated := func(w http.ResponseWriter, status int, body map[string]any) {
		w.Header().Set("Date", serverNow().UTC().Format(http.TimeFormat))
		writeJSON(w, status, body)
	}
	var first time.Time
	g := &fakeGate{answers: []func(http.ResponseWriter){func(w http.ResponseWriter) {
		dated(w, 200, map[string]any{"decision": "execute", "effect_id": "eff_1", "state": "leased", "attempt": 1,
			"lease_token": "lt_1", "lease_expires_at": serverNow().Add(6 * time.Second)})
	}}}
	g.heartbeat = func(w http.ResponseWriter) {
		if first.IsZero() {
			first = time.Now()
		}
		dated(w, 200, map[string]any{"effect_id": "eff_1", "lease_expires_at": serverNow().Add(6 * time.Second)})
	}
	c, _ := testClient(t, g)
	began := time.Now()
	doEffectLasting(t, c, 2500*time.Millisecond)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.heartbeats == 0 || first.Sub(began) < time.Second {
		t.Fatalf("%d heartbeats, the first after %v", g.heartbeats, first.Sub(began))
	}
}

// Without a Date header to measure the lease by, an expiry that already
// looks past on the local clock is not taken for a lapse: a heartbeat is
// tried first, and while heartbeats succeed the action runs on.
func TestDoEffectTriesAHeartbeatBeforeGivingUpALease(t *testing.T) {
	t.Parallel()
	undated := func(w http.ResponseWriter, body map[string]any) {
		w.Header()["Date"] = nil // net/http adds none then
		writeJSON(w, 200, body)
	}
	g := &fakeGate{answers: []func(http.ResponseWriter){func(w http.ResponseWriter) {
		undated(w, map[string]any{"decision": "execute", "effect_id": "eff_1", "state": "leased", "attempt": 1,
			"lease_token": "lt_1", "lease_expires_at": time.Now().Add(-time.Second)})
	}}}
	g.heartbeat = func(w http.ResponseWriter) {
		undated(w, map[string]any{"effect_id": "eff_1", "lease_expires_at": time.Now().Add(-time.Second)})
	}
	c, _ := testClient(t, g)
	doEffectLasting(t, c, 1500*time.Millisecond)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.heartbeats < 1 || g.heartbeats > 4 {
		t.Fatalf("%d heartbeats in 1.5 s", g.heartbeats)
	}
}

// The cause of a lost effect lease speaks of the effect, and still matches
// ErrLeaseLost.
func TestDoEffectLeaseLostCauseNamesTheEffect(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()},
		heartbeat: func(w http.ResponseWriter) { apiError(w, 409, CodeLeaseExpired, nil) }}
	g.answers[0] = decision(200, map[string]any{"decision": "execute", "effect_id": "eff_1", "state": "leased", "attempt": 1,
		"lease_token": "lt_1", "lease_expires_at": time.Now().Add(3 * time.Second)})
	c, _ := testClient(t, g)
	var cause error
	_, _ = DoEffect(context.Background(), c, beginReq, func(ctx context.Context, _ Lease) (sendResult, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return sendResult{}, ctx.Err()
	})
	if !errors.Is(cause, ErrLeaseLost) || !strings.Contains(cause.Error(), "effect lease lost") || strings.Contains(cause.Error(), "job") {
		t.Fatalf("cause %v", cause)
	}
}

// A success whose result the gate refuses (413, or 400 on a field under
// result, or on the body, which only the result can make unreadable:
// nested deeper than the gate reads) is reported again with a placeholder
// result under the same token: the key is settled instead of going
// indeterminate. DoEffect returns the outcome and an error matching
// ErrResultNotStored.
func TestDoEffectReportsAPlaceholderForARefusedResult(t *testing.T) {
	t.Parallel()
	refusedAt := func(field string) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			apiError(w, 400, CodeInvalidRequest, map[string]any{"validation": []any{
				map[string]any{"field": field, "message": "refused"}}})
		}
	}
	for name, tc := range map[string]struct {
		refuse func(w http.ResponseWriter)
		reason string
	}{
		"413":       {func(w http.ResponseWriter) { apiError(w, 413, CodePayloadTooLarge, nil) }, CodePayloadTooLarge},
		"400 field": {refusedAt("result.body"), "invalid_request at result.body"},
		"400 body":  {refusedAt("body"), "invalid_request at body"},
	} {
		refuse, reason := tc.refuse, tc.reason
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
			refuseFirstReport(g, refuse)
			c, _ := testClient(t, g)
			out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
				return sendResult{MessageID: "msg_1"}, nil
			})
			if !errors.Is(err, ErrResultNotStored) || out == nil || out.Result.MessageID != "msg_1" {
				t.Fatalf("out %+v err %v", out, err)
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.reports) != 2 {
				t.Fatalf("reports %v", g.reports)
			}
			second := g.reports[1]
			res, _ := second["result"].(map[string]any)
			if second["lease_token"] != "lt_1" || second["outcome"] != OutcomeSucceeded || res["ratchet"] != "result_not_recorded" ||
				res["reason"] != reason {
				t.Fatalf("second report %v", second)
			}
		})
	}
}

// A result that does not encode as JSON is never sent, so it cannot be
// refused or lost: a placeholder is reported at once, the key is settled,
// and DoEffect says the result was not stored. It used to be retried as a
// network failure until the report gave up, and the action, which
// happened, lapsed indeterminate (QA, against scripts/dev).
func TestDoEffectRecordsAPlaceholderForAResultThatIsNotJSON(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	c, _ := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (map[string]float64, error) {
		return map[string]float64{"score": math.NaN()}, nil
	})
	if !errors.Is(err, ErrResultNotStored) || !strings.Contains(err.Error(), "result_not_json") || out == nil ||
		!math.IsNaN(out.Result["score"]) {
		t.Fatalf("out %+v err %v", out, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.reports) != 1 {
		t.Fatalf("reports %v", g.reports)
	}
	res, _ := g.reports[0]["result"].(map[string]any)
	if g.reports[0]["outcome"] != OutcomeSucceeded || res["ratchet"] != "result_not_recorded" || res["reason"] != "result_not_json" {
		t.Fatalf("report %v", g.reports[0])
	}
}

// A duplicate whose recorded result is the placeholder says so instead of
// handing back a zero result as if it were the action's.
func TestDoEffectDuplicateOfAPlaceholderSaysTheResultWasNotStored(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "duplicate",
		"effect_id": "eff_1", "state": "succeeded", "attempt": 1,
		"result": map[string]any{"ratchet": "result_not_recorded", "reason": "payload_too_large"}})}}
	c, _ := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		t.Error("the action ran for a duplicate")
		return sendResult{}, nil
	})
	if !errors.Is(err, ErrResultNotStored) || out == nil || !out.Duplicate {
		t.Fatalf("out %+v err %v", out, err)
	}
}

// Begin names a request_id on every request, and a refusal of it stands:
// it is never asked again without one, which would cost a lost answer its
// lease (every supported server takes the field; sdk QA: the Go SDK alone
// asked again without it when a server refused it as unknown).
func TestBeginAlwaysSendsItsRequestID(t *testing.T) {
	t.Parallel()
	var bodies []map[string]any
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		bodies = append(bodies, body)
		if _, ok := body["request_id"]; ok {
			apiError(w, 400, CodeInvalidRequest, map[string]any{"validation": []any{
				map[string]any{"field": "request_id", "message": "is not a known field"}}})
			return
		}
		writeJSON(w, 200, map[string]any{"decision": "execute", "effect_id": "eff_1", "state": "leased",
			"attempt": 1, "lease_token": "lt_1"})
	}))
	if _, err := c.Begin(context.Background(), beginReq); !IsCode(err, CodeInvalidRequest) {
		t.Fatalf("err %v", err)
	}
	if len(bodies) != 1 || len(bodies[0]["request_id"].(string)) != 32 {
		t.Fatalf("bodies %v", bodies)
	}
}

// doEffectLasting runs DoEffect with an action that succeeds after d unless
// its context ends first, and fails the test unless it succeeded.
func doEffectLasting(t *testing.T, c *Client, d time.Duration) {
	t.Helper()
	out, err := DoEffect(context.Background(), c, beginReq, func(ctx context.Context, _ Lease) (sendResult, error) {
		select {
		case <-time.After(d):
			return sendResult{MessageID: "msg_1"}, nil
		case <-ctx.Done():
			return sendResult{}, context.Cause(ctx)
		}
	})
	if err != nil || out.Result.MessageID != "msg_1" {
		t.Fatalf("out %+v err %v", out, err)
	}
}

// A report whose first send landed, its answer lost, and whose retry met a
// newer attempt is answered lease_lost naming the outcome recorded: that
// is the report recorded, not refused (SDK gate QA).
func TestDoEffectReportThatLandedBeforeANewerAttemptSucceeds(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	g.report = func(w http.ResponseWriter) {
		if len(g.reports) == 1 {
			apiError(w, 502, CodeInternal, nil) // it landed; its answer did not
			return
		}
		apiError(w, 409, CodeLeaseLost, map[string]any{"attempt": 1, "reported_outcome": "succeeded"})
	}
	c, _ := testClient(t, g)
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{MessageID: "msg_1"}, nil
	})
	if err != nil || out.Result.MessageID != "msg_1" || len(g.reports) != 2 {
		t.Fatalf("out %+v err %v reports %d", out, err, len(g.reports))
	}
	// Another outcome recorded is still a refusal.
	g = &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	g.report = func(w http.ResponseWriter) {
		apiError(w, 409, CodeLeaseLost, map[string]any{"attempt": 1, "reported_outcome": "failed"})
	}
	c, _ = testClient(t, g)
	if _, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		return sendResult{MessageID: "msg_1"}, nil
	}); !IsCode(err, CodeLeaseLost) {
		t.Fatalf("err %v", err)
	}
}

// A begin whose answers are lost past the client's retries (503s whose
// outcome is unknown: the server may have granted execute) is asked again
// under the same request_id until one is answered, and DoEffect acts on
// that execute; it gave up after MaxRetries, leaving the lease it may have
// granted to lapse held by nobody (chaos QA).
func TestDoEffectAsksAgainForABeginWhoseAnswersAreLost(t *testing.T) {
	t.Parallel()
	unknown := func(w http.ResponseWriter) {
		apiError(w, 503, CodeDatabaseUnavailable, map[string]any{"outcome": "unknown"})
	}
	g := &fakeGate{answers: []func(http.ResponseWriter){unknown, unknown, unknown, unknown, unknown, unknown,
		unknown, unknown, unknown, execute()}}
	c, _ := testClient(t, g)
	acted := 0
	out, err := DoEffect(context.Background(), c, beginReq, func(context.Context, Lease) (sendResult, error) {
		acted++
		return sendResult{MessageID: "msg_1"}, nil
	})
	if err != nil || out == nil || acted != 1 || len(g.reports) != 1 {
		t.Fatalf("out %+v err %v acted %d reports %d", out, err, acted, len(g.reports))
	}
	if len(g.begins) != 10 {
		t.Fatalf("%d begins, want 10", len(g.begins))
	}
	for _, b := range g.begins {
		if b["request_id"] != g.begins[0]["request_id"] {
			t.Fatalf("request ids %v and %v", g.begins[0]["request_id"], b["request_id"])
		}
	}
}

// A begin that surely granted nothing (503 not_applied) is not asked past
// the client's retries, nor is one refused after a lost answer; one whose
// answers stay lost is asked until ctx ends.
func TestDoEffectGivesUpABeginThatGrantedNothing(t *testing.T) {
	t.Parallel()
	notApplied := func(w http.ResponseWriter) {
		apiError(w, 503, CodeDatabaseUnavailable, map[string]any{"outcome": "not_applied"})
	}
	g := &fakeGate{answers: []func(http.ResponseWriter){notApplied}}
	c, _ := testClient(t, g)
	act := func(context.Context, Lease) (sendResult, error) {
		t.Error("acted")
		return sendResult{}, nil
	}
	if _, err := DoEffect(context.Background(), c, beginReq, act); !IsCode(err, CodeDatabaseUnavailable) ||
		len(g.begins) != 4 {
		t.Fatalf("err %v begins %d", err, len(g.begins))
	}

	lost := func(w http.ResponseWriter) { apiError(w, 503, CodeDatabaseUnavailable, nil) }
	g = &fakeGate{answers: []func(http.ResponseWriter){lost, lost, lost, lost,
		func(w http.ResponseWriter) { apiError(w, 401, CodeUnauthorized, nil) }}}
	c, _ = testClient(t, g)
	_, err := DoEffect(context.Background(), c, beginReq, act)
	if !IsCode(err, CodeUnauthorized) || !MayHaveApplied(err) || len(g.begins) != 5 {
		t.Fatalf("err %v begins %d", err, len(g.begins))
	}

	g = &fakeGate{answers: []func(http.ResponseWriter){lost}}
	c, _ = testClient(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	c.sleep = func(ctx context.Context, d time.Duration) error {
		if len(g.begins) >= 12 {
			cancel()
		}
		return ctx.Err()
	}
	if _, err := DoEffect(ctx, c, beginReq, act); !errors.Is(err, context.Canceled) && !IsCode(err, CodeDatabaseUnavailable) {
		t.Fatalf("err %v", err)
	}
	if len(g.begins) != 12 {
		t.Fatalf("%d begins, want 12", len(g.begins))
	}
}

// GetPolicyStructuring reads GET /policies/{effect_type}/structuring, which no
// SDK read (parity QA), into typed fields.
func TestGetPolicyStructuring(t *testing.T) {
	t.Parallel()
	var path string
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.Method + " " + r.URL.EscapedPath()
		_, _ = io.WriteString(w, `{"effect_type":"pay/ment","threshold_micros":1000000,"threshold_from":"max_cost_micros",`+
			`"as_of":"2026-12-05T10:00:00Z","windows":[{"hours":24,"declared":10,"below_80_percent":5,`+
			`"from_80_to_90_percent":1,"from_90_to_100_percent":4,"at_or_above":0,"share_just_below":0.4},`+
			`{"hours":168,"declared":0,"below_80_percent":null,"from_80_to_90_percent":null,`+
			`"from_90_to_100_percent":null,"at_or_above":null,"share_just_below":null}]}`)
	}))
	s, err := c.GetPolicyStructuring(context.Background(), "pay/ment")
	if err != nil {
		t.Fatal(err)
	}
	if path != "GET /api/v1/policies/pay%2Fment/structuring" {
		t.Fatalf("called %s", path)
	}
	w := s.Windows[0]
	if s.EffectType != "pay/ment" || *s.ThresholdMicros != 1_000_000 || *s.ThresholdFrom != ThresholdFromMaxCost ||
		!s.AsOf.Equal(time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)) || len(s.Windows) != 2 ||
		w.Hours != 24 || w.Declared != 10 || *w.Below80Percent != 5 || *w.From80To90Percent != 1 ||
		*w.From90To100Percent != 4 || *w.AtOrAbove != 0 || *w.ShareJustBelow != 0.4 ||
		s.Windows[1].Hours != 168 || s.Windows[1].ShareJustBelow != nil {
		t.Fatalf("read %+v", s)
	}
}

// A ctx that ends while a begin is on its way does not cut that begin: its
// answer may be an execute, whose lease, abandoned, lapsed held by nobody
// and turned the key indeterminate (blocked under the default policy)
// though the action never ran, as the TypeScript SDK's doEffect and the
// Python SDK's do_effect_async avoid (sdk QA). The execute that comes back
// is released (reported failed: the action surely did not run) and
// DoEffect returns the ctx's error without calling the action.
func TestDoEffectReleasesALeaseGrantedAsItsContextEnded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	arrived := make(chan struct{})
	grant := execute()
	g := &fakeGate{answers: []func(http.ResponseWriter){func(w http.ResponseWriter) {
		close(arrived)
		<-ctx.Done() // the caller gave up while the server was granting execute
		grant(w)
	}}}
	c, _ := testClient(t, g)
	go func() { <-arrived; cancel() }()
	_, err := DoEffect(ctx, c, beginReq, func(context.Context, Lease) (sendResult, error) {
		t.Error("the action ran after its ctx had ended")
		return sendResult{}, nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.reports) != 1 || g.reports[0]["outcome"] != "failed" || g.reports[0]["lease_token"] != "lt_1" {
		t.Fatalf("reports %v, want the lease released as failed", g.reports)
	}
}

// A ctx that has ended before a begin is sent ends DoEffect without one,
// and one that ends while a begin is asked again at once (409
// retry_request) sends no more: a begin sent once ctx had ended could only
// be released, and an execute released as failed spends one of the key's
// max_attempts.
func TestDoEffectSendsNoBeginOnceItsContextEnded(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){execute()}}
	c, _ := testClient(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	act := func(context.Context, Lease) (sendResult, error) {
		t.Error("acted")
		return sendResult{}, nil
	}
	if _, err := DoEffect(ctx, c, beginReq, act); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	g.mu.Lock()
	if len(g.begins) != 0 || len(g.reports) != 0 {
		t.Fatalf("begins %d reports %v", len(g.begins), g.reports)
	}
	g.mu.Unlock()

	ctx, cancel = context.WithCancel(context.Background())
	g = &fakeGate{answers: []func(http.ResponseWriter){func(w http.ResponseWriter) {
		cancel() // the caller gives up as the server asks for the begin again
		apiError(w, 409, CodeRetryRequest, nil)
	}, execute()}}
	c, _ = testClient(t, g)
	c.sleep = sleepCtx
	if _, err := DoEffect(ctx, c, beginReq, act); !IsCode(err, CodeRetryRequest) && !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.begins) != 1 || len(g.reports) != 0 {
		t.Fatalf("begins %d reports %v", len(g.begins), g.reports)
	}
}

// The lease is heartbeated until the action returns, not until the caller's
// ctx ends: an action still at the vendor when ctx ends (a call that does
// not take ctx, or one that stops only at its next step) kept running while
// its lease lapsed unextended, and under on_indeterminate retry or probe
// another caller was granted execute and acted alongside it (sdk QA; the
// Python and TypeScript SDKs heartbeat until the action settles).
func TestDoEffectHeartbeatsUntilTheActionReturns(t *testing.T) {
	t.Parallel()
	g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "execute",
		"effect_id": "eff_1", "state": "leased", "attempt": 1, "lease_token": "lt_1",
		"lease_expires_at": time.Now().Add(3 * time.Second)})}}
	beat := make(chan struct{})
	var once sync.Once
	g.heartbeat = func(w http.ResponseWriter) {
		once.Do(func() { close(beat) })
		writeJSON(w, 200, map[string]any{"effect_id": "eff_1", "lease_expires_at": time.Now().Add(3 * time.Second)})
	}
	c, _ := testClient(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := DoEffect(ctx, c, beginReq, func(actx context.Context, _ Lease) (sendResult, error) {
		cancel() // the caller gives up while the action is at the vendor
		<-actx.Done()
		select {
		case <-beat: // the lease is still kept while the action finishes
		case <-time.After(20 * time.Second):
			t.Error("no heartbeat kept the lease of an action still running after its ctx ended")
		}
		return sendResult{}, actx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

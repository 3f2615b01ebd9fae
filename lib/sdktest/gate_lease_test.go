package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// clockAhead shows the effect routes' answers as a client whose clock runs
// skew ahead of the server's sees them: lease_expires_at and the Date
// header both read skew earlier than the client's clock.
type clockAhead struct {
	next       http.RoundTripper
	skew       time.Duration
	heartbeats atomic.Int32
}

func (s *clockAhead) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := s.next.RoundTrip(r)
	if err != nil || !strings.Contains(r.URL.Path, "/effects/") {
		return res, err
	}
	if strings.HasSuffix(r.URL.Path, "/heartbeat") {
		s.heartbeats.Add(1)
	}
	if d, err := http.ParseTime(res.Header.Get("Date")); err == nil {
		res.Header.Set("Date", d.Add(-s.skew).UTC().Format(http.TimeFormat))
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var m map[string]any
	if json.Unmarshal(raw, &m) == nil {
		if v, ok := m["lease_expires_at"].(string); ok {
			if ts, err := time.Parse(time.RFC3339Nano, v); err == nil {
				m["lease_expires_at"] = ts.Add(-s.skew).Format(time.RFC3339Nano)
				raw, _ = json.Marshal(m)
			}
		}
	}
	res.Body = io.NopCloser(bytes.NewReader(raw))
	res.ContentLength = int64(len(raw))
	res.Header.Del("Content-Length")
	return res, nil
}

// A client clock 4 s ahead of the server's and a 5 s lease: a 2 s action
// keeps its lease (the heartbeats extend it). DoEffect used to compare the
// server's lease_expires_at with the local clock, find barely a second
// left, and cancel the action after ~0.75 s without sending a heartbeat;
// the action, honouring ctx, then returned an unsure error and the key went
// indeterminate.
func TestDoEffectKeepsAHealthyLeaseWhenTheClientClockRunsAhead(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	g.policy(t, "email.send", map[string]any{"lease_seconds": 5})
	ahead := &clockAhead{skew: 4 * time.Second}
	agent := g.client(t, g.env.Key(g.ws, map[string]any{"name": "skewed-agent", "preset": "AGENT"}),
		func(rt http.RoundTripper) http.RoundTripper { ahead.next = rt; return ahead })
	began := time.Now()
	var cause error
	out, err := ratchet.DoEffect(context.Background(), agent, req("email.send", "skew:1"), func(ctx context.Context, _ ratchet.Lease) (sent, error) {
		select {
		case <-time.After(2 * time.Second):
			return sent{MessageID: "m"}, nil
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return sent{}, ctx.Err()
		}
	})
	t.Logf("after %s: err=%v cause=%v heartbeats=%d", time.Since(began).Round(10*time.Millisecond), err, cause, ahead.heartbeats.Load())
	require.NoError(t, err)
	require.Equal(t, "m", out.Result.MessageID)
	require.NotZero(t, ahead.heartbeats.Load(), "a 2 s action on a 5 s lease is heartbeated")
	e, err := g.operator.GetEffect(context.Background(), out.EffectID)
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectSucceeded, e.State)
}

// The action succeeded (the e-mail went out) but its result is over the
// gate's 256 KiB limit, so the report is refused 413. DoEffect records the
// success with a placeholder result instead: the key is settled, and the
// next DoEffect with it (here under on_indeterminate: retry, which would
// have performed the action again once the unreported lease lapsed) is a
// duplicate that says the result was not stored.
func TestDoEffectRecordsAPlaceholderForAResultTheGateRefuses(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	g.policy(t, "email.send", map[string]any{"lease_seconds": 5, "on_indeterminate": "retry"})
	big := strings.Repeat("x", 300<<10)
	var sends atomic.Int32
	action := func(context.Context, ratchet.Lease) (map[string]string, error) {
		sends.Add(1)
		return map[string]string{"message_id": "m1", "rendered": big}, nil
	}
	out, err := ratchet.DoEffect(context.Background(), g.agent, req("email.send", "big:1"), action)
	t.Logf("first DoEffect: err=%v", err)
	require.ErrorIs(t, err, ratchet.ErrResultNotStored)
	require.True(t, ratchet.IsCode(err, ratchet.CodePayloadTooLarge), "the refusal is wrapped: %v", err)
	require.NotNil(t, out)
	require.Equal(t, "m1", out.Result["message_id"], "the caller still gets the action's result")

	e, err := g.operator.GetEffect(context.Background(), out.EffectID)
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectSucceeded, e.State, "the success is recorded")
	var recorded map[string]string
	require.NoError(t, json.Unmarshal(e.Result, &recorded))
	require.Equal(t, map[string]string{"ratchet": "result_not_recorded", "reason": "payload_too_large"}, recorded)

	out2, err2 := ratchet.DoEffect(context.Background(), g.agent, req("email.send", "big:1"), action)
	t.Logf("second DoEffect: err=%v", err2)
	require.EqualValues(t, 1, sends.Load(), "the side effect was performed again")
	require.ErrorIs(t, err2, ratchet.ErrResultNotStored)
	require.NotNil(t, out2)
	require.True(t, out2.Duplicate)
	require.False(t, errors.Is(err2, ratchet.ErrBlocked))
}

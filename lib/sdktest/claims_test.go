package sdktest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// claimAnswerLost forwards every request, and loses the answer of the first
// claim that leased a job: the server committed the lease, the worker never
// read it.
type claimAnswerLost struct {
	next http.RoundTripper
	lost atomic.Bool
	// outage, when set, refuses every claim for that long after the lost
	// answer, retries included.
	outage      time.Duration
	outageUntil atomic.Pointer[time.Time]
}

func (l *claimAnswerLost) RoundTrip(r *http.Request) (*http.Response, error) {
	if until := l.outageUntil.Load(); until != nil && strings.HasSuffix(r.URL.Path, "/claim") && time.Now().Before(*until) {
		return nil, errors.New("dial tcp 127.0.0.1:50000: connection refused")
	}
	res, err := l.next.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, "/claim") || l.lost.Load() {
		return res, err
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return nil, err
	}
	if bytes.Contains(body, []byte(`"jobId"`)) && l.lost.CompareAndSwap(false, true) {
		until := time.Now().Add(l.outage)
		l.outageUntil.Store(&until)
		return nil, errors.New("read tcp 127.0.0.1:50000: connection reset by peer")
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	return res, nil
}

// A claim's answer lost on the way back is asked for again under the
// claim's id, so the job leased by the lost answer runs at once, on its
// first attempt: on its only attempt, it used to end EXHAUSTED after its
// lease lapsed, no handler having seen it.
func TestALostClaimAnswerCostsNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.JobLeaseGraceMs = 1000 }))
	ctx := context.Background()
	lossy := &claimAnswerLost{}
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "charge@1"),
		func(rt http.RoundTripper) http.RoundTripper { lossy.next = rt; return lossy }))
	var runs atomic.Int32
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "charge", Version: "1",
		Handler: func(_ context.Context, _ welcomeIn, job ratchet.JobContext) (welcomeOut, error) {
			runs.Add(1)
			return welcomeOut{MessageID: "charged"}, nil
		}}))
	run, err := b.producer.StartRun(ctx, "lost-claim")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "charge", Version: "1", Timeout: 2 * time.Second, MaxAttempts: 1})
	require.NoError(t, err)
	e := start(t, w, 1)
	s := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobSucceeded, ratchet.JobExhausted)
	require.True(t, lossy.lost.Load(), "no claim answer was lost")
	require.Equal(t, ratchet.JobSucceeded, s.Status)
	require.Equal(t, 1, s.DurableJob.Attempt)
	require.EqualValues(t, 1, runs.Load())
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, w.Stop(sctx))
	e.mu.Lock()
	defer e.mu.Unlock()
	require.Empty(t, e.list, "the retried claim is no error")
}

// A lost claim answer asked for again only after its call's retries failed
// (an outage of most of the lease) gets the job back with its lease renewed:
// the worker measures the lease from when it sent the claim that got the
// answer, so the lease it measures must start then. With the first lease
// answered as it was left, its heartbeat came too late, another worker
// claimed the job at the lapse, and the handler ran twice (review).
func TestALostClaimAskedAgainLateStillHoldsItsJob(t *testing.T) {
	t.Parallel()
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.JobLeaseGraceMs = 1000 }))
	ctx := context.Background()
	key := b.workerKey(t, "charge@1")
	var runs atomic.Int32
	tool := ratchet.Tool[welcomeIn, welcomeOut]{Name: "charge", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ ratchet.JobContext) (welcomeOut, error) {
			runs.Add(1)
			select {
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
				return welcomeOut{}, ctx.Err()
			}
			return welcomeOut{MessageID: "charged"}, nil
		}}
	// Claims are not retried within a call, so the worker asks again at its
	// first poll after the outage (its poll interval is 100 ms): 3.8 s into
	// the 5 s lease, with the first heartbeat due 1.7 s later.
	lossy := &claimAnswerLost{next: b.env.Server.Client().Transport, outage: 3800 * time.Millisecond}
	c, err := ratchet.NewClient(ratchet.Config{BaseURL: b.env.Server.URL, APIKey: key,
		HTTPClient: &http.Client{Transport: lossy}, MaxRetries: -1})
	require.NoError(t, err)
	w := ratchet.NewWorker(c)
	require.NoError(t, ratchet.RegisterTool(w, tool))
	run, err := b.producer.StartRun(ctx, "lost-claim-late")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "charge", Version: "1", Timeout: 4 * time.Second, MaxAttempts: 2})
	require.NoError(t, err)
	start(t, w, 1)
	for !lossy.lost.Load() {
		time.Sleep(10 * time.Millisecond)
	}
	// Another worker, ready to take the job the moment its lease lapses.
	other := ratchet.NewWorker(b.client(t, key, nil))
	require.NoError(t, ratchet.RegisterTool(other, tool))
	start(t, other, 1)

	s := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobSucceeded, ratchet.JobExhausted)
	require.Equal(t, ratchet.JobSucceeded, s.Status)
	require.Equal(t, 1, s.DurableJob.Attempt, "the job was claimed again")
	require.EqualValues(t, 1, runs.Load(), "the handler ran twice")
}

// A worker whose key is revoked while it runs stops claiming on the first
// claim the server refuses (401), and Stop says why: against the real
// service, whose claim answers a revoked key 401 even mid-poll (QA: the
// worker polled on for ever, and Stop answered nil).
func TestRevokedWorkerKeyStopsTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k, err := b.operator.CreateKey(ctx, ratchet.KeySpec{Name: "revoked-worker", Preset: "WORKER", Tools: []string{"revokedkey@1"}})
	require.NoError(t, err)
	w := ratchet.NewWorker(b.client(t, k.Secret, nil))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "revokedkey", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	e := start(t, w, 1)
	_, err = b.operator.RevokeKey(ctx, k.ID)
	require.NoError(t, err)
	select {
	case <-w.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the worker kept claiming with a revoked key")
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stopErr := w.Stop(sctx)
	require.True(t, ratchet.IsCode(stopErr, ratchet.CodeUnauthorized), "Stop = %v", stopErr)
	var apiErr *ratchet.Error
	require.True(t, e.find(&apiErr), "OnError was not told")
	require.Equal(t, http.StatusUnauthorized, apiErr.StatusCode)
}

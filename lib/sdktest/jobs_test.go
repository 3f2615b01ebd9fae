package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

type welcomeIn struct {
	CustomerID string `json:"customerId"`
	Mode       string `json:"mode,omitempty"`
}

type welcomeOut struct {
	MessageID string `json:"messageId"`
}

func TestProducerWorkerRunSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "send_welcome_email@1", "log_signup@1"), nil))
	keys := make(chan string, 4)
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "send_welcome_email", Version: "1",
		Handler: func(ctx context.Context, in welcomeIn, job ratchet.JobContext) (welcomeOut, error) {
			keys <- job.IdempotencyKey
			return welcomeOut{MessageID: "msg_" + in.CustomerID}, nil
		}}))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, struct{}]{Name: "log_signup", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (struct{}, error) { return struct{}{}, nil }}))
	start(t, w, 4)
	require.NotEmpty(t, w.ID())

	run, err := b.producer.StartRun(ctx, "Customer onboarding")
	require.NoError(t, err)
	require.Equal(t, ratchet.RunRunning, run.Status)
	first, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "cus_2048"}, ratchet.EnqueueOptions{
		Name: "send_welcome_email", Version: "1", Endpoint: "Email service",
		IdempotencyKey: "welcome:cus_2048", Timeout: 30 * time.Second, MaxAttempts: 5})
	require.NoError(t, err)
	require.Equal(t, "welcome:cus_2048", first.IdempotencyKey)
	require.False(t, first.Deduplicated)
	// A dependent step with a server-generated key.
	second, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "cus_2048"}, ratchet.EnqueueOptions{
		Name: "log_signup", Version: "1", AfterStepID: first.StepID, AfterStatus: ratchet.AfterSucceeded})
	require.NoError(t, err)
	require.NotEmpty(t, second.IdempotencyKey)
	again, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "cus_2048"}, ratchet.EnqueueOptions{
		Name: "log_signup", Version: "1", AfterStepID: first.StepID, AfterStatus: ratchet.AfterSucceeded})
	require.NoError(t, err)
	require.True(t, again.Deduplicated)
	require.Equal(t, second.StepID, again.StepID)
	require.Equal(t, second.IdempotencyKey, again.IdempotencyKey)

	_, err = b.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	done := waitRun(t, b.producer, run.ID, func(r *ratchet.Run) bool { return r.Status != ratchet.RunRunning })
	require.Equal(t, ratchet.RunSucceeded, done.Status, "%+v", done)
	require.True(t, done.CompletionRequested)
	s := step(t, done, first.StepID)
	require.Equal(t, ratchet.JobSucceeded, s.Status)
	require.Equal(t, "Email service", s.Endpoint)
	require.Equal(t, 5, s.DurableJob.MaxAttempts)
	require.Equal(t, 1, s.DurableJob.Attempt)
	require.Equal(t, "welcome:cus_2048", <-keys)

	// After finish, a new step is refused; the identical one deduplicates.
	_, err = b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "other"}, ratchet.EnqueueOptions{Name: "log_signup", Version: "1"})
	require.True(t, ratchet.IsCode(err, ratchet.CodeInvalidState), "%v", err)
	dup, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "cus_2048"}, ratchet.EnqueueOptions{
		Name: "send_welcome_email", Version: "1", Endpoint: "Email service",
		IdempotencyKey: "welcome:cus_2048", Timeout: 30 * time.Second, MaxAttempts: 5})
	require.NoError(t, err)
	require.True(t, dup.Deduplicated)
}

// serveFlaky creates the endpoint "fast", whose one-second CUSTOM schedule
// brings a retry due quickly, and runs a worker whose flaky@1 handler fails
// its first attempt ("provider busy", retryable) and succeeds after.
func serveFlaky(t *testing.T, b *bundle) {
	t.Helper()
	b.env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", b.ws.Key, map[string]any{
		"name": "fast", "preset": "CUSTOM", "maxAttempts": 3, "initialDelayMs": 1000, "multiplier": 1,
		"maxDelayMs": 1000, "jitterPercent": 0})
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "flaky@1"), nil))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "flaky", Version: "1",
		Handler: func(_ context.Context, _ welcomeIn, job ratchet.JobContext) (welcomeOut, error) {
			if job.Attempt == 1 {
				return welcomeOut{}, ratchet.Retryable("provider busy", time.Second)
			}
			return welcomeOut{MessageID: "ok"}, nil
		}}))
	start(t, w, 1)
}

func TestRetryableThenSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	serveFlaky(t, b)
	run, err := b.producer.StartRun(ctx, "retry")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{Name: "flaky", Version: "1", Endpoint: "fast"})
	require.NoError(t, err)
	_, err = b.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	done := waitRun(t, b.producer, run.ID, func(r *ratchet.Run) bool { return r.Status != ratchet.RunRunning })
	require.Equal(t, ratchet.RunSucceeded, done.Status)
	s := step(t, done, st.StepID)
	require.Equal(t, 2, s.DurableJob.Attempt)
	require.Equal(t, "CUSTOM", s.DurableJob.Policy.Preset)
}

// serveStrict runs a worker whose strict@1 handler always fails for good.
func serveStrict(t *testing.T, b *bundle) {
	t.Helper()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "strict@1"), nil))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "strict", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (welcomeOut, error) {
			return welcomeOut{}, ratchet.NonRetryable("invalid recipient")
		}}))
	start(t, w, 1)
}

func TestNonRetryableExhausts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	serveStrict(t, b)
	run, err := b.producer.StartRun(ctx, "strict")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{Name: "strict", Version: "1", MaxAttempts: 5})
	require.NoError(t, err)
	_, err = b.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	done := waitRun(t, b.producer, run.ID, func(r *ratchet.Run) bool { return r.Status != ratchet.RunRunning })
	require.Equal(t, ratchet.RunFailed, done.Status)
	s := step(t, done, st.StepID)
	require.Equal(t, ratchet.JobExhausted, s.Status)
	require.Equal(t, 1, s.DurableJob.Attempt, "a non-retryable failure exhausts at once")
	require.Len(t, s.DurableJob.Attempts, 1)
	a := s.DurableJob.Attempts[0]
	require.Equal(t, "FAILED", *a.Outcome)
	require.False(t, *a.Retryable)
	require.Equal(t, "invalid recipient", *a.ErrorMessage, "why it failed, for the operator deciding on a replay")
}

// exhaustedStep is a step of a new run whose strict job exhausted its one
// attempt (serveStrict's worker refuses its input).
func exhaustedStep(t *testing.T, b *bundle) (*ratchet.Run, *ratchet.EnqueueResult, ratchet.Step) {
	t.Helper()
	ctx := context.Background()
	serveStrict(t, b)
	run, err := b.producer.StartRun(ctx, "replay")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{Name: "strict", Version: "1"})
	require.NoError(t, err)
	return run, st, stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobExhausted)
}

func TestReplayAfterExhaustion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	run, st, s := exhaustedStep(t, b)

	// Preview, then re-queue the same job for one more attempt.
	preview, err := b.operator.ReplayPreview(ctx, st.StepID)
	require.NoError(t, err)
	require.True(t, preview.Eligible)
	require.Equal(t, "1", preview.HandlerVersion)
	require.Equal(t, st.StepID, preview.StepID)
	require.Equal(t, ratchet.JobExhausted, preview.Status)
	require.Equal(t, 1, preview.Attempt)
	// A contract the saved input does not fit: the SDK says why, as the
	// server does (QA: it dropped the upgrade's status and validation).
	_, err = b.operator.PublishContract(ctx, "strict", ratchet.ContractSpec{HandlerVersion: "2",
		InputSchema: json.RawMessage(`{"type":"object","required":["orderId"]}`)})
	require.NoError(t, err)
	preview, err = b.operator.ReplayPreview(ctx, st.StepID)
	require.NoError(t, err)
	require.Len(t, preview.Upgrades, 1)
	u := preview.Upgrades[0]
	require.Equal(t, ratchet.ContractActive, u.Status)
	require.False(t, u.Compatible)
	require.Equal(t, []ratchet.FieldError{{Field: "input.orderId", Message: "is required"}}, u.Validation)
	sameJSON(t, b, "/api/v1/steps/"+st.StepID+"/replay", preview)
	_, err = b.operator.Replay(ctx, st.StepID, ratchet.ReplayOptions{MaxAttempts: 1, Reason: "test"})
	require.True(t, ratchet.IsCode(err, ratchet.CodeInvalidRequest), "replay without acknowledging the risk: %v", err)
	res, err := b.operator.Replay(ctx, st.StepID, ratchet.ReplayOptions{AcknowledgeDuplicateRisk: true, MaxAttempts: 1,
		Reason: "test", ExpectedAttempt: &preview.Attempt})
	require.NoError(t, err)
	require.Equal(t, s.DurableJob.ID, res.JobID)
	require.Equal(t, ratchet.JobQueued, res.Status)
	require.Equal(t, 1, res.Attempt)
	require.Equal(t, "1", res.HandlerVersion)
	again := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobExhausted)
	require.Equal(t, 2, again.DurableJob.Attempt)
}

type providerError struct{ status int }

func (e *providerError) Error() string { return "provider said no" }

func TestClassifierPrecedence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "classified@1", "shaky@1"), nil))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "classified", Version: "1",
		Handler: func(_ context.Context, in welcomeIn, _ ratchet.JobContext) (welcomeOut, error) {
			switch in.Mode {
			case "provider-400":
				return welcomeOut{}, &providerError{400}
			case "explicit-retryable":
				return welcomeOut{}, ratchet.Retryable("explicit wins", 0)
			}
			return welcomeOut{}, errors.New("unknown failure")
		},
		ClassifyError: func(err error, _ ratchet.JobContext) ratchet.Decision {
			var pe *providerError
			if errors.As(err, &pe) && pe.status == 400 {
				return ratchet.Decision{NonRetryable: true}
			}
			if err.Error() == "explicit wins" {
				return ratchet.Decision{NonRetryable: true} // must never be asked
			}
			return ratchet.Decision{RetryAfter: 2 * time.Hour}
		}}))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "shaky", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (welcomeOut, error) {
			return welcomeOut{}, errors.New("boom")
		},
		ClassifyError: func(error, ratchet.JobContext) ratchet.Decision { panic("classifier bug") }}))
	onError := start(t, w, 4)

	run, err := b.producer.StartRun(ctx, "classify")
	require.NoError(t, err)
	enqueue := func(name, mode string) string {
		st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c", Mode: mode}, ratchet.EnqueueOptions{Name: name, Version: "1", MaxAttempts: 3})
		require.NoError(t, err)
		return st.StepID
	}
	provider := enqueue("classified", "provider-400")
	explicit := enqueue("classified", "explicit-retryable")
	hinted := enqueue("classified", "unknown")
	panicked := enqueue("shaky", "")

	s := stepIs(t, b.producer, run.ID, provider, ratchet.JobExhausted, ratchet.JobRetryScheduled)
	require.Equal(t, ratchet.JobExhausted, s.Status, "classifier said non-retryable")
	require.Equal(t, 1, s.DurableJob.Attempt)

	s = stepIs(t, b.producer, run.ID, explicit, ratchet.JobExhausted, ratchet.JobRetryScheduled)
	require.Equal(t, ratchet.JobRetryScheduled, s.Status, "an explicit RetryableError beats the classifier")

	// The classifier's two-hour hint is honoured: the retry is due no sooner.
	s = stepIs(t, b.producer, run.ID, hinted, ratchet.JobExhausted, ratchet.JobRetryScheduled)
	require.Equal(t, ratchet.JobRetryScheduled, s.Status)
	require.NotNil(t, s.DurableJob.DueAt)
	require.WithinDuration(t, time.Now().Add(2*time.Hour), *s.DurableJob.DueAt, 10*time.Minute)

	s = stepIs(t, b.producer, run.ID, panicked, ratchet.JobExhausted, ratchet.JobRetryScheduled)
	require.Equal(t, ratchet.JobRetryScheduled, s.Status, "a panicking classifier falls back to retryable")
	var pe *ratchet.PanicError
	require.True(t, onError.find(&pe), "the classifier panic reaches OnError")

	// Cancel the scheduled retries so the run can end.
	for _, id := range []string{explicit, hinted, panicked} {
		_, err := b.producer.CancelStep(ctx, id)
		require.NoError(t, err)
		stepIs(t, b.producer, run.ID, id, ratchet.JobCancelled)
	}
}

func TestTimeoutCancelsHandlerContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "slow@1"), nil))
	causes := make(chan error, 1)
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "slow", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ ratchet.JobContext) (welcomeOut, error) {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return welcomeOut{}, ctx.Err()
		}}))
	start(t, w, 1)
	run, err := b.producer.StartRun(ctx, "timeout")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "slow", Version: "1", Timeout: time.Second, MaxAttempts: 1})
	require.NoError(t, err)
	select {
	case cause := <-causes:
		require.ErrorIs(t, cause, ratchet.ErrTimeout)
	case <-time.After(time.Minute):
		t.Fatal("handler context never ended")
	}
	s := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobExhausted)
	require.Equal(t, 1, s.DurableJob.Attempt)
}

func TestCancelStepReachesHandler(t *testing.T) {
	t.Parallel()
	// A short lease grace makes the worker heartbeat (and so see the
	// cancellation) within a few seconds.
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.JobLeaseGraceMs = 1000 }))
	ctx := context.Background()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "long@1"), nil))
	started, causes := make(chan struct{}), make(chan error, 1)
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ ratchet.JobContext) (welcomeOut, error) {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return welcomeOut{}, ctx.Err()
		}}))
	start(t, w, 1)
	run, err := b.producer.StartRun(ctx, "cancel")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "long", Version: "1", Timeout: 5 * time.Second})
	require.NoError(t, err)
	<-started
	_, err = b.producer.CancelStep(ctx, st.StepID)
	require.NoError(t, err)
	select {
	case cause := <-causes:
		// The server either flags cancelRequested or refuses the heartbeat
		// of a cancelled job; both stop the handler before its timeout.
		require.True(t, errors.Is(cause, ratchet.ErrCancelRequested) || errors.Is(cause, ratchet.ErrLeaseLost), "%v", cause)
	case <-time.After(time.Minute):
		t.Fatal("handler context never ended")
	}
	stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobCancelled)
}

func TestGracefulStopLeavesNothingHalfReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "gated@1"), nil))
	started, release := make(chan struct{}, 4), make(chan struct{})
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "gated", Version: "1",
		Handler: func(ctx context.Context, in welcomeIn, _ ratchet.JobContext) (welcomeOut, error) {
			started <- struct{}{}
			<-release
			return welcomeOut{MessageID: in.CustomerID}, nil
		}}))
	require.NoError(t, w.Start(ctx, ratchet.StartOptions{Concurrency: 2, PollInterval: 100 * time.Millisecond}))
	run, err := b.producer.StartRun(ctx, "stop")
	require.NoError(t, err)
	var ids []string
	for _, c := range []string{"a", "b"} {
		st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: c}, ratchet.EnqueueOptions{Name: "gated", Version: "1", Timeout: time.Minute})
		require.NoError(t, err)
		ids = append(ids, st.StepID)
	}
	<-started
	<-started
	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		stopped <- w.Stop(sctx)
	}()
	// Work enqueued after Stop began is not claimed by this worker.
	late, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "late"}, ratchet.EnqueueOptions{Name: "gated", Version: "1"})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // several poll intervals
	close(release)
	require.NoError(t, <-stopped)
	r, err := b.producer.GetRun(ctx, run.ID)
	require.NoError(t, err)
	for _, id := range ids {
		require.Equal(t, ratchet.JobSucceeded, step(t, r, id).Status, "every claimed job was reported before Stop returned")
	}
	require.Equal(t, ratchet.JobQueued, step(t, r, late.StepID).Status)
}

func TestKilledWorkerJobIsReclaimed(t *testing.T) {
	t.Parallel()
	// Lease = timeout + grace; keep both short so the lapse comes quickly.
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.JobLeaseGraceMs = 500 }))
	ctx := context.Background()
	key := b.workerKey(t, "fragile@1")

	cut := &severable{}
	doomed := ratchet.NewWorker(b.client(t, key, func(next http.RoundTripper) http.RoundTripper { cut.next = next; return cut }))
	started, hang := make(chan ratchet.JobContext, 1), make(chan struct{})
	require.NoError(t, ratchet.RegisterTool(doomed, ratchet.Tool[welcomeIn, welcomeOut]{Name: "fragile", Version: "1",
		Handler: func(_ context.Context, _ welcomeIn, job ratchet.JobContext) (welcomeOut, error) {
			cut.cut.Store(true) // the process "dies": nothing more reaches the server
			started <- job
			<-hang // and this handler never finishes
			return welcomeOut{}, nil
		}}))
	start(t, doomed, 1)
	// Cleanups run last-in first-out: let the hung handler go before the
	// doomed worker's Stop waits for it.
	t.Cleanup(func() { close(hang) })

	run, err := b.producer.StartRun(ctx, "reclaim")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "fragile", Version: "1", Timeout: time.Second, MaxAttempts: 3})
	require.NoError(t, err)
	first := <-started
	require.Equal(t, 1, first.Attempt)

	rescuer := ratchet.NewWorker(b.client(t, key, nil))
	attempts := make(chan int, 1)
	require.NoError(t, ratchet.RegisterTool(rescuer, ratchet.Tool[welcomeIn, welcomeOut]{Name: "fragile", Version: "1",
		Handler: func(_ context.Context, _ welcomeIn, job ratchet.JobContext) (welcomeOut, error) {
			attempts <- job.Attempt
			return welcomeOut{MessageID: "rescued"}, nil
		}}))
	start(t, rescuer, 1)
	select {
	case a := <-attempts:
		require.Equal(t, 2, a)
	case <-time.After(time.Minute):
		t.Fatal("the lapsed job was never reclaimed")
	}
	s := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobSucceeded)
	require.Equal(t, 2, s.DurableJob.Attempt)
	require.NotEqual(t, doomed.ID(), rescuer.ID())
}

// An idle worker waits its poll interval between claims: the server's
// empty answer does not make it claim again at once. The interval is an
// hour, so one claim is all a worker that waits makes while the test
// watches; one that does not wait makes hundreds in that second. (The
// pacing itself is unit-tested with a fake clock in sdk/go.)
func TestIdleWorkerClaimsAtThePollInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cnt := &counting{read: make(chan struct{}, 1)}
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "idle@1"), func(next http.RoundTripper) http.RoundTripper { cnt.next = next; return cnt }))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "idle", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	require.NoError(t, w.Start(context.Background(), ratchet.StartOptions{PollInterval: time.Hour}))
	apitest.Returns(t, "the first claim was never answered", func() { <-cnt.read })
	// The window to see a claim that should not come; nothing is timed.
	time.Sleep(time.Second)
	require.NoError(t, w.Stop(context.Background()))
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	require.Equal(t, 1, cnt.claims, "an idle worker claimed again within its poll interval (an hour)")
}

// TestLowLevelWorkerCallsAreRetrySafe checks what the SDK's retries rely on:
// a repeated report with the same token and outcome answers the same, and a
// superseded token is refused (lease_lost) for heartbeats and reports alike.
func TestLowLevelWorkerCallsAreRetrySafe(t *testing.T) {
	t.Parallel()
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.JobLeaseGraceMs = 200 }))
	ctx := context.Background()
	wc := b.client(t, b.workerKey(t, "manual@1"), nil)
	workerID, err := wc.RegisterWorker(ctx, []ratchet.ToolRef{{Name: "manual", Version: "1"}})
	require.NoError(t, err)
	run, err := b.producer.StartRun(ctx, "manual")
	require.NoError(t, err)
	enq := func(customer string, timeout time.Duration) *ratchet.EnqueueResult {
		st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: customer}, ratchet.EnqueueOptions{
			Name: "manual", Version: "1", Timeout: timeout, MaxAttempts: 3})
		require.NoError(t, err)
		return st
	}
	claimOne := func() ratchet.ClaimedJob {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			jobs, err := wc.Claim(ctx, workerID, 1, 0)
			require.NoError(t, err)
			if len(jobs) == 1 {
				return jobs[0]
			}
			require.True(t, time.Now().Before(deadline), "nothing to claim")
			time.Sleep(100 * time.Millisecond)
		}
	}

	enq("a", 30*time.Second)
	j := claimOne()
	require.Equal(t, "manual", j.Name)
	require.Equal(t, 1, j.Attempt)
	require.JSONEq(t, `{"customerId":"a"}`, string(j.Input))
	hb, err := wc.HeartbeatJob(ctx, j.JobID, j.LeaseToken)
	require.NoError(t, err)
	require.False(t, hb.CancelRequested)
	report := ratchet.JobReport{LeaseToken: j.LeaseToken, Status: ratchet.ReportSucceeded, Output: []byte(`{"messageId":"m"}`)}
	first, err := wc.ReportJob(ctx, j.JobID, report)
	require.NoError(t, err)
	again, err := wc.ReportJob(ctx, j.JobID, report)
	require.NoError(t, err, "a repeated report is answered, so the SDK may retry it")
	require.Equal(t, first, again)

	// A lapsed lease reclaimed by a newer claim: the old token is lease_lost.
	enq("b", time.Second)
	old := claimOne()
	time.Sleep(1500 * time.Millisecond) // timeout 1 s + grace 0.2 s
	fresh := claimOne()
	require.Equal(t, old.JobID, fresh.JobID)
	require.Equal(t, 2, fresh.Attempt)
	_, err = wc.HeartbeatJob(ctx, old.JobID, old.LeaseToken)
	require.True(t, ratchet.IsCode(err, ratchet.CodeLeaseLost), "%v", err)
	_, err = wc.ReportJob(ctx, old.JobID, ratchet.JobReport{LeaseToken: old.LeaseToken, Status: ratchet.ReportSucceeded})
	require.True(t, ratchet.IsCode(err, ratchet.CodeLeaseLost), "%v", err)
	_, err = wc.ReportJob(ctx, fresh.JobID, ratchet.JobReport{LeaseToken: fresh.LeaseToken, Status: ratchet.ReportSucceeded})
	require.NoError(t, err)
}

// TestBatchReportAgainstTheServer checks ReportJobs, which the worker's
// batching relies on, on the real route: every report fenced by its own
// token and answered in its own slot, a stale token refused for its job
// alone, and a repeated batch answered the same.
func TestBatchReportAgainstTheServer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wc := b.client(t, b.workerKey(t, "batched@1"), nil)
	workerID, err := wc.RegisterWorker(ctx, []ratchet.ToolRef{{Name: "batched", Version: "1"}})
	require.NoError(t, err)
	run, err := b.producer.StartRun(ctx, "batched")
	require.NoError(t, err)
	var steps []string
	for i := range 3 {
		st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: fmt.Sprint(i)}, ratchet.EnqueueOptions{
			Name: "batched", Version: "1", MaxAttempts: 2})
		require.NoError(t, err)
		steps = append(steps, st.StepID)
	}
	var js []ratchet.ClaimedJob
	for deadline := time.Now().Add(time.Minute); len(js) < 3; {
		got, err := wc.Claim(ctx, workerID, 3-len(js), 0)
		require.NoError(t, err)
		js = append(js, got...)
		require.True(t, time.Now().Before(deadline), "claimed %d of 3", len(js))
	}
	reports := []ratchet.BatchJobReport{
		{JobID: js[0].JobID, JobReport: ratchet.JobReport{LeaseToken: js[0].LeaseToken, Status: ratchet.ReportSucceeded, Output: []byte(`{"ok":true}`)}},
		{JobID: js[1].JobID, JobReport: ratchet.JobReport{LeaseToken: "stale", Status: ratchet.ReportSucceeded}},
		{JobID: js[2].JobID, JobReport: ratchet.JobReport{LeaseToken: js[2].LeaseToken, Status: ratchet.ReportFailed,
			Error: &ratchet.JobError{Message: "no", Retryable: false}}},
	}
	res, err := wc.ReportJobs(ctx, reports)
	require.NoError(t, err)
	require.Len(t, res, 3)
	require.Nil(t, res[0].Err)
	require.Equal(t, ratchet.JobSucceeded, res[0].Status)
	require.True(t, ratchet.IsCode(res[1].Err, ratchet.CodeLeaseLost), "%v", res[1].Err)
	require.Nil(t, res[2].Err)
	require.Equal(t, ratchet.JobExhausted, res[2].Status)
	again, err := wc.ReportJobs(ctx, reports)
	require.NoError(t, err)
	// A refusal names the batch's request, which is each call's own.
	require.NotEmpty(t, res[1].Err.RequestID)
	require.NotEqual(t, res[1].Err.RequestID, again[1].Err.RequestID)
	again[1].Err.RequestID = res[1].Err.RequestID
	require.Equal(t, res, again, "a repeated batch answers the same, so the SDK may retry it")
	// The refused job is untouched: still RUNNING under its real lease.
	byJob := map[string]string{}
	for i, j := range js {
		byJob[j.JobID] = []string{ratchet.JobSucceeded, ratchet.JobRunning, ratchet.JobExhausted}[i]
	}
	got, err := b.producer.GetRun(ctx, run.ID)
	require.NoError(t, err)
	for _, id := range steps {
		st := step(t, got, id)
		require.Equal(t, byJob[st.DurableJob.ID], st.DurableJob.Status, "step %s", id)
	}
}

// TestWorkerBatchesManyJobs runs enough jobs at once that reports travel in
// batches, and checks each is recorded exactly once, on its first attempt.
func TestWorkerBatchesManyJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "many@1"), nil))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "many", Version: "1",
		Handler: func(_ context.Context, in welcomeIn, _ ratchet.JobContext) (welcomeOut, error) {
			return welcomeOut{MessageID: "m_" + in.CustomerID}, nil
		}}))
	errs := start(t, w, 25)
	run, err := b.producer.StartRun(ctx, "many")
	require.NoError(t, err)
	const n = 60
	for i := range n {
		_, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: fmt.Sprint(i)}, ratchet.EnqueueOptions{Name: "many", Version: "1"})
		require.NoError(t, err)
	}
	_, err = b.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	done := waitRun(t, b.producer, run.ID, func(r *ratchet.Run) bool { return r.Status != ratchet.RunRunning })
	require.Equal(t, ratchet.RunSucceeded, done.Status)
	require.Len(t, done.Steps, n)
	for _, s := range done.Steps {
		require.Equal(t, ratchet.JobSucceeded, s.Status)
		require.Equal(t, 1, s.DurableJob.Attempt)
	}
	// Stopped first: OnError runs on a goroutine of its own, and Stop
	// waits for the notices queued so far.
	require.NoError(t, w.Stop(ctx))
	errs.mu.Lock()
	defer errs.mu.Unlock()
	require.Empty(t, errs.list)
}

// An output the server refuses by its rules (a NUL in a string) can never be
// recorded: the worker reports a non-retryable failure naming the field, so
// the handler runs once rather than at every lapse of an unrecorded lease.
func TestRefusedOutputEndsTheJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var runs atomic.Int32
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "nul@1"), nil))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "nul", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (welcomeOut, error) {
			runs.Add(1)
			return welcomeOut{MessageID: "has\x00nul"}, nil
		}}))
	start(t, w, 1)
	run, err := b.producer.StartRun(ctx, "nul")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"},
		ratchet.EnqueueOptions{Name: "nul", Version: "1", MaxAttempts: 3, Timeout: time.Second})
	require.NoError(t, err)
	_, err = b.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	done := waitRun(t, b.producer, run.ID, func(r *ratchet.Run) bool { return r.Status != ratchet.RunRunning })
	s := step(t, done, st.StepID)
	require.Equal(t, ratchet.JobExhausted, s.Status)
	require.Equal(t, 1, s.DurableJob.Attempt, "ran once")
	require.EqualValues(t, 1, runs.Load())
	var outcome string
	var reported bool
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT outcome, reported_at IS NOT NULL FROM job_executions
		WHERE job_id = $1`, s.DurableJob.ID).Scan(&outcome, &reported))
	require.Equal(t, "FAILED", outcome)
	require.True(t, reported, "reported, not lapsed")
}

// EnqueueOptions.Delay makes the step due later (delayMs on the wire).
func TestDelayedEnqueueThroughTheSDK(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	run, err := b.producer.StartRun(ctx, "later")
	require.NoError(t, err)
	before := time.Now()
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "later", Version: "1", Delay: 2 * time.Hour})
	require.NoError(t, err)
	require.Equal(t, ratchet.JobQueued, st.Status)
	require.NotNil(t, st.DueAt)
	require.WithinRange(t, *st.DueAt, before.Add(2*time.Hour-time.Second), time.Now().Add(2*time.Hour+time.Second))
}

// ListRunSteps pages every step of a run, filtered by status.
func TestListRunStepsPagesARunsSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	run, err := b.producer.StartRun(ctx, "paged")
	require.NoError(t, err)
	var ids []string
	for i := range 3 {
		st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: fmt.Sprint(i)},
			ratchet.EnqueueOptions{Name: "paged", Version: "1"})
		require.NoError(t, err)
		ids = append(ids, st.StepID)
	}
	_, err = b.producer.CancelStep(ctx, ids[1])
	require.NoError(t, err)
	first, err := b.producer.ListRunSteps(ctx, run.ID, ratchet.StepQuery{Limit: 2})
	require.NoError(t, err)
	require.Len(t, first.Data, 2)
	require.NotNil(t, first.NextCursor)
	rest, err := b.producer.ListRunSteps(ctx, run.ID, ratchet.StepQuery{Limit: 2, Cursor: *first.NextCursor})
	require.NoError(t, err)
	require.Len(t, rest.Data, 1)
	require.Nil(t, rest.NextCursor)
	require.Equal(t, ids, []string{first.Data[0].ID, first.Data[1].ID, rest.Data[0].ID})
	cancelled, err := b.producer.ListRunSteps(ctx, run.ID, ratchet.StepQuery{Status: ratchet.JobCancelled})
	require.NoError(t, err)
	require.Len(t, cancelled.Data, 1)
	require.Equal(t, ids[1], cancelled.Data[0].ID)
	r, err := b.producer.GetRun(ctx, run.ID)
	require.NoError(t, err)
	require.False(t, r.StepsTruncated)
}

// A step replayed more than 50 times holds its job's last 50 attempts and
// last 50 replays and says so (AttemptsTruncated, ReplaysTruncated), and
// ListStepAttempts and ListStepReplays read every one, in order (size QA:
// the SDK dropped the flags, and a cut list read as the whole).
func TestACutStepIsReadWholeThroughItsPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	run, err := b.operator.StartRun(ctx, "replayed")
	require.NoError(t, err)
	st, err := b.operator.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"},
		ratchet.EnqueueOptions{Name: "flaky", Version: "1", MaxAttempts: 1})
	require.NoError(t, err)
	wc := b.client(t, b.workerKey(t, "flaky@1"), nil)
	workerID, err := wc.RegisterWorker(ctx, []ratchet.ToolRef{{Name: "flaky", Version: "1"}})
	require.NoError(t, err)
	const replays = 52 // attempts: one more
	for i := 0; ; i++ {
		jobs, err := wc.Claim(ctx, workerID, 1, 0)
		require.NoError(t, err)
		require.Len(t, jobs, 1, "attempt %d", i+1)
		_, err = wc.ReportJob(ctx, jobs[0].JobID, ratchet.JobReport{LeaseToken: jobs[0].LeaseToken, Status: ratchet.ReportFailed,
			Error: &ratchet.JobError{Message: fmt.Sprint("attempt ", i+1)}})
		require.NoError(t, err)
		if i == replays {
			break
		}
		seen := i + 1
		_, err = b.operator.Replay(ctx, st.StepID, ratchet.ReplayOptions{AcknowledgeDuplicateRisk: true,
			Reason: fmt.Sprint("replay ", i+1), ExpectedAttempt: &seen})
		require.NoError(t, err)
	}

	got, err := b.operator.GetStep(ctx, st.StepID)
	require.NoError(t, err)
	job := got.DurableJob
	require.True(t, job.AttemptsTruncated)
	require.True(t, job.ReplaysTruncated)
	require.Len(t, job.Attempts, 50)
	require.Equal(t, replays+1-49, job.Attempts[0].Attempt, "the last 50")
	require.Len(t, job.Replays, 50)
	require.Equal(t, "replay 3", *job.Replays[0].Reason)

	var attempts []int
	for q := (ratchet.ListQuery{Limit: 20}); ; {
		page, err := b.operator.ListStepAttempts(ctx, st.StepID, q)
		require.NoError(t, err)
		for _, a := range page.Data {
			attempts = append(attempts, a.Attempt)
		}
		if page.NextCursor == nil {
			break
		}
		q.Cursor = *page.NextCursor
	}
	require.Len(t, attempts, replays+1)
	for i, n := range attempts {
		require.Equal(t, i+1, n)
	}
	var reasons []string
	for q := (ratchet.ListQuery{Limit: 20}); ; {
		page, err := b.operator.ListStepReplays(ctx, st.StepID, q)
		require.NoError(t, err)
		for _, r := range page.Data {
			reasons = append(reasons, *r.Reason)
		}
		if page.NextCursor == nil {
			break
		}
		q.Cursor = *page.NextCursor
	}
	require.Len(t, reasons, replays)
	for i, r := range reasons {
		require.Equal(t, fmt.Sprint("replay ", i+1), r)
	}
}

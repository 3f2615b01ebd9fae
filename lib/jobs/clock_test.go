package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/jobs"
)

// instance is one service instance of a skew test, over the shared
// database, with its worker principal and a registered worker.
type instance struct {
	env    *apitest.Env
	svc    *jobs.Service
	worker *auth.Principal
	id     string
}

// skewedInstance starts an instance whose wall clock runs d off the
// database's, acting for the workspace's worker key (nil: a new workspace).
func skewedInstance(t *testing.T, d time.Duration, ws *apitest.Workspace, secret string) (*instance, apitest.Workspace, string) {
	t.Helper()
	env := apitest.Start(t, apitest.WithWall(func() time.Time { return time.Now().Add(d) }))
	if ws == nil {
		w := env.Signup()
		ws = &w
		secret = env.Key(w, map[string]any{"name": "worker", "preset": "WORKER", "tools": []string{"send_email@1"}})
	}
	p, err := env.App.Server.Auth.Authenticate(ctx, secret)
	require.NoError(t, err)
	in := &instance{env: env, svc: env.App.Server.Jobs, worker: p}
	r, err := in.svc.RegisterWorker(ctx, p, jobs.RegisterRequest{Tools: []jobs.Tool{{Name: "send_email", Version: "1"}}})
	require.NoError(t, err)
	in.id = r.WorkerID
	return in, *ws, secret
}

func (in *instance) claim(t *testing.T) []jobs.ClaimedJob {
	t.Helper()
	limit := 10
	c, err := in.svc.Claim(ctx, in.worker, in.id, jobs.ClaimRequest{Limit: &limit})
	require.NoError(t, err)
	return c.Jobs
}

// A job's lease, its retry's backoff and a delayed enqueue's due time hold
// whatever the clocks of the instances that set and read them say: with
// one instance's clock 90 s behind and another's 90 s ahead, the second's
// claim and sweeper neither take the job the first leased for 40 s, nor a
// retry the first put 60 s off, nor a step the first delayed by 60 s
// (clock QA: each instance decided by its own clock, so the second
// reclaimed the leased job at once, and the retry and the delayed step
// were due there before they were made).
//
// Not parallel: the sweeper acts on every workspace of the package
// database at the database's time, where the other tests' clocks stand
// elsewhere.
func TestJobTimesHoldWhateverTheInstancesClocksSay(t *testing.T) {
	behind, ws, secret := skewedInstance(t, -90*time.Second, nil, "")
	ahead, _, _ := skewedInstance(t, 90*time.Second, &ws, secret)
	run, err := behind.svc.CreateRun(ctx, ws.ID, jobs.CreateRunRequest{Name: "skew"})
	require.NoError(t, err)
	enq := func(in *instance, req jobs.EnqueueRequest) {
		t.Helper()
		req.Name, req.Version, req.MaxAttempts = "send_email", "1", ptr[int64](3)
		_, err := in.svc.Enqueue(ctx, ws.ID, run.ID, req)
		require.NoError(t, err)
	}

	enq(behind, jobs.EnqueueRequest{Input: json.RawMessage(`1`), TimeoutMs: ptr[int64](30_000)})
	claimed := behind.claim(t)
	require.Len(t, claimed, 1)
	j := claimed[0]
	// timeoutMs + JOB_LEASE_GRACE_MS from the database's time.
	require.WithinDuration(t, time.Now().Add(40*time.Second), j.LeaseExpiresAt, 5*time.Second)

	require.NoError(t, ahead.env.App.Sweeper.RunOnce(ctx).Error())
	require.Empty(t, ahead.claim(t), "the lease still holds")
	_, err = behind.svc.Heartbeat(ctx, behind.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
	require.NoError(t, err, "the sweeper ahead lapsed nothing")

	res, err := behind.svc.Report(ctx, behind.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
		Status: "FAILED", Error: &jobs.ReportError{Retryable: ptr(true), RetryAfterMs: ptr[int64](60_000)}})
	require.NoError(t, err)
	require.NotNil(t, res.NextDueAt)
	require.True(t, res.NextDueAt.After(time.Now().Add(55*time.Second)), "due %s", res.NextDueAt)
	require.Empty(t, ahead.claim(t), "the retry waits its 60 s")

	enq(behind, jobs.EnqueueRequest{Input: json.RawMessage(`2`), DelayMs: ptr[int64](60_000)})
	require.Empty(t, ahead.claim(t), "the delayed step waits its 60 s")
}

package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// statementCounter counts the statements a pool sends, BEGIN and COMMIT
// included (pgx sends them as statements too): each is a round trip.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// counted answers a service over its own pool (the app's settings, exec
// mode included) whose statements are counted.
func (b *bundle) counted(t *testing.T) (*jobs.Service, *statementCounter) {
	t.Helper()
	cfg := b.env.App.Pool.Config()
	require.Equal(t, pgx.QueryExecModeExec, cfg.ConnConfig.DefaultQueryExecMode)
	c := &statementCounter{}
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d := b.env.App.Server.Deps
	return jobs.New(pool, d.Sealer, d.Config.KeyHashSecret, d.Config.JobLeaseGraceMs, b.clock.Now, d.Logger), c
}

// The common enqueue (the endpoint exists, no contract applies) is one
// round trip, and so are a duplicate and each refusal the function decides.
// A new endpoint and a contract cost what Go does for them, plus a call.
func TestEnqueueRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc, c := b.counted(t)
	runID := b.run(t)
	trips := func(req jobs.EnqueueRequest) (jobs.EnqueueResult, int64, error) {
		t.Helper()
		if req.Name == "" {
			req.Name, req.Version = "send_email", "1"
		}
		before := c.n.Load()
		res, err := svc.Enqueue(ctx, b.ws, runID, req)
		return res, c.n.Load() - before, err
	}

	// A new endpoint: the call, the endpoint's lookup and insert, the call.
	first, n, err := trips(jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	// Past the point (five executions on a connection) where PL/pgSQL
	// switches to its cached generic plans.
	for i := range 10 {
		res, n, err := trips(jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i + 2))})
		require.NoError(t, err)
		require.False(t, res.Deduplicated)
		require.EqualValues(t, 1, n, "one round trip")
	}
	dup, n, err := trips(jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.True(t, dup.Deduplicated)
	require.Equal(t, first.StepID, dup.StepID)
	require.EqualValues(t, 1, n)
	dep, n, err := trips(jobs.EnqueueRequest{Input: json.RawMessage(`"d"`), AfterStepID: &first.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	require.NoError(t, err)
	require.Equal(t, "WAITING", dep.Status)
	require.EqualValues(t, 1, n)
	_, n, err = trips(jobs.EnqueueRequest{AfterStepID: ptr("stp_01m8kjt9g002extbwvcndh4bkd"), AfterStatus: ptr("FAILED")})
	require.Equal(t, apierr.CodeNotFound, code(t, err))
	require.EqualValues(t, 1, n)

	// A contract: the call, the contract's read, the call.
	_, err = b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
		HandlerVersion: "2", InputSchema: json.RawMessage(`{"type":"object"}`), OutputSchema: json.RawMessage(`true`)})
	require.NoError(t, err)
	res, n, err := trips(jobs.EnqueueRequest{Name: "send_email", Version: "2", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.EqualValues(t, 1, *b.step(t, res.StepID).ContractVersion)
	require.EqualValues(t, 3, n)
	_, n, err = trips(jobs.EnqueueRequest{Name: "send_email", Version: "2", Input: json.RawMessage(`[]`),
		Endpoint: ptr("new endpoint")})
	require.Equal(t, apierr.CodeInvalidRequest, code(t, err))
	require.EqualValues(t, 2, n, "the input is refused before the second call")
	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Len(t, eps, 1, "a refused enqueue creates no endpoint")

	_, err = svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	_, n, err = trips(jobs.EnqueueRequest{Input: json.RawMessage(`"late"`)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.EqualValues(t, 1, n)
	before := c.n.Load()
	_, err = svc.Enqueue(ctx, b.ws, "run_01m8kjt9g002extbwvcndh4bkd", jobs.EnqueueRequest{Name: "a", Version: "1"})
	require.Equal(t, apierr.CodeNotFound, code(t, err))
	require.EqualValues(t, 1, c.n.Load()-before)
}

// A report that exhausts a step records its step.exhausted, whose
// synthetic says whether the step is a tool test's, in the statement that
// records the release's events: the runs' synthetic was read by a
// statement of its own before it (one round trip more). The event's data
// is byte for byte what it was, for a tool test's step and an ordinary
// one's.
func TestAnExhaustingReportsRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc, c := b.counted(t)
	wid := b.register(t)
	test, err := b.svc.TestTool(ctx, b.worker, "send_email", jobs.ToolTestRequest{Version: "1"})
	require.NoError(t, err)
	plain := b.enqueue(t, b.run(t), jobs.EnqueueRequest{MaxAttempts: ptr[int64](1)})
	synthetic := map[string]bool{test.StepID: true, plain.StepID: false}
	for range synthetic {
		j := b.claimOne(t, wid)
		before := c.n.Load()
		_, err := svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED",
			Error: &jobs.ReportError{Retryable: ptr(false)}})
		require.NoError(t, err)
		require.EqualValues(t, 7, c.n.Load()-before, "round trips of the report exhausting step %s", j.StepID)
		require.Equal(t, jobs.StatusExhausted, b.step(t, j.StepID).Status)
		// As the data was written before: synthetic written by Go.
		var data, want string
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT e.data::text, $2::jsonb::text FROM events e
			WHERE e.type = 'step.exhausted' AND e.subject_id = $1`, j.StepID,
			fmt.Sprintf(`{"jobId":%q,"runId":%q,"attempt":%d,"leaseLapsed":%t,"synthetic":%t}`, j.JobID, j.RunID, 1,
				false, synthetic[j.StepID])).Scan(&data, &want))
		require.Equal(t, want, data)
	}
}

// Concurrent enqueues of one key on an endpoint that does not exist yet
// make exactly one step, and every other one answers it, deduplicated.
func TestConcurrentEnqueuesOfOneKeyMakeOneStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	const n = 200
	req := jobs.EnqueueRequest{Name: "send_email", Version: "1", Endpoint: ptr("fresh endpoint"),
		IdempotencyKey: ptr("once"), Input: json.RawMessage(`{"a":1}`)}
	res := make([]jobs.EnqueueResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { res[i], errs[i] = b.svc.Enqueue(ctx, b.ws, runID, req) })
	}
	wg.Wait()
	created := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, res[0].StepID, res[i].StepID)
		require.Equal(t, res[0].JobID, res[i].JobID)
		if !res[i].Deduplicated {
			created++
		}
	}
	require.Equal(t, 1, created)
	var steps, endpoints int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM jobs WHERE run_id = $1),
		(SELECT count(*) FROM job_endpoints WHERE workspace_id = $2)`, runID, b.ws).Scan(&steps, &endpoints))
	require.Equal(t, 1, steps)
	require.Equal(t, 1, endpoints)
}

// An enqueue racing a finish either gets its step in before the finish
// decides (and the run waits for it) or is refused: a run never completes
// with a step that has not ended, and no accepted step is lost. Each
// enqueue is sent twice (a producer's retry), all with the finish at one
// start: only new steps are refused after the finish, so of each pair both
// are refused, or one creates the step and the other answers it
// deduplicated, never a refusal beside an accepted step.
func TestEnqueueRacingFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, b.run(t), jobs.EnqueueRequest{}) // the endpoint exists: enqueues are one call
	for round := range 10 {
		runID := b.run(t)
		const pairs = 10
		res := make([]jobs.EnqueueResult, 2*pairs)
		errs := make([]error, 2*pairs)
		var finished jobs.Run
		var finishErr error
		apitest.StartTogether(2*pairs+1, func(i int) {
			if i == 2*pairs {
				finished, finishErr = b.svc.FinishRun(ctx, b.ws, runID)
				return
			}
			res[i], errs[i] = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
				Input: json.RawMessage(fmt.Sprintf(`[%d,%d]`, round, i/2))})
		})
		require.NoError(t, finishErr)
		accepted := map[string]bool{}
		for p := range pairs {
			a, c := 2*p, 2*p+1
			if errs[a] != nil || errs[c] != nil {
				require.Error(t, errs[a], "round %d pair %d: a refusal beside an accepted step", round, p)
				require.Error(t, errs[c], "round %d pair %d: a refusal beside an accepted step", round, p)
				require.Equal(t, apierr.CodeInvalidState, code(t, errs[a]))
				require.Equal(t, apierr.CodeInvalidState, code(t, errs[c]))
				continue
			}
			require.Equal(t, res[a].StepID, res[c].StepID)
			require.NotEqual(t, res[a].Deduplicated, res[c].Deduplicated, "round %d pair %d: one creates, one deduplicates",
				round, p)
			accepted[res[a].StepID] = true
		}
		run := b.getRun(t, runID)
		require.Len(t, run.Steps, len(accepted))
		for _, st := range run.Steps {
			require.True(t, accepted[st.ID])
		}
		if len(accepted) > 0 {
			require.Equal(t, "RUNNING", run.Status, "the run waits for its accepted steps")
			require.Equal(t, "RUNNING", finished.Status)
		} else {
			require.Equal(t, "SUCCEEDED", run.Status)
		}
	}
}

// TestEnqueueRacingFinish's failure staged by hand (CI): a producer's retry
// whose statement took its snapshot before the first enqueue of its step
// committed, then waited for the run's row behind FinishRun. Woken, it
// re-read only the locked run row (completion requested), not the step,
// and refused the retry of an accepted step as if it were new (409
// invalid_state). A new statement now looks the key up again (migration
// 0071). The first enqueue's commit is played by giving its step back the
// key hidden before the retry began, FinishRun by a transaction holding
// the run's row. Not parallel: it watches pg_stat_activity.
func TestEnqueueRetryRacingFinishAnswersTheStep(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	req := jobs.EnqueueRequest{Name: "send_email", Version: "1", Input: json.RawMessage(`"retried"`)}
	a := b.enqueue(t, runID, req)
	pool := b.env.App.Pool
	_, err := pool.Exec(ctx, `UPDATE jobs SET idempotency_key = 'hidden ' || id WHERE id = $1`, a.JobID)
	require.NoError(t, err)

	finish, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = finish.Rollback(ctx) }()
	_, err = finish.Exec(ctx, `SELECT 1 FROM job_runs WHERE id = $1 FOR UPDATE`, runID)
	require.NoError(t, err)
	type answer struct {
		res jobs.EnqueueResult
		err error
	}
	retried := make(chan answer, 1)
	go func() {
		res, err := b.svc.Enqueue(ctx, b.ws, runID, req)
		retried <- answer{res, err}
	}()
	waitForLock(t, pool, `%jobs_enqueue(%`, "the retry, its snapshot taken, waits for the run's row")
	_, err = pool.Exec(ctx, `UPDATE jobs SET idempotency_key = $2 WHERE id = $1`, a.JobID, a.IdempotencyKey)
	require.NoError(t, err, "the first enqueue commits")
	_, err = finish.Exec(ctx, `UPDATE job_runs SET completion_requested = true WHERE id = $1`, runID)
	require.NoError(t, err)
	require.NoError(t, finish.Commit(ctx))

	got := <-retried
	require.NoError(t, got.err, "a retry of an accepted step is answered, not refused")
	require.Equal(t, a.StepID, got.res.StepID)
	require.True(t, got.res.Deduplicated)
	_, err = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		Input: json.RawMessage(`"new"`)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "a new step is refused")
	require.Len(t, b.getRun(t, runID).Steps, 1)
}

// A dependent enqueued while its dependency ends is never stranded WAITING:
// either the enqueue sees the ending and decides at once, or the ending
// waits for the enqueue and releases the new step.
func TestDependentEnqueueRacingItsDependencyEnding(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	w := b.register(t)
	for i := range 20 {
		a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprintf(`"a%d"`, i))})
		j := b.claimOne(t, w)
		require.Equal(t, a.JobID, j.JobID)
		var dep jobs.EnqueueResult
		var depErr, reportErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			_, reportErr = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
				Status: jobs.StatusSucceeded})
		})
		wg.Go(func() {
			dep, depErr = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
				Input: json.RawMessage(fmt.Sprintf(`"d%d"`, i)), AfterStepID: &a.StepID, AfterStatus: ptr("SUCCEEDED")})
		})
		wg.Wait()
		require.NoError(t, reportErr)
		require.NoError(t, depErr)
		require.Equal(t, "QUEUED", b.step(t, dep.StepID).Status, "round %d (answered %s)", i, dep.Status)
		b.succeed(t, b.claimOne(t, w))
	}
}

// jobs_enqueue is PL/pgSQL (its plans are cached per session), VOLATILE
// (each statement sees what committed before it, which the fallback read
// after a conflicting insert relies on) and pins its search_path.
func TestEnqueueFunctionIsPLpgSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var lang, volatility string
	var searchPath bool
	err := b.env.App.Pool.QueryRow(ctx, `
SELECT l.lanname, p.provolatile::text, EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.proname = 'jobs_enqueue' AND p.pronamespace = to_regnamespace(current_schema())`).Scan(&lang, &volatility,
		&searchPath)
	require.NoError(t, err, "jobs_enqueue is missing")
	require.Equal(t, []any{"plpgsql", "v", true}, []any{lang, volatility, searchPath})
}

// A job's (run, workspace) must name a run of that workspace (migration
// 0014): the database refuses to move a job into another workspace or onto
// a run that does not exist, whatever the code above it does.
func TestAJobStaysInItsRunsWorkspace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := b.env.Signup()
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{})

	for name, sql := range map[string]string{
		"another workspace": `UPDATE jobs SET workspace_id = $2 WHERE id = $1`,
		"a missing run":     `UPDATE jobs SET run_id = 'run_' || $2 WHERE id = $1`,
	} {
		_, err := b.env.App.Pool.Exec(ctx, sql, st.JobID, other.ID)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, name)
		require.Equal(t, "23503", pgErr.Code, name) // foreign_key_violation
		require.Equal(t, "jobs_run_workspace_fkey", pgErr.ConstraintName, name)
	}
	require.Equal(t, jobs.StatusQueued, b.step(t, st.StepID).Status)
}

// A worker receives the input as the producer sent it, numbers included:
// the canonical form (numbers as float64 up to 17 significant digits) is
// only hashed.
func TestInputKeepsItsNumbersExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	in := `{"id":18446744073709551615,"amount":0.10000000000000001,"big":1e400,"n":[1.0,-0]}`
	enq := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(" " + in + "\n")})
	j := b.claimOne(t, b.register(t))
	require.Equal(t, enq.JobID, j.JobID)
	require.Equal(t, in, string(j.Input))

	// The key is still the canonical one: the same numbers written another
	// way are the same operation.
	again := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(
		`{"n":[1,0],"big":1e400,"amount":0.1,"id":18446744073709551615}`)})
	require.True(t, again.Deduplicated)
	require.Equal(t, enq.StepID, again.StepID)
}

// A delayed enqueue (delayMs, migration 0027) is QUEUED and due after the
// delay: no claim takes it before, one does after. The delay is part of the
// request (a retry with the same one answers the step, another one is
// idempotency_key_reuse); 0 is no delay; it takes no dependency.
func TestDelayedEnqueueIsDueAfterTheDelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	w := b.register(t)
	now := b.clock.Now()
	req := jobs.EnqueueRequest{Name: "send_email", Version: "1", IdempotencyKey: ptr("reminder:" + runID),
		DelayMs: ptr[int64](2 * 3600 * 1000)}
	res := b.enqueue(t, runID, req)
	require.Equal(t, jobs.StatusQueued, res.Status)
	requireTime(t, now.Add(2*time.Hour), *res.DueAt)
	requireTime(t, now.Add(2*time.Hour), *b.step(t, res.StepID).DurableJob.DueAt)

	again := b.enqueue(t, runID, req)
	require.True(t, again.Deduplicated)
	require.Equal(t, res.StepID, again.StepID)
	other := req
	other.DelayMs = ptr[int64](60_000)
	_, err := b.svc.Enqueue(ctx, b.ws, runID, other)
	require.Equal(t, apierr.CodeIdempotencyKeyReuse, code(t, err))

	require.Empty(t, b.claim(t, w, 10), "not due yet")
	b.clock.Add(2*time.Hour - time.Second)
	require.Empty(t, b.claim(t, w, 10), "a second early")
	b.clock.Add(time.Second)
	j := b.claimOne(t, w)
	require.Equal(t, res.JobID, j.JobID)

	// Without a key, the same step now and the same one later are two steps.
	at, later := jobs.EnqueueRequest{Name: "send_email", Version: "1", Input: []byte(`{"n":1}`)},
		jobs.EnqueueRequest{Name: "send_email", Version: "1", Input: []byte(`{"n":1}`), DelayMs: ptr[int64](86_400_000)}
	a, l := b.enqueue(t, runID, at), b.enqueue(t, runID, later)
	require.NotEqual(t, a.StepID, l.StepID)
	require.False(t, l.Deduplicated)
	require.Equal(t, l.StepID, b.enqueue(t, runID, later).StepID, "and each retries to itself")

	// 0 is no delay, the same request as none.
	plain := jobs.EnqueueRequest{Name: "send_email", Version: "1", IdempotencyKey: ptr("now:" + runID)}
	first := b.enqueue(t, runID, plain)
	plain.DelayMs = ptr[int64](0)
	require.Equal(t, first.StepID, b.enqueue(t, runID, plain).StepID)
}

func TestDelayedEnqueueValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	dep := b.enqueue(t, runID, jobs.EnqueueRequest{})
	for _, req := range []jobs.EnqueueRequest{
		{Name: "send_email", Version: "1", DelayMs: ptr[int64](-1)},
		{Name: "send_email", Version: "1", DelayMs: ptr[int64](jobs.MaxEnqueueDelayMs + 1)},
		{Name: "send_email", Version: "1", DelayMs: ptr[int64](1000), AfterStepID: &dep.StepID,
			AfterStatus: ptr("SUCCEEDED")},
	} {
		_, err := b.svc.Enqueue(ctx, b.ws, runID, req)
		e, ok := apierr.As(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, apierr.CodeInvalidRequest, e.Code)
		require.Equal(t, "delayMs", e.Detail["validation"].([]apierr.FieldError)[0].Field)
	}
	var n int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE run_id = $1`, runID).Scan(&n))
	require.Equal(t, 1, n, "refused enqueues change nothing")
}

// Publishing a schema whose $schema names an unsupported dialect is refused
// as such, at the schema's field (QA: "it has a $ref to another document"
// of a schema with no $ref).
func TestPublishRefusesAnUnsupportedDialect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
		HandlerVersion: "1", InputSchema: json.RawMessage(`{"$schema":"http://example.com/x","type":"object"}`)})
	require.Equal(t, apierr.CodeInvalidRequest, code(t, err))
	require.ErrorContains(t, err, "inputSchema must be a valid JSON Schema: its $schema names a dialect this "+
		"service does not support: use JSON Schema 2020-12")
	require.NotContains(t, err.Error(), "$ref")
}

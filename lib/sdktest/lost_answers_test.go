package sdktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// loseResponse forwards matching requests to the server, which acts and
// commits, and then loses the first n answers, as a dropped connection or a
// proxy timeout would.
type loseResponse struct {
	next   http.RoundTripper
	suffix string
	n      atomic.Int32
	seen   atomic.Int32
	// lost, if set, runs when an answer is lost, before the client learns
	// it: what happens meanwhile on the server (a delivery pass, say).
	lost func()
}

func (l *loseResponse) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := l.next.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, l.suffix) {
		return res, err
	}
	l.seen.Add(1)
	if l.n.Add(-1) >= 0 {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if l.lost != nil {
			l.lost()
		}
		return nil, errors.New("connection reset by peer (answer lost)")
	}
	return res, nil
}

func (b *bundle) losingClient(t *testing.T, key, suffix string) (*ratchet.Client, *loseResponse) {
	lose := &loseResponse{suffix: suffix}
	lose.n.Store(1)
	return b.client(t, key, func(rt http.RoundTripper) http.RoundTripper { lose.next = rt; return lose }), lose
}

// A begin whose answer is lost after the server granted execute is retried
// with the same request_id and answered the same execute: the action runs
// once and is reported. Without the id the retry read in_flight, nobody held
// the token, and the key ended blocked though the action never ran.
func TestDoEffectGetsTheExecuteItsLostAnswerHeld(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	agent, lose := g.losingClient(t, g.env.Key(g.ws, map[string]any{"name": "agent2", "preset": "AGENT"}),
		"/effects/begin")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var acted atomic.Int32
	out, err := ratchet.DoEffect(ctx, agent, req("email.send", "lost-begin:1"), func(context.Context, ratchet.Lease) (sent, error) {
		acted.Add(1)
		return sent{MessageID: "m1"}, nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, acted.Load())
	require.EqualValues(t, 2, lose.seen.Load(), "the lost begin and its retry")
	require.Equal(t, 1, out.Attempt)
	eff, err := g.operator.GetEffect(ctx, out.EffectID)
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectSucceeded, eff.State)
}

// A run started whose answer is lost is started again by the SDK's retry,
// under the call's own Idempotency-Key, which is answered the first answer
// again: one run, with the run's own key or without (before, a run started
// without one was not retried, and the caller could not tell whether it
// had started).
func TestStartRunRetriesALostAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, lose := b.losingClient(t, b.env.Key(b.ws, map[string]any{"name": "producer2", "preset": "INGEST"}), "/runs")
	ctx := context.Background()
	run, err := p.StartRun(ctx, "onboarding", ratchet.WithIdempotencyKey("onboarding:user_7"),
		ratchet.WithBudgetMicros(1_000_000))
	require.NoError(t, err)
	require.EqualValues(t, 2, lose.seen.Load())
	require.False(t, run.Deduplicated, "the retry was given the lost answer again")
	require.Equal(t, "onboarding:user_7", *run.IdempotencyKey)
	again, err := b.producer.StartRun(ctx, "onboarding", ratchet.WithIdempotencyKey("onboarding:user_7"),
		ratchet.WithBudgetMicros(1_000_000))
	require.NoError(t, err)
	require.Equal(t, run.ID, again.ID)
	_, err = b.producer.StartRun(ctx, "other", ratchet.WithIdempotencyKey("onboarding:user_7"))
	require.True(t, ratchet.IsCode(err, ratchet.CodeIdempotencyKeyReuse), "%v", err)

	lose.n.Store(1)
	unkeyed, err := p.StartRun(ctx, "unkeyed")
	require.NoError(t, err)
	require.EqualValues(t, 4, lose.seen.Load(), "the lost start and its retry")
	require.Equal(t, 1, countRows(t, b, `SELECT count(*) FROM job_runs WHERE workspace_id = $1 AND name = 'unkeyed'`))
	require.Nil(t, unkeyed.IdempotencyKey)
}

// A group opened whose answer is lost is opened again by the SDK's retry,
// under the call's own Idempotency-Key: one group (before, CreateGroup was
// not retried).
func TestCreateGroupRetriesALostAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	operator, lose := b.losingClient(t, b.ws.Key, "/groups")
	ctx := context.Background()
	for _, name := range []string{"checkout", "keyed checkout"} {
		lose.n.Store(1)
		create := func() (*ratchet.Group, error) { return operator.CreateGroup(ctx, name) }
		if name == "keyed checkout" {
			create = func() (*ratchet.Group, error) { return operator.CreateGroupWithKey(ctx, name, "checkout:9") }
		}
		g, err := create()
		require.NoError(t, err, name)
		require.False(t, g.Deduplicated, "%s: the retry was given the lost answer again", name)
		require.Equal(t, 1, countRows(t, b, `SELECT count(*) FROM effect_groups WHERE workspace_id = $1 AND name = '`+
			name+`'`), name)
	}
	require.EqualValues(t, 4, lose.seen.Load(), "each lost open and its retry")
}

// countRows is what query (a count, $1 the workspace) answers for b's.
func countRows(t *testing.T, b *bundle, query string) int {
	t.Helper()
	var n int
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), query, b.ws.ID).Scan(&n))
	return n
}

// A replay whose answer is lost is asked again under the same
// Idempotency-Key, which the server answers with the replay it made (the
// replay and its answer commit together): one replay, one more execution.
// Before, Replay was never repeated, and the caller could not tell whether
// the step had been queued again.
func TestReplayRetriesALostAnswerOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	run, st, _ := exhaustedStep(t, b)

	operator, lose := b.losingClient(t, b.env.Key(b.ws, map[string]any{"name": "operator2", "preset": "OPERATOR"}),
		"/replay")
	res, err := operator.Replay(ctx, st.StepID, ratchet.ReplayOptions{AcknowledgeDuplicateRisk: true, MaxAttempts: 1})
	require.NoError(t, err)
	require.EqualValues(t, 2, lose.seen.Load(), "the lost replay and its retry")
	require.Equal(t, ratchet.JobQueued, res.Status)
	again := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobExhausted)
	require.Len(t, again.DurableJob.Replays, 1, "one replay")
	require.Equal(t, 2, again.DurableJob.Attempt, "one more execution")
}

// A begin whose answers keep being lost past the client's retries (a
// database failover, chaos QA) is asked again under its request_id while
// the lease it may have granted can still be rejoined: DoEffect gets that
// execute and acts once. It gave up after MaxRetries, leaving the lease to
// nobody: the key turned indeterminate (blocked under the default policy)
// though the action never ran, and the caller's own retry, a new DoEffect,
// waited in_flight and then met blocked.
func TestDoEffectKeepsAskingABeginWhoseAnswersAreLost(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	lose := &loseResponse{suffix: "/effects/begin"}
	lose.n.Store(4)
	hc := g.env.Server.Client()
	agent, err := ratchet.NewClient(ratchet.Config{BaseURL: g.env.Server.URL, MaxRetries: 1,
		APIKey:     g.env.Key(g.ws, map[string]any{"name": "agent2", "preset": "AGENT"}),
		HTTPClient: &http.Client{Transport: func() http.RoundTripper { lose.next = hc.Transport; return lose }()}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var acted atomic.Int32
	out, err := ratchet.DoEffect(ctx, agent, req("email.send", "lost-begins:1"), func(context.Context, ratchet.Lease) (sent, error) {
		acted.Add(1)
		return sent{MessageID: "m1"}, nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, acted.Load())
	require.EqualValues(t, 5, lose.seen.Load(), "four lost answers, more than one call's retries, and the fifth")
	require.Equal(t, 1, out.Attempt, "the lease the first begin granted")
	eff, err := g.operator.GetEffect(ctx, out.EffectID)
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectSucceeded, eff.State)
	require.Len(t, eff.Attempts, 1)
}

// A worker's registration whose connection is ended at COMMIT (a failover,
// pg_terminate_backend) is answered not_applied once the server has found
// that the commit did not land, and the SDK's retry registers at once: one
// worker, two requests. Before, the server answered outcome unknown and
// held the Idempotency-Key until its claim lapsed: the retry was told
// retry_request for 30 s, and Start waited that long (chaos QA). Not
// parallel: it adds a trigger to job_workers.
func TestRegisterWorkerWhoseCommitEndedIsAnsweredAtOnce(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	// The workspace's first registration ends its connection at COMMIT.
	_, err = conn.Exec(ctx, fmt.Sprintf(`
CREATE SEQUENCE register_once;
CREATE FUNCTION register_end_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('register_once') = 1 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER register_end_at_commit AFTER INSERT ON job_workers DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.workspace_id = '%s') EXECUTE FUNCTION register_end_at_commit()`, b.ws.ID))
	require.NoError(t, err)
	defer func() {
		_, err := conn.Exec(ctx, `DROP TRIGGER register_end_at_commit ON job_workers;
DROP FUNCTION register_end_at_commit(); DROP SEQUENCE register_once`)
		require.NoError(t, err)
	}()
	var answers []string
	c := b.client(t, b.workerKey(t, "send_email@1"), func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			res, err := rt.RoundTrip(r)
			if err == nil && strings.HasSuffix(r.URL.Path, "/workers/register") {
				answers = append(answers, res.Status)
			}
			return res, err
		})
	})
	id, err := c.RegisterWorker(ctx, []ratchet.ToolRef{{Name: "send_email", Version: "1"}})
	require.NoError(t, err)
	require.Equal(t, []string{"503 Service Unavailable", "201 Created"}, answers)
	var workers int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM job_workers WHERE workspace_id = $1`, b.ws.ID).
		Scan(&workers))
	require.Equal(t, 1, workers, id)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A resolve sent without an Attempt whose answer is lost, retried by the
// SDK after the resolve to failed freed the key, the key was begun again
// and that attempt's lease lapsed, must not settle the new attempt, which
// nobody verified (retry QA: the retry resolved attempt 2 failed, and the
// next begin would run the action a third time though attempt 2 may have
// happened). The SDK names the attempt it read unknown, so the retry is
// refused, saying the first landed.
func TestResolveRetriedAfterTheKeyRanAgainSettlesOnlyItsAttempt(t *testing.T) {
	t.Parallel()
	clock := apitest.NewClock(time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour))
	b := setup(t, apitest.WithNow(clock.Now))
	ctx := context.Background()
	agent := b.client(t, b.env.Key(b.ws, map[string]any{"name": "agent2", "preset": "AGENT"}), nil)
	r := req("email.send", "lost-resolve:1")
	first, err := agent.Begin(ctx, r)
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionExecute, first.Decision)
	clock.Add(61 * time.Second) // attempt 1 lapses: indeterminate

	operator, lose := b.losingClient(t, b.ws.Key, "/resolve")
	lose.lost = func() {
		// While the resolve's answer is lost: the key runs again and that
		// attempt lapses too.
		again, err := agent.Begin(ctx, r)
		require.NoError(t, err)
		require.Equal(t, ratchet.DecisionExecute, again.Decision)
		require.Equal(t, 2, again.Attempt)
		clock.Add(61 * time.Second)
	}
	_, err = operator.ResolveEffect(ctx, first.EffectID, ratchet.ResolveRequest{Outcome: ratchet.OutcomeFailed})
	require.True(t, ratchet.IsCode(err, ratchet.CodeInvalidState), "%v", err)
	require.EqualValues(t, 2, lose.seen.Load(), "the lost resolve and its retry")
	eff, err := b.operator.GetEffect(ctx, first.EffectID)
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectIndeterminate, eff.State, "attempt 2 is still unknown")
	require.Len(t, eff.Attempts, 2)
	require.Equal(t, ratchet.OutcomeFailed, *eff.Attempts[0].Outcome)
	require.Equal(t, "indeterminate", *eff.Attempts[1].Outcome)
}

package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// Sweepers of two instances run their passes at once (the local loop, the
// cron route and the Lambda schedule may overlap: API.md §4 "safe to run
// concurrently"), eight passes released together, twice, at each of two
// moments: when leases have lapsed, and 31 days on. Every record a task
// ends, deletes or emits for is handled once: the passes' counts of each
// task add up to what changed in the database, each lapse has one
// effect.indeterminate or step.exhausted, the run one run.finished, the
// period one reconciliation.due; no pass fails a task, and neither
// instance logs an error. Through the sweeper and through concurrent calls
// of the cron route. Not parallel: a sweep acts on every workspace of the
// package database; each run lives in its own era, earlier than the one
// before (lastEra), so that nothing of another run has lapsed or aged in
// it.
func TestSweepersOfTwoInstancesHandleEachRecordOnce(t *testing.T) {
	for _, via := range []string{"RunOnce", "cron route"} {
		t.Run(via, func(t *testing.T) {
			lastEra -= 4
			era := time.Date(lastEra, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rand.IntN(1e6)) * time.Second)
			h := newSweepHammer(t, era, via == "cron route")
			h.sweepsEachRecordOnce(t)
		})
	}
}

// lastEra is the year the last run of the hammer began in (-count runs it
// again, each in an earlier era).
var lastEra = 2000

// sweepHammer is one workspace over two instances on one clock, with what
// their sweepers have to do.
type sweepHammer struct {
	envs  []*apitest.Env
	logs  *apitest.LockedBuffer
	clock *apitest.Clock
	ws    apitest.Workspace
	cron  bool
	runID string
	hooks []string
}

func newSweepHammer(t *testing.T, era time.Time, cron bool) *sweepHammer {
	h := &sweepHammer{logs: &apitest.LockedBuffer{}, clock: apitest.NewClock(era), cron: cron}
	for range 2 {
		h.envs = append(h.envs, apitest.Start(t, apitest.WithNow(h.clock.Now),
			apitest.WithLogger(slog.New(slog.NewTextHandler(h.logs, nil))),
			apitest.WithConfig(func(c *config.Config) {
				c.JobRetentionDays, c.EventRetentionDays, c.WebhookAllowPrivateNetworks = 90, 30, true
			})))
	}
	h.ws = h.envs[0].Signup()
	return h
}

const (
	lapsedEffects = 100
	lapsedJobs    = 20
	keptAnswers   = 5
	sendingHooks  = 2
)

func (h *sweepHammer) sweepsEachRecordOnce(t *testing.T) {
	env := h.envs[0]
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(refusing.Close)
	// Deliveries refused, then held by the subscription disabled: ended by
	// webhooks.expire_held after the events' retention. The subscriptions
	// past the first sendingHooks take a type no pass emits: they are here
	// for their creates' answers, kept for Idempotency-Keys
	// (idempotency.expired's).
	for i := range keptAnswers {
		types := events.Types
		if i >= sendingHooks {
			types = []string{events.ApprovalDecided}
		}
		r := env.DoWith("POST", "/api/v1/webhooks", h.ws.Key, http.Header{idempotency.Header: {fmt.Sprint("hook-", i)}},
			map[string]any{"url": refusing.URL + fmt.Sprint("/", i), "events": types})
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		h.hooks = append(h.hooks, r.JSON()["id"].(string))
	}
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/payment.charge", h.ws.Key,
		map[string]any{"reconcile_every_hours": 24 * 20})
	for i := range lapsedEffects {
		d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", h.ws.Key, map[string]any{"effect_type": "email.send",
			"idempotency_key": fmt.Sprint("lapse-", i), "payload": map[string]any{}, "lease_seconds": 1}).JSON()
		require.Equal(t, "execute", d["decision"])
	}
	h.leaseJobs(t)

	h.clock.Add(time.Minute) // past every lease
	h.passes(t, "effects.lapsed_leases", "jobs.lapsed_leases", "reconciliation.due", "idempotency.expired",
		"events.retention")
	h.requireOnePerSubject(t, events.EffectIndeterminate, lapsedEffects)
	h.requireOnePerSubject(t, events.StepExhausted, lapsedJobs)
	h.requireOnePerSubject(t, events.RunFinished, 1)
	var exhausted int
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs j
		WHERE j.run_id = $1 AND j.status = 'EXHAUSTED' AND (SELECT count(*) FROM job_executions x WHERE x.job_id = j.id) = 1`,
		h.runID).Scan(&exhausted))
	require.Equal(t, lapsedJobs, exhausted, "each lapsed last attempt ended once")
	var made, sentOnce int // each event fanned out to each subscription, and sent (refused) once
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE attempts = 1)
		FROM webhook_deliveries WHERE workspace_id = $1`, h.ws.ID).Scan(&made, &sentOnce))
	want := sendingHooks * (lapsedEffects + lapsedJobs + 1)
	require.Equal(t, []int{want, want}, []int{made, sentOnce}, "deliveries made, sent once")
	for _, id := range h.hooks {
		env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, h.ws.Key, map[string]any{"disabled": true})
	}

	h.clock.Add(31 * 24 * time.Hour) // past the events' retention and the answers' day
	h.leaveSecrets(t)
	h.clock.Add(2 * time.Minute) // past the rotated secret's minute
	sum := h.passes(t, "effects.retention", "reconciliation.due", "webhooks.expire_held", "idempotency.expired",
		"events.retention", "idempotency.link_secrets", "keys.revoked_secrets", "webhooks.expired_secrets")
	require.GreaterOrEqual(t, sum["idempotency.link_secrets"], 1)
	require.GreaterOrEqual(t, sum["keys.revoked_secrets"], 1)
	require.GreaterOrEqual(t, sum["webhooks.expired_secrets"], 2*deletedHooks+1)
	require.GreaterOrEqual(t, sum["idempotency.expired"], keptAnswers)
	h.requireOnePerSubject(t, events.ReconciliationDue, 1)
	require.NotContains(t, h.logs.String(), "level=ERROR")
}

// deletedHooks are the subscriptions leaveSecrets leaves deleted with
// their secrets.
const deletedHooks = 3

// leaveSecrets leaves what the secret tasks link or erase: as an instance
// of the release before migration 0068 (0065) leaves them during a deploy,
// a key revoked whose create's answer still shows its secret, and deleted
// subscriptions still holding theirs and their creates' answers; a rotated
// secret that stops signing in a minute; and an answer that names nothing.
func (h *sweepHammer) leaveSecrets(t *testing.T) {
	ctx := context.Background()
	env := h.envs[0]
	r := env.DoWith("POST", "/api/v1/keys", h.ws.Key, http.Header{idempotency.Header: {"key-revoked"}},
		map[string]any{"name": "revoked", "preset": "AGENT"})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	_, err := env.App.Pool.Exec(ctx, `UPDATE api_keys SET revoked_at = $2 WHERE id = $1`, r.JSON()["id"], h.clock.Now())
	require.NoError(t, err)
	var gone []string
	for i := range deletedHooks {
		r := env.DoWith("POST", "/api/v1/webhooks", h.ws.Key, http.Header{idempotency.Header: {fmt.Sprint("gone-", i)}},
			map[string]any{"url": "https://example.com/gone", "events": []string{events.RunFinished}})
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		gone = append(gone, r.JSON()["id"].(string))
	}
	_, err = env.App.Pool.Exec(ctx, `UPDATE webhooks SET deleted_at = $2 WHERE id = ANY($1)`, gone, h.clock.Now())
	require.NoError(t, err)
	env.Must(http.StatusOK, "POST", "/api/v1/webhooks/"+h.hooks[0]+"/rotate-secret", h.ws.Key,
		map[string]any{"previous_secret_expires_in_seconds": 60})
	// An answer recorded before migration 0067, naming nothing.
	r = env.DoWith("POST", "/api/v1/webhooks", h.ws.Key, http.Header{idempotency.Header: {"unlinked"}},
		map[string]any{"url": "https://example.com/unlinked", "events": []string{events.RunFinished}})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	_, err = env.App.Pool.Exec(ctx, `UPDATE idempotent_requests SET resource_id = NULL WHERE resource_id = $1`,
		r.JSON()["id"])
	require.NoError(t, err)
}

// leaseJobs enqueues lapsedJobs jobs of one attempt each and leases them
// for a second.
func (h *sweepHammer) leaseJobs(t *testing.T) {
	ctx := context.Background()
	env := h.envs[0]
	svc := env.App.Server.Jobs
	worker, err := env.App.Server.Auth.Authenticate(ctx, env.Key(h.ws, map[string]any{"name": "worker", "preset": "WORKER",
		"tools": []string{"send_email@1"}}))
	require.NoError(t, err)
	set := func(v int64) jsonx.Optional[int64] { return jsonx.Optional[int64]{Set: true, Value: v} }
	_, _, err = svc.CreateEndpoint(ctx, h.ws.ID, jobs.CreateEndpointRequest{Name: "send_email", PolicyFields: jobs.PolicyFields{
		Preset: jsonx.Optional[string]{Set: true, Value: "CUSTOM"}, MaxAttempts: set(1), InitialDelayMs: set(1000),
		Multiplier: jsonx.Optional[float64]{Set: true, Value: 1}, MaxDelayMs: set(1000),
		JitterPercent: jsonx.Optional[float64]{Set: true, Value: 0}}})
	require.NoError(t, err)
	run, err := svc.CreateRun(ctx, h.ws.ID, jobs.CreateRunRequest{Name: "lapsing"})
	require.NoError(t, err)
	h.runID = run.ID
	timeout := int64(1000)
	for i := range lapsedJobs {
		_, err := svc.Enqueue(ctx, h.ws.ID, run.ID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
			Input: json.RawMessage(fmt.Sprint(i)), TimeoutMs: &timeout})
		require.NoError(t, err)
	}
	reg, err := svc.RegisterWorker(ctx, worker, jobs.RegisterRequest{Tools: []jobs.Tool{{Name: "send_email", Version: "1"}}})
	require.NoError(t, err)
	limit := lapsedJobs
	c, err := svc.Claim(ctx, worker, reg.WorkerID, jobs.ClaimRequest{Limit: &limit})
	require.NoError(t, err)
	require.Len(t, c.Jobs, lapsedJobs)
}

// counted are the records whose changes a task's counts must add up to
// ($1 the pass's time): database-wide, as the sweeper acts on every
// workspace.
var counted = map[string]string{
	"effects.lapsed_leases": `SELECT count(*) FROM effects WHERE state = 'indeterminate'`,
	"effects.retention":     `SELECT -count(*) FROM effects`,
	"jobs.lapsed_leases":    `SELECT count(*) FROM jobs WHERE status = 'EXHAUSTED'`,
	"reconciliation.due":    `SELECT count(*) FROM events WHERE type = 'reconciliation.due' AND created_at = $1`,
	// Ended, and then deleted with their events by events.retention.
	"webhooks.expire_held": `SELECT -count(*) FROM webhook_deliveries WHERE state = 'pending'`,
	"idempotency.expired":  `SELECT -count(*) FROM idempotent_requests`,
	"events.retention":     `SELECT -count(*) FROM events WHERE created_at < $1::timestamptz - interval '30 days'`,
	// Answers naming nothing, linked.
	"idempotency.link_secrets": `SELECT -count(*) FROM idempotent_requests WHERE resource_id IS NULL AND answer IS NOT NULL`,
	// Answers showing a revoked key's secret.
	"keys.revoked_secrets": `SELECT -count(*) FROM idempotent_requests r JOIN api_keys k ON k.id = r.resource_id
		WHERE r.answer IS NOT NULL AND k.revoked_at IS NOT NULL`,
	// Secrets that stopped signing, and deleted subscriptions' secrets and
	// answers.
	"webhooks.expired_secrets": `SELECT -(SELECT count(*) FROM webhooks
		WHERE (deleted_at IS NOT NULL AND (secret IS NOT NULL OR previous_secret IS NOT NULL))
		   OR (previous_secret IS NOT NULL AND previous_secret_expires_at <= $1::timestamptz))
		- (SELECT count(*) FROM idempotent_requests r JOIN webhooks w ON w.id = r.resource_id
		   WHERE r.answer IS NOT NULL AND w.deleted_at IS NOT NULL)`,
}

// passes runs eight passes released together, twice, alternating between
// the instances, and requires the counts of each task named to add up to
// what changed in the database (counted): a record handled twice would be
// counted twice. It answers the counts of every task.
func (h *sweepHammer) passes(t *testing.T, tasks ...string) map[string]int {
	t.Helper()
	ctx := context.Background()
	read := func() map[string]int {
		out := map[string]int{}
		for _, task := range tasks {
			var args []any
			if strings.Contains(counted[task], "$1") {
				args = append(args, h.clock.Now())
			}
			var n int
			require.NoError(t, h.envs[0].App.Pool.QueryRow(ctx, counted[task], args...).Scan(&n), task)
			out[task] = n
		}
		return out
	}
	before := read()
	sum := map[string]int{}
	for range 2 {
		for _, changed := range h.together(t, 8) {
			for task, n := range changed {
				sum[task] += n
			}
		}
	}
	after := read()
	t.Logf("counts of the passes: %v", sum)
	for _, task := range tasks {
		require.Equal(t, after[task]-before[task], sum[task], "%s: the passes' counts against what changed", task)
	}
	return sum
}

// together runs n passes released together, alternating between the
// instances, through the sweeper or the cron route, and answers each one's
// counts by task, requiring that none failed a task.
func (h *sweepHammer) together(t *testing.T, n int) []map[string]int {
	t.Helper()
	out := make([]map[string]int, n)
	errs := make([]string, n)
	apitest.StartTogether(n, func(i int) {
		env := h.envs[i%len(h.envs)]
		if !h.cron {
			res := env.App.Sweeper.RunOnce(context.Background())
			out[i] = res.Changed
			if len(res.Errors) > 0 {
				errs[i] = fmt.Sprint(res.Errors)
			}
			return
		}
		r := env.Do("POST", "/api/cron/sweep", "test-cron-secret", nil)
		var body struct {
			Changed map[string]int    `json:"changed"`
			Errors  map[string]string `json:"errors"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil || r.Status != http.StatusOK || len(body.Errors) > 0 {
			errs[i] = fmt.Sprintf("%d %s", r.Status, r.Body)
		}
		out[i] = body.Changed
	})
	require.Empty(t, strings.Join(errs, ""), "a pass failed")
	return out
}

// requireOnePerSubject requires n subjects with an event of type typ in the
// workspace, one event each.
func (h *sweepHammer) requireOnePerSubject(t *testing.T, typ string, n int) {
	t.Helper()
	var subjects, recorded int
	require.NoError(t, h.envs[0].App.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT subject_id), count(*)
		FROM events WHERE workspace_id = $1 AND type = $2`, h.ws.ID, typ).Scan(&subjects, &recorded))
	require.Equal(t, []int{n, n}, []int{subjects, recorded}, "%s: subjects, events", typ)
}

package gate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// failingAfter is a database that is slow to answer slow and, for fail,
// has already run out the request's time before the statement is sent
// (pgx does not send it: the error says it is safe to retry): what a
// request meets when its deadline passes, or its connection is found
// gone, just after an earlier statement of it committed.
type failingAfter struct {
	slow, fail string
}

func (f failingAfter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch d.SQL {
	case f.slow:
		time.Sleep(1200 * time.Millisecond)
	case f.fail:
		expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		cancel()
		return expired
	}
	return ctx
}

func (failingAfter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// serverTraced is b's server with a gate whose pool's statements tr traces
// (a failingAfter: whose database fails as it says).
func serverTraced(b *bundle, tr pgx.QueryTracer) http.Handler {
	b.t.Helper()
	cfg := b.env.App.Pool.Config()
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b.t, err)
	b.t.Cleanup(pool.Close)
	deps := b.env.App.Server.Deps
	deps.Gate = gate.New(pool, deps.Sealer, deps.Auth.Hash, deps.Now, deps.Logger)
	return httpapi.New(deps)
}

func postTo(t *testing.T, h http.Handler, path, key string, body any) (int, map[string]any) {
	t.Helper()
	return sendTo(t, h, "POST", path, key, body)
}

func sendTo(t *testing.T, h http.Handler, method, path, key string, body any) (int, map[string]any) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req := httptest.NewRequest(method, path, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), "%s", rec.Body)
	return rec.Code, out
}

func outcomeOf(t *testing.T, status int, body map[string]any) any {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, status, "%v", body)
	e := body["error"].(map[string]any)
	require.Equal(t, "database_unavailable", e["code"])
	return e["detail"].(map[string]any)["outcome"]
}

// groupedStepFailingItsSettle begins (execute) a step of a new group under
// a key prefixed prefix, and answers it with a server whose database fails
// every settle of a group (sqlGroupStates) before the statement is sent.
func groupedStepFailingItsSettle(t *testing.T, prefix string) (*bundle, http.Handler, map[string]any) {
	t.Helper()
	b := setup(t)
	h := serverTraced(b, failingAfter{fail: gate.SQLGroupStates})
	body := email(key(prefix))
	body["group_id"] = b.newGroup("g", "")
	return b, h, b.mustBegin("execute", body)
}

// A report of a grouped effect commits, then settles its group in a
// transaction of its own. When the database fails that second step before
// its statement is sent, the report has landed all the same: the answer
// may not say nothing was applied (crash QA: 503 not_applied, while the
// effect read succeeded).
func TestAReportThatCommittedIsNeverAnsweredNotApplied(t *testing.T) {
	t.Parallel()
	b, h, d := groupedStepFailingItsSettle(t, "grouped-report")

	status, out := postTo(t, h, "/api/v1/effects/"+str(d["effect_id"])+"/report", b.ws.Key,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded", "result": map[string]any{"id": 1}})
	require.Equal(t, "succeeded", b.get(str(d["effect_id"]))["state"], "the report committed")
	require.Equal(t, "unknown", outcomeOf(t, status, out))

	// The retry the answer invites answers the report that landed.
	rep := b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded", map[string]any{"id": 1})
	require.Equal(t, http.StatusOK, rep.Status, "%s", rep.Body)
}

// A begin granted on its one-statement path is committed by that
// statement; one that took over a second has its lease measured again by
// a second statement. When the database fails that one before it is sent,
// the grant stands (the key is leased, and lapses indeterminate): the
// answer may not say nothing was applied, and the retry under the same
// request_id gets the grant (crash QA: 503 not_applied).
func TestASlowGrantThatCommittedIsNeverAnsweredNotApplied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := serverTraced(b, failingAfter{slow: gate.SQLBeginFast, fail: gate.SQLLengthenLease})
	body := email(key("slow-grant"))
	body["request_id"] = "0123456789abcdef0123456789abcdef"

	status, out := postTo(t, h, "/api/v1/effects/begin", b.ws.Key, body)
	require.Equal(t, "unknown", outcomeOf(t, status, out))

	again := b.mustBegin("execute", body)
	require.Equal(t, float64(1), again["attempt"], "the first grant stood")
}

// A resolve of a grouped effect commits, then settles its group in a
// transaction of its own, as a report does. When the database fails that
// second step before its statement is sent, the resolve has landed all the
// same: the answer may not say nothing was applied (it did, 503
// not_applied, while the effect read resolved), and the retry it invites
// answers the resolve that landed.
func TestAResolveThatCommittedIsNeverAnsweredNotApplied(t *testing.T) {
	t.Parallel()
	b, h, d := groupedStepFailingItsSettle(t, "grouped-resolve")
	b.clock.Add(2 * time.Minute) // the lease lapses unreported

	resolve := map[string]any{"outcome": "succeeded", "result": map[string]any{"id": 1}}
	status, out := postTo(t, h, "/api/v1/effects/"+str(d["effect_id"])+"/resolve", b.ws.Key, resolve)
	require.Equal(t, "succeeded", b.get(str(d["effect_id"]))["state"], "the resolve committed")
	require.Equal(t, "unknown", outcomeOf(t, status, out))

	again := b.env.Do("POST", "/api/v1/effects/"+str(d["effect_id"])+"/resolve", b.ws.Key, resolve)
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
}

// A policy write that lowers a type's retention commits, then dates the
// kept groups again in transactions of their own. When the database fails
// that dating before its statement is sent, the policy is written all the
// same: the answer may not say nothing was applied (it did, 503
// not_applied, while the policy read the new retention), and the PUT sent
// again (how a client retries a dating that failed) answers the policy.
func TestAPolicyPutThatCommittedIsNeverAnsweredNotApplied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := serverTraced(b, failingAfter{fail: gate.SQLClaimGroupsToDate})
	put := map[string]any{"retention_days": 7}

	status, out := sendTo(t, h, "PUT", "/api/v1/policies/email.send", b.ws.Key, put)
	got := b.env.Must(http.StatusOK, "GET", "/api/v1/policies/email.send", b.ws.Key, nil).JSON()
	require.Equal(t, float64(7), got["retention_days"], "the policy committed")
	require.Equal(t, "unknown", outcomeOf(t, status, out))

	require.Equal(t, float64(7), b.putPolicy("email.send", put)["retention_days"])
}

// A rejection of a compensation ends its group's rollback in a transaction
// of its own once the rejection committed. When the database fails that
// step, the answer says the outcome is unknown, and the rejection sent again
// (as that answer invites) ends the rollback as the first would have: the
// group's row reads unwind_failed after it, not only once a read or the
// sweeper settled it (it read unwinding: the repeat answered the approval
// and settled nothing).
func TestARejectionRepeatedAfterItsSettleFailedEndsTheRollback(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := serverTraced(b, failingAfter{fail: gate.SQLGroupStates})
	b.putPolicy("email.retract", map[string]any{"mode": "require_approval"})
	g, _, step := b.groupWithStep("g", "")
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil)
	aid := str(b.mustBegin("approval_required", map[string]any{"effect_type": "email.retract",
		"idempotency_key": "compensate:" + str(step["effect_id"]), "compensates_effect_id": step["effect_id"]})["approval_id"])

	status, out := postTo(t, h, "/api/v1/approvals/"+aid+"/reject", b.ws.Key, map[string]any{})
	require.Equal(t, "unknown", outcomeOf(t, status, out))
	stored := func() string {
		var state string
		require.NoError(t, b.env.App.Pool.QueryRow(context.Background(),
			`SELECT state FROM effect_groups WHERE id = $1`, g).Scan(&state))
		return state
	}
	require.Equal(t, "unwinding", stored(), "the settle failed")

	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+aid+"/reject", b.ws.Key, nil)
	require.Equal(t, "unwind_failed", stored(), "settled by the repeated rejection, before any read")
}

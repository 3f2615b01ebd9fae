package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/ids"
)

// statementCounter counts the statements a pool sends: each is a round trip.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A reconciliation settling leases that lapsed unreported, before any sweep
// recorded them, costs the same round trips for many as for few: it took
// one statement per lapse, seconds for a few thousand (QA: 3 000 took 8 s
// against 0.3 s once swept; 10 000, the most one request may hold, outlived
// a serverless function's time limit, so the reconciliation never landed).
// Each lapse is still recorded, effect.indeterminate once per effect.
func TestReconcileRecordsLapsesInOneStatement(t *testing.T) {
	t.Parallel()
	testReconcileRoundTrips(t, false)
}

// So does one settling steps of open groups (each charge a step of its
// order's group): only a rollback can end when a step settles, and the
// others cost nothing more (QA: 3 000 such steps cost a transaction each
// after the answer was decided, 9 000 round trips).
func TestReconcileOfGroupStepsSettlesOnlyRollbacks(t *testing.T) {
	t.Parallel()
	testReconcileRoundTrips(t, true)
}

func testReconcileRoundTrips(t *testing.T, grouped bool) {
	b := setup(t)
	counter := &statementCounter{}
	h := serverTraced(b, counter)

	const typ = "qa.reconcile.lapses"
	trips := func(n int) int64 {
		t.Helper()
		start := b.clock.Now()
		var ids []string
		records := []map[string]any{}
		for i := range n {
			k := key(fmt.Sprintf("lapsed-%d-%d", n, i))
			body := map[string]any{"effect_type": typ, "idempotency_key": k}
			if grouped {
				body["group_id"] = b.newGroup(k, "")
			}
			d := b.mustBegin("execute", body)
			ids = append(ids, d["effect_id"].(string))
			status := "succeeded"
			if i%2 == 1 {
				status = "failed"
			}
			records = append(records, map[string]any{"idempotency_key": k, "status": status})
		}
		b.clock.Add(2 * time.Minute) // the leases lapse; no sweep records it
		before := counter.n.Load()
		code, out := postTo(t, h, "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": typ,
			"from": start.Format(time.RFC3339Nano), "to": b.clock.Now().Format(time.RFC3339Nano), "records": records})
		used := counter.n.Load() - before
		require.Equal(t, http.StatusOK, code, "%v", out)
		require.Len(t, out["resolved"], n)
		for i, id := range ids {
			e := b.get(id)
			want := "succeeded"
			if i%2 == 1 {
				want = "failed"
			}
			require.Equal(t, want, e["state"])
			a := e["attempts"].([]any)[0].(map[string]any)
			require.Equal(t, want, a["outcome"])
			require.Equal(t, "reconciliation", a["resolve_note"])
			var events int
			require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM events
				WHERE workspace_id = $1 AND type = 'effect.indeterminate' AND subject_id = $2`, b.ws.ID, id).Scan(&events))
			require.Equal(t, 1, events, "the lapse is recorded once")
		}
		return used
	}
	few := trips(2)
	many := trips(12)
	require.Equal(t, few, many, "round trips do not grow with the lapses settled")
}

// A reconciliation reads its effects with JIT and parallel workers off,
// set in its transaction just before (sqlReconcilePlan): its estimate of
// every type's attempts in the window passes jit_above_cost on a busy
// workspace, and compiling took most of a second (review); the same
// estimate planned parallel workers, whose start was most of the read
// (scale QA: an hour's window 25 ms with them, 0.5-1.4 ms without).
func TestReconcileReadsItsEffectsWithJITAndParallelWorkersOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &statementLog{}
	h := serverTraced(b, rec)
	status, out := postTo(t, h, "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "qa.reconcile.jit",
		"from": b.clock.Now().Add(-time.Hour).Format(time.RFC3339Nano), "to": b.clock.Now().Format(time.RFC3339Nano),
		"records": []any{}})
	require.Equal(t, http.StatusOK, status, "%v", out)
	rec.mu.Lock()
	read := slices.IndexFunc(rec.sql, func(s string) bool { return s == gate.SQLReconcileEffects })
	require.Positive(t, read, "the effects are read, after a statement")
	before := rec.sql[read-1]
	rec.mu.Unlock()
	// What the statement before leaves set for the rest of its transaction.
	ctx := context.Background()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, before)
	require.NoError(t, err)
	var jit, workers string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('jit'), current_setting('max_parallel_workers_per_gather')`).
		Scan(&jit, &workers))
	require.Equal(t, "off", jit)
	require.Equal(t, "0", workers)
}

// The size a reconciliation reckons for its answer, from its items' fields,
// is the length the API writes, whatever the keys hold.
func TestReconciliationSizeIsWhatTheAPIWrites(t *testing.T) {
	t.Parallel()
	s := func(v string) *string { return &v }
	n := func(v int64) *int64 { return &v }
	now := time.Date(2026, 5, 1, 12, 30, 0, 123456000, time.UTC)
	r := gate.Reconciliation{EffectType: "payment.charge", From: now.Add(-time.Hour), To: now, ReconciledAt: now,
		Matched: []gate.ReconcileItem{{IdempotencyKey: `quote " and \ back`, EffectID: s("eff_01"),
			RatchetState: s("succeeded"), VendorStatus: s("succeeded"), RatchetAmountMicros: n(0),
			VendorAmountMicros: n(1_000_000_000_000_000_000)}},
		MissingAtVendor: []gate.ReconcileItem{{IdempotencyKey: "é漢字🙂 <&>", EffectID: s("eff_02"),
			RatchetState: s("succeeded"), RatchetAmountMicros: n(-5)}, {IdempotencyKey: "\u2028\u2029"}},
		UnknownToRatchet: []gate.ReconcileItem{{IdempotencyKey: "k", VendorStatus: s("pending")}},
		AmountMismatch:   []gate.ReconcileItem{},
		Resolved: []gate.ReconcileItem{{IdempotencyKey: strings.Repeat("x", 255), EffectID: s("eff_03"),
			RatchetState: s("indeterminate"), VendorStatus: s("refunded"), Outcome: s("succeeded")}},
		StatusMismatch: []gate.ReconcileItem{},
		Unsettled:      []gate.ReconcileItem{{IdempotencyKey: "u", Outcome: s("failed")}},
	}
	reckoned, written, err := gate.ReconciliationSize(r)
	require.NoError(t, err)
	require.Equal(t, len(written), reckoned, "%s", written)
}

// A reconciliation whose answer would pass what one answer holds
// (answer.Budget, 4 MB) is refused as a window of too many effects is,
// and changes nothing: what it would have resolved stays unknown, the
// type's last_reconciled_at is not recorded, and nothing is kept under its
// Idempotency-Key, which the narrower request then uses (QA: 4 000
// effects whose keys were 255 four-byte characters answered 4.7 MB, over
// what Vercel delivers, after its resolves had committed and its answer
// been kept).
func TestReconcileRefusesAnAnswerPastTheBudgetAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const typ = "qa.reconcile.size"
	t0 := b.clock.Now()
	k := key("unknown")
	unknown := b.mustBegin("execute", map[string]any{"effect_type": typ, "idempotency_key": k})
	b.clock.Add(2 * time.Minute) // its lease lapses: indeterminate
	// Keys of 255 four-byte characters: 4 000 such effects answer 4.7 MB.
	const n = 4_000
	effectIDs, keys := make([]string, n), make([]string, n)
	for i := range n {
		effectIDs[i] = ids.NewAt(ids.Effect, t0.Add(-30*time.Minute))
		keys[i] = fmt.Sprintf("%04d-", i) + strings.Repeat("🙂", 250)
	}
	_, err := b.env.App.Pool.Exec(ctx, `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key,
			fingerprint, state, lease_seconds, created_by_key_id, created_at, updated_at)
		SELECT id, $1, $2, k, 'f', 'succeeded', 60, $3, $4, $4 FROM unnest($5::text[], $6::text[]) AS u(id, k)`,
		b.ws.ID, typ, keyID(b.ws.Key), t0.Add(-30*time.Minute), effectIDs, keys)
	require.NoError(t, err)

	records := []map[string]any{{"idempotency_key": k, "status": "succeeded"}}
	body := func(from time.Time) map[string]any {
		return map[string]any{"effect_type": typ, "from": from.Format(time.RFC3339Nano),
			"to": b.clock.Now().Format(time.RFC3339Nano), "records": records}
	}
	header := http.Header{"Idempotency-Key": {"reconcile:size"}}
	for range 2 { // refused again: nothing was kept under the key
		r := b.env.DoWith("POST", "/api/v1/reconcile", b.ws.Key, header, body(t0.Add(-time.Hour)))
		require.Equal(t, []string{"to"}, validationFields(t, r))
		problem := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any)[0]
		require.Contains(t, problem.(map[string]any)["message"], "narrow the window or send fewer records")
		require.Less(t, len(r.Body), 4096)
		require.Empty(t, r.Header.Get("Idempotent-Replayed"))
		require.Equal(t, "indeterminate", b.get(unknown["effect_id"].(string))["state"], "the resolve rolled back")
		policy := b.env.Must(http.StatusOK, "GET", "/api/v1/policies/"+typ, b.ws.Key, nil).JSON()
		require.Nil(t, policy["last_reconciled_at"], "the reconciliation is not recorded")
	}
	// Without the header, the same.
	r := b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, body(t0.Add(-time.Hour)))
	require.Equal(t, []string{"to"}, validationFields(t, r))
	require.Equal(t, "indeterminate", b.get(unknown["effect_id"].(string))["state"])

	// The narrower window fits, under the same key.
	ok := b.env.DoWith("POST", "/api/v1/reconcile", b.ws.Key, header, body(t0.Add(-time.Minute)))
	require.Equal(t, http.StatusOK, ok.Status, "%s", ok.Body)
	require.Empty(t, ok.Header.Get("Idempotent-Replayed"))
	out := ok.JSON()
	require.Len(t, out["resolved"], 1)
	require.Empty(t, out["missing_at_vendor"])
	require.Equal(t, "succeeded", b.get(unknown["effect_id"].(string))["state"])
}

// A reconciliation settles the attempt it read, not one begun since: a
// record read before a probe began cannot say the probe did not act, and
// settling the effect settles every attempt of unknown outcome. Staged by
// hand: a transaction holds the row of an effect the reconciliation locks
// first (effect id order), and the reconciliation, the key read with its
// lapsed attempt, waits for it; the key is probed, the probe lapses and its
// lapse is recorded (the effect indeterminate again, at its new attempt);
// the transaction ends. The vendor's record says failed: settled failed,
// the probe, which may have acted since, would have freed its key for
// another execute (review). It is left unsettled; the held effect, read
// and locked at one attempt, is resolved.
func TestAReconciliationLeavesAnAttemptBegunSinceItsReadUnsettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe"})
	heldKey, probedKey := key("held"), key("probed")
	held := b.mustBegin("execute", charge(heldKey, nil)) // locked first: the lower id
	b.clock.Add(time.Second)
	k := charge(probedKey, 700)
	first := b.mustBegin("execute", k)
	require.Less(t, str(held["effect_id"]), str(first["effect_id"]))
	b.clock.Add(2 * time.Minute) // both leases lapse
	pool := b.env.App.Pool
	holder, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(context.Background(), `SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, held["effect_id"])
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, pool, apitest.BackendPID(t, holder))

	now := b.clock.Now()
	done := make(chan struct{})
	var reconciled *apitest.Response
	go func() {
		defer close(done)
		reconciled = b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "api.call",
			"from": now.Add(-time.Hour).Format(time.RFC3339), "to": now.Add(time.Hour).Format(time.RFC3339),
			"records": []map[string]any{
				{"idempotency_key": heldKey, "status": "failed"},
				{"idempotency_key": probedKey, "status": "failed"}}})
	}()
	waits.Waiting(done, "the reconciliation, the key read, waits for the held effect's row")

	k["lease_seconds"] = 1
	probe := b.mustBegin("execute", k)
	require.Equal(t, true, probe["probe"])
	b.clock.Add(1500 * time.Millisecond)
	require.Equal(t, http.StatusConflict,
		b.report(str(probe["effect_id"]), str(probe["lease_token"]), "succeeded", nil).Status,
		"reported after its lease: the lapse is recorded")
	require.NoError(t, holder.Rollback(context.Background()))
	<-done
	require.Equal(t, http.StatusOK, reconciled.Status, "%s", reconciled.Body)
	out := reconciled.JSON()
	lists := map[string][]string{}
	for _, list := range []string{"resolved", "unsettled"} {
		for _, it := range out[list].([]any) {
			lists[list] = append(lists[list], str(it.(map[string]any)["effect_id"]))
		}
	}
	require.Equal(t, []string{str(held["effect_id"])}, lists["resolved"])
	require.Equal(t, []string{str(probe["effect_id"])}, lists["unsettled"])
	effect := b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(probe["effect_id"]), b.ws.Key, nil).JSON()
	require.Equal(t, "indeterminate", effect["state"], "the probe may have acted: its outcome is still unknown")
}

// A reconciliation that settles steps of several rollbacks ends each
// rollback it can, though ending one failed: it stopped at the first
// failure, so the groups after it (by id) stayed unwinding until the
// sweeper took them, while SweepGroups goes on past a failure of a
// group's own (sweep.GoOn). Here the first group's row is held, so its
// settle meets lock_timeout; the second's still ends.
func TestReconcileEndsTheRollbacksAfterOneThatFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.env.App.Pool.Config()
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "50ms"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	deps := b.env.App.Server.Deps
	deps.Gate = gate.New(pool, deps.Sealer, deps.Auth.Hash, deps.Now, deps.Logger)
	h := httpapi.New(deps)

	start := b.clock.Now()
	var groups []string
	records := []map[string]any{}
	for i := range 2 {
		g := b.newGroup(fmt.Sprintf("rollback-%d", i), "")
		step := groupStep(g, email(key("lapsed")), nil)
		b.mustBegin("execute", step)
		groups = append(groups, g)
		records = append(records, map[string]any{"idempotency_key": step["idempotency_key"], "status": "failed"})
	}
	slices.Sort(groups)          // the order the reconciliation ends them in
	b.clock.Add(2 * time.Minute) // the leases lapse unreported
	for _, g := range groups {
		u := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
		require.Equal(t, "unwinding", u["state"], "waiting for its unknown step")
	}
	stored := func(g string) string {
		var state string
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT state FROM effect_groups WHERE id = $1`, g).Scan(&state))
		return state
	}

	hold, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, groups[0])
	require.NoError(t, err)
	status, out := postTo(t, h, "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "email.send",
		"from": start.Add(-time.Minute).Format(time.RFC3339Nano), "to": b.clock.Now().Format(time.RFC3339Nano),
		"records": records})
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.Len(t, out["resolved"], 2)
	require.NoError(t, hold.Rollback(ctx))

	require.Equal(t, "unwinding", stored(groups[0]), "its settle met the held row")
	require.Equal(t, "unwound", stored(groups[1]), "ended though the one before failed")
}

// from and to are RFC 3339 timestamps whose instant, in UTC, the answer can
// write back (RFC 3339's four-digit years): one whose offset takes it out
// of 0000-9999, or whose offset is 24 hours or more (RFC 3339's time-hour is
// 00-23), is refused at its field, before any effect is read (QA: 0000-01-01
// at +01:00 was refused at to, an answer "that would hold
// 9223372036854775807 bytes", the effects of two thousand years read first).
func TestAReconciliationWindowTheAnswerCannotWriteIsRefusedAtItsField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const typ = "qa.reconcile.window"
	k := key("window")
	unknown := b.mustBegin("execute", map[string]any{"effect_type": typ, "idempotency_key": k})
	b.clock.Add(2 * time.Minute) // its lease lapses: indeterminate
	records := []map[string]any{{"idempotency_key": k, "status": "succeeded"}}
	for _, c := range []struct{ from, to, field, message string }{
		{"0000-01-01T00:30:00+01:00", "9999-01-01T00:00:00Z", "from", "must be an RFC 3339 timestamp from " +
			"0000-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"},
		{"0000-01-01T00:00:00Z", "9999-12-31T23:59:59-01:00", "to", "must be an RFC 3339 timestamp from " +
			"0000-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"},
		{"2026-01-01T00:00:00+24:00", "9999-01-01T00:00:00Z", "from", "must be an RFC 3339 timestamp"},
		{"0000-01-01T00:00:00Z", "9999-01-01T00:00:00-99:59", "to", "must be an RFC 3339 timestamp"},
	} {
		r := b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": typ, "from": c.from,
			"to": c.to, "records": records})
		require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
		require.Equal(t, []any{map[string]any{"field": c.field, "message": c.message}},
			r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"], "%s %s", c.from, c.to)
		require.Equal(t, "indeterminate", b.get(unknown["effect_id"].(string))["state"], "nothing resolved")
	}
	// The widest window the answer writes is taken, and resolves it.
	out := b.env.Must(http.StatusOK, "POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": typ,
		"from": "0000-01-01T00:00:00Z", "to": "9999-12-31T23:59:59.999999Z", "records": records}).JSON()
	require.Len(t, out["resolved"], 1)
}

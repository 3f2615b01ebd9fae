package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/gate"
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
				g := b.env.Must(http.StatusCreated, "POST", "/api/v1/groups", b.ws.Key, map[string]any{"name": k}).JSON()
				body["group_id"] = g["id"]
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

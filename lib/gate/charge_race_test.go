package gate_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// A ceiling set while a failed probe's report is in flight counts neither
// the probe nor the attempt of unknown outcome it settled failed: nothing
// acted. The ceiling's backfill (sqlChargeEarlierGrants) reads the day's
// attempts and, after waiting for the effect's row (behind the report),
// re-reads the effect and each attempt it locks (FOR UPDATE OF e, a): the
// unknown attempt is failed now and left out; the probe, left out by the
// snapshot's read of the attempt before it (still unknown then), is failed
// as well. Had the attempts not been locked with the effect, the unknown
// attempt would be charged as of the statement's start, for good (no later
// report releases a failed attempt's charge). The report is played by a
// transaction holding the effect's row. Not parallel: it watches
// pg_stat_activity.
func TestACeilingSetWhileAFailedProbeReportsChargesNeither(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	id := str(b.probed(700)["effect_id"])
	pool := b.env.App.Pool

	report, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = report.Rollback(ctx) }()
	_, err = report.Exec(ctx, `SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	put := make(chan *apitest.Response, 1)
	go func() {
		put <- b.env.Do("PUT", "/api/v1/policies/api.call", b.ws.Key, map[string]any{"daily_budget_micros": 1000})
	}()
	apitest.WaitForLock(t, pool, `%granted AS (%`, "%",
		"the ceiling's backfill, its snapshot taken, waits for the effect's row")
	// What gate_report writes for a probe reported failed (migration 0033).
	_, err = report.Exec(ctx, `UPDATE effects SET state = 'failed', updated_at = now() WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = report.Exec(ctx, `UPDATE effect_attempts SET outcome = 'failed', reported_at = now()
		WHERE effect_id = $1 AND probe`, id)
	require.NoError(t, err)
	_, err = report.Exec(ctx, `UPDATE effect_attempts SET outcome = 'failed', resolved_at = now(), resolve_note = 'probe'
		WHERE effect_id = $1 AND NOT probe`, id)
	require.NoError(t, err)
	require.NoError(t, report.Commit(ctx))

	r := <-put
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	b.mustBegin("execute", charge(key("fits"), 1000))
	b.denialOf("budget_exceeded", charge(key("full"), 1))
}

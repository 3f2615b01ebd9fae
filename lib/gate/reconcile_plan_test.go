package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/stretchr/testify/require"
)

// A reminders pass knows the types reminded since their current period
// fell due from reconciliation_reminders, reading no events, however it is
// planned (scale QA: an index probe into events for each such type, some
// 800,000 buffers and 1.2 to 1.7 s a pass for 100,000 types overdue and
// reminded, every minute).
func TestReconciliationRemindersReadNoEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "gate_policies", "reconciliations", "reconciliation_reminders", "events")
	now := time.Now().UTC().Truncate(time.Microsecond)
	// $2 types of 50 workspaces, reminded every 24 hours for 10 days, each
	// reminded for its last 5 periods, the latest for its current one but
	// every hundredth's: within ANALYZE's sample, so its statistics are the
	// same on every run.
	const types = 5000
	seed := func(s string, args ...any) {
		_, err := tx.Exec(ctx, s, args...)
		require.NoError(t, err, "%.40s", s)
	}
	seed(`INSERT INTO gate_policies (workspace_id, effect_type, version, mode, on_indeterminate,
			lease_seconds, max_attempts, reconcile_every_hours, require_cost, required_dimensions, dimension_limits,
			surge_action, surge_cooldown_seconds, retention_days, created_at, updated_at, reconcile_since)
		SELECT 'ws_p' || k % 50, 'type.' || k, 1, 'allow', 'block', 30, 3, 24, false, '{}', '{}', 'monitor', 300, 90,
			$1::timestamptz - interval '10 days' + make_interval(secs => k), $1::timestamptz - interval '10 days',
			$1::timestamptz - interval '10 days' + make_interval(secs => k)
		FROM generate_series(1, $2::int) k`, now, types)
	seed(`INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key, dispatched_at)
		SELECT 'evt_p' || p.effect_type || '.' || j, p.workspace_id, 'reconciliation.due', p.effect_type, '{}',
			p.reconcile_since + make_interval(days => 9 - j, mins => 1), 'd' || j, $1::timestamptz
		FROM gate_policies p, generate_series(0, 4) j
		WHERE j > 0 OR hashtext(p.effect_type) % 100 <> 0`, now)
	seed(`INSERT INTO reconciliation_reminders (workspace_id, effect_type, last_reminded_at, last_due_at)
		SELECT workspace_id, subject_id, max(created_at), max(created_at) - interval '1 minute' FROM events
		GROUP BY workspace_id, subject_id`)
	for _, table := range []string{"gate_policies", "events", "reconciliation_reminders"} {
		seed(`ANALYZE ` + table)
	}
	for _, mode := range testpg.PlanCacheModes {
		for _, limit := range []int{10, 500} {
			read, nodes, err := testpg.RowsRead(ctx, tx, mode, gate.SQLReconcileDue, now, limit, gate.EventIDsAt(now, limit))
			require.NoError(t, err, "%s, limit %d", mode, limit)
			require.Zero(t, read["events"], "%s, limit %d: events read: %v", mode, limit, testpg.Reads(nodes, "events"))
		}
	}
	// The seed is as said: those not reminded for their current period are
	// reminded, the others are not.
	var due, n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM gate_policies WHERE hashtext(effect_type) % 100 = 0`).Scan(&due))
	require.NoError(t, tx.QueryRow(ctx, gate.SQLReconcileDue, now, 500, gate.EventIDsAt(now, 500)).Scan(&n))
	require.Positive(t, due)
	require.Equal(t, due, n)
}

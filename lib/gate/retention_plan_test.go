package gate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Retention deletes a batch of effects with their attempts and approvals
// by the batch's ids, reading the batch's rows, not every effect, attempt
// and approval kept, however it is planned (scale QA: joined to the batch,
// a plan made for the pass's values hashed it and scanned every effect,
// attempt or approval kept, 20,000 read for a batch of 100 effects).
func TestRetentionDeletesABatchOfEffectsByTheirIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "effects", "effect_attempts", "approvals", "gate_effect_history")
	now := time.Now().UTC().Truncate(time.Microsecond)
	// $2 effects of 20 workspaces, each with an attempt and every tenth
	// with an approval: a fifth ended 100 days ago (due), the others a day
	// ago (kept). Within ANALYZE's sample, so its statistics are the same
	// on every run.
	const effects, workspaces = 20000, 20
	seedEffects(ctx, t, tx, 10, `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state,
			lease_seconds, created_by_key_id, created_at, updated_at)
		SELECT 'eff_p' || k, 'ws_p' || k % $3, 'email.send', 'k' || k, 'f', 'succeeded', 30, 'key_p',
			$1::timestamptz - CASE WHEN k % 5 = 0 THEN interval '100 days' ELSE interval '1 day' END + make_interval(secs => k),
			$1::timestamptz - CASE WHEN k % 5 = 0 THEN interval '100 days' ELSE interval '1 day' END + make_interval(secs => k)
		FROM generate_series(1, $2::int) k`, now, effects, workspaces)
	pairs, types := make([]string, workspaces), make([]string, workspaces)
	for i := range pairs {
		pairs[i], types[i] = fmt.Sprintf("ws_p%d", i), "email.send"
	}
	for _, mode := range testpg.PlanCacheModes {
		for _, limit := range []int{100, 1000} {
			read, nodes, err := testpg.RowsRead(ctx, tx, mode, gate.SQLPurgeExpired, now, limit, []string(nil), pairs, types)
			require.NoError(t, err, "%s, limit %d", mode, limit)
			// The batch's effects read (after a probe a pair), for their
			// runs' spend, and deleted; their attempts twice.
			testpg.ReadsAtMost(t, read, nodes, map[string]int{"effects": 4 * limit, "effect_attempts": 2 * limit,
				"approvals": limit}, fmt.Sprintf("%s: a batch of %d effects", mode, limit))
		}
	}
}

// Retention reads a batch of ended groups, their steps and their steps'
// approvals by their ids, not every group, grouped effect and approval,
// however it is planned (scale QA: as a list of the batch's ids, a plan
// made for its values scanned every group, 4,000 read for a batch of 100;
// joined to the steps, every approval was scanned).
func TestRetentionReadsABatchOfGroupsByTheirIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "effect_groups", "effects", "approvals")
	now := time.Now().UTC().Truncate(time.Microsecond)
	// $2 committed groups of $3 steps, ended 200 days ago, and as many
	// effects again outside any group: within ANALYZE's sample.
	const groups, steps = 4000, 3
	for i, s := range []string{`INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id, created_at,
			updated_at, committed_at, keep_until)
		SELECT 'grp_' || g, 'ws_p' || g % 20, 'n', 'committed', 'key_p', $1::timestamptz - interval '200 days',
			$1::timestamptz - interval '200 days', $1::timestamptz - interval '200 days',
			$1::timestamptz - interval '1 day' + make_interval(secs => g)
		FROM generate_series(1, $2::int) g`,
		`INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state,
			lease_seconds, created_by_key_id, created_at, updated_at, group_id)
		SELECT 'eff_p' || k, 'ws_p' || k % 20, 'email.send', 'k' || k, 'f', 'succeeded', 30, 'key_p',
			$1::timestamptz - interval '200 days', $1::timestamptz - interval '200 days',
			CASE WHEN k <= $2 * $3 THEN 'grp_' || (k % $2 + 1) END
		FROM generate_series(1, 2 * $2 * $3::int) k`,
		`INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
		SELECT 'apr_' || id, workspace_id, id, effect_type, 'approved', 'r', created_at FROM effects
		WHERE hashtext(id) % 10 = 0`,
		`ANALYZE effect_groups`, `ANALYZE effects`, `ANALYZE approvals`,
	} {
		var args []any
		switch i {
		case 0:
			args = []any{now, groups}
		case 1:
			args = []any{now, groups, steps}
		}
		_, err := tx.Exec(ctx, s, args...)
		require.NoError(t, err, "%.40s", s)
	}
	for _, mode := range testpg.PlanCacheModes {
		for _, limit := range []int{100, 500} {
			batch := make([]string, limit)
			for i := range batch {
				batch[i] = fmt.Sprintf("grp_%d", i*groups/limit+1)
			}
			read, nodes, err := testpg.RowsRead(ctx, tx, mode, gate.SQLPurgeKeptGroups, now, batch, 10*limit)
			require.NoError(t, err, "%s, limit %d", mode, limit)
			// The batch's groups twice (read, deleted), its steps six
			// times (counted, locked, and twice each for their approvals'
			// ids and groups), their approvals twice.
			testpg.ReadsAtMost(t, read, nodes, map[string]int{"effect_groups": 2 * limit, "effects": 6 * steps * limit,
				"approvals": 2 * steps * limit}, fmt.Sprintf("%s: a batch of %d groups", mode, limit))
		}
	}
}

// Retention deletes the effects of the groups it deleted (a batch, at most
// a tenth of its effects' batch) with their attempts and approvals, reading
// those groups' steps, not every grouped effect, attempt or approval,
// however it is planned (scale QA: matched to the list of the groups' ids,
// a plan made for its values scanned every grouped effect, 12,000 read for
// the 300 steps of 100 groups).
func TestRetentionDeletesABatchOfGroupsStepsByTheirGroups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "effects", "effect_attempts", "approvals", "gate_effect_history")
	now := time.Now().UTC().Truncate(time.Microsecond)
	// $2 groups of $3 steps each (a workload of groups alone), each step
	// with an attempt and every third with an approval: within ANALYZE's
	// sample.
	const groups, steps = 4000, 3
	seedEffects(ctx, t, tx, 3, `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state,
			lease_seconds, created_by_key_id, created_at, updated_at, group_id)
		SELECT 'eff_p' || k, 'ws_p' || k % 20, 'email.send', 'k' || k, 'f', 'succeeded', 30, 'key_p',
			$1::timestamptz - interval '200 days', $1::timestamptz - interval '200 days', 'grp_' || (k % $2 + 1)
		FROM generate_series(1, $2 * $3::int) k`, now, groups, steps)
	for _, mode := range testpg.PlanCacheModes {
		for _, n := range []int{10, 100} {
			batch := make([]string, n)
			for i := range batch {
				batch[i] = fmt.Sprintf("grp_%d", i*groups/n+1)
			}
			read, nodes, err := testpg.RowsRead(ctx, tx, mode, gate.SQLPurgeExpired, now, 0, batch,
				[]string(nil), []string(nil))
			require.NoError(t, err, "%s, %d groups", mode, n)
			// The steps read, for their runs' spend, and deleted; their
			// attempts twice.
			testpg.ReadsAtMost(t, read, nodes, map[string]int{"effects": 3 * steps * n, "effect_attempts": 2 * steps * n,
				"approvals": steps * n}, fmt.Sprintf("%s: the steps of a batch of %d groups", mode, n))
		}
	}
}

// seedEffects runs effects (an insert of effects, with args) in tx, gives
// each effect an attempt and one in approvalsEvery (by its id's hash) an
// approval, and ANALYZEs the three tables.
func seedEffects(ctx context.Context, t *testing.T, tx pgx.Tx, approvalsEvery int, effects string, args ...any) {
	t.Helper()
	for i, s := range []string{effects,
		`INSERT INTO effect_attempts (effect_id, attempt, workspace_id, lease_token_hash, probe, started_at,
			lease_expires_at, outcome, began_by_key_id)
		SELECT id, 1, workspace_id, '\x00', false, created_at, created_at, 'succeeded', 'key_p' FROM effects`,
		`INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
		SELECT 'apr_' || id, workspace_id, id, effect_type, 'approved', 'r', created_at FROM effects
		WHERE hashtext(id) % $1 = 0`,
		`ANALYZE effects`, `ANALYZE effect_attempts`, `ANALYZE approvals`,
	} {
		var sargs []any
		switch i {
		case 0:
			sargs = args
		case 2:
			sargs = []any{approvalsEvery}
		}
		_, err := tx.Exec(ctx, s, sargs...)
		require.NoError(t, err, "%.40s", s)
	}
}

// Retention reads the runs of a batch's effects, to keep their wallets'
// spend (money.RetiredRunSpendSQL), through those effects and the runs' ids,
// not every effect with a run and every run, however it is planned,
// whether runs have wallets or, as most, none (scale QA: as id IN (…) over
// the effects joined to the batch, a plan made for the batch's values
// hashed it against a scan of every effect with a run, then of the whole
// of job_runs, for each batch: job_runs read 41 times in a pass that
// purged 41,000 effects; of 200,000 runs, all read for a batch of 1,000
// effects).
func TestRetentionReadsTheRunsOfABatchsEffects(t *testing.T) {
	t.Parallel()
	for name, budget := range map[string]string{"no wallets": "NULL", "wallets": "CASE WHEN g % 2 = 0 THEN 1000000 END"} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			ctx := context.Background()
			tx := testpg.Scratch(ctx, t, b.env.App.Pool, "effects", "effect_attempts", "approvals",
				"gate_effect_history", "job_runs", "run_retired_spend")
			now := time.Now().UTC().Truncate(time.Microsecond)
			// $2 runs of 20 workspaces, and as many effects, every fourth
			// of a run, a fifth ended 100 days ago (due). Within
			// ANALYZE's sample, so its statistics are the same on every
			// run.
			const runs, workspaces = 20000, 20
			_, err := tx.Exec(ctx, `INSERT INTO job_runs (id, workspace_id, name, status, created_at, finished_at,
					budget_micros)
				SELECT 'run_p' || g, 'ws_p' || g % $3, 'r', 'SUCCEEDED', $1::timestamptz - interval '100 days',
					$1::timestamptz - interval '100 days', `+budget+`
				FROM generate_series(1, $2::int) g`, now, runs, workspaces)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `ANALYZE job_runs`)
			require.NoError(t, err)
			seedEffects(ctx, t, tx, 10, `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key,
					fingerprint, state, lease_seconds, created_by_key_id, created_at, updated_at, run_id, cost_micros)
				SELECT 'eff_p' || k, 'ws_p' || k % $3, 'email.send', 'k' || k, 'f', 'succeeded', 30, 'key_p',
					$1::timestamptz - CASE WHEN k % 5 = 0 THEN interval '100 days' ELSE interval '1 day' END
						+ make_interval(secs => k),
					$1::timestamptz - CASE WHEN k % 5 = 0 THEN interval '100 days' ELSE interval '1 day' END
						+ make_interval(secs => k),
					CASE WHEN k % 4 = 0 THEN 'run_p' || (k % $2 + 1) END, 10
				FROM generate_series(1, $2::int) k`, now, runs, workspaces)
			pairs, types := make([]string, workspaces), make([]string, workspaces)
			for i := range pairs {
				pairs[i], types[i] = fmt.Sprintf("ws_p%d", i), "email.send"
			}
			for _, mode := range testpg.PlanCacheModes {
				for _, limit := range []int{100, 1000} {
					read, nodes, err := testpg.RowsRead(ctx, tx, mode, gate.SQLPurgeExpired, now, limit, []string(nil),
						pairs, types)
					require.NoError(t, err, "%s, limit %d", mode, limit)
					// The batch's effects read (after a probe a pair), for
					// their runs and deleted; the runs of a quarter of
					// them, each once.
					testpg.ReadsAtMost(t, read, nodes, map[string]int{"job_runs": limit, "run_retired_spend": limit, "effects": 4 * limit},
						fmt.Sprintf("%s: a batch of %d effects", mode, limit))
				}
			}
		})
	}
}

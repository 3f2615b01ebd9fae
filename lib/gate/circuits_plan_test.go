package gate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/testpg"
)

// A close's allowance starts at the latest key of the type stamped before
// it (closeFromSQL): its max(created_at) and max(surge_arrived_at) are a
// descent of effects_type_created_idx and effects_surge_arrivals_idx each,
// not a read of every key of the type, however the statement is planned
// (scale review: a type of a busy workspace holds hundreds of thousands of
// keys, and a close waited on that read holding the type's surge turn,
// which every begin of it takes).
func TestACloseReadsTheLatestKeyThroughAnIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "effects", "gate_circuits", "events")
	now := time.Now().UTC().Truncate(time.Microsecond)
	const keys = 120000
	_, err := tx.Exec(ctx, `
		INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, lease_seconds,
				created_by_key_id, created_at, updated_at, surge_arrived_at)
			SELECT 'eff_p' || k, CASE WHEN k % 10 = 0 THEN 'ws_other' ELSE 'ws_p' END, 'email.send', 'k' || k, 'f',
				'succeeded', 30, 'key_p', $1::timestamptz - make_interval(secs => k), $1::timestamptz - make_interval(secs => k),
				CASE WHEN k % 3 = 0 THEN $1::timestamptz - make_interval(secs => k) END
			FROM generate_series(1, $2::int) k`, now, keys)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `ANALYZE effects`)
	require.NoError(t, err)
	for name, sql := range map[string]string{"close": gate.SQLCloseCircuit, "surge off": gate.SQLCloseSurgeCircuit} {
		for _, mode := range testpg.PlanCacheModes {
			_, err := tx.Exec(ctx, `DELETE FROM gate_circuits`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `INSERT INTO gate_circuits (workspace_id, effect_type, state, opened_by, action, opened_at, closes_at, updated_at)
				VALUES ('ws_p', 'email.send', 'open', 'surge', 'deny', now(), now() + interval '1 hour', now())`)
			require.NoError(t, err)
			read, nodes, err := testpg.RowsRead(ctx, tx, mode, sql, "ws_p", "email.send", now, []string{"evt_plan0001"})
			require.NoError(t, err, "%s, %s", name, mode)
			// Two descents, a row or two each, of the type's 108,000 keys.
			require.Less(t, read["effects"], 100, "%s, %s: %v", name, mode, testpg.Reads(nodes, "effects"))
			var effects []string
			for _, n := range nodes {
				if index, _ := n.Fields["Index Name"].(string); n.Fields["Relation Name"] == "effects" || strings.HasPrefix(index, "effects_") {
					effects = append(effects, fmt.Sprint(n.Fields["Node Type"], " ", n.Fields["Index Name"]))
				}
			}
			// (Scratch's copies of the indexes are named by their columns.)
			require.ElementsMatch(t, []string{"Index Only Scan effects_workspace_id_effect_type_created_at_idx",
				"Index Only Scan effects_workspace_id_effect_type_surge_arrived_at_idx"}, effects, "%s, %s", name, mode)
		}
	}
}

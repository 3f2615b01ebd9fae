package gate_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/testpg"
)

// The sweeper reads a batch of one workspace's lapsed leases, not its
// backlog (a fleet of agents that died at once), whichever way its
// statement is planned: on its batch or once for any (testpg.CheckBacklog;
// the fan-out of events read a whole burst so, TestAFanOutReadsABatchOfABurst).
func TestTheSweepReadsABatchOfLapsedLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	testpg.CheckBacklog(t, b.env.App.Pool, testpg.Backlog{
		Tables: []string{"effects", "events"},
		Seed: `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state,
				lease_seconds, lease_expires_at, created_by_key_id, created_at, updated_at)
			SELECT 'eff_h' || g, 'ws_h' || g % $2, 'email.send', 'h' || g, 'f', 'succeeded', 60,
				now() - interval '2 days' + g * interval '1 ms', 'key_h', now() - interval '2 days', now() - interval '2 days'
			FROM generate_series(1, $1::int) g
			UNION ALL
			SELECT 'eff_b' || g, 'ws_h0', 'email.send', 'b' || g, 'f', 'leased', 60,
				now() - interval '1 hour' + g * interval '1 ms', 'key_b', now() - interval '1 hour', now() - interval '1 hour'
			FROM generate_series(1, $3::int) g`,
		SQL: gate.SQLLapseDue,
		Args: func(limit int) []any {
			events := make([]string, limit)
			for i := range events {
				events[i] = fmt.Sprintf("evt_plan%06d", i)
			}
			return []any{time.Now(), limit, events}
		},
		Limits: []int{100, 500},
	})
}

// The sweeper reads a batch of one workspace's unwinding groups, not all
// of them (thousands of rollbacks left unwinding), whichever way its
// statement is planned (testpg.CheckBacklog).
func TestTheSweepReadsABatchOfUnwindingGroups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	testpg.CheckBacklog(t, b.env.App.Pool, testpg.Backlog{
		Tables: []string{"effect_groups"},
		Seed: `INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id, created_at, updated_at,
				committed_at, swept_at)
			SELECT 'grp_h' || g, 'ws_h' || g % $2, 'g', 'committed', 'key_h', now() - interval '2 days',
				now() - interval '2 days', now() - interval '2 days', NULL
			FROM generate_series(1, $1::int) g
			UNION ALL
			SELECT 'grp_b' || g, 'ws_h0', 'g', 'unwinding', 'key_b', now() - interval '1 hour', now() - interval '1 hour',
				NULL, CASE WHEN g % 2 = 0 THEN now() - interval '1 hour' + g * interval '1 ms' END
			FROM generate_series(1, $3::int) g`,
		SQL:    gate.SQLUnwindingDue,
		Args:   func(limit int) []any { return []any{time.Now(), limit} },
		Limits: []int{100, 500},
	})
}

// A page of a workspace's approvals, of any state or of a rare one, reads
// that page, not another workspace's newer approvals nor its own of other
// states, however it is planned (scale QA: without ?state= the primary
// key was read backwards, 200,000 of another workspace's approvals for a
// page; "$4 = ” OR state = $4" in a generic plan read every approval for
// the few pending).
func TestAPageOfApprovalsReadsThePage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	testpg.CheckPages(t, b.env.App.Pool, testpg.Pages{
		Table: "approvals",
		Seed: `INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
			SELECT 'apr_' || lpad(g::text, 26, '0'), CASE WHEN g <= $1 THEN 'ws_h0' ELSE 'ws_h1' END, 'eff_' || g,
				'email.send', CASE WHEN g <= 2000 AND g % 20 = 0 THEN 'pending' ELSE 'approved' END, 'policy', now()
			FROM generate_series(1, $1::int * 3) g`,
		Rare:   gate.ApprovalPending,
		Cursor: "apr_" + strings.Repeat("0", 21) + "10000",
		Page: func(cursor, state string, limit int) (string, []any) {
			return db.NewestFirst(gate.SQLListApprovals, "workspace_id", []any{"ws_h0"}, cursor, "state", state, limit)
		},
	})
}

// A page of a workspace's effects, unfiltered, reads that page, not
// another workspace's newer effects nor, after a cursor, its own before
// it, however it is planned (scale QA: "$2 = ” OR id < $2" in a generic
// plan read the workspace's effects from its newest down to the cursor,
// 100,000 for a page 100,000 deep).
func TestAPageOfEffectsReadsThePage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	testpg.CheckPages(t, b.env.App.Pool, testpg.Pages{
		Table: "effects",
		Seed: `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, lease_seconds,
				created_by_key_id, created_at, updated_at)
			SELECT 'eff_' || lpad(g::text, 26, '0'), CASE WHEN g <= $1 THEN 'ws_h0' ELSE 'ws_h1' END, 'email.send',
				'k' || g, 'f', 'succeeded', 60, 'key_h', now(), now()
			FROM generate_series(1, $1::int * 3) g`,
		Cursor: "eff_" + strings.Repeat("0", 21) + "10000",
		Page: func(cursor, _ string, limit int) (string, []any) {
			return gate.ListEffectsSQL("ws_h0", cursor, limit, "", "", time.Now())
		},
	})
}

// A page of a workspace's effects of one state, or of one type, reads that
// page, first or after a cursor, however it is planned (scale QA: "$2 = ”
// OR id < $2" in a generic plan read the state's range from its newest
// entry down to the cursor, 100,000 entries for a page 100,000 deep). The
// rare value is every twentieth of the workspace's effects, so that a
// page after the cursor has the value's newer entries to read past.
func TestAFilteredPageOfEffectsReadsThePage(t *testing.T) {
	t.Parallel()
	seed := `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, lease_seconds,
			created_by_key_id, created_at, updated_at)
		SELECT 'eff_' || lpad(g::text, 26, '0'), CASE WHEN g <= $1 THEN 'ws_h0' ELSE 'ws_h1' END,
			CASE WHEN g <= $1 AND g % 20 = 0 THEN 'sms.send' ELSE 'email.send' END, 'k' || g, 'f',
			CASE WHEN g <= $1 AND g % 20 = 0 THEN 'failed' ELSE 'succeeded' END, 60, 'key_h', now(), now()
		FROM generate_series(1, $1::int * 3) g`
	cursor := "eff_" + strings.Repeat("0", 21) + "10000"
	for _, filter := range []string{"state", "effect_type"} {
		t.Run(filter, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rare := gate.StateFailed
			if filter == "effect_type" {
				rare = "sms.send"
			}
			testpg.CheckPages(t, b.env.App.Pool, testpg.Pages{
				Table: "effects", Seed: seed, Rare: rare, Cursor: cursor,
				Page: func(cursor, value string, limit int) (string, []any) {
					if filter == "state" {
						return gate.ListEffectsSQL("ws_h0", cursor, limit, value, "", time.Now())
					}
					return gate.ListEffectsSQL("ws_h0", cursor, limit, "", value, time.Now())
				},
			})
		})
	}
}

package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// A claim whose statement waited for its endpoint's row grants from the
// row as it is once woken, not as its snapshot saw it: a pause, a slot
// taken or the minute's allowance spent while it waited holds the job.
// Under READ COMMITTED the claim's candidate scan reads the endpoint as of
// the statement's start (its filter may be stale), and only the row it
// locks is re-read; jobs_claim_keyed therefore decides the grants in a
// second statement, after the lock (migration 0047). Staged by hand: a
// transaction holds the endpoint's row, the claim (its snapshot taken, the
// job a candidate) waits for it in pg_stat_activity, the transaction
// closes the gate and commits. The claim answers nothing; with the gate
// opened again the job is claimed (it was claimable all along).
func TestAClaimWaitingForItsEndpointGrantsFromTheLockedRow(t *testing.T) {
	t.Parallel()
	window := func(b *bundle) time.Time { return b.clock.Now().UTC().Truncate(time.Minute) }
	for _, gate := range []struct {
		name         string
		fields       jobs.PolicyFields
		close, reset string // $1 the endpoint, $2 the claim's rate window
	}{
		{"pause", jobs.PolicyFields{},
			`UPDATE job_endpoints SET paused = true WHERE id = $1 AND $2::timestamptz IS NOT NULL`,
			`UPDATE job_endpoints SET paused = false WHERE id = $1 AND $2::timestamptz IS NOT NULL`},
		{"maxConcurrent", jobs.PolicyFields{MaxConcurrent: opt[int64](1)},
			// another claim's grant of the last slot
			`UPDATE job_endpoints SET running_count = max_concurrent WHERE id = $1 AND $2::timestamptz IS NOT NULL`,
			`UPDATE job_endpoints SET running_count = 0 WHERE id = $1 AND $2::timestamptz IS NOT NULL`},
		{"rateLimitPerMinute", jobs.PolicyFields{RateLimitPerMinute: opt[int64](1)},
			// another claim's grant of the minute's last claim
			`UPDATE job_endpoints SET rate_window_start = $2, rate_window_count = rate_limit_per_minute WHERE id = $1`,
			`UPDATE job_endpoints SET rate_window_count = 0 WHERE id = $1 AND $2::timestamptz IS NOT NULL`},
	} {
		t.Run(gate.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email",
				PolicyFields: gate.fields})
			require.NoError(t, err)
			b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(`"gated"`)})
			w := b.register(t)
			pool := b.env.App.Pool

			holder, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(ctx) }()
			_, err = holder.Exec(ctx, `SELECT 1 FROM job_endpoints WHERE id = $1 FOR UPDATE`, ep.ID)
			require.NoError(t, err)
			type answer struct {
				jobs []jobs.ClaimedJob
				err  error
			}
			claimed := make(chan answer, 1)
			go func() {
				limit := 1
				c, err := b.svc.Claim(ctx, b.worker, w, jobs.ClaimRequest{Limit: &limit})
				claimed <- answer{c.Jobs, err}
			}()
			waitForLock(t, pool, `%jobs_claim_keyed(%`, "the claim, its snapshot taken, waits for the endpoint's row")
			_, err = holder.Exec(ctx, gate.close, ep.ID, window(b))
			require.NoError(t, err)
			require.NoError(t, holder.Commit(ctx))

			got := <-claimed
			require.NoError(t, got.err)
			require.Empty(t, got.jobs, "the gate closed while the claim waited holds the job")
			var running int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE endpoint_id = $1 AND status = 'RUNNING'`,
				ep.ID).Scan(&running))
			require.Zero(t, running)

			_, err = pool.Exec(ctx, gate.reset, ep.ID, window(b))
			require.NoError(t, err)
			require.Len(t, b.claim(t, w, 1), 1, "the gate opened again, the job is claimed")
		})
	}
}

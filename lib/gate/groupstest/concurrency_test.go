package groupstest

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

// A forward step racing an unwind either is refused (group_unwinding) or
// was admitted before the rollback started, and then the unwind sees it:
// nothing slips into a group behind its rollback's back.
func TestForwardStepsRacingUnwind(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 5; round++ {
		g := f.group()
		const n = 8
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			executed []string
			unwind   map[string]any
		)
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := f.do("POST", "/api/v1/effects/begin", map[string]any{"effect_type": "payment.charge",
					"idempotency_key": "race:" + ids.Random(6), "group_id": g, "cost_micros": 1,
					"compensation": map[string]any{"effect_type": "payment.refund"}})
				mu.Lock()
				defer mu.Unlock()
				switch r.Status {
				case http.StatusOK:
					executed = append(executed, r.JSON()["effect_id"].(string))
				default:
					require.Equal(t, "group_unwinding", r.ErrorCode(), "%s", r.Body)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			u := f.unwind(g)
			mu.Lock()
			unwind = u
			mu.Unlock()
		}()
		close(start)
		wg.Wait()
		// Every admitted step holds a live lease: unresolved, in the unwind's answer.
		require.ElementsMatch(t, executed, strs(unwind["unresolved"]), "round %d", round)
	}
}

// The last two compensations reported at the same time still end the
// rollback: whichever settles last sees both.
func TestConcurrentLastCompensations(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 5; round++ {
		g := f.group()
		f.done(g, true)
		f.done(g, true)
		u := f.unwind(g)
		type lease struct{ id, token string }
		var leases []lease
		for _, it := range u["plan"].([]any) {
			item := it.(map[string]any)
			comp := item["compensation"].(map[string]any)
			d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{
				"effect_type": comp["effect_type"], "payload": comp["payload"], "cost_micros": 0,
				"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": item["compensates_effect_id"]})
			leases = append(leases, lease{d["effect_id"].(string), d["lease_token"].(string)})
		}
		var wg sync.WaitGroup
		for _, l := range leases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.report(l.id, l.token, "succeeded")
			}()
		}
		wg.Wait()
		var state string
		require.NoError(t, f.env.App.Pool.QueryRow(context.Background(),
			`SELECT state FROM effect_groups WHERE id = $1`, g).Scan(&state))
		require.Equal(t, "unwound", state, "round %d", round)
	}
}

// A commit racing an unwind answers what it did: a 200 from commit shows
// the group committed, even when the unwind starts the moment it ends.
func TestCommitRacingUnwindAnswersTheCommit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 20; round++ {
		g := f.group()
		f.done(g, true)
		var wg sync.WaitGroup
		start := make(chan struct{})
		commits := make(chan *apitest.Response, 8)
		for i := 0; i < 8; i++ {
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				commits <- f.do("POST", "/api/v1/groups/"+g+"/commit", nil)
			}()
			go func() {
				defer wg.Done()
				<-start
				f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
			}()
		}
		close(start)
		wg.Wait()
		close(commits)
		for r := range commits {
			if r.Status == http.StatusOK {
				require.Equal(t, "committed", r.JSON()["state"], "round %d", round)
			} else {
				require.Equal(t, "invalid_state", r.ErrorCode(), "round %d: %s", round, r.Body)
			}
		}
	}
}

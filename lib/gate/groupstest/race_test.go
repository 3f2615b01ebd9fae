package groupstest

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

// hammer runs fn(i) for i in [0, n) at once and returns the responses in order.
func hammer(n int, fn func(i int) *apitest.Response) []*apitest.Response {
	out := make([]*apitest.Response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = fn(i)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

func (f *fx) events(typ, subject string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.env.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE workspace_id = $1 AND type = $2 AND subject_id = $3`,
		f.ws.ID, typ, subject).Scan(&n))
	return n
}

func (f *fx) eventsAbout(typ, effectID string) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.env.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE workspace_id = $1 AND type = $2 AND (subject_id = $3 OR data->>'effect_id' = $3)`,
		f.ws.ID, typ, effectID).Scan(&n))
	return n
}

// Many approves and rejects of one approval at once: exactly one decision
// wins, every answer agrees with it, one approval.decided event is recorded,
// and the waiting effect's next begins answer it (one execute after a yes).
func TestConcurrentDecisionsOfOneApproval(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/vendor.order", map[string]any{"mode": "require_approval"})
	for round := 0; round < 6; round++ {
		body := map[string]any{"effect_type": "vendor.order", "idempotency_key": "order:" + ids.Random(8),
			"payload": map[string]any{"n": round}}
		asks := hammer(8, func(int) *apitest.Response { return f.do("POST", "/api/v1/effects/begin", body) })
		apr := ""
		for _, r := range asks {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			require.Equal(t, "approval_required", r.JSON()["decision"], "%s", r.Body)
			if apr == "" {
				apr = r.JSON()["approval_id"].(string)
			}
			require.Equal(t, apr, r.JSON()["approval_id"])
		}
		require.Equal(t, 1, f.events("approval.requested", apr), "round %d", round)
		decisions := hammer(12, func(i int) *apitest.Response {
			verb := "approve"
			if (i+round)%2 == 1 {
				verb = "reject"
			}
			return f.do("POST", "/api/v1/approvals/"+apr+"/"+verb, map[string]any{"note": verb})
		})
		final := f.must(http.StatusOK, "GET", "/api/v1/approvals/"+apr, nil)["state"].(string)
		require.Contains(t, []string{"approved", "rejected"}, final)
		for i, r := range decisions {
			verb := "approved"
			if (i+round)%2 == 1 {
				verb = "rejected"
			}
			if verb == final {
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				require.Equal(t, final, r.JSON()["state"])
			} else {
				errCode(t, r, http.StatusConflict, "invalid_state")
			}
		}
		require.Equal(t, 1, f.events("approval.decided", apr), "round %d", round)
		begins := hammer(8, func(int) *apitest.Response { return f.do("POST", "/api/v1/effects/begin", body) })
		counts := map[string]int{}
		for _, r := range begins {
			d := r.JSON()
			if final == "rejected" {
				errCode(t, r, http.StatusForbidden, "approval_rejected")
			}
			counts[d["decision"].(string)]++
		}
		if final == "approved" {
			require.Equal(t, 1, counts["execute"], "%v", counts)
			require.Equal(t, 7, counts["in_flight"], "%v", counts)
		} else {
			require.Equal(t, 8, counts["denied"], "%v", counts)
		}
	}
}

// Many unwinds of one group at once agree on the plan (reverse order of
// success, same suggested keys); each compensation begun by many callers
// at once under its suggested key executes exactly once and the others are
// told in_flight (groups QA: one was refused invalid_state, told to use the
// key it had used: its insert met the step's compensation index before the
// key's); reports racing unwinds end the rollback unwound.
func TestConcurrentUnwindsAndCompensations(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 5; round++ {
		g := f.group()
		var steps []string
		for i := 0; i < 4; i++ {
			steps = append(steps, f.done(g, true))
		}
		us := hammer(8, func(int) *apitest.Response { return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil) })
		want := []string{steps[3], steps[2], steps[1], steps[0]}
		var plan []any
		for _, r := range us {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			u := r.JSON()
			require.Equal(t, "unwinding", u["state"])
			require.Equal(t, want, planIDs(u))
			if plan == nil {
				plan = u["plan"].([]any)
			}
			require.Equal(t, plan, u["plan"])
		}
		type lease struct{ id, token string }
		var leases []lease
		for _, it := range plan {
			item := it.(map[string]any)
			comp := item["compensation"].(map[string]any)
			body := map[string]any{"effect_type": comp["effect_type"], "payload": comp["payload"], "cost_micros": 0,
				"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": item["compensates_effect_id"]}
			rs := hammer(6, func(int) *apitest.Response { return f.do("POST", "/api/v1/effects/begin", body) })
			counts := map[string]int{}
			for _, r := range rs {
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				d := r.JSON()
				counts[d["decision"].(string)]++
				if d["decision"] == "execute" {
					leases = append(leases, lease{d["effect_id"].(string), d["lease_token"].(string)})
				}
			}
			require.Equal(t, map[string]int{"execute": 1, "in_flight": 5}, counts)
		}
		rs := hammer(len(leases)*2, func(i int) *apitest.Response {
			if i%2 == 0 {
				l := leases[i/2]
				return f.do("POST", "/api/v1/effects/"+l.id+"/report",
					map[string]any{"lease_token": l.token, "outcome": "succeeded"})
			}
			return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
		})
		for _, r := range rs {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		}
		u := f.unwind(g)
		require.Equal(t, "unwound", u["state"], "%v", u)
		require.ElementsMatch(t, steps, strs(u["reversed"]))
		require.Empty(t, u["plan"])
	}
}

// A forward step's report racing unwinds: every unwind shows the step
// either unresolved (still leased) or in the plan (succeeded), never
// neither, and once the report is in the plan offers it.
func TestStepReportRacingUnwind(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 8; round++ {
		g := f.group()
		first := f.done(g, true)
		f.clock.Add(time.Second)
		id, tok := f.step(g, true)
		rs := hammer(6, func(i int) *apitest.Response {
			if i == 0 {
				return f.do("POST", "/api/v1/effects/"+id+"/report",
					map[string]any{"lease_token": tok, "outcome": "succeeded"})
			}
			return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
		})
		for i, r := range rs {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			if i == 0 {
				continue
			}
			u := r.JSON()
			if planIDs(u) == nil || len(strs(u["unresolved"])) > 0 {
				require.Equal(t, []string{id}, strs(u["unresolved"]), "%v", u)
				require.Empty(t, planIDs(u), "nothing is offered behind a maybe")
			} else {
				require.Equal(t, []string{id, first}, planIDs(u))
			}
		}
		u := f.unwind(g)
		require.Equal(t, []string{id, first}, planIDs(u))
		require.Empty(t, u["unresolved"])
	}
}

// Reconcile, resolve, a late report and reads racing on one effect whose
// lease lapsed: exactly one settlement is recorded, the late report is
// lease_expired, one effect.indeterminate event.
func TestSettlementsOfALapsedEffectRace(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.charge", map[string]any{"lease_seconds": 5})
	// Two operators: a resolve's repeat by its own key answers 200, so
	// who won is told apart by key.
	resolver := f.env.Key(f.ws, map[string]any{"name": "resolver", "preset": "OPERATOR"})
	reconciler := f.env.Key(f.ws, map[string]any{"name": "reconciler", "preset": "OPERATOR"})
	for round := 0; round < 6; round++ {
		k := "charge:" + ids.Random(8)
		from := f.clock.Now().Add(-time.Minute).Format(time.RFC3339)
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{"effect_type": "payment.charge",
			"idempotency_key": k, "payload": map[string]any{"n": round}, "cost_micros": 500})
		require.Equal(t, "execute", d["decision"])
		id, tok := d["effect_id"].(string), d["lease_token"].(string)
		f.clock.Add(10 * time.Second)
		to := f.clock.Now().Add(time.Minute).Format(time.RFC3339)
		rs := hammer(12, func(i int) *apitest.Response {
			switch i % 4 {
			case 0:
				return f.do("POST", "/api/v1/effects/"+id+"/report", map[string]any{"lease_token": tok, "outcome": "succeeded"})
			case 1:
				return f.env.Do("POST", "/api/v1/effects/"+id+"/resolve", resolver, map[string]any{"outcome": "succeeded", "note": "seen"})
			case 2:
				return f.env.Do("POST", "/api/v1/reconcile", reconciler, map[string]any{"effect_type": "payment.charge", "from": from, "to": to,
					"records": []any{map[string]any{"idempotency_key": k, "status": "succeeded", "amount_micros": 500}}})
			default:
				return f.do("GET", "/api/v1/effects/"+id, nil)
			}
		})
		resolves, reconciled := 0, 0
		for i, r := range rs {
			switch i % 4 {
			case 0:
				errCode(t, r, http.StatusConflict, "lease_expired")
			case 1:
				if r.Status == http.StatusOK {
					resolves++
				} else {
					errCode(t, r, http.StatusConflict, "invalid_state")
				}
			case 2:
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				reconciled += len(r.JSON()["resolved"].([]any))
			default:
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			}
		}
		require.LessOrEqual(t, reconciled, 1, "round %d", round)
		require.True(t, (resolves > 0) != (reconciled == 1), "round %d: exactly one settlement: %d resolves, %d reconciled",
			round, resolves, reconciled)
		e := f.must(http.StatusOK, "GET", "/api/v1/effects/"+id, nil)
		require.Equal(t, "succeeded", e["state"])
		require.Len(t, e["attempts"], 1)
		require.Equal(t, 1, f.eventsAbout("effect.indeterminate", id), "round %d", round)
	}
}

// An approve racing begins of the effect it waits on: exactly one begin
// is granted execute, whatever the interleaving; the others wait for the
// approval or the lease.
func TestApproveRacingBeginsExecutesOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/vendor.order", map[string]any{"mode": "require_approval"})
	for round := 0; round < 8; round++ {
		body := map[string]any{"effect_type": "vendor.order", "idempotency_key": "order:" + ids.Random(8)}
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", body)
		apr := d["approval_id"].(string)
		rs := hammer(10, func(i int) *apitest.Response {
			if i == 0 {
				return f.do("POST", "/api/v1/approvals/"+apr+"/approve", map[string]any{})
			}
			return f.do("POST", "/api/v1/effects/begin", body)
		})
		require.Equal(t, http.StatusOK, rs[0].Status, "%s", rs[0].Body)
		counts := map[string]int{}
		for _, r := range rs[1:] {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			counts[r.JSON()["decision"].(string)]++
		}
		require.LessOrEqual(t, counts["execute"], 1, "%v", counts)
		require.Equal(t, 9, counts["execute"]+counts["in_flight"]+counts["approval_required"], "%v", counts)
		after := hammer(4, func(int) *apitest.Response { return f.do("POST", "/api/v1/effects/begin", body) })
		for _, r := range after {
			counts[r.JSON()["decision"].(string)]++
		}
		require.Equal(t, 1, counts["execute"], "%v", counts)
		e := f.must(http.StatusOK, "GET", "/api/v1/effects/"+d["effect_id"].(string), nil)
		require.EqualValues(t, 1, e["attempt"])
		require.Equal(t, 1, f.events("approval.decided", apr))
	}
}

// An approval of a group's forward step racing the group's unwind and the
// step's begins: the approval is given before the rollback started, or
// the unwind closes it (rejected) and a yes is refused (group_unwinding
// while the unwind holds it, invalid_state after); the step executes only
// if approved and begun before the rollback started, and then every unwind
// holds the plan behind it (unresolved); one approval.decided event for
// the one decision made.
func TestApproveRacingUnwind(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/vendor.order", map[string]any{"mode": "require_approval"})
	for round := 0; round < 8; round++ {
		g := f.group()
		first := f.done(g, true)
		body := map[string]any{"effect_type": "vendor.order", "idempotency_key": "order:" + ids.Random(8), "group_id": g}
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", body)
		require.Equal(t, "approval_required", d["decision"])
		id, apr := d["effect_id"].(string), d["approval_id"].(string)
		rs := hammer(6, func(i int) *apitest.Response {
			switch i % 3 {
			case 0:
				return f.do("POST", "/api/v1/approvals/"+apr+"/approve", map[string]any{})
			case 1:
				return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
			default:
				return f.do("POST", "/api/v1/effects/begin", body)
			}
		})
		approved, executed := 0, 0
		var unwinds []map[string]any
		for i, r := range rs {
			switch i % 3 {
			case 0:
				if r.Status == http.StatusOK {
					approved++
				} else if r.ErrorCode() != "group_unwinding" {
					errCode(t, r, http.StatusConflict, "invalid_state")
				}
			case 1:
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				unwinds = append(unwinds, r.JSON())
			default:
				if r.Status != http.StatusOK {
					errCode(t, r, http.StatusConflict, "group_unwinding")
					continue
				}
				switch r.JSON()["decision"] {
				case "execute":
					executed++
				case "approval_required", "in_flight":
				default:
					t.Fatalf("begin: %s", r.Body)
				}
			}
		}
		require.LessOrEqual(t, executed, 1)
		for _, u := range unwinds {
			if executed == 1 {
				require.Equal(t, []string{id}, strs(u["unresolved"]), "%v", u)
				require.Empty(t, planIDs(u))
			} else {
				require.Equal(t, []string{first}, planIDs(u), "%v", u)
			}
		}
		a := f.must(http.StatusOK, "GET", "/api/v1/approvals/"+apr, nil)
		if approved > 0 {
			require.Equal(t, "approved", a["state"])
			require.Equal(t, 1, f.events("approval.decided", apr))
		} else {
			require.Zero(t, executed)
			require.Equal(t, "rejected", a["state"], "closed by the unwind")
			require.Contains(t, a["note"], rolledBackNote)
			require.Equal(t, 1, f.events("approval.decided", apr))
		}
		if executed == 0 {
			errCode(t, f.do("POST", "/api/v1/effects/begin", body), http.StatusConflict, "group_unwinding")
		}
		e := f.must(http.StatusOK, "GET", "/api/v1/effects/"+id, nil)
		require.EqualValues(t, executed, e["attempt"])
	}
}

// A group's step whose lease lapsed: resolve, reconcile and unwinds race;
// once settled the plan offers the step, and a compensation that lapsed
// unreported and is then resolved ends the rollback.
func TestUnknownStepSettledRacingUnwind(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.charge", map[string]any{"lease_seconds": 5})
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.refund", map[string]any{"lease_seconds": 5})
	for round := 0; round < 5; round++ {
		g := f.group()
		first := f.done(g, true)
		from := f.clock.Now().Add(-time.Minute).Format(time.RFC3339)
		id, tok := f.step(g, true)
		f.clock.Add(10 * time.Second)
		to := f.clock.Now().Add(time.Minute).Format(time.RFC3339)
		e := f.must(http.StatusOK, "GET", "/api/v1/effects/"+id, nil)
		rs := hammer(9, func(i int) *apitest.Response {
			switch i % 3 {
			case 0:
				return f.do("POST", "/api/v1/effects/"+id+"/resolve", map[string]any{"outcome": "succeeded"})
			case 1:
				return f.do("POST", "/api/v1/reconcile", map[string]any{"effect_type": "payment.charge", "from": from, "to": to,
					"records": []any{map[string]any{"idempotency_key": e["idempotency_key"], "status": "succeeded", "amount_micros": 1000}}})
			default:
				return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
			}
		})
		for i, r := range rs {
			if i%3 == 0 && r.Status != http.StatusOK {
				errCode(t, r, http.StatusConflict, "invalid_state")
				continue
			}
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			if i%3 == 2 {
				u := r.JSON()
				if len(strs(u["unresolved"])) > 0 {
					require.Equal(t, []string{id}, strs(u["unresolved"]))
					require.Empty(t, planIDs(u))
				} else {
					require.Equal(t, []string{id, first}, planIDs(u))
				}
			}
		}
		errCode(t, f.do("POST", "/api/v1/effects/"+id+"/report", map[string]any{"lease_token": tok, "outcome": "failed"}),
			http.StatusConflict, "lease_expired")
		u := f.unwind(g)
		require.Equal(t, []string{id, first}, planIDs(u))
		// Compensate both; the first compensation lapses unreported.
		items := u["plan"].([]any)
		lapsedComp := f.compensate(items[0].(map[string]any), "")
		f.compensate(items[1].(map[string]any), "succeeded")
		f.clock.Add(10 * time.Second)
		u = f.unwind(g)
		require.Equal(t, []string{lapsedComp}, strs(u["unresolved"]))
		rs = hammer(6, func(i int) *apitest.Response {
			if i%2 == 0 {
				return f.do("POST", "/api/v1/effects/"+lapsedComp+"/resolve", map[string]any{"outcome": "succeeded"})
			}
			return f.do("GET", "/api/v1/groups/"+g, nil)
		})
		for _, r := range rs {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		}
		require.Equal(t, "unwound", f.stored(g), "round %d: the resolve that settled the last step ended the rollback", round)
	}
}

// A failed step's retries, begun with and without its group_id, racing
// unwinds: each begin executes (at most one), waits, or is refused
// group_unwinding; no deadlock or 500; an attempt granted shows in every
// later unwind as unresolved.
func TestStepRetriesRacingUnwind(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 10; round++ {
		g := f.group()
		f.done(g, true)
		f.clock.Add(time.Second)
		k := "charge:" + ids.Random(8)
		grouped := map[string]any{"effect_type": "payment.charge", "idempotency_key": k,
			"payload": map[string]any{"order": "o"}, "cost_micros": 1000, "group_id": g,
			"compensation": map[string]any{"effect_type": "payment.refund", "payload": map[string]any{"refund_of": "charge"}}}
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", grouped)
		id := d["effect_id"].(string)
		f.report(id, d["lease_token"].(string), "failed")
		bare := map[string]any{}
		for k, v := range grouped {
			if k != "group_id" && k != "compensation" {
				bare[k] = v
			}
		}
		rs := hammer(10, func(i int) *apitest.Response {
			switch {
			case i < 2:
				return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
			case i%2 == 0:
				return f.do("POST", "/api/v1/effects/begin", grouped)
			default:
				return f.do("POST", "/api/v1/effects/begin", bare)
			}
		})
		executed := 0
		for i, r := range rs {
			if i < 2 {
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				continue
			}
			if r.Status != http.StatusOK {
				errCode(t, r, http.StatusConflict, "group_unwinding")
				continue
			}
			switch r.JSON()["decision"] {
			case "execute":
				executed++
			case "in_flight":
			default:
				t.Fatalf("begin: %s", r.Body)
			}
		}
		require.LessOrEqual(t, executed, 1)
		u := f.unwind(g)
		if executed == 1 {
			require.Equal(t, []string{id}, strs(u["unresolved"]))
		} else {
			require.Empty(t, u["unresolved"])
		}
	}
}

// Under on_indeterminate retry, new attempts on a lapsed key racing
// reconciliations that find it succeeded at the vendor: either one begin
// is granted the new attempt (and the reconciliations leave the key
// unsettled) or one reconciliation resolves it (and every begin is told
// duplicate), never both, never twice.
func TestRetriesRacingReconcile(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.charge",
		map[string]any{"lease_seconds": 5, "on_indeterminate": "retry"})
	for round := 0; round < 8; round++ {
		k := "charge:" + ids.Random(8)
		body := map[string]any{"effect_type": "payment.charge", "idempotency_key": k,
			"payload": map[string]any{"n": round}, "cost_micros": 700}
		from := f.clock.Now().Add(-time.Minute).Format(time.RFC3339)
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", body)
		require.Equal(t, "execute", d["decision"])
		f.clock.Add(10 * time.Second)
		to := f.clock.Now().Add(time.Minute).Format(time.RFC3339)
		rs := hammer(9, func(i int) *apitest.Response {
			if i%3 == 0 {
				return f.do("POST", "/api/v1/reconcile", map[string]any{"effect_type": "payment.charge", "from": from,
					"to": to, "records": []any{map[string]any{"idempotency_key": k, "status": "succeeded", "amount_micros": 700}}})
			}
			return f.do("POST", "/api/v1/effects/begin", body)
		})
		counts := map[string]int{}
		for i, r := range rs {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			if i%3 == 0 {
				counts["resolved"] += len(r.JSON()["resolved"].([]any))
				continue
			}
			counts[r.JSON()["decision"].(string)]++
		}
		require.Equal(t, 1, counts["execute"]+counts["resolved"], "round %d: %v", round, counts)
		if counts["resolved"] == 1 {
			require.Equal(t, 6, counts["duplicate"], "%v", counts)
		} else {
			require.Equal(t, 5, counts["in_flight"], "%v", counts)
		}
	}
}

// A failed compensation's retries (with and without compensates_effect_id)
// racing unwinds, reads of the group and the other compensation's report:
// one new attempt at most, no deadlock, and the rollback ends unwound
// once both compensations succeeded.
func TestCompensationRetriesRacingSettlement(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 8; round++ {
		g := f.group()
		f.done(g, true)
		f.done(g, true)
		u := f.unwind(g)
		items := u["plan"].([]any)
		first := items[0].(map[string]any)
		comp := first["compensation"].(map[string]any)
		body := map[string]any{"effect_type": comp["effect_type"], "payload": comp["payload"], "cost_micros": 0,
			"idempotency_key": first["suggested_idempotency_key"], "compensates_effect_id": first["compensates_effect_id"]}
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", body)
		f.report(d["effect_id"].(string), d["lease_token"].(string), "failed")
		second := items[1].(map[string]any)
		c2 := second["compensation"].(map[string]any)
		d2 := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{"effect_type": c2["effect_type"],
			"payload": c2["payload"], "cost_micros": 0, "idempotency_key": second["suggested_idempotency_key"],
			"compensates_effect_id": second["compensates_effect_id"]})
		bare := map[string]any{}
		for k, v := range body {
			if k != "compensates_effect_id" {
				bare[k] = v
			}
		}
		rs := hammer(12, func(i int) *apitest.Response {
			switch i % 4 {
			case 0:
				if i == 0 {
					return f.do("POST", "/api/v1/effects/"+d2["effect_id"].(string)+"/report",
						map[string]any{"lease_token": d2["lease_token"], "outcome": "succeeded"})
				}
				return f.do("GET", "/api/v1/groups/"+g, nil)
			case 1:
				return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
			case 2:
				return f.do("POST", "/api/v1/effects/begin", body)
			default:
				return f.do("POST", "/api/v1/effects/begin", bare)
			}
		})
		var lease map[string]any
		for i, r := range rs {
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			if i%4 >= 2 {
				switch r.JSON()["decision"] {
				case "execute":
					require.Nil(t, lease, "one new attempt")
					lease = r.JSON()
				case "in_flight":
				default:
					t.Fatalf("begin: %s", r.Body)
				}
			}
		}
		require.NotNil(t, lease)
		f.report(lease["effect_id"].(string), lease["lease_token"].(string), "succeeded")
		require.Equal(t, "unwound", f.stored(g), "round %d", round)
	}
}

// Two groups' failed steps each begun again naming the other group (a key
// of group 1 sent with group 2's id, and the reverse), with the steps'
// own retries (with and without their group_id) and unwinds of both
// groups, all at once: the crossed begins are refused
// idempotency_key_reuse before they lock anything of the key's group (admit
// reads the key's group under the group it names; a key inserted
// meanwhile is refused on the fast read), so no begin holds two groups and
// nothing deadlocks; the rest execute (once), wait, or are refused
// group_unwinding.
func TestCrossedGroupBeginsRacingUnwinds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	failedStep := func(g string) map[string]any {
		body := map[string]any{"effect_type": "payment.charge", "idempotency_key": "charge:" + ids.Random(8),
			"payload": map[string]any{"order": ids.Random(4)}, "cost_micros": 1000, "group_id": g,
			"compensation": map[string]any{"effect_type": "payment.refund", "payload": map[string]any{"refund_of": "charge"}}}
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", body)
		f.report(d["effect_id"].(string), d["lease_token"].(string), "failed")
		return body
	}
	with := func(body map[string]any, group any) map[string]any {
		out := map[string]any{}
		for k, v := range body {
			if k != "group_id" {
				out[k] = v
			}
		}
		if group != nil {
			out["group_id"] = group
		} else {
			delete(out, "compensation")
		}
		return out
	}
	for round := 0; round < 8; round++ {
		g1, g2 := f.group(), f.group()
		f.done(g1, true)
		f.done(g2, true)
		a, b := failedStep(g1), failedStep(g2)
		type call struct {
			path string
			body map[string]any
			kind string // unwind, crossed, own
		}
		calls := []call{
			{"/api/v1/groups/" + g1 + "/unwind", nil, "unwind"},
			{"/api/v1/groups/" + g2 + "/unwind", nil, "unwind"},
		}
		for range 3 {
			calls = append(calls,
				call{"/api/v1/effects/begin", with(a, g2), "crossed"},
				call{"/api/v1/effects/begin", with(b, g1), "crossed"},
				call{"/api/v1/effects/begin", a, "own"},
				call{"/api/v1/effects/begin", b, "own"},
				call{"/api/v1/effects/begin", with(a, nil), "own"},
				call{"/api/v1/effects/begin", with(b, nil), "own"})
		}
		rs := hammer(len(calls), func(i int) *apitest.Response { return f.do("POST", calls[i].path, calls[i].body) })
		executed := map[string]int{}
		for i, r := range rs {
			switch c := calls[i]; c.kind {
			case "unwind":
				require.Equal(t, http.StatusOK, r.Status, "round %d: %s", round, r.Body)
			case "crossed":
				errCode(t, r, http.StatusConflict, "idempotency_key_reuse")
			default:
				if r.Status != http.StatusOK {
					errCode(t, r, http.StatusConflict, "group_unwinding")
					continue
				}
				switch d := r.JSON(); d["decision"] {
				case "execute":
					executed[d["effect_id"].(string)]++
				case "in_flight":
				default:
					t.Fatalf("round %d: begin: %s", round, r.Body)
				}
			}
		}
		for id, n := range executed {
			require.Equal(t, 1, n, "round %d: effect %s executed more than once", round, id)
		}
	}
}

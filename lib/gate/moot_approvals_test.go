package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/testpg"
)

// heldRetry leaves an email.send key indeterminate (its lease lapsed under
// on_indeterminate retry) with its retry waiting for an approval, and
// answers the effect id, the approval id and the begin body.
func (b *bundle) heldRetry() (id, approval string, body map[string]any) {
	b.t.Helper()
	return b.heldRetryOf("email.send")
}

// heldRetryOf is heldRetry for a key of effect type typ.
func (b *bundle) heldRetryOf(typ string) (id, approval string, body map[string]any) {
	b.t.Helper()
	b.putPolicy(typ, map[string]any{"on_indeterminate": "retry", "lease_seconds": 5})
	body = email(key("held"))
	body["effect_type"] = typ
	id = str(b.mustBegin("execute", body)["effect_id"])
	b.clock.Add(time.Minute) // the lease lapses unreported
	b.putPolicy(typ, map[string]any{"mode": "require_approval"})
	held := b.mustBegin("approval_required", body)
	require.Equal(b.t, "indeterminate", held["state"])
	return id, str(held["approval_id"]), body
}

// pendAgain makes approval pending again, as one an earlier release left
// pending (or a close passed over) was, its announcement gone with its
// decision.
func (b *bundle) pendAgain(approval string) {
	b.t.Helper()
	_, err := b.env.App.Pool.Exec(context.Background(), `WITH ap AS (UPDATE approvals SET state = 'pending',
		decided_at = NULL, decided_by_key_id = NULL, note = NULL WHERE id = $1 RETURNING id, effect_id),
		ev AS (DELETE FROM events WHERE subject_id = (SELECT id FROM ap))
		UPDATE effects SET approval_state = 'pending' WHERE id = (SELECT effect_id FROM ap)`, approval)
	require.NoError(b.t, err)
}

// A rejection is final for the key (API.md §2.4, §5): an effect the
// operator resolved failed while its retry waited for the approval reads
// denied approval_rejected as soon as it is rejected, as one waiting in
// awaiting_approval does, not failed until its next begin (gate QA).
func TestRejectingTheApprovalOfAFailedEffectDeniesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, approval, body := b.heldRetry()
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
	require.Equal(t, "failed", b.get(id)["state"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+approval+"/reject", b.ws.Key, map[string]any{"note": "no"})
	b.requireRejected(id, body)
}

// A rejection that waits for the effect's row while a resolve to failed
// holds it (the resolve locked the effect first) denies the effect as one
// sent after the resolve does: the rejection's statement read the effect's
// latest attempt in its own snapshot, of unknown outcome, and left the
// effect, resolved failed meanwhile, indeterminate with no attempt of
// unknown outcome left to resolve, its next begin denied and the effect
// still indeterminate (QA). The resolve is queued on the held row before
// the rejection, so it takes the row first.
func TestARejectionWaitingOnAResolveToFailedDeniesTheEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, approval, body := b.heldRetry()
	holder := b.holding(`SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, id)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, holder))
	send := func(path string, body map[string]any) (<-chan struct{}, *int) {
		done, status := make(chan struct{}), new(int)
		go func() {
			defer close(done)
			*status, _, _ = post(b.env, path, b.ws.Key, body)
		}()
		return done, status
	}
	resolved, resolveStatus := send("/api/v1/effects/"+id+"/resolve", map[string]any{"outcome": "failed"})
	waits.Waiting(resolved, "the resolve waits for the effect's row")
	rejected, rejectStatus := send("/api/v1/approvals/"+approval+"/reject", map[string]any{"note": "no"})
	waits.Waiting(rejected, "the rejection waits for the effect's row, behind the resolve")
	require.NoError(t, holder.Rollback(context.Background()))
	<-resolved
	<-rejected
	require.Equal(t, []int{http.StatusOK, http.StatusOK}, []int{*resolveStatus, *rejectStatus})
	e := b.requireRejected(id, body)
	require.Equal(t, "failed", e["attempts"].([]any)[0].(map[string]any)["outcome"])
}

// A pending approval whose effect a resolution settled succeeded asks
// nothing any more: nothing can run on its key again (a duplicate). The
// resolution decides it, rejected with a note saying why, so that the
// queue of pending approvals holds only questions (gate QA: it stayed
// pending for good, and approving it said nothing of the effect). Both an
// operator's resolve and a reconciliation do.
func TestResolvingAnEffectSucceededClosesItsPendingApproval(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"resolve", "reconcile"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			start := b.clock.Now().Add(-time.Hour)
			id, approval, body := b.heldRetry()
			if how == "resolve" {
				b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
					map[string]any{"outcome": "succeeded"})
			} else {
				out := b.env.Must(http.StatusOK, "POST", "/api/v1/reconcile", b.ws.Key, map[string]any{
					"effect_type": "email.send", "from": start.Format(time.RFC3339Nano),
					"to":      b.clock.Now().Format(time.RFC3339Nano),
					"records": []map[string]any{{"idempotency_key": body["idempotency_key"], "status": "succeeded"}},
				}).JSON()
				require.Len(t, out["resolved"], 1, "%v", out)
			}
			a := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+approval, b.ws.Key, nil).JSON()
			require.Equal(t, "rejected", a["state"], "%v", a)
			require.NotNil(t, a["decided_at"])
			require.Contains(t, str(a["note"]), "succeeded")
			require.Equal(t, keyID(b.ws.Key), a["decided_by_key_id"], "decided by the resolving key")
			pending := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()
			require.Empty(t, pending["data"])
			require.Equal(t, 1, b.events("approval.decided"))
			// The effect is what the resolution made it; its key is a duplicate.
			require.Equal(t, "succeeded", b.get(id)["state"])
			b.mustBegin("duplicate", body)
			errCode(t, b.env.Do("POST", "/api/v1/approvals/"+approval+"/approve", b.ws.Key, nil),
				http.StatusConflict, "invalid_state")
		})
	}
}

// Retention never deletes a pending approval (sqlPurgeExpired): an effect
// resolved failed while its retry waited for an operator is ended, but its
// question is still open, and its key held by it (retention QA: the effect
// went at its retention_days with its approval, unanswered, and the key was
// new again). Decided, it goes at its retention like any other. Not
// parallel, in its own era (1927).
func TestRetentionKeepsAnEffectWhoseApprovalIsPending(t *testing.T) {
	b, sweep := inEra(t, 1927)
	id, approval, body := b.heldRetry()
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
	b.clock.Add(49 * time.Hour)
	sweep()
	require.Equal(t, "failed", b.get(id)["state"], "kept while its approval is pending")
	a := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+approval, b.ws.Key, nil).JSON()
	require.Equal(t, "pending", a["state"])
	b.mustBegin("approval_required", body)

	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+approval+"/reject", b.ws.Key, nil)
	b.clock.Add(49 * time.Hour)
	sweep()
	errCode(t, b.env.Do("GET", "/api/v1/effects/"+id, b.ws.Key, nil), http.StatusNotFound, "not_found")
}

// A resolution never waits for a pending approval's lock: a decide locks
// the approval, then the effect, which the resolution already holds, so
// waiting closed a cycle (a deadlock, one side answering 503). It passes
// over an approval another transaction holds (an operator deciding it now),
// which that transaction decides, or leaves pending.
func TestAResolutionDoesNotWaitForAnApprovalBeingDecided(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, approval, _ := b.heldRetry()
	ctx := context.Background()
	holder := b.holding(`SELECT 1 FROM approvals WHERE id = $1 FOR UPDATE`, approval)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, holder))
	done, status := make(chan struct{}), make(chan int, 1)
	go func() {
		defer close(done)
		code, _, _ := post(b.env, "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "succeeded"})
		status <- code
	}()
	require.False(t, waits.Wait(done, "the resolve answers without waiting for the approval"))
	require.Equal(t, http.StatusOK, <-status)
	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, "succeeded", b.get(id)["state"])
}

// An approval a resolution left pending on an effect it settled succeeded
// (another transaction held it then; or the effect was settled before
// resolutions closed them, session 61) is closed by the sweeper
// (approvals.moot) as the resolution closes one: rejected, decided by the
// resolving key with the same note, announced once; the effect stays
// succeeded, and retention then takes it (it keeps an effect whose approval
// is pending). The resolving key revoked since decides it all the same.
func TestTheSweeperClosesAMootApprovalAResolutionLeftPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	made := b.env.Must(http.StatusCreated, "POST", "/api/v1/keys", b.ws.Key,
		map[string]any{"name": "resolver", "scopes": []string{"effects:resolve"}}).JSON()
	resolverID, resolver := str(made["id"]), str(made["secret"])
	id, approval, body := b.heldRetry()
	holder := b.holding(`SELECT 1 FROM approvals WHERE id = $1 FOR UPDATE`, approval)
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", resolver, map[string]any{"outcome": "succeeded"})
	var held string // read while still held: another test's sweep pass may close it once let go
	require.NoError(t, holder.QueryRow(ctx, `SELECT state FROM approvals WHERE id = $1`, approval).Scan(&held))
	require.Equal(t, "pending", held, "passed over while held")
	require.NoError(t, holder.Rollback(ctx))
	b.env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+resolverID, b.ws.Key, nil)

	for {
		n, err := b.env.App.Server.Gate.SweepMootApprovals(ctx, b.clock.Now(), 500)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	a := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+approval, b.ws.Key, nil).JSON()
	require.Equal(t, "rejected", a["state"], "%v", a)
	require.NotNil(t, a["decided_at"])
	require.Equal(t, gate.MootNote, a["note"])
	require.Equal(t, 1, b.events("approval.decided"))
	require.Equal(t, "succeeded", b.get(id)["state"])
	b.mustBegin("duplicate", body)
	var state, decidedBy string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT f.approval_state, ap.decided_by_key_id
		FROM effects f JOIN approvals ap ON ap.id = f.approval_id WHERE f.id = $1`, id).Scan(&state, &decidedBy))
	require.Equal(t, "rejected", state, "retention no longer keeps the effect for it")
	require.Equal(t, resolverID, decidedBy, "the resolving key, revoked since")
}

// The sweeper's moot approvals take turns among workspaces: each
// workspace's first before any one's second, so one workspace's backlog
// (every effect settled before resolutions closed their approvals) holds
// no other's back. Not parallel: the sweep acts on the whole package
// database, and is first run until it finds none.
func TestTheSweptMootApprovalsTakeTurnsAmongWorkspaces(t *testing.T) {
	ctx := context.Background()
	busy := setup(t)
	quiet := &bundle{t: t, env: busy.env, ws: busy.env.Signup(), clock: busy.clock} // one clock: its ids come later
	// Settled succeeded, and left pending as a release before session 61 left them.
	moot := func(b *bundle, typ string) string {
		id, approval, _ := b.heldRetryOf(typ)
		b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "succeeded"})
		b.pendAgain(approval)
		return approval
	}
	sweep := func(limit int) int {
		n, err := busy.env.App.Server.Gate.SweepMootApprovals(ctx, busy.clock.Now(), limit)
		require.NoError(t, err)
		return n
	}
	for sweep(500) > 0 { // other tests' (TestAResolutionDoesNotWaitForAnApprovalBeingDecided leaves one)
	}
	first, second := moot(busy, "email.send"), moot(busy, "sms.send") // the busy workspace's first
	last := moot(quiet, "email.send")
	closed := func(approvals ...string) (n int) {
		require.NoError(t, busy.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM approvals WHERE id = ANY($1)
			AND state = 'rejected'`, approvals).Scan(&n))
		return n
	}
	require.Equal(t, 2, sweep(2))
	require.Equal(t, 1, closed(last), "the quiet workspace's in the first batch")
	require.Equal(t, 1, closed(first, second))
	require.Equal(t, 1, sweep(2))
	require.Equal(t, 3, closed(first, second, last))
}

// The sweeper's pass over moot approvals reads the few it closes through
// the primary key, not every approval, whichever way it is planned: as
// ap.id IN (…) the planner hashed the batch's ids and scanned the whole
// table for them on every pass (scale QA: 1,430 pages for 50 pending of
// 100,000 approvals; db.RoundRobin says why). Nor does it visit every
// workspace: it probed each one's approvals on every pass, the 1,950
// without any pending as the 50 with (sweeper scalability QA: 10,000
// buffers a pass for 5,000 idle workspaces); it walks those with an
// effect settled or grouped whose approval is pending
// (effects_moot_approval_idx).
func TestTheMootApprovalsPassReadsNotEveryApproval(t *testing.T) {
	t.Parallel()
	tx := mootScratch(t, setup(t), 2000, 10, "'succeeded'", "k = 1 AND w % 40 = 0")
	mootPlans(t, tx, func(mode string, read map[string]int, nodes []testpg.PlanNode) {
		// The 50 pending, read by their workspaces' probes and again by
		// id, and the 50 closed; of 20,000.
		require.Less(t, read["approvals"], 1000, "%s: %v", mode, read)
		// A descent or two for each of the 50 workspaces with one
		// pending, none for the 1,950 idle ones.
		probes := 0
		for _, n := range nodes {
			if n.Fields["Relation Name"] == "approvals" && n.Fields["Node Type"] != "ModifyTable" {
				loops, _ := n.Fields["Actual Loops"].(float64)
				probes += int(loops)
			}
		}
		require.Less(t, probes, 500, "%s: approvals probed once per workspace", mode)
		require.Zero(t, read["workspaces"], "%s: the workspaces read", mode)
	})
}

// Nor does it read the approvals pending that are not moot, awaiting an
// operator's decision, however many: it read every pending approval of
// each workspace with one, with its effect, to find the moot among them,
// on every pass (scale QA: 20,000 pending in 100 workspaces, 100,000
// buffers and 0.76 s a pass with none moot); it reads the effects settled
// or grouped whose approval is pending (effects_moot_approval_idx).
func TestTheMootApprovalsPassReadsNotThePendingOnes(t *testing.T) {
	t.Parallel()
	// 20 workspaces of 500 effects awaiting approval each; the first of
	// each of 10 settled succeeded, its approval left pending (moot).
	tx := mootScratch(t, setup(t), 20, 500,
		"CASE WHEN k = 1 AND w % 2 = 0 THEN 'succeeded' ELSE 'awaiting_approval' END", "true")
	mootPlans(t, tx, func(mode string, read map[string]int, _ []testpg.PlanNode) {
		// The 10 moot, each read a few times; of 10,000 pending.
		require.Less(t, read["approvals"], 100, "%s: %v", mode, read)
		require.Less(t, read["effects"], 100, "%s: %v", mode, read)
	})
	var closed int
	require.NoError(t, tx.QueryRow(context.Background(), gate.SQLSweepMootApprovals, mootArgs()...).Scan(&closed))
	require.Equal(t, 10, closed, "the moot ones closed")
}

// mootScratch is a scratch copy (testpg.Scratch) of the tables the moot
// approvals pass reads, seeded with workspaces ws_m1… of perWorkspace
// effects each whose approval was asked: state, an SQL expression of w
// (the workspace's number) and k (the effect's), is the effect's state,
// and pending, another, whether its approval is pending (else approved).
func mootScratch(t *testing.T, b *bundle, workspaces, perWorkspace int, state, pending string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, b.env.App.Pool, "workspaces", "effects", "approvals", "events")
	approval := `CASE WHEN ` + pending + ` THEN 'pending' ELSE 'approved' END`
	ws, each := strconv.Itoa(workspaces), strconv.Itoa(perWorkspace)
	_, err := tx.Exec(ctx, `
		INSERT INTO workspaces (id, name) SELECT 'ws_m' || w, 'w' FROM generate_series(1, `+ws+`) w;
		INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, lease_seconds,
				created_by_key_id, created_at, updated_at, approval_id, approval_state)
			SELECT 'eff_m' || w || '_' || k, 'ws_m' || w, 'email.send', 'k' || k, 'f', `+state+`, 30, 'key_m',
				now(), now(), 'apr_m' || w || '_' || k, `+approval+`
			FROM generate_series(1, `+ws+`) w, generate_series(1, `+each+`) k;
		INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
			SELECT 'apr_m' || w || '_' || k, 'ws_m' || w, 'eff_m' || w || '_' || k, 'email.send', `+approval+`,
				'policy', now()
			FROM generate_series(1, `+ws+`) w, generate_series(1, `+each+`) k;
		ANALYZE workspaces; ANALYZE effects; ANALYZE approvals`)
	require.NoError(t, err)
	return tx
}

// mootPlans runs the moot approvals pass on tx in each plan cache mode
// (testpg.RowsRead), handing check the rows it read and its plan.
func mootPlans(t *testing.T, tx pgx.Tx, check func(mode string, read map[string]int, nodes []testpg.PlanNode)) {
	t.Helper()
	for _, mode := range testpg.PlanCacheModes {
		read, nodes, err := testpg.RowsRead(context.Background(), tx, mode, gate.SQLSweepMootApprovals, mootArgs()...)
		require.NoError(t, err, mode)
		check(mode, read, nodes)
	}
}

// mootArgs are the moot approvals pass's arguments: now, a batch of 500.
func mootArgs() []any {
	events := make([]string, 500)
	for i := range events {
		events[i] = fmt.Sprintf("evt_moot%06d", i)
	}
	return []any{time.Now(), 500, gate.MootNote, events, gate.RolledBackNote}
}

// A rejection ends the effect whichever comes first, it or a resolution to
// failed: the effect reads denied approval_rejected at once, its attempt
// failed, with the same events (gate QA: rejected first, the resolve left
// it failed until its key's next begin denied it). A reconciliation to
// failed settles it as a resolve does.
func TestARejectionDeniesTheEffectInEitherOrderWithAResolveToFailed(t *testing.T) {
	t.Parallel()
	resolve := func(b *bundle, id string, body map[string]any) {
		b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
	}
	reconcile := func(b *bundle, _ string, body map[string]any) {
		out := b.env.Must(http.StatusOK, "POST", "/api/v1/reconcile", b.ws.Key, map[string]any{
			"effect_type": "email.send", "from": b.clock.Now().Add(-time.Hour).Format(time.RFC3339Nano),
			"to":      b.clock.Now().Format(time.RFC3339Nano),
			"records": []map[string]any{{"idempotency_key": body["idempotency_key"], "status": "failed"}},
		}).JSON()
		require.Len(t, out["resolved"], 1, "%v", out)
	}
	reject := func(b *bundle, approval string) {
		b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+approval+"/reject", b.ws.Key, map[string]any{"note": "no"})
	}
	for _, c := range []struct {
		name        string
		rejectFirst bool
		settle      func(b *bundle, id string, body map[string]any)
	}{
		{"resolve then reject", false, resolve},
		{"reject then resolve", true, resolve},
		{"reconcile then reject", false, reconcile},
		{"reject then reconcile", true, reconcile},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id, approval, body := b.heldRetry()
			if c.rejectFirst {
				reject(b, approval)
				require.Equal(t, "indeterminate", b.get(id)["state"], "of unknown outcome, it stays so")
				c.settle(b, id, body)
			} else {
				c.settle(b, id, body)
				require.Equal(t, "failed", b.get(id)["state"])
				reject(b, approval)
			}
			if c.name == "reject then resolve" || c.name == "resolve then reject" {
				// A repeat of the resolve, its first answer lost, answers
				// the effect as it is, in either order.
				again := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
					map[string]any{"outcome": "failed"}).JSON()
				require.Equal(t, "denied", again["state"])
			}
			e := b.requireRejected(id, body)
			require.Equal(t, "failed", e["attempts"].([]any)[0].(map[string]any)["outcome"])
			require.Equal(t, map[string]int{"approval.requested": 1, "approval.decided": 1, "effect.indeterminate": 1},
				b.eventTypes())
		})
	}
}

// eventTypes counts the workspace's events by type.
func (b *bundle) eventTypes() map[string]int {
	b.t.Helper()
	rows, err := b.env.App.Pool.Query(context.Background(),
		`SELECT type, count(*)::int FROM events WHERE workspace_id = $1 GROUP BY type`, b.ws.ID)
	require.NoError(b.t, err)
	out := map[string]int{}
	for rows.Next() {
		var (
			typ string
			n   int
		)
		require.NoError(b.t, rows.Scan(&typ, &n))
		out[typ] = n
	}
	require.NoError(b.t, rows.Err())
	return out
}

// A late report failed of the lapsed attempt, after a rejection or racing
// it, changes nothing (409 lease_expired): the attempt's outcome stays
// unknown, the effect indeterminate with its approval rejected, and a
// resolve to failed then denies it approval_rejected as in either order
// above. The race holds the effect's row while both wait for it; either
// may take it first.
func TestALateReportFailedAndARejectionEndAsARejection(t *testing.T) {
	t.Parallel()
	for _, race := range []bool{false, true} {
		t.Run(fmt.Sprintf("race=%v", race), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry", "lease_seconds": 5})
			body := email(key("held"))
			first := b.mustBegin("execute", body)
			id, token := str(first["effect_id"]), str(first["lease_token"])
			b.clock.Add(time.Minute) // the lease lapses unreported
			b.putPolicy("email.send", map[string]any{"mode": "require_approval"})
			approval := str(b.mustBegin("approval_required", body)["approval_id"])
			report := map[string]any{"lease_token": token, "outcome": "failed"}
			var reportStatus, rejectStatus int
			var reported map[string]any
			if race {
				holder := b.holding(`SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, id)
				waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, holder))
				reportDone, rejectDone := make(chan struct{}), make(chan struct{})
				go func() {
					defer close(reportDone)
					reportStatus, reported, _ = post(b.env, "/api/v1/effects/"+id+"/report", b.ws.Key, report)
				}()
				waits.Waiting(reportDone, "the report waits for the effect's row")
				go func() {
					defer close(rejectDone)
					rejectStatus, _, _ = post(b.env, "/api/v1/approvals/"+approval+"/reject", b.ws.Key, nil)
				}()
				waits.Waiting(rejectDone, "the rejection waits for the effect's row")
				require.NoError(t, holder.Rollback(context.Background()))
				<-reportDone
				<-rejectDone
			} else {
				rejectStatus, _, _ = post(b.env, "/api/v1/approvals/"+approval+"/reject", b.ws.Key, nil)
				reportStatus, reported, _ = post(b.env, "/api/v1/effects/"+id+"/report", b.ws.Key, report)
			}
			require.Equal(t, []int{http.StatusConflict, http.StatusOK}, []int{reportStatus, rejectStatus})
			require.Equal(t, "lease_expired", reported["error"].(map[string]any)["code"], "%v", reported)
			e := b.get(id)
			require.Equal(t, "indeterminate", e["state"])
			require.Equal(t, "indeterminate", e["attempts"].([]any)[0].(map[string]any)["outcome"], "still unknown")
			b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
			b.requireRejected(id, body)
		})
	}
}

// An approval a group's rollback closed is no operator's rejection: the
// step whose retry it asked for, resolved failed afterwards, reads failed,
// as one resolved failed before the rollback closed its approval does
// (the close leaves the effect its state); its group answers its key.
func TestAStepWhoseApprovalARollbackClosedIsResolvedFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry", "lease_seconds": 5})
	g := b.newGroup("order", "")
	body := groupStep(g, email(key("held")), nil)
	id := str(b.mustBegin("execute", body)["effect_id"])
	b.clock.Add(time.Minute) // the lease lapses unreported
	b.putPolicy("email.send", map[string]any{"mode": "require_approval"})
	approval := str(b.mustBegin("approval_required", body)["approval_id"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil)
	a := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+approval, b.ws.Key, nil).JSON()
	require.Equal(t, "rejected", a["state"], "%v", a)
	require.Equal(t, gate.RolledBackNote, a["note"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
	e := b.get(id)
	require.Equal(t, "failed", e["state"])
	require.Nil(t, e["denial_code"])
}

// requireRejected requires effect id denied approval_rejected, and its
// key's next begin denied so; it answers the effect as read before that
// begin.
func (b *bundle) requireRejected(id string, body map[string]any) map[string]any {
	b.t.Helper()
	e := b.get(id)
	require.Equal(b.t, "denied", e["state"])
	require.Equal(b.t, "approval_rejected", e["denial_code"])
	b.denialOf("approval_rejected", body)
	return e
}

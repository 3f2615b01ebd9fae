package gate_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/testpg"
)

func TestListEffectsPagesFiltersAndRedacts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var all []string
	for i := 0; i < 5; i++ {
		d := b.mustBegin("execute", email(key("list")))
		all = append(all, str(d["effect_id"]))
		if i < 2 {
			r := b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded",
				map[string]any{"message_id": "secret-message-id", "n": 3})
			require.Equal(t, http.StatusOK, r.Status)
		}
		b.clock.Add(time.Millisecond)
	}
	other := b.mustBegin("execute", map[string]any{"effect_type": "sms.send", "idempotency_key": key("sms")})
	all = append(all, str(other["effect_id"]))

	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		path := "/api/v1/effects?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		page := b.env.Must(http.StatusOK, "GET", path, b.ws.Key, nil).JSON()
		for _, x := range page["data"].([]any) {
			e := x.(map[string]any)
			seen = append(seen, str(e["id"]))
			require.Nil(t, e["result"], "listings never carry results")
			require.NotContains(t, str(e), "secret-message-id")
			require.NotContains(t, str(e), "user_123")
		}
		if page["next_cursor"] == nil {
			break
		}
		cursor = str(page["next_cursor"])
	}
	require.ElementsMatch(t, all, seen)
	require.Len(t, seen, len(all))

	sms := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?effect_type=sms.send", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, sms, 1)
	ok := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=succeeded&effect_type=email.send", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, ok, 2)
	e := ok[0].(map[string]any)
	require.Equal(t, map[string]any{"message_id": "<string>", "n": "<number>"}, e["result_preview"])
	require.Equal(t, map[string]any{"to": "<string>", "template": "<string>"}, e["payload_preview"])
	require.Len(t, b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=leased", b.ws.Key, nil).JSON()["data"], 4)

	require.Contains(t, validationFields(t, b.env.Do("GET", "/api/v1/effects?state=done", b.ws.Key, nil)), "state")
	require.Contains(t, validationFields(t, b.env.Do("GET", "/api/v1/effects?limit=0", b.ws.Key, nil)), "limit")
	require.Contains(t, validationFields(t, b.env.Do("GET", "/api/v1/effects?limit=201", b.ws.Key, nil)), "limit")
}

func TestPayloadsAndResultsAreSealedAtRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := email(key("sealed"))
	body["payload"] = map[string]any{"to": "alice@example.com"}
	body["dimensions"] = map[string]any{"recipient": "alice@example.com"}
	groupStep(b.newGroup("g", ""), body,
		map[string]any{"effect_type": "email.retract", "payload": map[string]any{"to": "alice@example.com"}})
	d := b.mustBegin("execute", body)
	id := str(d["effect_id"])
	r := b.report(id, str(d["lease_token"]), "succeeded", map[string]any{"receipt": "rcpt-very-private"})
	require.Equal(t, http.StatusOK, r.Status)

	var payload, result, compensation []byte
	var dims, token string
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(),
		`SELECT payload, result, compensation, dimensions::text, encode(lease_token_hash, 'hex') FROM effects WHERE id = $1`, id).
		Scan(&payload, &result, &compensation, &dims, &token))
	for _, ct := range [][]byte{payload, result, compensation} {
		require.NotEmpty(t, ct)
		require.False(t, bytes.Contains(ct, []byte("alice")))
		require.False(t, bytes.Contains(ct, []byte("rcpt-very-private")))
	}
	require.NotContains(t, dims, "alice")
	require.Contains(t, dims, `"recipient"`)
	require.NotContains(t, token, str(d["lease_token"]))
	// The single read opens the result.
	require.Equal(t, map[string]any{"receipt": "rcpt-very-private"}, b.get(id)["result"])
	// A ciphertext moved to another effect does not open there: that
	// effect reads its result as unreadable, never the other's.
	d2 := b.mustBegin("execute", email(key("other")))
	require.Equal(t, http.StatusOK, b.report(str(d2["effect_id"]), str(d2["lease_token"]), "succeeded", nil).Status)
	_, err := b.env.App.Pool.Exec(context.Background(), `UPDATE effects SET result = $1 WHERE id = $2`, result, d2["effect_id"])
	require.NoError(t, err)
	moved := b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(d2["effect_id"]), b.ws.Key, nil)
	require.NotContains(t, string(moved.Body), "rcpt-very-private")
	require.Nil(t, moved.JSON()["result"])
	require.Equal(t, true, moved.JSON()["result_unreadable"])
}

func TestAttemptHistoryRecordsWhoAndWhen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent1, agent2 := b.agent(), b.agent()
	body := email(key("history"))
	t0 := b.clock.Now()
	r := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", agent1, body)
	d := r.JSON()
	id := str(d["effect_id"])
	b.clock.Add(5 * time.Second)
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/report", agent2,
		map[string]any{"lease_token": d["lease_token"], "outcome": "failed"})
	b.clock.Add(5 * time.Second)
	d2 := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", agent2, body).JSON()
	require.EqualValues(t, 2, d2["attempt"])

	e := b.get(id)
	require.Equal(t, t0.Format(time.RFC3339), e["created_at"])
	require.EqualValues(t, 2, e["attempt"])
	require.Equal(t, "leased", e["state"])
	require.Equal(t, t0.Add(70*time.Second).Format(time.RFC3339), e["lease_expires_at"])
	attempts := e["attempts"].([]any)
	require.Equal(t, map[string]any{
		"attempt": 1.0, "outcome": "failed", "probe": false, "started_at": t0.Format(time.RFC3339),
		"lease_expires_at": t0.Add(60 * time.Second).Format(time.RFC3339),
		"reported_at":      t0.Add(5 * time.Second).Format(time.RFC3339),
		"began_by_key_id":  keyID(agent1), "reported_by_key_id": keyID(agent2),
		"resolved_by_key_id": nil, "resolved_at": nil, "resolve_note": nil,
	}, attempts[0])
	a2 := attempts[1].(map[string]any)
	require.Nil(t, a2["outcome"])
	require.Equal(t, keyID(agent2), a2["began_by_key_id"])
	require.Equal(t, t0.Add(10*time.Second).Format(time.RFC3339), a2["started_at"])
}

// A repeated begin under a run that retention has since deleted
// (JOB_RETENTION_DAYS) answers its kept effect, not 404 run; a new key
// under that run is 404. Not parallel: the purge is not per workspace.
func TestBeginAnswersAKeptEffectOfAPurgedRun(t *testing.T) {
	b := setup(t)
	runID := str(b.env.Must(http.StatusCreated, "POST", "/api/v1/runs", b.ws.Key, map[string]any{"name": "r"}).JSON()["id"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", b.ws.Key, nil)
	body := email(key("inrun"))
	body["run_id"] = runID
	d := b.mustBegin("execute", body)
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded",
		map[string]any{"id": "msg_1"}).Status)

	b.clock.Add(91 * 24 * time.Hour)
	_, err := b.env.App.Server.Jobs.PurgeRetired(context.Background(), b.clock.Now().AddDate(0, 0, -90), 100)
	require.NoError(t, err)
	errCode(t, b.env.Do("GET", "/api/v1/runs/"+runID, b.ws.Key, nil), http.StatusNotFound, "not_found")

	dup := b.mustBegin("duplicate", body)
	require.Equal(t, map[string]any{"id": "msg_1"}, dup["result"])
	other := email(key("new"))
	other["run_id"] = runID
	errCode(t, b.begin(other), http.StatusNotFound, "not_found")
}

// listedEffect is what TestListEffectsFiltersPageLikeTheModel stored of an
// effect: its id, type, and the state it reads as.
type listedEffect struct{ id, typ, reads string }

// seedListedEffects stores n effects of workspace ws (key key) directly,
// created a millisecond apart from start, in every stored state and three
// types, among them leased ones whose lease lapsed by now (they read
// indeterminate), and answers them in creation order.
func seedListedEffects(t *testing.T, pool *pgxpool.Pool, ws, key string, n int, start, now time.Time) []listedEffect {
	t.Helper()
	types := []string{"email.send", "sms.send", "wire.transfer"}
	stored := []string{"succeeded", "failed", "denied", "indeterminate", "awaiting_approval", "leased", "leased"}
	out := make([]listedEffect, n)
	for i := range out {
		created := start.Add(time.Duration(i) * time.Millisecond)
		e := listedEffect{id: ids.NewAt(ids.Effect, created), typ: types[(i*7/3)%len(types)], reads: stored[(i*5)%len(stored)]}
		var lease *time.Time
		if e.reads == "leased" {
			l := now.Add(time.Minute) // live
			if i%2 == 0 {
				l, e.reads = now.Add(-time.Second), "indeterminate" // lapsed
			}
			lease = &l
		}
		_, err := pool.Exec(context.Background(), `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key,
			fingerprint, state, lease_seconds, lease_expires_at, created_by_key_id, created_at, updated_at)
			VALUES ($1, $2, $3, $1, 'f', $4, 60, $5, $6, $7, $7)`,
			e.id, ws, e.typ, stored[(i*5)%len(stored)], lease, key, created)
		require.NoError(t, err)
		out[i] = e
	}
	return out
}

// Every filter of the effects list (each state, each type, both, none)
// pages the effects it names newest first, each once, through cursors
// at any page size: the page is gathered from one index range per stored
// state (an indeterminate page reads the lapsed leases too), and the
// order, the cursors and the filters must come out as one walk would.
func TestListEffectsFiltersPageLikeTheModel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := b.clock.Now()
	seeded := seedListedEffects(t, b.env.App.Pool, b.ws.ID, keyID(b.ws.Key), 60, now.Add(-time.Hour), now)
	for _, state := range append([]string{""}, gate.States...) {
		for _, typ := range []string{"", "email.send", "wire.transfer", "none.such"} {
			var want []string
			for i := len(seeded) - 1; i >= 0; i-- {
				e := seeded[i]
				if (state == "" || e.reads == state) && (typ == "" || e.typ == typ) {
					want = append(want, e.id)
				}
			}
			for _, limit := range []int{1, 4, 200} {
				var got []string
				cursor := ""
				for pages := 0; ; pages++ {
					require.LessOrEqual(t, pages, len(seeded), "state %q type %q limit %d", state, typ, limit)
					// A filter left blank is left out: given empty, it is
					// refused (lib/httpapi knownQuery).
					q := url.Values{"limit": {fmt.Sprint(limit)}, "cursor": {cursor}}
					for name, v := range map[string]string{"state": state, "effect_type": typ} {
						if v != "" {
							q.Set(name, v)
						}
					}
					page := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?"+q.Encode(), b.ws.Key, nil).JSON()
					data := page["data"].([]any)
					require.LessOrEqual(t, len(data), limit)
					for _, x := range data {
						e := x.(map[string]any)
						got = append(got, str(e["id"]))
						if state != "" {
							require.Equal(t, state, e["state"])
						}
					}
					if page["next_cursor"] == nil {
						break
					}
					cursor = str(page["next_cursor"])
				}
				require.Equal(t, want, got, "state %q type %q limit %d", state, typ, limit)
			}
		}
	}
}

// A filtered page reads each state's newest ids from one range of an
// index (effects_state_idx, or effects_type_state_idx with a type,
// migration 0057), the ids alone, and then only the rows of the page: as
// one condition over the states, or with a type, the planner walked the
// workspace's effects newest first testing each (scale QA, 1.1M effects:
// a type retired two weeks ago, or the indeterminate effects of an
// incident two weeks back, 0.5-1.1 s and 147k buffers a page; under 1.5
// ms and 470 buffers in ranges). On a seeded workspace, the plan reads
// effects only so, whatever the filter.
func TestListEffectsReadsOneRangePerState(t *testing.T) {
	// Not parallel: the plan follows the whole table's statistics, which
	// the parallel tests' inserts sway between the ANALYZE and the
	// EXPLAIN (it failed so under load, twice in one session); the
	// package's parallel tests wait until the sequential ones are done.
	b := setup(t)
	ctx := context.Background()
	pool := b.env.App.Pool
	now := b.clock.Now()
	// Leases are few: those running now, and lapsed ones until the
	// sweeper stores them indeterminate. The states and the type filtered
	// are rare (2% of the effects or fewer), as an incident's are among a
	// busy workspace's: a common one is found as fast walking the newest
	// effects, and the planner may rightly choose that (a CI run's fresh
	// cluster did, for 20% failed).
	_, err := pool.Exec(ctx, `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state,
			lease_seconds, lease_expires_at, created_by_key_id, created_at, updated_at)
		SELECT 'eff_plan' || lpad(g::text, 23, '0'), $1,
			CASE WHEN g % 47 = 0 THEN 'refund.issue' ELSE (ARRAY['email.send', 'sms.send'])[1 + g % 2] END,
			'plan:' || g, 'f', CASE WHEN g % 3000 = 0 THEN 'leased' WHEN g % 53 = 1 THEN 'failed'
				WHEN g % 59 = 2 OR g % 47 = 0 AND g % 3 = 0 THEN 'indeterminate' ELSE 'succeeded' END,
			60, $3::timestamptz - interval '1 second', $2, $3::timestamptz - interval '1 day', $3::timestamptz - interval '1 day'
		FROM generate_series(1, 30000) g`, b.ws.ID, keyID(b.ws.Key), now)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM (ANALYZE) effects`)
	require.NoError(t, err)
	for _, f := range []struct{ state, typ string }{
		{"failed", ""}, {"indeterminate", ""}, {"", "refund.issue"}, {"succeeded", "refund.issue"},
		{"indeterminate", "refund.issue"},
	} {
		for _, cursor := range []string{"", "eff_plan" + strings.Repeat("0", 18) + "15000"} {
			sql, args := gate.ListEffectsSQL(b.ws.ID, cursor, 51, f.state, f.typ, now)
			nodes, err := testpg.Explain(ctx, pool, sql, args...)
			require.NoError(t, err)
			for _, n := range nodes {
				if n.Fields["Relation Name"] != "effects" {
					continue
				}
				typ, index := n.Fields["Node Type"], fmt.Sprint(n.Fields["Index Name"])
				cond := fmt.Sprint(n.Fields["Index Cond"])
				switch {
				case typ == "Index Only Scan" && (index == "effects_state_idx" || index == "effects_type_state_idx"):
				case typ == "Index Scan" && index == "effects_pkey" && strings.HasPrefix(cond, "(id = "): // a row of the page
				case f.state == "indeterminate" && strings.Contains(cond+fmt.Sprint(n.Fields["Filter"]), "lease_expires_at") &&
					(index == "effects_state_idx" || index == "effects_type_state_idx" || index == "effects_leased_idx"):
					// the lapsed leases an indeterminate page reads (few)
				default:
					t.Fatalf("state %q type %q cursor %q: effects read by %s %s (%s, filter %v)", f.state, f.typ, cursor,
						typ, index, cond, n.Fields["Filter"])
				}
			}
		}
	}
}

// A result damaged under a key this instance has (its header intact, so it
// names a configured key, but it fails authentication) reads
// result_unreadable: true in the lists, unfiltered and filtered, as on the
// effect's own read, and the readable results beside it read false (seal
// QA: lists looked only at the key the header names, so the list said
// false where the single read said true).
func TestADamagedResultReadsUnreadableInListsAsOnItsRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := map[string]string{}
	for _, k := range []string{"damaged", "kept"} {
		d := b.mustBegin("execute", email(key(k)))
		ids[k] = str(d["effect_id"])
		require.Equal(t, http.StatusOK, b.report(ids[k], str(d["lease_token"]), "succeeded",
			map[string]any{"message_id": k}).Status)
	}
	var sealed []byte
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT result FROM effects WHERE id = $1`, ids["damaged"]).
		Scan(&sealed))
	sealed[len(sealed)-1] ^= 1 // the tag's last byte
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE effects SET result = $2 WHERE id = $1`, ids["damaged"], sealed)
	require.NoError(t, err)

	want := map[string]any{ids["damaged"]: true, ids["kept"]: false}
	single := map[string]any{}
	for _, id := range ids {
		e := b.get(id)
		single[id] = e["result_unreadable"]
		require.Equal(t, "succeeded", e["state"], "the rest of the effect reads")
	}
	require.Equal(t, want, single)
	require.Nil(t, b.get(ids["damaged"])["result"])
	for _, path := range []string{"/api/v1/effects", "/api/v1/effects?state=succeeded",
		"/api/v1/effects?effect_type=email.send"} {
		listed := map[string]any{}
		for _, x := range b.env.Must(http.StatusOK, "GET", path, b.ws.Key, nil).JSON()["data"].([]any) {
			e := x.(map[string]any)
			listed[str(e["id"])] = e["result_unreadable"]
			require.Nil(t, e["result"], "listings never carry results")
		}
		require.Equal(t, want, listed, path)
	}
}

package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// rpcCall is one tools/call message of tool with args under id.
func rpcCall(id int, tool string, args map[string]any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args}}
}

// toolAnswers posts msg (one message, or a batch) to env's MCP endpoint
// under key and answers each tool result's structured content by its
// message's id, with whether it is an error result. Safe to call from any
// goroutine: it reports what is wrong as an error, never through t.
func toolAnswers(ctx context.Context, env *apitest.Env, key string, msg any, header ...string) (map[int]toolAnswer, error) {
	body, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	raw, err := post(ctx, env, key, string(body), header...)
	if err != nil {
		return nil, err
	}
	var answers []struct {
		ID     int `json:"id"`
		Result *struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	if raw[0] != '[' {
		raw = append(append([]byte("["), raw...), ']')
	}
	if err := json.Unmarshal(raw, &answers); err != nil {
		return nil, fmt.Errorf("%w: %s", err, raw)
	}
	out := map[int]toolAnswer{}
	for _, a := range answers {
		if a.Result == nil {
			return nil, fmt.Errorf("no tool result: %s", raw)
		}
		out[a.ID] = toolAnswer{a.Result.StructuredContent, a.Result.IsError}
	}
	return out, nil
}

// post is postMCP for any goroutine, with more headers (name, value, ...):
// it answers the body of a 200, and anything else as an error.
func post(ctx context.Context, env *apitest.Env, key, body string, header ...string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", env.Server.URL+"/api/v1/mcp", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := env.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", res.StatusCode, raw)
	}
	return raw, nil
}

type toolAnswer struct {
	content map[string]any
	isError bool
}

// spent is what the gate's daily counters of workspace hold, by scope (the
// days summed: a test may run across midnight, UTC).
func spent(t *testing.T, env *apitest.Env, workspace string) map[string][2]int64 {
	t.Helper()
	rows, err := env.App.Pool.Query(context.Background(), `SELECT scope, sum(micros)::bigint, sum(count)::bigint
		FROM gate_spend WHERE workspace_id = $1 GROUP BY scope`, workspace)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][2]int64{}
	for rows.Next() {
		var scope string
		var micros, count int64
		require.NoError(t, rows.Scan(&scope, &micros, &count))
		out[scope] = [2]int64{micros, count}
	}
	require.NoError(t, rows.Err())
	return out
}

// attempts counts the attempts of every effect of workspace.
func attempts(t *testing.T, env *apitest.Env, workspace string) int {
	t.Helper()
	var n int
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM effect_attempts a
		JOIN effects e ON e.id = a.effect_id WHERE e.workspace_id = $1`, workspace).Scan(&n))
	return n
}

// budgeted is a workspace whose policy of effectType is policy, with an
// AGENT key, made through env.
func budgeted(env *apitest.Env, effectType string, policy map[string]any) (apitest.Workspace, string) {
	ws := env.Signup()
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/"+effectType, ws.Key, policy)
	return ws, env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
}

// Racers released together on two instances, each sending ratchet_begin of
// one effect type and idempotency key through the MCP endpoint (a third
// alone without a request_id, a third alone with its own, a third as a
// batch of two with their own), in two workspaces at once under the same
// key: in each workspace exactly one call is answered execute and every
// other in_flight on the same effect, one attempt is made, and the type's
// budget, the key's ceiling and the dimension's limit are charged once.
// Reported succeeded by racers on both instances, the effect answers every
// later racer duplicate with its result, and nothing is charged again.
func TestRacingBeginsThroughMCPGrantOneLease(t *testing.T) {
	t.Parallel()
	instances := []*apitest.Env{apitest.Start(t), apitest.Start(t)}
	type tenant struct {
		ws    apitest.Workspace
		agent string
	}
	var tenants []tenant
	for range 2 {
		ws := instances[0].Signup()
		instances[0].Must(http.StatusOK, "PUT", "/api/v1/policies/hammer.send", ws.Key, map[string]any{
			"daily_budget_micros": 1000, "dimension_limits": map[string]any{"to": map[string]any{"daily_micros": 1000, "daily_count": 5}}})
		agent := instances[0].Key(ws, map[string]any{"name": "agent", "preset": "AGENT", "daily_spend_ceiling_micros": 1000})
		tenants = append(tenants, tenant{ws, agent})
	}
	args := func(requestID string) map[string]any {
		a := map[string]any{"effect_type": "hammer.send", "idempotency_key": "order:1", "cost_micros": 100,
			"payload": map[string]any{"n": 1}, "dimensions": map[string]any{"to": "a@b.c"}}
		if requestID != "" {
			a["request_id"] = requestID
		}
		return a
	}
	const racers = 24 // per workspace
	type answered struct {
		tenant  int
		answers map[int]toolAnswer
		err     error
	}
	race := func(message func(i, tenant int) any) []answered {
		out := make([]answered, 2*racers)
		apitest.StartTogether(2*racers, func(i int) {
			ten := i % 2
			a, err := toolAnswers(context.Background(), instances[(i/2)%2], tenants[ten].agent, message(i/2, ten))
			out[i] = answered{ten, a, err}
		})
		return out
	}
	begins := race(func(i, _ int) any {
		switch i % 3 {
		case 0:
			return rpcCall(1, "ratchet_begin", args(""))
		case 1:
			return rpcCall(1, "ratchet_begin", args(fmt.Sprintf("hammer-request-%04d-a", i)))
		}
		return []any{rpcCall(1, "ratchet_begin", args(fmt.Sprintf("hammer-request-%04d-b", i))),
			rpcCall(2, "ratchet_begin", args(fmt.Sprintf("hammer-request-%04d-c", i)))}
	})
	grants := make([]map[string]any, 2)
	effectIDs := make([]map[any]int, 2)
	for ten := range 2 {
		effectIDs[ten] = map[any]int{}
	}
	for _, b := range begins {
		require.NoError(t, b.err)
		for _, a := range b.answers {
			require.False(t, a.isError, "%v", a.content)
			effectIDs[b.tenant][a.content["effect_id"]]++
			switch a.content["decision"] {
			case "execute":
				require.Nil(t, grants[b.tenant], "a second execute: %v and %v", grants[b.tenant], a.content)
				grants[b.tenant] = a.content
			case "in_flight":
			default:
				t.Fatalf("decision %v", a.content)
			}
		}
	}
	for ten, tn := range tenants {
		require.NotNil(t, grants[ten], "no racer was granted the lease")
		require.Len(t, effectIDs[ten], 1, "every racer answered on one effect")
		require.Equal(t, 1, attempts(t, instances[0], tn.ws.ID), "one attempt")
		charged := spent(t, instances[0], tn.ws.ID)
		require.Len(t, charged, 3, "the type's budget, the key's ceiling and the dimension's limit: %v", charged)
		for scope, c := range charged {
			require.Equal(t, [2]int64{100, 1}, c, "%s charged once", scope)
		}
	}

	reports := race(func(_, ten int) any {
		return rpcCall(1, "ratchet_report", map[string]any{"effect_id": grants[ten]["effect_id"],
			"lease_token": grants[ten]["lease_token"], "outcome": "succeeded", "result": map[string]any{"sent": "m-1"}})
	})
	for _, r := range reports {
		require.NoError(t, r.err)
		require.False(t, r.answers[1].isError, "a report repeated answers its first outcome: %v", r.answers[1].content)
	}
	duplicates := race(func(_, _ int) any { return rpcCall(1, "ratchet_begin", args("")) })
	for _, d := range duplicates {
		require.NoError(t, d.err)
		require.Equal(t, "duplicate", d.answers[1].content["decision"], "%v", d.answers[1].content)
		require.Equal(t, map[string]any{"sent": "m-1"}, d.answers[1].content["result"])
	}
	for _, tn := range tenants {
		require.Equal(t, 1, attempts(t, instances[0], tn.ws.ID), "one attempt")
		for scope, c := range spent(t, instances[0], tn.ws.ID) {
			require.Equal(t, [2]int64{100, 1}, c, "%s charged once", scope)
		}
	}
}

// Racers on two instances sending one ratchet_begin under one request_id
// (the retries of one call whose answer was lost, as a client sends them)
// are each answered the same execute, lease token included: one attempt,
// charged once. The same request_id from another key of the workspace is
// in_flight (README: only that request can have the lease).
func TestRacingRetriesOfOneBeginThroughMCPShareItsLease(t *testing.T) {
	t.Parallel()
	instances := []*apitest.Env{apitest.Start(t), apitest.Start(t)}
	ws, agent := budgeted(instances[0], "hammer.retry", map[string]any{"daily_budget_micros": 500})
	agents := []string{agent, instances[0].Key(ws, map[string]any{"name": "b", "preset": "AGENT"})}
	args := map[string]any{"effect_type": "hammer.retry", "idempotency_key": "refund:9", "cost_micros": 200,
		"request_id": "8d0f6b1c-2b7e-4c55-9a31-5f0d8e2c7a10"}
	const racers = 20
	answers := make([]map[int]toolAnswer, racers)
	errs := make([]error, racers)
	apitest.StartTogether(racers, func(i int) {
		answers[i], errs[i] = toolAnswers(context.Background(), instances[i%2], agents[0], rpcCall(7, "ratchet_begin", args))
	})
	var lease any
	for i, a := range answers {
		require.NoError(t, errs[i])
		got := a[7].content
		require.Equal(t, "execute", got["decision"], "%v", got)
		if lease == nil {
			lease = got["lease_token"]
		}
		require.Equal(t, lease, got["lease_token"], "every retry answers the one lease")
	}
	other, err := toolAnswers(context.Background(), instances[1], agents[1], rpcCall(7, "ratchet_begin", args))
	require.NoError(t, err)
	require.Equal(t, "in_flight", other[7].content["decision"], "%v", other[7].content)
	require.Equal(t, 1, attempts(t, instances[0], ws.ID))
	require.Equal(t, map[string][2]int64{"type:hammer.retry": {200, 1}}, spent(t, instances[0], ws.ID))
}

// heldGroup is a workspace with a budgeted policy of effectType, an AGENT
// key and a group of that key whose row this test holds FOR UPDATE: a begin
// naming the group (which takes its row FOR SHARE) waits until release.
// waiting says whether a statement waits for the holder.
type heldGroup struct {
	ws           apitest.Workspace
	agent, group string
	release      func()
	waiting      func() bool
}

func holdGroup(t *testing.T, env *apitest.Env, effectType string) heldGroup {
	t.Helper()
	ws, agent := budgeted(env, effectType, map[string]any{"daily_budget_micros": 500})
	group := env.Must(http.StatusCreated, "POST", "/api/v1/groups", agent, map[string]any{"name": "g"}).JSON()["id"].(string)
	ctx := context.Background()
	tx, err := env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	release := func() { require.NoError(t, tx.Rollback(ctx)) }
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, group)
	require.NoError(t, err)
	holder := tx.Conn().PgConn().PID()
	waiting := func() bool {
		var n int
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1::int = ANY (pg_blocking_pids(pid))`, holder).Scan(&n))
		return n > 0
	}
	return heldGroup{ws, agent, group, release, waiting}
}

// A client that closes its connection while its ratchet_begin waits in the
// database stops the call where it is (README, MCP): the begin's statement
// is cancelled, nothing is granted, leased or charged, and the next begin
// of the key, with or without the request_id, is execute, not in_flight.
func TestABeginWhoseClientHangsUpLeavesNothingLeased(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	// Under every protocol version: the SDK ties a call to its request
	// under none of those before 2026-07-28, nor under that one unless told.
	for i, version := range []string{"", "2025-06-18", "2026-07-28"} {
		held := holdGroup(t, env, "hammer.hangup")
		ws, agent := held.ws, held.agent
		args := map[string]any{"effect_type": "hammer.hangup", "idempotency_key": "wire:1", "cost_micros": 100,
			"group_id": held.group, "request_id": fmt.Sprintf("0b5f7c4e-8a5d-4e4b-9c8f-3a6e2d1b9f7%d", i)}
		ctx := context.Background()
		msg, header := rpcCall(1, "ratchet_begin", args), []string{}
		if version != "" {
			header = []string{"MCP-Protocol-Version", version}
		}
		if version == "2026-07-28" {
			msg["params"].(map[string]any)["_meta"] = map[string]any{"io.modelcontextprotocol/protocolVersion": version,
				"io.modelcontextprotocol/clientCapabilities": map[string]any{},
				"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "t", "version": "1"}}
			header = append(header, "Mcp-Method", "tools/call", "Mcp-Name", "ratchet_begin")
		}

		callCtx, hangUp := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := toolAnswers(callCtx, env, agent, msg, header...)
			done <- err
		}()
		require.Eventually(t, held.waiting, 10*time.Second, 5*time.Millisecond, "%s: the begin never waited for the group", version)
		hangUp()
		require.ErrorIs(t, <-done, context.Canceled, version)
		require.Eventually(t, func() bool { return !held.waiting() }, 10*time.Second, 5*time.Millisecond,
			"%s: the begin went on waiting after its client hung up", version)
		held.release()

		require.Equal(t, 0, attempts(t, env, ws.ID), "%s: nothing was granted", version)
		require.Empty(t, spent(t, env, ws.ID), "%s: nothing was charged", version)
		delete(args, "request_id")
		again, err := toolAnswers(ctx, env, agent, rpcCall(2, "ratchet_begin", args))
		require.NoError(t, err)
		require.Equal(t, "execute", again[2].content["decision"], "%s: the key is free: %v", version, again[2].content)
		require.Equal(t, 1, attempts(t, env, ws.ID), version)
		require.Equal(t, map[string][2]int64{"type:hammer.hangup": {100, 1}}, spent(t, env, ws.ID), version)
	}
}

// A notifications/cancelled in a batch cancels the request of that batch it
// names (README, MCP): a ratchet_begin waiting in the database stops there,
// with nothing granted, leased or charged, so the key's next begin is
// execute; and the cancelled request is not answered, as MCP asks (it was
// answered as stopped, MCP QA): the batch's answer leaves it out, and a
// batch left with no answer is a 202 with no body.
func TestACancellationInABatchStopsItsBegin(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	held := holdGroup(t, env, "hammer.cancel")
	ws, agent := held.ws, held.agent
	args := map[string]any{"effect_type": "hammer.cancel", "idempotency_key": "wire:2", "cost_micros": 100,
		"group_id": held.group}
	ctx := context.Background()
	cancelOf := func(id int) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": id}}
	}

	// The begin waits for the group until the transaction ends; its route's
	// own time (15 s) would answer it otherwise than as cancelled.
	batch, err := json.Marshal([]any{rpcCall(1, "ratchet_begin", args),
		map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, cancelOf(1)})
	require.NoError(t, err)
	status, out := postMCP(t, env, agent, string(batch))
	require.Equal(t, http.StatusOK, status, "%s", out)
	answers := rpcAnswers(t, out)
	_, answered := answers["1"]
	require.False(t, answered, "the cancelled request was answered: %.400s", out)
	require.Contains(t, answers, "2", "%s", out)
	require.Contains(t, answers["2"], "result", "%s", out)

	batch, err = json.Marshal([]any{rpcCall(3, "ratchet_begin", args), cancelOf(3)})
	require.NoError(t, err)
	status, out = postMCP(t, env, agent, string(batch))
	require.Equal(t, http.StatusAccepted, status, "a batch whose only request was cancelled: %s", out)
	require.Empty(t, out)
	held.release()

	require.Equal(t, 0, attempts(t, env, ws.ID), "nothing was granted")
	require.Empty(t, spent(t, env, ws.ID), "nothing was charged")
	again, err := toolAnswers(ctx, env, agent, rpcCall(5, "ratchet_begin", args))
	require.NoError(t, err)
	require.Equal(t, "execute", again[5].content["decision"], "the key is free: %v", again[5].content)
}

// Racers on two instances, each a batch of two ratchet_begin calls of
// distinct keys under one type's daily budget that fits ten: exactly ten
// are granted, every other denied budget_exceeded (an error result carrying
// the decision), and the type's counter holds exactly the budget.
func TestRacingBeginsThroughMCPSpendExactlyTheBudget(t *testing.T) {
	t.Parallel()
	instances := []*apitest.Env{apitest.Start(t), apitest.Start(t)}
	ws, agent := budgeted(instances[0], "hammer.budget", map[string]any{"daily_budget_micros": 1000})
	const racers = 15
	answers := make([]map[int]toolAnswer, racers)
	errs := make([]error, racers)
	apitest.StartTogether(racers, func(i int) {
		begin := func(id int) map[string]any {
			return rpcCall(id, "ratchet_begin", map[string]any{"effect_type": "hammer.budget",
				"idempotency_key": fmt.Sprintf("charge:%d:%d", i, id), "cost_micros": 100})
		}
		answers[i], errs[i] = toolAnswers(context.Background(), instances[i%2], agent, []any{begin(1), begin(2)})
	})
	granted := 0
	for i, a := range answers {
		require.NoError(t, errs[i])
		for _, r := range a {
			if r.content["decision"] == "execute" {
				require.False(t, r.isError)
				granted++
				continue
			}
			require.True(t, r.isError, "%v", r.content)
			require.Equal(t, "denied", r.content["decision"], "%v", r.content)
			require.Equal(t, "budget_exceeded", r.content["error"].(map[string]any)["code"], "%v", r.content)
		}
	}
	require.Equal(t, 10, granted)
	require.Equal(t, 10, attempts(t, instances[0], ws.ID))
	require.Equal(t, map[string][2]int64{"type:hammer.budget": {1000, 10}}, spent(t, instances[0], ws.ID))
}

// Racers on two instances, each a batch of a tools/list, a ping and two
// ratchet_begin calls, under a key limited to five calls a minute: exactly
// five begins are admitted and the others refused rate_limited, each tool
// call counted once as its REST call, the protocol's own messages not at
// all (README, MCP): they are answered still.
func TestRacingToolCallsThroughMCPKeepTheRateLimit(t *testing.T) {
	t.Parallel()
	clock := apitest.NewClock(time.Now().Truncate(time.Minute)) // one rate window throughout
	instances := []*apitest.Env{apitest.Start(t, apitest.WithNow(clock.Now)), apitest.Start(t, apitest.WithNow(clock.Now))}
	ws := instances[0].Signup()
	agent := instances[0].Key(ws, map[string]any{"name": "agent", "preset": "AGENT", "rate_limit_per_minute": 5})
	const racers = 6
	outs := make([][]byte, racers)
	errs := make([]error, racers)
	apitest.StartTogether(racers, func(i int) {
		begin := func(id int) string {
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ratchet_begin",`+
				`"arguments":{"effect_type":"hammer.limit","idempotency_key":"k:%d:%d"}}}`, id, i, id)
		}
		outs[i], errs[i] = post(context.Background(), instances[i%2], agent, `[{"jsonrpc":"2.0","id":1,"method":"tools/list"},`+
			`{"jsonrpc":"2.0","id":2,"method":"ping"},`+begin(3)+`,`+begin(4)+`]`)
	})
	admitted := 0
	for i, out := range outs {
		require.NoError(t, errs[i])
		answers := rpcAnswers(t, out)
		require.Len(t, answers, 4, "%s", out)
		require.Len(t, answers["1"]["result"].(map[string]any)["tools"], 9, "tools/list is not counted")
		require.Equal(t, map[string]any{}, answers["2"]["result"], "ping is not counted")
		for _, id := range []string{"3", "4"} {
			result := answers[id]["result"].(map[string]any)
			structured := result["structuredContent"].(map[string]any)
			if structured["decision"] == "execute" {
				admitted++
				continue
			}
			require.Equal(t, "rate_limited", structured["error"].(map[string]any)["code"], "%v", structured)
		}
	}
	require.Equal(t, 5, admitted)
	require.Equal(t, 5, attempts(t, instances[0], ws.ID))
}

// Racers on two instances resolving one indeterminate effect through MCP,
// half succeeded and half failed, under one key: the first outcome recorded
// stands, every racer that sent it is answered the effect as settled, every
// other 409 invalid_state naming it, and the attempt's charge is kept or
// given back once (README: a resolve repeated with the same outcome is safe
// to retry).
func TestRacingResolvesThroughMCPSettleOnce(t *testing.T) {
	t.Parallel()
	instances := []*apitest.Env{apitest.Start(t), apitest.Start(t)}
	ws, agent := budgeted(instances[0], "hammer.resolve", map[string]any{"daily_budget_micros": 500})
	begun, err := toolAnswers(context.Background(), instances[0], agent, rpcCall(1, "ratchet_begin", map[string]any{
		"effect_type": "hammer.resolve", "idempotency_key": "vendor:1", "cost_micros": 100, "lease_seconds": 1}))
	require.NoError(t, err)
	effect := begun[1].content["effect_id"].(string)
	require.Eventually(t, func() bool {
		e := instances[0].Must(http.StatusOK, "GET", "/api/v1/effects/"+effect, ws.Key, nil).JSON()
		return e["state"] == "indeterminate"
	}, 30*time.Second, 50*time.Millisecond, "the lease never lapsed")

	const racers = 20
	outcome := func(i int) string { return []string{"succeeded", "failed"}[i%2] }
	answers := make([]map[int]toolAnswer, racers)
	errs := make([]error, racers)
	apitest.StartTogether(racers, func(i int) {
		answers[i], errs[i] = toolAnswers(context.Background(), instances[(i/2)%2], ws.Key, rpcCall(1, "ratchet_resolve",
			map[string]any{"effect_id": effect, "outcome": outcome(i), "note": "checked"}))
	})
	won := ""
	for i, a := range answers {
		require.NoError(t, errs[i])
		if !a[1].isError {
			require.Equal(t, outcome(i), a[1].content["state"], "%v", a[1].content)
			require.True(t, won == "" || won == outcome(i), "both outcomes answered as settled")
			won = outcome(i)
		}
	}
	require.NotEmpty(t, won, "no resolve was answered")
	for i, a := range answers {
		if a[1].isError {
			require.NotEqual(t, won, outcome(i), "a repeat of the outcome that stands is refused: %v", a[1].content)
			e := a[1].content["error"].(map[string]any)
			require.Equal(t, "invalid_state", e["code"], "%v", a[1].content)
			require.Equal(t, won, e["detail"].(map[string]any)["state"], "%v", a[1].content)
		}
	}
	want := map[string][2]int64{"type:hammer.resolve": {100, 1}} // succeeded: kept
	if won == "failed" {
		want = map[string][2]int64{"type:hammer.resolve": {0, 0}} // given back, once
	}
	require.Equal(t, want, spent(t, instances[0], ws.ID))
	require.Equal(t, 1, attempts(t, instances[0], ws.ID))
}

// An effect held for approval, approved by racers on two instances through
// ratchet_decide_approval, then begun again by racers on both: every
// decision is answered approved, exactly one begin is granted and the rest
// in_flight, and the budget is charged once, when it is granted.
func TestRacingApprovalsAndBeginsThroughMCPChargeOnce(t *testing.T) {
	t.Parallel()
	instances := []*apitest.Env{apitest.Start(t), apitest.Start(t)}
	ws, agent := budgeted(instances[0], "hammer.approve", map[string]any{"daily_budget_micros": 500,
		"approval_above_micros": 10})
	args := map[string]any{"effect_type": "hammer.approve", "idempotency_key": "payout:7", "cost_micros": 100}
	held, err := toolAnswers(context.Background(), instances[1], agent, rpcCall(1, "ratchet_begin", args))
	require.NoError(t, err)
	require.Equal(t, "approval_required", held[1].content["decision"], "%v", held[1].content)
	require.Empty(t, spent(t, instances[0], ws.ID), "nothing is charged while held")

	const racers = 12
	race := func(key string, msg map[string]any) []toolAnswer {
		out := make([]toolAnswer, racers)
		errs := make([]error, racers)
		apitest.StartTogether(racers, func(i int) {
			var a map[int]toolAnswer
			a, errs[i] = toolAnswers(context.Background(), instances[i%2], key, msg)
			out[i] = a[1]
		})
		for _, err := range errs {
			require.NoError(t, err)
		}
		return out
	}
	for _, d := range race(ws.Key, rpcCall(1, "ratchet_decide_approval",
		map[string]any{"approval_id": held[1].content["approval_id"], "decision": "approve"})) {
		require.False(t, d.isError, "%v", d.content)
		require.Equal(t, "approved", d.content["state"], "%v", d.content)
	}
	require.Empty(t, spent(t, instances[0], ws.ID), "approval charges nothing: the grant does")
	granted := 0
	for _, b := range race(agent, rpcCall(1, "ratchet_begin", args)) {
		require.False(t, b.isError, "%v", b.content)
		switch b.content["decision"] {
		case "execute":
			granted++
		case "in_flight":
		default:
			t.Fatalf("decision %v", b.content)
		}
	}
	require.Equal(t, 1, granted)
	require.Equal(t, 1, attempts(t, instances[0], ws.ID))
	require.Equal(t, map[string][2]int64{"type:hammer.approve": {100, 1}}, spent(t, instances[0], ws.ID))
}

package gate_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	body["compensation"] = map[string]any{"effect_type": "email.retract", "payload": map[string]any{"to": "alice@example.com"}}
	body["group_id"] = b.env.Must(http.StatusCreated, "POST", "/api/v1/groups", b.ws.Key,
		map[string]any{"name": "g"}).JSON()["id"]
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
	// A ciphertext moved to another effect does not open there.
	d2 := b.mustBegin("execute", email(key("other")))
	require.Equal(t, http.StatusOK, b.report(str(d2["effect_id"]), str(d2["lease_token"]), "succeeded", nil).Status)
	_, err := b.env.App.Pool.Exec(context.Background(), `UPDATE effects SET result = $1 WHERE id = $2`, result, d2["effect_id"])
	require.NoError(t, err)
	errCode(t, b.env.Do("GET", "/api/v1/effects/"+str(d2["effect_id"]), b.ws.Key, nil), http.StatusInternalServerError, "internal_error")
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

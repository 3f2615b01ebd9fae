package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

// rpcAnswers decodes a batch's answers by id.
func rpcAnswers(t *testing.T, out []byte) map[string]map[string]any {
	t.Helper()
	var answers []map[string]any
	require.NoError(t, json.Unmarshal(out, &answers), "%.300s", out)
	byID := map[string]map[string]any{}
	for _, a := range answers {
		id := fmt.Sprint(a["id"])
		require.NotContains(t, byID, id, "each request answered once")
		byID[id] = a
	}
	return byID
}

// A batch's answers together hold at most answer.Budget: a tool call whose
// result would take them past it is answered a JSON-RPC error saying to
// send it again alone or in a smaller batch, and the others are answered
// (QA: 20 reads of effects with 250 KB results answered 10 MB, which
// neither Vercel nor Lambda delivers). Each refused one, sent alone, is
// answered.
func TestABatchsAnswersStayWithinTheAnswerBudget(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var effectIDs []string
	for i := range 5 {
		d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{
			"effect_type": "qa.mcp.budget", "idempotency_key": fmt.Sprintf("big-%d", i)}).JSON()
		// Quotes are escaped once in the API's answer and again in the
		// tool result's text.
		result := map[string]any{"body": strings.Repeat(`"<`, 80_000)}
		env.Must(http.StatusOK, "POST", "/api/v1/effects/"+d["effect_id"].(string)+"/report", ws.Key,
			map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded", "result": result})
		effectIDs = append(effectIDs, d["effect_id"].(string))
	}
	read := func(id int, effectID string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ratchet_get_effect",`+
			`"arguments":{"effect_id":"%s"}}}`, id, effectID)
	}
	calls := make([]string, 20)
	for i := range calls {
		calls[i] = read(i, effectIDs[i%len(effectIDs)])
	}
	status, out := postMCP(t, env, ws.Key, "["+strings.Join(calls, ",")+"]")
	require.Equal(t, http.StatusOK, status, "%.300s", out)
	require.LessOrEqual(t, len(bytes.TrimSpace(out)), answer.Budget, "the batch's answer")
	byID := rpcAnswers(t, out)
	require.Len(t, byID, len(calls))
	answered, refused := 0, 0
	for i := range calls {
		a := byID[fmt.Sprint(i)]
		if e, ok := a["error"].(map[string]any); ok {
			refused++
			require.EqualValues(t, -32600, e["code"])
			require.Contains(t, e["message"], "send this request again alone or in a smaller batch")
			continue
		}
		answered++
		res := a["result"].(map[string]any)
		require.Equal(t, effectIDs[i%len(effectIDs)], res["structuredContent"].(map[string]any)["id"])
	}
	require.Positive(t, answered)
	require.Positive(t, refused)
	for i := range calls {
		if _, ok := byID[fmt.Sprint(i)]["error"]; !ok {
			continue
		}
		status, out := postMCP(t, env, ws.Key, read(i, effectIDs[i%len(effectIDs)]))
		require.Equal(t, http.StatusOK, status)
		var alone map[string]any
		require.NoError(t, json.Unmarshal(out, &alone))
		require.Nil(t, alone["error"], "alone it is answered")
		require.NotContains(t, string(out), `\u003c`, "markup is written as it is")
	}
}

// A list tool's page fits in what the answer has left: its tool result
// carries the API's page twice (as text, escaped again, and as structured
// content), so the page is asked for within a third of it, and pages on
// (QA: 200 effects whose keys and previews are quotes answered a 5 MB
// tool result).
func TestAListToolsPageFitsItsAnswer(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	current := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", ws.Key, nil).JSON()
	preview := map[string]any{}
	for i := range 60 {
		preview[fmt.Sprintf("%02d", i)+strings.Repeat(`"`, 62)] = "<string>"
	}
	previewJSON, err := json.Marshal(preview)
	require.NoError(t, err)
	const n = 200
	effectIDs, keys := make([]string, n), make([]string, n)
	now := time.Now().UTC()
	for i := range n {
		effectIDs[i] = ids.NewAt(ids.Effect, now)
		keys[i] = fmt.Sprintf("%03d", i) + strings.Repeat(`"`, 252)
	}
	_, err = env.App.Pool.Exec(context.Background(), `INSERT INTO effects (id, workspace_id, effect_type,
			idempotency_key, fingerprint, state, lease_seconds, created_by_key_id, created_at, updated_at,
			payload_preview, result_preview)
		SELECT id, $1, 'qa.mcp.list', k, 'f', 'succeeded', 60, $2, $3, $3, $4::jsonb, $4::jsonb
		FROM unnest($5::text[], $6::text[]) AS u(id, k)`,
		ws.ID, current["id"], now, string(previewJSON), effectIDs, keys)
	require.NoError(t, err)
	list := func(cursor string) (int, []byte) {
		args := `{"limit":200}`
		if cursor != "" {
			args = `{"limit":200,"cursor":"` + cursor + `"}`
		}
		return postMCP(t, env, ws.Key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":`+
			`"ratchet_list_effects","arguments":`+args+`}}`)
	}
	seen := map[string]bool{}
	cursor := ""
	for pages := 1; ; pages++ {
		require.Less(t, pages, 20)
		status, out := list(cursor)
		require.Equal(t, http.StatusOK, status, "%.300s", out)
		require.LessOrEqual(t, len(bytes.TrimSpace(out)), answer.Budget, "page %d", pages)
		var msg struct {
			Error  any `json:"error"`
			Result struct {
				IsError    bool `json:"isError"`
				Structured struct {
					Data []struct {
						ID string `json:"id"`
					} `json:"data"`
					NextCursor *string `json:"next_cursor"`
				} `json:"structuredContent"`
			} `json:"result"`
		}
		require.NoError(t, json.Unmarshal(out, &msg))
		require.Nil(t, msg.Error)
		require.False(t, msg.Result.IsError)
		page := msg.Result.Structured
		require.NotEmpty(t, page.Data)
		for _, e := range page.Data {
			require.False(t, seen[e.ID])
			seen[e.ID] = true
		}
		if page.NextCursor == nil {
			require.Greater(t, pages, 1, "200 such effects take more than one answer")
			break
		}
		cursor = *page.NextCursor
	}
	require.Len(t, seen, n)
}

// A tool call sent alone whose refusal names a key as long as the request
// is answered that refusal, with the key cut (apierr.CutField), never the
// JSON-RPC error that says to send it alone (size QA: an unknown argument,
// or a dimension, named by a key of a megabyte was refused invalid_request
// naming it twice, in the message and in detail.validation; carried twice
// again by the tool result, that passed what the answer had left, and the
// call, alone, was answered -32600 "send this request again alone").
func TestARefusalNamingAHugeKeyIsAnsweredAlone(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	key := strings.Repeat("k", 1_000_000)
	for name, args := range map[string]string{
		"unknown argument": `{"effect_type":"qa.mcp.key","idempotency_key":"k","` + key + `":1}`,
		"dimension name":   `{"effect_type":"qa.mcp.key","idempotency_key":"k","dimensions":{"` + key + `":"v"}}`,
	} {
		t.Run(name, func(t *testing.T) { refusedAlone(t, env, ws.Key, name, args) })
	}
}

// refusedAlone checks that the tool call args, sent alone, is refused
// invalid_request naming its key cut.
func refusedAlone(t *testing.T, env *apitest.Env, key, name, args string) {
	t.Helper()
	status, out := postMCP(t, env, key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":`+
		`{"name":"ratchet_begin","arguments":`+args+`}}`)
	require.Equal(t, http.StatusOK, status, name)
	require.Less(t, len(out), 64<<10, "%s: the refusal holds no megabyte", name)
	var msg struct {
		Error  any `json:"error"`
		Result struct {
			IsError    bool `json:"isError"`
			Structured struct {
				Error struct {
					Code   string `json:"code"`
					Detail struct {
						Validation []struct {
							Field string `json:"field"`
						} `json:"validation"`
					} `json:"detail"`
				} `json:"error"`
			} `json:"structuredContent"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(out, &msg), name)
	require.Nil(t, msg.Error, "%s: answered, not refused as too large: %.300s", name, out)
	require.True(t, msg.Result.IsError, name)
	require.Equal(t, "invalid_request", msg.Result.Structured.Error.Code, name)
	fields := msg.Result.Structured.Error.Detail.Validation
	require.NotEmpty(t, fields, name)
	require.Contains(t, fields[0].Field, "kkk…kkk", "%s: the key's start and end", name)
	require.LessOrEqual(t, len(fields[0].Field), apierr.MaxFieldBytes, name)
}

// A write of a real batch over HTTP whose result would take the batch's
// answer past answer.Budget ran, and is answered the short result saying
// so, never the error that says to send it again (the unit test,
// TestAWriteThatRanPastItsBatchsRoomSaysItRan, calls it without a batch).
// Three reports whose results are 256 KiB of quotes (each answered about
// three times that: the REST answer as text, escaped again, and as
// structured content) share one batch with tools/list calls, each of which
// has its answer set aside: whichever report finishes first fits, the
// others do not, so at least one is answered applied, in its text and its
// structured content, and every report stood, as ratchet_get_effect reads.
func TestAWriteOfABatchPastItsAnswerSaysItWasApplied(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	// 2 bytes a quote in the body: 130 000 of them within MaxResultBytes.
	result := map[string]any{"body": strings.Repeat(`"`, 130_000)}
	resultJSON, err := json.Marshal(result)
	require.NoError(t, err)
	const reports, lists = 3, mcpserver.MaxBatch - 3
	var calls []string
	effectIDs := map[string]string{}
	for i := range reports {
		d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{
			"effect_type": "qa.mcp.applied", "idempotency_key": fmt.Sprintf("applied-%d", i)}).JSON()
		effectIDs[fmt.Sprint(i)] = d["effect_id"].(string)
		calls = append(calls, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":`+
			`"ratchet_report","arguments":{"effect_id":"%s","lease_token":"%s","outcome":"succeeded","result":%s}}}`,
			i, d["effect_id"], d["lease_token"], resultJSON))
	}
	for i := range lists {
		calls = append(calls, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, 100+i))
	}
	status, out := postMCP(t, env, ws.Key, "["+strings.Join(calls, ",")+"]")
	require.Equal(t, http.StatusOK, status, "%.300s", out)
	require.LessOrEqual(t, len(bytes.TrimSpace(out)), answer.Budget, "the batch's answer")
	byID := rpcAnswers(t, out)
	require.Len(t, byID, reports+lists)
	for i := range lists {
		a := byID[fmt.Sprint(100+i)]
		require.Nil(t, a["error"], "tools/list has its answer set aside")
		require.Len(t, a["result"].(map[string]any)["tools"], 9)
	}
	applied := 0
	for id, effectID := range effectIDs {
		a := byID[id]
		require.Nil(t, a["error"], "a report that ran is never answered the error that says to send it again")
		res := a["result"].(map[string]any)
		require.NotEqual(t, true, res["isError"], id)
		structured := res["structuredContent"].(map[string]any)
		text := res["content"].([]any)[0].(map[string]any)["text"].(string)
		if structured["applied"] == nil {
			require.Equal(t, effectID, structured["id"], "answered in full")
			require.Equal(t, "succeeded", structured["state"])
			continue
		}
		applied++
		require.Equal(t, true, structured["applied"], id)
		require.Len(t, structured, 2, "applied and answer_omitted only: %v", structured)
		require.Contains(t, structured["answer_omitted"], "do not send it again: read the outcome with ratchet_get_effect")
		require.NotContains(t, structured["answer_omitted"], effectID, "it names no value of the call")
		var fromText map[string]any
		require.NoError(t, json.Unmarshal([]byte(text), &fromText))
		require.Equal(t, structured, fromText, "its text says the same")
	}
	require.Positive(t, applied, "a report past the batch's answer: %d of %d", applied, reports)
	require.Less(t, applied, reports, "the first to finish fits")
	for _, effectID := range effectIDs {
		// Read as the answer says: every report stood, its result whole.
		status, out := postMCP(t, env, ws.Key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":`+
			`{"name":"ratchet_get_effect","arguments":{"effect_id":"`+effectID+`"}}}`)
		require.Equal(t, http.StatusOK, status)
		var msg struct {
			Result struct {
				Structured struct {
					State  string          `json:"state"`
					Result json.RawMessage `json:"result"`
				} `json:"structuredContent"`
			} `json:"result"`
		}
		require.NoError(t, json.Unmarshal(out, &msg), "%.300s", out)
		require.Equal(t, "succeeded", msg.Result.Structured.State, effectID)
		require.JSONEq(t, string(resultJSON), string(msg.Result.Structured.Result), effectID)
	}
}

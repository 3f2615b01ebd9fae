package httpapi_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apitest"
)

// withBudget is env's API served with every answer held to n bytes
// (answer.Within), as the MCP endpoint holds the pages its tools read.
func withBudget(t *testing.T, env *apitest.Env, n int) *apitest.Env {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env.App.Server.ServeHTTP(w, r.WithContext(answer.Within(r.Context(), n)))
	}))
	t.Cleanup(srv.Close)
	return &apitest.Env{T: t, App: env.App, Server: srv, Client: srv.Client()}
}

// wideDocument is a JSON object whose redacted preview is as large as a
// preview gets (redact.MaxBytes): many keys of 64 four-byte characters.
func wideDocument(tag string) map[string]any {
	doc := map[string]any{}
	for i := range 40 {
		doc[fmt.Sprintf("%s%02d", tag, i)+strings.Repeat("🙂", 60)] = "v"
	}
	return doc
}

// pages follows path's cursors (cursorName) with env, each page within
// budget bytes unless it holds one item, and answers the ids of every item.
func pages(t *testing.T, env *apitest.Env, path, key, cursorName string, budget int) (ids []string, count int) {
	t.Helper()
	next := ""
	for count = 1; ; count++ {
		require.Less(t, count, 50, "the pages end")
		url := path
		if next != "" {
			sep := "?"
			if strings.Contains(path, "?") {
				sep = "&"
			}
			url += sep + "cursor=" + next
		}
		r := env.Must(http.StatusOK, "GET", url, key, nil)
		page := r.JSON()
		data := page["data"].([]any)
		require.NotEmpty(t, data, "a page holds at least one item")
		if len(data) > 1 {
			require.LessOrEqual(t, len(bytes.TrimSpace(r.Body)), budget, "%s: a page stays within its budget", url)
		}
		for _, it := range data {
			ids = append(ids, it.(map[string]any)["id"].(string))
		}
		c, _ := page[cursorName].(string)
		if c == "" {
			return ids, count
		}
		next = c
	}
}

// Every list pages within its answer's budget: a page ends early, with the
// usual cursor, before an item would take it past the budget (QA: 200
// effects or steps with full previews, keys and messages passed what Vercel
// and Lambda deliver). Here the budget holds about two items.
func TestListsPageWithinTheAnswerBudget(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	for i := range 5 {
		e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", e.ws.Key, map[string]any{
			"effect_type": "qa.budget", "idempotency_key": fmt.Sprintf("budget-%d-", i) + strings.Repeat("\"", 200),
			"payload": wideDocument("p")})
		e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": wideDocument(fmt.Sprint(i))})
	}
	whole := e.Must(http.StatusOK, "GET", "/api/v1/effects", e.ws.Key, nil)
	require.Len(t, whole.JSON()["data"], 5)
	budget := len(whole.Body) * 2 / 5
	small := withBudget(t, e.Env, budget)
	ids, count := pages(t, small, "/api/v1/effects?limit=4", e.ws.Key, "next_cursor", budget)
	require.Len(t, ids, 5)
	require.GreaterOrEqual(t, count, 3, "pages of two at most")

	steps := e.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID+"/steps", e.ingest, nil)
	budget = len(steps.Body) * 2 / 5
	small = withBudget(t, e.Env, budget)
	ids, count = pages(t, small, "/api/v1/runs/"+runID+"/steps", e.ingest, "nextCursor", budget)
	require.Len(t, ids, 5)
	require.GreaterOrEqual(t, count, 3)

	// A run answers the steps that fit, from the first, and says so.
	run := small.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID, e.ingest, nil)
	require.LessOrEqual(t, len(bytes.TrimSpace(run.Body)), budget)
	got := run.JSON()
	require.Equal(t, true, got["stepsTruncated"])
	require.NotEmpty(t, got["steps"])
	require.Less(t, len(got["steps"].([]any)), 5)
	for i, st := range got["steps"].([]any) {
		require.Equal(t, ids[i], st.(map[string]any)["id"])
	}
	full := e.getRun(runID)
	require.Equal(t, false, full["stepsTruncated"], "within the whole budget it holds them all")
	require.Len(t, full["steps"], 5)
}

package httpapi_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
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

// A step answers its job's last 50 attempts and last 50 replays, and says
// when earlier ones are left out (attemptsTruncated, replaysTruncated), in
// its own read, a page of its run's steps and its run's read alike; its
// attempts and replays routes page every one, in order (size QA: a job takes
// replays without end, each adding up to 10 attempts of up to two 2 000
// character messages, so one step alone could pass what one answer holds,
// and a page always holds at least one step).
func TestAStepAnswersItsLastAttemptsAndReplays(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	st := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{}})
	stepID, jobID := st["stepId"].(string), st["jobId"].(string)
	const attempts, replays = 150, 120
	start := time.Now().UTC().Add(-time.Hour)
	_, err := e.App.Pool.Exec(t.Context(), `INSERT INTO job_executions (job_id, attempt, workspace_id, worker_id,
			lease_token, started_at, lease_expires_at, outcome, warning, reported_at)
		SELECT $1, n, $2, 'wkr_qa', 'lt_' || n, $3::timestamptz + n * interval '1 second',
			$3::timestamptz + n * interval '1 second' + interval '1 minute', 'FAILED', 'attempt ' || n,
			$3::timestamptz + n * interval '1 second'
		FROM generate_series(1, $4::int) AS n`, jobID, e.ws.ID, start, attempts)
	require.NoError(t, err)
	replayIDs := make([]string, replays)
	for i := range replayIDs {
		replayIDs[i] = ids.NewAt("rpl", start.Add(time.Duration(i)*time.Second))
	}
	_, err = e.App.Pool.Exec(t.Context(), `INSERT INTO job_replays (id, workspace_id, job_id, step_id, key_id, reason,
			prior_status, prior_attempt, additional_attempts, max_attempts, old_handler_version, new_handler_version,
			created_at)
		SELECT id, $2, $3, $4, 'key_qa', 'replay ' || n, 'EXHAUSTED', n, 1, n + 1, '1', '1',
			$5::timestamptz + n * interval '1 second'
		FROM unnest($1::text[]) WITH ORDINALITY AS u(id, n)`, replayIDs, e.ws.ID, jobID, stepID, start)
	require.NoError(t, err)

	numbers := func(job map[string]any, list, field string) []int {
		var out []int
		for _, it := range job[list].([]any) {
			out = append(out, int(it.(map[string]any)[field].(float64)))
		}
		return out
	}
	span := func(from, to int) []int {
		var out []int
		for n := from; n <= to; n++ {
			out = append(out, n)
		}
		return out
	}
	read := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID, e.ingest, nil).JSON()
	page := e.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID+"/steps", e.ingest, nil).JSON()
	for name, s := range map[string]map[string]any{"step": read, "steps page": page["data"].([]any)[0].(map[string]any),
		"run": step(e.getRun(runID), 0)} {
		job := s["durableJob"].(map[string]any)
		require.Equal(t, span(attempts-jobs.StepAttemptsShown+1, attempts), numbers(job, "attempts", "attempt"), name)
		require.Equal(t, true, job["attemptsTruncated"], name)
		require.Equal(t, span(replays-jobs.StepReplaysShown+1, replays), numbers(job, "replays", "priorAttempt"), name)
		require.Equal(t, true, job["replaysTruncated"], name)
	}

	// The routes page them all, oldest first.
	var all []int
	next := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		r := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/attempts?limit=40&cursor="+next, e.ingest, nil).JSON()
		all = append(all, numbers(r, "data", "attempt")...)
		if r["nextCursor"] == nil {
			break
		}
		next = r["nextCursor"].(string)
	}
	require.Equal(t, span(1, attempts), all)
	all, next = nil, ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		r := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID+"/replays?limit=40&cursor="+next, e.ingest, nil).JSON()
		all = append(all, numbers(r, "data", "priorAttempt")...)
		if r["nextCursor"] == nil {
			break
		}
		next = r["nextCursor"].(string)
	}
	require.Equal(t, span(1, replays), all)

	// A step with fewer answers them all and says so; another workspace's
	// step, or none, is not found; a cursor not from the route is refused.
	other := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 2}})
	job := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+other["stepId"].(string), e.ingest, nil).JSON()["durableJob"].(map[string]any)
	require.Equal(t, false, job["attemptsTruncated"])
	require.Equal(t, false, job["replaysTruncated"])
	empty := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+other["stepId"].(string)+"/attempts", e.ingest, nil).JSON()
	require.Empty(t, empty["data"])
	require.Nil(t, empty["nextCursor"])
	stranger := e.Signup()
	for _, path := range []string{"/attempts", "/replays"} {
		r := e.Do("GET", "/api/v1/steps/"+stepID+path, stranger.Key, nil)
		require.Equal(t, http.StatusNotFound, r.Status, path)
	}
	for _, cursor := range []string{"0", "01", "x", "-1", "stp_x"} {
		r := e.Do("GET", "/api/v1/steps/"+stepID+"/attempts?cursor="+cursor, e.ingest, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, cursor)
		r = e.Do("GET", "/api/v1/steps/"+stepID+"/replays?cursor="+cursor, e.ingest, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, cursor)
	}
}

// A worker's error message is stored within the limit it was checked
// against, though masking lengthened it (size QA: 2 000 characters of "?q"
// were stored as some 8 000 of "?[redacted]", and a step answers its
// attempts whole).
func TestAMaskedErrorMessageStaysWithinItsLimit(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{}, "maxAttempts": 1})
	wid := e.register("send_email@1")
	claimed := e.claim(wid, 1)
	require.Len(t, claimed, 1)
	msg := strings.TrimSpace(strings.Repeat("?q ", 666))
	require.Equal(t, http.StatusOK, e.report(claimed[0], map[string]any{"status": "FAILED",
		"error": map[string]any{"message": msg}}).Status)
	a := durable(e.getRun(runID), 0)["attempts"].([]any)[0].(map[string]any)
	stored := a["errorMessage"].(string)
	require.True(t, strings.HasPrefix(stored, "?[redacted] ?[redacted]"), stored[:40])
	require.LessOrEqual(t, utf8.RuneCountInString(stored), 2000)
	require.True(t, strings.HasSuffix(stored, "…"))
}

// A group whose steps would take its answer past answer.Budget holds its
// first steps that fit, in order, and says so (steps_truncated), in its
// read, its commit and the answer to its create sent again alike; GET
// /api/v1/groups/{id}/steps pages them all, and from the last one shown the
// rest (size QA: 3 500 steps under keys of 255 four-byte characters
// answered 4.1 MB, which neither Vercel nor Lambda delivers).
func TestAGroupPastTheBudgetHoldsItsFirstSteps(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	g := env.Must(http.StatusCreated, "POST", "/api/v1/groups", agent,
		map[string]any{"name": "big", "idempotency_key": "big-group"}).JSON()["id"].(string)
	creator := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", agent, nil).JSON()["id"]
	const n = 3500
	now := time.Now().UTC()
	effectIDs, keys := make([]string, n), make([]string, n)
	for i := range n {
		effectIDs[i] = ids.NewAt(ids.Effect, now)
		keys[i] = fmt.Sprintf("%04d", i) + strings.Repeat("🙂", 251)
	}
	_, err := env.App.Pool.Exec(t.Context(), `INSERT INTO effects (id, workspace_id, effect_type,
			idempotency_key, fingerprint, state, lease_seconds, created_by_key_id, created_at, updated_at, group_id)
		SELECT id, $1, 'qa.group.size', k, 'f', 'succeeded', 60, $2, $3, $3, $4
		FROM unnest($5::text[], $6::text[]) AS u(id, k)`, ws.ID, creator, now, g, effectIDs, keys)
	require.NoError(t, err)
	keyOf := map[string]string{}
	for i, id := range effectIDs {
		keyOf[id] = keys[i]
	}
	slices.Sort(effectIDs)

	shown := func(name string, r *apitest.Response) []string {
		t.Helper()
		require.LessOrEqual(t, len(bytes.TrimSpace(r.Body)), answer.Budget, name)
		got := r.JSON()
		require.Equal(t, true, got["steps_truncated"], name)
		var out []string
		for _, st := range got["steps"].([]any) {
			out = append(out, st.(map[string]any)["effect_id"].(string))
		}
		require.Greater(t, len(out), n/2, name)
		require.Less(t, len(out), n, name)
		require.Equal(t, effectIDs[:len(out)], out, "%s: the first steps, in order", name)
		return out
	}
	first := shown("read", env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, agent, nil))
	shown("create sent again", env.Must(http.StatusOK, "POST", "/api/v1/groups", agent,
		map[string]any{"name": "big", "idempotency_key": "big-group"}))

	// The rest, from the last one shown; and all of them, page by page.
	steps := func(cursor string) []string {
		t.Helper()
		var out []string
		for pages := 0; ; pages++ {
			require.Less(t, pages, 30, "the pages end")
			r := env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g+"/steps?limit=200&cursor="+cursor, agent, nil)
			require.LessOrEqual(t, len(bytes.TrimSpace(r.Body)), answer.Budget)
			page := r.JSON()
			for _, st := range page["data"].([]any) {
				out = append(out, st.(map[string]any)["effect_id"].(string))
			}
			next, _ := page["next_cursor"].(string)
			if next == "" {
				return out
			}
			cursor = next
		}
	}
	require.Equal(t, effectIDs[len(first):], steps(first[len(first)-1]))
	require.Equal(t, effectIDs, steps(""))
	page := env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g+"/steps?limit=1", agent, nil).JSON()
	require.Equal(t, map[string]any{"effect_id": effectIDs[0], "effect_type": "qa.group.size",
		"idempotency_key": keyOf[effectIDs[0]], "state": "succeeded", "has_compensation": false, "compensates_effect_id": nil},
		page["data"].([]any)[0])
	// Another key that sees only its own groups finds none; a cursor that
	// is no effect id is refused.
	other := env.Key(ws, map[string]any{"name": "other", "preset": "AGENT"})
	require.Equal(t, http.StatusNotFound, env.Do("GET", "/api/v1/groups/"+g+"/steps", other, nil).Status)
	require.Equal(t, http.StatusOK, env.Do("GET", "/api/v1/groups/"+g+"/steps", ws.Key, nil).Status)
	require.Equal(t, http.StatusBadRequest, env.Do("GET", "/api/v1/groups/"+g+"/steps?cursor=x", agent, nil).Status)

	shown("commit", env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/commit", agent, nil))
}

package httpapi_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An endpoint's attempts are read newest first, each with its job and the
// message its worker reported, without another endpoint's; filtered by
// outcome, paged with nextCursor, and refused with the field named when a
// query is wrong.
func TestAnEndpointsAttemptsAreReadNewestFirst(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "charge@1")
	runID := e.run()
	email := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"to": "a"}})
	charge := e.enqueue(runID, map[string]any{"name": "charge", "version": "1"})
	wid := e.register("send_email@1", "charge@1")

	jobs := e.claim(wid, 10)
	require.Len(t, jobs, 2)
	for _, j := range jobs {
		body := map[string]any{"status": "SUCCEEDED", "output": map[string]any{}}
		if j["jobId"] == email["jobId"] {
			// A worker reporting over plain HTTP, without an SDK's
			// redaction: the server masks the token (console QA).
			body = map[string]any{"status": "FAILED", "error": map[string]any{
				"message": "smtp 421:\ttry later (Authorization: Bearer sk_live_abc123)", "retryable": true}}
		}
		require.Equal(t, http.StatusOK, e.report(j, body).Status)
	}
	e.clock.Add(time.Hour) // past the retry's backoff
	again := e.claim(wid, 10)
	require.Len(t, again, 1)
	require.Equal(t, email["jobId"], again[0]["jobId"])
	require.Equal(t, http.StatusOK, e.report(again[0], map[string]any{"status": "SUCCEEDED", "output": map[string]any{}}).Status)

	endpoints := map[string]string{}
	for _, ep := range e.Must(http.StatusOK, "GET", "/api/v1/endpoints", e.ws.Key, nil).JSON()["data"].([]any) {
		ep := ep.(map[string]any)
		endpoints[ep["name"].(string)] = ep["id"].(string)
	}
	path := "/api/v1/endpoints/" + endpoints["send_email"] + "/attempts"
	page := e.Must(http.StatusOK, "GET", path, e.ingest, nil).JSON()
	require.Nil(t, page["nextCursor"])
	data := page["data"].([]any)
	require.Len(t, data, 2, "the other endpoint's attempt is not listed")
	latest, first := data[0].(map[string]any), data[1].(map[string]any)
	for _, a := range data {
		a := a.(map[string]any)
		require.Equal(t, email["jobId"], a["jobId"])
		require.Equal(t, email["stepId"], a["stepId"])
		require.Equal(t, runID, a["runId"])
		require.Equal(t, "send_email", a["name"])
		require.Equal(t, "1", a["version"])
		require.Equal(t, wid, a["workerId"])
	}
	require.EqualValues(t, 2, latest["attempt"])
	require.Equal(t, "SUCCEEDED", latest["outcome"])
	require.Nil(t, latest["errorMessage"])
	require.EqualValues(t, 1, first["attempt"])
	require.Equal(t, "FAILED", first["outcome"])
	require.Equal(t, true, first["retryable"])
	require.Equal(t, "smtp 421: try later (Authorization: [redacted]", first["errorMessage"])
	// The attempt as the step reads it, with the job's fields beside it.
	step := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+email["stepId"].(string), e.ingest, nil).JSON()
	stepFirst := step["durableJob"].(map[string]any)["attempts"].([]any)[0].(map[string]any)
	for k, v := range stepFirst {
		require.Equal(t, v, first[k], k)
	}

	failed := e.Must(http.StatusOK, "GET", path+"?outcome=FAILED", e.ingest, nil).JSON()["data"].([]any)
	require.Equal(t, []any{first}, failed)
	other := e.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+endpoints["charge"]+"/attempts", e.ingest, nil).JSON()
	require.Len(t, other["data"], 1)
	require.Equal(t, charge["jobId"], other["data"].([]any)[0].(map[string]any)["jobId"])

	// One at a time: the same two, in the same order, then no cursor.
	one := e.Must(http.StatusOK, "GET", path+"?limit=1", e.ingest, nil).JSON()
	require.Equal(t, []any{latest}, one["data"])
	cursor, ok := one["nextCursor"].(string)
	require.True(t, ok, "a cursor to the rest")
	two := e.Must(http.StatusOK, "GET", path+"?limit=1&cursor="+url.QueryEscape(cursor), e.ingest, nil).JSON()
	require.Equal(t, []any{first}, two["data"])
	require.Nil(t, two["nextCursor"])

	for query, field := range map[string]string{
		"?outcome=LOST": "outcome", "?cursor=yesterday": "cursor", "?cursor=1:job_nope:1": "cursor", "?limit=0": "limit",
		"?cursor=" + url.QueryEscape(cursor[:len(cursor)-1]+"0"):                  "cursor",
		"?cursor=" + url.QueryEscape("1:"+email["jobId"].(string)+":99999999999"): "cursor", // no integer's attempt
		// Another spelling of the cursor it answered is a mistyped one.
		"?cursor=" + url.QueryEscape("+"+cursor):                                     "cursor",
		"?cursor=" + url.QueryEscape("0"+cursor):                                     "cursor",
		"?cursor=" + url.QueryEscape(strings.Replace(cursor, ":job_", ":+job_", 1)):  "cursor",
		"?cursor=" + url.QueryEscape(cursor[:strings.LastIndex(cursor, ":")+1]+"01"): "cursor",
	} {
		r := e.Do("GET", path+query, e.ingest, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", query, r.Body)
		require.Equal(t, field, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any)[0].(map[string]any)["field"], query)
	}
	require.Equal(t, http.StatusNotFound, e.Do("GET", "/api/v1/endpoints/end_nothing/attempts", e.ingest, nil).Status)
	stranger := e.Signup()
	require.Equal(t, http.StatusNotFound, e.Do("GET", path, stranger.Key, nil).Status, "another workspace's endpoint")
	require.Equal(t, http.StatusForbidden, e.Do("GET", path, e.worker, nil).Status, "a WORKER key reads no runs")
}

// Attempts leased by one claim start at the same instant: pages of them
// follow job and attempt, so each is read once, none skipped.
func TestAttemptsOfOneClaimArePagedOnce(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	runID := e.run()
	want := map[string]bool{}
	for i := range 5 {
		st := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": i}})
		want[st["jobId"].(string)] = true
	}
	require.Len(t, e.claim(e.register("send_email@1"), 10), 5)
	var endpoint string
	for _, ep := range e.Must(http.StatusOK, "GET", "/api/v1/endpoints", e.ws.Key, nil).JSON()["data"].([]any) {
		endpoint = ep.(map[string]any)["id"].(string)
	}
	seen := map[string]bool{}
	query := "?limit=2"
	for pages := 0; ; pages++ {
		require.Less(t, pages, 3, "5 attempts in pages of 2")
		page := e.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+endpoint+"/attempts"+query, e.ingest, nil).JSON()
		for _, a := range page["data"].([]any) {
			id := a.(map[string]any)["jobId"].(string)
			require.False(t, seen[id], "%s read twice", id)
			seen[id] = true
		}
		next, ok := page["nextCursor"].(string)
		if !ok {
			break
		}
		query = "?limit=2&cursor=" + url.QueryEscape(next)
	}
	require.Equal(t, want, seen)
}

package ratchet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// nested is a JSON array nesting levels arrays around "leaf".
func nested(levels int) json.RawMessage {
	return json.RawMessage(strings.Repeat("[", levels) + `"leaf"` + strings.Repeat("]", levels))
}

// claimedJSON is a claim answer's job with input as sent.
func claimedJSON(id string, input json.RawMessage) string {
	return fmt.Sprintf(`{"jobId":%q,"stepId":"stp_%s","runId":"run_1","name":"deep","version":"1","attempt":1,`+
		`"maxAttempts":3,"leaseToken":"tok_%s","leaseExpiresAt":%q,"leaseMs":600000,"timeoutMs":30000,`+
		`"idempotencyKey":"key_%s","input":%s}`, id, id, id, time.Now().Add(10*time.Minute).Format(time.RFC3339Nano), id, input)
}

// A claim answer carries each input three levels down, and the API takes
// a body nested 10 000 levels deep: an input of 9 999 levels made the
// answer deeper than encoding/json reads, and the whole claim unreadable
// (every job in it lapsed unrun, and came back at every claim).
func TestClaimReadsAnAnswerNestedDeeperThanEncodingJSONReads(t *testing.T) {
	t.Parallel()
	answer := `{"jobs": [` + claimedJSON("job_1", json.RawMessage(`{"a":1}`)) + ",\n " +
		claimedJSON("job_2", nested(9999)) + ", " + claimedJSON("job_3", nested(10001)) +
		`], "later": ` + string(nested(10005)) + `, "JOBS": null, "jobs": [` + claimedJSON("job_1", json.RawMessage(`{"a":1}`)) +
		",\t" + claimedJSON("job_2", nested(9999)) + ",\r\n" + claimedJSON("job_3", nested(10001)) + "]}"
	var whole map[string]any
	if err := json.Unmarshal([]byte(answer), &whole); !tooDeep(err) {
		t.Fatalf("the answer reads whole (%v): not the case under test", err)
	}
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, answer)
	}))
	jobs, err := c.Claim(context.Background(), "wkr_1", 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 3 {
		t.Fatalf("%d jobs: %+v", len(jobs), jobs)
	}
	for i, want := range []json.RawMessage{json.RawMessage(`{"a":1}`), nested(9999), nested(10001)} {
		j := jobs[i]
		id := fmt.Sprintf("job_%d", i+1)
		if j.JobID != id || j.StepID != "stp_"+id || j.LeaseToken != "tok_"+id || j.MaxAttempts != 3 || j.LeaseMs != 600000 ||
			j.LeaseExpiresAt.IsZero() || j.IdempotencyKey != "key_"+id || !bytes.Equal(j.Input, want) {
			t.Fatalf("job %d: %+v (input %d bytes)", i, j, len(j.Input))
		}
	}
	// And what json.Unmarshal refuses, it refuses too.
	for _, bad := range []string{`{"jobs": [` + claimedJSON("job_1", nested(9999)) + `]} x`,
		`{"jobs": [` + claimedJSON("job_1", nested(9999)) + `,]}`, `{"jobs": {"a": ` + string(nested(10001)) + `}}`} {
		var a claimAnswer
		if err := a.unmarshalDeep([]byte(bad)); err == nil {
			t.Fatalf("read %.60q…", bad)
		}
	}
}

// deepServer is fakeJobs with the server's own refusal of a body nested
// more than 10 000 levels (400 at body), and a first claim answered with
// the given text.
type deepServer struct {
	*fakeJobs
	// claimMu guards claim. Not named mu: that would hide fakeJobs.mu,
	// which guards the reports the tests read (a data race under -race).
	claimMu sync.Mutex
	claim   string // the first claim's answer, then the fake's own
}

func (d *deepServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if len(body) > 0 && !json.Valid(body) {
		apiError(w, 400, CodeInvalidRequest, map[string]any{"validation": []map[string]any{
			{"field": "body", "message": "nests arrays and objects more than 10000 levels deep"}}})
		return
	}
	d.claimMu.Lock()
	claim := d.claim
	if strings.HasSuffix(r.URL.Path, "/claim") {
		d.claim = ""
	}
	d.claimMu.Unlock()
	if claim != "" && strings.HasSuffix(r.URL.Path, "/claim") {
		_, _ = io.WriteString(w, claim)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	d.fakeJobs.ServeHTTP(w, r)
}

func startDeepWorker(t *testing.T, d *deepServer, register func(*Worker)) {
	t.Helper()
	c, _ := testClient(t, d)
	w := NewWorker(c)
	register(w)
	if err := w.Start(context.Background(), StartOptions{Concurrency: 4, PollInterval: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopWithin(t, w, ctx)
	})
}

// The jobs of a claim whose answer nests deeper than encoding/json reads
// run; one whose input alone is deeper than that fails alone, not retried.
func TestWorkerRunsTheJobsOfAClaimNestedDeeperThanEncodingJSONReads(t *testing.T) {
	t.Parallel()
	d := &deepServer{fakeJobs: newFakeJobs(), claim: `{"jobs":[` + claimedJSON("job_1", json.RawMessage(`{"a":1}`)) + "," +
		claimedJSON("job_2", nested(9999)) + "," + claimedJSON("job_3", nested(10001)) + "]}"}
	startDeepWorker(t, d, func(w *Worker) {
		must(t, RegisterTool(w, Tool[json.RawMessage, json.RawMessage]{Name: "deep", Version: "1",
			Handler: func(_ context.Context, in json.RawMessage, _ JobContext) (json.RawMessage, error) { return in, nil }}))
	})
	if rep := d.waitReport(t, "job_1"); rep["status"] != ReportSucceeded {
		t.Fatalf("job_1: %v", rep)
	}
	d.waitReport(t, "job_2")
	d.mu.Lock()
	var echoed struct {
		Status string          `json:"status"`
		Output json.RawMessage `json:"output"`
	}
	err := json.Unmarshal(d.reports["job_2"], &echoed)
	d.mu.Unlock()
	if err != nil || echoed.Status != ReportSucceeded || !bytes.Equal(echoed.Output, nested(9999)) {
		t.Fatalf("job_2: %v %s (%d bytes of output)", err, echoed.Status, len(echoed.Output))
	}
	rep := d.waitReport(t, "job_3")
	e, _ := rep["error"].(map[string]any)
	if rep["status"] != ReportFailed || e["retryable"] != false ||
		!strings.HasPrefix(e["message"].(string), "input does not match the handler's input type") {
		t.Fatalf("job_3: %v", rep)
	}
}

// An output the API cannot take fails its job alone, not retried: one the
// server refuses at body (its report nested more than 10 000 levels), and
// one deeper than encoding/json writes, which made the whole batch of
// reports holding it unencodable (each of its jobs ran again).
func TestWorkerFailsAnOutputNestedDeeperThanTheAPITakesAlone(t *testing.T) {
	t.Parallel()
	d := &deepServer{fakeJobs: newFakeJobs(), claim: `{"jobs":[` + claimedJSON("job_1", json.RawMessage(`9999`)) + "," +
		claimedJSON("job_2", json.RawMessage(`10000`)) + "," + claimedJSON("job_3", json.RawMessage(`10001`)) + "," +
		claimedJSON("job_4", json.RawMessage(`10`)) + "]}"}
	var ready sync.WaitGroup
	ready.Add(4) // every handler returns at once: their reports go together
	startDeepWorker(t, d, func(w *Worker) {
		must(t, RegisterTool(w, Tool[int, any]{Name: "deep", Version: "1",
			Handler: func(_ context.Context, levels int, _ JobContext) (any, error) {
				var out any = "leaf"
				for range levels {
					out = []any{out}
				}
				ready.Done()
				ready.Wait()
				return out, nil
			}}))
	})
	for id, want := range map[string]string{"job_1": "", "job_4": "",
		"job_2": "handler output refused by the server at body",
		"job_3": "output cannot be encoded as JSON: nests arrays and objects more than 10000 levels deep"} {
		d.waitReport(t, id)
		d.mu.Lock()
		var rep struct {
			Status string    `json:"status"`
			Error  *JobError `json:"error"`
		}
		err := json.Unmarshal(d.reports[id], &rep)
		d.mu.Unlock()
		switch {
		case err != nil:
			t.Fatalf("%s: %v", id, err)
		case want == "" && (rep.Status != ReportSucceeded || rep.Error != nil):
			t.Fatalf("%s: %+v", id, rep)
		case want != "" && (rep.Status != ReportFailed || rep.Error == nil || rep.Error.Retryable || rep.Error.Message != want):
			t.Fatalf("%s: %+v %+v", id, rep, rep.Error)
		}
	}
}

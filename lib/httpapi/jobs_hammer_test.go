package httpapi_test

import (
	"fmt"
	"net/http"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// batchReportAnswer is what POST /api/v1/jobs/report answers, as far as
// the tests read it.
type batchReportAnswer struct {
	Results []struct {
		JobID  string `json:"jobId"`
		Status string `json:"status"`
		Error  *struct {
			Code string `json:"code"`
		} `json:"error"`
	} `json:"results"`
}

// Enqueues racing under one idempotencyKey over HTTP: exactly one answers
// 201 (deduplicated false); those of the same operation answer 200 with
// deduplicated true naming its step; any other operation is 409
// idempotency_key_reuse. Half the racers send one input, the others each
// their own, so either kind may win.
func TestHTTPEnqueuesOfOneKeyRacing(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1", "input": 0}) // the endpoint exists
	for round := range 3 {
		runID := e.run()
		const n = 16
		inputs := make([]any, n)
		for i := range inputs {
			inputs[i] = map[string]any{"shared": true}
			if i%2 == 1 {
				inputs[i] = map[string]any{"own": i}
			}
		}
		answers := make([]*apitest.Response, n)
		apitest.StartTogether(n, func(i int) {
			answers[i] = e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest, map[string]any{"name": "send_email",
				"version": "1", "idempotencyKey": fmt.Sprint("k", round), "input": inputs[i]})
		})
		created, stepID, winner := 0, "", any(nil)
		for i, r := range answers {
			switch r.Status {
			case http.StatusCreated, http.StatusOK:
				body := r.JSON()
				require.Equal(t, r.Status == http.StatusOK, body["deduplicated"], "racer %d: %s", i, r.Body)
				if r.Status == http.StatusCreated {
					created++
				}
				if stepID == "" {
					stepID, winner = body["stepId"].(string), inputs[i]
				}
				require.Equal(t, stepID, body["stepId"], "racer %d", i)
				require.Equal(t, winner, inputs[i], "racer %d succeeded with another operation", i)
			case http.StatusConflict:
				require.Equal(t, "idempotency_key_reuse", r.ErrorCode(), "racer %d", i)
			default:
				t.Fatalf("racer %d: %d %s", i, r.Status, r.Body)
			}
		}
		require.Equal(t, 1, created)
		for i, r := range answers {
			if reflect.DeepEqual(inputs[i], winner) {
				require.NotEqual(t, http.StatusConflict, r.Status, "racer %d sent the winning operation", i)
			}
		}
		require.Len(t, e.getRun(runID)["steps"], 1)
	}
}

// POST /api/v1/jobs/report racing single reports of the same jobs over
// HTTP: with the same outcome both answer 200 with it; with different
// outcomes one is recorded and the other is 409 invalid_state (in its slot,
// for the batch). The run's steps say the recorded outcomes.
func TestHTTPBatchReportRacingSingleReports(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	const n = 20
	for i := range n {
		e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": i})
	}
	claimed := e.claim(e.register("send_email@1"), n)
	require.Len(t, claimed, n)
	var reports []map[string]any
	for _, j := range claimed {
		reports = append(reports, map[string]any{"jobId": j["jobId"], "leaseToken": j["leaseToken"], "status": "SUCCEEDED"})
	}
	singles := make([]*apitest.Response, n)
	var batch *apitest.Response
	apitest.StartTogether(n+1, func(i int) {
		if i == n {
			batch = e.Do("POST", "/api/v1/jobs/report", e.worker, map[string]any{"reports": reports})
			return
		}
		body := map[string]any{"status": "SUCCEEDED"}
		if i%2 == 1 {
			body = map[string]any{"status": "FAILED", "error": map[string]any{"message": "no", "retryable": false}}
		}
		singles[i] = e.report(claimed[i], body)
	})
	require.Equal(t, http.StatusOK, batch.Status, "%s", batch.Body)
	var out batchReportAnswer
	batch.Decode(t, &out)
	require.Len(t, out.Results, n)
	want := map[string]string{} // job → the status its step must read
	for i, j := range claimed {
		slot, single := out.Results[i], singles[i]
		require.Equal(t, j["jobId"], slot.JobID)
		switch {
		case i%2 == 0:
			require.Equal(t, http.StatusOK, single.Status, "%s", single.Body)
			require.Equal(t, "SUCCEEDED", single.JSON()["status"])
			require.Nil(t, slot.Error)
			require.Equal(t, "SUCCEEDED", slot.Status)
			want[slot.JobID] = "SUCCEEDED"
		case slot.Error == nil:
			require.Equal(t, http.StatusConflict, single.Status, "job %s: both outcomes accepted: %s", slot.JobID, single.Body)
			require.Equal(t, "invalid_state", single.ErrorCode())
			want[slot.JobID] = "SUCCEEDED"
		default:
			require.Equal(t, http.StatusOK, single.Status, "job %s: both outcomes refused: %s", slot.JobID, single.Body)
			require.Equal(t, "invalid_state", slot.Error.Code)
			want[slot.JobID] = "EXHAUSTED"
		}
	}
	for _, st := range e.getRun(runID)["steps"].([]any) {
		job := st.(map[string]any)["durableJob"].(map[string]any)
		require.Equal(t, want[job["id"].(string)], job["status"], job["id"])
	}
}

package httpapi_test

import (
	"net/http"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// Publications of one tool's same handler version, with the same body,
// racing on two instances each make a contract of their own (contracts are
// immutable; only an Idempotency-Key makes a retry one): their
// contractVersions are 1 to n, none shared or skipped, the list holds
// exactly them, and an enqueue of that version selects the last.
func TestPublicationsOfOneHandlerVersionRacingOnTwoInstances(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	instances := e.twoInstances()
	const racers = 12
	answers := make([]*apitest.Response, racers)
	apitest.StartTogether(racers, func(i int) {
		answers[i] = instances[i%2].Do("POST", "/api/v1/tools/send_email/contracts", e.ws.Key, contractBody("1", nil))
	})
	var versions []int
	for i, r := range answers {
		require.Equal(t, http.StatusCreated, r.Status, "racer %d: %s", i, r.Body)
		versions = append(versions, int(r.JSON()["contractVersion"].(float64)))
	}
	sort.Ints(versions)
	var listed []int
	for _, c := range e.contracts("send_email") {
		listed = append(listed, int(c.(map[string]any)["contractVersion"].(float64)))
	}
	for i := range racers {
		require.Equal(t, i+1, versions[i], "answered %v", versions)
		require.Equal(t, i+1, listed[i], "listed %v", listed)
	}
	require.Len(t, listed, racers)
	step := e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"customerId": "cus_1"}})
	require.EqualValues(t, racers, e.stepOf(step["stepId"].(string))["contractVersion"])
}

// Upgrade replays of one exhausted step, each with the expectedHandlerVersion
// the preview read, racing each other on two instances and publications of
// the tool's target handler version: exactly one replay moves the step to
// the target (200, its handler version), every other is 409, invalid_state
// (the job is queued again) or version_conflict naming the new handler
// version; one audit row; every publication lands with a number of its own.
func TestUpgradeReplaysRacingEachOtherAndPublications(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	instances := e.twoInstances()
	wid := e.register("send_email@1")
	_, stepID := e.exhausted(wid, map[string]any{"customerId": "cus_1"}, 1)
	target := e.publish("send_email", contractBody("2", nil))["contractVersion"]
	upgrade := map[string]any{"acknowledgeDuplicateRisk": true, "targetContractVersion": target,
		"expectedHandlerVersion": e.preview(stepID)["handlerVersion"], "acknowledgeVersionChange": true}
	const replayers, publishers = 10, 4
	answers := make([]*apitest.Response, replayers+publishers)
	apitest.StartTogether(replayers+publishers, func(i int) {
		if i >= replayers {
			answers[i] = instances[i%2].Do("POST", "/api/v1/tools/send_email/contracts", e.ws.Key, contractBody("2", nil))
			return
		}
		answers[i] = instances[i%2].Do("POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, upgrade)
	})
	replayed := 0
	published := map[float64]bool{}
	for i, r := range answers {
		switch {
		case i >= replayers:
			require.Equal(t, http.StatusCreated, r.Status, "publisher %d: %s", i, r.Body)
			published[r.JSON()["contractVersion"].(float64)] = true
		case r.Status == http.StatusOK:
			replayed++
			require.Equal(t, "2", r.JSON()["handlerVersion"], "replayer %d", i)
		case r.Status == http.StatusConflict && r.ErrorCode() == "invalid_state":
		case r.Status == http.StatusConflict && r.ErrorCode() == "version_conflict":
			require.Equal(t, "2", errorDetail(r)["currentHandlerVersion"], "replayer %d", i)
		default:
			t.Fatalf("replayer %d answered %d: %s", i, r.Status, r.Body)
		}
	}
	require.Equal(t, 1, replayed)
	require.Len(t, published, publishers)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM job_replays WHERE step_id = $1`, stepID))
	step := e.stepOf(stepID)
	require.Equal(t, "2", step["version"])
	require.Equal(t, target, step["contractVersion"])
}

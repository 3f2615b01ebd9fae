package httpapi_test

import (
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// Registrations of one WORKER key racing on two instances each make a
// worker of their own, bound to that key: n distinct workerIds, n rows,
// queue health counting n workers of the version, each id claiming for its
// key and 404 for another.
func TestWorkerRegistrationsOfOneKeyRacingOnTwoInstances(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	instances := e.twoInstances()
	e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1", "input": 1}) // queue health lists the version
	const racers = 12
	answers := make([]*apitest.Response, racers)
	apitest.StartTogether(racers, func(i int) {
		answers[i] = instances[i%2].Do("POST", "/api/v1/workers/register", e.worker,
			map[string]any{"tools": []any{map[string]any{"name": "send_email", "version": "1"}}})
	})
	ids := map[string]bool{}
	for i, r := range answers {
		require.Equal(t, http.StatusCreated, r.Status, "racer %d: %s", i, r.Body)
		ids[r.JSON()["workerId"].(string)] = true
	}
	require.Len(t, ids, racers, "every registration a worker of its own")
	require.Equal(t, racers, e.count(`SELECT count(*) FROM job_workers WHERE workspace_id = $1 AND key_id = $2`,
		e.ws.ID, e.Must(http.StatusOK, "GET", "/api/v1/keys/current", e.worker, nil).JSON()["id"]))
	var health struct {
		Data []struct {
			Name, Version string
			WorkersSeen   int `json:"workersSeen"`
		} `json:"data"`
	}
	e.Must(http.StatusOK, "GET", "/api/v1/queue/health", e.ingest, nil).Decode(t, &health)
	require.Len(t, health.Data, 1)
	require.Equal(t, racers, health.Data[0].WorkersSeen)
	otherWorker := e.Key(e.ws, map[string]any{"name": "other", "preset": "WORKER", "tools": []string{"send_email@1"}})
	for id := range ids {
		e.Must(http.StatusOK, "POST", "/api/v1/workers/"+id+"/claim", e.worker, map[string]any{"limit": 1})
		e.Must(http.StatusNotFound, "POST", "/api/v1/workers/"+id+"/claim", otherWorker, map[string]any{"limit": 1})
	}
}

// Signups racing on two instances each get a workspace and an operator key
// of their own: distinct workspaces, keys and secrets, each key the only one
// its workspace lists, each workspace seeded with the same starter policies.
// With SIGNUP_RATE_PER_HOUR set on both, a burst admits exactly the rate.
func TestSignupsRacingOnTwoInstances(t *testing.T) {
	t.Parallel()
	// An hour of its own keeps the signup bucket apart from other tests'
	// and from this test's earlier runs.
	now := time.Date(2040, 1, 1, 0, 30, 0, 0, time.UTC).Add(time.Duration(rand.N(1_000_000)) * time.Hour)
	const rate, racers = 5, 12
	var instances []*apitest.Env
	for range 2 {
		instances = append(instances, apitest.Start(t, apitest.WithNow(func() time.Time { return now })))
	}
	answers := make([]*apitest.Response, racers)
	apitest.StartTogether(racers, func(i int) {
		answers[i] = instances[i%2].Do("POST", "/api/v1/workspaces", "", map[string]any{"name": "raced"})
	})
	workspaces, keys, secrets := map[string]bool{}, map[string]bool{}, map[string]bool{}
	var policies []any
	for i, r := range answers {
		require.Equal(t, http.StatusCreated, r.Status, "racer %d: %s", i, r.Body)
		var out struct {
			WorkspaceID string `json:"workspace_id"`
			Key         struct{ ID, Secret string }
		}
		r.Decode(t, &out)
		workspaces[out.WorkspaceID], keys[out.Key.ID], secrets[out.Key.Secret] = true, true, true
		env := instances[(i+1)%2]
		require.Equal(t, out.Key.ID, env.Must(http.StatusOK, "GET", "/api/v1/keys/current", out.Key.Secret, nil).JSON()["id"])
		listed := env.Must(http.StatusOK, "GET", "/api/v1/keys", out.Key.Secret, nil).JSON()["data"].([]any)
		require.Len(t, listed, 1, "racer %d", i)
		require.Equal(t, out.Key.ID, listed[0].(map[string]any)["id"])
		seeded := env.Must(http.StatusOK, "GET", "/api/v1/policies", out.Key.Secret, nil).JSON()["data"].([]any)
		if policies == nil {
			policies = seeded
		}
		require.Equal(t, len(policies), len(seeded), "racer %d", i)
	}
	require.NotEmpty(t, policies, "starter policies")
	require.Len(t, workspaces, racers)
	require.Len(t, keys, racers)
	require.Len(t, secrets, racers)

	for i := range instances {
		instances[i] = apitest.Start(t, apitest.WithNow(func() time.Time { return now }),
			apitest.WithConfig(func(c *config.Config) { c.SignupRatePerHour = rate }))
	}
	apitest.StartTogether(racers, func(i int) {
		answers[i] = instances[i%2].Do("POST", "/api/v1/workspaces", "", map[string]any{"name": "limited"})
	})
	require.Equal(t, rate, countAdmitted(t, answers, http.StatusCreated))
}

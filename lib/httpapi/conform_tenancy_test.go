package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/ids"
)

// API.md §0: "A cross-tenant or unknown id is always 404 not_found, never a
// hint." On every route of the table that takes an id in its path (a new
// one fails here until it has a case): another workspace's operator, with a
// body the route would take, is answered exactly as for an id that names
// nothing, and the owner's objects are left as they were.
func TestConformanceAnotherWorkspacesIDIsAnUnknownIDOnEveryRoute(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	a := e.ws.Key
	b := e.Signup().Key

	effect := e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", a,
		map[string]any{"effect_type": "t.x", "idempotency_key": "k"}).JSON()
	e.Must(http.StatusOK, "PUT", "/api/v1/policies/t.held", a, map[string]any{"mode": "require_approval"})
	approval := e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", a,
		map[string]any{"effect_type": "t.held", "idempotency_key": "h"}).JSON()["approval_id"].(string)
	key := e.Must(http.StatusCreated, "POST", "/api/v1/keys", a, map[string]any{"name": "k", "preset": "AGENT"}).JSON()["id"].(string)
	group := e.Must(http.StatusCreated, "POST", "/api/v1/groups", a, map[string]any{"name": "g"}).JSON()["id"].(string)
	hook := e.Must(http.StatusCreated, "POST", "/api/v1/webhooks", a,
		map[string]any{"url": "https://example.com/h", "events": []string{"run.finished"}}).JSON()["id"].(string)
	runID := e.run()
	st := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{}})
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 2}})
	worker := e.register("send_email@1")
	job := e.claim(worker, 1)[0]
	endpoint := e.Must(http.StatusOK, "POST", "/api/v1/endpoints", a, map[string]any{"name": "send_email"}).JSON()

	real := map[string]string{
		"effects": effect["effect_id"].(string), "approvals": approval, "keys": key, "groups": group, "webhooks": hook,
		"runs": runID, "steps": st["stepId"].(string), "workers": worker, "jobs": job["jobId"].(string),
		"endpoints": endpoint["id"].(string),
	}
	prefix := map[string]string{
		"effects": ids.Effect, "approvals": ids.Approval, "keys": ids.Key, "groups": ids.Group, "webhooks": ids.Webhook,
		"runs": ids.Run, "steps": ids.Step, "workers": ids.Worker, "jobs": ids.Job, "endpoints": ids.Endpoint,
	}
	bodies := map[string]any{
		"effects.report":            map[string]any{"lease_token": effect["lease_token"], "outcome": "succeeded"},
		"effects.heartbeat":         map[string]any{"lease_token": effect["lease_token"]},
		"effects.resolve":           map[string]any{"outcome": "succeeded"},
		"approvals.approve":         map[string]any{"note": "n"},
		"approvals.reject":          map[string]any{"note": "n"},
		"webhooks.update":           map[string]any{"disabled": true},
		"webhooks.deliveries.retry": map[string]any{"delivery_ids": []string{ids.New(ids.Delivery)}},
		"runs.enqueue":              map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 3}},
		"steps.replay":              ack,
		"workers.claim":             map[string]any{"limit": 1},
		"jobs.heartbeat":            map[string]any{"leaseToken": job["leaseToken"]},
		"jobs.report":               map[string]any{"leaseToken": job["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{}},
		"endpoints.policy.put":      map[string]any{"expectedVersion": endpoint["version"], "maxConcurrent": 1},
	}
	reads := func() map[string]string {
		out := map[string]string{}
		for name, path := range map[string]string{
			"effect": "/api/v1/effects/" + real["effects"], "approval": "/api/v1/approvals/" + approval,
			"keys": "/api/v1/keys", "group": "/api/v1/groups/" + group, "webhook": "/api/v1/webhooks/" + hook,
			"run": "/api/v1/runs/" + runID, "endpoint": "/api/v1/endpoints/" + real["endpoints"] + "/policy",
		} {
			out[name] = string(e.Must(http.StatusOK, "GET", path, a, nil).Body)
		}
		return out
	}
	before := reads()

	checked := 0
	for _, r := range httpapi.Routes() {
		parts := strings.Split(r.Pattern, "/")
		for i, p := range parts {
			if p != "{id}" && p != "{workerId}" {
				continue
			}
			kind := parts[i-1]
			require.Contains(t, real, kind, "%s %s: no case for its id", r.Method, r.Pattern)
			theirs := append([]string(nil), parts...)
			theirs[i] = real[kind]
			unknown := append([]string(nil), parts...)
			unknown[i] = ids.New(prefix[kind])
			body := bodies[r.Name]
			cross := e.Do(r.Method, strings.Join(theirs, "/"), b, body)
			require.Equal(t, http.StatusNotFound, cross.Status, "%s %s: %s", r.Method, r.Pattern, cross.Body)
			require.Equal(t, apierr.CodeNotFound, cross.ErrorCode())
			none := e.Must(http.StatusNotFound, r.Method, strings.Join(unknown, "/"), b, body)
			require.Equal(t, none.JSON()["error"], cross.JSON()["error"], "%s %s: answered as an unknown id", r.Method, r.Pattern)
			checked++
		}
	}
	require.Greater(t, checked, 35)
	require.Equal(t, before, reads(), "the other workspace changed nothing")
	// The owner's lease tokens still hold.
	e.Must(http.StatusOK, "POST", "/api/v1/effects/"+real["effects"]+"/report", a,
		map[string]any{"lease_token": effect["lease_token"], "outcome": "succeeded"})
	require.Equal(t, http.StatusOK, e.report(job, map[string]any{"status": "SUCCEEDED", "output": map[string]any{}}).Status)
}

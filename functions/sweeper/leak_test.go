package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// The deployed sweeper's process, as Lambda runs it, logs nothing a caller
// chose (lib/sdktest's TestTheSweeperLogsNothingUserControlled, through
// the runtime API): it delivers a marked event to a receiver that fails
// with marks in its body and headers, under a URL whose path and query
// carry marks, on a scheduled event that carries marks itself; then a
// pass fails on an error quoting a marked URL (apitest.RefuseMarked), its
// task logged, and the invocation's error, which Lambda logs, names no
// value either.
func TestTheFunctionLogsNothingUserControlled(t *testing.T) {
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.WebhookAllowPrivateNetworks = true }))
	var n atomic.Int64 // the receiver marks its answers from its own goroutines
	c := func(label string) string { return apitest.Marked(label, int(n.Add(1))) }
	ws := env.Signup()
	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Leak", c("receiverheader"))
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":"` + c("receiverbody") + `"}`))
	}))
	t.Cleanup(receiver.Close)
	hook := func(label string) {
		env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key, map[string]any{
			"url": receiver.URL + "/" + c(label) + "?token=" + c("query"), "events": []string{"approval.requested"}})
	}
	approval := func() {
		env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{"effect_type": "wire.send",
			"idempotency_key": c("key"), "payload": map[string]any{"to": c("payload")}, "cost_micros": 5000})
	}
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/wire.send", ws.Key, map[string]any{"mode": "allow",
		"approval_above_micros": 1000})
	hook("hookpath")
	approval()

	rt := apitest.NewLambdaRuntime(t)
	logs := rt.StartFunction(t, "WEBHOOK_ALLOW_PRIVATE_NETWORKS=true")
	scheduled := events.EventBridgeEvent{Version: "0", ID: c("eventid"), DetailType: "Scheduled Event", Source: "aws.events",
		Region: "us-east-1", Time: time.Now().UTC(), Detail: json.RawMessage(`{"x":"` + c("detail") + `"}`)}
	a := rt.Invoke(t, scheduled)
	require.False(t, a.Error, "a function error: %s", a.Payload)
	require.NotZero(t, hits.Load(), "the receiver was called: %s", a.Payload)

	apitest.RefuseMarked(t, env.App.Pool)
	hook("raiseme")
	approval()
	a = rt.Invoke(t, scheduled)
	require.True(t, a.Error, "the pass failed: %s", a.Payload)
	apitest.RequireNoLeak(t, string(a.Payload), nil, "sweep: 1 task(s) failed")
	apitest.RequireNoLeak(t, logs(), nil, `"msg":"sweep task failed"`, `"task":"webhooks.deliver"`, "SQLSTATE P0001")
}

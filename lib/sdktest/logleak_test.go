package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// canary is the mark every user-controlled value of TestNothingUserControlledIsLogged
// carries: no log line may hold it, whole or in part past it.
const canary = apitest.Mark

// TestNothingUserControlledIsLogged runs a wide scenario (gate, approvals,
// groups, reconcile, jobs, contracts, webhooks against a failing receiver,
// refusals, database errors mid-request, sealed values that cannot be
// opened, panics mid-request, route errors whose text quotes a request's
// value, MCP tool calls, the sweeper, and the Go SDK worker's default
// failure log) at the most verbose log level, every value the caller
// chooses marked with canary, and holds every captured line to "never log
// payloads, inputs, outputs, keys or full error bodies": no canary, no API
// key secret, no lease token (nor either half of one). Its siblings below
// (the sweeper on a moved clock, the Python and TypeScript workers) and in
// functions/api, functions/sweeper, functions/mcp and lib/vercel (each
// entry point as deployed) share its mark and check (apitest.RequireNoLeak).
// Not parallel: the SDK worker's default log is slog.Default, swapped here.
func TestNothingUserControlledIsLogged(t *testing.T) {
	var logs apitest.LockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	previous := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(previous) })

	env := apitest.Start(t, apitest.WithLogger(logger),
		apitest.WithConfig(func(c *config.Config) { c.WebhookAllowPrivateNetworks = true }))
	s := &leakScenario{t: t, env: env}
	s.run(logger)

	out := logs.String()
	// The lines that had a value at hand were written (else the test holds nothing):
	// the SDK worker's default log, the statement timeout, the cancelled request, a request line.
	apitest.RequireNoLeak(t, out, s.secrets, `msg="ratchet worker" error=*ratchet.PanicError`,
		`msg="ratchet worker" report=not_recorded`, "code=lease_expired", `msg="ratchet worker refused" error=api status=401`,
		`msg="ratchet worker" error=network kind="unreadable answer" method=POST`, "SQLSTATE 57014",
		"status=499", "route=jobs.report status=409",
		`msg=panic`, `panic="a string, its value withheld from logs"`, `panic="a *errors.errorString, its value withheld from logs"`,
		"route=effects.begin err=", "SQLSTATE 22P02", "SQLSTATE P0001", "SQLSTATE RTZ99",
		"route=mcp.post status=200", "route=effects.report status=409",
		"result_unreadable", "webhook signing secret cannot be opened", "claim passed over a job whose input")
	require.GreaterOrEqual(t, strings.Count(out, `error=*ratchet.PanicError`), 2, "the handler's panic and the classifier's")
	t.Logf("%d log lines checked, %d secrets", strings.Count(out, "\n"), len(s.secrets))
}

// leakScenario drives TestNothingUserControlledIsLogged: c(label) is a
// fresh canary value, and secrets gathers what the server mints (keys,
// lease tokens, webhook secrets) that the log must not hold either.
type leakScenario struct {
	t       *testing.T
	env     *apitest.Env
	key     string       // the workspace's operator key
	gateKey string       // an effect's idempotency key
	effect  string       // its effect, succeeded with a marked result
	hook    string       // a webhook whose deliveries fail
	n       atomic.Int64 // c's count: receivers and proxies mark their answers from their own goroutines
	secrets []string
}

func (s *leakScenario) c(label string) string {
	return apitest.Marked(label, int(s.n.Add(1)))
}

func (s *leakScenario) secret(v any) string {
	str, _ := v.(string)
	require.NotEmpty(s.t, str)
	s.secrets = append(s.secrets, str)
	return str
}

func (s *leakScenario) do(method, path, key string, body any, header ...string) map[string]any {
	s.t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	r := s.env.DoWith(method, path, key, h, body)
	s.t.Logf("%s %s → %d %.300s", method, path, r.Status, r.Body)
	return r.JSON()
}

func (s *leakScenario) run(logger *slog.Logger) {
	s.workspaceAndKeys()
	s.gate()
	s.groupsAndReconcile()
	s.jobs()
	s.sdkWorker()
	s.webhooks()
	s.unreadable()
	s.failingRequests(logger)
	s.panics()
	s.quotingErrors()
	s.mcpTools()
	res := s.env.App.Sweeper.RunOnce(context.Background())
	s.t.Logf("sweep: %+v", res)
}

func (s *leakScenario) workspaceAndKeys() {
	ws := s.do("POST", "/api/v1/workspaces", "", map[string]any{"name": s.c("workspace")})
	s.key = s.secret(ws["key"].(map[string]any)["secret"])
	k := s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": s.c("keyname"), "preset": "AGENT"},
		"Idempotency-Key", s.c("idemheader"))
	s.secret(k["secret"])
	// A request with a key that does not exist, and one malformed.
	s.do("GET", "/api/v1/effects", "rk_live_"+s.c("badkey"), nil)
	s.do("GET", "/api/v1/effects", s.c("garbagekey"), nil)
	// The same Idempotency-Key with another body: a conflict.
	s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": s.c("keyname2"), "preset": "AGENT"},
		"Idempotency-Key", s.c("idemheader"))
}

func (s *leakScenario) gate() {
	typ := "email.send"
	s.do("PUT", "/api/v1/policies/"+typ, s.key, map[string]any{"mode": "allow", "on_indeterminate": "block",
		"approval_above_micros": 1000, "required_dimensions": []string{"recipient"}})
	begin := func(key string, cost int, payload map[string]any) map[string]any {
		return s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": typ,
			"idempotency_key": key, "payload": payload, "cost_micros": cost,
			"dimensions": map[string]any{"recipient": s.c("dimension")}})
	}
	// Execute, report a success with a result.
	key := s.c("gatekey")
	s.gateKey = key
	b := begin(key, 10, map[string]any{"to": s.c("payload")})
	id, _ := b["effect_id"].(string)
	s.effect = id
	token := s.secret(b["lease_token"])
	s.do("POST", "/api/v1/effects/"+id+"/heartbeat", s.key, map[string]any{"lease_token": token})
	s.do("POST", "/api/v1/effects/"+id+"/report", s.key, map[string]any{"lease_token": token,
		"outcome": "succeeded", "result": map[string]any{"message_id": s.c("result")}})
	begin(key, 10, map[string]any{"to": s.c("payload-reuse")}) // idempotency_key_reuse
	begin(key, 10, map[string]any{"to": s.c("payload")})       // duplicate
	// A failed report with error text, then a report under a token not its own.
	b = begin(s.c("gatekey-failed"), 10, map[string]any{"to": s.c("payload")})
	id, _ = b["effect_id"].(string)
	token = s.secret(b["lease_token"])
	s.do("POST", "/api/v1/effects/"+id+"/report", s.key, map[string]any{"lease_token": s.c("wrongtoken"),
		"outcome": "failed", "result": map[string]any{"error": s.c("reporterror")}})
	s.do("POST", "/api/v1/effects/"+id+"/report", s.key, map[string]any{"lease_token": token,
		"outcome": "failed", "result": map[string]any{"error": s.c("reporterror")}})
	// An approval, approved with a note; another rejected with one.
	for _, decide := range []string{"approve", "reject"} {
		b = begin(s.c("gatekey-approval"), 5000, map[string]any{"to": s.c("payload")})
		approval, _ := b["approval_id"].(string)
		s.do("POST", "/api/v1/approvals/"+approval+"/"+decide, s.key, map[string]any{"note": s.c("approvalnote")})
	}
	// An indeterminate effect (a lease that lapsed), resolved with a note.
	s.do("PUT", "/api/v1/policies/sms.send", s.key, map[string]any{"mode": "allow", "on_indeterminate": "block",
		"lease_seconds": 5})
	b = s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "sms.send",
		"idempotency_key": s.c("gatekey-lapse"), "payload": map[string]any{"to": s.c("payload")}, "lease_seconds": 1})
	id, _ = b["effect_id"].(string)
	if tok, ok := b["lease_token"].(string); ok {
		s.secret(tok)
	}
	s.waitEffectState(id, "indeterminate")
	s.do("POST", "/api/v1/effects/"+id+"/resolve", s.key, map[string]any{"outcome": "succeeded",
		"result": map[string]any{"found": s.c("resolveresult")}, "note": s.c("resolvenote")})
	// Bad input that a refusal may quote: a key too long, an effect type, a payload that is not an object.
	begin(strings.Repeat(s.c("longkey"), 40), 10, map[string]any{"to": s.c("payload")})
	s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": s.c("Bad Type!"),
		"idempotency_key": s.c("gatekey"), "payload": s.c("payloadstring")})
	s.do("POST", "/api/v1/effects/begin", s.key, `{"effect_type":"email.send","idempotency_key":"`+s.c("broken")+`",`)
}

func (s *leakScenario) waitEffectState(id, state string) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		e := s.do("GET", "/api/v1/effects/"+id, s.key, nil)
		if e["state"] == state {
			return
		}
		require.True(s.t, time.Now().Before(deadline), "effect %s never %s: %v", id, state, e)
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *leakScenario) groupsAndReconcile() {
	g := s.do("POST", "/api/v1/groups", s.key, map[string]any{"name": s.c("groupname")})
	gid, _ := g["id"].(string)
	b := s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "charge.create",
		"idempotency_key": s.c("groupkey"), "payload": map[string]any{"amount": s.c("payload")}, "group_id": gid,
		"compensation": map[string]any{"effect_type": "charge.refund", "payload": map[string]any{"why": s.c("compensation")}}})
	id, _ := b["effect_id"].(string)
	if tok, ok := b["lease_token"].(string); ok {
		s.do("POST", "/api/v1/effects/"+id+"/report", s.key, map[string]any{"lease_token": s.secret(tok),
			"outcome": "succeeded", "result": map[string]any{"charge": s.c("result")}})
	}
	s.do("POST", "/api/v1/groups/"+gid+"/unwind", s.key, nil)
	now := time.Now().UTC()
	for _, status := range []string{"succeeded", s.c("reconcilestatus")} {
		s.do("POST", "/api/v1/reconcile", s.key, map[string]any{"effect_type": "charge.create",
			"from": now.Add(-time.Hour).Format(time.RFC3339), "to": now.Add(time.Hour).Format(time.RFC3339),
			"records": []map[string]any{
				{"idempotency_key": s.c("reconcilekey"), "status": "succeeded", "amount_micros": 5},
				{"idempotency_key": s.c("groupkey"), "status": status, "amount_micros": 7},
			}})
	}
	s.do("POST", "/api/v1/circuits/email.send/open", s.key, map[string]any{"action": "deny", "reason": s.c("circuitreason")})
	s.do("POST", "/api/v1/circuits/email.send/close", s.key, nil)
}

func (s *leakScenario) jobs() {
	tool := s.c("tool")
	s.do("POST", "/api/v1/tools/"+tool+"/contracts", s.key, map[string]any{"handlerVersion": "1",
		"inputSchema": map[string]any{"type": "object", "description": s.c("schema"),
			"properties": map[string]any{"to": map[string]any{"type": "string", "pattern": "^" + canary + "_", "description": s.c("pattern")}}},
		"outputSchema": map[string]any{"type": "object", "title": s.c("outschema")}, "status": "ACTIVE"})
	// Schemas a library may refuse quoting what it was given: a pattern
	// that is no regular expression, a $ref and a format it does not know,
	// a $schema it does not take (another tool's, this one's latest contract stays).
	other := s.c("othertool")
	for _, bad := range []map[string]any{
		{"type": "string", "pattern": "(" + s.c("badpattern")},
		{"$ref": "#/" + s.c("badref")},
		{"$ref": "https://" + s.c("remote") + ".example/s.json"},
		{"type": "string", "format": s.c("format")},
		{"$schema": "https://" + s.c("dialect") + ".example/schema"},
		{"type": s.c("type")},
		{"enum": s.c("enum")},
	} {
		s.do("POST", "/api/v1/tools/"+other+"/contracts", s.key, map[string]any{"handlerVersion": "1",
			"inputSchema": bad, "outputSchema": bad})
	}
	run := s.do("POST", "/api/v1/runs", s.key, map[string]any{"name": s.c("runname")}, "Idempotency-Key", s.c("runheader"))
	runID, _ := run["id"].(string)
	enqueue := func(name string, input map[string]any, extra map[string]any) map[string]any {
		body := map[string]any{"name": name, "version": "1", "input": input, "endpoint": s.c("endpoint"),
			"idempotencyKey": s.c("jobkey"), "maxAttempts": 1}
		for k, v := range extra {
			body[k] = v
		}
		return s.do("POST", "/api/v1/runs/"+runID+"/steps", s.key, body)
	}
	ok := enqueue(tool, map[string]any{"to": s.c("input")}, map[string]any{"contractVersion": 1})
	enqueue(tool, map[string]any{"to": "x" + s.c("input-refused")}, map[string]any{"contractVersion": 1}) // schema refusal
	failing := enqueue(tool, map[string]any{"to": s.c("input")}, nil)
	enqueue(s.c("Bad Tool Name!"), map[string]any{"to": s.c("input")}, nil)
	s.do("POST", "/api/v1/tools/"+tool+"/test", s.key, map[string]any{"version": "1", "input": map[string]any{"to": s.c("testinput")}})

	worker := s.secret(s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": s.c("workerkey"), "preset": "WORKER",
		"tools": []string{tool + "@1"}})["secret"])
	reg := s.do("POST", "/api/v1/workers/register", worker, map[string]any{"tools": []map[string]any{{"name": tool, "version": "1"}}},
		"Idempotency-Key", s.c("registerheader"))
	wid, _ := reg["workerId"].(string)
	claimed := map[string]string{} // step id → job id
	tokens := map[string]string{}
	for i := 0; i < 5 && len(claimed) < 3; i++ {
		c := s.do("POST", "/api/v1/workers/"+wid+"/claim", worker, map[string]any{"limit": 10, "waitSeconds": 0})
		jobs, _ := c["jobs"].([]any)
		for _, j := range jobs {
			job := j.(map[string]any)
			step, _ := job["stepId"].(string)
			claimed[step], _ = job["jobId"].(string)
			tokens[step] = s.secret(job["leaseToken"])
		}
	}
	report := func(step, status string, extra map[string]any) {
		body := map[string]any{"leaseToken": tokens[step], "status": status}
		for k, v := range extra {
			body[k] = v
		}
		s.do("POST", "/api/v1/jobs/"+claimed[step]+"/heartbeat", worker, map[string]any{"leaseToken": tokens[step]})
		s.do("POST", "/api/v1/jobs/"+claimed[step]+"/report", worker, body)
	}
	okStep, _ := ok["stepId"].(string)
	failStep, _ := failing["stepId"].(string)
	if _, found := claimed[okStep]; found {
		report(okStep, "SUCCEEDED", map[string]any{"output": map[string]any{"sent": s.c("output")}})
	}
	if _, found := claimed[failStep]; found {
		s.do("POST", "/api/v1/jobs/"+claimed[failStep]+"/report", worker, map[string]any{"leaseToken": s.c("staletoken"),
			"status": "FAILED", "error": map[string]any{"message": s.c("failmessage")}})
		report(failStep, "FAILED", map[string]any{"error": map[string]any{"message": s.c("failmessage"), "retryable": false}})
	}
	for step := range claimed {
		if step != okStep && step != failStep {
			report(step, "FAILED", map[string]any{"output": map[string]any{"x": s.c("badoutput")},
				"error": map[string]any{"message": s.c("failmessage"), "retryAfterMs": 1}})
		}
	}
	if failStep != "" {
		s.do("POST", "/api/v1/steps/"+failStep+"/replay", s.key, map[string]any{"acknowledgeDuplicateRisk": true,
			"maxAttempts": 1, "reason": s.c("replayreason")}, "Idempotency-Key", s.c("replayheader"))
	}
	s.do("POST", "/api/v1/runs/"+runID+"/finish", s.key, nil)
}

// sdkWorker runs the Go SDK's worker without OnError, so its default
// failure log (slog.Default, captured) writes what goes wrong: a handler
// that panics with a canary, then one that fails with one; since the log
// writes one line a minute, each next problem in a worker of its own: a
// classifier that panics with a canary, claims answered unreadably then
// refused (refusedGoWorker), and reports refused with a marked message and
// detail.
func (s *leakScenario) sdkWorker() {
	var calls atomic.Int32
	s.goWorker(2, func(in map[string]any) (map[string]any, error) {
		if calls.Add(1) == 1 {
			panic(fmt.Sprint(in["to"]))
		}
		return nil, errors.New(fmt.Sprint(in["to"]))
	}, nil, nil)
	s.goWorker(1, func(in map[string]any) (map[string]any, error) { return nil, errors.New(fmt.Sprint(in["to"])) },
		func(err error, _ ratchet.JobContext) ratchet.Decision { panic(err.Error()) }, nil)
	s.refusedGoWorker()
	s.goWorker(1, func(in map[string]any) (map[string]any, error) { return map[string]any{"sent": in["to"]}, nil }, nil,
		func(r *http.Request) *http.Response {
			if !strings.HasSuffix(r.URL.Path, "/report") {
				return nil
			}
			body := fmt.Sprintf(`{"error":{"code":"lease_expired","message":"%s","detail":{"x":"%s"}}}`,
				s.c("reportmessage"), s.c("reportdetail"))
			return &http.Response{StatusCode: http.StatusConflict, Request: r, Body: io.NopCloser(strings.NewReader(body)),
				Header: http.Header{"Content-Type": {"application/json"}}}
		})
}

// refusedGoWorker runs a Go SDK worker whose claims are answered with a
// marked body that is not JSON (past the client's retries), then refused
// as a revoked key's with a marked message, which stops it.
func (s *leakScenario) refusedGoWorker() {
	ctx := context.Background()
	tool := s.c("sdktool")
	key := s.secret(s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": "sdk", "preset": "WORKER",
		"tools": []string{tool + "@1"}})["secret"])
	var claims atomic.Int32
	hc := &http.Client{Transport: answering{next: s.env.Server.Client().Transport, answer: func(r *http.Request) *http.Response {
		if !strings.HasSuffix(r.URL.Path, "/claim") {
			return nil
		}
		status, body := http.StatusOK, s.c("garbledclaim")+` {"jobs":[`
		if claims.Add(1) > garbledClaims {
			status, body = http.StatusUnauthorized, fmt.Sprintf(`{"error":{"code":"unauthorized","message":"%s","detail":{}}}`,
				s.c("claimmessage"))
		}
		return &http.Response{StatusCode: status, Request: r, Body: io.NopCloser(strings.NewReader(body)),
			Header: http.Header{"Content-Type": {"application/json"}}}
	}}}
	client, err := ratchet.NewClient(ratchet.Config{BaseURL: s.env.Server.URL, APIKey: key, HTTPClient: hc})
	require.NoError(s.t, err)
	w := ratchet.NewWorker(client)
	require.NoError(s.t, ratchet.RegisterTool(w, ratchet.Tool[map[string]any, map[string]any]{Name: tool, Version: "1",
		Handler: func(context.Context, map[string]any, ratchet.JobContext) (map[string]any, error) { return nil, nil }}))
	require.NoError(s.t, w.Start(ctx, ratchet.StartOptions{PollInterval: 50 * time.Millisecond}))
	select {
	case <-w.Done():
	case <-time.After(time.Minute):
		s.t.Fatal("the refused worker never stopped")
	}
}

// answering answers a request itself when answer does, else sends it on.
type answering struct {
	answer func(*http.Request) *http.Response
	next   http.RoundTripper
}

func (a answering) RoundTrip(r *http.Request) (*http.Response, error) {
	if res := a.answer(r); res != nil {
		return res, nil
	}
	return a.next.RoundTrip(r)
}

// goWorker runs a Go SDK worker of a tool of its own (handle, classify) on
// jobs marked inputs, until it ran n of them; answer, when set, answers
// the worker's requests it says it answers.
func (s *leakScenario) goWorker(n int, handle func(map[string]any) (map[string]any, error),
	classify func(error, ratchet.JobContext) ratchet.Decision, answer func(*http.Request) *http.Response) {
	ctx := context.Background()
	tool := s.c("sdktool")
	key := s.secret(s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": "sdk", "preset": "WORKER",
		"tools": []string{tool + "@1"}})["secret"])
	hc := s.env.Server.Client()
	if answer != nil {
		hc = &http.Client{Transport: answering{answer: answer, next: hc.Transport}}
	}
	client, err := ratchet.NewClient(ratchet.Config{BaseURL: s.env.Server.URL, APIKey: key, HTTPClient: hc})
	require.NoError(s.t, err)
	w := ratchet.NewWorker(client)
	handled := make(chan struct{}, n)
	require.NoError(s.t, ratchet.RegisterTool(w, ratchet.Tool[map[string]any, map[string]any]{Name: tool, Version: "1",
		Handler: func(_ context.Context, in map[string]any, _ ratchet.JobContext) (map[string]any, error) {
			defer func() { handled <- struct{}{} }()
			return handle(in)
		}, ClassifyError: classify}))
	require.NoError(s.t, w.Start(ctx, ratchet.StartOptions{Concurrency: 2, PollInterval: 50 * time.Millisecond}))
	run := s.do("POST", "/api/v1/runs", s.key, map[string]any{"name": s.c("sdkrun")})
	runID, _ := run["id"].(string)
	for i := 0; i < n; i++ {
		s.do("POST", "/api/v1/runs/"+runID+"/steps", s.key, map[string]any{"name": tool, "version": "1",
			"input": map[string]any{"to": s.c("sdkinput")}, "maxAttempts": 1})
	}
	for i := 0; i < n; i++ {
		select {
		case <-handled:
		case <-time.After(20 * time.Second):
			s.t.Fatal("the SDK worker never ran its jobs")
		}
	}
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = w.Stop(stop)
}

// webhooks subscribes a receiver that answers 500 with a canary in its
// body and headers, under a URL whose user info and query carry canaries,
// and has the sweeper deliver to it.
func (s *leakScenario) webhooks() {
	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Leak", s.c("receiverheader"))
		w.Header().Set("Location", "http://"+s.c("receiverlocation")+".example/")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":"` + s.c("receiverbody") + `"}`))
	}))
	s.t.Cleanup(receiver.Close)
	u, err := url.Parse(receiver.URL)
	require.NoError(s.t, err)
	u.User = url.UserPassword(s.c("webhookuser"), s.c("webhookpass"))
	s.do("POST", "/api/v1/webhooks", s.key, map[string]any{"url": u.String(), "events": []string{"approval.requested"}})
	u.User = nil
	u.Path = "/" + s.c("webhookpath")
	u.RawQuery = "token=" + s.c("webhookquery")
	hook := s.do("POST", "/api/v1/webhooks", s.key, map[string]any{"url": u.String(), "events": []string{"approval.requested"}},
		"Idempotency-Key", s.c("webhookheader"))
	if sec, ok := hook["secret"].(string); ok {
		s.secret(sec)
	}
	hookID, _ := hook["id"].(string)
	s.hook = hookID
	s.do("POST", "/api/v1/webhooks", s.key, map[string]any{"url": "http://" + s.c("unresolvable") + ".invalid/?k=" + s.c("q"),
		"events": []string{"approval.requested"}})
	// An approval.requested event, then passes of the sweeper until the receiver was called.
	s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "email.send",
		"idempotency_key": s.c("gatekey-hook"), "payload": map[string]any{"to": s.c("payload")}, "cost_micros": 5000,
		"dimensions": map[string]any{"recipient": s.c("dimension")}})
	deadline := time.Now().Add(15 * time.Second)
	for hits.Load() == 0 && time.Now().Before(deadline) {
		s.env.App.Sweeper.RunOnce(context.Background())
		time.Sleep(100 * time.Millisecond)
	}
	require.NotZero(s.t, hits.Load(), "the receiver was called")
	s.do("GET", "/api/v1/webhooks/"+hookID+"/deliveries", s.key, nil)
	s.do("PATCH", "/api/v1/webhooks/"+hookID, s.key, map[string]any{"url": "ftp://" + s.c("badurl")})
	if rot, ok := s.do("POST", "/api/v1/webhooks/"+hookID+"/rotate-secret", s.key, nil)["secret"].(string); ok {
		s.secret(rot)
	}
}

// unreadable garbles sealed values the scenario marked, as a disk or a
// botched restore would, so that the lines saying a value cannot be opened
// are written: the succeeded effect's result (its tag), read back and
// answered to a duplicate begin; the failing webhook's signing secret (its
// tag), then a delivery to it; and a job's input (its key id: a key this
// instance is not configured with), which a claim passes over.
func (s *leakScenario) unreadable() {
	ctx := context.Background()
	garble := func(sql string, args ...any) {
		tag, err := s.env.App.Pool.Exec(ctx, sql, args...)
		require.NoError(s.t, err)
		require.EqualValues(s.t, 1, tag.RowsAffected(), sql)
	}
	const lastByte = "set_byte(%[1]s, length(%[1]s) - 1, get_byte(%[1]s, length(%[1]s) - 1) # 1)"
	garble(`UPDATE effects SET result = `+fmt.Sprintf(lastByte, "result")+` WHERE id = $1`, s.effect)
	e := s.do("GET", "/api/v1/effects/"+s.effect, s.key, nil)
	require.Equal(s.t, true, e["result_unreadable"], "%v", e)
	s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "email.send",
		"idempotency_key": s.gateKey, "payload": map[string]any{"to": s.c("payload")}, "cost_micros": 10,
		"dimensions": map[string]any{"recipient": s.c("dimension")}})

	garble(`UPDATE webhooks SET secret = `+fmt.Sprintf(lastByte, "secret")+` WHERE id = $1`, s.hook)
	s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "email.send",
		"idempotency_key": s.c("gatekey-garbled"), "payload": map[string]any{"to": s.c("payload")}, "cost_micros": 5000,
		"dimensions": map[string]any{"recipient": s.c("dimension")}})
	for range 3 {
		s.env.App.Sweeper.RunOnce(ctx)
	}

	tool := s.c("garbledtool")
	worker := s.secret(s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": "garbled", "preset": "WORKER",
		"tools": []string{tool + "@1"}})["secret"])
	run := s.do("POST", "/api/v1/runs", s.key, map[string]any{"name": s.c("garbledrun")})
	runID, _ := run["id"].(string)
	step := s.do("POST", "/api/v1/runs/"+runID+"/steps", s.key, map[string]any{"name": tool, "version": "1",
		"input": map[string]any{"to": s.c("input")}})
	jobID, _ := step["jobId"].(string)
	garble(`UPDATE jobs SET input_sealed = set_byte(input_sealed, 1, get_byte(input_sealed, 1) # 255) WHERE id = $1`, jobID)
	reg := s.do("POST", "/api/v1/workers/register", worker, map[string]any{"tools": []map[string]any{{"name": tool, "version": "1"}}})
	wid, _ := reg["workerId"].(string)
	s.do("POST", "/api/v1/workers/"+wid+"/claim", worker, map[string]any{"limit": 1, "waitSeconds": 0})
}

// failingRequests raises database errors mid-request: while the test holds
// the effect rows of the workspace locked, a begin on an instance whose
// statements time out fast fails with a statement timeout, and one on the
// first instance is cancelled by its client while its statement waits.
func (s *leakScenario) failingRequests(logger *slog.Logger) {
	ctx := context.Background()
	fast := apitest.Start(s.t, apitest.WithLogger(logger),
		apitest.WithConfig(func(c *config.Config) { c.DBStatementTimeout = 300 * time.Millisecond }))
	tx, err := s.env.App.Pool.Begin(ctx)
	require.NoError(s.t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE effects IN ACCESS EXCLUSIVE MODE`)
	require.NoError(s.t, err)
	body := map[string]any{"effect_type": "email.send", "idempotency_key": s.gateKey,
		"payload": map[string]any{"to": s.c("payload")}, "cost_micros": 10,
		"dimensions": map[string]any{"recipient": s.c("dimension")}}
	r := fast.DoWith("POST", "/api/v1/effects/begin", s.key, http.Header{"Idempotency-Key": {s.c("timeoutheader")}}, body)
	s.t.Logf("begin under a statement timeout → %d %s", r.Status, r.Body)

	cctx, cancel := context.WithCancel(ctx)
	raw, err := json.Marshal(body)
	require.NoError(s.t, err)
	req, err := http.NewRequestWithContext(cctx, "POST", s.env.Server.URL+"/api/v1/effects/begin", bytes.NewReader(raw))
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		res, err := s.env.Client.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	s.waitLockWaiter(ctx)
	cancel()
	<-done
	s.waitNoLockWaiter(ctx)
}

// waitLockWaiter waits until a statement waits on a lock (the begin on the
// rows the test holds).
func (s *leakScenario) waitLockWaiter(ctx context.Context) {
	s.pollWaiters(ctx, func(n int) bool { return n > 0 })
}

// waitNoLockWaiter waits until the cancelled statement is gone, so its
// error is logged before the test reads the log.
func (s *leakScenario) waitNoLockWaiter(ctx context.Context) {
	s.pollWaiters(ctx, func(n int) bool { return n == 0 })
}

func (s *leakScenario) pollWaiters(ctx context.Context, done func(int) bool) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int
		require.NoError(s.t, s.env.App.Pool.QueryRow(ctx,
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n))
		if done(n) {
			return
		}
		require.True(s.t, time.Now().Before(deadline), "lock waiters: %d", n)
		time.Sleep(20 * time.Millisecond)
	}
}

// panics makes routes panic while they read their body, with a string, an
// error and a wrapped error each holding a canary, on a route taking an
// Idempotency-Key, one that does not and the MCP endpoint (a protocol
// endpoint the MCP SDK reads): the recover hook logs the panic and its
// stack, never the value.
func (s *leakScenario) panics() {
	values := []any{s.c("panicstring"), errors.New(s.c("panicerror")), fmt.Errorf("decode: %w", errors.New(s.c("panicwrapped")))}
	for _, v := range values {
		for _, path := range []string{"/api/v1/effects/begin", "/api/v1/keys", "/api/v1/mcp"} {
			req := httptest.NewRequest("POST", path, apitest.PanickyBody{V: v})
			req.Header.Set("Authorization", "Bearer "+s.key)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", s.c("panicheader"))
			rec := httptest.NewRecorder()
			s.env.App.Server.ServeHTTP(rec, req)
			require.Equal(s.t, http.StatusInternalServerError, rec.Code, "%s", rec.Body)
			require.NotContains(s.t, rec.Body.String(), canary)
		}
	}
}

// quotingErrors has routes fail on errors that quote the request's values
// (apitest.RefuseMarked): a begin whose idempotency key Postgres cannot cast, and
// groups whose names it raises on, one of them under an Idempotency-Key.
func (s *leakScenario) quotingErrors() {
	apitest.RefuseMarked(s.t, s.env.App.Pool)
	for _, how := range []string{"castme", "raiseme", "coded"} {
		r := s.env.DoWith("POST", "/api/v1/effects/begin", s.key, nil, map[string]any{"effect_type": "push.send",
			"idempotency_key": s.c(how), "payload": map[string]any{"to": s.c("payload")}})
		require.Equal(s.t, http.StatusInternalServerError, r.Status, "%s", r.Body)
		r = s.env.DoWith("POST", "/api/v1/groups", s.key, http.Header{"Idempotency-Key": {s.c("groupheader")}},
			map[string]any{"name": s.c(how)})
		require.Equal(s.t, http.StatusInternalServerError, r.Status, "%s", r.Body)
	}
}

// bearer sends each request with key as its bearer token.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpTools calls the MCP endpoint's tools with canaries in their arguments
// and results: a begin, its report with a result, the effect read back
// (its result in the tool's answer), a heartbeat and report under a token
// not its own, a resolve and an approval decision of ids that do not
// exist, with notes, filters and a policy's type the API refuses,
// arguments the schema refuses, a tool that does not exist, and JSON-RPC
// messages the transport refuses.
func (s *leakScenario) mcpTools() {
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: s.c("client"), Version: s.c("clientversion")}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: s.env.Server.URL + "/api/v1/mcp", HTTPClient: &http.Client{Transport: bearer{s.key}}}, nil)
	require.NoError(s.t, err)
	defer cs.Close()
	call := func(tool string, args map[string]any) map[string]any {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			s.t.Logf("%s → %v", tool, err)
			return nil
		}
		out, _ := res.StructuredContent.(map[string]any)
		s.t.Logf("%s → error %v %.300v", tool, res.IsError, out)
		return out
	}
	b := call("ratchet_begin", map[string]any{"effect_type": "push.send", "idempotency_key": s.c("mcpkey"),
		"payload": map[string]any{"to": s.c("mcppayload")}, "dimensions": map[string]any{"to": s.c("mcpdimension")}})
	id, _ := b["effect_id"].(string)
	token, _ := b["lease_token"].(string)
	require.NotEmpty(s.t, token, "the MCP begin was granted a lease: %v", b)
	s.secret(token)
	call("ratchet_heartbeat", map[string]any{"effect_id": id, "lease_token": s.c("mcptoken")})
	call("ratchet_report", map[string]any{"effect_id": id, "lease_token": s.c("mcptoken"), "outcome": "succeeded"})
	call("ratchet_report", map[string]any{"effect_id": id, "lease_token": token, "outcome": "succeeded",
		"result": map[string]any{"id": s.c("mcpresult")}})
	got := call("ratchet_get_effect", map[string]any{"effect_id": id})
	require.Contains(s.t, fmt.Sprint(got), canary, "the effect's result is in the tool's answer")
	call("ratchet_get_effect", map[string]any{"effect_id": s.c("mcpeffect")})
	call("ratchet_resolve", map[string]any{"effect_id": s.c("mcpeffect"), "outcome": "succeeded",
		"result": map[string]any{"x": s.c("mcpresolve")}, "note": s.c("mcpnote")})
	call("ratchet_decide_approval", map[string]any{"approval_id": s.c("mcpapproval"), "decision": "approve", "note": s.c("mcpnote")})
	call("ratchet_decide_approval", map[string]any{"approval_id": s.c("mcpapproval"), "decision": s.c("mcpdecision")})
	call("ratchet_list_effects", map[string]any{"effect_type": s.c("Bad Type!"), "cursor": s.c("mcpcursor")})
	call("ratchet_list_approvals", map[string]any{"state": s.c("mcpstate")})
	call("ratchet_get_policy", map[string]any{"effect_type": s.c("mcppolicy")})
	call("ratchet_begin", map[string]any{"effect_type": "push.send", "idempotency_key": s.c("mcpkey"),
		s.c("mcpfield"): s.c("mcpvalue"), "lease_seconds": s.c("mcpnumber")})
	call(s.c("mcptool"), map[string]any{"x": s.c("mcparg")})
	for _, body := range []string{`{"jsonrpc":"2.0","id":"` + s.c("mcpid") + `","method":"` + s.c("mcpmethod") + `"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin","arguments":"` + s.c("mcpargs") + `"}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ratchet_begin","arguments":{"effect_type":"` +
			s.c("mcpbroken") + `"`,
		s.c("mcpgarbage")} {
		r := s.env.DoWith("POST", "/api/v1/mcp", s.key, http.Header{"Accept": {"application/json, text/event-stream"}}, body)
		s.t.Logf("mcp raw → %d %.300s", r.Status, r.Body)
	}
}

// TestTheSweeperLogsNothingUserControlled has the sweeper, at the most
// verbose log level, work through marked state on a clock the test moves:
// webhook deliveries to a receiver that fails with marks in its body and
// headers, retried until they are given up; an effect's lease and a job's
// that lapse (the effect indeterminate, its event delivered too), an
// approval left pending, a run finished; a pass through the cron route;
// and a delivery pass that fails on an error quoting a marked URL
// (apitest.RefuseMarked), which the sweeper logs. No line holds a mark.
// Not parallel: apitest.RefuseMarked's triggers are TestNothingUserControlledIsLogged's too.
func TestTheSweeperLogsNothingUserControlled(t *testing.T) {
	var logs apitest.LockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	clock := apitest.NewClock(time.Now())
	var cronSecret string
	env := apitest.Start(t, apitest.WithLogger(logger), apitest.WithNow(clock.Now),
		apitest.WithConfig(func(c *config.Config) { c.WebhookAllowPrivateNetworks = true; cronSecret = c.CronSecret }))
	s := &leakScenario{t: t, env: env}
	s.workspaceAndKeys()

	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Leak", s.c("receiverheader"))
		w.Header().Set("Retry-After", s.c("retryafter"))
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte(`{"error":"` + s.c("receiverbody") + `"}`))
	}))
	t.Cleanup(receiver.Close)
	hookURL := func(label string) string {
		u, err := url.Parse(receiver.URL)
		require.NoError(t, err)
		u.Path, u.RawQuery = "/"+s.c(label), "token="+s.c("hookquery")
		return u.String()
	}
	hook := s.do("POST", "/api/v1/webhooks", s.key, map[string]any{"url": hookURL("hookpath"),
		"events": []string{"approval.requested", "effect.indeterminate", "run.finished", "step.exhausted"}})
	hookID, _ := hook["id"].(string)
	require.NotEmpty(t, hookID, "%v", hook)
	if sec, ok := hook["secret"].(string); ok {
		s.secret(sec)
	}

	// An approval left pending, an effect whose lease lapses, a job whose lease lapses.
	s.do("PUT", "/api/v1/policies/wire.send", s.key, map[string]any{"mode": "allow", "on_indeterminate": "block",
		"approval_above_micros": 1000})
	s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "wire.send",
		"idempotency_key": s.c("sweepapproval"), "payload": map[string]any{"to": s.c("payload")}, "cost_micros": 5000})
	b := s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "wire.send",
		"idempotency_key": s.c("sweeplapse"), "payload": map[string]any{"to": s.c("payload")}, "cost_micros": 5,
		"dimensions": map[string]any{"to": s.c("dimension")}})
	s.secret(b["lease_token"])
	tool := s.c("sweeptool")
	worker := s.secret(s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": s.c("workerkey"), "preset": "WORKER",
		"tools": []string{tool + "@1"}})["secret"])
	run := s.do("POST", "/api/v1/runs", s.key, map[string]any{"name": s.c("sweeprun")})
	runID, _ := run["id"].(string)
	s.do("POST", "/api/v1/runs/"+runID+"/steps", s.key, map[string]any{"name": tool, "version": "1",
		"input": map[string]any{"to": s.c("input")}, "maxAttempts": 1, "idempotencyKey": s.c("sweepjob")})
	reg := s.do("POST", "/api/v1/workers/register", worker, map[string]any{"tools": []map[string]any{{"name": tool, "version": "1"}}})
	wid, _ := reg["workerId"].(string)
	c := s.do("POST", "/api/v1/workers/"+wid+"/claim", worker, map[string]any{"limit": 1, "waitSeconds": 0})
	jobs, _ := c["jobs"].([]any)
	require.Len(t, jobs, 1, "the job was claimed: %v", c)
	s.secret(jobs[0].(map[string]any)["leaseToken"])
	s.do("POST", "/api/v1/runs/"+runID+"/finish", s.key, nil)

	// Passes of the sweeper, hours apart, until every delivery was given up.
	deliveries := func() []any {
		d := s.env.Do("GET", "/api/v1/webhooks/"+hookID+"/deliveries", s.key, nil).JSON()
		list, _ := d["data"].([]any)
		return list
	}
	for pass := 0; ; pass++ {
		res := env.App.Sweeper.RunOnce(context.Background())
		require.Empty(t, res.Errors, "pass %d", pass)
		list := deliveries()
		pending := 0
		for _, d := range list {
			if d.(map[string]any)["state"] == "pending" {
				pending++
			}
		}
		if len(list) >= 3 && pending == 0 {
			t.Logf("pass %d: %d deliveries given up after %d calls", pass, len(list), hits.Load())
			break
		}
		require.Less(t, pass, 40, "deliveries never given up: %v", list)
		clock.Add(7 * time.Hour)
	}
	r := env.DoWith("GET", "/api/cron/sweep", cronSecret, nil, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)

	// Delivery passes that fail on an error quoting a marked URL, one way
	// then the other; the URL is then made one RefuseMarked lets by.
	apitest.RefuseMarked(t, env.App.Pool)
	for _, how := range []string{"castme", "raiseme"} {
		h := s.do("POST", "/api/v1/webhooks", s.key, map[string]any{"url": hookURL(how), "events": []string{"approval.requested"}})
		s.do("POST", "/api/v1/effects/begin", s.key, map[string]any{"effect_type": "wire.send",
			"idempotency_key": s.c("sweepapproval"), "payload": map[string]any{"to": s.c("payload")}, "cost_micros": 5000})
		failed := false
		for pass := 0; pass < 10 && !failed; pass++ {
			clock.Add(time.Minute)
			failed = env.App.Sweeper.RunOnce(context.Background()).Errors["webhooks.deliver"] != ""
		}
		require.True(t, failed, "the delivery task failed on the refused URL (%s)", how)
		_, err := env.App.Pool.Exec(context.Background(), `UPDATE webhooks SET url = $2 WHERE id = $1`, h["id"], receiver.URL)
		require.NoError(t, err)
	}

	apitest.RequireNoLeak(t, logs.String(), s.secrets, "route=cron.sweep status=200",
		`msg="sweep task failed" task=webhooks.deliver err=`, "SQLSTATE 22P02", "SQLSTATE P0001")
	t.Logf("%d log lines checked", strings.Count(logs.String(), "\n"))
}

// TestTheSDKWorkersLogNothingUserControlled runs the Python and TypeScript
// SDKs' workers (testdata/leak_worker.*) with their default logs (Python's
// logging at DEBUG, Node's console) against the service through a proxy
// that refuses every report with a marked message and detail: three jobs
// whose inputs carry marks fail a way each worker logs (a handler raising
// with the mark, a classifier raising with it, an output that is not JSON
// whose error names it, each report then refused), a worker whose marked
// key is refused at its start, and one whose first claim is answered with
// a marked body that is not JSON, then refused with a marked message. What each process prints holds no mark and no key.
// garbledClaims is how many of a worker's claims the revoking proxy answers
// with a body that is not JSON: past the client's own retries.
const garbledClaims = 6

func TestTheSDKWorkersLogNothingUserControlled(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	s := &leakScenario{t: t, env: env}
	s.workspaceAndKeys()
	var refused atomic.Int32
	target, err := url.Parse(env.Server.URL)
	require.NoError(t, err)
	forward := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/v1/jobs/") && strings.HasSuffix(r.URL.Path, "/report") {
			refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Request-Id", "req_01m9470000000000000000000")
			w.WriteHeader(http.StatusConflict)
			_, _ = fmt.Fprintf(w, `{"error":{"code":"lease_expired","message":"%s","detail":{"x":"%s"}}}`,
				s.c("reportmessage"), s.c("reportdetail"))
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	// The other proxy answers a worker's first claim with a body that is
	// not JSON, beginning with a mark (a JSON parser's error may quote it),
	// then its claims as a revoked key's.
	var mu sync.Mutex
	claims := map[string]int{} // worker path → claims answered
	revoking := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/claim") {
			w.Header().Set("Content-Type", "application/json")
			mu.Lock()
			claims[r.URL.Path]++
			n := claims[r.URL.Path]
			mu.Unlock()
			if n <= garbledClaims {
				_, _ = fmt.Fprintf(w, `%s {"jobs":[`, s.c("garbledclaim"))
				return
			}
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = fmt.Fprintf(w, `{"error":{"code":"unauthorized","message":"%s","detail":{}}}`, s.c("claimmessage"))
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(revoking.Close)

	run := func(t *testing.T, dir string, name string, args ...string) {
		tool := "leak_tool"
		key := s.secret(s.do("POST", "/api/v1/keys", s.key, map[string]any{"name": s.c("workerkey"), "preset": "WORKER",
			"tools": []string{tool + "@1"}})["secret"])
		r := s.do("POST", "/api/v1/runs", s.key, map[string]any{"name": s.c("sdkrun")})
		runID, _ := r["id"].(string)
		for _, kind := range []string{"raise", "classify", "output"} {
			s.do("POST", "/api/v1/runs/"+runID+"/steps", s.key, map[string]any{"name": tool, "version": "1",
				"input": map[string]any{"kind": kind, "to": s.c("input")}, "maxAttempts": 1})
		}
		before := refused.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "LEAK_BASE_URL="+proxy.URL, "LEAK_KEY="+key, "LEAK_TOOL="+tool,
			"LEAK_BAD_KEY=rk_live_"+s.c("badkey"), "LEAK_REVOKING_BASE_URL="+revoking.URL, "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		t.Logf("%s printed:\n%s", name, out)
		require.Contains(t, string(out), "handlers ran: 3")
		require.Greater(t, refused.Load(), before, "reports were refused")
		apitest.RequireNoLeak(t, string(out), append(s.secrets, key), "report=not_recorded", "code=lease_expired",
			"refused: RatchetError", "ratchet worker refused: error=api status=401 code=unauthorized",
			`kind="unreadable answer"`)
	}
	t.Run("python", func(t *testing.T) {
		python := pythonInterpreter(t)
		script, err := filepath.Abs("testdata/leak_worker.py")
		require.NoError(t, err)
		run(t, pythonSDK, python, script)
	})
	t.Run("typescript", func(t *testing.T) {
		node := nodeInterpreter(t)
		run(t, ".", node, "testdata/leak_worker.mjs")
	})
}

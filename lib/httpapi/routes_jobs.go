package httpapi

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// jobsRoutes are the durable-job routes (API.md §3).
func (s *Server) jobsRoutes() []Route {
	runsWrite, runsRead := []string{auth.ScopeRunsWrite}, []string{auth.ScopeRunsRead}
	work, endpointsWrite := []string{auth.ScopeJobsWork}, []string{auth.ScopeEndpointsWrite}
	return []Route{
		{
			Method: "POST", Pattern: "/api/v1/runs", Name: "runs.create", Tag: "jobs", Scopes: runsWrite,
			Summary: "Start a run (status RUNNING) to which durable steps are enqueued; budgetMicros gives it " +
				"its own wallet, charged by every effect begun with its run_id (403 run_budget_exceeded beyond it). " +
				"With idempotencyKey a retry answers the run it started (200, deduplicated: true); the same key " +
				"with another name or budget is 409 idempotency_key_reuse. Under an Idempotency-Key header, with " +
				"idempotencyKey or without, the same request sent again is answered the first answer again.",
			Request: jobs.CreateRunRequest{}, Response: jobs.Run{}, Status: 201,
			Errors:  []string{apierr.CodeInvalidRequest, apierr.CodeIdempotencyKeyReuse, apierr.CodeRetryRequest},
			DedupOK: true, Idempotent: true, Handle: s.createRun,
		},
		{
			Method: "GET", Pattern: "/api/v1/runs", Name: "runs.list", Tag: "jobs", Scopes: runsRead,
			Summary: "List runs newest first, without their steps; ?status= RUNNING, SUCCEEDED or FAILED " +
				"(a FAILED run to inspect, say).",
			Query: append([]Param{{Name: "status", Type: "string", Description: "RUNNING, SUCCEEDED or FAILED",
				Enum: []string{jobs.RunRunning, jobs.RunSucceeded, jobs.RunFailed}}},
				camelListParams...),
			Response: CamelPage[jobs.RunSummary]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: idCursor(ids.Run),
			Handle: s.listRuns,
		},
		{
			Method: "GET", Pattern: "/api/v1/runs/{id}/steps", Name: "runs.steps", Tag: "jobs", Scopes: runsRead,
			Summary: "Page a run's steps in id order, each as GET /api/v1/steps/{id} reads it; ?status= one job " +
				"status. For runs too large to read whole with GET /api/v1/runs/{id}.",
			Query: append([]Param{{Name: "status", Type: "string", Description: "WAITING, QUEUED, RUNNING, " +
				"RETRY_SCHEDULED, SUCCEEDED, EXHAUSTED, CANCELLED or SKIPPED", Enum: jobs.Statuses,
				Rule: jobs.StatusRule}}, camelListParams...),
			Response: CamelPage[jobs.Step]{}, Status: 200,
			Cursor: idCursor(ids.Step),
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound}, Handle: s.listSteps,
		},
		{
			Method: "GET", Pattern: "/api/v1/runs/{id}", Name: "runs.get", Tag: "jobs", Scopes: runsRead,
			Summary: "Read a run with its steps, each with durableJob (status, attempt, maxAttempts, dueAt, " +
				"policy snapshot) and redacted input/output previews: its first 1000 steps, fewer when they would " +
				"take the answer past about 4 MB, stepsTruncated saying so (GET /api/v1/runs/{id}/steps pages them all).",
			Response: jobs.Run{}, Status: 200, Errors: []string{apierr.CodeNotFound}, Handle: s.getRun,
		},
		{
			Method: "POST", Pattern: "/api/v1/runs/{id}/steps", Name: "runs.enqueue", Tag: "jobs", Scopes: runsWrite,
			Summary: "Enqueue a durable step. An omitted idempotencyKey is generated from the operation; the same key " +
				"and operation answers 200 with deduplicated: true, another operation 409 idempotency_key_reuse. " +
				"delayMs (up to 30 days) makes the step due later.",
			Request: jobs.EnqueueRequest{}, Response: jobs.EnqueueResult{}, Status: 201,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeIdempotencyKeyReuse,
				apierr.CodeInvalidState},
			DedupOK: true, ChecksKey: true, Handle: s.enqueue,
		},
		{
			Method: "POST", Pattern: "/api/v1/runs/{id}/finish", Name: "runs.finish", Tag: "jobs", Scopes: runsWrite,
			Summary: "Request completion: new steps are then refused, and the run becomes SUCCEEDED when every step " +
				"ended well. A run is FAILED as soon as a step is EXHAUSTED or CANCELLED, requested or not.",
			Response: jobs.Run{}, Status: 200, Errors: []string{apierr.CodeNotFound}, Handle: s.finishRun,
		},
		{
			Method: "GET", Pattern: "/api/v1/steps/{id}", Name: "steps.get", Tag: "jobs", Scopes: runsRead,
			Summary: "Read one step and its durable job, with its last 50 attempts and last 50 replays " +
				"(attemptsTruncated and replaysTruncated say earlier ones are left out: a step replayed many times " +
				"would pass what one answer holds; GET /api/v1/steps/{id}/attempts and /replays page them all).",
			Response: jobs.Step{}, Status: 200, Errors: []string{apierr.CodeNotFound}, Handle: s.getStep,
		},
		{
			Method: "GET", Pattern: "/api/v1/steps/{id}/attempts", Name: "steps.attempts", Tag: "jobs",
			Scopes: runsRead,
			Summary: "Page every attempt of a step's durable job in attempt order (cursor: the last attempt's " +
				"number), where a step's reads answer its last 50 (attemptsTruncated).",
			Query: camelListParams, Response: CamelPage[jobs.Attempt]{}, Status: 200,
			Cursor: func(s string) bool { _, ok := jobs.ParseAttemptCursor(s); return ok },
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound}, Handle: s.listStepAttempts,
		},
		{
			Method: "GET", Pattern: "/api/v1/steps/{id}/replays", Name: "steps.replays", Tag: "jobs",
			Scopes: runsRead,
			Summary: "Page every replay of a step's durable job oldest first (the replay audit; cursor: the last " +
				"replay's id, another step's being 400 invalid_request), where a step's reads answer its last 50 " +
				"(replaysTruncated).",
			Query: camelListParams, Response: CamelPage[jobs.Replay]{}, Status: 200,
			Cursor: jobs.ValidReplayCursor,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound}, Handle: s.listStepReplays,
		},
		{
			Method: "POST", Pattern: "/api/v1/steps/{id}/cancel", Name: "steps.cancel", Tag: "jobs", Scopes: runsWrite,
			Idempotent: true,
			Summary: "Cancel a step that has not ended. A running job's worker sees cancelRequested on its next " +
				"heartbeat; a replay of the step is not claimed until that attempt reports or its lease expires. " +
				"Cancelling a cancelled step answers it unchanged; a step whose last attempt's lease lapsed has " +
				"ended EXHAUSTED (409 invalid_state), as any read of it shows. " + retriedAction,
			Request: struct{}{}, Response: jobs.Step{}, Status: 200,
			Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidState},
			Handle: bodiless(s.cancelStep),
		},
		{
			Method: "POST", Pattern: "/api/v1/workers/register", Name: "workers.register", Tag: "workers", Scopes: work,
			Idempotent: true,
			Summary: "Register a worker for exact name@version pairs the key may work; the worker id stays bound " +
				"to this key.",
			Request: jobs.RegisterRequest{}, Response: jobs.RegisterResult{}, Status: 201,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeForbidden}, Handle: s.registerWorker,
		},
		{
			Method: "POST", Pattern: "/api/v1/workers/{workerId}/claim", Name: "workers.claim", Tag: "workers",
			Scopes: work,
			Summary: "Lease up to limit (1-100) due jobs of the worker's exact versions in one statement, honouring " +
				"pause, maxConcurrent and rateLimitPerMinute, and fewer when their inputs would pass 3 MB together " +
				"(always one); waitSeconds (0-20) long-polls (re-checking after 50 ms, doubling to 1 s, and at once " +
				"when the same instance queues work in the workspace). A claim sent again with its claimId (new for " +
				"every claim) answers the jobs the first leased under it, with the same lease tokens and their leases " +
				"renewed, while those leases hold and within one lease's length of the first claim, and then leases " +
				"nothing more (so a lost answer costs no attempt); once none is answered, the id claims afresh.",
			Request: jobs.ClaimRequest{}, Response: jobs.ClaimResult{}, Status: 200,
			Errors:    []string{apierr.CodeInvalidRequest, apierr.CodeNotFound},
			ChecksKey: true, Handle: s.claim,
			// The longest wait (20 s) plus its last look, inside the
			// functions' own limit: the default 15 s cut waits of 16-20 s
			// short, sometimes during that look, whose leases were then lost.
			Timeout: FunctionTimeout - AnswerMargin,
		},
		{
			Method: "POST", Pattern: "/api/v1/jobs/{id}/heartbeat", Name: "jobs.heartbeat", Tag: "workers", Scopes: work,
			Summary: "Extend the lease by the job's timeout plus the grace; returns cancelRequested. A cancelled " +
				"attempt's lease is not extended (the answer carries it unchanged, with cancelRequested true): its " +
				"worker should stop. A key restricted to tools may heartbeat only their jobs (403).",
			Request: jobs.HeartbeatRequest{}, Response: jobs.HeartbeatResult{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeLeaseLost,
				apierr.CodeInvalidState},
			Settles: true, Handle: s.heartbeat,
		},
		{
			Method: "POST", Pattern: "/api/v1/jobs/{id}/report", Name: "jobs.report", Tag: "workers", Scopes: work,
			Summary: "Report an attempt: SUCCEEDED with output, or FAILED with error {message, retryable, " +
				"retryAfterMs: a floor under the policy's backoff (the retry waits the longer of the two), not the " +
				"delay itself}. A superseded lease token is 409 lease_lost, a repeat of its report included; until " +
				"then a repeat of the same outcome (its status and, for FAILED, its retryable and retryAfterMs) " +
				"answers the same object, and one that differs is 409 invalid_state. A key " +
				"restricted to tools may report only their jobs (403).",
			Request: jobs.ReportRequest{}, Response: jobs.ReportResult{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeLeaseLost,
				apierr.CodeInvalidState},
			Settles: true, Handle: s.report,
		},
		{
			Method: "POST", Pattern: "/api/v1/jobs/report", Name: "jobs.report.batch", Tag: "workers", Scopes: work,
			Summary: "Report up to 100 attempts in one request and one transaction, each fenced by its own lease " +
				"token; results come back in request order, a refused report carrying its error code (forbidden " +
				"for a tool the key may not work). The successes' outputs are checked against their contracts " +
				"from one budget, what one report's check may take: a batch it cannot cover is refused whole " +
				"(400 invalid_request at reports, nothing recorded), to be sent again one report at a time.",
			Request: jobs.BatchReportRequest{}, Response: jobs.BatchReportResponse{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest}, Settles: true, Handle: s.reportBatch,
		},
		{
			Method: "GET", Pattern: "/api/v1/endpoints", Name: "endpoints.list", Tag: "endpoints", Scopes: runsRead,
			Summary: "List endpoints (services) with their policies, oldest first.", Query: camelListParams,
			Response: CamelPage[jobs.Endpoint]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: idCursor(ids.Endpoint),
			Handle: s.listEndpoints,
		},
		{
			Method: "POST", Pattern: "/api/v1/endpoints", Name: "endpoints.create", Tag: "endpoints",
			Scopes:  endpointsWrite,
			Summary: "Create an endpoint ahead of its first job (201); an existing name answers 200 unchanged.",
			Request: jobs.CreateEndpointRequest{}, Response: jobs.Endpoint{}, Status: 201,
			Errors: []string{apierr.CodeInvalidRequest}, DedupOK: true, Handle: s.createEndpoint,
		},
		{
			Method: "GET", Pattern: "/api/v1/endpoints/{id}/policy", Name: "endpoints.policy.get", Tag: "endpoints",
			Scopes: runsRead, Summary: "Read an endpoint's policy (policyPreset, retryPolicy, gates).",
			Response: jobs.Endpoint{}, Status: 200, Errors: []string{apierr.CodeNotFound}, Handle: s.getEndpoint,
		},
		{
			Method: "GET", Pattern: "/api/v1/endpoints/{id}/attempts", Name: "endpoints.attempts", Tag: "endpoints",
			Scopes: runsRead,
			Summary: "Page the endpoint's attempts (one per claim) newest first, each with its job, step and run, its " +
				"outcome and the message its worker reported (what to inspect when the endpoint fails, before " +
				"closing its circuit or resuming it); ?outcome= SUCCEEDED or FAILED keeps only those.",
			Query: append([]Param{{Name: "outcome", Type: "string", Description: "SUCCEEDED or FAILED",
				Enum: []string{jobs.StatusSucceeded, jobs.OutcomeFailed}}},
				camelListParams...),
			Response: CamelPage[jobs.EndpointAttempt]{}, Status: 200,
			Cursor: jobs.ValidEndpointAttemptsCursor,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound}, Handle: s.listEndpointAttempts,
		},
		{
			Method: "PUT", Pattern: "/api/v1/endpoints/{id}/policy", Name: "endpoints.policy.put", Tag: "endpoints",
			Scopes: endpointsWrite,
			Summary: "Merge policy fields (expectedVersion required). Existing jobs keep their policy snapshot and dueAt. " +
				"A rateLimitPerMinute set or changed counts the attempts started earlier in its UTC minute.",
			Request: jobs.UpdatePolicyRequest{}, Response: jobs.Endpoint{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeVersionConflict},
			Handle: s.updatePolicy,
		},
		{
			Method: "POST", Pattern: "/api/v1/endpoints/{id}/pause", Name: "endpoints.pause", Tag: "endpoints",
			Scopes: endpointsWrite, Idempotent: true,
			Summary: "Pause: jobs are accepted but not claimed, consuming no attempts. " + retriedAction,
			Request: struct{}{}, Response: jobs.Endpoint{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: bodiless(s.pauseEndpoint),
		},
		{
			Method: "POST", Pattern: "/api/v1/endpoints/{id}/resume", Name: "endpoints.resume", Tag: "endpoints",
			Scopes: endpointsWrite, Idempotent: true, Summary: "Resume a paused endpoint. " + retriedAction,
			Request: struct{}{}, Response: jobs.Endpoint{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: bodiless(s.resumeEndpoint),
		},
		{
			Method: "POST", Pattern: "/api/v1/endpoints/{id}/circuit/close", Name: "endpoints.circuit.close",
			Tag: "endpoints", Scopes: endpointsWrite, Idempotent: true,
			Summary: "Close the endpoint's circuit breaker; closing a closed circuit answers the endpoint unchanged. " +
				retriedAction,
			Request: struct{}{}, Response: jobs.Endpoint{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: bodiless(s.closeEndpointCircuit),
		},
		{
			Method: "GET", Pattern: "/api/v1/queue/health", Name: "queue.health", Tag: "operations", Scopes: runsRead,
			Summary: "Per exact name@version: queued count, oldest queued age, workers seen recently, and a plain " +
				"message when no worker serves a queued version; paged in name@version order.",
			Query:    camelListParams,
			Response: CamelPage[jobs.QueueHealth]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: jobs.ValidHealthCursor,
			Handle: s.queueHealth,
		},
	}
}

func (s *Server) createRun(ctx context.Context, c *Call) (any, error) {
	var req jobs.CreateRunRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	r, err := s.Jobs.CreateRun(ctx, c.Principal.WorkspaceID, req)
	if err != nil {
		return nil, err
	}
	body, err := fitRun(ctx, r)
	if err != nil {
		return nil, err
	}
	if r.Deduplicated != nil && *r.Deduplicated {
		return Reply{Status: http.StatusOK, Body: body}, nil
	}
	return body, nil
}

func (s *Server) listRuns(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	runs, err := s.Jobs.ListRuns(ctx, c.Principal.WorkspaceID, c.R.URL.Query().Get("status"), cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, runs, limit, func(r jobs.RunSummary) string { return r.ID })
}

func (s *Server) listSteps(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Run)
	if err != nil {
		return nil, err
	}
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	steps, err := s.Jobs.ListSteps(ctx, c.Principal.WorkspaceID, id, c.R.URL.Query().Get("status"), cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, steps, limit, func(st jobs.Step) string { return st.ID })
}

func (s *Server) getRun(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Run)
	if err != nil {
		return nil, err
	}
	r, err := s.Jobs.GetRun(ctx, c.Principal.WorkspaceID, id)
	if err != nil {
		return nil, err
	}
	return fitRun(ctx, r)
}

func (s *Server) enqueue(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Run)
	if err != nil {
		return nil, err
	}
	var req jobs.EnqueueRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	res, err := s.Jobs.EnqueueAs(ctx, c.Principal, id, req)
	if err != nil {
		return nil, err
	}
	if res.Deduplicated {
		return Reply{Status: http.StatusOK, Body: res}, nil
	}
	return res, nil
}

func (s *Server) finishRun(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Run)
	if err != nil {
		return nil, err
	}
	r, err := s.Jobs.FinishRun(ctx, c.Principal.WorkspaceID, id)
	if err != nil {
		return nil, err
	}
	return fitRun(ctx, r)
}

// fitRun encodes a run within its answer's budget (answer.Of): a run reads
// with up to 1 000 steps, each with input and output previews of up to
// 8 KB and its attempts' messages, which passed what Vercel and Lambda
// deliver long before the thousandth (QA). One that would pass it answers
// the steps that fit, from the first, with stepsTruncated: true, as one
// with more than 1 000 does; GET /api/v1/runs/{id}/steps pages them all.
func fitRun(ctx context.Context, r jobs.Run) (any, error) {
	return fitPrefix(ctx, r.Steps, 0, func(steps []jobs.Step, cut bool) any {
		r.Steps, r.StepsTruncated = steps, r.StepsTruncated || cut
		return r
	})
}

// fitPrefix encodes the answer with(items, false) when it is within its
// budget (answer.Of), as nearly every one is, encoded once; otherwise
// with(prefix, true) for the longest prefix of items that keeps it within,
// of at least atLeast items: an answer whose list cannot be paged (a run's
// steps, an unwind's plan) says it was cut and how to read the rest.
func fitPrefix[T any](ctx context.Context, items []T, atLeast int, with func(prefix []T, cut bool) any) (any, error) {
	budget := answer.Of(ctx)
	whole, err := jsonx.Marshal(with(items, false))
	if err != nil || len(whole) <= budget {
		return rawAnswer(whole), err
	}
	empty, err := jsonx.Marshal(with(items[:0], true))
	if err != nil {
		return nil, err
	}
	size, kept := len(empty), 0
	for i, it := range items {
		b, err := jsonx.Marshal(it)
		if err != nil {
			return nil, err
		}
		if size += len(b); i > 0 {
			size++ // the comma before it
		}
		if size > budget && kept >= atLeast {
			break
		}
		kept++
	}
	out, err := jsonx.Marshal(with(items[:kept], true))
	return rawAnswer(out), err
}

func (s *Server) getStep(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Step)
	if err != nil {
		return nil, err
	}
	return s.Jobs.GetStep(ctx, c.Principal.WorkspaceID, id)
}

func (s *Server) listStepAttempts(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Step)
	if err != nil {
		return nil, err
	}
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	after, _ := jobs.ParseAttemptCursor(cursor) // 0 for the first page
	attempts, err := s.Jobs.ListStepAttempts(ctx, c.Principal.WorkspaceID, id, after, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, attempts, limit, jobs.AttemptCursor)
}

func (s *Server) listStepReplays(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Step)
	if err != nil {
		return nil, err
	}
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	replays, err := s.Jobs.ListStepReplays(ctx, c.Principal.WorkspaceID, id, cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, replays, limit, func(r jobs.Replay) string { return r.ID })
}

func (s *Server) cancelStep(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Step)
	if err != nil {
		return nil, err
	}
	return s.Jobs.CancelStep(ctx, c.Principal.WorkspaceID, id)
}

func (s *Server) registerWorker(ctx context.Context, c *Call) (any, error) {
	var req jobs.RegisterRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.RegisterWorker(ctx, c.Principal, req)
}

func (s *Server) claim(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("workerId", ids.Worker)
	if err != nil {
		return nil, err
	}
	var req jobs.ClaimRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.Claim(ctx, c.Principal, id, req)
}

func (s *Server) heartbeat(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Job)
	if err != nil {
		return nil, err
	}
	var req jobs.HeartbeatRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.Heartbeat(ctx, c.Principal, id, req)
}

func (s *Server) report(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Job)
	if err != nil {
		return nil, err
	}
	var req jobs.ReportRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.Report(ctx, c.Principal, id, req)
}

// reportBatch reads each report of the batch on its own, so that one that
// cannot be read (a field of the wrong type, a null, a NUL in its output)
// is refused in its slot and the others are applied, as the service
// refuses one that reads but breaks a rule.
func (s *Server) reportBatch(ctx context.Context, c *Call) (any, error) {
	var raw struct {
		Reports []jsonstrict.Deferred `json:"reports"`
	}
	if err := c.Decode(&raw); err != nil {
		return nil, err
	}
	req := jobs.BatchReportRequest{Reports: make([]jobs.BatchReportItem, len(raw.Reports))}
	for i, item := range raw.Reports {
		if err := DecodeJSON(item, &req.Reports[i]); err != nil {
			var named struct {
				JobID any `json:"jobId"`
			}
			_ = json.Unmarshal(item, &named) // the slot names the job when it can
			jobID, _ := named.JobID.(string)
			req.Reports[i] = jobs.RefusedBatchItem(jobID, err)
		}
	}
	return s.Jobs.ReportBatch(ctx, c.Principal, req)
}

func (s *Server) listEndpoints(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	eps, err := s.Jobs.ListEndpoints(ctx, c.Principal.WorkspaceID, cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, eps, limit, func(e jobs.Endpoint) string { return e.ID })
}

func (s *Server) createEndpoint(ctx context.Context, c *Call) (any, error) {
	var req jobs.CreateEndpointRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	e, created, err := s.Jobs.CreateEndpoint(ctx, c.Principal.WorkspaceID, req)
	if err != nil {
		return nil, err
	}
	if !created {
		return Reply{Status: http.StatusOK, Body: e}, nil
	}
	return e, nil
}

func (s *Server) getEndpoint(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Endpoint)
	if err != nil {
		return nil, err
	}
	return s.Jobs.GetEndpoint(ctx, c.Principal.WorkspaceID, id)
}

func (s *Server) listEndpointAttempts(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Endpoint)
	if err != nil {
		return nil, err
	}
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	attempts, err := s.Jobs.ListEndpointAttempts(ctx, c.Principal.WorkspaceID, id, c.R.URL.Query().Get("outcome"),
		cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, attempts, limit, jobs.AttemptsCursor)
}

func (s *Server) updatePolicy(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Endpoint)
	if err != nil {
		return nil, err
	}
	var req jobs.UpdatePolicyRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.UpdatePolicy(ctx, c.Principal.WorkspaceID, id, req)
}

func (s *Server) pauseEndpoint(ctx context.Context, c *Call) (any, error) {
	return s.setPaused(ctx, c, true)
}

func (s *Server) resumeEndpoint(ctx context.Context, c *Call) (any, error) {
	return s.setPaused(ctx, c, false)
}

func (s *Server) setPaused(ctx context.Context, c *Call, paused bool) (any, error) {
	id, err := c.PathID("id", ids.Endpoint)
	if err != nil {
		return nil, err
	}
	return s.Jobs.SetPaused(ctx, c.Principal.WorkspaceID, id, paused)
}

func (s *Server) closeEndpointCircuit(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Endpoint)
	if err != nil {
		return nil, err
	}
	return s.Jobs.CloseCircuit(ctx, c.Principal.WorkspaceID, id)
}

func (s *Server) queueHealth(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	data, err := s.Jobs.QueueHealth(ctx, c.Principal.WorkspaceID, cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, data, limit, jobs.QueueHealth.HealthCursor)
}

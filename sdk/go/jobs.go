package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ToolRef names one exact handler: a tool name and handler version.
type ToolRef struct {
	Name    string `json:"name"`    // the tool name, e.g. "send_welcome_email"
	Version string `json:"version"` // the exact handler version, e.g. "1"
}

// RegisterWorker registers a worker for the exact tools it serves (POST
// /api/v1/workers/register, a WORKER key listing each name@version) and
// returns its worker id, bound to the registering key. Most code uses Worker,
// which calls this for you.
func (c *Client) RegisterWorker(ctx context.Context, tools []ToolRef) (string, error) {
	// Every attempt carries one key, so a repeat after an ambiguous failure
	// gets the worker id the first attempt registered (a server older than
	// the header registers a second, idle one: harmless).
	return c.registerWorker(ctx, newRequestID(), tools)
}

// registerWorker is RegisterWorker under Idempotency-Key key, which a
// worker's Start keeps across its own retries.
func (c *Client) registerWorker(ctx context.Context, key string, tools []ToolRef) (string, error) {
	var out struct {
		WorkerID string `json:"workerId"`
	}
	err := c.doKeyed(ctx, "POST", "/workers/register", key, map[string]any{"tools": tools}, &out, idempotent)
	return out.WorkerID, err
}

// ClaimedJob is a job leased to this worker by a claim.
type ClaimedJob struct {
	JobID   string `json:"jobId"`
	StepID  string `json:"stepId"`
	RunID   string `json:"runId"`
	Name    string `json:"name"`
	Version string `json:"version"`
	Attempt int    `json:"attempt"` // this execution's number, from 1
	// MaxAttempts is the job's ceiling: Attempt == MaxAttempts is its last
	// execution unless it is replayed.
	MaxAttempts int `json:"maxAttempts"`
	// LeaseToken proves this claim in heartbeats and the report.
	LeaseToken     string    `json:"leaseToken"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt"` // by the server's clock
	// LeaseMs is the lease's length, which each heartbeat extends it by
	// from then (0 from a server that does not say): the worker measures
	// the lease with its own clock from when it sent the claim.
	LeaseMs   int64 `json:"leaseMs"`
	TimeoutMs int64 `json:"timeoutMs"` // the attempt's timeout
	// IdempotencyKey is stable across attempts: pass it to the destination.
	IdempotencyKey string          `json:"idempotencyKey"`
	Input          json.RawMessage `json:"input"` // the step's input, decrypted

	// leaseEnd is when the lease lapses by this process's clock (see
	// leaseEndFrom), set by the worker that claimed the job.
	leaseEnd time.Time
}

// setServerDate implements serverDated: every job of the answer was leased
// at its Date.
func (a *claimAnswer) setServerDate(t time.Time) { a.date = t }

// leaseEndFrom is when a lease granted or extended by a request sent at
// sent (this process's clock) lapses: sent plus its length, which errs
// early by the request's own time whatever the server's clock says (a
// worker clock behind the server's would otherwise report, or claim again,
// after the lease lapsed). When the server does not say the length, the
// length is its expiry less the answer's Date (serverDate, zero without
// one), read as the
// gate's leases are (localExpiry: from sent, less a second for Date's whole
// seconds), so that a server clock ahead of or behind ours does not
// lengthen or cut the lease; the expiry as it is without a Date. A server
// that says neither (no expiry either) is taken to lease for the job's
// timeout plus its default grace, as the Python and TypeScript workers take
// it: a zero end read as lapsed, and the handler was cancelled as its lease
// lost at its first heartbeat.
func leaseEndFrom(sent time.Time, j ClaimedJob, serverExpiry, serverDate time.Time) time.Time {
	if j.LeaseMs > 0 {
		return sent.Add(time.Duration(j.LeaseMs) * time.Millisecond)
	}
	if serverExpiry.IsZero() {
		return sent.Add(time.Duration(j.TimeoutMs)*time.Millisecond + defaultLeaseGrace)
	}
	return localExpiry(serverExpiry, serverDate, sent)
}

// defaultLeaseGrace is the server's default JOB_LEASE_GRACE_MS: a job's
// lease is its timeout plus this, unless the server is configured
// otherwise (which it then says in leaseMs).
const defaultLeaseGrace = 10 * time.Second

// Claim leases up to limit (1–100) due jobs for workerID, waiting up to
// waitSeconds (0–20) for one to appear. It is ClaimKeyed under a new claim
// id.
func (c *Client) Claim(ctx context.Context, workerID string, limit, waitSeconds int) ([]ClaimedJob, error) {
	return c.ClaimKeyed(ctx, workerID, NewClaimID(), limit, waitSeconds)
}

// NewClaimID is a random claim id for ClaimKeyed.
func NewClaimID() string { return newRequestID() }

// ClaimKeyed is Claim under claimID (1–64 characters of A-Z a-z 0-9 . _ :
// -), new for every claim. The call is retried under the same id, and a
// failed call whose answer may have been lost (MayHaveApplied) can be made
// again with it: the server answers the jobs the first call leased under
// the id, with the same lease tokens, while their leases hold, instead of
// leaving them leased to nobody until they lapse (each lapse spends an
// attempt).
func (c *Client) ClaimKeyed(ctx context.Context, workerID, claimID string, limit, waitSeconds int) ([]ClaimedJob, error) {
	jobs, _, err := c.claimKeyed(ctx, workerID, claimID, limit, waitSeconds)
	return jobs, err
}

// claimKeyed is ClaimKeyed, answering the answer's Date too (zero without
// one), by which the worker reads a lease without its length
// (leaseEndFrom). Kept out of ClaimedJob, whose printed and compared
// values it would change.
func (c *Client) claimKeyed(ctx context.Context, workerID, claimID string, limit, waitSeconds int) ([]ClaimedJob, time.Time, error) {
	var out claimAnswer // read by its parts when an input nests too deep for the whole (deepjson.go)
	path := "/workers/" + pathID(workerID) + "/claim"
	body := claimBody{Limit: limit, WaitSeconds: waitSeconds, ClaimID: claimID}
	// The same claim id each retry. Every supported server takes claimId
	// (since migration 0042): a claim is never sent without it, as in the
	// Python and TypeScript SDKs.
	err := c.do(ctx, "POST", path, body, &out, idempotent)
	if err != nil {
		return nil, time.Time{}, err
	}
	return out.Jobs, out.date, nil
}

// claimBody is a claim's request body.
type claimBody struct {
	Limit       int    `json:"limit"`
	WaitSeconds int    `json:"waitSeconds"`
	ClaimID     string `json:"claimId,omitempty"`
}

// JobHeartbeat is the answer to a job heartbeat.
type JobHeartbeat struct {
	LeaseExpiresAt time.Time `json:"leaseExpiresAt"` // the extended expiry
	// CancelRequested is true when the job was cancelled: stop working on it.
	CancelRequested bool `json:"cancelRequested"`
}

// jobHeartbeatAnswer is a heartbeat's answer with its Date header (zero
// without one).
type jobHeartbeatAnswer struct {
	JobHeartbeat
	serverDate time.Time
}

// setServerDate implements serverDated.
func (h *jobHeartbeatAnswer) setServerDate(t time.Time) { h.serverDate = t }

// HeartbeatJob extends a job's lease (POST /api/v1/jobs/{id}/heartbeat). A
// superseded token answers 409 lease_lost.
func (c *Client) HeartbeatJob(ctx context.Context, jobID, leaseToken string) (*JobHeartbeat, error) {
	hb, _, err := c.heartbeatJob(ctx, jobID, leaseToken)
	return hb, err
}

// heartbeatJob is HeartbeatJob, answering the answer's Date too (zero
// without one), as claimKeyed does.
func (c *Client) heartbeatJob(ctx context.Context, jobID, leaseToken string) (*JobHeartbeat, time.Time, error) {
	var out jobHeartbeatAnswer
	err := c.do(ctx, "POST", "/jobs/"+pathID(jobID)+"/heartbeat", map[string]string{"leaseToken": leaseToken}, &out, idempotent)
	if err != nil {
		return nil, time.Time{}, err
	}
	return &out.JobHeartbeat, out.serverDate, nil
}

// Job report statuses.
const (
	ReportSucceeded = "SUCCEEDED"
	ReportFailed    = "FAILED"
)

// JobReport is the body of a job report. Build it with care: the worker
// runtime does, enforcing that Error.RetryAfterMs is 1000–86400000 and only
// present on a retryable failure.
type JobReport struct {
	LeaseToken string          `json:"leaseToken"`       // the claim's token
	Status     string          `json:"status"`           // ReportSucceeded or ReportFailed
	Output     json.RawMessage `json:"output,omitempty"` // JSON output of a success
	Error      *JobError       `json:"error,omitempty"`  // what failed
}

// JobError is a failed attempt's error as the API stores it: a bounded,
// redacted message and the retry decision, nothing else.
type JobError struct {
	Message   string `json:"message"`   // bounded and redacted
	Retryable bool   `json:"retryable"` // false exhausts the job at once
	// RetryAfterMs is a minimum wait before the retry (1000–86400000), only
	// with Retryable.
	RetryAfterMs *int64 `json:"retryAfterMs,omitempty"`
}

// JobReportResult is the answer to a job report; NextDueAt is set when a
// retry was scheduled.
type JobReportResult struct {
	JobID     string     `json:"jobId"`
	Status    string     `json:"status"`    // the job's status after the report
	Attempt   int        `json:"attempt"`   // the reported attempt
	NextDueAt *time.Time `json:"nextDueAt"` // when a scheduled retry is due
}

// ReportJob records an attempt's outcome (POST /api/v1/jobs/{id}/report).
// Repeating the same report with the same token answers the same result, so
// it is retried after ambiguous failures.
func (c *Client) ReportJob(ctx context.Context, jobID string, report JobReport) (*JobReportResult, error) {
	var out JobReportResult
	if err := c.do(ctx, "POST", "/jobs/"+pathID(jobID)+"/report", report, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// BatchJobReport is one report in a batch: a JobReport for JobID.
type BatchJobReport struct {
	JobID string `json:"jobId"`
	JobReport
}

// BatchJobResult is one report's answer in a batch: the result a single
// report would answer, or Err with the error it would answer (lease_lost,
// invalid_state, not_found, forbidden; its detail included, and its
// RequestID the batch response's X-Request-Id, shared by every report of
// the batch). One report's error never affects the others.
type BatchJobResult struct {
	JobReportResult
	Err *Error
}

// ReportJobs records several attempts' outcomes in one call (POST
// /api/v1/jobs/report, 1–100 reports, one commit on the server). Each report
// is fenced by its own lease token exactly as ReportJob is, and answered in
// its own slot, in request order. Like ReportJob it is retried after
// ambiguous failures: a repeated batch answers the same results. An answer
// that does not hold one result per report, each naming the job of the
// report sent in its slot, cannot be matched to the reports, not even those
// whose slots agree: it is read as an answer lost (the outcome of every
// report unknown) and the batch is asked again, as after a cut answer, as
// the Python and TypeScript SDKs do.
func (c *Client) ReportJobs(ctx context.Context, reports []BatchJobReport) ([]BatchJobResult, error) {
	out := &batchAnswer{jobIDs: make([]string, len(reports))}
	for i, r := range reports {
		out.jobIDs[i] = r.JobID
	}
	if err := c.do(ctx, "POST", "/jobs/report", map[string]any{"reports": reports}, out, idempotent); err != nil {
		return nil, err
	}
	res := make([]BatchJobResult, len(out.Results))
	for i, r := range out.Results {
		res[i].JobReportResult = JobReportResult{JobID: r.JobID, Status: r.Status, Attempt: r.Attempt, NextDueAt: r.NextDueAt}
		if r.Error != nil {
			res[i].Err = &Error{StatusCode: batchErrorStatus(r.Error.Code), Code: r.Error.Code, Message: r.Error.Message,
				Detail: r.Error.Detail, RequestID: out.requestID}
		}
	}
	return res, nil
}

// batchAnswer is a batch report's answer, read against the reports it
// answers (jobIDs, in request order): once decodes it, checks it and keeps
// its X-Request-Id (checkedAnswer.check), so that an answer not matching the
// reports is an unreadable answer, retried as one.
type batchAnswer struct {
	jobIDs    []string
	requestID string
	Results   []struct {
		JobID     string     `json:"jobId"`
		Status    string     `json:"status"`
		Attempt   int        `json:"attempt"`
		NextDueAt *time.Time `json:"nextDueAt"`
		Error     *struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Detail  map[string]any `json:"detail"`
		} `json:"error"`
	} `json:"results"`
}

func (a *batchAnswer) reset() { a.Results, a.requestID = nil, "" }

func (a *batchAnswer) check(h http.Header) error {
	a.requestID = h.Get("X-Request-Id")
	if len(a.Results) != len(a.jobIDs) {
		return fmt.Errorf("%w: %d results for %d reports", errBatchMismatch, len(a.Results), len(a.jobIDs))
	}
	for i, r := range a.Results {
		if r.JobID != a.jobIDs[i] {
			return fmt.Errorf("%w: result %d is for job %s, not %s", errBatchMismatch, i, r.JobID, a.jobIDs[i])
		}
	}
	return nil
}

// errBatchMismatch marks a batch report's answer that does not line up with
// the reports it answers (not one result per report, or one naming another
// job): read as an answer lost, and, twice running, a reason for the
// worker's reporter to send the batch report by report (splitsBatch).
var errBatchMismatch = errors.New("the answer does not line up with the reports")

// batchErrorStatus is the status a single report would have answered with
// code, so errors from a batch read like those of ReportJob.
func batchErrorStatus(code string) int {
	switch code {
	case CodeNotFound:
		return 404
	case CodeForbidden:
		return 403
	case CodeLeaseLost, CodeLeaseExpired, CodeInvalidState:
		return 409
	default:
		return 400
	}
}

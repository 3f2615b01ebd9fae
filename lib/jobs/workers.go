package jobs

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/toolname"
)

// Tool is an exact handler a worker serves.
type Tool struct {
	Name    string `json:"name" openapi:"minLength=1,maxLength=200,toolname"`
	Version string `json:"version" openapi:"minLength=1,maxLength=100,toolname"`
}

// RegisterRequest is the body of POST /api/v1/workers/register.
type RegisterRequest struct {
	Tools []Tool `json:"tools" openapi:"required,minItems=1,maxItems=100"` // toolname.MaxPairs
}

// RegisterResult answers a registration.
type RegisterResult struct {
	WorkerID string `json:"workerId"`
}

// RegisterWorker registers a worker for exact name@version pairs the key may
// work; the worker id stays bound to the key.
func (s *Service) RegisterWorker(ctx context.Context, p *auth.Principal, req RegisterRequest) (RegisterResult, error) {
	var pr apierr.Problems
	if len(req.Tools) == 0 || len(req.Tools) > toolname.MaxPairs {
		pr.Add("tools", "must list 1-%d {name, version} pairs", toolname.MaxPairs)
	}
	names, versions := make([]string, 0, len(req.Tools)), make([]string, 0, len(req.Tools))
	refs := make([][2]string, 0, len(req.Tools))
	for i, t := range req.Tools {
		if !toolname.ValidName(t.Name) {
			pr.Add(fmt.Sprintf("tools.%d.name", i), toolname.NameRule)
		}
		if !toolname.ValidVersion(t.Version) {
			pr.Add(fmt.Sprintf("tools.%d.version", i), toolname.VersionRule)
		}
		names, versions = append(names, t.Name), append(versions, t.Version)
		refs = append(refs, [2]string{t.Name, t.Version})
	}
	if err := pr.Err(); err != nil {
		return RegisterResult{}, err
	}
	if err := p.RequireTools(refs...); err != nil {
		return RegisterResult{}, err
	}
	id := ids.NewAt(ids.Worker, s.now())
	if _, err := db.Writer(ctx, s.pool).Exec(ctx, sqlInsertWorker, id, p.WorkspaceID, p.KeyID, names, versions, s.now()); err != nil {
		return RegisterResult{}, fmt.Errorf("register worker: %w", err)
	}
	return RegisterResult{WorkerID: id}, nil
}

// ClaimRequest is the body of POST /api/v1/workers/{workerId}/claim.
type ClaimRequest struct {
	Limit       *int `json:"limit,omitempty" openapi:"min=1,max=100,default=1"`
	WaitSeconds *int `json:"waitSeconds,omitempty" openapi:"min=0,max=20,default=0"`
	// ClaimID names this claim, so that the worker can send it again when
	// its answer was lost: the claim sent again answers the jobs the first
	// leased under the id, with the same lease tokens and their leases
	// renewed, while those leases hold (and leases nothing more). A new id
	// for every new claim.
	ClaimID *string `json:"claimId,omitempty" openapi:"minLength=1,maxLength=64,pattern=^[A-Za-z0-9._:-]+$"`
}

// validClaimID is ClaimRequest.ClaimID's rule.
var validClaimID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// ClaimedJob is one leased job.
type ClaimedJob struct {
	JobID          string    `json:"jobId"`
	StepID         string    `json:"stepId"`
	RunID          string    `json:"runId"`
	Name           string    `json:"name"`
	Version        string    `json:"version"`
	Attempt        int       `json:"attempt"`
	MaxAttempts    int       `json:"maxAttempts"`
	LeaseToken     string    `json:"leaseToken"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt"`
	// LeaseMs is the lease's length (timeoutMs plus the grace), which each
	// heartbeat extends it by from then: a worker measures the lease with
	// its own clock from when it sent the claim, whatever the two clocks
	// say (LeaseExpiresAt is the server's).
	LeaseMs        int64           `json:"leaseMs"`
	TimeoutMs      int64           `json:"timeoutMs"`
	IdempotencyKey string          `json:"idempotencyKey"`
	Input          json.RawMessage `json:"input"`
}

// ClaimResult answers a claim.
type ClaimResult struct {
	Jobs []ClaimedJob `json:"jobs" openapi:"notNull"` // [] when none (claimOrWait)
}

// Long-poll pacing: polls start fast and back off, bounded by the request.
const (
	pollMin = 50 * time.Millisecond
	pollMax = time.Second
)

// answerMargin is how long before its request's deadline a long poll stops
// waiting and answers: a platform that ends the function at the deadline
// (Lambda, Vercel) would otherwise lose an answer sent at that moment, and
// with it the leases of a claim made in its last look.
const answerMargin = 2 * time.Second

// Claim leases up to limit due jobs for the worker in one statement. With
// waitSeconds it polls (short sleeps, bounded by ctx) until a job is claimed
// or the wait ends; it never holds a connection while sleeping, and wakes
// early when this process queues work in the workspace (waker).
func (s *Service) Claim(ctx context.Context, p *auth.Principal, workerID string, req ClaimRequest) (ClaimResult, error) {
	var pr apierr.Problems
	limit, wait := DefaultClaimLimit, 0
	if req.Limit != nil {
		limit = *req.Limit
		if limit < 1 || limit > MaxClaimLimit {
			pr.Add("limit", "must be an integer from 1 to %d", MaxClaimLimit)
		}
	}
	if req.WaitSeconds != nil {
		wait = *req.WaitSeconds
		if wait < 0 || wait > MaxClaimWaitSeconds {
			pr.Add("waitSeconds", "must be an integer from 0 to %d", MaxClaimWaitSeconds)
		}
	}
	var key *claimKey
	if req.ClaimID != nil {
		if !validClaimID.MatchString(*req.ClaimID) {
			pr.Add("claimId", "must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'")
		}
		key = &claimKey{id: *req.ClaimID, secret: s.claimSecret(p.KeyID, workerID, *req.ClaimID)}
	}
	if err := pr.Err(); err != nil {
		return ClaimResult{}, err
	}
	if wait > 0 {
		if s.waits.take(p.KeyID) {
			defer s.waits.release(p.KeyID)
		} else {
			wait = 0 // the key has maxWaitingClaimsPerKey waiting here: answer at once
		}
	}
	deadline := time.Now().Add(time.Duration(wait) * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Add(-answerMargin).Before(deadline) {
		deadline = d.Add(-answerMargin)
	}
	poll := longPoll{parked: wait > 0, deadline: deadline, pause: s.pollMin}
	if poll.parked {
		var err error
		if poll.tools, err = s.workerTools(ctx, p, workerID); err != nil {
			return ClaimResult{}, err
		}
	}
	for first := true; ; first = false {
		jobs, again, err := s.claimOrWait(ctx, p, workerID, limit, key, first, &poll)
		if err != nil {
			return ClaimResult{}, err
		}
		if !again {
			return ClaimResult{Jobs: jobs}, nil
		}
	}
}

// longPoll is a claim's wait: whether it parks with the waker (waitSeconds
// above 0), when it ends, and the pause before its next look; and the jobs
// its looks passed over (claimOnce), passed over at every later look too:
// this instance cannot open them any better then.
type longPoll struct {
	parked   bool
	tools    map[string]bool // the worker's tools (workerTools), whose work wakes it
	deadline time.Time
	pause    time.Duration
	skip     []string
	slot     string // the tool whose freed slot woke the last wait (waker.passSlot)
}

// claimOrWait is one poll of Claim: it claims, and when nothing was claimed
// and the deadline is still ahead, sleeps until the next poll (the pause,
// then doubled up to pollMax) or until this process queues work in the
// workspace, and answers again. A parked poll registers with the waker
// before it claims, so a commit after the claim's snapshot still wakes it;
// when it stops without looking again, a wake it got is passed on to the
// next parked claim.
func (s *Service) claimOrWait(ctx context.Context, p *auth.Principal, workerID string, limit int, key *claimKey,
	first bool, poll *longPoll) (jobs []ClaimedJob, again bool, err error) {
	var woken <-chan struct{}
	if poll.parked {
		var leave func(last bool) string
		woken, leave = s.wake.park(p.WorkspaceID, poll.tools)
		defer func() { poll.slot = leave(!again) }()
	}
	jobs, err = s.claimOnce(ctx, p, workerID, limit, key, &poll.skip)
	if s.looked != nil && err == nil {
		s.looked(workerID)
	}
	if slot := poll.slot; slot != "" && err == nil {
		poll.slot = ""
		if len(jobs) == 0 {
			s.wake.passSlot(p.WorkspaceID, slot) // the slot may be another tool's
		}
	}
	if err != nil || len(jobs) > 0 {
		return jobs, false, err
	}
	if first && !poll.parked {
		// An empty claim may mean an unknown worker or another key's
		// worker: both are 404, never a hint. (A parked claim read its
		// worker before it parked: workerTools.)
		var ok bool
		err := s.pool.QueryRow(ctx, sqlWorkerExists, workerID, p.WorkspaceID, p.KeyID).Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, false, apierr.NotFound("worker")
		}
		if err != nil {
			return nil, false, fmt.Errorf("worker lookup: %w", err)
		}
	}
	left := time.Until(poll.deadline)
	if left <= 0 {
		return []ClaimedJob{}, false, nil
	}
	t := time.NewTimer(min(poll.pause, left))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return []ClaimedJob{}, false, nil
	case <-woken:
	case <-t.C:
		poll.pause = min(poll.pause*2, s.pollMax)
	}
	return nil, true, nil
}

// workerTools reads the name@version pairs the key's worker serves (toolKey,
// and anyVersion of each name), which a long poll parks with so that only
// work it can take wakes it; not_found for an unknown worker or another
// key's, as a claim answers.
func (s *Service) workerTools(ctx context.Context, p *auth.Principal, workerID string) (map[string]bool, error) {
	var names, versions []string
	err := s.pool.QueryRow(ctx, sqlWorkerTools, workerID, p.WorkspaceID, p.KeyID).Scan(&names, &versions)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, apierr.NotFound("worker")
	}
	if err != nil {
		return nil, fmt.Errorf("worker lookup: %w", err)
	}
	tools := make(map[string]bool, len(names))
	for i := range min(len(names), len(versions)) {
		tools[toolKey(names[i], versions[i])], tools[anyVersion(names[i])] = true, true
	}
	return tools, nil
}

// claimKey is a claim's ClaimID and the secret its lease tokens are
// derived from.
type claimKey struct{ id, secret string }

// claimSecret is the secret a keyed claim's lease tokens are derived from
// (migration 0042, jobs_claim_token): only the service, which holds the
// hash key, can compute it, and a claim sent again under the same key,
// worker and id computes the same one, and so answers the same tokens.
func (s *Service) claimSecret(keyID, workerID, claimID string) string {
	return hex.EncodeToString(s.mac([]byte("job.claim:" + keyID + ":" + workerID + ":" + claimID)))
}

// claimArgs are sqlClaim's parameters for a claim at now (key: nil for a
// claim without a claimId).
func (s *Service) claimArgs(p *auth.Principal, workerID string, limit int, key *claimKey, now time.Time) []any {
	var claimID, secret *string
	if key != nil {
		claimID, secret = &key.id, &key.secret
	}
	return []any{workerID, p.WorkspaceID, now, p.KeyID, limit, s.leaseGrace.Milliseconds(), now.Truncate(time.Minute),
		LapseWarning, s.claimInputBudget, claimID, secret}
}

// claimOnce runs the claim statement, again when a deadlock rolled it back.
// It runs in a transaction that commits only once every claimed job's input
// is opened: an input this instance cannot open (sealed with a key missing
// from its RESULT_ENCRYPTION_KEY / RESULT_ENCRYPTION_KEYS, as on an instance
// still running the settings before a rotation) rolls the claim back with
// nothing leased (rotation QA: the leases committed and the claim answered
// 500, so each job waited out its lease with an attempt spent, and one with
// maxAttempts 1 failed without ever running). The claim is then made again,
// passing over those jobs (migration 0052), so that a job no instance can
// open, left by a key removed too early, does not hold up the jobs behind
// it; it stays queued, for an instance that has its key, and is logged by
// each claim that passes over it. After maxSkipRounds such rounds the
// claim fails. skip holds the jobs passed over, by earlier looks of the
// same claim too (longPoll), which pass over them without finding them.
func (s *Service) claimOnce(ctx context.Context, p *auth.Principal, workerID string, limit int,
	key *claimKey, skip *[]string) (jobs []ClaimedJob, err error) {
	for round := 1; ; round++ {
		err = s.txRetrying(ctx, func(tx pgx.Tx) (err error) {
			if len(*skip) > 0 {
				if _, err := tx.Exec(ctx, sqlClaimSkip, strings.Join(*skip, ",")); err != nil {
					return fmt.Errorf("claim: set jobs to skip: %w", err)
				}
			}
			jobs, err = s.claimStatement(ctx, tx, p, workerID, limit, key)
			return err
		})
		var unreadable *unreadableInputs
		if !errors.As(err, &unreadable) || round == maxSkipRounds {
			return jobs, err
		}
		passed := false
		for id, openErr := range unreadable.jobs {
			if slices.Contains(*skip, id) {
				// Answered though named: a claim sent again under its
				// claimId answers what the first leased, and cannot pass
				// over any of it; claiming again would only answer it again.
				continue
			}
			s.logger.Warn("claim passed over a job whose input this instance cannot open",
				"job_id", id, "worker_id", workerID, "err", openErr)
			*skip = append(*skip, id)
			passed = true
		}
		if !passed {
			return jobs, err
		}
	}
}

// maxSkipRounds bounds the claims one request makes while it finds jobs
// whose input it cannot open (claimOnce).
const maxSkipRounds = 4

// unreadableInputs fails a claim that leased jobs whose input this
// instance cannot open: their ids and why, the claim rolled back.
type unreadableInputs struct{ jobs map[string]error }

func (u *unreadableInputs) Error() string {
	ids := slices.Sorted(maps.Keys(u.jobs))
	msg := fmt.Sprintf("open input of job %s: %v", ids[0], u.jobs[ids[0]])
	if len(ids) > 1 {
		msg += fmt.Sprintf(" (and %d more jobs)", len(ids)-1)
	}
	return msg
}

// Unwrap answers why each input failed to open, so a claim that gives up
// on them answers the 500 that says a stored value's key is missing.
func (u *unreadableInputs) Unwrap() []error { return slices.Collect(maps.Values(u.jobs)) }

func (s *Service) claimStatement(ctx context.Context, q db.Querier, p *auth.Principal, workerID string, limit int,
	key *claimKey) ([]ClaimedJob, error) {
	rows, err := q.Query(ctx, sqlClaim, s.claimArgs(p, workerID, limit, key, s.now())...)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	unreadable := &unreadableInputs{jobs: map[string]error{}}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ClaimedJob, error) {
		var j ClaimedJob
		if r.RawValues()[0] == nil {
			return j, errClaimKeyRevoked // sqlClaim's row for a revoked key
		}
		var sealed []byte
		err := r.Scan(&j.JobID, &j.StepID, &j.RunID, &j.Name, &j.Version, &j.Attempt, &j.MaxAttempts, &j.LeaseToken,
			&j.LeaseExpiresAt, &j.TimeoutMs, &j.IdempotencyKey, &sealed)
		if err != nil {
			return j, err
		}
		j.LeaseExpiresAt = j.LeaseExpiresAt.UTC()
		j.LeaseMs = j.TimeoutMs + s.leaseGrace.Milliseconds()
		if j.Input, err = s.open(j.JobID, "input", sealed); err != nil {
			unreadable.jobs[j.JobID] = err // read on: the next claim passes over every one
		}
		return j, nil
	})
	if errors.Is(err, errClaimKeyRevoked) {
		return nil, auth.ErrRevokedKey() // revoked since this instance authenticated the claim
	}
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if len(unreadable.jobs) > 0 {
		return nil, fmt.Errorf("claim: %w", unreadable)
	}
	return jobs, nil
}

// errClaimKeyRevoked stops reading a claim's rows at the one sqlClaim
// answers for a revoked key.
var errClaimKeyRevoked = errors.New("claim: key revoked")

// HeartbeatRequest is the body of POST /api/v1/jobs/{id}/heartbeat.
type HeartbeatRequest struct {
	LeaseToken string `json:"leaseToken" openapi:"minLength=1"`
}

// HeartbeatResult answers a heartbeat.
type HeartbeatResult struct {
	LeaseExpiresAt  *time.Time `json:"leaseExpiresAt" openapi:"notNull"` // set by every claim, never cleared: never null
	CancelRequested bool       `json:"cancelRequested"`
}

// Heartbeat extends the current lease by the job's timeout plus the grace
// (not a cancelled attempt's: see below).
// A key restricted to some tools may heartbeat only their jobs.
func (s *Service) Heartbeat(ctx context.Context, p *auth.Principal, jobID string, req HeartbeatRequest) (HeartbeatResult, error) {
	if req.LeaseToken == "" {
		return HeartbeatResult{}, apierr.InvalidField("leaseToken", "is required")
	}
	// A second pass only after a revive that took nothing back: the job
	// was no longer requeued when the revive had its row (reported, claimed,
	// or taken back by a retry of this heartbeat meanwhile), or its endpoint
	// had no room. The state read again says which.
	for pass := 0; ; pass++ {
		out, err := s.extendLease(ctx, p, jobID, req.LeaseToken)
		if !errors.Is(err, pgx.ErrNoRows) {
			return out, err
		}
		st, err := s.readLeaseState(ctx, p, jobID, req.LeaseToken)
		if err != nil {
			return HeartbeatResult{}, err
		}
		if !st.requeued {
			return st.answer()
		}
		if pass > 0 {
			// lease_lost all the same: the worker must stop, or the
			// endpoint's limit is passed. Said plainly, since no attempt
			// supersedes this one yet (QA: "another attempt holds the job"
			// misled).
			return HeartbeatResult{}, apierr.Conflict(apierr.CodeLeaseLost, "This lease lapsed and the job was "+
				"queued again; its endpoint's concurrency slot went to another job, so stop. A report with this "+
				"token is still recorded until the job is claimed again.")
		}
		out, err = s.revive(ctx, p, jobID, req.LeaseToken)
		if !errors.Is(err, pgx.ErrNoRows) {
			return out, err
		}
	}
}

// leaseState is what a heartbeat that extended no lease reads of its job
// and token (sqlLeaseState), to answer why.
type leaseState struct {
	status                                                string
	current, requeued, replayedOpen, unreported, reported bool
	cancelledRequeued                                     bool
	leaseExpiresAt                                        *time.Time
	cancelRequested                                       bool
}

// readLeaseState reads the job's lease state for token; not_found for a job
// the workspace does not have, forbidden for one whose tool the key may
// not work.
func (s *Service) readLeaseState(ctx context.Context, p *auth.Principal, jobID, token string) (leaseState, error) {
	var st leaseState
	var name, version string
	err := s.pool.QueryRow(ctx, sqlLeaseState, jobID, p.WorkspaceID, token).Scan(&st.status, &st.current,
		&st.leaseExpiresAt, &st.cancelRequested, &name, &version, &st.requeued, &st.replayedOpen, &st.unreported,
		&st.reported, &st.cancelledRequeued)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return st, apierr.NotFound("job")
	case err != nil:
		return st, fmt.Errorf("heartbeat: %w", err)
	case !p.MayWorkTool(name, version):
		return st, p.RequireTools([2]string{name, version})
	}
	return st, nil
}

// answer answers a heartbeat whose token holds no running job and whose job
// is not requeued under it.
func (st leaseState) answer() (HeartbeatResult, error) {
	out := HeartbeatResult{LeaseExpiresAt: st.leaseExpiresAt, CancelRequested: st.cancelRequested}
	switch {
	case st.replayedOpen:
		// Its attempt was cancelled, then the job replayed: the worker
		// should stop, and its report is still recorded (decideReport).
		out.CancelRequested, out.LeaseExpiresAt = true, utc(out.LeaseExpiresAt)
		return out, nil
	case st.cancelledRequeued:
		// Requeued, then cancelled: its worker may still be at work, and
		// its report is still recorded, as for any cancelled attempt not
		// yet reported; it should stop. Its lapsed lease is not extended,
		// and it takes back no slot (the requeue freed it).
		out.CancelRequested, out.LeaseExpiresAt = true, utc(out.LeaseExpiresAt)
		return out, nil
	case !st.current && st.reported:
		// Replayed or requeued, then reported, and claimed by no one
		// since: the token is not superseded, its attempt is over (QA:
		// lease_lost said a later attempt held the job).
		return out, apierr.InvalidState("This attempt already ended; the job is %s.", st.status)
	case !st.current:
		return out, errLeaseLost()
	case st.status == StatusCancelled && st.unreported:
		// The worker should stop (cancelRequested is true). Its lease is
		// not extended: a worker heartbeating on after the cancel would
		// otherwise hold its endpoint's slot for as long as it liked.
		out.LeaseExpiresAt = utc(out.LeaseExpiresAt)
		return out, nil
	case st.status == StatusCancelled:
		// QA: an attempt reported before the cancel got its lease back.
		return out, apierr.InvalidState("This attempt already ended; the job is %s.", st.status)
	case st.status == StatusRetryScheduled || st.status == StatusQueued:
		// QA: "the job already ended" read wrong of a job due again.
		return out, apierr.InvalidState("This attempt already ended; the job is %s.", st.status)
	default:
		return out, apierr.InvalidState("The job already ended (%s).", st.status)
	}
}

// extendLease extends a current lease (sqlHeartbeat); pgx.ErrNoRows when
// the token holds no running job the key may work.
func (s *Service) extendLease(ctx context.Context, p *auth.Principal, jobID, token string) (HeartbeatResult, error) {
	var out HeartbeatResult
	err := s.pool.QueryRow(ctx, sqlHeartbeat, jobID, p.WorkspaceID, token, s.now(),
		s.leaseGrace.Milliseconds(), p.Tools).Scan(&out.LeaseExpiresAt, &out.CancelRequested)
	switch {
	case err == nil:
		out.LeaseExpiresAt = utc(out.LeaseExpiresAt)
		return out, nil
	case errors.Is(err, pgx.ErrNoRows):
		return out, err
	default:
		return out, fmt.Errorf("heartbeat: %w", err)
	}
}

// revive gives a job the sweeper requeued, with nothing claimed since, back
// to the worker whose heartbeat shows it still at work, if the endpoint has
// room (sqlReviveRequeued); pgx.ErrNoRows when it took nothing back (no
// room, or the job was no longer requeued once it had its row).
func (s *Service) revive(ctx context.Context, p *auth.Principal, jobID, token string) (HeartbeatResult, error) {
	var out HeartbeatResult
	err := s.pool.QueryRow(ctx, sqlReviveRequeued, jobID, p.WorkspaceID, token, s.now(),
		s.leaseGrace.Milliseconds()).Scan(&out.LeaseExpiresAt, &out.CancelRequested)
	switch {
	case err == nil:
		out.LeaseExpiresAt = utc(out.LeaseExpiresAt)
		return out, nil
	case errors.Is(err, pgx.ErrNoRows):
		return out, err
	default:
		return HeartbeatResult{}, fmt.Errorf("heartbeat: revive: %w", err)
	}
}

func errLeaseLost() *apierr.Error {
	return apierr.Conflict(apierr.CodeLeaseLost, "This lease token does not hold the job: a later attempt does, "+
		"or the token was never this job's.")
}

// ReportRequest is the body of POST /api/v1/jobs/{id}/report.
type ReportRequest struct {
	LeaseToken string          `json:"leaseToken" openapi:"minLength=1"`
	Status     string          `json:"status" openapi:"enum=SUCCEEDED|FAILED"`
	Output     json.RawMessage `json:"output,omitempty"`
	Error      *ReportError    `json:"error,omitempty"`
}

// ReportError is a failed attempt's bounded, redacted error and the worker's
// retry decision.
type ReportError struct {
	Message      string `json:"message,omitempty" openapi:"maxLength=2000"` // may be left out: a failure without a message
	Retryable    *bool  `json:"retryable,omitempty"`
	RetryAfterMs *int64 `json:"retryAfterMs,omitempty" openapi:"min=1000,max=86400000"`
}

// ReportResult answers a report.
type ReportResult struct {
	JobID     string     `json:"jobId"`
	Status    string     `json:"status" openapi:"enum=WAITING|QUEUED|RUNNING|RETRY_SCHEDULED|SUCCEEDED|EXHAUSTED|CANCELLED|SKIPPED"`
	Attempt   int        `json:"attempt"`
	NextDueAt *time.Time `json:"nextDueAt"`
}

const maxErrorMessage = 2000

// validate checks a report's own fields, naming them from its body's root (a batch
// item's are named within the item, answered in its slot).
func (r ReportRequest) validate(p *apierr.Problems) {
	if r.LeaseToken == "" {
		p.Add("leaseToken", "is required")
	}
	hasOutput := len(bytes.TrimSpace(r.Output)) > 0 && !bytes.Equal(bytes.TrimSpace(r.Output), []byte("null"))
	switch r.Status {
	case StatusSucceeded:
		switch {
		case r.Error != nil && r.Error.RetryAfterMs != nil:
			p.Add("error.retryAfterMs", "is refused with a successful result")
		case r.Error != nil:
			p.Add("error", "is only allowed with status FAILED")
		}
	case OutcomeFailed:
		if hasOutput {
			p.Add("output", "is only allowed with status SUCCEEDED")
		}
		if e := r.Error; e != nil {
			if utf8.RuneCountInString(e.Message) > maxErrorMessage {
				p.Add("error.message", "must be at most %d characters", maxErrorMessage)
			}
			if e.RetryAfterMs != nil {
				switch {
				case e.Retryable != nil && !*e.Retryable:
					p.Add("error.retryAfterMs", "is refused with retryable: false")
				case *e.RetryAfterMs < MinRetryAfterMs || *e.RetryAfterMs > MaxRetryAfterMs:
					p.Add("error.retryAfterMs", "must be an integer from 1000 to 86400000")
				}
			}
		}
	default:
		p.Add("status", "must be SUCCEEDED or FAILED")
	}
}

// Report records an attempt's outcome, fenced by its lease token. A key
// restricted to some tools may report only their jobs.
func (s *Service) Report(ctx context.Context, p *auth.Principal, jobID string, req ReportRequest) (ReportResult, error) {
	var pr apierr.Problems
	req.validate(&pr)
	if err := pr.Err(); err != nil {
		return ReportResult{}, err
	}
	var (
		out  reportOutcome
		wake reportWakes
	)
	checks := newOutputChecks()
	err := s.txRetrying(ctx, func(tx pgx.Tx) error {
		res, w, err := s.reportMany(ctx, tx, p, []reportItem{{jobID: jobID, req: req}}, checks)
		if err != nil {
			return err
		}
		out, wake = res[0], w
		// A refused report changed nothing: rolling back is the same.
		return out.err
	})
	if err == nil {
		s.wakeAfterReport(p.WorkspaceID, wake)
	}
	return out.res, err
}

// BatchReportItem is one job's report in a batch: a single report's fields
// plus jobId (spelled out so decoding errors name wire paths).
type BatchReportItem struct {
	JobID      string          `json:"jobId"`
	LeaseToken string          `json:"leaseToken"`
	Status     string          `json:"status" openapi:"enum=SUCCEEDED|FAILED"`
	Output     json.RawMessage `json:"output,omitempty"`
	Error      *ReportError    `json:"error,omitempty"`
	// refused is why the item could not be read (RefusedBatchItem).
	refused error
}

// RefusedBatchItem is an item of a batch that could not be read as a
// report (a field of the wrong type, or null): it is answered in its slot
// with err, as the single route would answer its body, and the batch's
// other reports are applied (review: a null in one item refused the batch).
func RefusedBatchItem(jobID string, err error) BatchReportItem {
	return BatchReportItem{JobID: jobID, refused: err}
}

func (b BatchReportItem) report() ReportRequest {
	return ReportRequest{LeaseToken: b.LeaseToken, Status: b.Status, Output: b.Output, Error: b.Error}
}

// BatchReportRequest is the body of POST /api/v1/jobs/report.
type BatchReportRequest struct {
	Reports []BatchReportItem `json:"reports" openapi:"required,minItems=1,maxItems=100"`
}

// BatchReportError is a refused report in a batch (the same code, message
// and detail a single report would answer).
type BatchReportError struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Detail  map[string]any `json:"detail"`
}

// BatchReportResult is one report's answer: the single report's object, or
// its error.
type BatchReportResult struct {
	JobID     string            `json:"jobId"`
	Status    string            `json:"status,omitempty" openapi:"enum=WAITING|QUEUED|RUNNING|RETRY_SCHEDULED|SUCCEEDED|EXHAUSTED|CANCELLED|SKIPPED"`
	Attempt   int               `json:"attempt,omitempty"`
	NextDueAt *time.Time        `json:"nextDueAt"` // null unless a retry is scheduled, as the single report answers
	Error     *BatchReportError `json:"error,omitempty"`
}

// BatchReportResponse answers a batch in request order.
type BatchReportResponse struct {
	Results []BatchReportResult `json:"results" openapi:"notNull"` // one a report (ReportBatch)
}

const maxBatchReports = 100

// ReportBatch applies several reports, each fenced by its own lease token, in
// one transaction (one commit for the batch). A report refused for its own
// reason (lease_lost, invalid_state, not_found, or invalid_request for its
// own fields) is answered in its slot and does not affect the others; so is
// one for a tool a restricted key may not work (forbidden). Only a batch
// that is not one (no reports, more than 100), or whose successes' outputs
// one report's check budget cannot cover (outputChecks), is refused whole.
func (s *Service) ReportBatch(ctx context.Context, p *auth.Principal, req BatchReportRequest) (BatchReportResponse, error) {
	if len(req.Reports) == 0 || len(req.Reports) > maxBatchReports {
		return BatchReportResponse{}, apierr.InvalidField("reports", "must hold 1-100 reports")
	}
	out := BatchReportResponse{Results: make([]BatchReportResult, len(req.Reports))}
	var (
		items []reportItem
		slots []int // items[k] answers out.Results[slots[k]]
	)
	seen := map[string]bool{}
	for i, r := range req.Reports {
		// Each item is checked as the single report route checks its own
		// request (QA: one malformed item refused the batch, and with it
		// the reports of jobs that had finished).
		var pr apierr.Problems
		switch {
		case r.refused != nil:
			out.Results[i] = refusedInBatch(r.JobID, r.refused)
			continue
		case r.JobID == "":
			// Left out: the item is malformed (fuzz QA: it answered
			// not_found, as for an id that names no job).
			out.Results[i] = refusedInBatch(r.JobID, apierr.InvalidField("jobId", "is required"))
			continue
		case !ids.Valid(ids.Job, r.JobID):
			out.Results[i] = refusedInBatch(r.JobID, apierr.NotFound("job"))
			continue
		}
		if seen[r.JobID] {
			pr.Add("jobId", "appears twice in the batch (the first valid report of it is the one applied)")
		}
		report := r.report()
		report.validate(&pr)
		if err := pr.Err(); err != nil {
			out.Results[i] = refusedInBatch(r.JobID, err)
			continue
		}
		seen[r.JobID] = true // only a report that is applied takes the job
		items = append(items, reportItem{jobID: r.JobID, req: report})
		slots = append(slots, i)
	}
	if len(items) == 0 {
		return out, nil
	}
	checks := newOutputChecks()
	var wake reportWakes
	err := s.txRetrying(ctx, func(tx pgx.Tx) error {
		res, w, err := s.reportMany(ctx, tx, p, items, checks)
		if err != nil {
			return err
		}
		wake = w
		for k, r := range res {
			i := slots[k]
			if r.err != nil {
				if _, ok := apierr.As(r.err); ok {
					out.Results[i] = refusedInBatch(items[k].jobID, r.err)
					continue
				}
			}
			out.Results[i] = BatchReportResult{JobID: r.res.JobID, Status: r.res.Status, Attempt: r.res.Attempt,
				NextDueAt: r.res.NextDueAt}
		}
		return nil
	})
	if errors.Is(err, errOverBudget) {
		// The outputs checked before this one left too little to check it
		// (outputChecks): the transaction, which recorded nothing, is
		// rolled back, and the batch refused whole.
		return BatchReportResponse{}, errReportsTooCostly()
	}
	if err == nil {
		s.wakeAfterReport(p.WorkspaceID, wake)
	}
	return out, err
}

// refusedInBatch answers a refused report in its batch slot: the code,
// message and detail the single report route would answer (detail {} when
// there is none).
func refusedInBatch(jobID string, err error) BatchReportResult {
	e, _ := apierr.As(err)
	w := e.Wire()
	return BatchReportResult{JobID: jobID, Error: &BatchReportError{Code: w.Code, Message: w.Message, Detail: w.Detail}}
}

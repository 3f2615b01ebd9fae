package jobs

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/seal"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// Reports are applied set-based: one statement locks every job of the batch
// (in id order, so concurrent batches cannot deadlock) and reads the
// execution each lease token names, Go decides each report's outcome, and one
// statement records them all. A batch of a hundred successes therefore costs
// the same four round trips as a single report (BEGIN, lock, apply, COMMIT);
// only endings with consequences (released dependents, a run to settle, an
// output contract to check) add statements, and those are set-based too.

// reportItem is one validated report of a batch.
type reportItem struct {
	jobID string
	req   ReportRequest
}

// reportOutcome is one report's answer: its result or its refusal.
type reportOutcome struct {
	res ReportResult
	err error
}

// lockedJob is a job locked for a report, with the execution its lease token
// names (the x fields are nil when the token names none).
type lockedJob struct {
	runLocked, dependents bool
	status                string
	attempt               int
	pol                   RetryPolicy
	stepID, runID         string
	requested             bool
	xAttempt              *int32
	xOutcome, xResult     *string
	xReported, xNext      *time.Time
	name                  string
	version               *string // read only for a key restricted to some tools
	requeued              bool    // QUEUED again by the sweeper after its lease lapsed (read in decideReport)
	replayed              bool    // replayed since its lapsed cancelled attempt was failed (read in decideReport)
	contractVersion       *int32
	xRejected             bool
	workspaceID, jobID    string
	endpointID            string
	circuitHint           bool // the endpoint's breaker is on or its circuit open (see sqlReportLock)
	// gated: the endpoint has maxConcurrent, a breaker or an open circuit
	// (jobs_report_lock_endpoints locked it): a report ending its attempt
	// may free a concurrency slot a parked claim waits for.
	gated bool
}

// applyRow is one report to record: the execution's outcome and, when
// updateJob, the job's next status.
type applyRow struct {
	jobID      string
	attempt    int
	next       string
	due        *time.Time
	finished   *time.Time
	output     []byte
	preview    *string
	outcome    string
	retryable  *bool
	retryAfter *int64
	errSealed  []byte
	updateJob  bool
	warning    *string
	rejected   bool
	reheld     bool // a requeued job's late report: its slot is taken back first (sqlAdjustSlots)
	released   bool // a cancelled attempt's report: the slot it may still hold is freed (sqlAdjustSlots)
}

// reportMany applies validated reports (distinct job ids) inside tx and
// answers each in its slot, its successes' outputs checked from checks'
// one budget (outputChecks). A report refused for its own reason
// (lease_lost, invalid_state, not_found) does not affect the others; any
// other error aborts the transaction. wake says which parked claims are
// worth waking once tx commits (reportWakes).
func (s *Service) reportMany(ctx context.Context, tx pgx.Tx, p *auth.Principal, items []reportItem, checks *outputChecks) (
	out []reportOutcome, wake reportWakes, err error) {
	workspaceID := p.WorkspaceID
	locked, err := s.lockForReport(ctx, tx, p, items)
	if err != nil {
		return nil, reportWakes{}, err
	}
	now := s.now()
	out = make([]reportOutcome, len(items))
	var (
		apply      []applyRow
		done       []endedStep
		dependents bool
		settle     = map[string]bool{} // run → its shared lock is still to be taken
		unasked    []string            // runs read as not finishing, whose shared lock we hold
	)
	for i, it := range items {
		j, ok := locked[it.jobID]
		if !ok {
			out[i].err = apierr.NotFound("job")
			continue
		}
		if p.Tools != nil && !p.MayWorkTool(j.name, *j.version) {
			out[i].err = p.RequireTools([2]string{j.name, *j.version})
			continue
		}
		res, row, err := s.decideReport(ctx, tx, j, it.req, checks, now)
		if err != nil {
			if _, ok := apierr.As(err); !ok {
				return nil, reportWakes{}, err
			}
			out[i].err = err
			continue
		}
		out[i].res = res
		if row == nil {
			continue
		}
		apply = append(apply, *row)
		if row.updateJob && ended(row.next) {
			done = append(done, endedStep{stepID: j.stepID, runID: j.runID, workspaceID: workspaceID,
				jobID: j.jobID, status: row.next, attempt: row.attempt})
			dependents = dependents || j.dependents
			// An exhausted step fails its run at once; otherwise only a
			// run whose completion was requested may end.
			if j.requested || !j.runLocked || row.next == StatusExhausted {
				settle[j.runID] = settle[j.runID] || !j.runLocked
			} else if !slices.Contains(unasked, j.runID) {
				unasked = append(unasked, j.runID)
			}
		}
	}
	// slotted are the jobs whose endpoints' concurrency counts the
	// recording may change: every statement below that locks endpoint rows
	// locks all of theirs, in id order.
	var (
		reheld, freed, slotted []string
		freedAttempts          []int32
	)
	for _, row := range apply {
		if row.reheld {
			reheld = append(reheld, row.jobID)
		}
		if row.released {
			freed, freedAttempts = append(freed, row.jobID), append(freedAttempts, int32(row.attempt))
		}
		if row.updateJob || row.released {
			slotted = append(slotted, row.jobID)
			if !row.reheld && locked[row.jobID].gated {
				wake.slots = append(wake.slots, locked[row.jobID].name)
			}
		}
	}
	// The endpoint rows were locked by sqlReportLock (see recordCircuits).
	circuitClosed, err := s.recordCircuits(ctx, tx, workspaceID, tallyCircuits(apply, locked), slotted, now)
	if err != nil {
		return nil, reportWakes{}, err
	}
	if reheld != nil || freed != nil {
		if _, err := tx.Exec(ctx, sqlAdjustSlots, reheld, freed, freedAttempts, slotted, now); err != nil {
			return nil, reportWakes{}, fmt.Errorf("report: adjust slots: %w", err)
		}
	}
	finishing, err := s.applyReports(ctx, tx, workspaceID, apply, now, unasked)
	if err != nil {
		return nil, reportWakes{}, err
	}
	if err := s.keepCancelledOutputs(ctx, tx, apply, now); err != nil {
		return nil, reportWakes{}, err
	}
	for _, runID := range finishing {
		if _, ok := settle[runID]; !ok {
			settle[runID] = false
		}
	}
	if len(done) > 0 {
		// The common case costs no statement here: no dependents, and
		// completion not requested while the run lock was taken unopposed.
		// A run lock the report's lock did not get is taken before the
		// dependents' rows are (the lock order, see sqlRunLockShared).
		runs := slices.Sorted(maps.Keys(settle))
		for _, runID := range runs {
			if settle[runID] {
				if _, err := tx.Exec(ctx, sqlRunLockShared, runID); err != nil {
					return nil, reportWakes{}, fmt.Errorf("lock run: %w", err)
				}
			}
		}
		if _, _, err := s.release(ctx, tx, done, dependents); err != nil {
			return nil, reportWakes{}, err
		}
		for _, runID := range runs {
			if err := s.lockAndSettle(ctx, tx, runID, false); err != nil {
				return nil, reportWakes{}, err
			}
		}
	}
	wake.all = dependents || circuitClosed
	return out, wake, nil
}

// reportWakes says which parked claims a recorded report batch is worth
// waking: all of the workspace's when a step with dependents ended (which
// may have queued them) or a circuit closed; otherwise one per attempt it
// ended on an endpoint with maxConcurrent (or a breaker), whose slot a
// claim may be waiting for (wake QA: such a claim waited for its next
// poll). One each, not all: a report rate of claims would otherwise look
// at once for every freed slot.
type reportWakes struct {
	all   bool
	slots []string // the tool of each attempt that freed a slot
}

// wakeAfterReport wakes the claims w names, once the report committed.
func (s *Service) wakeAfterReport(workspaceID string, w reportWakes) {
	if w.all {
		s.wake.wakeAll(workspaceID)
		return
	}
	for _, name := range w.slots {
		s.wakeForSlot(workspaceID, name)
	}
}

// wakeForSlot wakes a claim for a slot an attempt of tool name freed in
// workspaceID (waker.wakeSlot).
func (s *Service) wakeForSlot(workspaceID, name string) { s.wake.wakeSlot(workspaceID, name) }

// lockForReport locks the items' jobs in id order and reads them with the
// executions their tokens name.
func (s *Service) lockForReport(ctx context.Context, tx pgx.Tx, p *auth.Principal, items []reportItem) (map[string]*lockedJob, error) {
	workspaceID := p.WorkspaceID
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b reportItem) int { return strings.Compare(a.jobID, b.jobID) })
	jobIDs, tokens := make([]string, len(sorted)), make([]string, len(sorted))
	for i, it := range sorted {
		jobIDs[i], tokens[i] = it.jobID, it.req.LeaseToken
	}
	rows, err := tx.Query(ctx, sqlReportLock, db.TextArray(jobIDs), workspaceID, db.TextArray(tokens), p.Tools != nil)
	if err != nil {
		return nil, fmt.Errorf("report lock: %w", err)
	}
	defer rows.Close()
	locked := make(map[string]*lockedJob, len(items))
	for rows.Next() {
		j := &lockedJob{workspaceID: workspaceID}
		if err := rows.Scan(nil, &j.runLocked, &j.dependents, &j.status, &j.attempt, &j.pol.MaxAttempts, &j.stepID,
			&j.runID, &j.endpointID, &j.pol.Preset, &j.pol.InitialDelayMs, &j.pol.Multiplier, &j.pol.MaxDelayMs,
			&j.pol.JitterPercent, &j.requested, &j.xAttempt, &j.xOutcome, &j.xReported, &j.xResult, &j.xNext,
			&j.name, &j.contractVersion, &j.xRejected, &j.jobID, &j.version, &j.circuitHint, &j.gated); err != nil {
			return nil, fmt.Errorf("report lock: %w", err)
		}
		locked[j.jobID] = j
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("report lock: %w", err)
	}
	return locked, nil
}

// reportedAs is the status the attempt read with j was reported as, if it
// was: what the worker sent (a success its contract refused is recorded
// FAILED, and was reported SUCCEEDED).
func (j *lockedJob) reportedAs() (string, bool) {
	if j.xReported == nil || j.xOutcome == nil {
		return "", false
	}
	if j.xRejected {
		return StatusSucceeded, true
	}
	return *j.xOutcome, true
}

// decideReport answers one report on its locked job: its result and the row
// to record (nil when nothing is recorded), or its refusal.
func (s *Service) decideReport(ctx context.Context, tx pgx.Tx, j *lockedJob, req ReportRequest, checks *outputChecks,
	now time.Time) (ReportResult, *applyRow, error) {
	if j.xAttempt == nil {
		return ReportResult{}, nil, errLeaseLost()
	}
	if j.status != StatusRunning && j.xReported == nil {
		if err := s.rereadExecution(ctx, tx, j, req.LeaseToken); err != nil {
			return ReportResult{}, nil, err
		}
	}
	if j.status == StatusQueued {
		// Read under the lock, like the execution: a requeue that committed
		// while this report waited shows.
		if err := tx.QueryRow(ctx, sqlRequeuedFor, j.jobID, req.LeaseToken).Scan(&j.requeued); err != nil {
			return ReportResult{}, nil, fmt.Errorf("report: requeued: %w", err)
		}
	}
	if j.status == StatusCancelled && j.xOutcome != nil && j.xReported == nil {
		// The sweeper failed this cancelled attempt as lapsed: its report
		// is still recorded, unless a replay queued the job again since
		// (and it was cancelled again): the replay's claim would supersede
		// it, and until then the token is lease_lost, as its heartbeat
		// answers and as the report answered before the second cancel
		// (model QA: recorded after that cancel, an ended attempt's
		// outcome replaced and its output put on the job).
		if err := tx.QueryRow(ctx, sqlReplayedSince, j.jobID).Scan(&j.replayed); err != nil {
			return ReportResult{}, nil, fmt.Errorf("report: replayed: %w", err)
		}
	}
	xa := int(*j.xAttempt)
	switch {
	case xa < j.attempt:
		// A newer claim superseded this attempt: lease_lost, even for a
		// repeat of the report it made (API.md §5), whose answer would
		// describe a job that has moved on (contract QA: a repeat after a
		// retry succeeded answered RETRY_SCHEDULED). The refusal says what
		// the attempt was reported as, if it was, so that a worker whose
		// first answer was lost learns it landed (as the gate's does).
		lost := errLeaseLost().WithDetail("attempt", xa)
		if sent, ok := j.reportedAs(); ok {
			lost = lost.WithDetail("reportedOutcome", sent)
		}
		return ReportResult{}, nil, lost
	case j.xReported != nil && j.xOutcome != nil:
		// Already reported: the same outcome answers the same object.
		sent, _ := j.reportedAs()
		if sent != req.Status {
			return ReportResult{}, nil, apierr.InvalidState("This attempt was already reported as %s.", sent)
		}
		if sent == OutcomeFailed && !j.xRejected {
			if err := s.sameFailure(ctx, tx, j.jobID, xa, req.Error); err != nil {
				return ReportResult{}, nil, err
			}
		}
		return ReportResult{JobID: j.jobID, Status: *j.xResult, Attempt: xa, NextDueAt: utc(j.xNext)}, nil, nil
	case j.status == StatusCancelled && !j.replayed, j.status == StatusQueued && !j.requeued && j.xOutcome == nil:
		// Cancelled while running, or since replayed (QUEUED again) while
		// this attempt may still have been running and no claim has
		// superseded it: its report is recorded (API.md §5) on the
		// attempt, not the job, and frees the slot it held (QA: after a
		// replay it was refused, and the worker's success thrown away).
		row := s.outcomeRow(j.jobID, xa, req, j.status, nil, nil)
		row.updateJob, row.released = false, true
		if j.xOutcome != nil {
			// The sweeper had failed the attempt as lapsed (its lease
			// expired unreported): the report replaces that outcome, so
			// the lapse's warning would now contradict it (contract QA:
			// SUCCEEDED read "Lease expired without a report").
			row.warning = &lateCancelledReportWarning
		}
		return ReportResult{JobID: j.jobID, Status: j.status, Attempt: xa}, &row, nil
	case j.status == StatusQueued && !j.requeued, j.replayed:
		// A replay queued the job again after this attempt ended
		// unreported (its lease lapsed), cancelled again since or not: its
		// next claim supersedes it.
		return ReportResult{}, nil, errLeaseLost()
	case j.status != StatusRunning && j.status != StatusQueued:
		// detail.leaseLapsed: the job ended because this attempt, its last,
		// lapsed unreported, so the worker's outcome is the one lost here
		// (a worker counts it not recorded), not settled by another's.
		return ReportResult{}, nil, apierr.InvalidState("The job already ended (%s); this report was not recorded.", j.status).
			WithDetail("status", j.status).WithDetail("leaseLapsed", j.xReported == nil && xa == j.attempt)
	}
	// RUNNING, or QUEUED by the sweeper after its lease lapsed and not
	// claimed since: a report with the current token is recorded (API.md §5).

	if req.Status == StatusSucceeded && j.contractVersion != nil {
		rejection, err := checks.output(ctx, tx, j, req.Output)
		if err != nil {
			return ReportResult{}, nil, err
		}
		if rejection != "" {
			// An output schema rejection is a non-retryable failure (seed 000).
			row := s.rejectionRow(j.jobID, j.attempt, rejection, &now)
			row.reheld = j.status == StatusQueued
			return ReportResult{JobID: j.jobID, Status: StatusExhausted, Attempt: j.attempt}, &row, nil
		}
	}
	next, due, finished := StatusSucceeded, (*time.Time)(nil), &now
	if req.Status != StatusSucceeded {
		next = StatusExhausted
		retryable := req.Error == nil || req.Error.Retryable == nil || *req.Error.Retryable
		if retryable && j.attempt < j.pol.MaxAttempts {
			var floor *int64
			if req.Error != nil {
				floor = req.Error.RetryAfterMs
			}
			d := j.pol.NextDue(now, j.attempt, floor, s.jitter())
			next, due, finished = StatusRetryScheduled, &d, nil
		}
	}
	row := s.outcomeRow(j.jobID, j.attempt, req, next, due, finished)
	if j.status == StatusQueued {
		row.reheld, row.warning = true, &lateReportWarning
	}
	return ReportResult{JobID: j.jobID, Status: next, Attempt: j.attempt, NextDueAt: due}, &row, nil
}

// sameFailure refuses a repeated FAILED report of attempt xa of job jobID
// whose decision differs from the recorded one's: whether it may be
// retried and its retryAfterMs, which decided the retry's dueAt, are part
// of its outcome, so a repeat that says otherwise is not the same report
// (QA: it answered 200 and the attempt kept the first word; a repeat with
// another retryAfterMs answered the first's nextDueAt, as if applied), as
// an idempotency key reused with other parameters is refused. Its message
// is not compared: the first stands.
func (s *Service) sameFailure(ctx context.Context, tx pgx.Tx, jobID string, xa int, e *ReportError) error {
	var (
		was      bool
		wasAfter *int64
	)
	if err := tx.QueryRow(ctx, sqlReportedFailure, jobID, xa).Scan(&was, &wasAfter); err != nil {
		return fmt.Errorf("report: read failure: %w", err)
	}
	if now := e == nil || e.Retryable == nil || *e.Retryable; now != was {
		return apierr.InvalidState("This attempt was already reported as FAILED with retryable %t.", was)
	}
	var after *int64
	if e != nil {
		after = e.RetryAfterMs
	}
	switch {
	case after == nil && wasAfter == nil, after != nil && wasAfter != nil && *after == *wasAfter:
		return nil
	case wasAfter == nil:
		return apierr.InvalidState("This attempt was already reported as FAILED without retryAfterMs.")
	}
	return apierr.InvalidState("This attempt was already reported as FAILED with retryAfterMs %d.", *wasAfter)
}

// lateReportWarning marks an attempt reported after the sweeper had queued
// its job again (sqlRequeueLapsed): recorded, since no other attempt ran.
var lateReportWarning = "Reported after its lease lapsed and the job was queued again; no other attempt had run."

// lateCancelledReportWarning marks a cancelled step's attempt reported after
// its lease lapsed and the sweeper had failed it: recorded, since the step
// was cancelled and no other attempt ran.
var lateCancelledReportWarning = "Reported after its lease lapsed; the step had been cancelled and no other attempt had run."

// rereadExecution reads j's execution again. jobs_report_lock reads the job
// row as its lock was granted but the execution as the statement began, so
// a report of the same attempt that committed while this one waited for
// the lock (a client's retry racing its original) shows in the job's
// status only; without this read it would be refused as too late, or
// recorded a second time on a cancelled job.
func (s *Service) rereadExecution(ctx context.Context, tx pgx.Tx, j *lockedJob, token string) error {
	err := tx.QueryRow(ctx, sqlExecutionByToken, j.jobID, token).Scan(&j.xAttempt, &j.xOutcome, &j.xReported,
		&j.xResult, &j.xNext, &j.xRejected)
	if err != nil {
		return fmt.Errorf("report: read execution: %w", err)
	}
	return nil
}

// outcomeRow is the row recording the worker's own outcome: the sealed
// output or error as the worker sent them.
func (s *Service) outcomeRow(jobID string, attempt int, req ReportRequest, next string, due, finished *time.Time) applyRow {
	row := applyRow{jobID: jobID, attempt: attempt, next: next, due: due, finished: finished, outcome: req.Status,
		updateJob: true}
	if req.Status == StatusSucceeded && len(bytes.TrimSpace(req.Output)) > 0 {
		row.output = s.sealer.Seal(req.Output, seal.AAD(jobID, "output"))
		pv := string(redact.PreviewJSON(req.Output))
		row.preview = &pv
	}
	if req.Status == OutcomeFailed {
		// A failure without a decision is retryable, as it is scheduled:
		// recorded so, the attempt reads what was decided (contract QA:
		// a FAILED report without an error object read retryable null
		// while its job was scheduled again, and {"error": {}} read true).
		t := req.Error == nil || req.Error.Retryable == nil || *req.Error.Retryable
		row.retryable = &t
	}
	if req.Error != nil {
		row.retryAfter = req.Error.RetryAfterMs
		// Masked as the SDKs mask it before sending (ratchet.RedactText):
		// a worker reporting over plain HTTP may send a token the console
		// would otherwise show to every reader of the run (console QA).
		// Masking may lengthen it ("?q" reads "?[redacted]"): it is held
		// to the limit the message was checked against (cutMessage), as a
		// step answers its attempts whole (size QA).
		if msg := cutMessage(ratchet.RedactText(req.Error.Message), maxErrorMessage); msg != "" {
			row.errSealed = s.sealer.Seal([]byte(msg), seal.AAD(jobID, fmt.Sprintf("error/%d", attempt)))
		}
	}
	return row
}

// rejectionRow records a success whose output the contract refused: the
// execution fails, non-retryable, with the rejection as its warning and
// error, the output is not stored, and the job is EXHAUSTED.
func (s *Service) rejectionRow(jobID string, attempt int, rejection string, finished *time.Time) applyRow {
	retryable := false
	return applyRow{jobID: jobID, attempt: attempt, next: StatusExhausted, finished: finished, outcome: OutcomeFailed,
		retryable: &retryable, errSealed: s.sealer.Seal([]byte(rejection), seal.AAD(jobID, fmt.Sprintf("error/%d", attempt))),
		updateJob: true, warning: &rejection, rejected: true}
}

// keepCancelledOutputs stores the output of successes reported for jobs
// cancelled while they ran: the job stays CANCELLED (or QUEUED, replayed
// since), but the result the worker was told was recorded is kept (the step
// shows its preview until another attempt's replaces it), not dropped with
// the status change the cancel already made.
func (s *Service) keepCancelledOutputs(ctx context.Context, tx pgx.Tx, rows []applyRow, now time.Time) error {
	var (
		ids      []string
		outputs  [][]byte
		previews []*string
	)
	for _, r := range rows {
		if !r.updateJob && r.outcome == StatusSucceeded && r.output != nil {
			ids, outputs, previews = append(ids, r.jobID), append(outputs, r.output), append(previews, r.preview)
		}
	}
	if ids == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, sqlKeepCancelledOutputs, ids, outputs, previews, now); err != nil {
		return fmt.Errorf("report: cancelled outputs: %w", err)
	}
	return nil
}

// applyReports records rows in one statement.
//
// unasked are runs whose completion jobs_report_lock read as not requested
// while it took their shared lock unopposed. It read them as its statement
// began, before the lock: a finish that committed in between is seen
// neither by its own check (the step had not ended yet) nor by that read.
// This statement begins after the lock, so the runs it answers as finishing
// are complete: a finish it does not see waits for the lock, and its check
// then sees these steps ended.
func (s *Service) applyReports(ctx context.Context, tx pgx.Tx, workspaceID string, rows []applyRow, now time.Time,
	unasked []string) (finishing []string, err error) {
	if len(rows) == 0 {
		return nil, nil
	}
	n := len(rows)
	var (
		jobIDs, next, outcome = make([]string, n), make([]string, n), make([]string, n)
		attempts              = make([]int32, n)
		due, finished         = make([]*time.Time, n), make([]*time.Time, n)
		output, errSealed     = make([][]byte, n), make([][]byte, n)
		preview, warning      = make([]*string, n), make([]*string, n)
		retryable             = make([]*bool, n)
		retryAfter            = make([]*int64, n)
		updateJob, rejected   = make([]bool, n), make([]bool, n)
	)
	for i, r := range rows {
		jobIDs[i], attempts[i], next[i], due[i], finished[i] = r.jobID, int32(r.attempt), r.next, r.due, r.finished
		output[i], preview[i], outcome[i], retryable[i], retryAfter[i] = r.output, r.preview, r.outcome, r.retryable, r.retryAfter
		errSealed[i], updateJob[i], warning[i], rejected[i] = r.errSealed, r.updateJob, r.warning, r.rejected
	}
	if unasked == nil {
		unasked = []string{}
	}
	if err := tx.QueryRow(ctx, sqlReportApply, workspaceID, now, db.TextArray(jobIDs), attempts, db.TextArray(next), due,
		finished, output, preview, db.TextArray(outcome), retryable, retryAfter, errSealed, updateJob, warning, rejected,
		db.TextArray(unasked)).Scan(nil, &finishing); err != nil {
		return nil, fmt.Errorf("report apply: %w", err)
	}
	return finishing, nil
}

package ratchet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Report batching. A worker at high concurrency finishes many jobs per
// second; one HTTP request (and one commit) per report would cap it at the
// request rate. So finished handlers hand their reports to one flusher,
// which sends whatever has gathered as one batch (POST /api/v1/jobs/report)
// when the batch is full or reportLinger after its first report, whichever
// comes first. Each report in a batch is still fenced by its own lease token
// and answered in its own slot: a refused report (lease_lost, say) affects
// only its job. A job's slot is freed once its report is queued; at most
// reportInFlight batches are in flight plus one gathering (and the queue
// behind it), so a slow server slows claiming instead of piling up reports.
// A batch split for a report the server keeps failing on (see send) goes
// on outside that bound, singleReportsInFlight reports at a time: what
// bounds those is that a worker whose reports fail claims nothing more
// until the server records others (holding).
const (
	reportBatchMax   = 100       // the API's limit per batch
	reportBatchBytes = 512 << 10 // well under the API's 1 MiB request limit
	// reportInFlight bounds concurrent batch requests. The server applies a
	// batch in one transaction, report by report; a few batches at once
	// keep its connections busy while the next batch gathers.
	reportInFlight = 3
	// reportLinger is how long the first report of a batch waits for
	// company. Short: it is added to every job's completion latency.
	reportLinger = 10 * time.Millisecond
	// reportLeaseMargin: a report is sent at least this long before its
	// lease (as last extended by a heartbeat) lapses, whatever the linger.
	reportLeaseMargin = 5 * time.Second
	// singleReportsInFlight bounds the single reports a refused batch is
	// sent as.
	singleReportsInFlight = 8
)

// queuedReport is one finished attempt waiting to be sent.
type queuedReport struct {
	id      uint64 // its entry in the reporter's pending set
	job     ClaimedJob
	report  JobReport // LeaseToken set
	expires time.Time // the lease's expiry as last known
	size    int       // approximate encoded size
}

func newQueuedReport(j ClaimedJob, r JobReport, expires time.Time) queuedReport {
	r.LeaseToken = j.LeaseToken
	size := 256 + len(j.JobID) + len(r.LeaseToken) + len(r.Output)
	if r.Error != nil {
		size += len(r.Error.Message)
	}
	return queuedReport{job: j, report: r, expires: expires, size: size}
}

// reporter gathers reports into batches and sends them.
type reporter struct {
	c      *Client
	ctx    context.Context // outlives the worker's ctx: reports are sent after it ends
	giveUp context.CancelFunc
	onErr  func(error)
	// refused, when set, is told a report refused 401 (the key was
	// revoked) instead of onErr: the worker stops (Worker.refuse).
	refused func(notice, err error)
	linger  time.Duration // reportLinger; tests lengthen it

	mu     sync.RWMutex // held (read) while queueing, (write) to close in
	closed bool
	in     chan queuedReport
	slots  chan struct{}  // one per batch in flight
	sends  sync.WaitGroup // batches in flight
	done   chan struct{}  // the flusher has sent everything and returned
	once   sync.Once

	// The reports queued and not yet settled (recorded, or answered for
	// good), which the worker must not claim again while they are held:
	// see holding.
	pmu     sync.Mutex
	nextID  uint64
	pending map[uint64]*pendingReport
	settled chan struct{} // signalled (buffered, 1) whenever a report is settled or found failing on its own
	// recordedSent is the send time of the latest-sent delivery the server
	// recorded a report of, and recordedAt when it did (under pmu): see
	// markFailing.
	recordedSent, recordedAt time.Time
	// deliveryTimeout bounds one delivery (reportTimeout; tests shorten it).
	deliveryTimeout time.Duration
	// lost counts the reports that were not recorded for any reason but a
	// settled refusal (see settledRefusal): given up at close's deadline,
	// or refused for a reason that says nothing about the job (401, 400).
	lost atomic.Int64
}

// pendingReport is what holding needs to know of a queued report.
type pendingReport struct {
	expires      time.Time // its lease's expiry as last known (zero: unknown)
	failing      bool      // a delivery met a failure worth a retry
	failingSince time.Time // when a delivery first did
	ownFailure   bool      // it failed while the server was recording others: see markFailing
}

func newReporter(ctx context.Context, c *Client, onErr func(error), linger time.Duration) *reporter {
	if linger <= 0 {
		linger = reportLinger
	}
	sendCtx, giveUp := context.WithCancel(context.WithoutCancel(ctx))
	r := &reporter{c: c, ctx: sendCtx, giveUp: giveUp, onErr: onErr, linger: linger,
		in: make(chan queuedReport, reportBatchMax), slots: make(chan struct{}, reportInFlight), done: make(chan struct{}),
		pending: map[uint64]*pendingReport{}, settled: make(chan struct{}, 1), deliveryTimeout: reportTimeout}
	go r.run()
	return r
}

// enqueue queues a report; it blocks while a full batch is already waiting
// behind the one in flight, until the reporter gives up (its report then
// goes to OnError). After close, the report is sent at once on its own.
func (r *reporter) enqueue(q queuedReport) {
	r.pmu.Lock()
	r.nextID++
	q.id = r.nextID
	r.pending[q.id] = &pendingReport{expires: q.expires}
	r.pmu.Unlock()
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		r.send([]queuedReport{q})
		return
	}
	select {
	case r.in <- q:
		r.mu.RUnlock()
	case <-r.ctx.Done():
		// Given up (close's deadline passed while the server took no
		// reports): waiting on would hold close, and Stop, past it. It
		// fails under the read lock, which close's write lock waits for,
		// so that Stop counts it and OnError has it before Stop returns
		// (CI under load: failed after the unlock, two reports given up so
		// were counted by no Stop, "698 report(s)" of 700).
		r.fail(q, r.ctx.Err())
		r.mu.RUnlock()
	}
}

// close stops gathering, sends what is queued without lingering, and waits
// until it has been sent: each report retried until the server answers it,
// or until ctx ends, when the reports still unsent are given up (OnError;
// their leases lapse and the jobs run again). It reports whether all were
// sent; lostReports counts those that were not recorded.
func (r *reporter) close(ctx context.Context) bool {
	// Giving up at ctx's end also releases handlers blocked queueing their
	// reports, which close must wait for before it closes the queue.
	stop := context.AfterFunc(ctx, r.giveUp)
	defer stop()
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		close(r.in)
		r.mu.Unlock()
	})
	select {
	case <-r.done:
		return true
	case <-ctx.Done():
	}
	// A ctx that had already ended (a refusal's bound, passed before Stop
	// was called) is ready as soon as close is: with nothing pending there
	// is nothing to give up, however the select chose (CI: a Stop with no
	// reports at all said reports went to OnError, one run in five).
	r.pmu.Lock()
	idle := len(r.pending) == 0
	r.pmu.Unlock()
	r.giveUp() // ends the retries and the requests in flight
	<-r.done
	return idle
}

// run is the flusher.
func (r *reporter) run() {
	defer close(r.done)
	defer r.sends.Wait()
	// carried are the reports left for the next batch, in order: one that
	// did not fit the previous batch, and those of a job it already named.
	var carried []queuedReport
	for {
		var first queuedReport
		if len(carried) > 0 {
			first, carried = carried[0], carried[1:]
		} else {
			q, ok := <-r.in
			if !ok {
				return
			}
			first = q
		}
		batch, size := []queuedReport{first}, first.size
		named := map[string]bool{first.job.JobID: true}
		var later []queuedReport
		full := false
		deadline := r.deadline(first)
		timer := time.NewTimer(time.Until(deadline))
		add := func(q queuedReport) {
			switch {
			case named[q.job.JobID]:
				// Two attempts' reports of one job (the second claimed
				// after the first's lease lapsed): the server refuses a job
				// named twice in one batch, the second with it (Go SDK QA:
				// the live attempt's report was lost so, and the job ran a
				// third time). It goes in the next batch.
				later = append(later, q)
			case size+q.size > reportBatchBytes:
				later, full = append(later, q), true
			default:
				batch, size, named[q.job.JobID] = append(batch, q), size+q.size, true
				if d := r.deadline(q); d.Before(deadline) {
					deadline = d
					timer.Reset(time.Until(d))
				}
			}
		}
		for len(carried) > 0 && len(batch) < reportBatchMax && !full {
			q := carried[0]
			carried = carried[1:]
			add(q)
		}
	gather:
		for len(batch) < reportBatchMax && !full {
			select {
			case q, ok := <-r.in:
				if !ok {
					break gather // closed: send what there is at once
				}
				add(q)
			case <-timer.C:
				break gather
			}
		}
		carried = append(later, carried...)
		timer.Stop()
		r.slots <- struct{}{} // wait for a free slot; meanwhile reports queue up
		r.sends.Add(1)
		go func() {
			defer func() { <-r.slots; r.sends.Done() }()
			r.send(batch)
		}()
	}
}

// deadline is when a batch holding q must be sent: after the linger, but
// never later than reportLeaseMargin before q's lease lapses.
func (r *reporter) deadline(q queuedReport) time.Time {
	d := time.Now().Add(r.linger)
	if latest := q.expires.Add(-reportLeaseMargin); !q.expires.IsZero() && latest.Before(d) {
		return latest
	}
	return d
}

// send delivers one batch, and delivers it again for as long as the server
// says a retry may succeed (a 429, a 503, another 5xx, a network failure),
// with capped backoff, until it answers each report for good: recorded, or
// refused for itself (lease_lost, invalid_state, ...). Only close's deadline
// (r.ctx) gives up on it. A job report is accepted even after its lease
// lapsed as long as no newer claim exists (API.md §5), so there is no local
// horizon: a report given up lets the job run again, a second side effect,
// and the worker itself would be the one to reclaim it once the server is
// back. Meanwhile the batch is held (see holding), so the worker claims
// nothing, and every reportTimeout of failures goes to OnError. Reports are
// safe to repeat (the same token and outcome answer the same result).
func (r *reporter) send(batch []queuedReport) {
	var failingSince, warned time.Time
	splittable := false // the previous delivery failed as splitsBatch says
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		err := r.sendOnce(batch, sent)
		if err == nil {
			return
		}
		wait, retry := r.retryDelay(err, attempt)
		if !retry {
			for _, q := range batch {
				r.fail(q, err)
			}
			return
		}
		if len(batch) > 1 && splitsBatch(err) {
			if splittable {
				// The batch failed twice running in a way one report
				// (or the batch route) could cause: each report is sent
				// on its own, with its own retries, on the single-report
				// route, so that one report the server chokes on holds
				// back only itself (see holding) — and not the
				// batch's slot either, which three such reports would
				// otherwise take for good, stalling every report behind
				// them. close still waits for them (r.sends, counted
				// while this batch's own send is).
				r.sends.Add(1)
				go func() {
					defer r.sends.Done()
					r.sendEach(batch)
				}()
				return
			}
			splittable = true
		} else {
			splittable = false
		}
		r.markFailing(batch, sent)
		now := time.Now()
		if failingSince.IsZero() {
			failingSince, warned = now, now
		} else if now.Sub(warned) >= reportTimeout {
			warned = now
			r.onErr(fmt.Errorf("ratchet: report job %s attempt %d (and %d more in its batch) not recorded for %s; still retrying: %w",
				batch[0].job.JobID, batch[0].job.Attempt, len(batch)-1, now.Sub(failingSince).Round(time.Second), err))
		}
		if r.c.sleep(r.ctx, wait) != nil { // the client's own wait; r.ctx ends only when close gives up
			for _, q := range batch {
				r.fail(q, err)
			}
			return
		}
	}
}

// splitsBatch says whether a batch's retryable failure could be one of its
// reports' doing, or the batch route's: a 500, the server failing on what it
// was sent; or an answer that does not line up with the reports sent (not
// one result per report, or results naming other jobs: errBatchMismatch),
// which says nothing of an outage, and which sending the batch again would
// meet for ever (the worker held its claims, its reports never drained and
// Stop waited its deadline out, giving them all up). A 429, a 503 (the
// server or its database unavailable to every request alike), a proxy's 502
// or 504, a timeout, a network failure or an answer cut short say the same
// of every request, and splitting would only multiply them during an
// outage.
func splitsBatch(err error) bool {
	var apiErr *Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusInternalServerError || errors.Is(err, errBatchMismatch)
}

// sendOnce makes one delivery of batch, answering each report it settles
// (recorded, or refused for itself) and the error worth a retry of the
// rest. A lone report uses the single-report route. A batch the server
// refuses as a whole (an older server without the batch route, a body over
// its limit) is sent again report by report, so no outcome depends on the
// batch route existing.
func (r *reporter) sendOnce(batch []queuedReport, sent time.Time) error {
	ctx, cancel := context.WithTimeout(r.ctx, r.deliveryTimeout)
	defer cancel()
	if len(batch) == 1 {
		return r.single(ctx, batch[0], sent)
	}
	items := make([]BatchJobReport, len(batch))
	for i, q := range batch {
		items[i] = BatchJobReport{JobID: q.job.JobID, JobReport: q.report}
	}
	res, err := r.c.ReportJobs(ctx, items)
	if err != nil {
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.StatusCode >= 400 && apiErr.StatusCode < 500 && apiErr.StatusCode != 429 {
			r.sendEach(batch)
			return nil
		}
		return err
	}
	var failures []queuedReport // successes whose output the server can never record, as failures
	for i, x := range res {
		if x.Err == nil {
			r.recorded(batch[i], sent)
		} else if q, ok := r.outputRefused(batch[i], x.Err); ok {
			// Reported as a failure instead, as single does, and as the
			// Python and TypeScript workers read such a refusal in a batch
			// (sdk QA: given up here, the job ran again at every lapse).
			failures = append(failures, q)
		} else {
			r.fail(batch[i], x.Err)
		}
	}
	if len(failures) > 0 {
		r.sendEach(failures)
	}
	return nil
}

// outputRefused says whether err, a report's refusal, refuses the output of
// a success the server can never record; if so it tells OnError and answers
// the non-retryable failure to report instead.
func (r *reporter) outputRefused(q queuedReport, err error) (queuedReport, bool) {
	why, ok := unrecordableOutput(err)
	if !ok || q.report.Status != ReportSucceeded {
		return q, false
	}
	r.onErr(&ReportNotRecordedError{What: "output_refused", JobID: q.job.JobID, Attempt: q.job.Attempt, Err: err})
	q.report = JobReport{LeaseToken: q.report.LeaseToken, Status: ReportFailed,
		Error: &JobError{Message: why, Retryable: false}}
	return q, true
}

// sendEach delivers a refused batch report by report, each with send's
// retries (a single report can meet a 503 as well as the batch did), a few
// at a time so that a hundred reports do not open a hundred connections.
func (r *reporter) sendEach(batch []queuedReport) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, singleReportsInFlight)
	for _, q := range batch {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			r.send([]queuedReport{q})
		}()
	}
	wg.Wait()
}

// single sends one report on its own, answering the error worth a retry.
// A success whose output the server can never record (over its request
// limit, or refused by its rules: a NUL in a string, a number beyond
// float64, a repeated key in raw JSON) is reported as a non-retryable
// failure instead, so the job ends once rather than running again at every
// lapse.
func (r *reporter) single(ctx context.Context, q queuedReport, sent time.Time) error {
	_, err := r.c.ReportJob(ctx, q.job.JobID, q.report)
	if failed, ok := r.outputRefused(q, err); ok {
		q = failed
		_, err = r.c.ReportJob(ctx, q.job.JobID, q.report)
	}
	if err == nil {
		r.recorded(q, sent)
		return nil
	}
	if _, retry := r.retryDelay(err, 0); retry {
		return err
	}
	r.fail(q, err)
	return nil
}

// retryDelay is the client's answer for a report's delivery, and a delivery
// that ran out of its own time (reportTimeout: a connection that hangs, a
// proxy holding the request) is retried too: only r.ctx, which close ends
// when it gives up, ends a report's retries. So is a bare 4xx (notRatchets:
// a proxy's or a load balancer's answer during a deploy or a misroute, a
// 404, a 408), which says nothing of the report, as a 5xx does not (review:
// it was given up, and the job ran again once its lease lapsed); but not a
// bare 413, a body the proxy refuses for good.
func (r *reporter) retryDelay(err error, attempt int) (time.Duration, bool) {
	if errors.Is(err, context.DeadlineExceeded) && r.ctx.Err() == nil {
		return r.c.backoff(attempt), true
	}
	var apiErr *Error
	if notRatchets(err) && errors.As(err, &apiErr) && apiErr.StatusCode < 500 && apiErr.StatusCode != http.StatusRequestEntityTooLarge {
		return r.c.backoff(attempt), true
	}
	return r.c.retryDelay(err, attempt, idempotent)
}

// unrecordableOutput says whether a success report's refusal is about its
// output, and what to report instead: 413 for its size (the server's, or a
// proxy's bare 413 before it: nginx refuses bodies over 1 MB by default,
// and a success report's body is its output; review: given up, the job ran
// again at every lapse), or 400 naming a field under output (the field
// path and rule, never the value).
func unrecordableOutput(err error) (string, bool) {
	var apiErr *Error
	if !errors.As(err, &apiErr) {
		return "", false
	}
	if apiErr.StatusCode == http.StatusRequestEntityTooLarge && notRatchets(err) {
		return "handler output exceeds the request size limit of a proxy before the server", true
	}
	switch apiErr.Code {
	case CodePayloadTooLarge:
		return "handler output exceeds the server's request size limit", true
	case CodeInvalidRequest:
		for _, f := range apiErr.Validation() {
			// The body: only the output can make a report's body
			// unreadable (nested more levels deep than the server reads).
			if f.Field == "output" || f.Field == "body" || strings.HasPrefix(f.Field, "output.") {
				return "handler output refused by the server at " + f.Field, true
			}
		}
	}
	return "", false
}

// fail reports a report that was not recorded; its lease lapses and the job
// is claimed again (unless the refusal says the job is settled already).
func (r *reporter) fail(q queuedReport, err error) { r.settle(q, err, time.Time{}) }

// recorded settles q, which the server recorded from a delivery sent at sent.
func (r *reporter) recorded(q queuedReport, sent time.Time) { r.settle(q, nil, sent) }

// settle ends q's stay in the pending set: recorded (err nil, from a
// delivery sent at sent) or not. A report not recorded goes to OnError, and
// is counted lost unless the server's refusal settled the job's fate itself.
func (r *reporter) settle(q queuedReport, err error, sent time.Time) {
	if jobReportLanded(err, q.report.Status) {
		err = nil
	}
	r.pmu.Lock()
	delete(r.pending, q.id)
	if err == nil && sent.After(r.recordedSent) {
		r.recordedSent, r.recordedAt = sent, time.Now()
	}
	r.pmu.Unlock()
	r.signalSettled()
	if err == nil {
		return
	}
	if !settledRefusal(err) {
		r.lost.Add(1)
	}
	notice := &ReportNotRecordedError{What: "not_recorded", JobID: q.job.JobID, Attempt: q.job.Attempt, Err: err}
	if r.refused != nil && keyRefused(err) {
		r.refused(notice, err)
		return
	}
	r.onErr(notice)
}

// jobReportLanded says whether a report's refusal says an earlier send of
// the same report was recorded: lease_lost naming, in detail.reportedOutcome,
// the status this report sends (its first send landed, its answer was lost,
// and a newer claim came before the retry), as DoEffect's reportLanded reads
// the gate's and the Python and TypeScript workers read it (sdk QA: such a
// report went to OnError as refused).
func jobReportLanded(err error, status string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CodeLeaseLost && e.Detail["reportedOutcome"] == status
}

// settledRefusal says whether a report's refusal is the server's last word
// on the job, so that nothing is lost by it: a newer claim holds the job
// (lease_lost), the job ended or has another outcome recorded
// (invalid_state), or it no longer exists (not_found). A job that ended
// because this attempt, its last, lapsed before the report got through
// (invalid_state with detail.leaseLapsed: an outage outlasted the lease) is
// not settled by it: the handler's outcome is what was lost.
func settledRefusal(err error) bool {
	if IsCode(err, CodeInvalidState) {
		var e *Error
		return !errors.As(err, &e) || e.Detail["leaseLapsed"] != true
	}
	return IsCode(err, CodeLeaseLost) || IsCode(err, CodeNotFound)
}

// markFailing marks the batch's reports, whose delivery sent at sent
// failed, as held by a failing delivery. A report fails on its own when
// the server, after its first failure, recorded a report of a delivery sent
// since, and this one's delivery, sent after that, failed again: the server
// takes reports, and refuses or chokes on this one. Only a failure after
// such a recording says so: when an outage ends, the first report recorded
// says nothing of the others still waiting out their backoff (Go SDK QA:
// they were taken as failing on their own, the worker claimed at once, got
// back the jobs whose outcomes it still held, their leases lapsed in the
// outage, and ran them a second time).
//
// A report found failing on its own no longer holds the claims: settled is
// signalled, as when a report settles, or the worker, waiting on it in
// awaitReports, would claim nothing until another report settled (never,
// with no other job running).
func (r *reporter) markFailing(batch []queuedReport, sent time.Time) {
	r.pmu.Lock()
	now := time.Now()
	released := false
	for _, q := range batch {
		p := r.pending[q.id]
		if p == nil {
			continue
		}
		if !p.failing {
			p.failing, p.failingSince = true, now
		} else if !p.ownFailure && r.recordedSent.After(p.failingSince) && sent.After(r.recordedAt) {
			p.ownFailure, released = true, true
		}
	}
	r.pmu.Unlock()
	if released {
		r.signalSettled()
	}
}

// signalSettled tells a worker waiting in awaitReports that holding may
// have changed (settled holds one signal: one waiting is enough).
func (r *reporter) signalSettled() {
	select {
	case r.settled <- struct{}{}:
	default:
	}
}

// holding says whether the reporter holds a report whose job a claim made
// now could be handed back: one whose delivery has met a failure (the
// server is down or refusing reports for now), or whose lease, as last
// extended, lapses within reportLeaseMargin of horizon (now, or when a
// long-polling claim made now is surely answered). The worker claims nothing
// while it does, so it never runs a job again whose outcome it is holding
// (a claim would meet the same outage anyway); settled signals when that
// may have changed.
//
// A report failing on its own (see markFailing: the server records
// others, and fails on this one, a batch split for it, see splitsBatch)
// does not hold the worker: pausing the worker would not mend it. It is
// still retried until close gives up.
func (r *reporter) holding(horizon time.Time) bool {
	r.pmu.Lock()
	defer r.pmu.Unlock()
	for _, p := range r.pending {
		if p.ownFailure {
			continue // see above
		}
		if p.failing || (!p.expires.IsZero() && !horizon.Before(p.expires.Add(-reportLeaseMargin))) {
			return true
		}
	}
	return false
}

// lostReports is the number of reports not recorded so far, settled
// refusals aside.
func (r *reporter) lostReports() int { return int(r.lost.Load()) }

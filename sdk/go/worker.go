package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DefaultPollInterval is how long an idle worker waits between claims.
// Shorter intervals cost database operations and (on serverless hosting)
// function invocations; budget for them before lowering it.
const DefaultPollInterval = 30 * time.Second

// Heartbeat pacing: a third of the remaining lease, or of the job's timeout
// when that is shorter, within these bounds, so a heartbeat lands well
// inside the lease and a cancellation request is seen within a third of the
// timeout, and within a minute.
const (
	minHeartbeat = time.Second
	maxHeartbeat = time.Minute
)

// claimWaitMargin is the part of the HTTP client's timeout a long-polling
// claim leaves for its round trip.
const claimWaitMargin = 5 * time.Second

// maxFailureWait caps the worker's wait after registrations or claims that
// keep failing for a reason that may pass (see failureWait), unless the
// poll interval is longer: a worker never gives up on a server that is down
// or shedding load, and finds it again within about this long once it is
// back. The Python and TypeScript workers use the same.
const maxFailureWait = time.Minute

// reportTimeout bounds one delivery of a report or batch of reports (with
// the client's own retries), and paces the OnError notices of a report that
// keeps failing (it is retried until the server answers it).
const reportTimeout = 30 * time.Second

// DefaultStopGrace is StartOptions.StopGrace's default, the Python and
// TypeScript workers' too: once Stop's deadline passed (or Start's context
// ended), how long cancelled handlers have to return and be reported; the
// reports are sent until twice that past the deadline. A handler that honours its
// context returns at once; the grace is for one in a call that ends
// shortly after, which is then reported instead of left to run on
// unreported beside the attempt another worker begins once its lease lapses.
const DefaultStopGrace = 10 * time.Second

// StartOptions configure a running worker.
type StartOptions struct {
	// Concurrency is the number of jobs run at once (default 1). Claims ask
	// for as many jobs as there are free slots, at most 100.
	Concurrency int
	// PollInterval is the wait between claims while the queue is empty
	// (default DefaultPollInterval, with ±10% jitter; a longer one than a
	// year is waited as a year). After a full batch the worker claims again
	// at once.
	PollInterval time.Duration
	// WaitSeconds (0–20, default 0) makes each claim long-poll: the server
	// holds an empty claim up to this long and answers as soon as a job is
	// due, so a job enqueued while a claim waits starts within about a
	// second (within milliseconds when the enqueue reaches the same server
	// instance, which wakes the claim). The time a claim spent waiting
	// counts towards the poll interval: between waits the worker sleeps the
	// rest of PollInterval, and a job enqueued then starts at the next
	// claim. To keep a claim waiting at all times, set PollInterval to
	// WaitSeconds (20 s and 20: about 30 claims per idle 10 minutes). With
	// the default interval an idle worker makes no more claim calls than
	// without it; but each idle
	// claim is then a request held open for WaitSeconds (billed time on
	// serverless hosting), and Stop waits for a claim in flight (until its
	// deadline). Values above 20 are clamped, and so are values that would
	// not leave 5 s of the Config.HTTPClient's Timeout for the answer.
	WaitSeconds int
	// OnError receives problems that stay in the process: failed
	// registrations, claims and heartbeats, leases lost (a *LeaseLostError)
	// and reports not recorded (a *ReportNotRecordedError), each naming the
	// job and attempt, handler and classifier panics, invalid classifier
	// decisions. A registration or claim that
	// fails for a reason that may pass (a network error, a 5xx, a 429, after
	// Config.MaxRetries) is retried for as long as the worker runs: after the
	// nth failure in a row the worker waits PollInterval doubled n-1 times,
	// at most a minute (or PollInterval when that is longer), half of it
	// jittered, and never less than the server's Retry-After
	// (detail.retry_after_seconds) within the same cap (and up to a fifth
	// of it more, drawn at random, as after a 429 or a 503). Only a refusal no
	// retry mends stops it (see Worker.Done). Calls are made in order on a goroutine of the
	// worker's own, never on the poll loop, a heartbeat or the reporter, so
	// a slow OnError holds up no work (up to 256 notices wait for it; more
	// are dropped and their count delivered after, but never the refusal
	// that stops the worker), and it may call Stop. A
	// panic in it is recovered and dropped.
	// Errors may hold payload details: do not ship them anywhere you would
	// not ship the payload.
	//
	// Without OnError the worker logs a one-line summary of each problem to
	// log/slog's default logger (slog.Default(), read when the line is
	// written) at Warn, message "ratchet worker", holding none of the
	// error's text: an API error's status, code and request_id, and the
	// call's method, host and path; a network failure's kind ("connection
	// refused", "dns", "timeout", ...) and the call's method, host and path
	// (never a query or body); anything else (a handler or classifier panic,
	// an invalid decision) by its Go type alone, with a hint to set OnError.
	// It logs the first problem at once, then at most one line a minute,
	// whose more_since_last_line counts the problems left out since the line
	// before; once a registration or claim succeeds after a logged failure
	// to reach the server, one line "ratchet worker recovered" with the
	// number of failed calls. A report not recorded is logged with
	// report=not_recorded (or output_refused), its job_id and attempt, then
	// its error as above; a lost lease with lease=lost (or lapsed), its
	// job_id, attempt and tool (name@version), then the heartbeat's refusal; the refusal that stops the worker (see Worker.Done)
	// at once as "ratchet worker refused", whatever the pacing; and
	// whenever the worker stops (Stop, Start giving up, Start's context
	// ending, a refusal), when problems were left out since the last line,
	// one line "ratchet worker stopped" counting them. Setting OnError replaces this log
	// entirely.
	OnError func(error)
	// StopGrace is how long, once Stop's deadline passed (or Start's
	// context ended), cancelled handlers have to return and be reported;
	// every report is sent until the deadline plus twice StopGrace,
	// whenever its handler returned, as in the Python and TypeScript
	// workers: Stop returns within its deadline plus twice StopGrace and a
	// second. A handler cancelled
	// for a lost lease or a cancelled job gets it from the deadline too, as
	// the Python and TypeScript workers give it; from Stop's call (or its
	// cancellation, if later) when Stop's context has no deadline. Zero means
	// DefaultStopGrace (10 s); negative means none.
	StopGrace time.Duration
}

// Worker claims jobs for its registered tools and runs them. Create it with
// NewWorker, add handlers with RegisterTool, then Start and eventually Stop.
//
// Delivery is at least once: a crash after a side effect but before the
// report repeats the effect on another worker, so handlers must pass
// JobContext.IdempotencyKey to their destinations.
type Worker struct {
	c *Client

	mu       sync.Mutex
	tools    map[ToolRef]*registeredTool
	started  bool
	workerID string
	refs     []ToolRef // the registered pairs, to register again
	active   int
	opts     StartOptions

	stopping   chan struct{}           // closed by Stop (under mu): claim no more
	undated    chan struct{}           // closed by a Stop whose context has no deadline (under mu)
	cancelPoll context.CancelFunc      // ends a registration or claim in flight, at Stop's deadline
	slotFreed  chan struct{}           // a handler finished (buffered, 1)
	loopDone   chan struct{}           // closed when polling ended, or Start gave up before it
	done       chan struct{}           // Done's: closed once, when polling ended for good
	refused    error                   // the claim's 401 or 403 that stopped the worker (mu)
	refusedAt  time.Time               // when refused was set (mu): a stop's deadline (boundByRefusal)
	claiming   bool                    // a claim is in flight (mu), for Stop's error
	claimID    string                  // the next claim's id: a lost claim's, to ask again (poll loop only)
	claimLimit int                     // the limit the claim under claimID asked for (poll loop only)
	jobs       sync.WaitGroup          // dispatched jobs, until their report is queued (or left unreported)
	handlers   sync.WaitGroup          // handler calls in progress, stragglers included, settled ones given up (await) excluded
	running    int                     // handler calls in progress whose attempt is not reported (mu)
	startEnded bool                    // Start's context ended: an immediate stop (mu)
	cutByStart int                     // handlers Start's end cut off that returned an error (mu)
	stragglers int                     // handler calls still in progress after their timeout was reported (mu)
	settled    int                     // of running, handlers cancelled for a lost lease or a cancelled job (mu)
	givenUp    int                     // of settled, those no longer waited for: their stop grace passed (mu)
	unreported int                     // handlers left running unreported once their stop grace passed (mu)
	returned   chan struct{}           // signalled (buffered, 1) when running drops
	cancelJobs context.CancelCauseFunc // ends every handler's context
	reporter   *reporter               // batches the handlers' reports
	notices    *notices                // delivers OnError calls (opts.OnError is its notify)

	// Test seams.
	clock        clock
	jitter       func() float64
	reportLinger time.Duration // zero: reportLinger
	log          *slog.Logger  // the default failure log's logger; nil: slog.Default()
	// afterReturn, when set, runs once a handler that returned in time has
	// been awaited, before its result is judged (hctx is its context).
	afterReturn func(hctx context.Context)
}

// clock is the worker's time source; tests replace it to pace the poll loop
// without sleeping.
type clock interface {
	Now() time.Time
	// Timer returns a channel that fires after d and a function stopping it.
	Timer(d time.Duration) (<-chan time.Time, func())
}

type realClock struct{}

// Now returns the wall clock.
func (realClock) Now() time.Time { return time.Now() }

// Timer wraps time.NewTimer.
func (realClock) Timer(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}

// NewWorker returns a worker that uses c (configured with a WORKER key).
func NewWorker(c *Client) *Worker {
	return &Worker{c: c, tools: map[ToolRef]*registeredTool{}, clock: realClock{}, jitter: rand.Float64,
		done: make(chan struct{})}
}

// Done returns a channel closed once the worker has stopped claiming for
// good: Stop was called, Start's context ended, or the server refused the
// worker for good, whichever call met the refusal first: a 401 to any call
// (a claim, a heartbeat, a report: the key was revoked); a claim refused 403
// (the key may not claim) or with any other status no retry mends (400, 409
// but retry_request, 422...: the claim's body is the worker's own); after a
// claim's 404 not_found the worker registers again once, and a registration
// refused, or a 404 again, stops it too. A heartbeat's or report's 403 is
// that job's alone. The refusal goes to OnError, and the worker stops as a
// Stop whose deadline has passed would: a claim in flight is abandoned and
// the running handlers' contexts are cancelled at once (ErrWorkerStopped);
// those that return within StopGrace are reported as they returned. Call
// Stop to wait for them and their reports, as for any stop; its error then
// says the worker was refused and wraps the refusal
// (IsCode(err, CodeUnauthorized), ...). Wait on it beside your shutdown
// signal, so a revoked key ends the process instead of leaving a worker that
// claims nothing. Failures that may pass (a network error, a 5xx, a 429)
// never stop the worker: it goes on claiming with backoff (see
// StartOptions.OnError).
func (w *Worker) Done() <-chan struct{} { return w.done }

func (w *Worker) add(rt *registeredTool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return errors.New("ratchet: register tools before Start")
	}
	if _, dup := w.tools[rt.ref]; dup {
		return fmt.Errorf("ratchet: %s@%s is already registered", rt.ref.Name, rt.ref.Version)
	}
	w.tools[rt.ref] = rt
	return nil
}

// ID returns the worker id the server assigned at Start ("" before).
func (w *Worker) ID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.workerID
}

// Start registers the worker's tools and starts polling in the background.
// It returns once registration succeeded, or failed for good: Ratchet's own
// refusal (401, 403, 400 in its error envelope) is returned at once, while a
// failure that may pass (the server unreachable, a 5xx, a 429: what
// Config.MaxRetries retries; or an answer that is not Ratchet's, as a
// proxy's bare 400, 401 or 404) is retried without end, each failure to OnError, with capped jittered
// backoff (see StartOptions.OnError) and under one Idempotency-Key, until it
// succeeds, ctx ends (Start then returns ctx's error) or Stop is called.
// ctx bounds the
// worker's whole life: cancelling it stops claiming and cancels running
// handlers at once (cause ErrWorkerStopped; their attempts are reported as
// they returned, the context's error as a retryable failure, a result as a
// success, until twice StopGrace past ctx's end, unless Stop is called by
// then, whose deadline decides instead; a report not sent goes
// to OnError and its job runs again once its lease lapses). For a graceful
// shutdown call Stop instead.
//
// If Stop is called while Start is still registering (a SIGTERM during a
// slow start, say), the worker never polls: Start returns an error matching
// ErrWorkerStopped, and Stop returns nil once Start has given up.
func (w *Worker) Start(ctx context.Context, opts StartOptions) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("ratchet: worker already started")
	}
	if len(w.tools) == 0 {
		w.mu.Unlock()
		return errors.New("ratchet: register at least one tool before Start")
	}
	refs := make([]ToolRef, 0, len(w.tools))
	for ref := range w.tools {
		refs = append(refs, ref)
	}
	// The stopping state exists before registration, so that a Stop
	// during it is seen (and can cut it off at its deadline) instead of
	// finding a worker that was "never started" and returning while
	// Start goes on to poll with nobody left to stop it.
	pollCtx, cancelPoll := context.WithCancel(ctx)
	w.started = true
	w.stopping, w.undated, w.loopDone, w.cancelPoll = make(chan struct{}), make(chan struct{}), make(chan struct{}), cancelPoll
	w.mu.Unlock()

	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	notices := newNotices(opts.OnError, w.log, w.clock.Now)
	opts.OnError = notices.notify
	opts.WaitSeconds = min(max(opts.WaitSeconds, 0), 20)
	switch {
	case opts.StopGrace == 0:
		opts.StopGrace = DefaultStopGrace
	case opts.StopGrace < 0:
		opts.StopGrace = 0
	}
	if t := w.c.hc.Timeout; t > 0 && opts.WaitSeconds > 0 {
		// A claim held WaitSeconds must be answered within the HTTP
		// client's timeout, with room for the round trip: otherwise every
		// idle claim ends in the timeout (QA: each went to OnError, and
		// the worker slept a whole interval after it).
		opts.WaitSeconds = min(opts.WaitSeconds, max(int((t-claimWaitMargin)/time.Second), 0))
	}
	w.mu.Lock()
	w.notices = notices // a Stop during registration waits for its notices too
	stopping := w.stopping
	w.mu.Unlock()
	id, err := w.register(pollCtx, stopping, refs, opts)

	w.mu.Lock()
	defer w.mu.Unlock()
	if closed(w.stopping) {
		cancelPoll()
		close(w.loopDone) // Stop waits for it
		close(w.done)
		return errStoppedWhileStarting
	}
	if err != nil {
		cancelPoll()
		w.started = false // Start may be called again
		w.stopping, w.undated, w.loopDone, w.cancelPoll = nil, nil, nil, nil
		notices.stopped() // the worker stops here: nobody need call Stop
		return err
	}
	notices.recovered()
	// Handlers get a context that outlives nothing but is ended by Stop's
	// deadline or by ctx, always with ErrWorkerStopped as the cause.
	jobsCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	unhook := context.AfterFunc(ctx, func() {
		w.mu.Lock()
		w.startEnded = true // the handlers it cuts off are counted for Stop to say so
		w.mu.Unlock()
		cancel(ErrWorkerStopped)
	})
	w.cancelJobs = func(cause error) { unhook(); cancel(cause) }
	w.workerID, w.refs, w.opts, w.notices = id, refs, opts, notices
	w.reporter = newReporter(ctx, w.c, opts.OnError, w.reportLinger)
	w.reporter.refused = w.refuse // a report's 401 stops the worker as a claim's does
	w.slotFreed, w.returned = make(chan struct{}, 1), make(chan struct{}, 1)
	go w.loop(ctx, pollCtx, jobsCtx)
	return nil
}

// register registers refs for Start under one Idempotency-Key (a repeat
// after a lost answer gets the worker id the first attempt registered),
// trying again after each failure that may pass (transient, or an answer
// that is not Ratchet's own, notRatchets), told to OnError, with
// failureWait's backoff: a worker started while the server is
// down or shedding load waits for it, as a River or Temporal worker does,
// instead of failing after Config.MaxRetries (worker QA: Start gave up
// within seconds, and a process that logged the error and went on ran no
// worker at all). Ratchet's own refusal (a proxy's bare 400, 401 or 404
// is not: review, it failed Start at once while a running worker asked
// again) ends it at once, and so do ctx and Stop
// (stopping, which also cuts a retry's wait short).
func (w *Worker) register(ctx context.Context, stopping chan struct{}, refs []ToolRef, opts StartOptions) (string, error) {
	key := newRequestID()
	for n := 1; ; n++ {
		id, err := w.c.registerWorker(withRetryCutoff(ctx, stopping), key, refs)
		if err == nil || closed(stopping) || !w.c.transient(err) && !notRatchets(err) {
			return id, err
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("%w (the last registration failed: %w)", ctx.Err(), err)
		}
		opts.OnError(fmt.Errorf("ratchet: register (the worker tries again): %w", err))
		fire, stop := w.clock.Timer(failureWait(opts.PollInterval, n, err, w.jitter))
		select {
		case <-fire:
		case <-stopping:
		case <-ctx.Done():
		}
		stop()
		if ctx.Err() != nil {
			return "", fmt.Errorf("%w (the last registration failed: %w)", ctx.Err(), err)
		}
	}
}

// failureWait is how long the worker waits after the nth failure in a row
// (from 1) of its registration or its claims, when the failure may pass (and
// of a job's heartbeats, from minHeartbeat: heartbeatWait):
// pollInterval doubled n-1 times, at most maxFailureWait (or pollInterval
// when that is longer), with equal jitter (half fixed, half drawn by
// jitter), so that a fleet of workers neither hammers a server that is down
// nor comes back all at once; and at least the server's Retry-After
// (detail.retry_after_seconds, or the header of a 429 or 503) when err has
// one, within the same cap, so that a long one cannot park the worker
// (lengthened by up to a fifth, drawn by jitter: retryAfter).
func failureWait(pollInterval time.Duration, n int, err error, jitter func() float64) time.Duration {
	limit := max(pollInterval, maxFailureWait)
	d := pollInterval
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	d = d/2 + time.Duration(jitter()*float64(d/2))
	return max(d, retryAfter(err, limit, jitter))
}

// retryAfter is err's Retry-After (an API error's detail.retry_after_seconds,
// or a 429's or 503's header) up to limit, then lengthened by up to a
// fifth, drawn by jitter, as the client's own retry of a 429 or a 503 is
// (retryAfterWait): the workers of a fleet that the limiter (or a proxy's
// 503) refused together were all told to come back at one instant, and came
// back together, most to be refused again; 0 when it has none.
func retryAfter(err error, limit time.Duration, jitter func() float64) time.Duration {
	var apiErr *Error
	if !errors.As(err, &apiErr) {
		return 0
	}
	secs := apiErr.RetryAfterSeconds()
	if secs <= 0 {
		return 0
	}
	d := limit
	if secs < int(limit/time.Second) {
		d = time.Duration(secs) * time.Second
	}
	return retryAfterWait(d, jitter)
}

// keyRefused says whether a call's failure says the worker's key no longer
// works at all: Ratchet's 401 (the key was revoked, or never was valid),
// whichever call meets it first (a claim, a heartbeat, a report, a
// registration). A 403 on a heartbeat or a report is not: it is that job's
// alone (the key may not work its tool, see leaseGone). Nor is a 401
// without Ratchet's error envelope (see notRatchets).
func keyRefused(err error) bool {
	var apiErr *Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusUnauthorized && !notRatchets(err)
}

// notRatchets says whether a failure is an answer that is not Ratchet's own:
// an HTTP status without the API's error envelope (no error code), as a
// proxy, a load balancer or a platform answers during a deploy or a
// misroute (a bare 404, a 408, a 400, a 401). Such an answer says nothing
// of the worker's key or claims, and passes as a 5xx does: it never stops
// the worker, which asks again after backoff.
func notRatchets(err error) bool {
	var apiErr *Error
	return errors.As(err, &apiErr) && apiErr.Code == ""
}

// workerUnknown says whether a claim's failure says the server no longer
// knows the worker id (it deletes registrations not seen for
// JOB_RETENTION_DAYS): registering again mends it, once.
func workerUnknown(err error) bool {
	var apiErr *Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusNotFound && apiErr.Code == CodeNotFound
}

// refusedForGood says whether a claim's failure, or the failure of the
// registration made again after a claim answered 404, stops the worker: any
// refusal that asking again cannot mend. A 401 (the key was revoked) and a
// 403 (the key may not claim, or not these tools), but also a 400, a 409
// other than retry_request, a 422 or any other 4xx: a claim's body is the
// worker's own (a limit of 1-100, a wait of 0-20 s, a claim id), so the
// server (or a proxy before it) refuses every claim the worker will ever
// send, and a worker that asked for ever would only spin (API.md §3.1 names
// no other refusal of a claim). A claim's 404 not_found is the one refusal
// that registering again mends (workerUnknown). Only Ratchet's own refusal,
// in its error envelope, stops the worker: an answer without one (a
// proxy's, notRatchets) may pass, as do a network error, a 5xx, a 429, a
// 408 request_timeout and a retry_request; none of them stops it.
func (w *Worker) refusedForGood(err error) bool {
	var apiErr *Error
	return errors.As(err, &apiErr) && !notRatchets(err) && !workerUnknown(err) && !w.c.transient(err)
}

// errStoppedWhileStarting is Start's answer when Stop came first.
var errStoppedWhileStarting = fmt.Errorf("ratchet: Stop was called while Start was registering; the worker did not start: %w",
	ErrWorkerStopped)

// closed reports whether ch is closed.
func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Stop stops claiming and waits for running handlers to finish and be
// reported. If ctx ends first, a claim still in flight is abandoned (the
// jobs it claimed run again once their leases lapse) and the handlers'
// contexts are cancelled (cause ErrWorkerStopped); handlers that then
// return within StartOptions.StopGrace (10 s by default) are reported as
// they returned (an error, the
// context's included, as a failure, retryable unless classified otherwise;
// a result as a success: the work was done), and Stop returns an error
// saying how many were cancelled. Every report, whenever its handler
// returned, is sent until twice that grace past ctx's end, as in the Python
// and TypeScript workers. A handler that ignores its context is left running
// unreported: its lease lapses and another worker reclaims the job, and
// OnError is told so once, as a *ReportNotRecordedError naming the job
// (its Err matching ErrWorkerStopped), before Stop returns. A
// handler whose timeout was already reported (it ignored its timeout) is
// not waited for past ctx's end; the error counts it apart. A handler that
// ignores the cancellation of a lost lease (OnError was told a
// *LeaseLostError) or of a job the server cancelled, before Stop, while it
// waits or during the grace, is waited for as the others are: until ctx's
// deadline, then the same StopGrace. A ctx without a deadline gives it
// StopGrace from Stop's call instead (or from that cancellation, if later)
// rather than wait for it for ever. It is then left running, nothing
// reported or told (a newer attempt holds its job, or the job runs no
// more); the error counts it apart too (matching ErrWorkerStopped).
//
// Reports are retried until the server answers them, bounded only by ctx
// (and the grace). If any report of the worker's life was not recorded (given
// up at the deadline, or refused for a reason other than the job being
// settled elsewhere, such as lease_lost), Stop returns an error saying how
// many, even when everything else stopped in time.
//
// Stop called during Start's registration makes Start give up without
// polling; Stop then returns nil once Start has returned (or, at ctx's end,
// cuts the registration off). Stop called after Start's context ended
// returns an error matching ErrWorkerStopped when that cut handlers off; a
// handler that ignored that cancellation (or a refusal's, see Done) past
// StopGrace was left unreported then (OnError was told) and is not waited
// for, whether ctx has a deadline or not: the error counts it.
//
// OnError notices still queued or being delivered when Stop is done are
// waited for up to a second, so that those its error refers to have been
// delivered; without OnError, the default log first counts the problems it
// left out since its last line, if any. After a refusal no retry mends (a
// revoked key's 401, whichever call met it) the worker stops on its own (see
// Done), and Stop's error says so and wraps the refusal (IsCode(err,
// CodeUnauthorized), ...). Stop may be called from OnError: OnError runs on
// a goroutine of its own, never on those Stop waits for (such a Stop takes
// that second, since it waits for the call it is made from).
func (w *Worker) Stop(ctx context.Context) error {
	err := w.stop(ctx)
	w.mu.Lock()
	notices, refused := w.notices, w.refused
	w.mu.Unlock()
	if refused != nil {
		// The stop was the worker's own, on a refused key: Stop's caller
		// must learn it, or a worker that claims nothing passes for a
		// clean stop (QA: it used to poll on, each claim refused 401).
		if err == nil {
			err = refused
		} else {
			err = fmt.Errorf("%w; %w", refused, err)
		}
	}
	if notices != nil {
		notices.stopped()
		notices.flush()
	}
	return err
}

// stop is Stop without waiting for OnError calls.
func (w *Worker) stop(ctx context.Context) error {
	w.mu.Lock()
	stopping, loopDone, cancelPoll := w.stopping, w.loopDone, w.cancelPoll
	if stopping != nil && !closed(stopping) {
		close(stopping)
	}
	if _, dated := ctx.Deadline(); !dated && w.undated != nil && !closed(w.undated) {
		// No deadline to wait for: a handler ignoring a lost lease or a
		// cancel request gets the stop grace from now (await).
		close(w.undated)
	}
	w.mu.Unlock()
	if stopping == nil {
		return nil // never started
	}
	defer cancelPoll()
	abandoned := w.awaitPolling(ctx, loopDone, cancelPoll)
	w.mu.Lock()
	polled := w.reporter != nil
	w.mu.Unlock()
	if !polled {
		return nil // Start gave up before polling: nothing ran
	}
	queued := make(chan struct{}) // every dispatched job's report is queued
	go func() { w.jobs.Wait(); close(queued) }()
	finished := make(chan struct{}) // and every handler has returned
	go func() { <-queued; w.handlers.Wait(); close(finished) }()
	select {
	case <-finished:
		w.cancelJobs(ErrWorkerStopped)
		// Every handler's report is queued: send them all until the
		// deadline plus twice the grace, as the reports of handlers
		// cancelled at the deadline are (a handler that finished just
		// before it fares no worse than one that finished just after), as
		// in the Python and TypeScript workers.
		sendCtx, cancel := afterGrace(ctx, w.reportGrace())
		defer cancel()
		sendCtx, cancelRefused := w.boundByRefusal(sendCtx)
		defer cancelRefused()
		sent := w.reporter.close(sendCtx)
		lost := w.reporter.lostReports()
		w.mu.Lock()
		cut, left := w.cutByStart, w.settled // left: given up after their stop grace, still running
		unreported := w.unreported
		w.mu.Unlock()
		if !sent || abandoned {
			return stopDeadlineError(stopState{running: unreported + left, left: unreported, settled: left, sent: sent,
				lost: lost, abandoned: abandoned}, ctx.Err())
		}
		err := finishedError(lost, cut)
		if unreported > 0 {
			// Cancelled by an immediate stop (Start's context ended, a
			// refusal), they ignored it past the stop grace.
			gone := fmt.Errorf("ratchet: %d handler(s) ignored cancellation past the stop grace (%v) and were left unreported "+
				"(see OnError); their leases lapse and the jobs run again: %w", unreported, w.stopGraceOr(), ErrWorkerStopped)
			if err == nil {
				err = gone
			} else {
				err = fmt.Errorf("%w; %w", gone, err)
			}
		}
		if left > 0 {
			// Stop returns rather than wait for handlers that ignore a
			// cancellation with nothing left to report (sdk QA: a Stop
			// without a deadline never returned), as the TypeScript
			// worker's stop() resolves false.
			still := fmt.Errorf("ratchet: %s, left running once the stop grace (%v) had passed: %w",
				settledRunning(left), w.stopGraceOr(), ErrWorkerStopped)
			if err == nil {
				return still
			}
			return fmt.Errorf("%w; %w", still, err)
		}
		return err
	case <-ctx.Done():
	}
	ended := time.Now()
	w.mu.Lock()
	st := stopState{running: w.running, abandoned: abandoned}
	w.mu.Unlock()
	w.cancelJobs(ErrWorkerStopped)
	// Handlers get a grace to return; a handler's report is queued once it
	// returns, so what is counted here are handlers, not reports waiting
	// for a server that takes none. Stragglers whose timeout was reported
	// are not waited for: they ignored one cancellation already.
	grace, stop := w.clock.Timer(w.stopGraceOr())
	defer stop()
	st.left, st.settled = w.awaitReturns(grace)
	st.left -= st.settled
	w.mu.Lock()
	st.stragglers = w.stragglers
	w.mu.Unlock()
	// Reports queued so far, those of handlers that returned within the
	// grace included, are sent until the deadline plus twice the grace,
	// whenever their handlers returned, as in the Python and TypeScript
	// workers (it was one grace past the handlers' return: a stop whose
	// handlers had all returned gave its reports up a grace sooner than
	// theirs); then the rest go to OnError (giving up also frees handlers'
	// reports waiting for room in a full queue). A handler returning later
	// sends its report on its own.
	sendCtx, cancel := context.WithDeadline(context.Background(), ended.Add(w.reportGrace()))
	defer cancel()
	sendCtx, cancelRefused := w.boundByRefusal(sendCtx)
	defer cancelRefused()
	release := context.AfterFunc(sendCtx, w.reporter.giveUp)
	defer release()
	select {
	case <-queued: // every returned handler's report is queued
	case <-sendCtx.Done():
	}
	st.sent = w.reporter.close(sendCtx)
	st.lost = w.reporter.lostReports()
	return stopDeadlineError(st, ctx.Err())
}

// boundByRefusal ends ctx, the context Stop sends the last reports within,
// twice the stop grace past a refusal that stopped the worker, if one did,
// earlier than ctx's own end: a refusal is a stop whose deadline is the
// refusal, whether Stop was called before it or after, as in the Python and
// TypeScript workers (a refusal during a Stop left the reports to Stop's own
// deadline).
func (w *Worker) boundByRefusal(ctx context.Context) (context.Context, context.CancelFunc) {
	w.mu.Lock()
	at := w.refusedAt
	w.mu.Unlock()
	if at.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, at.Add(w.reportGrace()))
}

// finishedError is Stop's answer when every handler returned (or was given
// up, finished with nothing to report) before its deadline: lost reports
// not recorded, and cut handlers Start's end cut off.
func finishedError(lost, cut int) error {
	if lost > 0 {
		return fmt.Errorf("ratchet: %d report(s) were not recorded (see OnError); their jobs run again once their leases lapse: %w",
			lost, ErrReportsNotRecorded)
	}
	if cut > 0 {
		// QA: after a signal context given to Start, Stop answered nil
		// although the handlers had been cut off mid-call.
		return fmt.Errorf("ratchet: %d handler(s) were cancelled when Start's context ended (an immediate stop) "+
			"and returned an error, reported as a failure; for a graceful stop keep Start's context alive and call Stop: %w", cut,
			ErrWorkerStopped)
	}
	return nil
}

// settledRunning says that n handlers cancelled for a lost lease or a
// cancelled job still run, with nothing to report.
func settledRunning(n int) string {
	return fmt.Sprintf("%d handler(s) still running after their lease was lost or their job was cancelled "+
		"(nothing to report: a newer attempt holds the job, or it runs no more)", n)
}

// awaitReturns waits until no handler with an unreported attempt runs
// (those given up after their own stop grace aside), or grace fires; it
// returns how many still run, and how many of those were cancelled for a
// lost lease or a cancelled job (settled).
func (w *Worker) awaitReturns(grace <-chan time.Time) (running, settled int) {
	for {
		w.mu.Lock()
		running, settled = w.running, w.settled
		waited := running - w.givenUp
		w.mu.Unlock()
		if waited == 0 {
			return running, settled
		}
		select {
		case <-w.returned:
		case <-grace:
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.running, w.settled
		}
	}
}

// awaitPolling waits for the poll loop to end. A claim in flight, or one
// whose answer was lost (askAgainWhileStopping), is answered first (its
// leases are ours), but only until ctx ends: the claim
// is bounded by nothing but the HTTP client, which may have no timeout, so
// it is then cancelled and its jobs' leases left to lapse, which beats a
// Stop that never returns. abandoned reports that a claim was in flight at
// the deadline.
func (w *Worker) awaitPolling(ctx context.Context, loopDone chan struct{}, cancelPoll context.CancelFunc) (abandoned bool) {
	select {
	case <-loopDone:
		return false
	case <-ctx.Done():
	}
	w.mu.Lock()
	abandoned = w.claiming
	w.mu.Unlock()
	cancelPoll()
	<-loopDone
	// A claim whose answer was lost, still being asked again, is
	// abandoned as well (the loop has ended: claimID is ours to read).
	return abandoned || w.claimID != ""
}

// stopState is what Stop found at and after its deadline.
type stopState struct {
	running    int  // handlers with unreported attempts at the deadline, cancelled then
	left       int  // of them, those that ignored the stop's cancellation past the grace
	settled    int  // of them, those still running past the grace after a lost lease or the job's cancellation
	stragglers int  // handlers still running after their timeout was reported
	sent       bool // every queued report was answered before the reporter gave up
	lost       int  // reports not recorded (settled refusals aside)
	abandoned  bool // a claim was in flight at the deadline
}

// stopDeadlineError is Stop's answer when its deadline passed: what became
// of the handlers running then, of the reports, and of a claim in flight.
// err is the deadline's; nil when Stop had none and a refusal's bound
// (boundByRefusal) ended the last reports instead.
func stopDeadlineError(st stopState, err error) error {
	var b strings.Builder
	if err == nil {
		b.WriteString("ratchet: stop grace after the refusal passed; ")
		err = ErrWorkerStopped
	} else {
		b.WriteString("ratchet: stop deadline passed; ")
	}
	returned := st.running - st.left - st.settled
	switch {
	case st.left > 0:
		fmt.Fprintf(&b, "%d handler(s) ignored cancellation and were left unreported", st.left)
		if returned > 0 {
			fmt.Fprintf(&b, ", %d cancelled and reported as they returned", returned)
		}
	case returned > 0 && st.sent && st.lost == 0:
		fmt.Fprintf(&b, "%d handler(s) cancelled and reported as they returned", returned)
	case returned > 0:
		fmt.Fprintf(&b, "%d handler(s) cancelled", returned)
	case st.settled == 0:
		b.WriteString("no handler was running")
	}
	if st.settled > 0 {
		if st.left > 0 || returned > 0 {
			b.WriteString("; ")
		}
		b.WriteString(settledRunning(st.settled))
	}
	if st.stragglers > 0 {
		fmt.Fprintf(&b, "; %d handler(s) still running after their timeout was reported", st.stragglers)
	}
	switch {
	case st.lost > 0:
		fmt.Fprintf(&b, "; %d report(s) were not recorded and went to OnError (their jobs run again once their leases lapse)", st.lost)
	case !st.sent:
		b.WriteString("; reports the server did not take went to OnError (their jobs run again once their leases lapse)")
	}
	if st.abandoned {
		b.WriteString("; a claim in flight was abandoned (the jobs it claimed run again once their leases lapse)")
	}
	if st.lost > 0 || !st.sent {
		return fmt.Errorf("%s: %w (%w)", b.String(), err, ErrReportsNotRecorded)
	}
	return fmt.Errorf("%s: %w", b.String(), err)
}

// afterGrace returns a context that ends grace after ctx does (and its
// cancel function).
func afterGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return gctx, func() { stop(); cancel() }
}

// loop claims and dispatches until Stop or ctx.
//
// pollCtx, which Stop cancels at its deadline, carries the claims and
// re-registrations: Stop must not outwait a request nobody answers.
func (w *Worker) loop(ctx, pollCtx, jobsCtx context.Context) {
	defer close(w.done)
	defer close(w.loopDone)
	defer w.askAgainWhileStopping(ctx, pollCtx, jobsCtx)
	defer func() {
		ended, refused := ctx.Err() != nil, w.refusedErr() != nil
		if !ended && !refused {
			return // Stop's, which sends the last reports and counts
		}
		// Ended by ctx, or stopped on its own (a refusal): nobody may call
		// Stop, so send the last reports once the cancelled handlers have
		// returned, then count the problems left out, once, after the
		// reports that failed too, as the Python and TypeScript workers
		// count (closing note 48: after a refusal the count came as soon
		// as the reports were queued, and a report that failed after it
		// got a second "ratchet worker stopped" line at Stop). A Stop
		// called by then (signal.NotifyContext for Start, then Stop with a
		// shutdown deadline) decides when they are given up: its deadline
		// is the caller's. Without one, they are sent until twice the stop
		// grace past ctx's end, as a Stop's until twice it past its
		// deadline: a server that stays down must not keep this goroutine
		// retrying for the life of the process. A refusal is a stop whose
		// deadline is the refusal, whether or not Stop is called: its
		// reports are sent until twice the grace past it, as the Python and
		// TypeScript workers send them (they were sent until Stop's
		// deadline, for ever without a Stop). What is not sent by then goes
		// to OnError.
		go func() {
			queued := make(chan struct{}) // every dispatched job's report is queued
			go func() { w.jobs.Wait(); close(queued) }()
			if ended || refused {
				grace := time.AfterFunc(w.reportGrace(), func() {
					if refused || !closed(w.stopping) {
						w.reporter.giveUp()
					}
				})
				defer grace.Stop()
			}
			<-queued
			w.reporter.close(context.Background())
			w.notices.stopped()
		}()
	}()
	full := false            // the last claim filled every slot it asked for: work is waiting
	lost := 0                // claims running whose answers were lost
	failed := 0              // claims running that failed otherwise
	registeredAgain := false // the last claim answered 404 and the worker registered again
	for {
		if w.stopped(ctx) {
			return
		}
		free := w.free()
		if free == 0 {
			select {
			case <-w.slotFreed:
				continue
			case <-w.stopping:
				return
			case <-ctx.Done():
				return
			}
		}
		if full && free < w.claimTarget() {
			if !w.gather(ctx) {
				return
			}
			free = w.free()
		}
		if !w.awaitReports(ctx) {
			return
		}
		limit := min(free, 100)
		began := w.clock.Now()
		jobs, err := w.claimAndDispatch(ctx, pollCtx, jobsCtx, limit, w.opts.WaitSeconds)
		if err != nil && !w.stopped(ctx) {
			notice := fmt.Errorf("ratchet: claim: %w", err)
			switch {
			case workerUnknown(err) && !registeredAgain:
				// The server forgot the worker: register again, once.
				w.opts.OnError(notice)
				rerr := w.registerAgain(pollCtx)
				if rerr != nil && !w.stopped(ctx) && !w.c.transient(rerr) && !notRatchets(rerr) {
					w.refuse(fmt.Errorf("ratchet: register again: %w", rerr), rerr)
					return
				}
				if rerr != nil && !w.stopped(ctx) {
					w.opts.OnError(fmt.Errorf("ratchet: register again: %w", rerr))
				}
				registeredAgain = rerr == nil
			case workerUnknown(err) || w.refusedForGood(err):
				// No claim will ever succeed (the key was revoked, may not
				// claim, or every claim is refused; or the server forgot
				// the worker again right after registering it): the worker
				// stops rather than asking for ever, and Done and Stop say
				// so.
				w.refuse(notice, err)
				return
			default:
				w.opts.OnError(notice)
			}
		}
		if err == nil || !workerUnknown(err) {
			registeredAgain = false
		}
		if err != nil && w.claimID != "" {
			// Its answer was lost: the jobs it may have leased are ours
			// while their leases hold, so it is asked again under its id
			// after a backoff, not a whole poll interval, which outlasts
			// a short lease (Go SDK QA: jobs with a 15 s lease lapsed
			// while the worker waited its 30 s); not before the server's
			// Retry-After, though.
			lost++
			if !w.pause(ctx, max(min(w.c.backoff(lost), w.opts.PollInterval), retryAfter(err, maxFailureWait, w.jitter))) {
				return
			}
			continue
		}
		lost = 0
		if err != nil {
			// A failure that may pass (the server down, failing or
			// shedding load), or an answer that is not Ratchet's (a
			// proxy's bare 404, 408 or 400, notRatchets): asked
			// again for as long as the worker runs, with backoff (worker
			// QA: a failed claim was followed by one poll interval, however
			// long the failures lasted, and honoured a 429's Retry-After
			// only within MaxRetries).
			failed++
			full = false
			if !w.pause(ctx, failureWait(w.opts.PollInterval, failed, err, w.jitter)) {
				return
			}
			continue
		}
		failed = 0
		w.notices.recovered()
		full = len(jobs) >= limit
		if full {
			continue // a full batch: more are likely waiting
		}
		if len(jobs) > 0 && w.opts.WaitSeconds > 0 {
			// Long-polling: the next claim waits on the server anyway, and
			// only empty claims count against the idle budget.
			continue
		}
		var waited time.Duration
		if w.opts.WaitSeconds > 0 {
			waited = w.clock.Now().Sub(began) // the long poll already waited this long
		}
		if !w.idle(ctx, waited) {
			return
		}
	}
}

// refuse stops the worker for good after a refusal no retry mends: a 401
// met by any call (keyRefused), or a claim's or registration's refusal
// (refusedForGood). It stops as a Stop whose deadline has passed would,
// whichever call met the refusal first: no more claims (a claim in flight is
// abandoned), and the running handlers' contexts are cancelled at once
// (cause ErrWorkerStopped; those that return within StopGrace are reported
// as they returned, which a revoked key's server refuses too). notice goes to
// OnError, or without it to the default log at once, whatever its pacing;
// err is kept for Stop to return (the first refusal's; a later one is only
// told).
func (w *Worker) refuse(notice, err error) {
	w.mu.Lock()
	first := w.refused == nil
	if first {
		var apiErr *Error
		errors.As(err, &apiErr)
		why := "the server refused its claims, which asking again does not mend"
		switch {
		case apiErr != nil && apiErr.StatusCode == http.StatusUnauthorized:
			why = "the server refused its key (revoked or invalid)"
		case apiErr != nil && apiErr.StatusCode == http.StatusForbidden:
			why = "the server forbids its key to claim, or to work its tools"
		case workerUnknown(err):
			why = "the server did not know the worker it had just registered again"
		}
		w.refused = fmt.Errorf("ratchet: the worker stopped claiming: %s: %w", why, err)
		w.refusedAt = time.Now()
		if !closed(w.stopping) {
			close(w.stopping)
		}
	}
	cancelJobs, cancelPoll := w.cancelJobs, w.cancelPoll
	w.mu.Unlock()
	if !first {
		w.opts.OnError(notice)
		return
	}
	w.notices.refused(notice)
	if cancelPoll != nil {
		cancelPoll()
	}
	if cancelJobs != nil {
		cancelJobs(ErrWorkerStopped)
	}
}

// claimAndDispatch claims up to limit jobs, long-polling up to wait seconds,
// and dispatches those it is answered.
func (w *Worker) claimAndDispatch(ctx, pollCtx, jobsCtx context.Context, limit, wait int) ([]ClaimedJob, error) {
	sent := time.Now()
	jobs, date, err := w.claim(pollCtx, limit, wait)
	for _, j := range jobs {
		j.leaseEnd = leaseEndFrom(sent, j, j.LeaseExpiresAt, date)
		w.dispatch(ctx, jobsCtx, j)
	}
	return jobs, err
}

// askAgainWhileStopping asks again, once Stop was called, under the id of a
// claim whose answer was lost, until it is answered or Stop's deadline
// cancels pollCtx: the jobs it may have leased are this worker's while their
// leases hold, and run within the stop's time like those of a claim in
// flight when Stop came (Go SDK QA: a Stop during the lost claim's retry
// wait ended it, and its jobs lapsed unseen, nothing said). Asked again, a
// claim that had leased nothing leases afresh, at most its own limit, and
// does not long-poll. Start's context ending is an immediate stop: it
// abandons the claim.
func (w *Worker) askAgainWhileStopping(ctx, pollCtx, jobsCtx context.Context) {
	for attempt := 0; w.claimID != "" && ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			fire, stop := w.clock.Timer(w.c.backoff(attempt))
			select {
			case <-fire:
			case <-pollCtx.Done():
			case <-ctx.Done():
			}
			stop()
		}
		if pollCtx.Err() != nil || ctx.Err() != nil {
			return
		}
		if _, err := w.claimAndDispatch(ctx, pollCtx, jobsCtx, w.claimLimit, 0); err != nil && w.claimID == "" {
			w.opts.OnError(fmt.Errorf("ratchet: claim asked again while stopping: %w", err))
		}
	}
}

// pause waits d, or until Stop or ctx; false means stop.
func (w *Worker) pause(ctx context.Context, d time.Duration) bool {
	fire, stop := w.clock.Timer(d)
	defer stop()
	select {
	case <-fire:
		return true
	case <-w.stopping:
		return false
	case <-ctx.Done():
		return false
	}
}

// awaitReports waits while the reporter holds a report that is failing or
// whose lease is about to lapse (see reporter.holding), within the claim's
// long poll too (WaitSeconds), as the Python and TypeScript workers look
// ahead (review: Go looked no further than the margin, so a long poll could
// wait out the lapse): a claim now could hand this worker back a job whose
// outcome it is still trying to report, and run it again. False means stop.
func (w *Worker) awaitReports(ctx context.Context) bool {
	for w.reporter.holding(time.Now().Add(time.Duration(w.opts.WaitSeconds) * time.Second)) {
		select {
		case <-w.reporter.settled:
		case <-w.stopping:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// claim asks for up to limit jobs, marked in flight while it is. A claim
// whose answer may have been lost leaves its id for the next, which then
// answers what the lost one leased (while those leases hold) rather than
// leaving it leased to nobody.
func (w *Worker) claim(pollCtx context.Context, limit, wait int) ([]ClaimedJob, time.Time, error) {
	w.mu.Lock()
	w.claiming = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.claiming = false
		w.mu.Unlock()
	}()
	if w.claimID == "" {
		w.claimID, w.claimLimit = NewClaimID(), limit
	}
	jobs, date, err := w.c.claimKeyed(withRetryCutoff(pollCtx, w.stopping), w.ID(), w.claimID, limit, wait)
	if err == nil || !MayHaveApplied(err) {
		w.claimID = ""
	}
	return jobs, date, err
}

// registerAgain registers the worker's tools under a new worker id, for a
// server that no longer knows the old one (it deletes registrations not
// seen for JOB_RETENTION_DAYS). Jobs already running keep their leases:
// they are reported by lease token, not worker id. A failure is returned
// (the loop tells it): a refusal stops the worker, as at Start; after a
// failure that may pass, the next claim, answered 404 again, registers
// again.
func (w *Worker) registerAgain(ctx context.Context) error {
	id, err := w.c.RegisterWorker(withRetryCutoff(ctx, w.stopping), w.refs)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.workerID = id
	w.mu.Unlock()
	w.notices.recovered()
	return nil
}

// refusedErr is the refusal that stopped the worker, or nil.
func (w *Worker) refusedErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refused
}

// stopped reports whether Stop was called or ctx ended.
func (w *Worker) stopped(ctx context.Context) bool {
	select {
	case <-w.stopping:
		return true
	default:
		return ctx.Err() != nil
	}
}

// claimCooldown bounds how long a worker with work waiting lets finished
// slots gather before it claims again. A claim of many jobs costs the
// server about what a claim of one does, so a worker whose handlers finish
// quickly claims full batches instead of a slot at a time (River's fetch
// cooldown plays the same part): in the work benchmark this doubled the
// jobs per claim (51 → 98) and raised throughput by a fifth. It only applies
// after a full claim, so it never delays a job that arrives at an idle
// worker, and a worker with slow handlers claims what is free after 5 ms.
const claimCooldown = 5 * time.Millisecond

// claimTarget is the number of free slots worth a claim without waiting:
// as many as one claim can take.
func (w *Worker) claimTarget() int {
	return min(w.opts.Concurrency, 100)
}

// gather waits until claimTarget slots are free or claimCooldown has
// passed, whichever comes first; false means stop.
func (w *Worker) gather(ctx context.Context) bool {
	fire, stop := w.clock.Timer(claimCooldown)
	defer stop()
	for w.free() < w.claimTarget() {
		select {
		case <-w.slotFreed:
		case <-fire:
			return true
		case <-w.stopping:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// free returns the number of idle slots.
func (w *Worker) free() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.opts.Concurrency - w.active
}

// maxPollInterval is the longest idle wait: a year.
const maxPollInterval = 365 * 24 * time.Hour

// idle waits one jittered poll interval, less what the claim already
// waited; false means stop.
func (w *Worker) idle(ctx context.Context, waited time.Duration) bool {
	// At most maxPollInterval: one near time.Duration's limit (292 years),
	// jittered up, overflowed to a negative wait, and the worker claimed
	// again at once, for ever (a busy loop of claims); the Python SDK
	// refuses a poll_interval past a year for the same reason.
	d := min(w.opts.PollInterval, maxPollInterval)
	d = time.Duration(float64(d)*(0.9+0.2*w.jitter())) - waited
	if d <= 0 {
		return !w.stopped(ctx)
	}
	return w.pause(ctx, d)
}

// dispatch runs one claimed job in its own goroutine.
func (w *Worker) dispatch(ctx, jobsCtx context.Context, j ClaimedJob) {
	w.mu.Lock()
	w.active++
	rt := w.tools[ToolRef{Name: j.Name, Version: j.Version}]
	if rt != nil {
		// Counted from here, not once its goroutine runs, so that Stop's
		// deadline counts a handler about to start with a cancelled context.
		w.running++
		w.handlers.Add(1)
	}
	w.mu.Unlock()
	w.jobs.Add(1)
	go func() {
		var handler <-chan struct{}
		defer func() {
			// The slot stays taken until the handler returns, so
			// Concurrency bounds the handlers running in this process,
			// stragglers included.
			if handler != nil {
				<-handler
			}
			w.mu.Lock()
			w.active--
			w.mu.Unlock()
			select {
			case w.slotFreed <- struct{}{}:
			default:
			}
		}()
		defer w.jobs.Done()
		handler = w.execute(ctx, jobsCtx, rt, j)
	}()
}

// execute runs a handler under its timeout with heartbeats and reports the
// outcome. It returns once the outcome is queued (or the attempt is left
// unreported); if the handler is still running then, the channel it returns
// closes when it has returned (nil otherwise).
func (w *Worker) execute(ctx, jobsCtx context.Context, rt *registeredTool, j ClaimedJob) <-chan struct{} {
	job := JobContext{JobID: j.JobID, StepID: j.StepID, RunID: j.RunID, Name: j.Name, Version: j.Version,
		Attempt: j.Attempt, MaxAttempts: j.MaxAttempts, IdempotencyKey: j.IdempotencyKey, Timeout: time.Duration(j.TimeoutMs) * time.Millisecond}
	if rt == nil {
		// The server only hands out registered pairs; if it ever does not,
		// give the job back for a worker that has the handler.
		w.report(j, j.leaseEnd, JobReport{Status: ReportFailed,
			Error: &JobError{Message: "worker has no handler for this name@version", Retryable: true}})
		return nil
	}

	hctx, cancel := context.WithCancelCause(jobsCtx)
	defer cancel(nil)
	if job.Timeout > 0 {
		var cancelTimeout context.CancelFunc
		hctx, cancelTimeout = context.WithTimeoutCause(hctx, job.Timeout, ErrTimeout)
		defer cancelTimeout()
	}
	// Under mu: the handler returned; its timeout was reported while it
	// ran; its lease was lost or its job cancelled by the server while it
	// ran (counted in settled while it runs on).
	var returned, straggler, settled, givenUp, abandoned bool
	settle := func(cause error) {
		w.mu.Lock()
		if !returned && !settled {
			settled = true
			w.settled++
		}
		w.mu.Unlock()
		cancel(cause)
	}
	hbCtx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	hbDone := make(chan struct{})
	expires := j.leaseEnd // as extended by the heartbeats; read after hbDone
	go func() {
		defer close(hbDone)
		expires = w.heartbeat(hbCtx, j, settle)
	}()

	done := make(chan handlerResult, 1)
	handlerReturned := make(chan struct{})
	go func() { // counted in running and handlers by dispatch
		defer func() {
			w.mu.Lock()
			returned = true
			if settled {
				w.settled--
			}
			switch {
			case givenUp:
				w.givenUp--
			case !abandoned:
				w.handlers.Done()
			}
			if straggler {
				w.stragglers--
			} else {
				w.running--
				select {
				case w.returned <- struct{}{}:
				default:
				}
			}
			w.mu.Unlock()
			close(handlerReturned)
		}()
		var res handlerResult
		exited := true // until invoke returns: runtime.Goexit ends the goroutine without returning
		defer func() {
			if exited {
				// A handler that ends its goroutine with runtime.Goexit
				// (t.FailNow or t.Fatal in a handler under test) fails as a
				// panicking one does: its result was waited for with no
				// bound, and the job, heartbeated on, never reported, its
				// slot held for good (review).
				res.err = &PanicError{Where: "handler " + rt.ref.Name + "@" + rt.ref.Version,
					Value: "runtime.Goexit: the handler's goroutine exited without returning (t.FailNow or t.Fatal in a handler?)"}
			}
			// Why it was cancelled, if it was, as it returned: a timeout, a
			// cancel request or a stop landing after that does not change
			// how its result is judged, as in the TypeScript and Python
			// workers (sdk QA: Go read it once awaited, so an ordinary
			// error returned just before a stop was reported as the
			// stop's). Heartbeat answers from then on are ignored.
			if hctx.Err() != nil {
				res.cause = context.Cause(hctx)
			}
			stopHeartbeat()
			done <- res
		}()
		res.out, res.err = rt.invoke(hctx, j.Input, job)
		exited = false
	}()
	res, finished := w.await(hctx, jobsCtx, done)
	stopHeartbeat()
	<-hbDone
	if !finished {
		// The handler ignored its cancellation, and whatever it returns
		// later is dropped. A timeout is recorded now (the job retries per
		// its policy) and the handler counts as a straggler from then on; a
		// stopping worker leaves the job unreported and its lease, no
		// longer extended, lapses for another worker to reclaim; a handler
		// whose lease was lost (OnError was told) or whose job the server
		// cancelled (it runs no more), before the stop or during its grace,
		// is left running with nothing to report or tell: Stop counts it
		// apart (sdk QA: OnError was told its job ran again).
		w.mu.Lock()
		gone := settled
		w.mu.Unlock()
		switch {
		case errors.Is(context.Cause(hctx), ErrTimeout):
			e := rt.decide(ErrTimeout, ErrTimeout, job, w.opts.OnError)
			w.report(j, expires, JobReport{Status: ReportFailed, Error: &e})
			w.mu.Lock()
			if !returned { // else it returned meanwhile and was counted as such
				if settled { // lost during the timeout's grace: a straggler all the same
					settled = false
					w.settled--
				}
				straggler = true
				w.running--
				w.stragglers++
				select {
				case w.returned <- struct{}{}:
				default:
				}
			}
			w.mu.Unlock()
		case gone:
			// Given up: Stop, which waits for the handlers to return, no
			// longer waits for this one (it counts it in w.settled).
			w.mu.Lock()
			if !returned { // else it returned meanwhile and was counted as such
				givenUp = true
				w.givenUp++
				w.handlers.Done()
				select {
				case w.returned <- struct{}{}:
				default:
				}
			}
			w.mu.Unlock()
		default:
			// Its lease lapses and the job runs again elsewhere: OnError
			// is told, naming the job (QA: only Stop's count said so, and
			// not which job would run again). Stop no longer waits for it
			// either: after an immediate stop (Start's context ended, a
			// refusal) a Stop without a deadline waited for it for ever
			// (review), though it had been given up.
			w.mu.Lock()
			w.unreported++
			if !returned {
				abandoned = true
				w.handlers.Done()
			}
			w.mu.Unlock()
			w.opts.OnError(&ReportNotRecordedError{What: "not_recorded", JobID: j.JobID, Attempt: j.Attempt,
				Err: fmt.Errorf("left unreported, its handler still running when the stop grace (%v) ended; "+
					"its lease lapses and the job runs again: %w", w.stopGraceOr(), ErrWorkerStopped)})
		}
		return handlerReturned
	}
	if w.afterReturn != nil {
		w.afterReturn(hctx)
	}
	out, err, cause := res.out, res.err, res.cause
	if errors.Is(cause, ErrLeaseLost) {
		// After a heartbeat's lease_lost, or a lapse while heartbeats
		// failed, a success is reported all the same: the server records
		// the outcome of a lapsed attempt that no claim has superseded (its
		// job requeued, its slot taken meanwhile), which spares the job a
		// second run; a newer claim answers lease_lost, which settles it. A
		// failure is not: the job runs again either way. Nor is anything
		// after another refusal (the job ended, or is gone, or the key may
		// no longer work it): the server would refuse that too.
		var lost *jobLeaseLostError
		if err == nil && errors.As(cause, &lost) && lost.successWorthReporting() {
			w.report(j, expires, JobReport{Status: ReportSucceeded, Output: out})
		}
		return nil
	}
	if err == nil {
		w.report(j, expires, JobReport{Status: ReportSucceeded, Output: out})
		return nil
	}
	e := rt.decide(err, cause, job, w.opts.OnError)
	w.report(j, expires, JobReport{Status: ReportFailed, Error: &e})
	if errors.Is(cause, ErrWorkerStopped) {
		w.mu.Lock()
		if w.startEnded {
			w.cutByStart++
		}
		w.mu.Unlock()
	}
	return nil
}

// stopGraceOr is the worker's stop grace (StartOptions.StopGrace).
func (w *Worker) stopGraceOr() time.Duration { return w.opts.StopGrace }

// reportGrace is how long past a stop's deadline (or Start's context's
// end) reports are sent: twice the stop grace, one for the cancelled
// handlers to return and one more for their reports, whenever each
// returned, as in the Python and TypeScript workers.
func (w *Worker) reportGrace() time.Duration { return 2 * w.opts.StopGrace }

// handlerResult is what a handler returned.
type handlerResult struct {
	out   json.RawMessage
	err   error
	cause error // context.Cause of its context as it returned; nil while that was live
}

// timeoutGrace is how long a handler whose timeout passed has to return
// before the worker records the timeout without it: long enough for a
// handler that honours its context to unwind and report its own error,
// short enough that one that ignores it cannot hold its job.
const timeoutGrace = time.Second

// await waits for the handler. Once its timeout has passed it waits at
// most timeoutGrace more, and once the worker is stopping (Stop's deadline,
// or the end of Start's context: jobsCtx ends) at most the stop grace;
// finished is false when the handler did not return by then. A cancel
// request or a lost lease waits for the handler as before (the heartbeats
// have already stopped, so its lease lapses on its own) until the worker
// stops (Stop's deadline, the end of Start's context, or the call of a
// Stop without a deadline), and then the stop grace at most, as the
// TypeScript and Python workers wait (sdk QA: Go waited with no bound, so
// that after Start's context ended the reports were never closed, and a
// Stop without a deadline never returned; then it counted the grace from
// Stop's call, deadline or not, giving such a handler less time than the
// TypeScript and Python workers, and less than a handler Stop cancels).
func (w *Worker) await(hctx, jobsCtx context.Context, done <-chan handlerResult) (res handlerResult, finished bool) {
	select {
	case res = <-done:
		return res, true
	case <-hctx.Done():
	}
	grace := timeoutGrace
	switch cause := context.Cause(hctx); {
	case errors.Is(cause, ErrTimeout):
	case errors.Is(cause, ErrWorkerStopped):
		grace = w.stopGraceOr()
	default:
		select {
		case res = <-done:
			return res, true
		case <-jobsCtx.Done(): // Stop's deadline, or Start's context ended
		case <-w.undated: // a Stop without a deadline was called
		}
		grace = w.stopGraceOr()
	}
	fire, stop := w.clock.Timer(grace)
	defer stop()
	select {
	case res = <-done:
		return res, true
	case <-fire:
		return handlerResult{}, false
	}
}

// report queues a report for the next batch (sent before the lease that
// expires then lapses, and retried until the server answers it); reports
// not recorded go to OnError and their leases lapse.
func (w *Worker) report(j ClaimedJob, expires time.Time, r JobReport) {
	w.reporter.enqueue(newQueuedReport(j, r, expires))
}

// heartbeat extends the lease well before it lapses until ctx ends, and
// cancels the handler when the server asks or the lease is gone: refused
// (see leaseGone), or its end passed by this process's clock while
// heartbeats failed (one at least tried since the lease was granted or last
// extended), as the Python and TypeScript workers do (sdk QA: the
// handler ran on past the lapse, while another worker could reclaim the
// job). Each heartbeat is one try (singleTry), cut off by heartbeatCutoff;
// a failed one is tried again by this loop, paced by heartbeatWait as the
// Python and TypeScript workers pace theirs. It returns when the lease, as
// last extended, lapses by this process's clock (leaseEndFrom).
func (w *Worker) heartbeat(ctx context.Context, j ClaimedJob, cancel context.CancelCauseFunc) time.Time {
	end := j.leaseEnd
	var failed error // the last heartbeat's failure, nil after one that worked
	failures := 0    // heartbeats failed in a row
	tried := false   // a heartbeat was sent since the lease was granted or last extended
	for {
		fire, stop := w.clock.Timer(heartbeatWait(w.heartbeatEvery(end, j), failed, failures, w.jitter))
		select {
		case <-ctx.Done():
			stop()
			return end
		case <-fire:
		}
		sent := time.Now()
		if !sent.Before(end) && tried {
			// Not before one heartbeat was tried, as DoEffect tries one: a
			// lease measured from a long-polling claim's sending runs from
			// when the server answered it, up to WaitSeconds later, and may
			// look lapsed before the handler starts (review: a 1 s timeout's
			// lease, 11 s, under WaitSeconds 20, was cancelled as lost a
			// second in, never heartbeated, and its job ran again).
			cancel(&jobLeaseLostError{})
			w.opts.OnError(&LeaseLostError{JobID: j.JobID, Attempt: j.Attempt, Tool: ToolRef{Name: j.Name, Version: j.Version}})
			return end
		}
		hctx, cancelBeat := context.WithTimeout(singleTry(ctx), heartbeatCutoff(end.Sub(sent)))
		hb, date, err := w.c.heartbeatJob(hctx, j.JobID, j.LeaseToken)
		cancelBeat()
		tried = true
		if ctx.Err() != nil {
			return end
		}
		failed = err
		if err != nil {
			failures++
			if leaseGone(err) {
				cancel(&jobLeaseLostError{code: ErrorCode(err)})
				w.opts.OnError(&LeaseLostError{JobID: j.JobID, Attempt: j.Attempt, Tool: ToolRef{Name: j.Name, Version: j.Version}, Err: err})
				return end
			}
			if keyRefused(err) {
				// The key was revoked: the worker stops, as after a claim's
				// 401, and this handler's context ends with the others'.
				w.refuse(fmt.Errorf("ratchet: heartbeat job %s: %w", j.JobID, err), err)
				return end
			}
			w.opts.OnError(fmt.Errorf("ratchet: heartbeat job %s: %w", j.JobID, err))
			continue
		}
		if hb.CancelRequested {
			// A cancelled job's lease is not extended: it ends as before.
			cancel(ErrCancelRequested)
			return end
		}
		failures, tried = 0, false
		end = leaseEndFrom(sent, j, hb.LeaseExpiresAt, date)
	}
}

// heartbeatEvery is a third of the lease left until end, or of the job's
// timeout when that is shorter, within [minHeartbeat, maxHeartbeat], so that
// heartbeats that keep failing are tried again more often as the lapse nears
// (review: a third of the whole length put the third try at the lapse
// itself). With the lease's length (leaseMs), end is this process's clock's
// and the length bounds what is left; without it, end is the server's
// expiry moved onto this process's clock by the answer's Date
// (leaseEndFrom). The timeout bounds both: a
// cancellation reaches a handler within a third of its timeout, as in the
// Python and TypeScript SDKs (SDK QA: a job of a 5 s timeout, its lease
// 15 s, was first heartbeated at its timeout, so its cancel never reached
// it), and heartbeats stay inside the lease when the server's clock runs
// ahead of ours.
func (w *Worker) heartbeatEvery(end time.Time, j ClaimedJob) time.Duration {
	var left time.Duration
	if j.LeaseMs > 0 {
		left = min(time.Duration(j.LeaseMs)*time.Millisecond, time.Until(end))
	} else {
		left = end.Sub(w.clock.Now())
	}
	if timeout := time.Duration(j.TimeoutMs) * time.Millisecond; timeout > 0 && timeout < left {
		left = timeout
	}
	return min(max(left/3, minHeartbeat), maxHeartbeat)
}

// heartbeatWait is the wait before the next heartbeat: every
// (heartbeatEvery) after one that worked; after the nth failure in a row
// failureWait's backoff from minHeartbeat, as after failed claims: 1, 2, 4,
// 8 s... (doubled n-1 times), half of it drawn by jitter, so that the
// workers of a fleet do not all try again at the same marks after an
// outage, and at least the server's Retry-After (a 429's or a 503's, and up
// to a fifth more drawn by jitter); either
// never past every, a third of the lease left, so that at least two more
// tries fit before it lapses. The Python and TypeScript workers pace theirs
// the same (sdk QA: Go retried inside its client, 0.5-8 s apart, and then
// waited a third of the lease left; they waited a third of the lease left
// at once; Go waited out a 429's whole Retry-After; and the backoff had no
// jitter).
func heartbeatWait(every time.Duration, failed error, failures int, jitter func() float64) time.Duration {
	if failed == nil {
		return every
	}
	return min(every, failureWait(minHeartbeat, failures, failed, jitter))
}

// heartbeatCutoff is how long one heartbeat may take when the lease has left
// to run (by this process's clock): a third of it, at least minHeartbeat, so
// that a hung call leaves two thirds of the lease for the paced tries after
// it (heartbeatWait), and never hides the lapse; the HTTP client's Timeout
// bounds it too. The Python and TypeScript workers cut theirs the same,
// within their client's timeout (sdk QA: Go let one call run to the lease's
// end, leaving no time to try again; they cut it at 10 s, past the end of a
// short lease).
func heartbeatCutoff(left time.Duration) time.Duration {
	return max(left/3, minHeartbeat)
}

// leaseGone says whether a job heartbeat's refusal ends the attempt for
// good, as the Python and TypeScript workers read it: 409 (lease_lost: a
// newer claim holds the job; invalid_state: the attempt or the job ended),
// 404 (the job is gone) and 403 (the key may not work the job's tool: it
// was cancelled and replayed onto a version the key does not list, and
// its report would be refused the same; sdk QA: the Go worker alone
// heartbeated on, every beat refused). A 401 stops the worker (keyRefused).
// Anything else (a 429, a 5xx, a lost answer) is a heartbeat that failed:
// tried again until the lease's end; so is a 403, 404 or 409 without
// Ratchet's error envelope (notRatchets: a proxy's or a load balancer's bare
// answer during a deploy or a misroute says nothing of the lease; review: it
// cancelled every running handler as lease lost and dropped their failures).
func leaseGone(err error) bool {
	var apiErr *Error
	if !errors.As(err, &apiErr) || notRatchets(err) {
		return false
	}
	switch apiErr.StatusCode {
	case http.StatusForbidden, http.StatusNotFound, http.StatusConflict:
		return true
	}
	return false
}

// jobLeaseLostError is the cause a handler is cancelled with when a
// heartbeat is refused for good, or the lease lapsed while heartbeats
// failed; it matches ErrLeaseLost and keeps the refusal's code ("" for a
// lapse). Only lease_lost and a lapse leave a success worth reporting: the
// server records a lapsed attempt's report while no newer claim holds the
// job.
type jobLeaseLostError struct{ code string }

// Error implements error.
func (e *jobLeaseLostError) Error() string {
	if e.code == "" {
		return ErrLeaseLost.Error() + " (no heartbeat extended it before it lapsed)"
	}
	return ErrLeaseLost.Error() + " (" + e.code + ")"
}

// successWorthReporting says whether a success returned after the lease was
// lost is still reported (see jobLeaseLostError).
func (e *jobLeaseLostError) successWorthReporting() bool {
	return e.code == CodeLeaseLost || e.code == ""
}

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *jobLeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

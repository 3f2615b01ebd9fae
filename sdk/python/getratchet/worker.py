"""The worker runtime: claims jobs for registered tools and runs them."""

from __future__ import annotations

import collections
import inspect
import math
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Deque, Dict, Hashable, List, Optional, Set, Tuple, Union, cast

from . import _json
from ._aio import await_alone
from ._failurelog import LOGGER, FailureLog
from ._http import Abort, Transport, new_request_id, path_id, spread_retry_after
from ._secrets import hide_secrets
from ._time import lease_seconds
from .errors import (FORBIDDEN, INVALID_REQUEST, INVALID_STATE, LEASE_EXPIRED, LEASE_LOST, MAX_RETRY_AFTER_MS,
                     MIN_RETRY_AFTER_MS, NOT_FOUND, PAYLOAD_TOO_LARGE, ConnectionLost, InvalidDecisionError, LeaseLost,
                     NonRetryableError, RatchetError, ReportNotRecorded, RetryableError, clamp_retry_after_ms)
from .redact import redact_message

# Heartbeat pacing: a third of the lease left, within these bounds, so a
# heartbeat lands well inside the lease and a cancellation is seen soon.
_MIN_HEARTBEAT = 1.0
_MAX_HEARTBEAT = 60.0
# How long a handler whose timeout passed has to return before the worker
# reports the timeout without it: enough for a handler that honours
# context.cancelled to unwind, too short for one that ignores it to hold
# its job (the Go SDK's timeoutGrace).
_TIMEOUT_GRACE = 1.0
# start()'s default stop_grace (the Go SDK's DefaultStopGrace): once a
# stop's deadline passed, how long cancelled handlers have to return and be
# reported, and then how much longer the reports are sent. Python cannot
# interrupt a blocked thread, so a handler notices its cancellation only at
# its next look at context.cancelled (or its own call's timeout): with the
# 1 s this was, one in a call of a few seconds was left unreported, its
# thread running on beside the attempt another worker began once the lease
# lapsed (SDK consistency QA: Go's was 10 s).
DEFAULT_STOP_GRACE = 10.0
# The deadline of a stop that stop() did not ask for (a stop_event set, a
# KeyboardInterrupt in a blocking start()): stop()'s default.
_IMPLICIT_STOP_TIMEOUT = 30.0
# The longest stop deadline and stop_grace waited, in seconds: a year, in
# place of a longer one or infinity ("no deadline", as Go's Stop under a
# context without one), which raised OverflowError out of stop() and the
# worker's loop (threading's waits end by TIMEOUT_MAX), the running job
# left unreported.
_MAX_STOP_WAIT = 365 * 24 * 3600.0
# The longest poll_interval start() takes, in seconds: a year.
_MAX_POLL_INTERVAL = 365 * 24 * 3600.0
# How much longer than the give-up time stop() waits for the deliveries it
# cut to end and on_error to be told.
_ABORT_SLACK = 2.0
_MAX_CLAIM = 100
# Reports of jobs that finish while another report is being sent go out
# together (POST /jobs/report): at most the API's 100 a batch, and about
# half its 1 MiB request limit in bytes (a report larger than that goes
# alone).
_REPORT_BATCH_MAX = 100
_REPORT_BATCH_BYTES = 512 * 1024
# No claim is made while a report waits to be recorded and its lease (as
# last extended) lapses within this margin (plus a long poll's wait): the
# claim could hand this worker its own job again (the Go SDK's
# reportLeaseMargin).
_REPORT_LEASE_MARGIN = 5.0
# One delivery of a report or a batch waits at most this long for its
# answer before it is repeated (the Go SDK's reportTimeout): a connection
# that hangs must not hold every report behind it for the client's timeout.
_REPORT_TIMEOUT = 30.0
# While one delivery of a report or a batch keeps failing for a reason that
# may pass (an outage, 429s), on_error is told this often that it is still
# being retried (a ReportNotRecorded, what "retrying"), as the Go SDK's
# reporter tells OnError every reportTimeout: an operator sees an outage
# that holds the worker's claims before a stop gives its reports up.
_REPORT_RETRYING_NOTICE = 30.0
# Report deliveries in flight at once (the Go SDK's reportInFlight).
_REPORTS_IN_FLIGHT = 3
# The single reports a batch sent again report by report (see _Reporter)
# has in flight at once (the Go SDK's singleReportsInFlight): a server that
# just refused the batch as too much is not sent its hundred reports at once.
_SINGLE_REPORTS_IN_FLIGHT = 8
# The server refuses request bodies over 1 MiB; an output that large (with
# the report around it) can never be recorded.
MAX_OUTPUT_BYTES = 1024 * 1024 - 1024
# Caps the wait after registrations or claims that keep failing for a reason
# that may pass, unless the poll interval is longer (the Go SDK's
# maxFailureWait): a worker never gives up on a server that is down or
# shedding load, and finds it again within about this long once it is back.
_MAX_FAILURE_WAIT = 60.0
# How often the claim loop looks again while a slot is missing or a report
# holds the claims. Each change it waits for (a slot freed, a report
# recorded, given up or found failing on its own, the stop) wakes it at
# once; this only bounds a change that could come unannounced.
_CLAIM_CHECK = 1.0
# How many times _despite_interrupts runs a step again after a
# KeyboardInterrupt cut it short: a Ctrl-C or two cut a step once each (each
# step takes microseconds), a step cut at every run is a signal storm or
# raises KeyboardInterrupt itself, and was run again for ever. The last
# run holds SIGINT's handler off (_holding_sigint), so that a storm of
# signals cannot leave the step undone.
_INTERRUPT_RERUNS = 3
# How often the on_error thread, waiting for something to deliver, looks
# whether its queue was closed though nothing woke it: a signal storm that
# cut every run of the close step after it set the flag and before it woke
# the thread left it waiting for ever, and each flush after it waited its
# full second (_Notices).
_NOTICES_CHECK = 0.1


@dataclass
class JobContext:
    """What a handler is told about the job it runs.

    Pass ``idempotency_key`` to the destination so that a repeated attempt
    is deduplicated there. ``cancelled`` is set when the handler should
    stop: its timeout passed ("timeout"), the server asked ("cancelled"),
    the lease was lost ("lease_lost") or the worker is stopping
    ("stopping"); ``cancel_reason`` says which. Python cannot stop a
    blocked thread: check ``cancelled`` (or ``remaining()``) and bound your
    own network calls with timeouts.
    """
    job_id: str
    step_id: str
    run_id: str
    name: str
    version: str
    attempt: int
    idempotency_key: str
    timeout_ms: int
    # The job's ceiling: attempt == max_attempts is the last execution
    # (unless replayed); 0 from a server that does not say.
    max_attempts: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    cancel_reason: Optional[str] = None
    _deadline: float = field(default=float("inf"), repr=False)
    _lease_token: str = field(default="", repr=False)

    def remaining(self) -> float:
        """Seconds left before the attempt's timeout (0 when passed)."""
        return max(0.0, self._deadline - time.monotonic())

    def _cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()


@dataclass
class _Tool:
    name: str
    version: str
    handler: Callable[[Any, JobContext], Any]
    classify: Optional[Callable[[BaseException, JobContext], Any]]

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


class _Active:
    """One claimed job while its supervisor runs it."""

    def __init__(self, context: JobContext, lease_ms: int, lease_end: float) -> None:
        self.context = context
        self.wake = threading.Event()  # the handler returned, a heartbeat cancelled it, or the worker stops
        self.stop_requested = False
        self.lease_ms = lease_ms
        self.lease_end = lease_end  # by this process's clock, as last extended
        self.lost_code: Optional[str] = None  # why the lease was lost: the server's code, or "" for a local lapse
        # The lease was lost or the server cancelled the job, even after the
        # stop cancelled the handler: its job does not run again for this
        # worker's leaving it.
        self.settled_elsewhere = False
        self.beats_done = threading.Event()  # the handler returned (or was left running): heartbeats end
        # Fired with beats_done: cuts a heartbeat in flight, whose answer
        # would come after the handler finished (end_beats).
        self.beats_cut = Abort("the handler finished", cuts_answers=True)
        self.reporting = False  # the handler is done; lease_end no longer moves (under the worker's lock)
        self.own_failure = False  # its report fails on its own (under the worker's lock): see Worker._report
        self.straggler = False  # the supervisor went on without the handler (under the worker's lock)
        self.given_up = False  # a second interrupt gave it up: the supervisor waits for nothing more
        self.told = False  # its report's loss went to on_error (under the worker's lock)
        # It holds one of the worker's slots (under the worker's lock): from
        # its claim until its handler returned and its report is queued
        # (Worker._free_slot), or, a straggler's, until its handler returns.
        self.holds_slot = True

    def end_beats(self) -> None:
        """Ends the heartbeats: none is sent from now, and the answer of one
        in flight is not read, as the Go and TypeScript workers end theirs
        (cutting the one in flight) once the handler returns."""
        self.beats_done.set()
        self.beats_cut.fire()

    def stop(self) -> None:
        """The worker's stop deadline passed: cancel the handler, and have
        the supervisor wait for it at most the grace."""
        self.stop_requested = True
        self.context._cancel("stopping")
        self.wake.set()

    def give_up(self) -> None:
        """A second interrupt came during the stop: cancel the handler, and
        have the supervisor wait for it no longer (Worker._abandon)."""
        self.given_up = True
        self.stop()


class _Report:
    """One job's report on its way: its delivery's callbacks, and once
    delivered (done) its refusal or failure (error), or that it is to be
    sent on its own (alone)."""

    def __init__(self, job_id: str, body: Dict[str, Any], may_wait: Callable[[float], bool],
                 on_retry: Callable[[], None], on_attempt: Callable[[], None] = lambda: None,
                 attempt: int = 0) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.queued = False  # deliver's on_queued was called
        self.body = body
        self.may_wait = may_wait
        self.on_retry = on_retry
        self.on_attempt = on_attempt
        try:
            self.size = len(_json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8"))
        except (TypeError, ValueError):
            self.size = _REPORT_BATCH_BYTES  # alone: its own send raises what it raised before
        self.done = False
        # Set when the batch is sent again report by report: the slots its
        # reports share, _SINGLE_REPORTS_IN_FLIGHT of them.
        self.alone: Optional[threading.BoundedSemaphore] = None
        self.error: Optional[BaseException] = None


class _Retrying:
    """Tells tell, every _REPORT_RETRYING_NOTICE while one delivery (of a
    report, or a batch: named by its first report) keeps failing for a
    reason that may pass, that it is still retried, as the Go SDK's
    reporter.send does: a ReportNotRecorded (what "retrying") naming the
    job and attempt, how many more the batch holds and for how long it has
    failed, its cause the last failure; never a report's body. failed is
    the delivery's stop_on (it records the failure and never stops it),
    retrying its on_retry."""

    def __init__(self, batch: List["_Report"], tell: Callable[[BaseException], None]) -> None:
        self._batch = batch
        self._tell = tell
        self._since: Optional[float] = None
        self._told = 0.0
        self._last: Optional[BaseException] = None

    def failed(self, err: BaseException) -> bool:
        self._last = err
        return False

    def retrying(self) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = self._told = now
            return
        if now - self._told < _REPORT_RETRYING_NOTICE:
            return
        self._told = now
        first, more = self._batch[0], len(self._batch) - 1
        failure = self._last
        detail = failure.code if isinstance(failure, RatchetError) else type(failure).__name__
        self._tell(ReportNotRecorded(
            f"ratchet: the report of job {first.job_id} attempt {first.attempt} (and {more} more in its batch) "
            f"not recorded for {round(now - self._since)}s ({detail}); still retrying",
            job_id=first.job_id, attempt=first.attempt, what="retrying", cause=failure))


class _Reporter:
    """Delivers the worker's job reports, batching those that finish
    together, as the Go SDK's reporter does.

    A report made while fewer than three deliveries are in flight goes at
    once, on the single-report route when it is alone; reports made while
    three are in flight gather and go as one batch (POST /jobs/report, up to
    100) when one ends. Three in flight, as the Go SDK's reporter has them,
    so that a delivery that hangs (up to its 30 s) does not hold every other
    report behind it while their leases lapse (QA: another worker ran such a
    job again). No thread of its own: the thread of the first report waiting
    sends the next batch, its own report in it or not. Each report in a
    batch is fenced by its own lease token and answered in its own slot,
    which is handed to its job as the single report's answer would be. A
    batch is repeated through failures as one report is, each report's
    callbacks told (so no claim is made while it fails, and a stop's
    deadline ends it), except that a batch the server refuses whole (an
    older server, a body it will not read) and one that meets a 500 twice
    running (which one report could cause) are sent again report by report,
    each by its own job's thread, at most _SINGLE_REPORTS_IN_FLIGHT of a
    batch at once (as the Go and TypeScript SDKs send them: a server that
    just answered "too much" is not sent a hundred requests at once), so
    that one report the server chokes on holds back only itself; so is one
    whose answer twice running does not line up with its reports
    (batch_results): a protocol error, not an outage, which the batch sent
    again whole would meet for ever (its reports never drained, no claim
    was made meanwhile, and a stop gave them all up at its deadline), as in
    the Go and TypeScript SDKs.
    """

    def __init__(self, transport: Transport, tell: Callable[[BaseException], None] = lambda error: None) -> None:
        self._transport = transport
        self._tell = tell  # on_error's: a delivery still failing (_Retrying)
        self._cond = threading.Condition()
        self._queue: List[_Report] = []
        self._in_flight = 0  # deliveries being sent
        self._abort = Abort()

    def abort(self) -> None:
        """Gives up every delivery: those in flight are cut (their reports
        are not recorded, as far as this process knows) and later ones fail
        at once. For a stop past its deadline and twice its grace."""
        self._abort.fire()

    def deliver(self, job_id: str, body: Dict[str, Any], *, may_wait: Callable[[float], bool],
                on_retry: Callable[[], None], on_attempt: Callable[[], None] = lambda: None,
                attempt: int = 0, on_queued: Callable[[], None] = lambda: None) -> None:
        """Delivers job_id's report (of attempt) and returns once recorded;
        raises what Transport.call_until raises for the single report: its
        refusal, or the failure may_wait gave up on. on_queued is called
        once the report is queued (the worker then frees its job's slot, as
        the Go SDK's does once its reporter took the report): at once while
        fewer than _REPORT_BATCH_MAX reports wait in the queue before it
        (the Go reporter's queue holds as many), else once it has moved up
        or into a delivery, so that a slow server slows claiming instead of
        piling up reports; at the latest as the call ends."""
        report = _Report(job_id, body, may_wait, on_retry, on_attempt, attempt)
        with self._cond:
            self._queue.append(report)
            while not report.done:
                if not report.queued and self._room_for(report):
                    report.queued = True
                    self._cond.release()
                    try:
                        on_queued()
                    finally:
                        self._cond.acquire()
                    continue
                if self._in_flight >= _REPORTS_IN_FLIGHT or not self._queue:
                    self._cond.wait()
                    continue
                batch = self._take()
                self._in_flight += 1
                # Reports behind the batch moved up: those waiting for room
                # look again, and so does this one, whose thread is about to
                # deliver (it freed its slot only once that delivery ended,
                # where the TypeScript worker frees one after each take).
                self._cond.notify_all()
                free = not report.queued and self._room_for(report)
                report.queued = report.queued or free
                self._cond.release()
                try:
                    if free:
                        self._queued_then_send(on_queued, batch)
                    else:
                        self._send(batch)
                finally:
                    self._cond.acquire()
                    self._in_flight -= 1
                    self._cond.notify_all()
        if not report.queued:
            report.queued = True
            on_queued()
        if report.alone is not None:
            retrying = _Retrying([report], self._tell)

            def retried() -> None:
                on_retry()
                retrying.retrying()

            with report.alone:
                self._transport.call_until("POST", _report_path(job_id), body, may_wait=may_wait, on_retry=retried,
                                           stop_on=retrying.failed,
                                           timeout=min(self._transport.timeout, _REPORT_TIMEOUT), abort=self._abort,
                                           on_attempt=on_attempt, bare_may_pass=True)
        elif report.error is not None:
            raise report.error

    def _queued_then_send(self, on_queued: Callable[[], None], batch: List[_Report]) -> None:
        """Calls on_queued, then sends batch whatever it raised: the batch
        holds other threads' reports."""
        try:
            on_queued()
        finally:
            self._send(batch)

    def _room_for(self, report: _Report) -> bool:
        """Whether fewer than _REPORT_BATCH_MAX reports wait in the queue
        before report, or it is no longer queued (under the condition)."""
        for ahead, queued in enumerate(self._queue):
            if queued is report:
                return ahead < _REPORT_BATCH_MAX
        return True

    def _take(self) -> List[_Report]:
        batch: List[_Report] = []
        size = 0
        jobs = set()
        later: List[_Report] = []  # a second report of a job already in the batch (a newer attempt)
        while self._queue and len(batch) < _REPORT_BATCH_MAX:
            if self._queue[0].job_id in jobs:
                # The server answers a job named twice in one batch
                # invalid_request for the second: it waits for the next one.
                later.append(self._queue.pop(0))
                continue
            if batch and size + self._queue[0].size > _REPORT_BATCH_BYTES:
                break
            report = self._queue.pop(0)
            batch.append(report)
            jobs.add(report.job_id)
            size += report.size
        self._queue[:0] = later
        return batch

    def _send(self, batch: List[_Report]) -> None:
        """One delivery of batch, with its retries; every report in it is
        done when it returns."""
        try:
            self._deliver(batch)
        except BaseException as failure:  # noqa: BLE001 - each report's own thread raises it
            for report in batch:
                if not report.done:
                    report.error = failure
        finally:
            for report in batch:
                report.done = True

    def _deliver(self, batch: List[_Report]) -> None:
        if len(batch) == 1:
            path, body = _report_path(batch[0].job_id), batch[0].body
        else:
            path, body = "/jobs/report", {"reports": [{"jobId": r.job_id, **r.body} for r in batch]}
        failed_500 = [0]  # 500s running
        mismatched = [0]  # answers running that do not line up with the reports (batch_results)
        misread = [False]  # the answer to the attempt that just failed did not
        retrying = _Retrying(batch, self._tell)

        def stop_on(err: Exception) -> bool:
            retrying.failed(err)
            failed_500[0] = failed_500[0] + 1 if isinstance(err, RatchetError) and err.status == 500 else 0
            mismatched[0] = mismatched[0] + 1 if misread[0] else 0
            misread[0] = False
            return failed_500[0] >= 2 or mismatched[0] >= 2

        def may_wait(wait: float) -> bool:
            return all([r.may_wait(wait) for r in batch])  # every report told: each keeps whether it gave up

        def on_retry() -> None:
            for r in batch:
                r.on_retry()
            retrying.retrying()

        def on_attempt() -> None:
            for r in batch:
                r.on_attempt()

        def read(answer: Dict[str, Any], request_id: str) -> Any:
            try:
                return batch_results(answer, [r.job_id for r in batch], request_id)
            except ValueError:
                misread[0] = True  # the transport raises it as an answer lost
                raise

        try:
            answer = self._transport.call_until("POST", path, body, may_wait=may_wait, on_retry=on_retry,
                                                stop_on=stop_on, timeout=min(self._transport.timeout, _REPORT_TIMEOUT),
                                                abort=self._abort, on_attempt=on_attempt,
                                                read=read if len(batch) > 1 else None,
                                                # A batch's bare 4xx sends it report by report (below).
                                                bare_may_pass=len(batch) == 1)
        except (RatchetError, ConnectionLost) as err:
            if mismatched[0] >= 2 or (isinstance(err, RatchetError) and (
                    failed_500[0] >= 2 or (len(batch) > 1 and 400 <= err.status < 500 and err.status != 429))):
                slots = threading.BoundedSemaphore(_SINGLE_REPORTS_IN_FLIGHT)
                for r in batch:
                    r.alone = slots
                return
            raise
        if len(batch) == 1:
            return
        for report, (_, error) in zip(batch, answer):
            if error is not None:
                report.error = error


def _claimed_lease_ms(job: Dict[str, Any], timeout_ms: int, date: Optional[datetime]) -> int:
    """A claimed job's lease length in ms: its leaseMs, which the server of
    this repository always sends; from a server that does not, its
    leaseExpiresAt less the claim answer's Date (less a second: Date has
    whole seconds), as the Go worker and a gate lease read it, so that a
    server clock ahead of or behind this process's neither lengthens nor
    cuts the lease; without a Date, what is left of it by this process's
    clock; the timeout plus 10 s (the server's default grace) only when it
    says neither."""
    given = int(job.get("leaseMs") or 0)
    if given > 0:
        return given
    left = int(lease_seconds(job.get("leaseExpiresAt"), date) * 1000)
    return left if left > 0 else timeout_ms + 10_000


def _report_path(job_id: str) -> str:
    return "/jobs/" + path_id(job_id) + "/report"


def batch_results(answer: Dict[str, Any], job_ids: List[str],
                  request_id: str = "") -> List[Tuple[Dict[str, Any], Optional[RatchetError]]]:
    """Each report's result in a batch report's answer (POST /jobs/report),
    in the reports' order (job_ids), with its error: None, or the refusal
    the single report would have raised (_item_error), its request_id the
    batch response's. An answer without one result per report, each naming
    the job of the report sent in its slot, raises ValueError: it cannot be
    matched to the reports, not even those whose slots agree, and is read
    as an answer lost (Transport.call's read: ConnectionLost, repeated as
    one), as the Go and TypeScript SDKs read it. The worker's batches and
    Ratchet.report_jobs read the answer alike."""
    results = answer.get("results")
    if not isinstance(results, list) or len(results) != len(job_ids):
        raise ValueError("not one result per report")
    out: List[Tuple[Dict[str, Any], Optional[RatchetError]]] = []
    for job_id, result in zip(job_ids, results):
        if not isinstance(result, dict) or result.get("jobId") != job_id:
            raise ValueError("a result for another job")
        failure = result.get("error")
        out.append((result, _item_error(failure, request_id) if isinstance(failure, dict) else None))
    return out


def _item_error(envelope: Dict[str, Any], request_id: str) -> RatchetError:
    """A batch's refusal of one report, as the single report's refusal
    (the status it would have answered: 409 lease_lost, 404 not_found...),
    with the batch response's request_id."""
    code = str(envelope.get("code", ""))
    status = {NOT_FOUND: 404, FORBIDDEN: 403, LEASE_LOST: 409, LEASE_EXPIRED: 409, INVALID_STATE: 409}.get(code, 400)
    given = envelope.get("detail")
    detail: Dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    return RatchetError(status, code, str(envelope.get("message", "")), detail, request_id=request_id)


class Worker:
    """Claims jobs of its registered tools and runs them (``Ratchet.worker``).

    Register tools first (``Ratchet.register_tool``), then ``start``. The
    worker claims in batches sized to its free slots, claims again at once
    after a full batch and waits ``poll_interval`` (±10 %) when idle,
    heartbeats each job well inside its lease (on a thread of its own, so a
    slow heartbeat never delays a timeout), sets the handler's
    ``context.cancelled`` at its timeout and when the server asks, and
    reports each outcome (those finishing together in one batch, each
    answered as its own report; retried until the server answers; no new claim is
    made while a report is failing, so a job whose outcome is still being
    reported is never run again here). Nothing but a bounded, redacted
    message leaves the process for a failure.
    """

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._reporter = _Reporter(transport, self._notify)
        self._tools: Dict[Tuple[str, str], _Tool] = {}
        self._lock = threading.Condition()
        self._running = 0  # slots taken: a slot is freed once its job's report is queued (_free_slot)
        # Supervisors not yet ended, by job id and attempt: a job's next
        # attempt may be claimed here while the report of its last one is
        # still being retried (QA: keyed by job id, the second attempt's
        # entry was overwritten and then removed by the first's end, and
        # stop() returned while its handler still ran).
        self._active: Dict[Tuple[str, int], _Active] = {}
        self._stragglers = 0  # handlers still running after the worker went on without them
        # The reports whose delivery met a failure, each with when it first
        # did; those failing on their own (see _report); and the send time
        # of the latest-sent delivery the server recorded, with when it did.
        # A failing report holds the claims unless it fails on its own (the
        # Go SDK's holding()).
        self._failing: Dict[int, float] = {}
        self._own_failures: Set[int] = set()
        self._recorded_sent = float("-inf")
        self._recorded_at = float("-inf")
        self._started = False
        self._stopping = threading.Event()
        self._stop_at: Optional[float] = None  # when running handlers are told to stop
        self._stop_grace = DEFAULT_STOP_GRACE  # start()'s stop_grace
        self._done = threading.Event()
        self._loop_thread: Optional[threading.Thread] = None
        self._errors = _Notices()
        self._on_error: Optional[Callable[[BaseException], Any]] = None
        # Without on_error: the default failure log, decided by the on_error
        # thread in the order the problems were told, each at the time it was
        # told (_log; a test seam: its now is the clock that paces it).
        self._failure_log = FailureLog()
        self._failure_log_lock = threading.Lock()
        self._lost_reports = 0
        self._left_unreported = 0  # handlers a stop gave up on, their jobs unreported
        self.worker_id: Optional[str] = None
        self._claim_id: Optional[str] = None  # a claim whose answer was lost, to ask again (loop thread only)
        self._claim_limit = 1  # the limit that claim asked for (loop thread only)
        self._claim_abort = Abort()  # fired at the stop's deadline: cuts a claim in flight
        # A stop() without a deadline (math.inf) was asked for: a handler that
        # ignores a lost lease or a cancel request gets the grace from then,
        # or from the loss if later (the Go SDK's undated; set under the lock).
        self._undated = False
        self._claim_waits_cut = Abort()  # fired at the stop: ends a claim's wait between attempts (a 429's)
        self._claim_cut: Optional[threading.Timer] = None  # fires it; cancelled once the worker is done
        self._abandoned_claims = 0  # claims whose answers were lost and never asked again in time
        self._refused: Optional[RatchetError] = None  # the claim's 401 or 403 that stopped the worker
        self._registering: Optional[threading.Thread] = None  # the thread start() registers on, while it does
        self._abandoned = False  # a second interrupt gave up the stop (_abandon); nothing more is told

    def add_tool(self, name: str, version: str, handler: Callable[[Any, JobContext], Any],
                 classify_error: Optional[Callable[[BaseException, JobContext], Any]] = None) -> None:
        """Registers handler for name@version (see Ratchet.register_tool)."""
        if not name or not version:
            raise ValueError("ratchet: a tool needs a name and a version")
        if not callable(handler) or (classify_error is not None and not callable(classify_error)):
            raise TypeError("ratchet: handler and classify_error must be callable")
        if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
            # Its body never runs when called: the generator was reported as
            # an output that is not JSON, and the job exhausted unrun.
            raise TypeError("ratchet: a handler must return its output, not be a generator function")
        with self._lock:
            if self._started:
                raise RuntimeError("ratchet: register tools before start()")
            if (name, version) in self._tools:
                raise ValueError(f"ratchet: {name}@{version} is already registered")
            self._tools[(name, version)] = _Tool(name, version, handler, classify_error)

    # -- lifecycle ----------------------------------------------------------

    def start(self, concurrency: int = 1, *, poll_interval: float = 30.0, wait_seconds: int = 0,
              on_error: Optional[Callable[[BaseException], Any]] = None,
              stop_event: Optional[threading.Event] = None, block: bool = True,
              stop_grace: float = DEFAULT_STOP_GRACE) -> None:
        """Registers the worker and polls for jobs until stop().

        concurrency bounds the handlers running at once (a handler that
        ignores its cancellation keeps its slot until it returns).
        poll_interval (seconds, > 0, at most a year) is the idle wait between claims (30 s
        by default: every claim is a database query and, on Vercel, a
        function invocation); with wait_seconds (0-20) each claim long-polls
        on the server, and the idle wait is what is left of the interval.
        on_error(error) receives what the worker cannot hand to anyone else
        (claims and heartbeats that failed, leases lost, reports not recorded
        (refused, given up, or never sent because a stop left the job's
        handler running past stop_grace), classifier failures), on a thread
        of the worker's own, in order. Without it the
        worker logs each to logging.getLogger("getratchet.worker") at
        WARNING as one line holding none of the error's text (an API error's
        status, code and request id; a network failure's kind; the call's
        method, host and path; else only the exception's class): the first
        at once, then at most a line a minute counting those left out, and
        one line when a registration or claim succeeds after a logged
        failure to reach the server. stop_event,
        when set, stops the worker as stop() does. With block=True (the
        default) start returns once the worker has stopped, its running
        jobs ended and on_error been told what the stop gave up (waited for
        up to a second, as stop() waits; a KeyboardInterrupt there asks for
        the stop, waits, and is raised again; a second one while it waits,
        or one after stop_event was set, stops the waiting (one as the
        first's stop is asked for, too), as a second
        Ctrl-C quits a Celery or RQ worker: running handlers are cancelled
        and left running unwaited, report deliveries cut, each job whose
        report was not recorded told to on_error once as ReportNotRecorded
        (its lease lapses and it runs again), nothing more told after, and
        the KeyboardInterrupt raised again once on_error was told, waited
        for up to a second; a further one cuts short only that wait, none
        of the giving up: a step of it cut at every try, as only a storm of
        signals does, is done after a few with SIGINT's handler held off).
        A start() called while its caller handles a KeyboardInterrupt (in
        an ``except KeyboardInterrupt:`` block) counts
        that one as no interrupt of the worker's: the worker's first stops it
        as above. With block=False it returns once the worker is registered
        (which waits out an outage first, as below), its loop running on a
        thread of its own. stop_grace
        (seconds, >= 0; 10 by default, as the Go and TypeScript workers')
        is how long, once a stop's deadline passed, cancelled handlers have
        to return and be reported (those that do not are left unreported,
        each told to on_error once: see stop()), and then how much longer
        the reports are sent.

        A registration or claim that fails for a reason that may pass (the
        server unreachable, a 5xx, a 429, once the client's max_retries ran
        out) goes to on_error and is tried again for as long as the worker
        runs: after the nth failure in a row the worker waits poll_interval
        doubled n-1 times, at most a minute (or poll_interval when longer),
        half of it jittered, and never less than the server's Retry-After
        (detail.retry_after_seconds) within that cap (and up to a fifth of
        it more, drawn at random, as after a 429 or a 503). So start() waits out
        an outage before it registers (under one Idempotency-Key), until
        Ratchet's own refusal (401, 403, 400 in its error envelope: raised at
        once; a proxy's bare 400, 401 or 404 is waited out as a 5xx is), a
        stop() or stop_event
        (start() then returns, having run nothing). A refusal no retry
        mends, whichever call meets it first (a 401 to any call: the key was
        revoked; a claim refused 403, 400, 409, 422...; a registration
        refused, or a 404 again, after a claim's 404 registered the worker
        again), stops the worker as a stop() whose deadline has passed
        would: running handlers are told to stop at once. It goes to
        on_error (or the default log, at once), and a blocking start() then
        raises that RatchetError, once on_error has been told it (waited for
        up to a second). Without on_error, a last line counts the
        problems the log left out, if any, when the worker stops."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError("ratchet: concurrency must be a positive integer")
        if isinstance(wait_seconds, bool) or not isinstance(wait_seconds, int) or not 0 <= wait_seconds <= 20:
            raise ValueError("ratchet: wait_seconds must be an integer from 0 to 20")
        # At most a year: a longer one (past threading.TIMEOUT_MAX, about 292
        # years, once jittered) raised OverflowError out of the worker's loop
        # at its first idle wait, after it had registered.
        if (not isinstance(poll_interval, (int, float)) or not math.isfinite(poll_interval) or poll_interval <= 0
                or poll_interval > _MAX_POLL_INTERVAL):
            raise ValueError("ratchet: poll_interval must be a positive number of seconds, at most a year")
        if (isinstance(stop_grace, bool) or not isinstance(stop_grace, (int, float)) or not math.isfinite(stop_grace)
                or stop_grace < 0):
            raise ValueError("ratchet: stop_grace must be a number of seconds, 0 or more")
        with self._lock:
            if not self._tools:
                raise RuntimeError("ratchet: register at least one tool before start()")
            if self._started:
                raise RuntimeError("ratchet: the worker was already started")
            self._started = True
            self._stop_grace = min(float(stop_grace), _MAX_STOP_WAIT)
        self._on_error = on_error
        tools = [{"name": t.name, "version": t.version} for t in self._tools.values()]
        # The failed registrations are told, and a stop_event heard, while
        # start() waits for the server. A queue of its own: that of a
        # start() that raised was closed, its thread ended.
        self._errors = _Notices()
        threading.Thread(target=self._deliver_errors, name="ratchet-on-error", daemon=True).start()
        gave_up = threading.Event()  # this start() raised: its stop_event watcher ends
        if stop_event is not None:
            threading.Thread(target=self._watch_stop_event, args=(stop_event, gave_up), name="ratchet-stop-event",
                             daemon=True).start()
        self._registering = threading.current_thread()
        try:
            self.worker_id = self._register_until(tools, float(poll_interval))
        except BaseException:
            with self._lock:
                self._started = False
            gave_up.set()
            self._close_errors()
            raise
        finally:
            self._registering = None
        if self.worker_id is None:
            # Stopped while waiting for the server: nothing ran.
            self._drain(sys.exc_info()[1])
            return
        args = (concurrency, float(poll_interval), wait_seconds, tools)
        if block:
            self._loop_thread = threading.current_thread()
            try:
                self._loop(*args)
            finally:
                # on_error (or the default log) is told what the stop gave
                # up, for at most a second, before start() returns or raises,
                # as stop() waits: a stop_event's or a KeyboardInterrupt's
                # start() returned while the reports it lost were still being
                # told, and a program that ended then never heard of them
                # (review: start() raised while a slow on_error had yet to be
                # told the refusal).
                self._flush_errors()
            if self._refused is not None:
                # A worker that stopped because its key was refused must
                # not return as a clean stop would (QA: it polled on for
                # ever, each claim refused 401).
                raise self._refused
        else:
            self._loop_thread = threading.Thread(target=self._loop, args=args, name="ratchet-worker", daemon=True)
            self._loop_thread.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stops polling and lets running handlers finish within timeout
        seconds; then their ``context.cancelled`` is set ("stopping") and
        those that still do not return within start()'s stop_grace (10 s
        by default) are left unreported (their leases lapse and another
        worker runs them again), each told to on_error once, before stop()
        returns, as a ReportNotRecorded naming its job_id and attempt
        (never its input), as the Go and TypeScript workers' are (one whose
        lease was lost or whose job the server cancelled, before or during
        the grace, is left running after the same grace, from the deadline
        too, nothing told: its
        job does not run again for this worker's leaving it; with no
        deadline, math.inf, the grace runs from the stop's call, or from the
        loss if later, as under Go's Stop without a deadline); the
        reports are sent until the deadline and twice the grace at most, as
        the Go SDK's Stop. timeout=math.inf sets no deadline (a year, as
        any longer one), as Go's Stop under a context without one. Returns
        whether every job this worker claimed ended with its outcome
        recorded or settled elsewhere (no report lost: one refused because
        a newer attempt holds the job, it ended, or it no longer exists is
        not, as Go's Stop; no handler left running, no claim whose
        answer was lost given up: a claim still unanswered at the deadline
        is cut, and the jobs it may have leased lapse). A stop before
        start() does nothing and answers True; one while start() waits for
        the server to register it ends the wait (start() returns having run
        nothing). Called from the thread running start() (a signal
        handler) before it is done, it only asks for the stop, answers
        False, and start() returns once done. A KeyboardInterrupt while
        it waits gives up what is left at once, as a second one during a
        blocking start()'s drain does (handlers cancelled and left
        unwaited, report deliveries cut, each job whose report was not
        recorded told to on_error once), and is raised again once the
        worker is done and on_error told (waited for up to a second; a
        further one cuts short only that wait, none of the giving up)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
            raise ValueError("ratchet: stop's timeout must be a number of seconds (math.inf: no deadline)")
        timeout_asked = float(timeout)
        timeout = min(max(timeout_asked, 0.0), _MAX_STOP_WAIT)
        with self._lock:
            if not self._started:
                return True
        self._request_stop(timeout)
        if math.isinf(timeout_asked) and timeout_asked > 0:
            with self._lock:
                if not self._undated:
                    # No deadline to start their grace at: a handler
                    # ignoring a lost lease or a cancel request, which has
                    # nothing left to report, gets it from now (or from the
                    # loss, if later), as under Go's Stop without a deadline
                    # (review: it was waited for until the year's deadline).
                    self._undated = True
                    for active in self._active.values():
                        active.wake.set()
        if not self._done.is_set() and threading.current_thread() in (self._loop_thread, self._registering):
            return False
        # The drain cuts the deliveries still in flight at the give-up
        # time; they end at once, and on_error is told before this returns.
        try:
            self._done.wait(timeout + 2 * self._stop_grace + _ABORT_SLACK)
        except KeyboardInterrupt:
            # A Ctrl-C while stop() waits (start(block=False): the drain runs
            # on the worker's thread) gives up what is left at once, as a
            # second one during a blocking start()'s drain does (review: it
            # raised out of stop() while the drain ran on to its deadline).
            self._abandon()
            self._done.wait(_ABORT_SLACK)
            self._flush_errors()
            raise
        self._flush_errors()
        with self._lock:
            return (self._done.is_set() and not self._abandoned and not self._active and self._lost_reports == 0
                    and self._left_unreported == 0 and self._stragglers == 0 and self._abandoned_claims == 0)

    def _request_stop(self, timeout: float) -> None:
        with self._lock:
            if self._stop_at is None:
                self._stop_at = time.monotonic() + max(0.0, timeout)
                # A claim in flight (or waiting out a 429) is cut at the
                # deadline, as Go's and TypeScript's are (QA: one the
                # transport kept retrying leased jobs after stop() returned).
                self._claim_cut = threading.Timer(max(0.0, timeout), self._claim_abort.fire)
                self._claim_cut.daemon = True
                self._claim_cut.start()
                # A claim waiting out a 429 leased nothing: it ends at once,
                # as Go's and TypeScript's do, rather than at the deadline.
                self._claim_waits_cut.fire()
            self._stopping.set()
            self._lock.notify_all()

    def _watch_stop_event(self, stop_event: threading.Event, gave_up: threading.Event) -> None:
        while not self._done.is_set() and not gave_up.is_set():
            if stop_event.wait(0.5):
                self._request_stop(_IMPLICIT_STOP_TIMEOUT)
                return

    # -- polling ------------------------------------------------------------

    def _register(self, tools: List[Dict[str, str]], key: Optional[str] = None) -> str:
        # A stop ends a wait between attempts, and its deadline cuts one in
        # flight, as a claim's.
        answer = self._transport.call("POST", "/workers/register", {"tools": tools}, safe=True,
                                      idempotency_key=key or new_request_id(), abort=self._claim_abort,
                                      retry_cutoff=self._claim_waits_cut)
        return cast(str, answer["workerId"])  # API.md: the worker's id, a string

    def _register_until(self, tools: List[Dict[str, str]], poll_interval: float) -> Optional[str]:
        """Registers for start(), under one Idempotency-Key (a repeat after
        a lost answer gets the worker id the first attempt registered),
        trying again after each failure that may pass, told to on_error,
        with _failure_wait's backoff: a worker started while the server is
        down waits for it, as a River or Temporal worker does (worker QA:
        start() gave up after max_retries; review: it raised a proxy's bare
        4xx, _not_ratchets, at once). Ratchet's own refusal is raised; None
        when the worker was stopped first."""
        key = new_request_id()
        failures = 0
        while True:
            try:
                worker_id = self._register(tools, key)
                self._recovered()
                return worker_id
            except (RatchetError, ConnectionLost) as err:
                if self._stopping.is_set():
                    return None
                if not self._transient(err) and not _not_ratchets(err):
                    raise  # Ratchet's own refusal; a proxy's bare 400, 401 or 404 may pass
                self._notify(err)
                failures += 1
                self._pause(_failure_wait(poll_interval, failures, err))
                if self._stopping.is_set():
                    return None

    def _register_again(self, tools: List[Dict[str, str]]) -> Optional[BaseException]:
        """Registers under a new worker id, for a server that forgot the old
        one; answers the failure (the loop tells it: a refusal stops the
        worker, as at start(); after a failure that may pass, the next
        claim, answered 404 again, registers again), or None."""
        try:
            self.worker_id = self._register(tools)
            self._recovered()
        except (RatchetError, ConnectionLost) as again:
            return again
        return None

    def _refused_for_good(self, err: BaseException) -> bool:
        """Whether a claim's failure, or the failure of the registration made
        again after a claim answered 404, stops the worker (the Go SDK's
        refusedForGood): any refusal that asking again cannot mend. A 401
        (the key was revoked) and a 403 (the key may not claim, or not these
        tools), but also a 400, a 409 other than retry_request, a 422 or any
        other 4xx: a claim's body is the worker's own, so every claim it
        would ever send is refused alike (API.md names no other refusal of a
        claim). A claim's 404 not_found is the one refusal that registering
        again mends (_worker_unknown). Only Ratchet's own refusal, in its
        error envelope, stops the worker: an answer without one (a proxy's,
        _not_ratchets) may pass, as do the failures _transient names."""
        return (isinstance(err, RatchetError) and not _not_ratchets(err) and not _worker_unknown(err)
                and not self._transient(err))

    def _refuse(self, err: BaseException, notice: Optional[BaseException] = None) -> None:
        """Stops the worker for good after a refusal no retry mends: a 401
        met by any call (_key_refused), or a claim's or registration's
        refusal (_refused_for_good), whichever call met it first. It stops as
        a stop whose deadline has passed: no more claims (a claim in flight
        is cut), and the running handlers are told to stop at once
        ("stopping"; those that return within stop_grace are reported as
        they returned, which a revoked key's server refuses too). notice
        (err when None) goes to on_error, or without it to the default log
        at once, whatever its pacing; err is what a blocking start() raises
        (the first refusal's; a later one is only told)."""
        told: BaseException = err if notice is None else notice
        with self._lock:
            first = self._refused is None
            if first:
                self._refused = err  # type: ignore[assignment]
        if not first:
            self._notify(told)
            return
        if self._on_error is not None:
            self._errors.put(told)
        else:
            self._log(lambda log, at: log.refusal(told, at))
        self._request_stop(0.0)
        with self._lock:
            now = time.monotonic()
            if self._stop_at is not None and self._stop_at > now:
                self._stop_at = now  # a stop asked for before: now at once
                self._lock.notify_all()
        self._claim_abort.fire()

    def _transient(self, err: BaseException) -> bool:
        """Whether a failure may pass: what the transport repeats for a call
        safe to repeat (a lost answer, a 5xx, a 429, a 408, retry_request)."""
        if isinstance(err, ConnectionLost):
            return True
        return isinstance(err, RatchetError) and self._transport.retry_delay(err, 0, True) is not None

    def _pause(self, seconds: float) -> None:
        """Waits seconds, or until the worker stops."""
        self._stopping.wait(seconds)

    def _loop(self, concurrency: int, poll_interval: float, wait_seconds: int, tools: List[Dict[str, str]]) -> None:
        lost = 0  # claims running whose answers were lost
        failed = 0  # claims running that failed otherwise
        registered_again = False  # the last claim answered 404 and the worker registered again
        before = sys.exc_info()[1]  # what start()'s caller was handling, if anything: no interrupt of this loop's
        try:
            while not self._stopping.is_set():
                with self._lock:
                    # No claim while a slot is missing, or while a report is
                    # failing: the job it reports may lapse and come back to
                    # this very worker, which would run it again.
                    while ((self._running >= concurrency or self._reports_holding()
                            or self._report_lapsing(wait_seconds))
                           and not self._stopping.is_set()):
                        self._lock.wait(_CLAIM_CHECK)
                    if self._stopping.is_set():
                        break
                    limit = min(concurrency - self._running, _MAX_CLAIM)
                sent = time.monotonic()
                try:
                    jobs, date = self._claim(limit, wait_seconds)
                except (RatchetError, ConnectionLost) as err:
                    # A claim the stop cut (a 429's wait) is no failure to
                    # tell, as in Go and TypeScript; nor, once stopping, one
                    # whose answer was lost (asked again below, or told
                    # abandoned).
                    if not self._stopping.is_set():
                        if _worker_unknown(err) and not registered_again:
                            # The server forgot the worker: register again, once.
                            self._notify(err)
                            again = self._register_again(tools)
                            if again is not None and not self._stopping.is_set():
                                if not self._transient(again) and not _not_ratchets(again):
                                    self._refuse(again)
                                    break
                                self._notify(again)
                            registered_again = again is None
                        elif _worker_unknown(err) or self._refused_for_good(err):
                            # No claim will ever succeed (the key was revoked,
                            # may not claim, or every claim is refused; or the
                            # server forgot the worker again right after it
                            # registered again): stop rather than ask for ever.
                            self._refuse(err)
                            break
                        else:
                            self._notify(err)
                    if not _worker_unknown(err):
                        registered_again = False
                    if self._claim_id is not None:
                        lost += 1
                    else:
                        lost, failed = 0, failed + 1
                    self._pause(self._after_failed_claim(poll_interval, lost, failed, err))
                    continue
                lost = failed = 0
                registered_again = False
                self._recovered()
                for job in jobs:
                    self._dispatch(job, sent, date)
                if len(jobs) >= limit or (jobs and wait_seconds):
                    continue  # work is waiting, or the next claim waits on the server anyway
                # A long poll already waited part of the interval.
                waited = time.monotonic() - sent if wait_seconds else 0.0
                self._pause(max(0.0, _jittered(poll_interval) - waited))
            self._ask_again_while_stopping()
        except BaseException:
            # A KeyboardInterrupt: stop as stop() would, then raise it again.
            # A second one that lands here, before the drain begins, is
            # seen there by its context (the first).
            self._request_stop(_IMPLICIT_STOP_TIMEOUT)
            raise
        finally:
            # Not closed: one that lands in the few bytecodes between here
            # and the drain's try skips the drain, as Python gives no way to
            # hold a signal's handler off (short of replacing it).
            self._drain(before)

    def _after_failed_claim(self, poll_interval: float, lost: int, failed: int, err: BaseException) -> float:
        """How long to wait after a failed claim: _failure_wait's backoff
        after failed claims in a row (worker QA: one poll interval, however
        long the failures lasted, and a 429's Retry-After heeded only
        within max_retries), or, when its answer was lost (its id kept,
        lost claims running), the transport's backoff: the jobs it may have
        leased are this worker's while their leases hold, which a whole
        interval would outlast (Go SDK QA: jobs with a 15 s lease lapsed
        unseen while the worker waited its 30 s); never before the server's
        Retry-After."""
        if self._claim_id is None:
            return _failure_wait(poll_interval, failed, err)
        return max(min(self._transport.backoff(lost), poll_interval), _retry_after(err, _MAX_FAILURE_WAIT))

    def _ask_again_while_stopping(self) -> None:
        """Once the worker stops, asks again under the id of a claim whose
        answer was lost, until it is answered or the stop's deadline: the jobs
        it may have leased run within the stop's time like those of a claim in
        flight when the stop came (Go SDK QA: the stop ended the asking, and
        the jobs lapsed unseen). Asked again, a claim that had leased nothing
        leases afresh, at most its own limit, without a long poll."""
        attempt = 0
        if self._refused is not None:
            return  # a refused key's claim would be refused too; the handlers stop at once
        while self._claim_id is not None:
            with self._lock:
                left = (self._stop_at or 0.0) - time.monotonic()
            if left <= 0 or self._claim_abort.fired:
                with self._lock:
                    self._abandoned_claims += 1
                self._notify(ConnectionLost("ratchet: the worker stopped before a claim whose answer was lost was "
                                            "answered; the jobs it leased, if any, run again once their leases lapse"))
                return
            if attempt:
                time.sleep(min(self._transport.backoff(attempt), left))
            attempt += 1
            sent = time.monotonic()
            try:
                jobs, date = self._claim(self._claim_limit, 0)
            except (RatchetError, ConnectionLost) as err:
                if self._claim_id is None:
                    self._notify(err)  # answered: refused
                continue
            for job in jobs:
                self._dispatch(job, sent, date)

    def _reports_holding(self) -> bool:
        """Whether a failing report holds the claims (under the lock)."""
        return any(key not in self._own_failures for key in self._failing)

    def _report_lapsing(self, wait_seconds: int) -> bool:
        """Whether a report not yet recorded has a lease that lapses before
        a claim made now is surely answered (under the lock)."""
        horizon = time.monotonic() + _REPORT_LEASE_MARGIN + wait_seconds
        return any(a.reporting and not a.own_failure and a.lease_end <= horizon for a in self._active.values())

    def _claim(self, limit: int, wait_seconds: int) -> Tuple[List[Dict[str, Any]], Optional[datetime]]:
        # One claim id across the call's retries, and across claims until
        # one is answered: a claim whose answer was lost is answered again
        # with the jobs it leased, instead of leaving them to lapse. The
        # answer's Date comes with its jobs: their leases are read by it.
        if self._claim_id is None:
            self._claim_id, self._claim_limit = new_request_id(), limit
        body = {"limit": limit, "waitSeconds": wait_seconds, "claimId": self._claim_id}
        path = "/workers/" + path_id(self.worker_id or "") + "/claim"
        try:
            answer, date = self._transport.call("POST", path, body, safe=True, with_date=True,
                                                timeout=max(self._transport.timeout, wait_seconds + 10.0),
                                                abort=self._claim_abort, retry_cutoff=self._claim_waits_cut)
        except RatchetError as err:
            if not err.may_have_applied:
                self._claim_id = None  # answered: nothing was leased under it
            raise
        self._claim_id = None
        return [hide_secrets(job) for job in answer.get("jobs") or []], date

    def _dispatch(self, job: Dict[str, Any], sent: float, date: Optional[datetime]) -> None:
        context = JobContext(job_id=job["jobId"], step_id=job.get("stepId", ""), run_id=job.get("runId", ""),
                             name=job.get("name", ""), version=job.get("version", ""),
                             attempt=int(job.get("attempt", 0)), idempotency_key=job.get("idempotencyKey", ""),
                             timeout_ms=int(job.get("timeoutMs") or 0),
                             max_attempts=int(job.get("maxAttempts") or 0), _lease_token=job["leaseToken"])
        lease_ms = _claimed_lease_ms(job, context.timeout_ms, date)
        active = _Active(context, lease_ms, sent + lease_ms / 1000)
        with self._lock:
            self._running += 1
            self._active[(context.job_id, context.attempt)] = active
            if self._stopping.is_set() and self._stop_at is not None and time.monotonic() >= self._stop_at:
                active.stop()
        threading.Thread(target=self._supervise, args=(active, job), name="ratchet-job", daemon=True).start()

    def _drain(self, before: Optional[BaseException]) -> None:
        """Waits for running jobs until the stop deadline, then tells the
        rest to stop and waits for their supervisors (which report what
        returned within the grace). A KeyboardInterrupt meanwhile (a second
        Ctrl-C) gives up what is left at once (_abandon) and is raised
        again; so does one that came before the drain began, while the
        first was handled (the exception the drain's caller propagates, its
        context an interrupt raised since before: what the thread was
        handling when the worker began, not the worker's). Either way the
        worker ends done, its on_error thread told the rest and its claim
        cut's timer cancelled (review: a second Ctrl-C skipped all three,
        and they ran on until the deadline), each of those steps done even
        when another interrupt cuts one short (_despite_interrupts)."""
        try:
            if _interrupted_again(sys.exc_info()[1], before):
                # Review: taken as the first, it drained to the deadline
                # (with no deadline at all when it cut the stop's request).
                self._abandon()
            else:
                self._wait_for_jobs()
        except BaseException:
            self._abandon()
            raise
        finally:
            # A stopped worker makes no more calls: its kept connections go
            # (the client's own calls open new ones as they need them).
            _despite_interrupts(self._cancel_claim_cut, self._done.set, self._close_errors,
                                self._transport.close_idle)

    def _cancel_claim_cut(self) -> None:
        with self._lock:
            if self._claim_cut is not None:
                self._claim_cut.cancel()  # nothing left to cut: its thread ends now, not at the deadline

    def _wait_for_jobs(self) -> None:
        with self._lock:
            while self._active and (self._stop_at is None or time.monotonic() < self._stop_at):
                self._lock.wait(None if self._stop_at is None else max(0.0, self._stop_at - time.monotonic()))
            for active in self._active.values():
                active.stop()
            # Reports still being delivered at the give-up time are cut
            # (QA: a delivery in flight waited out its own timeout, and
            # stop() returned while threads still sent).
            give_up = (self._stop_at if self._stop_at is not None else time.monotonic()) + 2 * self._stop_grace
            aborted = False
            while self._active:
                left = give_up - time.monotonic()
                if left > 0 or aborted:
                    self._lock.wait(None if aborted else left)
                    continue
                aborted = True
                self._lock.release()
                try:
                    self._reporter.abort()
                finally:
                    self._lock.acquire()

    def _abandon(self) -> None:
        """Gives up, at once, what a stop still waited for: a second
        interrupt means stop waiting, as a second Ctrl-C makes Celery's and
        RQ's workers quit without waiting for their jobs. Running handlers
        are cancelled ("stopping") and waited for no longer, report
        deliveries are cut, and each job whose report was not recorded
        (nor already told lost) is told to on_error once, as not recorded:
        its lease lapses and another worker runs it again. Nothing the
        worker's threads meet afterwards is told. Another interrupt while it
        runs (a third Ctrl-C) cuts none of this short: each step is
        idempotent, done again when cut (_despite_interrupts, a few times
        at most), and called again it does only what is left (review: a job
        was left untold, another not cancelled, the deliveries not cut); a
        job told and cut before it was marked told is told once all the
        same (_Notices)."""
        _despite_interrupts(self._give_up_jobs, self._claim_waits_cut.fire, self._claim_abort.fire,
                            self._reporter.abort)

    def _give_up_jobs(self) -> None:
        with self._lock:
            self._abandoned = True
            now = time.monotonic()
            if self._stop_at is None or self._stop_at > now:
                self._stop_at = now
            self._stopping.set()
            for active in self._active.values():
                active.give_up()
                if not active.settled_elsewhere:
                    # Not a job whose lease was lost (on_error was told)
                    # or that the server cancelled: neither runs again for
                    # this worker's giving it up (QA: told it did).
                    self._tell_given_up(active, _given_up(active))
            self._lock.notify_all()

    def _tell_given_up(self, active: _Active, notice: ReportNotRecorded) -> None:
        """Tells on_error (under the lock) of a job a stop gave up, unless
        it was told already: by a second interrupt (_give_up_jobs), or by
        its supervisor once the stop grace ended with its handler still
        running, or its report's loss (_lost). Marked once told, not
        before: an interrupt (a third Ctrl-C) between the two has the step
        run again, which tells it again rather than never (a user who
        misses a lost job never looks for it; one told twice of the same
        job and attempt sees it is one). The on_error thread delivers one
        notice of a key, so that it is told once all the same (review: told
        twice), whichever path told it first."""
        if not active.told:
            self._tell(notice, key=("given up", active.context.job_id, active.context.attempt))
            active.told = True

    def _release_slot(self) -> None:
        with self._lock:
            self._running -= 1
            self._lock.notify_all()

    def _free_slot(self, active: _Active) -> None:
        """Frees the slot active holds, if it still does: once its report is
        queued (the reporter retries it meanwhile, its deliveries bounded by
        the queue's room and, while they fail, by no claim being made), or
        as its supervisor ends, as the Go worker frees a job's slot once its
        report is queued (a report failing on its own, which the server
        keeps refusing, kept the slot of a worker of one until the stop
        gave it up, so the worker claimed on in name only). Not a
        straggler's: its slot is kept until its handler returns."""
        with self._lock:
            if not active.holds_slot:
                return
            active.holds_slot = False
            self._running -= 1
            self._lock.notify_all()

    # -- one job ------------------------------------------------------------

    def _supervise(self, active: _Active, job: Dict[str, Any]) -> None:
        context = active.context
        try:
            tool = self._tools.get((context.name, context.version))
            if tool is None:
                # The server only hands out registered pairs; if it ever
                # does not, give the job back for a worker that has it.
                self._report(context, {"status": "FAILED", "error": {
                    "message": "worker has no handler for this name@version", "retryable": True}})
                return
            outcome: Dict[str, Any] = {}
            handler, ref = tool.handler, tool.ref

            def run_handler() -> None:
                try:
                    output = handler(job.get("input"), context)
                    if inspect.isawaitable(output):
                        # An async def handler, awaited on this thread's own
                        # loop (its coroutine was reported as an output that
                        # is not JSON, and the job exhausted unrun).
                        output = await_alone(output, f"{ref}'s handler")
                    outcome["output"] = output
                except BaseException as failure:  # noqa: BLE001 - every failure is the job's outcome
                    outcome["error"] = failure
                finally:
                    with self._lock:
                        # Why it was cancelled when it returned: a stop that
                        # comes after must not change how its outcome is read.
                        outcome["reason"] = context.cancel_reason
                        outcome["returned"] = True
                        straggler = active.straggler
                        if straggler:
                            self._stragglers -= 1
                    # Heartbeat answers from now on are not read (a 401 once
                    # it returned stopped the worker; Go and TypeScript stop
                    # the heartbeats as the handler returns).
                    active.end_beats()
                    active.wake.set()
                    if straggler:
                        self._release_slot()  # its slot was kept until now

            context._deadline = (time.monotonic() + context.timeout_ms / 1000 if context.timeout_ms > 0
                                 else float("inf"))
            threading.Thread(target=run_handler, name=f"ratchet-handler-{tool.ref}", daemon=True).start()
            beats = threading.Thread(target=self._heartbeats, args=(active,), name="ratchet-heartbeat", daemon=True)
            beats.start()
            self._watch(active, outcome)
            # The heartbeats end before the report is sent, as in Go and
            # TypeScript: one in flight is cut, not waited for (review: the
            # report went out while a heartbeat could still act on its answer).
            active.end_beats()
            beats.join()
            with self._lock:
                active.reporting = True
                if not outcome.get("returned"):
                    # The handler ignored its cancellation; whatever it
                    # returns later is dropped, and its slot stays taken
                    # until it does.
                    active.straggler = True
                    active.holds_slot = False  # released as its handler returns
                    self._stragglers += 1
            if active.straggler:
                # A timeout is recorded now (the job retries per its
                # policy); a stopping worker leaves the job unreported,
                # its lease lapses. A handler whose lease was lost
                # (on_error was told) or whose job the server cancelled (it
                # runs no more), before the stop or during its grace, is
                # left running with nothing to report or tell: stop()
                # answers False (QA: a lease lost during the grace was told
                # "the job runs again").
                if context.cancel_reason == "timeout":
                    self._report(context, {"status": "FAILED", "error": {
                        "message": f"handler timed out after {context.timeout_ms}ms", "retryable": True}})
                elif context.cancel_reason == "stopping" and not active.settled_elsewhere:
                    with self._lock:
                        self._left_unreported += 1
                        if not self._abandoned:  # else a second interrupt gave it up, and told it
                            # Its lease lapses and the job runs again
                            # elsewhere: on_error is told, naming the job, as
                            # Go's OnError and TypeScript's onError are (QA:
                            # only stop()'s False said so, and not which job
                            # would run again). Under the lock, and before
                            # the job leaves _active: queued before the
                            # on_error thread's end, so told before stop()
                            # or start() returns.
                            self._tell_given_up(active, _given_up(active, self._stop_grace))
                return
            self._report_outcome(tool, active, outcome)
        except BaseException as failure:  # noqa: BLE001 - a supervisor must not die silently
            self._notify(failure)
        finally:
            self._free_slot(active)
            with self._lock:
                self._active.pop((context.job_id, context.attempt), None)
                self._lock.notify_all()

    def _report_outcome(self, tool: _Tool, active: _Active, outcome: Dict[str, Any]) -> None:
        context = active.context
        error = outcome.get("error")
        reason = outcome.get("reason")
        if reason == "lease_lost":
            # A success is reported all the same unless the job ended: the
            # server records a lapsed attempt that no claim superseded, and
            # a newer claim answers lease_lost, which settles it. A failure
            # is not: the job runs again either way.
            if error is None and active.lost_code in (LEASE_LOST, ""):
                self._report_success(context, tool, outcome.get("output"))
            return
        if error is None:
            self._report_success(context, tool, outcome.get("output"))
            return
        try:
            message, retryable, hint = self._judge(tool, error, context, reason)
        except BaseException as failure:  # noqa: BLE001 - an error that fails when inspected
            self._notify(failure)
            message, retryable, hint = "handler failed with an error that could not be inspected", True, None
        report: Dict[str, Any] = {"message": message, "retryable": retryable}
        if hint is not None:
            report["retryAfterMs"] = hint
        self._report(context, {"status": "FAILED", "error": report})

    def _watch(self, active: _Active, outcome: Dict[str, Any]) -> None:
        """Waits for the handler, cancelling it at its timeout; once it is
        cancelled for its timeout or the worker's stop, waits at most the
        grace. A server's cancellation or a lost lease (set by the
        heartbeats) waits for the handler as before, until a stop's deadline
        or the call of a stop without one (then the grace, from the call or
        the loss, whichever came later)."""
        context = active.context
        grace_end: Optional[float] = None
        while not outcome.get("returned") and not active.given_up:
            now = time.monotonic()
            if grace_end is None and (active.stop_requested or (active.settled_elsewhere and self._undated)):
                grace_end = now + self._stop_grace
            until = min(grace_end if grace_end is not None else float("inf"),
                        context._deadline if not context.cancelled.is_set() else float("inf"))
            active.wake.wait(None if until == float("inf") else max(0.0, until - now))
            active.wake.clear()
            if outcome.get("returned") or active.given_up:
                return
            now = time.monotonic()
            if grace_end is not None and now >= grace_end:
                return
            if not context.cancelled.is_set() and now >= context._deadline:
                context._cancel("timeout")
                grace_end = now + _TIMEOUT_GRACE

    def _beat_pause(self, active: _Active, seconds: float) -> bool:
        """Waits seconds before the next heartbeat; True once the handler
        is done (a test seam)."""
        return active.beats_done.wait(seconds)

    def _heartbeats(self, active: _Active) -> None:
        """Extends the lease well before it lapses until the handler is
        done, and cancels the handler when the server asks or the lease is
        gone (a refusal, or its end passing by this process's clock while
        heartbeats fail, one at least tried since the lease was granted or
        last extended, as the Go and TypeScript workers do)."""
        context = active.context
        failed: Optional[BaseException] = None  # the last heartbeat's failure
        failures = 0  # heartbeats failed in a row
        tried = False  # a heartbeat was sent since the lease was granted or last extended
        while not self._beat_pause(active, _beat_wait(_beat_every(active.lease_end, context), failed, failures)):
            failed = None
            if time.monotonic() >= active.lease_end and tried:
                # Not before one heartbeat was tried, as do_effect tries one:
                # a lease measured from a long-polling claim's sending runs
                # from when the server answered it, up to wait_seconds later,
                # and may look lapsed before the handler starts (review: a
                # 1 s timeout's lease, 11 s, under wait_seconds 20, was
                # cancelled as lost a second in, never heartbeated, and its
                # job ran again).
                active.lost_code, active.settled_elsewhere = "", True
                context._cancel("lease_lost")
                active.wake.set()
                self._notify(LeaseLost(job_id=context.job_id, attempt=context.attempt,
                                       tool=f"{context.name}@{context.version}"))
                return
            sent, tried = time.monotonic(), True
            try:
                beat = self._transport.call("POST", "/jobs/" + path_id(context.job_id) + "/heartbeat",
                                            {"leaseToken": context._lease_token}, safe=True, max_retries=0,
                                            timeout=min(self._transport.timeout, _beat_cutoff(active.lease_end - sent)),
                                            abort=active.beats_cut)
            except RatchetError as err:
                if active.beats_done.is_set():
                    # The handler is done: its report, answered on its own,
                    # settles the attempt, and neither a refusal (a 401
                    # included: it no longer stops the worker) nor a failure
                    # of this heartbeat is acted on or told (the Go and
                    # TypeScript workers end the heartbeat as the handler
                    # returns; review: a 5xx was told to on_error).
                    return
                if err.status in (403, 404, 409) and not _not_ratchets(err):
                    # The lease is lost (a newer claim) or the job ended:
                    # nothing this attempt does will count. Not so a bare
                    # one (_not_ratchets: a proxy's answer during a deploy
                    # or a misroute), which says nothing of the lease and is
                    # tried again as a 5xx is, as in Go and TypeScript.
                    active.lost_code, active.settled_elsewhere = err.code, True
                    context._cancel("lease_lost")
                    active.wake.set()
                    self._notify(LeaseLost(job_id=context.job_id, attempt=context.attempt,
                                           tool=f"{context.name}@{context.version}", cause=err))
                    return
                if _key_refused(err):
                    # The key was revoked: the worker stops, as after a
                    # claim's 401, and this handler is told to with the others.
                    self._refuse(err)
                    return
                self._notify(err)
                failed, failures = err, failures + 1
                continue
            except ConnectionLost as err:
                if active.beats_done.is_set():
                    return  # the handler is done (above)
                self._notify(err)
                failed, failures = err, failures + 1
                continue
            failures, tried = 0, False
            if active.beats_done.is_set():
                return  # the handler is done (above)
            if beat.get("cancelRequested"):
                # The lease is not extended for a cancelled job.
                active.settled_elsewhere = True
                context._cancel("cancelled")
                active.wake.set()
                return
            active.lease_end = sent + active.lease_ms / 1000

    # -- deciding and reporting ---------------------------------------------

    def _judge(self, tool: _Tool, error: BaseException, context: JobContext,
               reason: Optional[str]) -> Tuple[str, bool, Optional[int]]:
        """Maps a failed attempt to the error the API is told; reason is why
        the handler was cancelled, if it was, when it returned. Order:
        server-requested cancellation; explicit SDK errors; timeout and
        worker stop; the tool's classifier; retryable by default."""
        if reason == "cancelled":
            return "cancelled at the server's request", False, None
        if isinstance(error, RetryableError):
            return (redact_message(_describe(getattr(error, "message", error))), True,
                    getattr(error, "retry_after_ms", None))
        if isinstance(error, NonRetryableError):
            return redact_message(_describe(getattr(error, "message", error))), False, None
        if reason == "timeout":
            return f"handler timed out after {context.timeout_ms}ms", True, None
        if reason == "stopping":
            return "worker stopped before the handler finished", True, None
        message = redact_message(f"{type(error).__name__}: {_describe(error)}")
        if tool.classify is None:
            return message, True, None
        try:
            decision = tool.classify(error, context)
        except BaseException as failure:  # noqa: BLE001 - a classifier failure falls back to retryable
            self._notify(failure)
            return message, True, None
        verdict = _read_decision(decision)
        if verdict is None:
            self._notify(InvalidDecisionError(tool.ref, decision))
            return message, True, None
        retryable, hint = verdict
        if hint is not None and not MIN_RETRY_AFTER_MS <= hint <= MAX_RETRY_AFTER_MS:
            self._notify(InvalidDecisionError(tool.ref, decision, clamped=True))
            hint = clamp_retry_after_ms(hint)
        return message, retryable, hint

    def _report_success(self, context: JobContext, tool: _Tool, output: Any) -> None:
        try:
            # Read by the server at any depth it takes (a deep output raised
            # RecursionError here and was reported as not JSON).
            size = len(_json.dumps(output, allow_nan=False).encode("utf-8"))
        except (TypeError, ValueError) as failure:
            self._notify(TypeError(f"ratchet: {tool.ref} returned an output that is not JSON "
                                   f"({type(failure).__name__}); reported as a non-retryable failure"))
            self._report(context, {"status": "FAILED", "error": {
                "message": "handler output is not JSON", "retryable": False}})
            return
        if size > MAX_OUTPUT_BYTES:
            # Over the server's request size limit: sending it could only be
            # refused (or cut off by a proxy), and the job would run again.
            refusal: Optional[RatchetError] = RatchetError(413, PAYLOAD_TOO_LARGE, "output too large")
        else:
            refusal = self._report(context, {"status": "SUCCEEDED", "output": output}, notify=False)
        if refusal is None:
            return
        why = _unrecordable_output(refusal)
        if why is None:
            self._lost(context, refusal)
            return
        # The server can never record this output (its size, or the tool's
        # contract): report the attempt failed for good instead.
        self._notify(ReportNotRecorded(f"ratchet: job {context.job_id} attempt {context.attempt}: the server "
                                       f"refuses the output ({refusal.code}); reporting it failed",
                                       job_id=context.job_id, attempt=context.attempt, what="output_refused",
                                       cause=refusal))
        self._report(context, {"status": "FAILED", "error": {"message": why, "retryable": False}})

    def _report(self, context: JobContext, body: Dict[str, Any], notify: bool = True) -> Optional[RatchetError]:
        """Sends a report, repeating it through lost answers and server
        failures until the server answers (once the worker is stopping, at
        most until its stop deadline and the grace), and counting it as
        failing meanwhile, so that no claim is made. Returns the refusal;
        None when recorded, or when it was given up (then already told to
        on_error)."""
        body = {"leaseToken": context._lease_token, **body}
        state = {"gave_up": False, "sent": 0.0}
        key = id(state)  # this report's key in _failing while it is

        def may_wait(wait: float) -> bool:
            with self._lock:
                state["gave_up"] = (self._stop_at is not None
                                    and time.monotonic() + wait > self._stop_at + 2 * self._stop_grace)
            return not state["gave_up"]

        def on_attempt() -> None:
            state["sent"] = time.monotonic()

        def on_retry() -> None:
            # After a failed delivery. The report fails on its own when the
            # server, after its first failure, recorded a report of a
            # delivery sent since, and this delivery, sent after that,
            # failed again: the server takes reports and refuses or chokes
            # on this one, which pausing the worker would not mend (not
            # even once its lease lapsed: one bad output stalled the
            # worker). When an outage ends, the first report recorded says
            # nothing of the others still waiting out their backoff (Go SDK
            # QA: taken as failing on their own, their jobs ran again).
            # Found failing on its own, it no longer holds the claims: the
            # claim loop is woken, not left to its next check (up to a
            # second late).
            with self._lock:
                since = self._failing.setdefault(key, time.monotonic())
                if (key not in self._own_failures and self._recorded_sent > since
                        and state["sent"] > self._recorded_at):
                    self._own_failures.add(key)
                    active = self._active.get((context.job_id, context.attempt))
                    if active is not None:
                        active.own_failure = True
                    self._lock.notify_all()

        try:
            with self._lock:
                holder = self._active.get((context.job_id, context.attempt))
            self._reporter.deliver(context.job_id, body, may_wait=may_wait, on_retry=on_retry, on_attempt=on_attempt,
                                   attempt=context.attempt,
                                   on_queued=(lambda: None) if holder is None else (lambda: self._free_slot(holder)))
            with self._lock:
                if state["sent"] > self._recorded_sent:
                    self._recorded_sent, self._recorded_at = state["sent"], time.monotonic()
            return None
        except RatchetError as err:
            if err.code == LEASE_LOST and err.detail.get("reportedOutcome") == body["status"]:
                return None  # an earlier send of this report landed
            if state["gave_up"]:
                self._lost(context, err)
                return None
            if notify:
                self._lost(context, err)
            return err
        except ConnectionLost as err:
            self._lost(context, err)
            return None
        finally:
            with self._lock:
                self._failing.pop(key, None)
                self._own_failures.discard(key)
                self._lock.notify_all()

    def _lost(self, context: JobContext, error: BaseException) -> None:
        detail = error.code if isinstance(error, RatchetError) else type(error).__name__
        notice = ReportNotRecorded(f"ratchet: the report of job {context.job_id} attempt {context.attempt} "
                                   f"was not recorded ({detail}); {_what_follows(error)}",
                                   job_id=context.job_id, attempt=context.attempt, cause=error)
        with self._lock:
            if not _settled_refusal(error):
                # A refusal that settles the job elsewhere (a newer attempt
                # holds it, say) loses nothing stop() answers for, as Go's Stop.
                self._lost_reports += 1
            if self._abandoned:
                return  # _abandon told it
            # Told here, not by _abandon, and under the lock, so that it is
            # told once and before the on_error thread's end is queued.
            active = self._active.get((context.job_id, context.attempt))
            if active is not None:
                active.told = True
            if not _key_refused(error):
                self._tell(notice)
                return
        self._refuse(error, notice)  # the key was revoked: the worker stops, as after a claim's 401

    # -- errors -------------------------------------------------------------

    def _notify(self, error: BaseException) -> None:
        with self._lock:
            # Once a second interrupt gave the stop up, what the worker's
            # threads still meet is not told: _abandon told each job left
            # once, and the on_error thread is ending. Under the lock, so
            # that nothing is queued after its end.
            if not self._abandoned:
                self._tell(error)

    def _tell(self, error: BaseException, key: Optional[Hashable] = None) -> None:
        """Queues error for on_error, or for the default failure log; of
        errors queued under one key, only the first is delivered."""
        if self._on_error is not None:
            self._errors.put(error, key)
            return
        self._log(lambda log, at: log.failure(error, at), key)

    def _recovered(self) -> None:
        """Tells the default failure log that a registration or claim
        succeeded (nothing with on_error)."""
        if self._on_error is not None:
            return
        self._log(lambda log, at: log.recovered())

    def _log(self, decide: Callable[[FailureLog, float], Optional[str]], key: Optional[Hashable] = None) -> None:
        """Queues a problem (or a recovery) for the default failure log, with
        the time it was told: the on_error thread decides its line (decide)
        as it takes it, so that a problem told twice under one key (a step
        cut by an interrupt after it told a job, and run again) is left out
        once, as on_error hears of it once, where the log decided here, as
        each was told, counted the second among those left out since its
        last line (one too many). Under the lock, so that the times go in
        the order they are queued."""
        with self._failure_log_lock:
            self._errors.put(_LogStep(decide, self._failure_log.now()), key)

    def _close_errors(self) -> None:
        """Ends the on_error thread once it has delivered the rest; without
        on_error, the default log first counts the problems it left out
        since its last line, if any (logged by that thread as it ends).
        Idempotent, whatever cuts it short: it only sets a flag (_Notices)."""
        self._errors.close()

    def _deliver_errors(self) -> None:
        while True:
            error = self._errors.take()
            try:
                if error is None:
                    if self._on_error is None:
                        with self._failure_log_lock:
                            line = self._failure_log.stopped()
                        if line is not None:
                            LOGGER.warning("%s", line)
                    return  # the worker is done
                if isinstance(error, _LogStep):
                    with self._failure_log_lock:
                        line = error.decide(self._failure_log, error.at)
                    if line is not None:
                        LOGGER.warning("%s", line)
                elif self._on_error is not None:
                    self._on_error(error)
            except BaseException:  # noqa: BLE001 - on_error's own failure has nowhere to go
                pass
            finally:
                self._errors.done(error is None)

    def _flush_errors(self) -> None:
        """Waits up to a second for on_error to be told what is queued (and,
        once the worker is done, for its thread to end)."""
        self._errors.flush(1.0)


@dataclass
class _LogStep:
    """A problem (or a recovery) waiting in the on_error queue for the
    default failure log, which its thread tells (decide, with at, the time
    it was told) and logs the line of, if any: a slow handler of the
    logging module holds up no work."""
    decide: Callable[[FailureLog, float], Optional[str]]
    at: float


class _Notices:
    """The on_error queue: what the worker tells on_error (or the default
    log), in order, for the on_error thread to deliver (take, then done).

    Built so that a KeyboardInterrupt that cuts a call short on the thread
    running start() or stop() leaves it whole, and the call made again
    (_despite_interrupts) does not do it twice, as a queue.Queue could not
    (review): put is one append (a single call into C, which no signal
    handler cuts), what is left to deliver is read from the items and the
    thread's state, never counted apart (a queue.Queue.put cut between
    adding an item and counting it left the count off), and close sets a
    flag where an end marker was queued (one queued again after a cut was
    never taken, and each flush after it waited its full second). Of items
    put under one key, the thread delivers the first only: a step that
    tells a job and is cut before it marks it told tells it again, and
    on_error hears of it once. A wake-up that a cut left unsent (the item
    is queued, the thread not yet woken) is made up by the next put or
    close; one of the close is made up by the thread itself, which looks at
    the flag every _NOTICES_CHECK seconds however long it waits, so that a
    close whose every run a signal storm cut before it woke the thread ends
    it all the same."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: Deque[Tuple[Union[BaseException, _LogStep], Optional[Hashable]]] = collections.deque()
        self._closed = False
        self._busy = False  # the thread is delivering an item (under _cond)
        self._ended = False  # the thread has ended (under _cond)
        self._keys: Set[Hashable] = set()  # the keys of the items taken (the thread's own)

    @property
    def unfinished_tasks(self) -> int:
        """Items queued or being delivered (queue.Queue's name)."""
        with self._cond:
            return len(self._items) + int(self._busy)

    def put(self, item: Union[BaseException, _LogStep], key: Optional[Hashable] = None) -> None:
        self._items.append((item, key))
        self._wake()

    def close(self) -> None:
        """The thread ends once it has delivered what is queued."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def take(self) -> Optional[Union[BaseException, _LogStep]]:
        """The next item to deliver, once there is one; None once closed
        with nothing left (the thread then ends)."""
        with self._cond:
            while True:
                while self._items:
                    item, key = self._items.popleft()
                    if key is not None:
                        if key in self._keys:
                            continue
                        self._keys.add(key)
                    self._busy = True
                    return item
                if self._closed:
                    self._busy = True  # until the thread has ended (done(True))
                    return None
                self._cond.wait(_NOTICES_CHECK)

    def done(self, ended: bool) -> None:
        """The item taken was delivered; ended: the thread ends."""
        with self._cond:
            self._busy = False
            self._ended = self._ended or ended
            self._cond.notify_all()

    def flush(self, seconds: float) -> None:
        """Waits up to seconds until everything queued was delivered, and
        once closed until the thread has ended."""
        with self._cond:
            self._cond.wait_for(lambda: self._ended or (not self._items and not self._busy and not self._closed),
                                seconds)


def _given_up(active: _Active, grace: Optional[float] = None) -> ReportNotRecorded:
    """What on_error is told of a job a stop gave up (under the worker's
    lock), naming it (never its input): a second interrupt's (grace None),
    its report not known to be recorded or its handler not yet returned; or
    one whose handler was still running when the stop grace (seconds)
    ended."""
    context = active.context
    what = (f"the report of job {context.job_id} attempt {context.attempt} was not known to be recorded"
            if active.reporting and grace is None else
            f"job {context.job_id} attempt {context.attempt} was left unreported, its handler still running")
    why = ("the worker, interrupted again while it stopped, gave it up" if grace is None
           else f"the stop grace ({grace:g} s) ended")
    return ReportNotRecorded(f"ratchet: {what} when {why}; the job runs again once its lease lapses",
                             job_id=context.job_id, attempt=context.attempt)


def _interrupted_again(error: Optional[BaseException], before: Optional[BaseException]) -> bool:
    """Whether error is a KeyboardInterrupt raised while another, raised
    since before (the exception being handled when the worker began, if
    any), was handled: a second Ctrl-C, its context the first (or an
    exception raised while the first was handled)."""
    if not isinstance(error, KeyboardInterrupt) or error is before:
        return False
    context = error.__context__
    while context is not None and context is not before:
        if isinstance(context, KeyboardInterrupt):
            return True
        context = context.__context__
    return False


def _despite_interrupts(*steps: Callable[[], None]) -> None:
    """Runs each of steps (idempotent) to its end in turn, even when a
    KeyboardInterrupt (another Ctrl-C) cuts one short: that step is run
    again, the rest after it, and the first interrupt is raised once the
    last is done. After _INTERRUPT_RERUNS runs cut short, the step is run
    once more holding SIGINT's handler off (_holding_sigint): a storm of
    signals that cut every run left the step undone (review), and cuts none
    of that run. That run is made again only when a signal lands in the few
    bytecodes around it where the handler is not held off, so the loop ends
    once signals stop arriving; a step that raises KeyboardInterrupt of its
    own (which looped for ever: review) is run 1 + _INTERRUPT_RERUNS times,
    then left as it is, the rest run all the same. Python runs a signal's
    handler between any two bytecodes, so one that lands between two steps,
    outside the try, still escapes; this narrows what it can cut short to
    those few bytecodes."""
    interrupt: Optional[KeyboardInterrupt] = None
    for step in steps:
        for _ in range(_INTERRUPT_RERUNS):
            try:
                step()
                break
            except KeyboardInterrupt as err:
                interrupt = interrupt or err
        else:
            while True:  # again only when a signal lands outside the held run
                try:
                    held = _holding_sigint(step)  # run it whatever was cut before
                    interrupt = interrupt or held
                    break
                except KeyboardInterrupt as err:
                    interrupt = interrupt or err
    if interrupt is not None:
        raise interrupt


def _holding_sigint(step: Callable[[], None]) -> Optional[KeyboardInterrupt]:
    """Runs step with SIGINT's Python handler held off: a SIGINT that comes
    meanwhile is handled (its handler called) once step is done. Answers
    the KeyboardInterrupt step raised of its own or that handler raised, if
    any, raised by neither: a step cut here is not run again. Raises a
    KeyboardInterrupt that lands before the handler is held off (the
    caller's loop counts it as another cut). Off the main thread, or when
    SIGINT has no Python handler, no signal can raise KeyboardInterrupt
    there, and step is run as it is. Blocking SIGINT with
    signal.pthread_sigmask would not do: the kernel hands the signal to
    another of the worker's threads, and Python still runs its handler on
    the main thread."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        return _interrupt_of(step)
    original: Callable[[int, Any], Any] = handler
    held: List[Tuple[int, Any]] = []
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    except ValueError:  # not the main interpreter: no signal handler runs here
        return _interrupt_of(step)
    try:
        interrupt = _interrupt_of(step)
    finally:
        signal.signal(signal.SIGINT, original)
    if held:
        signum, frame = held[0]
        interrupt = interrupt or _interrupt_of(lambda: original(signum, frame))
    return interrupt


def _interrupt_of(step: Callable[[], object]) -> Optional[KeyboardInterrupt]:
    """Runs step; answers the KeyboardInterrupt it raised, if any."""
    try:
        step()
    except KeyboardInterrupt as err:
        return err
    return None


def _jittered(seconds: float) -> float:
    return seconds * random.uniform(0.9, 1.1)


def _failure_wait(poll_interval: float, n: int, err: BaseException) -> float:
    """The wait after the nth failure in a row (from 1) of the worker's
    registration or claims, when the failure may pass (and of a job's
    heartbeats, from _MIN_HEARTBEAT: _beat_wait; the Go SDK's failureWait): poll_interval doubled n-1 times, at most
    _MAX_FAILURE_WAIT (or poll_interval when longer), half of it drawn at
    random so that a fleet of workers does not come back at once; and at
    least the server's Retry-After, within the same cap."""
    limit = max(poll_interval, _MAX_FAILURE_WAIT)
    step = poll_interval
    for _ in range(1, n):
        if step >= limit:
            break
        step *= 2
    step = min(step, limit)
    return max(step / 2 + random.random() * step / 2, _retry_after(err, limit))


def _retry_after(err: BaseException, limit: float) -> float:
    """err's Retry-After (detail.retry_after_seconds, or a 429's or 503's
    header) in seconds, up to limit, then lengthened by up to a fifth, drawn
    at random, as the transport's own retry of a 429 or a 503 is (the Go
    SDK's retryAfter): the workers of a fleet that the limiter (or a proxy's
    503) refused together were all told to come back at one instant, and
    came back together, most to be refused again; 0 when it has none."""
    if not isinstance(err, RatchetError):
        return 0.0
    return spread_retry_after(float(min(err.retry_after_seconds, limit)), random.random())


def _key_refused(err: BaseException) -> bool:
    """Whether a call's failure says the worker's key no longer works at all
    (the Go SDK's keyRefused): a 401 (the key was revoked, or never was
    valid), whichever call meets it first. A 403 on a heartbeat or a report
    is not: it is that job's alone (the key may not work its tool). Nor is a
    401 without Ratchet's error envelope (_not_ratchets)."""
    return isinstance(err, RatchetError) and err.status == 401 and not _not_ratchets(err)


def _not_ratchets(err: BaseException) -> bool:
    """Whether a failure is an answer that is not Ratchet's own (the Go SDK's
    notRatchets): an HTTP status without the API's error envelope (no error
    code), as a proxy, a load balancer or a platform answers during a deploy
    or a misroute (a bare 404, 408, 400, 401). It says nothing of the
    worker's key or claims, and passes as a 5xx does: it never stops the
    worker, which asks again after backoff."""
    return isinstance(err, RatchetError) and not err.code


def _worker_unknown(err: BaseException) -> bool:
    """Whether a claim's failure says the server no longer knows the worker
    id (it deletes registrations not seen for JOB_RETENTION_DAYS):
    registering again mends it, once."""
    return isinstance(err, RatchetError) and err.status == 404 and err.code == NOT_FOUND


def _beat_every(lease_end: float, context: JobContext) -> float:
    left = lease_end - time.monotonic()
    if context.timeout_ms > 0:
        left = min(left, context.timeout_ms / 1000)
    return min(max(left / 3, _MIN_HEARTBEAT), _MAX_HEARTBEAT)


def _beat_wait(every: float, failed: Optional[BaseException], failures: int) -> float:
    """The wait before the next heartbeat (the Go SDK's heartbeatWait):
    every (_beat_every) after one that worked; after the nth failure in a
    row _failure_wait's backoff from _MIN_HEARTBEAT, as after failed claims:
    1, 2, 4, 8 s... (doubled n-1 times), half of it drawn at random, so that
    the workers of a fleet do not all try again at the same marks after an
    outage, and at least the server's Retry-After (a 429's, a 503's, and up
    to a fifth of it more, drawn at random); either
    never past every, a third of the lease left, so that at least two more
    tries fit before it lapses (sdk QA: this SDK waited a third of the lease
    left at once, Go retried inside its client; the backoff had no
    jitter)."""
    if failed is None:
        return every
    return min(every, _failure_wait(_MIN_HEARTBEAT, failures, failed))


def _beat_cutoff(left: float) -> float:
    """How long one heartbeat may take (the Go SDK's heartbeatCutoff), left
    being the seconds the lease has to run by this process's clock: a third
    of it, at least _MIN_HEARTBEAT, within the client's timeout, so that a
    hung call leaves two thirds of the lease for the paced tries after it
    and never hides the lapse (sdk QA: this SDK cut it at 10 s, past the end
    of a short lease; Go let it run to the lease's end)."""
    return max(left / 3, _MIN_HEARTBEAT)


def _describe(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - an error whose __str__ fails still fails its job
        return "an error that could not be described"


def _read_decision(decision: Any) -> Optional[Tuple[bool, Optional[int]]]:
    """A classifier's decision as (retryable, hint), or None when invalid:
    not {"retryable": bool[, "retry_after_ms": number]}, or a hint with
    retryable False (the API never takes one). A fractional hint is rounded
    up to whole milliseconds (a hint is a minimum wait)."""
    if not isinstance(decision, dict) or not set(decision) <= {"retryable", "retry_after_ms"}:
        return None
    retryable = decision.get("retryable")
    hint = decision.get("retry_after_ms")
    if not isinstance(retryable, bool):
        return None
    if hint is None:
        return retryable, None
    if not retryable or isinstance(hint, bool) or not isinstance(hint, (int, float)):
        return None
    if isinstance(hint, int):
        return True, hint  # never NaN; one beyond a float's range is clamped like any other
    if math.isnan(hint):
        return None
    if math.isinf(hint):
        # Read as any huge hint is: the worker clamps it and says so
        # (review: refused, the job was retried at the policy's delay).
        return True, MAX_RETRY_AFTER_MS + 1 if hint > 0 else MIN_RETRY_AFTER_MS - 1
    return True, math.ceil(hint)


def _settled_refusal(error: BaseException) -> bool:
    """Whether a report's refusal is the server's last word on the job, so
    that nothing is lost by it (Go's settledRefusal): a newer claim holds
    the job, the job ended or has another outcome recorded, or it no longer
    exists. A job that ended because this attempt, its last, lapsed before
    the report got through is not settled by it: the outcome was lost."""
    if not isinstance(error, RatchetError):
        return False
    if error.code == INVALID_STATE:
        return error.detail.get("leaseLapsed") is not True
    return error.code in (LEASE_LOST, NOT_FOUND)


def _what_follows(error: BaseException) -> str:
    """What becomes of a job whose report was not recorded, by the refusal
    (Go's settledRefusal): only a refusal that does not settle the job
    leaves it to run again (QA: a lease_lost was told "its lease lapses and
    it runs again", though a newer attempt already held the job)."""
    if not isinstance(error, RatchetError):
        return "its lease lapses and it runs again"
    code = error.code
    if code == LEASE_LOST:
        return "a newer attempt holds the job"
    if code == INVALID_STATE and error.detail.get("leaseLapsed") is True:
        return "this attempt, the job's last, lapsed before it got through, which ended the job"
    if code == INVALID_STATE:
        return "the job already ended or has another outcome recorded"
    if code == NOT_FOUND:
        return "the job no longer exists"
    return "its lease lapses and it runs again"


def _unrecordable_output(err: RatchetError) -> Optional[str]:
    """What to report instead of a success whose output the server refused:
    413 for its size, or 400 naming a field under output (never the value),
    or the body, which only the output can make unreadable (nested more
    levels deep than the server reads). A bare 413 (no error envelope) is a
    proxy's body limit before the server (nginx refuses bodies over 1 MB by
    default), and a success report's body is its output (the Go SDK's
    unrecordableOutput; review: given up, the job ran again at every lapse)."""
    if err.status == 413 and not err.code:
        return "handler output exceeds the request size limit of a proxy before the server"
    if err.code == PAYLOAD_TOO_LARGE:
        return "handler output exceeds the server's request size limit"
    if err.code == INVALID_REQUEST:
        for item in err.validation:
            name = str(item.get("field", "")) if isinstance(item, dict) else ""
            if name in ("output", "body") or name.startswith("output."):
                return "handler output refused by the server at " + name
    return None

"""The client: producer calls, the effect gate, and the worker's registry."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import math
import threading
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from . import _json
from ._aio import await_alone, is_async, loop_running
from ._http import Abort, Transport, new_request_id, path_id
from ._secrets import hide_secrets
from ._time import aware, lease_seconds as _lease_seconds
from .errors import (INVALID_REQUEST, LEASE_LOST, PAYLOAD_TOO_LARGE, ApprovalRequired, ConnectionLost, EffectBlocked,
                     EffectDenied, EffectInFlight, NotPerformed, OutcomeNotReported, RatchetError, ResultNotStored)
from .types import (AfterStatus, ApiKey, ApiKeyPage, Approval, ApprovalPage, BatchJobResult, BeginResponse, Circuit,
                    CircuitPage,
                    ClaimedJob, Contract, ContractPage, ContractStatus, Effect, EffectHeartbeat, EffectPage, EffectPolicy,
                    EffectPolicyPage, EmergencyStop, Endpoint, EndpointAttemptPage, EndpointPage, EnqueueResult, Group,
                    GroupCommit, GroupStepPage, JobAttemptPage, JobHeartbeat, JobReplayPage, JobReportResult,
                    JobOutcome, JobStatus, NewApiKey,
                    NewWebhook, PriorAttempt, QueueHealthPage, Reconciliation, ReplayPreview, ReplayResult,
                    RetriedDeliveries, RetryPreset, RevokedApiKey,
                    Run, RunPage, RunStatus, Step, StepPage, Structuring, ToolTest, Unwind, Webhook,
                    WebhookDeliveryPage, WebhookPage)
from .worker import JobContext, Worker, batch_results

# The transport answers the JSON object a route returned, decoded but
# untyped: the casts below name the shape API.md gives that route's answer
# (types.py), which nothing checks at run time.

# Typed AfterStatus, so enqueue's after_status takes them under a type
# checker (a plain assignment reads as str).
AFTER_SUCCEEDED: AfterStatus = "SUCCEEDED"
AFTER_FAILED: AfterStatus = "FAILED"

# How often do_effect asks again while another caller holds the lease: from
# the first wait, doubling to the last (a begin that finds a live lease is
# one indexed read), never longer than the server's retry_after_seconds.
_FIRST_IN_FLIGHT_WAIT = 0.25
_MAX_IN_FLIGHT_WAIT = 5.0

# The "ratchet" field of the result recorded in place of one the gate refused.
_PLACEHOLDER_MARK = "result_not_recorded"
# The server refuses request bodies over 1 MiB (and results over 256 KiB).
_MAX_RESULT_BYTES = 1024 * 1024 - 1024
# How long do_effect keeps sending a report the server cannot take for now
# (as Go's DoEffect): the heartbeats keep the lease meanwhile, so without a
# bound a report route failing for good held the call, and the key's
# waiters, for ever.
_REPORT_TIMEOUT = 30.0
# How long before an effect lease's end (as last extended, by this
# process's clock) do_effect tells an action whose heartbeats have not
# extended it that the lease is lost: at most a quarter of the lease as
# granted, as the Go SDK's effectLeaseMargin (a lease of 2 s was given up
# a second early, half of it, where Go gives it up half a second early).
_EFFECT_LEASE_MARGIN = 1.0
# How long do_effect asks again for a begin whose answers were all lost,
# from its first failure (as Go's DoEffect).
_BEGIN_PATIENCE = 30.0


def create_ratchet(base_url: Optional[str] = None, api_key: str = "", **options: Any) -> "Ratchet":
    """Returns a Ratchet client (see Ratchet)."""
    return Ratchet(base_url=base_url, api_key=api_key, **options)


def blind_key(secret: str, key: str) -> str:
    """An idempotency key that is still deterministic but no longer
    guessable: HMAC-SHA-256 of key under a secret only your system holds,
    hex, 32 characters."""
    return hmac.new(secret.encode("utf-8"), key.encode("utf-8"), hashlib.sha256).hexdigest()[:32]


@dataclass(frozen=True)
class Lease:
    """What do_effect's action is given: the attempt it performs.

    With ``probe`` the holder must first check the vendor for
    ``prior_attempt`` (whose outcome is unknown) and return what it found,
    or perform the action. ``lost`` is set when the lease was lost (a newer
    attempt exists, or it lapsed): stop, the outcome will not be recorded.
    """
    effect_id: str
    attempt: int
    probe: bool
    prior_attempt: Optional[PriorAttempt]
    lease_expires_at: str
    lost: threading.Event


@dataclass(frozen=True)
class EffectOutcome:
    """do_effect's answer: the action's result, or with ``duplicate`` the
    result recorded by the attempt that performed it earlier."""
    effect_id: str
    attempt: int
    result: Any
    duplicate: bool


class Ratchet:
    """A client of the Ratchet API. Thread-safe.

    ``api_key`` is read from the environment or a secret store, never from
    source: an INGEST key to produce, a WORKER key listing its exact
    ``name@version`` tools to work, an AGENT key to use the gate.

    Calls that are idempotent (every gate and job call, by key, lease token
    or Idempotency-Key) are repeated after a lost answer or a 5xx, with
    capped backoff and jitter, up to ``max_retries`` times; a 429 after the
    server's retry_after_seconds; start_run and create_group without an
    idempotency key, update_effect_policy and update_endpoint_policy are
    never repeated after an ambiguous failure.

    Every method that calls the API (but do_effect and do_effect_async,
    protocols whose bounds are in_flight_timeout and the report's own) takes
    a keyword-only ``timeout`` (seconds), as a Go method takes a context: it
    bounds the whole call, its retries and the waits between them included,
    in place of the client's ``timeout``. An attempt it cuts raises
    ConnectionLost; a retry's wait that would end past it is not begun, and
    the call raises its last failure at once (a RatchetError whose
    ``may_have_applied`` says whether an earlier attempt may have acted).
    enqueue's and publish_contract's ``timeout_ms`` are the job's, not the
    call's.
    """

    def __init__(self, base_url: Optional[str] = None, api_key: str = "", *, timeout: float = 60.0,
                 max_retries: int = 3, user_agent: str = "") -> None:
        self._transport = Transport(base_url, api_key, timeout=timeout, max_retries=max_retries,
                                    user_agent=user_agent)
        self._lock = threading.Lock()
        self._run_id: Optional[str] = None
        self._worker: Optional[Worker] = None

    def close(self) -> None:
        """Closes the connections this client keeps alive between calls
        (stop its worker first). Calls made after it still work, each on a
        connection of its own; closing again does nothing."""
        self._transport.close()

    def __enter__(self) -> "Ratchet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- escape hatch -------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *, safe: bool = False,
                idempotency_key: Optional[str] = None, timeout: Optional[float] = None) -> Any:
        """Calls any route (path under /api/v1, e.g. "/endpoints") and
        returns the decoded answer; failures raise RatchetError. safe=True
        lets the call be repeated after a lost answer: only for calls that
        are idempotent. timeout (seconds) bounds the whole call, as every
        method's does (see the class)."""
        return self._transport.call(method, path, body, safe=safe, idempotency_key=idempotency_key,
                                    call_timeout=timeout)

    # -- producer -----------------------------------------------------------

    @property
    def run_id(self) -> Optional[str]:
        """The run start_run started, which enqueue and finish_run default to."""
        with self._lock:
            return self._run_id

    def start_run(self, name: str, *, idempotency_key: Optional[str] = None,
                  budget_micros: Optional[int] = None, timeout: Optional[float] = None) -> Run:
        """Starts a run (POST /runs) and makes it this client's current run.

        It is repeated after an ambiguous failure under an Idempotency-Key
        of its own, made once per call, so a retry after a lost answer is
        answered the run the first attempt started, never a second run.
        idempotency_key (derived from the work, as a Temporal workflow id)
        is the run's own key, sent in the body: starting it again, from this
        process or another, answers the same run (``deduplicated``)."""
        body: Dict[str, Any] = {"name": name}
        if idempotency_key is not None:
            body["idempotencyKey"] = idempotency_key
        if budget_micros is not None:
            body["budgetMicros"] = budget_micros
        run = cast(Run, self._keyed("/runs", body, None, timeout))
        with self._lock:
            self._run_id = run["id"]
        return run

    def _run(self, run_id: Optional[str]) -> str:
        run_id = run_id or self.run_id
        if not run_id:
            raise ValueError("ratchet: no run: call start_run first or pass run_id")
        return run_id

    def enqueue(self, input: Any, *, name: str, version: str, endpoint: Optional[str] = None,
                idempotency_key: Optional[str] = None, timeout_ms: Optional[int] = None,
                max_attempts: Optional[int] = None, contract_version: Optional[int] = None,
                after_step_id: Optional[str] = None, after_status: Optional[AfterStatus] = None,
                delay_ms: Optional[int] = None, run_id: Optional[str] = None, timeout: Optional[float] = None) -> EnqueueResult:
        """Adds a step to the run (POST /runs/{id}/steps): the exact handler
        name@version, its JSON input and options. Without idempotency_key
        the server derives one from the run, name, version, contract
        version, endpoint, dependency and canonical input, so an identical
        enqueue is deduplicated (``deduplicated`` in the answer); use an
        explicit key when producers in different languages must agree.
        Enqueue is idempotent either way, so it is retried."""
        if not name or not version:
            raise ValueError("ratchet: enqueue needs a tool name and version")
        body: Dict[str, Any] = {"name": name, "version": version, "input": input}
        optional = {"endpoint": endpoint, "idempotencyKey": idempotency_key, "timeoutMs": timeout_ms,
                    "maxAttempts": max_attempts, "contractVersion": contract_version,
                    "afterStepId": after_step_id, "afterStatus": after_status, "delayMs": delay_ms}
        body.update({k: v for k, v in optional.items() if v is not None})
        answer = self._transport.call("POST", "/runs/" + path_id(self._run(run_id)) + "/steps", body, safe=True,
                                      call_timeout=timeout)
        return cast(EnqueueResult, answer)

    def finish_run(self, run_id: Optional[str] = None, *, timeout: Optional[float] = None) -> Run:
        """Requests the run's completion: it ends SUCCEEDED once every step
        ended well, FAILED when one is EXHAUSTED or CANCELLED. Enqueue every
        branch before this."""
        answer = self._transport.call("POST", "/runs/" + path_id(self._run(run_id)) + "/finish", {}, safe=True,
                                      call_timeout=timeout)
        return cast(Run, answer)

    def get_run(self, run_id: Optional[str] = None, *, timeout: Optional[float] = None) -> Run:
        """Reads a run with its steps (each with ``durableJob``)."""
        answer = self._transport.call("GET", "/runs/" + path_id(self._run(run_id)), safe=True, call_timeout=timeout)
        return cast(Run, answer)

    def get_step(self, step_id: str, *, timeout: Optional[float] = None) -> Step:
        """Reads one step with its job's last 50 executions and last 50
        replays: ``durableJob.attemptsTruncated`` and ``replaysTruncated``
        say earlier ones are left out (list_step_attempts and
        list_step_replays page them all)."""
        answer = self._transport.call("GET", "/steps/" + path_id(step_id), safe=True, call_timeout=timeout)
        return cast(Step, answer)

    def list_step_attempts(self, step_id: str, *, limit: Optional[int] = None,
                           cursor: Optional[str] = None, timeout: Optional[float] = None) -> JobAttemptPage:
        """Pages every execution of a step's job in attempt order, where a
        step holds its last 50 (``attemptsTruncated``): {"data",
        "nextCursor"}. Pass nextCursor as cursor for the next page."""
        answer = self._transport.call("GET", "/steps/" + path_id(step_id) + "/attempts"
                                      + _query(limit=limit, cursor=cursor), safe=True, call_timeout=timeout)
        return cast(JobAttemptPage, answer)

    def list_step_replays(self, step_id: str, *, limit: Optional[int] = None,
                          cursor: Optional[str] = None, timeout: Optional[float] = None) -> JobReplayPage:
        """Pages every replay of a step's job oldest first, where a step
        holds its last 50 (``replaysTruncated``): {"data", "nextCursor"}."""
        answer = self._transport.call("GET", "/steps/" + path_id(step_id) + "/replays"
                                      + _query(limit=limit, cursor=cursor), safe=True, call_timeout=timeout)
        return cast(JobReplayPage, answer)

    def list_runs(self, *, status: Optional[RunStatus] = None, limit: Optional[int] = None,
                  cursor: Optional[str] = None, timeout: Optional[float] = None) -> RunPage:
        """Pages the workspace's runs newest first, without their steps
        (scope runs:read): {"data": [...], "nextCursor"}; status RUNNING,
        SUCCEEDED or FAILED. Pass nextCursor as cursor for the next page."""
        answer = self._transport.call("GET", "/runs" + _query(status=status, limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(RunPage, answer)

    def list_run_steps(self, run_id: Optional[str] = None, *, status: Optional[JobStatus] = None,
                       limit: Optional[int] = None, cursor: Optional[str] = None,
                       timeout: Optional[float] = None) -> StepPage:
        """Pages a run's steps in id order, each as get_step reads it, for
        runs larger than get_run's first steps (1000, or fewer where more would pass about 4 MB): {"data", "nextCursor"}."""
        answer = self._transport.call("GET", "/runs/" + path_id(self._run(run_id)) + "/steps"
                                      + _query(status=status, limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(StepPage, answer)

    def cancel_step(self, step_id: str, *, idempotency_key: Optional[str] = None,
                    timeout: Optional[float] = None) -> Step:
        """Cancels a step's job; a running handler learns of it at its next
        heartbeat. Retried under an Idempotency-Key of its own (or
        idempotency_key, the caller's), so a retry after a lost answer never
        cancels a replay of the step made since."""
        answer = self._keyed("/steps/" + path_id(step_id) + "/cancel", {}, idempotency_key, timeout)
        return cast(Step, answer)

    def replay_preview(self, step_id: str, *, timeout: Optional[float] = None) -> ReplayPreview:
        """Whether an exhausted or cancelled step may be replayed, and the
        contract versions it could be upgraded to (``upgrades``)."""
        answer = self._transport.call("GET", "/steps/" + path_id(step_id) + "/replay", safe=True, call_timeout=timeout)
        return cast(ReplayPreview, answer)

    def replay(self, step_id: str, *, reason: Optional[str] = None, max_attempts: int = 1,
               acknowledge_duplicate_risk: bool = True, target_contract_version: Optional[int] = None,
               expected_handler_version: Optional[str] = None, acknowledge_version_change: bool = False,
               expected_attempt: Optional[int] = None, timeout: Optional[float] = None) -> ReplayResult:
        """Queues an exhausted or cancelled step again (scope steps:replay).

        The previous worker may have completed a side effect whose result
        was never recorded: confirm destination-side idempotency first. For
        a version upgrade pass target_contract_version, the preview's
        handler version as expected_handler_version, and
        acknowledge_version_change=True. expected_attempt (the preview's
        ``attempt``) refuses a replay of a step that ran since. One
        Idempotency-Key spans the call's retries, so a repeat after a lost
        answer gets the first replay back instead of replaying twice."""
        if not acknowledge_duplicate_risk:
            raise ValueError("ratchet: a replay must acknowledge the duplicate risk")
        body: Dict[str, Any] = {"acknowledgeDuplicateRisk": True, "maxAttempts": max_attempts}
        optional = {"reason": reason, "targetContractVersion": target_contract_version,
                    "expectedHandlerVersion": expected_handler_version, "expectedAttempt": expected_attempt}
        body.update({k: v for k, v in optional.items() if v is not None})
        if acknowledge_version_change:
            body["acknowledgeVersionChange"] = True
        answer = self._transport.call("POST", "/steps/" + path_id(step_id) + "/replay", body, safe=True,
                                      idempotency_key=new_request_id(), call_timeout=timeout)
        return cast(ReplayResult, answer)

    # -- worker -------------------------------------------------------------

    def register_tool(self, name: str, version: str, handler: Callable[[Any, JobContext], Any], *,
                      classify_error: Optional[Callable[[BaseException, JobContext], Any]] = None) -> None:
        """Registers the handler for the exact tool name@version (the WORKER
        key must list it). handler(input, context) returns the output (JSON
        values); raise RetryableError or NonRetryableError to decide the
        retry, or let classify_error(error, context) decide for other
        exceptions ({"retryable": True, "retry_after_ms": ...} or
        {"retryable": False}); unknown errors are retryable. An async def
        handler is awaited on an event loop of its own, on its thread."""
        self.worker.add_tool(name, version, handler, classify_error)

    @property
    def worker(self) -> Worker:
        """This client's worker runtime: start(), stop()."""
        with self._lock:
            if self._worker is None:
                self._worker = Worker(self._transport)
            return self._worker

    # -- the effect gate ----------------------------------------------------

    def begin(self, effect_type: str, idempotency_key: str, payload: Any = None, *,
              cost_micros: Optional[int] = None, dimensions: Optional[Dict[str, Any]] = None,
              run_id: Optional[str] = None, group_id: Optional[str] = None,
              compensation: Optional[Dict[str, Any]] = None, compensates_effect_id: Optional[str] = None,
              lease_seconds: Optional[int] = None, request_id: Optional[str] = None,
              timeout: Optional[float] = None) -> BeginResponse:
        """Asks before acting (POST /effects/begin) and returns the answer:
        ``decision`` is execute, duplicate, in_flight, blocked,
        approval_required or denied (a denial is answered, not raised: its
        ``error`` holds the code). The key is derived from the work, never
        from time or randomness. A request_id (random when not given) spans
        the call's retries, so a begin whose answer was lost gets the same
        lease again instead of in_flight."""
        return cast(BeginResponse, self._begin(self._begin_body(
            effect_type, idempotency_key, payload, cost_micros=cost_micros, dimensions=dimensions, run_id=run_id,
            group_id=group_id, compensation=compensation, compensates_effect_id=compensates_effect_id,
            lease_seconds=lease_seconds, request_id=request_id), timeout)[0])

    @staticmethod
    def _begin_body(effect_type: str, idempotency_key: str, payload: Any, *, request_id: Optional[str] = None,
                    **options: Any) -> Dict[str, Any]:
        unknown = set(options) - {"cost_micros", "dimensions", "run_id", "group_id", "compensation",
                                  "compensates_effect_id", "lease_seconds"}
        if unknown:
            raise TypeError(f"ratchet: unknown begin option(s): {', '.join(sorted(unknown))}")
        body: Dict[str, Any] = {"effect_type": effect_type, "idempotency_key": idempotency_key, "payload": payload,
                      "request_id": request_id or new_request_id()}
        body.update({k: v for k, v in options.items() if v is not None})
        return body

    def _begin(self, body: Dict[str, Any], timeout: Optional[float] = None,
               retry_cutoff: Optional[Abort] = None) -> Tuple[Dict[str, Any], float, str]:
        """begin's answer; for an execute, the lease's length in seconds by
        the server's clock (its expiry less the answer's Date); for a
        denial, the answer's X-Request-Id (its body holds none).
        retry_cutoff, once fired, ends the waits between the transport's
        retries, never an attempt already sent."""
        try:
            answer, date = self._transport.call("POST", "/effects/begin", body, safe=True, with_date=True,
                                                call_timeout=timeout, retry_cutoff=retry_cutoff)
        except RatchetError as err:
            if err.status == 403 and isinstance(err.body, dict) and err.body.get("decision") == "denied":
                return err.body, 0.0, err.request_id
            raise
        return hide_secrets(answer), _lease_seconds(answer.get("lease_expires_at"), date), ""

    def report_effect(self, effect_id: str, lease_token: str, outcome: str, result: Any = None,
                      *, timeout: Optional[float] = None) -> Effect:
        """Reports an execute's outcome: "succeeded" with its result, or
        "failed" only when the action surely did not reach the outside
        world. Unsure? Report nothing: the lease lapses and the outcome is
        recorded honestly as indeterminate."""
        answer = self._transport.call("POST", "/effects/" + path_id(effect_id) + "/report",
                                      _effect_report(lease_token, outcome, result), safe=True, call_timeout=timeout)
        return cast(Effect, answer)

    def heartbeat_effect(self, effect_id: str, lease_token: str, *, timeout: Optional[float] = None) -> EffectHeartbeat:
        """Extends an execute's lease: {"effect_id", "lease_expires_at"}."""
        answer = self._transport.call("POST", "/effects/" + path_id(effect_id) + "/heartbeat",
                                      {"lease_token": lease_token}, safe=True, call_timeout=timeout)
        return cast(EffectHeartbeat, answer)

    def get_effect(self, effect_id: str, *, timeout: Optional[float] = None) -> Effect:
        """Reads an effect with its attempts."""
        answer = self._transport.call("GET", "/effects/" + path_id(effect_id), safe=True, call_timeout=timeout)
        return cast(Effect, answer)

    def resolve_effect(self, effect_id: str, outcome: str, result: Any = None, *, note: Optional[str] = None,
                       attempt: Optional[int] = None, timeout: Optional[float] = None) -> Effect:
        """Records what an operator found at the vendor for an indeterminate
        effect (scope effects:resolve) and unblocks its key: "succeeded"
        with the vendor's result, which a duplicate begin then answers, or
        "failed" (it did not happen). Repeating the same resolve answers the
        effect, so it is retried. attempt is the attempt verified (the
        effect's latest attempt whose outcome reads "indeterminate", as
        read): sent, the resolve applies only to it, and naming another is
        409 invalid_state (detail["unresolved_attempt"] names the one
        unknown now), so a retried resolve never settles a later attempt.
        Left None, the effect is read first (scope effects:read) and its
        latest attempt reading "indeterminate" is sent (none when no attempt
        does, or the key may not read effects)."""
        if outcome not in ("succeeded", "failed"):
            raise ValueError("ratchet: resolve_effect needs outcome 'succeeded' or 'failed'")
        body: Dict[str, Any] = {"outcome": outcome}
        if result is not None:
            body["result"] = result
        if note is not None:
            body["note"] = note
        if attempt is None:
            # The call is retried: without attempt, a repeat landing after
            # the resolve to failed freed the key, the key ran again and that
            # attempt lapsed would settle that unverified attempt (retry QA).
            # Name the attempt unknown now (none if the key may not read).
            try:
                attempt = _latest_unknown(self.get_effect(effect_id, timeout=timeout))
            except RatchetError as err:
                if err.code != "forbidden":
                    raise
        if attempt is not None:
            body["attempt"] = attempt
        answer = self._transport.call("POST", "/effects/" + path_id(effect_id) + "/resolve", body, safe=True,
                                      call_timeout=timeout)
        return cast(Effect, answer)

    def list_effects(self, *, state: Optional[str] = None, effect_type: Optional[str] = None,
                     limit: Optional[int] = None, cursor: Optional[str] = None,
                     timeout: Optional[float] = None) -> EffectPage:
        """Pages effects newest first (scope effects:read), results as
        redacted previews: {"data": [...], "next_cursor"}. state="indeterminate"
        lists those to verify at the vendor and resolve."""
        answer = self._transport.call("GET", "/effects" + _query(state=state, effect_type=effect_type, limit=limit,
                                                                 cursor=cursor), safe=True, call_timeout=timeout)
        return cast(EffectPage, answer)

    def do_effect(self, effect_type: str, idempotency_key: str, action: Callable[[Lease], Any],
                  payload: Any = None, *, in_flight_timeout: Optional[float] = None,
                  **begin_options: Any) -> EffectOutcome:
        """Wraps a side effect in the gate's protocol.

        execute: runs action(lease) under a heartbeated lease and reports
        "succeeded" with what it returns; if it raises NotPerformed the
        attempt is reported "failed" (it surely did not happen) and the
        exception re-raised; any other exception reports nothing (the lease
        lapses: an honest indeterminate) and is re-raised. duplicate: returns
        the recorded result without acting. A begin whose answers are all
        lost (network failures, a 5xx after which the server may have
        granted execute) is asked again under its request_id past the
        transport's retries, for up to 30 s from the first failure, so that
        a lease one of them granted is given back rather than left to lapse.
        in_flight: asks again (0.25 s
        doubling to 5 s, never past the server's retry_after_seconds) until
        in_flight_timeout seconds, then EffectInFlight. blocked,
        approval_required and denied raise EffectBlocked, ApprovalRequired
        and EffectDenied. An async action (an async def, or a plain function
        returning a coroutine) is awaited on an event loop of its own, as
        asyncio.run would; in a thread that runs an event loop use
        do_effect_async, which awaits it on that loop: there an async def is
        refused before begin, and a coroutine a plain function returns is
        closed unawaited with nothing reported (the plain function may have
        acted before returning it, so the attempt is left to lapse
        indeterminate, never reported failed), and TypeError raised. A
        generator function is refused before begin (a generator a plain
        action returns is its result, not JSON). begin_options are begin's
        keyword options. A request_id of yours (one is made per call) must
        never be reused once an action may have run under its lease (a
        do_effect that returned, a process that crashed mid-action): while
        that lease is live its begin is handed the same execute, and the
        action runs twice."""
        _check_action(action, "do_effect", loop_running())
        begin_options.setdefault("request_id", new_request_id())
        decided = self._lease_or_answer(effect_type, idempotency_key, payload, in_flight_timeout, begin_options)
        if isinstance(decided, EffectOutcome):
            return decided
        held = self._hold(*decided)
        try:
            try:
                result = action(held.lease)
                if inspect.isawaitable(result):
                    # An async action wrapped in a plain one (a lambda, a
                    # decorator). It used to be reported failed as never
                    # run, but the plain part may have acted: the attempt
                    # ran again at the key's next begin (SDK review).
                    result = await_alone(result, "do_effect's action (use do_effect_async in async code)")
            except NotPerformed as not_performed:
                self._report_not_performed(held, not_performed)
                raise
            return self._record(held, result)
        finally:
            # Not joined: a heartbeat still in flight ends on its own (a
            # reported lease answers it 409), and must not hold the answer.
            held.stop.set()

    async def do_effect_async(self, effect_type: str, idempotency_key: str, action: Callable[[Lease], Any],
                              payload: Any = None, *, in_flight_timeout: Optional[float] = None,
                              **begin_options: Any) -> EffectOutcome:
        """do_effect for asyncio code: the action (an async def, or a plain
        function, whose awaitable result is awaited) runs on the calling
        event loop; each begin and the report run on threads
        (asyncio.to_thread), so the loop is never blocked, and the in-flight
        waits on the loop (asyncio.sleep), so that callers waiting for a
        holder never take the threads its report needs. Outcomes and
        exceptions are do_effect's. Cancelled while the action runs,
        nothing is reported (it may have acted: the lease lapses,
        indeterminate); cancelled before it was called, the begin already
        sent is awaited but not retried, and a lease granted meanwhile is
        reported failed (the action surely did not run)."""
        _check_action(action, "do_effect_async", False)
        begin_options.setdefault("request_id", new_request_id())
        asking = _Asking(in_flight_timeout)
        while True:
            handed = _Handover()
            try:
                decided = await asyncio.to_thread(self._decide, effect_type, idempotency_key, payload,
                                                  begin_options, asking, handed)
            except asyncio.CancelledError:
                unclaimed = handed.abandon()
                if unclaimed is not None:
                    # The lease came back as the task was cancelled: the action
                    # never ran, so the attempt is released for the next caller.
                    threading.Thread(target=self._release_unrun, args=unclaimed,
                                     name="ratchet-effect-release", daemon=True).start()
                raise
            if not isinstance(decided, _InFlight):
                break
            # Waited on the loop, not on the thread: the default executor's
            # few threads (min(32, CPUs + 4)) each held by a caller waiting
            # out in_flight left none for the holder's report, in this same
            # process, whose lease its heartbeats kept live: every one of
            # them waited for ever (sdk QA).
            await asyncio.sleep(decided.pause)
        if isinstance(decided, EffectOutcome):
            return decided
        held = self._hold(*decided)
        settling = False
        try:
            try:
                result = action(held.lease)
                if inspect.isawaitable(result):
                    result = await result
            except NotPerformed as not_performed:
                settling = True
                await asyncio.to_thread(self._settled, held, self._report_not_performed, held, not_performed)
                raise
            settling = True
            return await asyncio.to_thread(self._settled, held, self._record, held, result)
        finally:
            if not settling:
                held.stop.set()

    def _lease_or_answer(self, effect_type: str, idempotency_key: str, payload: Any,
                         in_flight_timeout: Optional[float], begin_options: Dict[str, Any]) -> Any:
        """Begins until the gate decides: (answer, lease_end) for an
        execute, an EffectOutcome for a duplicate; raises for the others.
        in_flight is waited out on this thread."""
        asking = _Asking(in_flight_timeout)
        while True:
            decided = self._decide(effect_type, idempotency_key, payload, begin_options, asking)
            if not isinstance(decided, _InFlight):
                return decided
            time.sleep(decided.pause)

    def _decide(self, effect_type: str, idempotency_key: str, payload: Any, begin_options: Dict[str, Any],
                asking: "_Asking", handed: Optional["_Handover"] = None) -> Any:
        """One begin (with its retries, _begin_answered) and what it
        decided: (answer, lease_end) for an execute, an EffectOutcome for a
        duplicate, an _InFlight naming the pause before asking again; raises
        for the others, and EffectInFlight once asking's time is up. handed,
        for do_effect_async, keeps a lease granted after its task was
        cancelled from being lost unreported (None is then answered)."""
        sent = time.monotonic()
        answer, lease_seconds, request_id = self._begin_answered(
            self._begin_body(effect_type, idempotency_key, payload, **begin_options), handed)
        decision = answer.get("decision")
        effect_id = answer.get("effect_id", "")
        if decision == "execute":
            leased = (answer, sent + lease_seconds)
            if handed is not None and not handed.give(leased):
                self._release_unrun(*leased)  # its task was cancelled meanwhile: the action never runs
                return None
            return leased
        if decision == "duplicate":
            recorded = answer.get("result")
            reason = _placeholder_reason(recorded)
            if reason is not None:
                # The attempt that acted could not record its result.
                raise ResultNotStored(effect_id, reason, None)
            return EffectOutcome(effect_id, answer.get("attempt", 0), recorded, True)
        if decision == "in_flight":
            pause = min(asking.wait, max(answer.get("retry_after_seconds") or 1, 1))
            asking.wait = min(2 * asking.wait, _MAX_IN_FLIGHT_WAIT)
            if asking.give_up is not None:
                # The last pause ends at the timeout, which asks once
                # more (QA: a pause that would pass it gave up at once,
                # up to 5 s early, with the holder about to report).
                left = asking.give_up - time.monotonic()
                if left <= 0:
                    raise EffectInFlight(effect_id)
                pause = min(pause, left)
            return _InFlight(pause)
        if decision == "blocked":
            raise EffectBlocked(effect_id, answer.get("prior_attempt"))
        if decision == "approval_required":
            raise ApprovalRequired(effect_id, answer.get("approval_id", ""))
        if decision == "denied":
            error = answer.get("error") or {}
            raise EffectDenied(effect_id, RatchetError(403, str(error.get("code", "")),
                                                       str(error.get("message", "")),
                                                       error.get("detail") or {}, request_id, answer))
        raise RatchetError(200, "unknown_decision", f"unknown begin decision {decision!r}")

    def _begin_answered(self, body: Dict[str, Any],
                        handed: Optional["_Handover"] = None) -> Tuple[Dict[str, Any], float, str]:
        """_begin, asked again under the same request_id past the
        transport's retries while every answer was lost (a network failure,
        a 5xx after which the server may have granted execute: a database
        failover, an ended connection), for up to _BEGIN_PATIENCE from the
        first failure: a lease one of them granted is given back to the
        repeat while it is live. Given up after the transport's retries, the
        lease lapsed held by nobody, and the key turned indeterminate
        (blocked under the default policy) though the action never ran
        (chaos QA). A failure that surely granted nothing (not_applied, a
        refusal) is raised at once."""
        give_up: Optional[float] = None
        attempt = 0
        while True:
            try:
                # A cancelled task's begin sends no retry either, as Go's
                # sentRunsOn and TypeScript's signal (sdk QA: the retries went
                # on through max_retries, and an execute one brought was
                # only released, spending one of the key's attempts).
                return self._begin(body, retry_cutoff=None if handed is None else handed.cutoff)
            except RatchetError as err:
                if attempt > 0:
                    err._unconfirmed = True  # an earlier call's answers were lost
                if not err.may_have_applied:
                    raise
                wait = self._transport.retry_delay(err, attempt, True)
                if wait is None:
                    raise
                failure: Exception = err
            except ConnectionLost as err:
                wait, failure = self._transport.backoff(attempt), err
            if give_up is None:
                give_up = time.monotonic() + _BEGIN_PATIENCE
            if time.monotonic() + wait >= give_up:
                raise failure
            attempt += 1
            if handed is None:
                self._transport.sleep(wait)
            elif handed.abandoned.wait(wait):
                raise failure  # its task was cancelled: nobody waits for the answer

    def _hold(self, answer: Dict[str, Any], lease_end: float) -> "_Held":
        """The execute's lease, heartbeated from now until its stop is set."""
        effect_id, token = answer["effect_id"], answer["lease_token"]
        lost = threading.Event()
        lease = Lease(effect_id, answer.get("attempt", 0), bool(answer.get("probe")),
                      answer.get("prior_attempt"), answer.get("lease_expires_at", ""), lost)
        # The heartbeats run until the outcome is reported, not only while
        # the action runs: a report retried through a server blip must still
        # find the lease. lease_end is this process's clock's view of the
        # lease's end, as last extended.
        held = _Held(effect_id, token, lease, {"end": lease_end}, threading.Event())
        threading.Thread(target=self._heartbeat_effect, args=(effect_id, token, held.state, held.stop, lost),
                         name="ratchet-effect-heartbeat", daemon=True).start()
        return held

    @staticmethod
    def _settled(held: "_Held", settle: Callable[..., Any], *args: Any) -> Any:
        """settle(*args), the heartbeats kept until it is done (a report in
        a thread outlives a cancelled do_effect_async)."""
        try:
            return settle(*args)
        finally:
            held.stop.set()

    def _report_not_performed(self, held: "_Held", not_performed: NotPerformed) -> None:
        """Reports the attempt failed: the action said it surely did not act."""
        try:
            self._report_effect(held.effect_id, held.token, "failed", None, held.state)
        except (RatchetError, ConnectionLost) as err:
            # Raised all the same, with why its failure may not be
            # recorded (the lease then lapses: indeterminate).
            not_performed.report_error = err

    def _release_unrun(self, answer: Dict[str, Any], lease_end: float) -> None:
        """Reports failed a lease whose action was never called (its
        do_effect_async was cancelled as the lease came back)."""
        try:
            self._report_effect(answer["effect_id"], answer["lease_token"], "failed", None, {"end": lease_end})
        except (RatchetError, ConnectionLost):
            pass  # not recorded: the lease lapses, indeterminate

    def _record(self, held: "_Held", result: Any) -> EffectOutcome:
        """Reports the action's result a success (or, when it cannot be
        kept, the success with the placeholder and ResultNotStored)."""
        effect_id, token, state = held.effect_id, held.token, held.state
        reason = _unsendable_result(result)
        if reason is None:
            try:
                self._report_effect(effect_id, token, "succeeded", result, state)
                return EffectOutcome(effect_id, held.lease.attempt, result, False)
            except RatchetError as err:
                reason = _unrecordable_result(err)
                if reason is None:
                    raise OutcomeNotReported(effect_id, result, err) from err
            except ConnectionLost as err:
                raise OutcomeNotReported(effect_id, result, err) from err
        # The action happened; only its result cannot be kept. Recording
        # the success without it settles the key: left unreported it
        # would turn indeterminate.
        try:
            self._report_effect(effect_id, token, "succeeded",
                                {"ratchet": _PLACEHOLDER_MARK, "reason": reason}, state)
        except (RatchetError, ConnectionLost) as err:
            raise OutcomeNotReported(effect_id, result, err) from err
        raise ResultNotStored(effect_id, reason, result)

    def _report_effect(self, effect_id: str, token: str, outcome: str, result: Any, state: Dict[str, float]) -> None:
        """Reports, repeating through lost answers and server failures while
        the lease stands (the heartbeats keep it), for at most _REPORT_TIMEOUT."""
        give_up = time.monotonic() + _REPORT_TIMEOUT
        try:
            # Each attempt within the give-up time too (review: one that hung
            # took the transport's 60 s, where Go's is cut at its 30 s).
            self._transport.call_until("POST", "/effects/" + path_id(effect_id) + "/report",
                                       _effect_report(token, outcome, result),
                                       may_wait=lambda wait: time.monotonic() + wait < min(state["end"], give_up),
                                       timeout=min(self._transport.timeout, _REPORT_TIMEOUT),
                                       # A bare 4xx (a proxy's during a deploy) says nothing of the
                                       # report, as for a job's (sdk QA: given up at once, the lease
                                       # lapsed and the performed action read indeterminate); a bare
                                       # 413 is a body refused for good (_unrecordable_result).
                                       bare_may_pass=True)
        except RatchetError as err:
            # An earlier send of this report landed (its answer was lost) and
            # a newer attempt began before the retry: lease_lost names the
            # outcome it recorded (QA: said not recorded), as Go's reads it.
            if err.code == LEASE_LOST and err.detail.get("reported_outcome") == outcome:
                return
            raise

    def _heartbeat_effect(self, effect_id: str, token: str, state: Dict[str, float],
                          stop: threading.Event, lost: threading.Event) -> None:
        # Paced at a third of the lease left, within 1 s to 1 min; the
        # action is told the lease is lost on a refusal, or a second (at most
        # a quarter of the lease as granted: _EFFECT_LEASE_MARGIN) before
        # its end by this process's clock when heartbeats keep failing. A
        # heartbeat is always tried before the lease is given up (as Go's):
        # a lease of 3 s or less was given up unbeaten, and lapsed under an
        # action still running (sdk QA).
        tried = False  # a heartbeat was sent since the lease was last extended
        extended = False  # a heartbeat has extended the lease
        margin = max(min(_EFFECT_LEASE_MARGIN, (state["end"] - time.monotonic()) / 4), 0.0)
        while True:
            left = state["end"] - time.monotonic()
            pause = min(max(left / 3, 1.0), 60.0, max(left - margin, 0.0))
            if extended and not tried:
                pause = max(pause, 1.0)  # just extended: not a beat in a loop on a short estimate
            if stop.wait(pause):
                return
            if tried and time.monotonic() >= state["end"] - margin:
                lost.set()
                return
            # The first try since the lease was extended gets its second
            # even past the point the action must be told.
            floor = 0.1 if tried else 1.0
            tried = True
            sent = time.monotonic()
            try:
                # No retries inside the call (a 429's wait could outlast the
                # lease): this loop beats again, and watches the lease's end.
                # Nor may a hung heartbeat outlast the moment the action must
                # be told (QA: with 10 s, one unanswered beat told it long
                # after the lease lapsed and another caller could act).
                beat, date = self._transport.call("POST", "/effects/" + path_id(effect_id) + "/heartbeat",
                                                  {"lease_token": token}, safe=True, max_retries=0, with_date=True,
                                                  timeout=min(self._transport.timeout, 10.0,
                                                              max(state["end"] - margin - sent, floor)))
            except RatchetError as err:
                if err.status in (404, 409) and err.code:
                    lost.set()
                    return
                # A server failure, or a bare 4xx without Ratchet's error
                # envelope (a proxy's, a load balancer's or a platform's
                # answer during a deploy or a misroute), which says nothing
                # of the lease, as the worker reads a job's heartbeat (sdk
                # QA: a bare 404 told the action its lease was lost and
                # ended the heartbeats, so the lease then lapsed for real):
                # the next beat tries again.
                continue
            except ConnectionLost:
                continue
            seconds = _lease_seconds(beat.get("lease_expires_at"), date)
            if seconds > 0:
                state["end"] = sent + seconds
            tried, extended = False, True


    # -- operator calls -----------------------------------------------------
    #
    # Thin methods over the operator routes, as the Go SDK's (names and which
    # are repeated after a lost answer). Answers are the API's JSON as plain
    # dicts, annotated with their TypedDicts (getratchet.types).
    #
    # -- worker, low level (jobs:work) ------------------------------------
    # The routes the worker runtime (``worker()``) calls, for a loop of your
    # own, as the Go SDK's RegisterWorker, ClaimKeyed, HeartbeatJob,
    # ReportJob and ReportJobs. Most code uses the worker.

    def register_worker(self, tools: List[Any], *, idempotency_key: Optional[str] = None,
                        timeout: Optional[float] = None) -> str:
        """Registers a worker for the exact tools it serves ((name, version)
        pairs or {"name", "version"}; a WORKER key must list each
        name@version) and returns its ``workerId``, bound to this key. One
        Idempotency-Key (idempotency_key, or a fresh one) spans the retries,
        so a repeat after a lost answer gets the first worker id."""
        refs = []
        for tool in tools:
            name, version = (tool["name"], tool["version"]) if isinstance(tool, dict) else tool
            refs.append({"name": name, "version": version})
        answer = self._keyed("/workers/register", {"tools": refs}, idempotency_key, timeout)
        return cast(str, answer["workerId"])  # API.md: the worker's id, a string

    def claim(self, worker_id: str, *, limit: int = 1, wait_seconds: int = 0,
              claim_id: Optional[str] = None, timeout: Optional[float] = None) -> List[ClaimedJob]:
        """Leases up to limit (1-100) due jobs for worker_id, waiting up to
        wait_seconds (0-20) for one, and returns them (each with ``jobId``,
        ``leaseToken``, ``leaseExpiresAt``, ``leaseMs``, ``attempt``,
        ``maxAttempts``, ``idempotencyKey``, ``input``...). claim_id (1-64
        characters of A-Z a-z 0-9 . _ : -; a fresh one when None) spans the
        retries: a call whose answer may have been lost
        (``may_have_applied``, ConnectionLost) can be made again with it, and
        the server answers the jobs the first call leased, with the same
        lease tokens, instead of leaving them leased to nobody. The call's
        timeout is at least wait_seconds plus 10 s; a timeout= of yours
        replaces it (one shorter than wait_seconds cuts the wait)."""
        body = {"limit": limit, "waitSeconds": wait_seconds, "claimId": claim_id or new_request_id()}
        answer = self._transport.call("POST", "/workers/" + path_id(worker_id) + "/claim", body, safe=True,
                                      timeout=max(self._transport.timeout, wait_seconds + 10.0), call_timeout=timeout)
        return [hide_secrets(job) for job in answer.get("jobs") or []]

    def heartbeat_job(self, job_id: str, lease_token: str, *, timeout: Optional[float] = None) -> JobHeartbeat:
        """Extends a job's lease by its length from now: {"leaseExpiresAt",
        "cancelRequested"} (stop working on it when true). A superseded
        token raises 409 lease_lost."""
        answer = self._transport.call("POST", "/jobs/" + path_id(job_id) + "/heartbeat",
                                      {"leaseToken": lease_token}, safe=True, call_timeout=timeout)
        return cast(JobHeartbeat, answer)

    def report_job(self, job_id: str, lease_token: str, status: str, *, output: Any = None,
                   error: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None) -> JobReportResult:
        """Records an attempt's outcome: status "SUCCEEDED" with its JSON
        output, or "FAILED" with error {"message", "retryable",
        "retryAfterMs"} (retryAfterMs 1000-86400000, only when retryable;
        keep the message short and free of secrets). Answers {"jobId",
        "status", "attempt", "nextDueAt"}. The same report with the same
        token answers the same, so it is repeated after a lost answer."""
        answer = self._transport.call("POST", "/jobs/" + path_id(job_id) + "/report",
                                      _job_report(lease_token, status, output, error), safe=True, call_timeout=timeout)
        return cast(JobReportResult, answer)

    def report_jobs(self, reports: List[Dict[str, Any]], *, timeout: Optional[float] = None) -> List[BatchJobResult]:
        """Records several outcomes in one call (1-100, one commit): each
        report {"job_id", "lease_token", "status", "output", "error"} as
        report_job's, fenced by its own token. Answers one result per
        report, in order: {"jobId", "status", "attempt", "nextDueAt",
        "error"}, where ``error`` is None or the RatchetError the single
        report would have raised (409 lease_lost...; its request_id the
        batch response's); one report's error never affects the others.
        Repeated after a lost answer, as report_job; an answer whose
        results do not name the reports' jobs in their order is one."""
        body = {"reports": [{"jobId": r["job_id"], **_job_report(r["lease_token"], r["status"], r.get("output"),
                                                                 r.get("error"))} for r in reports]}
        job_ids = [r["job_id"] for r in reports]
        answer = self._transport.call("POST", "/jobs/report", body, safe=True, call_timeout=timeout,
                                      read=lambda answer, request_id: batch_results(answer, job_ids, request_id))
        return [cast(BatchJobResult, {**result, "error": error}) for result, error in answer]

    # list methods answer one page: {"data", "next_cursor"} on the gate's
    # routes, {"data", "nextCursor"} on the job routes; pass that cursor as
    # cursor for the next page. Creates the server keys (keys, webhooks,
    # contracts, tool tests, delivery retries, secret rotations, reconcile,
    # and a run's start and a group's open, whatever their body key) send one Idempotency-Key across their retries, so a retry after a lost
    # answer gets what the first attempt made instead of a second one.

    def _keyed(self, path: str, body: Any, idempotency_key: Optional[str], timeout: Optional[float] = None,
               method: str = "POST") -> Any:
        """POST path (or method) under an Idempotency-Key (the caller's or a
        fresh one) that spans the call's retries, within timeout when given.
        The actions whose repeat would undo another actor's change made
        since (a breaker's open or close, the emergency stop and its
        release, a step's cancel, an endpoint's pause, resume or circuit
        close, a webhook's update, a policy update) go through here too,
        under the caller's key or a fresh one: a
        retry after a lost answer is then answered the first answer, where
        a close retried after the breaker tripped again closed the new trip
        and a cancel retried after a replay cancelled the replay."""
        return self._transport.call(method, path, body, safe=True,
                                    idempotency_key=idempotency_key or new_request_id(), call_timeout=timeout)

    # policies (policies:read, policies:write)

    def list_effect_policies(self, *, limit: Optional[int] = None, cursor: Optional[str] = None,
                             timeout: Optional[float] = None) -> EffectPolicyPage:
        """Pages the workspace's configured effect-type policies:
        {"data", "next_cursor"}."""
        answer = self._transport.call("GET", "/policies" + _query(limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(EffectPolicyPage, answer)

    def get_effect_policy(self, effect_type: str, *, timeout: Optional[float] = None) -> EffectPolicy:
        """Reads effect_type's policy; an unconfigured type reads as the safe
        default, version 0. Its last_reconciled_at (read-only) is when the
        type was last reconciled, None before the first."""
        answer = self._transport.call("GET", "/policies/" + path_id(effect_type), safe=True, call_timeout=timeout)
        return cast(EffectPolicy, answer)

    def get_policy_structuring(self, effect_type: str, *, timeout: Optional[float] = None) -> Structuring:
        """How closely the costs declared for effect_type over the last 24
        hours and 7 days crowd its watch line (structuring_threshold_micros,
        else max_cost_micros): {"effect_type", "threshold_micros",
        "threshold_from", "as_of", "windows": [{"hours", "declared",
        "below_80_percent", "from_80_to_90_percent",
        "from_90_to_100_percent", "at_or_above", "share_just_below"}]}. A
        measure, never enforced."""
        answer = self._transport.call("GET", "/policies/" + path_id(effect_type) + "/structuring", safe=True,
                                      call_timeout=timeout)
        return cast(Structuring, answer)

    def update_effect_policy(self, effect_type: str, update: Optional[Dict[str, Any]] = None, *,
                             expected_version: Optional[int] = None, idempotency_key: Optional[str] = None,
                             timeout: Optional[float] = None, **fields: Any) -> EffectPolicy:
        """Merges the fields of update and the keyword fields (the API's
        snake_case names: mode, max_cost_micros, ...; None clears a nullable
        one, fields left out keep their values; a list or map sent,
        required_dimensions or dimension_limits, replaces the stored one
        whole: a dimension left out of dimension_limits loses its limit)
        into effect_type's policy and returns it. With expected_version it
        merges only while that is still the policy's version (0 for a type
        on the safe default; otherwise RatchetError code version_conflict:
        read it again and decide again). Retried under an Idempotency-Key of its own (or
        idempotency_key, the caller's), so a retry after a lost answer is
        answered the first answer and never writes over another operator's
        update made since. A dimension limit (dimension_limits={"recipient":
        {"daily_count": 3}}) may leave out (or set None) either of
        daily_micros and daily_count, not both, as the server takes it."""
        body = _fields(update, fields)
        if expected_version is not None:
            body["expected_version"] = expected_version
        answer = self._keyed("/policies/" + path_id(effect_type), body, idempotency_key, timeout, method="PUT")
        return cast(EffectPolicy, answer)

    # approvals (approvals:write)

    def list_approvals(self, *, state: Optional[str] = None, limit: Optional[int] = None,
                       cursor: Optional[str] = None, timeout: Optional[float] = None) -> ApprovalPage:
        """Pages the approvals newest first, state "pending", "approved" or
        "rejected" (None: every state): {"data", "next_cursor"}."""
        answer = self._transport.call("GET", "/approvals" + _query(state=state, limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(ApprovalPage, answer)

    def get_approval(self, approval_id: str, *, timeout: Optional[float] = None) -> Approval:
        """Reads one approval (ApprovalRequired.approval_id names it)."""
        answer = self._transport.call("GET", "/approvals/" + path_id(approval_id), safe=True, call_timeout=timeout)
        return cast(Approval, answer)

    def approve(self, approval_id: str, *, note: Optional[str] = None, timeout: Optional[float] = None) -> Approval:
        """Approves a pending effect: the next begin of its key executes.
        Approving an approved one answers it unchanged, so it is retried;
        approving a rejected one is 409 invalid_state."""
        answer = self._transport.call("POST", "/approvals/" + path_id(approval_id) + "/approve",
                                      _fields(None, {"note": note}, drop_none=True), safe=True, call_timeout=timeout)
        return cast(Approval, answer)

    def reject(self, approval_id: str, *, note: Optional[str] = None, timeout: Optional[float] = None) -> Approval:
        """Rejects a pending effect: every begin of its key is denied
        approval_rejected, for good. Retried as approve."""
        answer = self._transport.call("POST", "/approvals/" + path_id(approval_id) + "/reject",
                                      _fields(None, {"note": note}, drop_none=True), safe=True, call_timeout=timeout)
        return cast(Approval, answer)

    # circuits and the emergency stop (policies:write; the reads take policies:read too)

    def list_circuits(self, *, limit: Optional[int] = None, cursor: Optional[str] = None,
                      timeout: Optional[float] = None) -> CircuitPage:
        """Pages the breaker of every effect type seen or configured:
        {"data", "next_cursor"}."""
        answer = self._transport.call("GET", "/circuits" + _query(limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(CircuitPage, answer)

    def open_circuit(self, effect_type: str, *, action: Optional[str] = None, reason: Optional[str] = None,
                     idempotency_key: Optional[str] = None, timeout: Optional[float] = None) -> Circuit:
        """Opens effect_type's breaker by hand: its begins meet action
        ("monitor", "require_approval" (the default) or "deny") until
        close_circuit. It is retried under an Idempotency-Key of its own, as
        are the other breaker calls, so a retry after a lost answer never
        opens again a breaker another operator closed since."""
        answer = self._keyed("/circuits/" + path_id(effect_type) + "/open",
                             _fields(None, {"action": action, "reason": reason}, drop_none=True), idempotency_key,
                             timeout)
        return cast(Circuit, answer)

    def close_circuit(self, effect_type: str, *, idempotency_key: Optional[str] = None,
                      timeout: Optional[float] = None) -> Circuit:
        """Closes effect_type's breaker, with a fresh surge allowance
        counted from now. A retry never closes a breaker that tripped again
        since (an Idempotency-Key of its own)."""
        answer = self._keyed("/circuits/" + path_id(effect_type) + "/close", {}, idempotency_key, timeout)
        return cast(Circuit, answer)

    def emergency_stop(self, *, action: Optional[str] = None, reason: Optional[str] = None,
                       idempotency_key: Optional[str] = None, timeout: Optional[float] = None) -> CircuitPage:
        """Holds every effect type, those first seen while it is on
        included, with action ("require_approval" by default) until
        release_emergency_stop. Answers at most the first 200 circuits as
        {"data", "next_cursor"} without a cursor: list_circuits pages them.
        A retry never stops again after another operator's release (an
        Idempotency-Key of its own)."""
        answer = self._keyed("/circuits/stop", _fields(None, {"action": action, "reason": reason}, drop_none=True),
                             idempotency_key, timeout)
        return cast(CircuitPage, answer)

    def get_emergency_stop(self, *, timeout: Optional[float] = None) -> EmergencyStop:
        """Whether the emergency stop is on: {"state": "open"|"closed",
        "action", "reason", "opened_at"}."""
        answer = self._transport.call("GET", "/circuits/stop", safe=True, call_timeout=timeout)
        return cast(EmergencyStop, answer)

    def release_emergency_stop(self, *, idempotency_key: Optional[str] = None,
                               timeout: Optional[float] = None) -> CircuitPage:
        """Lifts the emergency stop; breakers of single types stay as they
        are. Answers circuits as emergency_stop does. A retry never lifts a
        stop another operator put on since (an Idempotency-Key of its own)."""
        answer = self._keyed("/circuits/release", {}, idempotency_key, timeout)
        return cast(CircuitPage, answer)

    # compensation groups

    def create_group(self, name: str, *, idempotency_key: Optional[str] = None,
                     timeout: Optional[float] = None) -> Group:
        """Opens a group; begins with its id as group_id join it. It is
        repeated after an ambiguous failure under an Idempotency-Key of its
        own, made once per call, so a retry after a lost answer is answered
        the group the first attempt opened, never a second group. With
        idempotency_key (derived from the work, "checkout:order_123"), sent
        in the body, a later call, from this process or another, answers
        the group the key opened (``deduplicated``; the same key with
        another name is 409 idempotency_key_reuse)."""
        body: Dict[str, Any] = {"name": name}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        return cast(Group, self._keyed("/groups", body, None, timeout))

    def get_group(self, group_id: str, *, timeout: Optional[float] = None) -> Group:
        """Reads a group with its steps: all of them, or the first that fit
        in one answer of about 4 MB (some 3 000 steps at worst), with
        ``steps_truncated`` true; list_group_steps pages the rest."""
        answer = self._transport.call("GET", "/groups/" + path_id(group_id), safe=True, call_timeout=timeout)
        return cast(Group, answer)

    def list_group_steps(self, group_id: str, *, limit: Optional[int] = None,
                         cursor: Optional[str] = None, timeout: Optional[float] = None) -> GroupStepPage:
        """Pages every step of a group in effect id order, each as get_group
        shows it: {"data", "next_cursor"}. A group's read, commit and
        repeated keyed create hold the first steps that fit in one answer
        (``steps_truncated``): pass the last one's effect_id as cursor to
        read the rest, then next_cursor."""
        answer = self._transport.call("GET", "/groups/" + path_id(group_id) + "/steps"
                                      + _query(limit=limit, cursor=cursor), safe=True, call_timeout=timeout)
        return cast(GroupStepPage, answer)

    def commit_group(self, group_id: str, *, timeout: Optional[float] = None) -> GroupCommit:
        """Commits a group whose forward steps all succeeded (or answers the
        plan of those that have not); committing again answers it again.
        Its steps are cut to fit one answer as get_group's are
        (``steps_truncated``)."""
        answer = self._transport.call("POST", "/groups/" + path_id(group_id) + "/commit", safe=True,
                                      call_timeout=timeout)
        return cast(GroupCommit, answer)

    def unwind_group(self, group_id: str, *, timeout: Optional[float] = None) -> Unwind:
        """Starts (or reads) a group's rollback: {"state", "plan",
        "plan_truncated", "unresolved", ...}, the plan in reverse order of
        success. Repeating it answers the plan as it stands; a plan cut to
        fit one answer (about 4 MB) says plan_truncated: perform its items,
        then unwind again for the rest."""
        answer = self._transport.call("POST", "/groups/" + path_id(group_id) + "/unwind", safe=True,
                                      call_timeout=timeout)
        return cast(Unwind, answer)

    # webhooks (webhooks:write)

    def create_webhook(self, url: str, events: List[str], *, idempotency_key: Optional[str] = None,
                       timeout: Optional[float] = None) -> NewWebhook:
        """Subscribes url to events and answers the subscription with its
        signing ``secret``, shown only here. One Idempotency-Key (yours, at
        most 255 characters, or a fresh one) spans the retries; the same
        call under the same key within a day answers the same subscription
        and secret, so a caller whose retries ran out can still recover it
        (until the subscription is deleted: the server then erases that
        answer, and the same call raises RatchetError not_found)."""
        answer = self._keyed("/webhooks", {"url": url, "events": list(events)}, idempotency_key, timeout)
        return cast(NewWebhook, hide_secrets(answer))

    def list_webhooks(self, *, limit: Optional[int] = None, cursor: Optional[str] = None,
                      timeout: Optional[float] = None) -> WebhookPage:
        """Pages the subscriptions: {"data", "next_cursor"}."""
        answer = self._transport.call("GET", "/webhooks" + _query(limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(WebhookPage, answer)

    def get_webhook(self, webhook_id: str, *, timeout: Optional[float] = None) -> Webhook:
        """Reads one subscription (never its secret)."""
        answer = self._transport.call("GET", "/webhooks/" + path_id(webhook_id), safe=True, call_timeout=timeout)
        return cast(Webhook, answer)

    def delete_webhook(self, webhook_id: str, *, timeout: Optional[float] = None) -> Webhook:
        """Removes a subscription; its pending deliveries end failed.
        Deleting again answers it again, so it is retried."""
        answer = self._transport.call("DELETE", "/webhooks/" + path_id(webhook_id), safe=True, call_timeout=timeout)
        return cast(Webhook, answer)

    def update_webhook(self, webhook_id: str, *, url: Optional[str] = None, events: Optional[List[str]] = None,
                       disabled: Optional[bool] = None, idempotency_key: Optional[str] = None,
                       timeout: Optional[float] = None) -> Webhook:
        """Changes a subscription without deleting it, so it keeps its
        signing secret and its deliveries: any of ``url`` (every delivery not
        yet sent goes to it), ``events`` (in place of the current ones: the
        events fanned out from then on are matched against them, and pending
        deliveries of a type left out end failed) and ``disabled`` (True: it
        is sent nothing, its pending deliveries wait, at most as long as the
        server keeps events, then end failed ``expired while disabled``, and
        the events recorded meanwhile are skipped; False: enabled again). None keeps a field; give
        at least one. Answers the subscription as get_webhook reads it.
        Retried under an Idempotency-Key of its own, so a retry after a lost
        answer never undoes another update made since (a disable retried
        after an enable)."""
        body: Dict[str, Any] = {}
        if url is not None:
            body["url"] = url
        if events is not None:
            body["events"] = list(events)
        if disabled is not None:
            body["disabled"] = disabled
        answer = self._keyed("/webhooks/" + path_id(webhook_id), body, idempotency_key, timeout, method="PATCH")
        return cast(Webhook, answer)

    def list_webhook_deliveries(self, webhook_id: str, *, limit: Optional[int] = None,
                                cursor: Optional[str] = None, timeout: Optional[float] = None) -> WebhookDeliveryPage:
        """Pages a subscription's deliveries, each with its state, attempts
        and last status: {"data", "next_cursor"}."""
        answer = self._transport.call("GET", "/webhooks/" + path_id(webhook_id) + "/deliveries"
                                      + _query(limit=limit, cursor=cursor), safe=True, call_timeout=timeout)
        return cast(WebhookDeliveryPage, answer)

    def retry_webhook_deliveries(self, webhook_id: str, delivery_ids: List[str], *,
                                 idempotency_key: Optional[str] = None, timeout: Optional[float] = None) -> RetriedDeliveries:
        """Sends deliveries (1 to 100, by id) again once the receiver is
        mended: each that ended is pending again, due at once, under the
        same event id; one still pending keeps its schedule. Answers
        {"deliveries": [...]} as they now are. One Idempotency-Key
        (idempotency_key, or a fresh one) spans the retries, so a lost answer
        does not send them twice."""
        answer = self._keyed("/webhooks/" + path_id(webhook_id) + "/deliveries/retry",
                             {"delivery_ids": list(delivery_ids)}, idempotency_key, timeout)
        return cast(RetriedDeliveries, answer)

    def rotate_webhook_secret(self, webhook_id: str, *, previous_expires_in: Optional[float] = None,
                              replace_previous: bool = False, idempotency_key: Optional[str] = None,
                              timeout: Optional[float] = None) -> NewWebhook:
        """Gives a subscription a new signing ``secret`` (shown once). Until
        the previous one expires deliveries are signed with both:
        previous_expires_in seconds (rounded up, up to a week; None: the
        server's day, 0: at once). replace_previous rotates even while an
        earlier rotation's previous secret still signs (otherwise 409
        invalid_state); that secret stops at once. Retried under one
        Idempotency-Key (idempotency_key, or a fresh one), so a lost answer
        gets the secret the first made."""
        body: Dict[str, Any] = {}
        if previous_expires_in is not None:
            body["previous_secret_expires_in_seconds"] = max(math.ceil(previous_expires_in), 0)
        if replace_previous:
            body["replace_previous"] = True
        answer = self._keyed("/webhooks/" + path_id(webhook_id) + "/rotate-secret", body, idempotency_key, timeout)
        return cast(NewWebhook, hide_secrets(answer))

    # keys (keys:write)

    def create_key(self, name: str, *, preset: Optional[str] = None, scopes: Optional[List[str]] = None,
                   tools: Optional[List[str]] = None, daily_spend_ceiling_micros: Optional[int] = None,
                   rate_limit_per_minute: Optional[int] = None, idempotency_key: Optional[str] = None,
                   timeout: Optional[float] = None) -> NewApiKey:
        """Mints a key from a preset ("AGENT", "INGEST", "WORKER",
        "OPERATOR") or explicit scopes, never more than this client's key
        holds; tools bound a WORKER key to exact "name@version" pairs (None:
        unrestricted, [] none). Answers it with its ``secret``, shown only
        here. Retried under one Idempotency-Key (yours, or a fresh one), so
        a retry after a lost answer gets the key the first attempt minted
        instead of a second; the same key within a day answers it again."""
        body: Dict[str, Any] = {"name": name, "tools": None if tools is None else list(tools)}
        body.update(_fields(None, {"preset": preset, "scopes": None if scopes is None else list(scopes),
                                   "daily_spend_ceiling_micros": daily_spend_ceiling_micros,
                                   "rate_limit_per_minute": rate_limit_per_minute}, drop_none=True))
        answer = self._keyed("/keys", body, idempotency_key, timeout)
        return cast(NewApiKey, hide_secrets(answer))

    def list_keys(self, *, created_by: Optional[str] = None, limit: Optional[int] = None,
                  cursor: Optional[str] = None, timeout: Optional[float] = None) -> ApiKeyPage:
        """Pages the workspace's keys, never their secrets: {"data", "next_cursor"}.
        created_by, a key id, lists only the keys that key minted (their
        created_by_key_id): revoking a key leaves them live, so revoke each."""
        answer = self._transport.call("GET", "/keys" + _query(created_by=created_by, limit=limit, cursor=cursor),
                                      safe=True, call_timeout=timeout)
        return cast(ApiKeyPage, answer)

    def current_key(self, *, timeout: Optional[float] = None) -> ApiKey:
        """Reads this client's own key (any valid key may): its scopes,
        tools, spend ceiling and rate limit, never its secret."""
        answer = self._transport.call("GET", "/keys/current", safe=True, call_timeout=timeout)
        return cast(ApiKey, answer)

    def revoke_key(self, key_id: str, *, include_minted: bool = False,
                   timeout: Optional[float] = None) -> RevokedApiKey:
        """Revokes a key for good and answers it; revoking again answers the
        same key, so it is retried. A client revoking its own key whose
        answer was lost is refused (401) when it asks again: read the key
        with another to confirm.

        include_minted=True (a key found compromised) revokes with it, in one
        transaction, every live key minted from it, the keys those minted,
        and so on (?include_minted=true), answered in ``minted_revoked``.
        A key of the tree this key may not revoke, or the workspace's last
        root key, refuses it all: nothing is revoked, and the error's
        detail["key_id"] names that key. Sent again, it answers the key,
        revokes what of the tree is still live, and lists again in
        ``minted_revoked`` what the first call took (a retry whose first
        answer was lost learns the tree, not [].)"""
        path = "/keys/" + path_id(key_id) + ("?include_minted=true" if include_minted else "")
        answer = self._transport.call("DELETE", path, safe=True, call_timeout=timeout)
        return cast(RevokedApiKey, answer)

    # endpoints (endpoints:write)

    def list_endpoints(self, *, limit: Optional[int] = None, cursor: Optional[str] = None,
                       timeout: Optional[float] = None) -> EndpointPage:
        """Pages the endpoints with their policies: {"data", "nextCursor"}."""
        answer = self._transport.call("GET", "/endpoints" + _query(limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(EndpointPage, answer)

    def create_endpoint(self, name: str, policy: Optional[Dict[str, Any]] = None,
                        *, timeout: Optional[float] = None, **fields: Any) -> Endpoint:
        """Creates an endpoint ahead of its first job, with policy fields as
        update_endpoint_policy takes them (none: STANDARD). An existing name
        answers the endpoint unchanged, so it is retried."""
        answer = self._transport.call("POST", "/endpoints", dict(_fields(policy, fields), name=name), safe=True,
                                      call_timeout=timeout)
        return cast(Endpoint, answer)

    def get_endpoint(self, endpoint_id: str, *, timeout: Optional[float] = None) -> Endpoint:
        """Reads an endpoint and its policy (GET /endpoints/{id}/policy)."""
        answer = self._transport.call("GET", "/endpoints/" + path_id(endpoint_id) + "/policy", safe=True,
                                      call_timeout=timeout)
        return cast(Endpoint, answer)

    def update_endpoint_policy(self, endpoint_id: str, expected_version: int, update: Optional[Dict[str, Any]] = None,
                               *, timeout: Optional[float] = None, **fields: Any) -> Endpoint:
        """Merges the fields of update and the keyword fields (the API's
        camelCase names: preset, maxAttempts, initialDelayMs, multiplier,
        maxDelayMs, jitterPercent, defaultTimeoutMs, maxConcurrent,
        rateLimitPerMinute, circuitFailureThreshold, circuitCooldownMs; None
        clears an optional one) into the endpoint's policy while
        expected_version is still its version (otherwise RatchetError code
        version_conflict). Jobs already enqueued keep their snapshot. Not
        repeated after a lost answer (a repeat of an update that landed
        would meet the new version): read the endpoint to see.
        update_effect_policy, unlike it, is repeated under an
        Idempotency-Key."""
        body = dict(_fields(update, fields), expectedVersion=expected_version)
        answer = self._transport.call("PUT", "/endpoints/" + path_id(endpoint_id) + "/policy", body, safe=False,
                                      call_timeout=timeout)
        return cast(Endpoint, answer)

    def pause_endpoint(self, endpoint_id: str, *, idempotency_key: Optional[str] = None,
                       timeout: Optional[float] = None) -> Endpoint:
        """Pauses an endpoint: its jobs are accepted but not claimed,
        consuming no attempts, until resume_endpoint. Retried under an
        Idempotency-Key of its own, so a retry after a lost answer never
        pauses again an endpoint another operator resumed since."""
        answer = self._keyed("/endpoints/" + path_id(endpoint_id) + "/pause", {}, idempotency_key, timeout)
        return cast(Endpoint, answer)

    def resume_endpoint(self, endpoint_id: str, *, idempotency_key: Optional[str] = None,
                        timeout: Optional[float] = None) -> Endpoint:
        """Resumes a paused endpoint, retried under an Idempotency-Key of
        its own as pause_endpoint is."""
        answer = self._keyed("/endpoints/" + path_id(endpoint_id) + "/resume", {}, idempotency_key, timeout)
        return cast(Endpoint, answer)

    def close_endpoint_circuit(self, endpoint_id: str, *, idempotency_key: Optional[str] = None,
                               timeout: Optional[float] = None) -> Endpoint:
        """Closes the endpoint's circuit breaker by hand (read its recent
        attempts first, list_endpoint_attempts); closing a closed one
        changes nothing. A retry never closes it again once it opened again
        since (an Idempotency-Key of its own)."""
        answer = self._keyed("/endpoints/" + path_id(endpoint_id) + "/circuit/close", {}, idempotency_key, timeout)
        return cast(Endpoint, answer)

    def list_endpoint_attempts(self, endpoint_id: str, *, outcome: Optional[JobOutcome] = None,
                               limit: Optional[int] = None, cursor: Optional[str] = None,
                               timeout: Optional[float] = None) -> EndpointAttemptPage:
        """Pages an endpoint's attempts newest first, each with its job and
        its worker's message; outcome "SUCCEEDED" or "FAILED" keeps only
        those: {"data", "nextCursor"}."""
        answer = self._transport.call("GET", "/endpoints/" + path_id(endpoint_id) + "/attempts"
                                      + _query(outcome=outcome, limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(EndpointAttemptPage, answer)

    # contracts and tool tests (contracts:write)

    def publish_contract(self, name: str, *, handler_version: str, input_schema: Any,
                         output_schema: Any = None, timeout_ms: Optional[int] = None,
                         retry_preset: Optional[RetryPreset] = None, retry_policy: Optional[Dict[str, Any]] = None,
                         status: Optional[ContractStatus] = None, idempotency_key: Optional[str] = None,
                         timeout: Optional[float] = None) -> Contract:
        """Publishes a new contract version of tool name: the handler
        version it binds, its input and output JSON Schemas (2020-12; no
        output_schema accepts any output), timeout, retry preset (STANDARD,
        AGGRESSIVE, RELAXED, or CUSTOM with retry_policy's maxAttempts,
        initialDelayMs, multiplier, maxDelayMs, jitterPercent) and status
        ("ACTIVE" or "FORBIDDEN"). Answers the contract with its
        ``contractVersion``. Retried under one Idempotency-Key
        (idempotency_key, or a fresh one), so a repeat after a lost answer
        gets the version the first published."""
        body: Dict[str, Any] = {"handlerVersion": handler_version, "inputSchema": input_schema}
        if retry_policy is not None:
            retry_policy = {k: v for k, v in retry_policy.items() if k != "preset"}
        body.update(_fields(None, {"outputSchema": output_schema, "timeoutMs": timeout_ms,
                                   "retryPreset": retry_preset, "retryPolicy": retry_policy, "status": status},
                            drop_none=True))
        answer = self._keyed("/tools/" + path_id(name) + "/contracts", body, idempotency_key, timeout)
        return cast(Contract, answer)

    def list_contracts(self, name: str, *, limit: Optional[int] = None, cursor: Optional[str] = None,
                       timeout: Optional[float] = None) -> ContractPage:
        """Pages tool name's contracts by version: {"data", "nextCursor"}."""
        answer = self._transport.call("GET", "/tools/" + path_id(name) + "/contracts"
                                      + _query(limit=limit, cursor=cursor), safe=True, call_timeout=timeout)
        return cast(ContractPage, answer)

    def test_tool(self, name: str, version: str, input: Any = None, *,
                  idempotency_key: Optional[str] = None, timeout: Optional[float] = None) -> ToolTest:
        """Enqueues a synthetic one-attempt job of name@version with input,
        checked against the version's contract as any enqueue, in a run of
        its own: follow it with get_run(answer["runId"]). Retried under one
        Idempotency-Key (idempotency_key, or a fresh one), as
        publish_contract."""
        body: Dict[str, Any] = {"version": version}
        if input is not None:
            body["input"] = input
        answer = self._keyed("/tools/" + path_id(name) + "/test", body, idempotency_key, timeout)
        return cast(ToolTest, answer)

    # reconciliation (reconcile:write) and the queue

    def reconcile(self, effect_type: str, from_: Any, to: Any, records: Optional[List[Dict[str, Any]]] = None, *,
                  idempotency_key: Optional[str] = None, timeout: Optional[float] = None) -> Reconciliation:
        """Compares the vendor's records ({"idempotency_key", "status":
        "succeeded"|"refunded"|"failed"|"pending", "amount_micros"}, at most
        10 000; none is a valid answer) with the effects of effect_type
        that happened in [from_, to) (aware datetimes or RFC 3339 strings;
        by the start of each one's latest attempt that did not fail),
        resolves the indeterminate effects a record settles and restarts the
        type's reconcile_every_hours calendar. Answers the counts and lists
        (matched, missing_at_vendor, unknown_to_ratchet, amount_mismatch,
        resolved, status_mismatch, unsettled). Sent under an Idempotency-Key
        (idempotency_key, or a fresh one), so a retry after a lost answer is
        answered the first call's ``resolved`` (compared again, they would
        read as matched); the same call under the same key within a day is
        answered it too."""
        body = {"effect_type": effect_type, "from": _rfc3339(from_, "from_"), "to": _rfc3339(to, "to"),
                "records": list(records or [])}
        answer = self._keyed("/reconcile", body, idempotency_key, timeout)
        return cast(Reconciliation, answer)

    def list_queue_health(self, *, limit: Optional[int] = None, cursor: Optional[str] = None,
                          timeout: Optional[float] = None) -> QueueHealthPage:
        """Pages the queued work of each exact name@version (queued, due,
        oldest age, workers seen, the endpoints holding it and a plain
        ``message`` when something does): {"data", "nextCursor"}."""
        answer = self._transport.call("GET", "/queue/health" + _query(limit=limit, cursor=cursor), safe=True,
                                      call_timeout=timeout)
        return cast(QueueHealthPage, answer)

@dataclass(frozen=True)
class _Held:
    """An execute do_effect holds: its lease, heartbeated until stop is set."""
    effect_id: str
    token: str
    lease: Lease
    state: Dict[str, float]  # "end": the lease's end by this process's clock, as last extended
    stop: threading.Event


class _Asking:
    """do_effect's asking again while another caller holds the lease: the
    next pause (from _FIRST_IN_FLIGHT_WAIT, doubling to _MAX_IN_FLIGHT_WAIT)
    and when it gives up (time.monotonic(); None: never)."""

    def __init__(self, in_flight_timeout: Optional[float]) -> None:
        self.wait = _FIRST_IN_FLIGHT_WAIT
        self.give_up = None if in_flight_timeout is None else time.monotonic() + in_flight_timeout


@dataclass(frozen=True)
class _InFlight:
    """A begin answered in_flight: ask again after pause seconds."""
    pause: float


class _Handover:
    """Hands do_effect_async the lease a begin on a thread obtained, or,
    once its task was cancelled, keeps it for release."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.abandoned = threading.Event()
        # Fired with abandoned: ends the waits between a begin's retries.
        self.cutoff = Abort("cancelled")
        self._leased: Optional[Tuple[Dict[str, Any], float]] = None

    def give(self, leased: Tuple[Dict[str, Any], float]) -> bool:
        """False when the task was cancelled: the lease is its giver's to release."""
        with self._lock:
            if self.abandoned.is_set():
                return False
            self._leased = leased
            return True

    def abandon(self) -> Optional[Tuple[Dict[str, Any], float]]:
        """Marks the task cancelled; answers a lease already given, which
        it never took, for release."""
        with self._lock:
            self.abandoned.set()
            self.cutoff.fire()
            return self._leased


def _check_action(action: Any, name: str, in_loop: bool) -> None:
    """Refuses, before a lease is taken, an action that cannot act: after,
    the call's failure would leave the key indeterminate, an operator's to
    resolve."""
    if not callable(action):
        raise TypeError(f"ratchet: {name}'s action must be callable, not {type(action).__name__}")
    if inspect.isgeneratorfunction(action) or inspect.isasyncgenfunction(action):
        raise TypeError(f"ratchet: {name}'s action must perform the effect and return its result, not a "
                        "generator function")
    if in_loop and is_async(action):
        raise TypeError(f"ratchet: {name} cannot await an async action in a thread that runs an event loop "
                        "without blocking it: use `await client.do_effect_async(...)`")


def _latest_unknown(effect: Effect) -> Optional[int]:
    """The latest of effect's attempts whose outcome reads indeterminate:
    the attempt a resolve settles now (None for none)."""
    unknown = [a["attempt"] for a in effect.get("attempts") or [] if a.get("outcome") == "indeterminate"]
    return max(unknown) if unknown else None


def _query(**params: Any) -> str:
    """A list's query string ("" without parameters): the params not None."""
    given = {k: str(v) for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(given) if given else ""


def _fields(update: Optional[Dict[str, Any]], fields: Dict[str, Any], *, drop_none: bool = False) -> Dict[str, Any]:
    """A request body: update's fields, then the keyword fields; with
    drop_none, those None are left out."""
    body = dict(update or {})
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None} if drop_none else body


def _job_report(lease_token: str, status: str, output: Any, error: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A job report's body, leaving out what was not given."""
    body: Dict[str, Any] = {"leaseToken": lease_token, "status": status}
    if output is not None:
        body["output"] = output
    if error is not None:
        body["error"] = error
    return body


def _rfc3339(value: Any, name: str) -> str:
    """A time as the API takes it: an aware datetime in RFC 3339, or a
    string as it is."""
    if isinstance(value, datetime):
        return aware(value, name).isoformat()
    if isinstance(value, str):
        return value
    raise TypeError(f"ratchet: {name} must be a datetime or an RFC 3339 string, not {type(value).__name__}")

def _effect_report(token: str, outcome: str, result: Any) -> Dict[str, Any]:
    body: Dict[str, Any] = {"lease_token": token, "outcome": outcome}
    if result is not None:
        body["result"] = result
    return body


def _unsendable_result(result: Any) -> Optional[str]:
    """Why a result cannot even be sent (not JSON, or over the server's
    request size limit), or None."""
    try:
        size = len(_json.dumps(result, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError):
        return "result_not_json"
    return PAYLOAD_TOO_LARGE if size > _MAX_RESULT_BYTES else None


def _unrecordable_result(err: RatchetError) -> Optional[str]:
    """Why a success's result cannot be recorded (its size, or a field
    under result the gate refused: "invalid_request at <field>", the
    reason the Go and TypeScript SDKs record; the body, which only the
    result can make unreadable: nested more levels deep than the gate
    reads), or None for other refusals. A bare 413 (a proxy's body limit
    before the server, without Ratchet's envelope) refuses it for good too,
    as Go's DoEffect reads it (sdk QA: raised as not reported, the lease
    lapsed, and under on_indeterminate retry the next caller acted again)."""
    if err.code == PAYLOAD_TOO_LARGE or (err.status == 413 and not err.code):
        return PAYLOAD_TOO_LARGE
    if err.code == INVALID_REQUEST:
        for item in err.validation:
            field = str(item.get("field", "")) if isinstance(item, dict) else ""
            if field in ("result", "body") or field.startswith("result."):
                return f"{INVALID_REQUEST} at {field}"
    return None


def _placeholder_reason(recorded: Any) -> Optional[str]:
    """Why a recorded result is the placeholder one a success whose result
    could not be kept was recorded with, or None when it is a result: the
    placeholder is exactly {"ratchet": "result_not_recorded", "reason": str},
    as the Go and TypeScript SDKs read it (an action's own result that
    merely has such a field is returned)."""
    if (isinstance(recorded, dict) and set(recorded) == {"ratchet", "reason"}
            and recorded["ratchet"] == _PLACEHOLDER_MARK and isinstance(recorded["reason"], str)):
        return recorded["reason"]
    return None

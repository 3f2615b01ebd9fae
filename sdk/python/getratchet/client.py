"""The client: producer calls, the effect gate, and the worker's registry."""

from __future__ import annotations

import hashlib
import hmac
import inspect
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Tuple

from ._http import Transport, new_request_id, path_id
from .errors import (INVALID_REQUEST, LEASE_LOST, PAYLOAD_TOO_LARGE, ApprovalRequired, ConnectionLost, EffectBlocked,
                     EffectDenied, EffectInFlight, NotPerformed, OutcomeNotReported, RatchetError, ResultNotStored)

AFTER_SUCCEEDED = "SUCCEEDED"
AFTER_FAILED = "FAILED"

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
    prior_attempt: Optional[dict]
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
    server's retry_after_seconds; start_run without an idempotency key is
    never repeated after an ambiguous failure.
    """

    def __init__(self, base_url: Optional[str] = None, api_key: str = "", *, timeout: float = 60.0,
                 max_retries: int = 3, user_agent: str = "") -> None:
        self._transport = Transport(base_url, api_key, timeout=timeout, max_retries=max_retries,
                                    user_agent=user_agent)
        self._lock = threading.Lock()
        self._run_id: Optional[str] = None
        self._worker: Any = None

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
                idempotency_key: Optional[str] = None) -> Any:
        """Calls any route (path under /api/v1, e.g. "/endpoints") and
        returns the decoded answer; failures raise RatchetError. safe=True
        lets the call be repeated after a lost answer: only for calls that
        are idempotent."""
        return self._transport.call(method, path, body, safe=safe, idempotency_key=idempotency_key)

    # -- producer -----------------------------------------------------------

    @property
    def run_id(self) -> Optional[str]:
        """The run start_run started, which enqueue and finish_run default to."""
        with self._lock:
            return self._run_id

    def start_run(self, name: str, *, idempotency_key: Optional[str] = None,
                  budget_micros: Optional[int] = None) -> dict:
        """Starts a run (POST /runs) and makes it this client's current run.

        With idempotency_key (derived from the work, as a Temporal workflow
        id) the call is repeated after an ambiguous failure and starting it
        again answers the same run; without one it is not repeated, since a
        repeat would start a second run."""
        body: dict = {"name": name}
        if idempotency_key is not None:
            body["idempotencyKey"] = idempotency_key
        if budget_micros is not None:
            body["budgetMicros"] = budget_micros
        run = self._transport.call("POST", "/runs", body, safe=idempotency_key is not None)
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
                after_step_id: Optional[str] = None, after_status: Optional[str] = None,
                delay_ms: Optional[int] = None, run_id: Optional[str] = None) -> dict:
        """Adds a step to the run (POST /runs/{id}/steps): the exact handler
        name@version, its JSON input and options. Without idempotency_key
        the server derives one from the run, name, version, contract
        version, endpoint, dependency and canonical input, so an identical
        enqueue is deduplicated (``deduplicated`` in the answer); use an
        explicit key when producers in different languages must agree.
        Enqueue is idempotent either way, so it is retried."""
        if not name or not version:
            raise ValueError("ratchet: enqueue needs a tool name and version")
        body: dict = {"name": name, "version": version, "input": input}
        optional = {"endpoint": endpoint, "idempotencyKey": idempotency_key, "timeoutMs": timeout_ms,
                    "maxAttempts": max_attempts, "contractVersion": contract_version,
                    "afterStepId": after_step_id, "afterStatus": after_status, "delayMs": delay_ms}
        body.update({k: v for k, v in optional.items() if v is not None})
        return self._transport.call("POST", "/runs/" + path_id(self._run(run_id)) + "/steps", body, safe=True)

    def finish_run(self, run_id: Optional[str] = None) -> dict:
        """Requests the run's completion: it ends SUCCEEDED once every step
        ended well, FAILED when one is EXHAUSTED or CANCELLED. Enqueue every
        branch before this."""
        return self._transport.call("POST", "/runs/" + path_id(self._run(run_id)) + "/finish", {}, safe=True)

    def get_run(self, run_id: Optional[str] = None) -> dict:
        """Reads a run with its steps (each with ``durableJob``)."""
        return self._transport.call("GET", "/runs/" + path_id(self._run(run_id)), safe=True)

    def get_step(self, step_id: str) -> dict:
        """Reads one step with its executions and replays."""
        return self._transport.call("GET", "/steps/" + path_id(step_id), safe=True)

    def list_runs(self, *, status: Optional[str] = None, limit: Optional[int] = None,
                  cursor: Optional[str] = None) -> dict:
        """Pages the workspace's runs newest first, without their steps
        (scope runs:read): {"data": [...], "nextCursor"}; status RUNNING,
        SUCCEEDED or FAILED. Pass nextCursor as cursor for the next page."""
        return self._transport.call("GET", "/runs" + _query(status=status, limit=limit, cursor=cursor), safe=True)

    def list_run_steps(self, run_id: Optional[str] = None, *, status: Optional[str] = None,
                       limit: Optional[int] = None, cursor: Optional[str] = None) -> dict:
        """Pages a run's steps in id order, each as get_step reads it, for
        runs larger than get_run's first 1000 steps: {"data", "nextCursor"}."""
        return self._transport.call("GET", "/runs/" + path_id(self._run(run_id)) + "/steps"
                                    + _query(status=status, limit=limit, cursor=cursor), safe=True)

    def cancel_step(self, step_id: str) -> dict:
        """Cancels a step's job; a running handler learns of it at its next
        heartbeat. Cancelling again answers the same step."""
        return self._transport.call("POST", "/steps/" + path_id(step_id) + "/cancel", {}, safe=True)

    def replay_preview(self, step_id: str) -> dict:
        """Whether an exhausted or cancelled step may be replayed, and the
        contract versions it could be upgraded to (``upgrades``)."""
        return self._transport.call("GET", "/steps/" + path_id(step_id) + "/replay", safe=True)

    def replay(self, step_id: str, *, reason: Optional[str] = None, max_attempts: int = 1,
               acknowledge_duplicate_risk: bool = True, target_contract_version: Optional[int] = None,
               expected_handler_version: Optional[str] = None, acknowledge_version_change: bool = False,
               expected_attempt: Optional[int] = None) -> dict:
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
        body: dict = {"acknowledgeDuplicateRisk": True, "maxAttempts": max_attempts}
        optional = {"reason": reason, "targetContractVersion": target_contract_version,
                    "expectedHandlerVersion": expected_handler_version, "expectedAttempt": expected_attempt}
        body.update({k: v for k, v in optional.items() if v is not None})
        if acknowledge_version_change:
            body["acknowledgeVersionChange"] = True
        return self._transport.call("POST", "/steps/" + path_id(step_id) + "/replay", body, safe=True,
                                    idempotency_key=new_request_id())

    # -- worker -------------------------------------------------------------

    def register_tool(self, name: str, version: str, handler: Callable[[Any, Any], Any], *,
                      classify_error: Optional[Callable[[BaseException, Any], Any]] = None) -> None:
        """Registers the handler for the exact tool name@version (the WORKER
        key must list it). handler(input, context) returns the output (JSON
        values); raise RetryableError or NonRetryableError to decide the
        retry, or let classify_error(error, context) decide for other
        exceptions ({"retryable": True, "retry_after_ms": ...} or
        {"retryable": False}); unknown errors are retryable."""
        self.worker.add_tool(name, version, handler, classify_error)

    @property
    def worker(self) -> Any:
        """This client's worker runtime: start(), stop()."""
        with self._lock:
            if self._worker is None:
                from .worker import Worker
                self._worker = Worker(self._transport)
            return self._worker

    # -- the effect gate ----------------------------------------------------

    def begin(self, effect_type: str, idempotency_key: str, payload: Any = None, *,
              cost_micros: Optional[int] = None, dimensions: Optional[dict] = None,
              run_id: Optional[str] = None, group_id: Optional[str] = None,
              compensation: Optional[dict] = None, compensates_effect_id: Optional[str] = None,
              lease_seconds: Optional[int] = None, request_id: Optional[str] = None) -> dict:
        """Asks before acting (POST /effects/begin) and returns the answer:
        ``decision`` is execute, duplicate, in_flight, blocked,
        approval_required or denied (a denial is answered, not raised: its
        ``error`` holds the code). The key is derived from the work, never
        from time or randomness. A request_id (random when not given) spans
        the call's retries, so a begin whose answer was lost gets the same
        lease again instead of in_flight."""
        return self._begin(self._begin_body(
            effect_type, idempotency_key, payload, cost_micros=cost_micros, dimensions=dimensions, run_id=run_id,
            group_id=group_id, compensation=compensation, compensates_effect_id=compensates_effect_id,
            lease_seconds=lease_seconds, request_id=request_id))[0]

    @staticmethod
    def _begin_body(effect_type: str, idempotency_key: str, payload: Any, *, request_id: Optional[str] = None,
                    **options: Any) -> dict:
        unknown = set(options) - {"cost_micros", "dimensions", "run_id", "group_id", "compensation",
                                  "compensates_effect_id", "lease_seconds"}
        if unknown:
            raise TypeError(f"ratchet: unknown begin option(s): {', '.join(sorted(unknown))}")
        body: dict = {"effect_type": effect_type, "idempotency_key": idempotency_key, "payload": payload,
                      "request_id": request_id or new_request_id()}
        body.update({k: v for k, v in options.items() if v is not None})
        return body

    def _begin(self, body: dict) -> Tuple[dict, float, str]:
        """begin's answer; for an execute, the lease's length in seconds by
        the server's clock (its expiry less the answer's Date); for a
        denial, the answer's X-Request-Id (its body holds none)."""
        try:
            answer, date = self._transport.call("POST", "/effects/begin", body, safe=True, with_date=True)
        except RatchetError as err:
            if err.status == 403 and isinstance(err.body, dict) and err.body.get("decision") == "denied":
                return err.body, 0.0, err.request_id
            raise
        return answer, _lease_seconds(answer.get("lease_expires_at"), date), ""

    def report_effect(self, effect_id: str, lease_token: str, outcome: str, result: Any = None) -> dict:
        """Reports an execute's outcome: "succeeded" with its result, or
        "failed" only when the action surely did not reach the outside
        world. Unsure? Report nothing: the lease lapses and the outcome is
        recorded honestly as indeterminate."""
        return self._transport.call("POST", "/effects/" + path_id(effect_id) + "/report",
                                    _effect_report(lease_token, outcome, result), safe=True)

    def heartbeat_effect(self, effect_id: str, lease_token: str) -> dict:
        """Extends an execute's lease: {"effect_id", "lease_expires_at"}."""
        return self._transport.call("POST", "/effects/" + path_id(effect_id) + "/heartbeat",
                                    {"lease_token": lease_token}, safe=True)

    def get_effect(self, effect_id: str) -> dict:
        """Reads an effect with its attempts."""
        return self._transport.call("GET", "/effects/" + path_id(effect_id), safe=True)

    def resolve_effect(self, effect_id: str, outcome: str, result: Any = None, *, note: Optional[str] = None) -> dict:
        """Records what an operator found at the vendor for an indeterminate
        effect (scope effects:resolve) and unblocks its key: "succeeded"
        with the vendor's result, which a duplicate begin then answers, or
        "failed" (it did not happen). Repeating the same resolve answers the
        effect, so it is retried."""
        if outcome not in ("succeeded", "failed"):
            raise ValueError("ratchet: resolve_effect needs outcome 'succeeded' or 'failed'")
        body: dict = {"outcome": outcome}
        if result is not None:
            body["result"] = result
        if note is not None:
            body["note"] = note
        return self._transport.call("POST", "/effects/" + path_id(effect_id) + "/resolve", body, safe=True)

    def list_effects(self, *, state: Optional[str] = None, effect_type: Optional[str] = None,
                     limit: Optional[int] = None, cursor: Optional[str] = None) -> dict:
        """Pages effects newest first (scope effects:read), results as
        redacted previews: {"data": [...], "next_cursor"}. state="indeterminate"
        lists those to verify at the vendor and resolve."""
        return self._transport.call("GET", "/effects" + _query(state=state, effect_type=effect_type, limit=limit,
                                                               cursor=cursor), safe=True)

    def do_effect(self, effect_type: str, idempotency_key: str, action: Callable[[Lease], Any],
                  payload: Any = None, *, in_flight_timeout: Optional[float] = None,
                  **begin_options: Any) -> EffectOutcome:
        """Wraps a side effect in the gate's protocol.

        execute: runs action(lease) under a heartbeated lease and reports
        "succeeded" with what it returns; if it raises NotPerformed the
        attempt is reported "failed" (it surely did not happen) and the
        exception re-raised; any other exception reports nothing (the lease
        lapses: an honest indeterminate) and is re-raised. duplicate: returns
        the recorded result without acting. in_flight: asks again (0.25 s
        doubling to 5 s, never past the server's retry_after_seconds) until
        in_flight_timeout seconds, then EffectInFlight. blocked,
        approval_required and denied raise EffectBlocked, ApprovalRequired
        and EffectDenied. An async def or generator action raises TypeError
        (before begin, or, wrapped, with the attempt reported failed since
        its body never ran). begin_options are begin's keyword options. A
        request_id of yours (one is made per call) must never be reused once
        an action may have run under its lease (a do_effect that returned,
        a process that crashed mid-action): while that lease is live its
        begin is handed the same execute, and the action runs twice."""
        if not callable(action):
            # Refused before a lease is taken: after, the call's failure
            # would leave the key indeterminate, an operator's to resolve.
            raise TypeError(f"ratchet: do_effect's action must be callable, not {type(action).__name__}")
        if inspect.iscoroutinefunction(action) or inspect.isgeneratorfunction(action):
            # Refused before a lease is taken; see _refuse_unrun for others.
            raise TypeError("ratchet: do_effect's action must be a plain function that performs the effect and "
                            "returns its result, not an async def or generator (run an async one with "
                            "asyncio.run inside it)")
        # One request id for the whole call: a begin whose answer was lost
        # is answered again by the next, whichever retry asks.
        begin_options.setdefault("request_id", new_request_id())
        give_up = None if in_flight_timeout is None else time.monotonic() + in_flight_timeout
        wait = _FIRST_IN_FLIGHT_WAIT
        while True:
            sent = time.monotonic()
            answer, lease_seconds, request_id = self._begin(
                self._begin_body(effect_type, idempotency_key, payload, **begin_options))
            decision = answer.get("decision")
            effect_id = answer.get("effect_id", "")
            if decision == "execute":
                return self._run_leased(answer, sent + lease_seconds, action)
            if decision == "duplicate":
                recorded = answer.get("result")
                if isinstance(recorded, dict) and recorded.get("ratchet") == _PLACEHOLDER_MARK:
                    # The attempt that acted could not record its result.
                    raise ResultNotStored(effect_id, str(recorded.get("reason", "")), None)
                return EffectOutcome(effect_id, answer.get("attempt", 0), recorded, True)
            if decision == "in_flight":
                pause = min(wait, max(answer.get("retry_after_seconds") or 1, 1))
                wait = min(2 * wait, _MAX_IN_FLIGHT_WAIT)
                if give_up is not None:
                    # The last pause ends at the timeout, which asks once
                    # more (QA: a pause that would pass it gave up at once,
                    # up to 5 s early, with the holder about to report).
                    left = give_up - time.monotonic()
                    if left <= 0:
                        raise EffectInFlight(effect_id)
                    pause = min(pause, left)
                time.sleep(pause)
                continue
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

    def _run_leased(self, answer: dict, lease_end: float, action: Callable[[Lease], Any]) -> EffectOutcome:
        effect_id, token = answer["effect_id"], answer["lease_token"]
        lost = threading.Event()
        lease = Lease(effect_id, answer.get("attempt", 0), bool(answer.get("probe")),
                      answer.get("prior_attempt"), answer.get("lease_expires_at", ""), lost)
        # The heartbeats run until the outcome is reported, not only while
        # the action runs: a report retried through a server blip must still
        # find the lease. lease_end is this process's clock's view of the
        # lease's end, as last extended.
        state = {"end": lease_end}
        stop = threading.Event()
        beats = threading.Thread(target=self._heartbeat_effect, args=(effect_id, token, state, stop, lost),
                                 name="ratchet-effect-heartbeat", daemon=True)
        beats.start()
        try:
            try:
                result = action(lease)
            except NotPerformed as not_performed:
                try:
                    self._report_effect(effect_id, token, "failed", None, state)
                except (RatchetError, ConnectionLost) as err:
                    # Raised all the same, with why its failure may not be
                    # recorded (the lease then lapses: indeterminate).
                    not_performed.report_error = err  # type: ignore[attr-defined]
                raise
            if inspect.isawaitable(result) or inspect.isgenerator(result):
                # An async def (or generator) action returned its body
                # unrun: recorded as its result it was a success that never
                # happened (QA: a placeholder settled the key for good).
                self._refuse_unrun(effect_id, token, result, state)
            reason = _unsendable_result(result)
            if reason is None:
                try:
                    self._report_effect(effect_id, token, "succeeded", result, state)
                    return EffectOutcome(effect_id, lease.attempt, result, False)
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
        finally:
            # Not joined: a heartbeat still in flight ends on its own (a
            # reported lease answers it 409), and must not hold the answer.
            stop.set()

    def _refuse_unrun(self, effect_id: str, token: str, result: Any, state: dict) -> None:
        """Raises TypeError for an action that returned a coroutine, generator
        or other awaitable instead of acting. One whose body never started
        surely did nothing: it is closed and the attempt reported failed, so
        the key may be tried again. Any other (a scheduled task, a future)
        may be acting: nothing is reported."""
        unrun = ((inspect.iscoroutine(result) and inspect.getcoroutinestate(result) == inspect.CORO_CREATED)
                 or (inspect.isgenerator(result) and inspect.getgeneratorstate(result) == inspect.GEN_CREATED))
        error = TypeError(f"ratchet: do_effect's action returned {type(result).__name__} instead of acting: it "
                          "must be a plain function that performs the effect and returns its result (run an "
                          "async one with asyncio.run inside it)")
        if not unrun:
            raise error
        result.close()
        try:
            self._report_effect(effect_id, token, "failed", None, state)
        except (RatchetError, ConnectionLost) as err:
            error.report_error = err  # type: ignore[attr-defined]
        raise error

    def _report_effect(self, effect_id: str, token: str, outcome: str, result: Any, state: dict) -> None:
        """Reports, repeating through lost answers and server failures while
        the lease stands (the heartbeats keep it), for at most _REPORT_TIMEOUT."""
        give_up = time.monotonic() + _REPORT_TIMEOUT
        try:
            self._transport.call_until("POST", "/effects/" + path_id(effect_id) + "/report",
                                       _effect_report(token, outcome, result),
                                       may_wait=lambda wait: time.monotonic() + wait < min(state["end"], give_up))
        except RatchetError as err:
            # An earlier send of this report landed (its answer was lost) and
            # a newer attempt began before the retry: lease_lost names the
            # outcome it recorded (QA: said not recorded), as Go's reads it.
            if err.code == LEASE_LOST and err.detail.get("reported_outcome") == outcome:
                return
            raise

    def _heartbeat_effect(self, effect_id: str, token: str, state: dict,
                          stop: threading.Event, lost: threading.Event) -> None:
        # Paced at a third of the lease left, within 1 s to 1 min; the
        # action is told the lease is lost on a refusal, or a second before
        # its end by this process's clock when heartbeats keep failing.
        while True:
            left = state["end"] - time.monotonic()
            if stop.wait(min(max(left / 3, 1.0), 60.0, max(left - 1.0, 0.0))):
                return
            if time.monotonic() >= state["end"] - 1.0:
                lost.set()
                return
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
                                                              max(state["end"] - 1.0 - sent, 0.1)))
            except RatchetError as err:
                if err.status in (404, 409):
                    lost.set()
                    return
                continue  # a server failure: the next beat tries again
            except ConnectionLost:
                continue
            seconds = _lease_seconds(beat.get("lease_expires_at"), date)
            if seconds > 0:
                state["end"] = sent + seconds


def _query(**params: Any) -> str:
    """A list's query string ("" without parameters): the params not None."""
    given = {k: str(v) for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(given) if given else ""


def _effect_report(token: str, outcome: str, result: Any) -> dict:
    body: dict = {"lease_token": token, "outcome": outcome}
    if result is not None:
        body["result"] = result
    return body


def _unsendable_result(result: Any) -> Optional[str]:
    """Why a result cannot even be sent (not JSON, or over the server's
    request size limit), or None."""
    try:
        size = len(json.dumps(result, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        return "result_not_json"
    return PAYLOAD_TOO_LARGE if size > _MAX_RESULT_BYTES else None


def _unrecordable_result(err: RatchetError) -> Optional[str]:
    """Why a success's result cannot be recorded (its size, or a field
    under result the gate refused), or None for other refusals."""
    if err.code == PAYLOAD_TOO_LARGE:
        return PAYLOAD_TOO_LARGE
    if err.code == INVALID_REQUEST:
        for item in err.validation:
            field = str(item.get("field", "")) if isinstance(item, dict) else ""
            if field == "result" or field.startswith("result."):
                return field
    return None


def _parse_time(timestamp: Any) -> Optional[datetime]:
    """An RFC 3339 timestamp of the server's, or None when it does not parse."""
    match = _RFC3339.match(str(timestamp or ""))
    if not match:
        return None
    whole, fraction, zone = match.groups()
    zone = "+00:00" if zone in ("Z", "z") else zone
    # Python 3.10's fromisoformat takes exactly three or six fractional
    # digits; the server writes up to nine, trailing zeros trimmed.
    digits = (fraction or ".")[1:7].ljust(6, "0")
    try:
        return datetime.fromisoformat(f"{whole}.{digits}{zone}")
    except ValueError:
        return None


def _lease_seconds(expires: Any, date: Optional[datetime]) -> float:
    """A lease's length by the server's clock: its expiry less the
    answer's Date (whole seconds, so less a second), or by this process's
    clock without one; 0 when unknown."""
    end = _parse_time(expires)
    if end is None:
        return 0.0
    if date is None:
        return max((end - datetime.now(timezone.utc)).total_seconds(), 0.0)
    return max((end - date).total_seconds() - 1.0, 0.0)


_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

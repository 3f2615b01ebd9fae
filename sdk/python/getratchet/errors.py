"""Errors the SDK raises, and the ones handlers raise to decide a retry."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, TypedDict

# The API's stable error codes (API.md, "Errors").
INVALID_REQUEST = "invalid_request"
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
NOT_FOUND = "not_found"
IDEMPOTENCY_KEY_REUSE = "idempotency_key_reuse"
INVALID_STATE = "invalid_state"
LEASE_EXPIRED = "lease_expired"
LEASE_LOST = "lease_lost"
RETRY_REQUEST = "retry_request"
VERSION_CONFLICT = "version_conflict"
PAYLOAD_TOO_LARGE = "payload_too_large"
RATE_LIMITED = "rate_limited"
INTERNAL_ERROR = "internal_error"
DATABASE_UNAVAILABLE = "database_unavailable"
REQUEST_TIMEOUT = "request_timeout"

# The shortest and longest retry hint the API takes, in milliseconds.
MIN_RETRY_AFTER_MS = 1_000
MAX_RETRY_AFTER_MS = 86_400_000


class _SDKError(Exception):
    """The base of the SDK's exceptions: pickled (multiprocessing, a
    ProcessPoolExecutor, a task queue's result backend) as their args and
    attributes, and unpickled without calling __init__, whose parameters
    are not their args (RatchetError(status, code, message...) was pickled
    as its text alone, and unpickling raised TypeError in place of it)."""

    def __reduce__(self) -> Any:
        return _unpickled, (type(self), self.args, self.__dict__)


def _unpickled(cls: Any, args: Any, state: Dict[str, Any]) -> Any:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


def _detail_strings(value: Any) -> List[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


class ValidationProblem(TypedDict):
    """One problem of a value refused as invalid: the field's dotted path
    from the body's root, and why. Declared here, where
    RatchetError.validation answers them, so that getratchet.types (which
    imports this module) can export it without a circular import."""
    field: str
    message: str


def _error_text(status: int, code: str, message: str, detail: Dict[str, Any], request_id: str) -> str:
    """The text of a RatchetError, as the Go SDK's: what a 403's key lacks
    (detail.any_of or detail.required) and the request id to quote."""
    # Empty parts are left out, as the Go SDK's text leaves them.
    text = f"ratchet: {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    detail = detail if isinstance(detail, dict) else {}
    any_of, required = _detail_strings(detail.get("any_of")), _detail_strings(detail.get("required"))
    if any_of:
        text += " (requires one of " + ", ".join(any_of) + ")"
    elif required:
        text += " (requires " + ", ".join(required) + ")"
    if request_id:
        text += f" (request {request_id})"
    return text


class RatchetError(_SDKError):
    """A failure the API answered: its HTTP status and the stable ``code``.

    ``detail`` is the envelope's detail object (``validation``,
    ``required``, ``retry_after_seconds``...), ``request_id`` the response's
    ``X-Request-Id`` to quote to support.
    """

    def __init__(self, status: int, code: str, message: str,
                 detail: Optional[Dict[str, Any]] = None, request_id: str = "",
                 body: Any = None) -> None:
        super().__init__(_error_text(status, code, message, detail or {}, request_id))
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail or {}
        self.request_id = request_id
        # The whole decoded answer, for a denied begin's decision fields.
        self.body = body
        # Set when an earlier attempt of the same call may have acted (its
        # answer lost, a 5xx) and this answer only ended the retries.
        self._unconfirmed = False

    @property
    def retry_after_seconds(self) -> int:
        """The wait the server asked for (a 429's or a retry_request's), or 0."""
        value = self.detail.get("retry_after_seconds")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return 0

    @property
    def required(self) -> List[str]:
        """detail.required of a 403 forbidden: the scopes (or
        ``tool:name@version``) the key lacks; [] otherwise."""
        return _detail_strings(self.detail.get("required"))

    @property
    def any_of(self) -> List[str]:
        """detail.any_of of a 403 forbidden from a route that any one of
        several scopes opens (holding one is enough), as Go's AnyOf(); []
        otherwise."""
        return _detail_strings(self.detail.get("any_of"))

    @property
    def resets_at(self) -> Optional[str]:
        """detail.resets_at of a budget_exceeded, key_budget_exceeded or
        dimension_limit_exceeded denial (an RFC 3339 time: when its UTC day
        window rolls over), or None."""
        value = self.detail.get("resets_at")
        return value if isinstance(value, str) and value else None

    @property
    def dimension(self) -> Optional[str]:
        """detail.dimension of a dimension_limit_exceeded denial, or None."""
        value = self.detail.get("dimension")
        return value if isinstance(value, str) and value else None

    @property
    def validation(self) -> List[ValidationProblem]:
        """The fields a 400 invalid_request refused: [{"field", "message"}]."""
        value = self.detail.get("validation")
        return value if isinstance(value, list) else []

    @property
    def may_have_applied(self) -> bool:
        """Whether the call may have been applied despite this answer: a 5xx
        other than a database_unavailable that says nothing was applied, or
        any answer that ended the retries of a call an earlier attempt of
        which may have been applied (its answer lost, such a 5xx), as the Go
        SDK's MayHaveApplied says."""
        if self._unconfirmed:
            return True
        if self.status < 500:
            return False
        return not (self.code == DATABASE_UNAVAILABLE
                    and self.detail.get("outcome") == "not_applied")


class ConnectionLost(_SDKError):
    """The answer to a call was lost (a network failure or a timeout): the
    call may have been applied. Calls that are safe to repeat are retried
    before this is raised."""


class RetryableError(_SDKError):
    """Raise from a handler: the attempt failed and the job should run again.

    ``retry_after_ms`` asks for at least that long before the next attempt;
    the server waits the longer of it and the policy's own delay, never
    bypassing a pause, an open circuit or the attempt limit. It is rounded
    up to whole milliseconds and clamped into the API's 1 000 to 86 400 000
    (as the Go SDK does; infinity too), so raising one never fails; anything
    but a number, or NaN, is no hint.
    """

    def __init__(self, message: str, retry_after_ms: Optional[float] = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_ms: Optional[int] = None
        if isinstance(retry_after_ms, int) and not isinstance(retry_after_ms, bool):
            # Never NaN; one beyond a float's range (10**400) is clamped too
            # (review: math.isnan raised OverflowError on it).
            self.retry_after_ms = clamp_retry_after_ms(retry_after_ms)
        elif isinstance(retry_after_ms, float) and not math.isnan(retry_after_ms):
            # Infinity ("not before long") is clamped as a huge hint is (SDK
            # QA: dropped, it was retried sooner than a finite one).
            ms = retry_after_ms if math.isfinite(retry_after_ms) else math.copysign(MAX_RETRY_AFTER_MS, retry_after_ms)
            self.retry_after_ms = clamp_retry_after_ms(math.ceil(ms))


class NonRetryableError(_SDKError):
    """Raise from a handler: the attempt failed for good and the job ends
    EXHAUSTED without another attempt."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidDecisionError(_SDKError):
    """Passed to a worker's ``on_error`` when a tool's ``classify_error``
    returned a decision the API cannot take as it is. The job is reported
    retryable without a hint, or, when only the hint was out of range
    (``clamped``), with the hint clamped into 1 s to 24 h."""

    def __init__(self, tool: str, decision: Any, clamped: bool = False) -> None:
        what = ("a retry hint outside 1000-86400000 ms; sent clamped" if clamped
                else "an invalid decision; treated as retryable")
        super().__init__(f"ratchet: classify_error of {tool} returned {what}")
        self.tool = tool
        self.decision = decision
        self.clamped = clamped


class ReportNotRecorded(_SDKError):
    """Passed to a worker's ``on_error`` when a job's report was refused or
    could not be delivered, or was never sent because a stop gave the job
    up (its handler still running when the stop grace ended, or a second
    interrupt): the job's lease lapses and it runs again (or, on its last
    attempt, ends EXHAUSTED). ``what`` is "not_recorded", or
    "output_refused" when the server refused a success's output and a
    failure is reported instead, or "retrying" when nothing is lost yet:
    the report's delivery has kept failing for a reason that may pass (an
    outage, 429s) and is still retried, told every 30 s while it does (the
    Go SDK's OnError is told the same); ``job_id`` and ``attempt`` name the
    attempt, and ``__cause__`` is the call's error (a RatchetError, a
    ConnectionLost), when there is one (none for a job a stop gave up)."""

    def __init__(self, message: str, *, job_id: str = "", attempt: int = 0, what: str = "not_recorded",
                 cause: Optional[BaseException] = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.attempt = attempt
        self.what = what
        self.__cause__ = cause


class LeaseLost(_SDKError):
    """Passed to a worker's ``on_error`` when a job's attempt lost its lease
    while its handler ran, which is then cancelled as "lease_lost": a
    heartbeat was refused for good (``__cause__`` is the RatchetError: 409
    lease_lost or invalid_state, 404, 403), or the lease passed its end by
    this process's clock while heartbeats failed (``__cause__`` None). The
    job runs again once its lease lapses, unless the refusal says it ended.
    ``job_id``, ``attempt`` and ``tool`` ("name@version") name the attempt
    (the Go SDK's LeaseLostError, the TypeScript SDK's LeaseLostError)."""

    def __init__(self, *, job_id: str, attempt: int, tool: str, cause: Optional[BaseException] = None) -> None:
        what = ("no longer holds its lease" if cause is not None
                else "no heartbeat extended its lease before it lapsed")
        super().__init__(f"ratchet: job {job_id} attempt {attempt} ({tool}): {what}")
        self.job_id = job_id
        self.attempt = attempt
        self.tool = tool
        self.__cause__ = cause


def clamp_retry_after_ms(value: int) -> int:
    """A hint moved into the API's range: a shorter one waits 1 s, a longer
    one 24 h."""
    return min(max(value, MIN_RETRY_AFTER_MS), MAX_RETRY_AFTER_MS)


# The effect gate's decisions other than execute and duplicate, raised by
# Ratchet.do_effect.

class PriorAttempt(TypedDict):
    """The attempt whose outcome is unknown, which a probe must check first
    (a blocked begin names it too). Declared here, where EffectBlocked
    holds one, so that getratchet.types (which imports this module) can
    export it without a circular import."""
    attempt: int
    started_at: Optional[str]
    lease_expired_at: Optional[str]


class EffectBlocked(_SDKError):
    """A prior attempt's outcome is unknown: verify at the vendor, then have
    an operator resolve the effect (POST /effects/{id}/resolve)."""

    def __init__(self, effect_id: str, prior_attempt: Optional[PriorAttempt]) -> None:
        super().__init__(f"ratchet: effect {effect_id} is blocked: a prior attempt's outcome is unknown")
        self.effect_id = effect_id
        self.prior_attempt = prior_attempt


class ApprovalRequired(_SDKError):
    """An operator decision is pending: poll, or wait for the webhook."""

    def __init__(self, effect_id: str, approval_id: str) -> None:
        super().__init__(f"ratchet: effect {effect_id} awaits approval {approval_id}")
        self.effect_id = effect_id
        self.approval_id = approval_id


class EffectDenied(_SDKError):
    """Policy, budget, breaker or rejection: report the reason, do not work
    around it. ``code`` is the denial's error code (policy_denied,
    budget_exceeded, circuit_open...), ``error`` the whole RatchetError,
    ``request_id`` the answer's X-Request-Id to quote to support."""

    def __init__(self, effect_id: str, error: RatchetError) -> None:
        super().__init__(f"ratchet: effect {effect_id} denied: {error.code}")
        self.effect_id = effect_id
        self.code = error.code
        self.error = error
        self.request_id = error.request_id


class EffectInFlight(_SDKError):
    """Another caller still held the effect's lease when do_effect stopped
    waiting (its ``in_flight_timeout``)."""

    def __init__(self, effect_id: str) -> None:
        super().__init__(f"ratchet: effect {effect_id} is still in flight elsewhere")
        self.effect_id = effect_id


class NotPerformed(_SDKError):
    """Raise from a do_effect action when the action surely did not reach
    the outside world: the attempt is reported ``failed`` and a later caller
    may try again. Any other exception reports nothing, so the lease lapses
    and the outcome is honestly indeterminate. ``report_error`` is set when
    reporting the failure failed too (the lease then lapses), else None."""

    report_error: Optional[BaseException] = None


class ResultNotStored(_SDKError):
    """The action succeeded but the gate refused its result (too large, or
    refused field): a placeholder result was recorded instead, so the key is
    settled. ``result`` is the action's own result."""

    def __init__(self, effect_id: str, reason: str, result: Any) -> None:
        super().__init__(f"ratchet: effect {effect_id} succeeded, but the gate refused its result ({reason}); "
                         "a placeholder was recorded")
        self.effect_id = effect_id
        self.reason = reason
        self.result = result


class OutcomeNotReported(_SDKError):
    """The action succeeded but its report failed (refused, or its answers
    lost while the lease stood): ``result`` is the action's result, and
    ``cause`` says why. If the report's answer was lost it may have been
    recorded; if not, the lease lapses and the outcome is indeterminate
    (the key's next begin says which)."""

    def __init__(self, effect_id: str, result: Any, cause: BaseException) -> None:
        super().__init__(f"ratchet: effect {effect_id} succeeded, but its report failed: {cause}")
        self.effect_id = effect_id
        self.result = result
        self.cause = cause


# Verifying a webhook delivery (verify_webhook).

class WebhookSignatureError(_SDKError):
    """verify_webhook's answer to a delivery whose Ratchet-Signature is
    missing, malformed, wrong or outside the tolerance: not Ratchet's, or
    replayed (answer it 401). ``reason`` says which; it never holds the
    secret."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"ratchet: webhook signature does not verify: {reason}")
        self.reason = reason


class NoWebhookSecretError(_SDKError):
    """verify_webhook's answer when the receiver has no secret to check with
    (an unset variable, say): with an empty key anyone could sign, so
    nothing is accepted. A misconfiguration, not a forged delivery, so it is
    not a WebhookSignatureError."""

    def __init__(self) -> None:
        super().__init__("ratchet: no webhook secret to verify with")

"""What a worker without on_error does with its problems: one safe line each
to the standard logging module, paced (the Go SDK's failureLog)."""

from __future__ import annotations

import http.client
import logging
import socket
import time
import urllib.error
import urllib.parse
from typing import Any, Callable, Optional, Tuple

from .errors import ConnectionLost, LeaseLost, RatchetError, ReportNotRecorded

try:
    import ssl
except ImportError:  # pragma: no cover - a Python built without it
    ssl = None  # type: ignore[assignment]

LOGGER = logging.getLogger("getratchet.worker")

# The least time (seconds) between two failure lines: a server down for
# hours costs a line a minute, not one a failed claim, heartbeat and report
# (the Go SDK's failureLogEvery).
LOG_EVERY = 60.0

_HINT = "(set on_error to see it)"


class FailureLog:
    """Decides the default log's lines (worker QA: a worker retrying against
    a dead or misconfigured server was silent for ever): the first failure at
    once, then at most one line every LOG_EVERY seconds, which counts the
    failures left out since the line before; and, once a registration or
    claim succeeds after a line told of a failed call to the server, one line
    saying after how many such failures it recovered. A line holds none of an
    error's text, which may hold payload details (see summary). Not
    thread-safe: the worker calls it under a lock of its own, from its
    on_error thread, in the order the problems were told, each with the time
    it was told (at; now() when None)."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self._last: Optional[float] = None  # when the last failure line was logged
        self._left = 0  # failures since then that were not logged
        self._failures = 0  # failed calls to the server since the last recovery
        self._outage = False  # a line told of a failed call, and no recovery line followed

    def failure(self, error: BaseException, at: Optional[float] = None) -> Optional[str]:
        """The line to log for error, or None when it is left out."""
        text, call = summary(error)
        if call:
            self._failures += 1
        now = self.now() if at is None else at
        if self._last is not None and now - self._last < LOG_EVERY:
            self._left += 1
            return None
        if self._left:
            text += f" more_since_last_line={self._left}"
        self._last, self._left = now, 0
        self._outage = self._outage or call
        return "ratchet worker: " + text

    def refusal(self, error: BaseException, at: Optional[float] = None) -> str:
        """The line to log for error, a refusal that stopped the worker:
        logged whatever the pacing, since it says why the worker claims no
        more, with the count of those left out before it."""
        text, call = summary(error)
        if call:
            self._failures += 1
        if self._left:
            text += f" more_since_last_line={self._left}"
        self._last, self._left = self.now() if at is None else at, 0
        return "ratchet worker refused: " + text

    def stopped(self) -> Optional[str]:
        """The line to log when the worker stops: the count of the problems
        left out since the last line (worker QA: they were dropped), or None
        when none was."""
        if not self._left:
            return None
        left, self._left = self._left, 0
        return f"ratchet worker stopped: more_since_last_line={left}"

    def recovered(self) -> Optional[str]:
        """The line to log when a registration or claim succeeded: None
        unless a line told of a failed call since the last recovery."""
        failures, self._failures = self._failures, 0
        if not self._outage:
            return None
        self._outage = False
        return f"ratchet worker: recovered after {failures} failures"


def summary(error: BaseException) -> Tuple[str, bool]:
    """error without its text, and whether it is a failed call to the
    server: an API error by its status, code and request id (never its
    message or detail) and the call it answered; a network failure by its
    kind and the call it failed on (method, host and path, never the query or
    a body); anything else (a handler's or classifier's exception, an invalid
    decision, an output that is not JSON) by its class alone, with a hint. A
    report not recorded is named by what became of it, its job id and
    attempt, then its cause as above (the Go SDK's shape), and a lost lease
    by lease=lapsed or lost, its job id, attempt and tool (name@version),
    then the heartbeat's refusal as above; neither is a failed call to the
    server (the recovery line counts none)."""
    if isinstance(error, ReportNotRecorded) and error.what == "retrying" and error.__cause__ is not None:
        # A report still retried is logged as its delivery's failure, a
        # failed call to the server, as the Go SDK logs its notice (which
        # wraps that failure).
        return summary(error.__cause__)
    if isinstance(error, ReportNotRecorded) and error.job_id:
        # Not counted as a failed call to the server: it answered it (or the
        # stop gave it up), and no recovery line is owed for it.
        text = summary(error.__cause__)[0] if error.__cause__ is not None else f"error=ReportNotRecorded {_HINT}"
        return f"report={_token(error.what)} job_id={_token(error.job_id)} attempt={int(error.attempt)} {text}", False
    if isinstance(error, LeaseLost) and error.job_id:
        # Nor is a lost lease: the server answered the heartbeat that lost
        # it, or the failures that let it lapse were counted already.
        what, text = ("lost", " " + summary(error.__cause__)[0]) if error.__cause__ is not None else ("lapsed", "")
        return (f"lease={what} job_id={_token(error.job_id)} attempt={int(error.attempt)} "
                f"tool={_token(error.tool, 200)}{text}"), False
    if isinstance(error, RatchetError):
        text = f"error=api status={error.status}"
        if error.code:
            text += f" code={_token(error.code)}"
        if error.request_id:
            text += f" request_id={_token(error.request_id)}"
        return text + _call(getattr(error, "_call", None)), True
    if isinstance(error, ConnectionLost):
        kind = getattr(error, "_kind", None) or type(error).__name__
        return f"error=network kind={_quote(kind)}" + _call(getattr(error, "_call", None)), True
    if isinstance(error, (OSError, http.client.HTTPException)):
        request = getattr(error, "request", None)  # a requests exception's
        url = getattr(request, "url", None)
        call = None
        if isinstance(url, str):
            parts = urllib.parse.urlsplit(url)
            call = (getattr(request, "method", "") or "", parts.netloc.rpartition("@")[2], parts.path)
        return f"error=network kind={_quote(net_kind(error))}" + _call(call), True
    return f"error={type(error).__name__} {_HINT}", False


def net_kind(failure: BaseException) -> str:
    """A transport failure by what it is, never by its text."""
    if isinstance(failure, urllib.error.URLError) and isinstance(failure.reason, BaseException):
        failure = failure.reason
    if isinstance(failure, socket.gaierror):
        return "dns"
    if isinstance(failure, ConnectionRefusedError):
        return "connection refused"
    if isinstance(failure, ConnectionResetError):
        return "connection reset"
    if isinstance(failure, TimeoutError):  # socket.timeout too
        return "timeout"
    if isinstance(failure, (http.client.RemoteDisconnected, http.client.IncompleteRead, BrokenPipeError,
                            ConnectionAbortedError)):
        return "connection closed"
    if ssl is not None and isinstance(failure, ssl.SSLError):
        return "tls"
    return type(failure).__name__


def _call(call: Any) -> str:
    if not call:
        return ""
    method, host, path = call
    return f" method={_token(method)} host={_token(host)} path={_token(path, 200)}"


def _token(value: Any, most: int = 64) -> str:
    """A code, request id, host or path as one word: cut, and printable
    ASCII only, as a server (or a proxy posing as one) may send anything."""
    return "".join(c if "!" <= c <= "~" else "?" for c in str(value)[:most])


def _quote(kind: str) -> str:
    return f'"{kind}"' if " " in kind else _token(kind)

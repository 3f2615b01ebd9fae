"""One HTTP call to the API, with the retries that are safe for it, over
connections kept alive between calls."""

from __future__ import annotations

import base64
import http.client
import math
import os
import random
import secrets
import select
import socket
import threading
import time
import urllib.parse
import urllib.request
import weakref
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type

try:
    import ssl
except ImportError:  # a Python built without OpenSSL still speaks plain http
    ssl = None  # type: ignore[assignment]

from . import _json
from ._failurelog import net_kind
from .errors import (DATABASE_UNAVAILABLE, REQUEST_TIMEOUT, RETRY_REQUEST, ConnectionLost,
                     RatchetError)

VERSION = "0.2.7"
DEFAULT_BASE_URL = "https://getratchet.app"

# Capped exponential backoff with equal jitter, as the Go SDK's.
BACKOFF_BASE = 0.5
BACKOFF_CAP = 8.0
# A 429's wait is cut to the rate windows' minute.
MAX_RATE_LIMIT_WAIT = 60
# ... and lengthened by up to a fifth of it, drawn at random (never
# shortened), as the Go SDK's retryAfterSpread: the limiter tells every client
# it refused in one of its one-minute windows to come back at that window's
# end, and waiting exactly that long brought them all back at the same
# instant, most to be refused again. A 503's Retry-After (a proxy's
# maintenance page, a host shedding load) is spread the same: every client it
# turned away was told the same instant (it was waited exactly).
_RETRY_AFTER_SPREAD = 5


def spread_retry_after(seconds: float, drawn: float) -> float:
    """The wait after a Retry-After that asked for seconds (a 429's or a
    503's): never less, and up to a fifth more, drawn (in [0, 1)). The
    transport's retries and the worker's waits spread theirs alike."""
    return seconds + drawn * seconds / _RETRY_AFTER_SPREAD
# How often a call sent under an Idempotency-Key waits while the server
# still holds the key for an earlier attempt (409 retry_request).
MAX_KEY_HELD_WAITS = 40
# Idle connections kept per Transport: more than a worker's claim, reports
# and heartbeats need at once; a busier moment opens more, closed after.
MAX_IDLE_CONNECTIONS = 8

# How a kept connection the server closed while it sat idle (its keep-alive
# timeout) fails the next request before any answer comes back.
_STALE: Tuple[Type[BaseException], ...] = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
if ssl is not None:
    _STALE += (ssl.SSLEOFError,)


# Why a key is refused that no HTTP header can carry; never the key itself.
KEY_UNSENDABLE = ("ratchet: the API key holds a line break, a control character or a character beyond ASCII, "
                  "which no key holds and no Authorization header can carry (read it without its line end)")


def _header_unsendable(header: str) -> str:
    """Why an Idempotency-Key or a User-Agent is refused that no header can
    carry, before anything is sent; never the value itself."""
    return (f"ratchet: the {header} holds a line break, a control character or a character beyond ASCII, "
            "which no header can carry")


# Why an id or a name of "." or ".." is refused: a URL resolves it as a path
# step, so the call would reach another route (GET /runs/.. is GET /api/v1).
DOT_SEGMENT = ('ratchet: an id or a name of "." or ".." cannot be sent: '
               "a URL reads it as a path step, calling another route")


def _dot_segment(path: str) -> bool:
    """Whether path (its query aside) has a "." or ".." step."""
    return any(seg in (".", "..") for seg in path.split("?", 1)[0].split("/"))


def _sendable_key(key: str) -> bool:
    """Whether key is printable ASCII (spaces and tabs allowed: the server
    trims them around it), the only characters a key has, as the Go and
    TypeScript SDKs check it; an Idempotency-Key and a User-Agent are held
    to the same."""
    return all(c == "\t" or " " <= c <= "~" for c in key)


def new_request_id() -> str:
    """A random id for an Idempotency-Key, a begin's request_id or a claimId."""
    return secrets.token_hex(16)


def path_id(value: str) -> str:
    """A path segment with everything but letters, digits and - . _ ~
    percent-encoded (a tool named "a&b" must reach the route as that name)."""
    return urllib.parse.quote(value, safe="")


class Abort:
    """Cuts the calls made with it (a worker's report deliveries at its
    stop's give-up time): fire() shuts the connection of each call in flight,
    whose blocked read then ends at once, and every call made after fails
    before it is sent. Python cannot interrupt a thread blocked in a read;
    shutting its socket is the one way to end the read from another. reason
    is what a call it cut says ended it."""

    def __init__(self, reason: str = "given up", *, cuts_answers: bool = False) -> None:
        self.reason = reason
        # Whether an answer read by a call it cut is thrown away: a call's
        # bound (the answer came too late, or cut short by the shutdown);
        # a worker's stop keeps an answer it may still read only when its
        # framing proves it whole (see _once).
        self.cuts_answers = cuts_answers
        self._lock = threading.Lock()
        self._fired = False
        self._event = threading.Event()
        # Each call's connection and the socket it had when attached: once
        # an answer says Connection: close, http.client drops connection.sock
        # while the body is still read from that socket, which fire() must
        # shut all the same.
        self._connections: Dict[http.client.HTTPConnection, Optional[socket.socket]] = {}
        self._linked: Set[threading.Event] = set()  # events set when it fires (_wait_either)

    @property
    def fired(self) -> bool:
        return self._fired

    def wait(self, seconds: float) -> bool:
        """Waits seconds, or until it fires; answers whether it fired."""
        return self._event.wait(seconds)

    def fire(self) -> None:
        with self._lock:
            self._fired = True
            self._event.set()
            socks = list(self._connections.values())
            for event in self._linked:
                event.set()
        for sock in socks:
            _shut(sock)

    def _attach(self, connection: http.client.HTTPConnection) -> bool:
        with self._lock:
            if self._fired:
                return False
            self._connections[connection] = connection.sock
            return True

    def _detach(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._connections.pop(connection, None)

    def _link(self, event: threading.Event) -> None:
        with self._lock:
            self._linked.add(event)
            if self._fired:
                event.set()

    def _unlink(self, event: threading.Event) -> None:
        with self._lock:
            self._linked.discard(event)


def _wait_either(seconds: float, *aborts: Optional[Abort]) -> bool:
    """Waits seconds, or until one of the aborts fires; answers whether one
    fired. A thread waits on one event: each abort sets it when it fires."""
    either = threading.Event()
    linked = [a for a in aborts if a is not None]
    for abort in linked:
        abort._link(either)
    try:
        return either.wait(seconds)
    finally:
        for abort in linked:
            abort._unlink(either)


def _shut(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    try:
        # The plain socket's shutdown, under TLS too: the TLS layer's own
        # would drop its state under the reading thread.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: nothing left to cut


# Every Transport of this process, for _after_fork.
_TRANSPORTS: "weakref.WeakSet[Transport]" = weakref.WeakSet()


def _after_fork() -> None:
    """In a child process made by fork (gunicorn's --preload, a
    multiprocessing or Celery prefork pool) of a process whose client had
    made a call: each Transport forgets the connections it kept, whose
    sockets the child shares with its parent and its siblings (two processes
    reading one socket read each other's answers: a begin answered another
    process's execute, its lease token with it), and draws its jitter afresh
    (the children drew the same backoffs, coming back to a server at the
    same moments). Its locks are made anew: one held by a thread of the
    parent at the fork stays held for ever in the child, whose only thread
    is the one that forked. Closing a kept connection here closes the
    child's copy of its socket only: the parent's stays open, and no TLS
    close_notify is sent."""
    for transport in list(_TRANSPORTS):
        transport._idle_lock = threading.Lock()
        transport._jitter_lock = threading.Lock()
        transport._jitter.seed()
        idle, transport._idle = transport._idle, []
        for connection in idle:
            try:
                connection.close()
            except OSError:
                pass


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_after_fork)


class Transport:
    """Sends calls to one API base URL with one key. Thread-safe, and
    safe to use in a child process that forked after it made calls (the
    child opens connections of its own)."""

    def __init__(self, base_url: Optional[str], api_key: str, timeout: float = 60.0,
                 max_retries: int = 3, user_agent: str = "",
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not api_key:
            raise ValueError("ratchet: an API key is required (read it from the environment)")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            # Refused as a method's timeout is: 0 timed every call out at
            # once (a lost answer, repeated: a worker's registration for
            # ever), a negative one or NaN raised ValueError at each call.
            raise ValueError("ratchet: timeout must be a positive number of seconds")
        if not _sendable_key(api_key):
            # Never sent: http.client refused it at each call with a
            # ValueError that printed the whole key (a secret file read with
            # its line end, open(path).read()).
            raise ValueError(KEY_UNSENDABLE)
        if not _sendable_key(user_agent):
            # Refused as the key is: http.client refused it at each call
            # with a ValueError that printed it.
            raise ValueError(_header_unsendable("user agent"))
        # A trailing /api/v1 is accepted, as the Go SDK accepts it (a base
        # URL copied from the API's own paths went to /api/v1/api/v1/...,
        # every call 404 not_found, where a Go client of the same setting
        # worked).
        base = (base_url or DEFAULT_BASE_URL).rstrip("/")
        if base.endswith("/api/v1"):
            base = base[:-len("/api/v1")]
        parsed = urllib.parse.urlparse(base)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError("ratchet: base_url must be an http(s) URL")
        if parsed.username is not None or parsed.password is not None:
            # Refused, as the TypeScript and Go SDKs refuse it: the API key
            # is the credential, and a user and password stripped silently
            # left a reader of the setting thinking they were sent. The
            # message leaves them out.
            raise ValueError("ratchet: base_url must not hold credentials (user:password@); "
                             "the API key is the credential")
        self.base = base
        self._key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.user_agent = ((user_agent + " ") if user_agent else "") + f"getratchet-python/{VERSION}"
        self.sleep = sleep
        self._jitter = random.Random()
        self._jitter_lock = threading.Lock()
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or ""
        self._port = parsed.port
        self._prefix = parsed.path.rstrip("/") + "/api/v1"
        # The proxy the environment names for base_url, as urllib honoured
        # it (HTTPS_PROXY / HTTP_PROXY, NO_PROXY): https goes through a
        # CONNECT tunnel, plain http as absolute-URI requests to it.
        self._proxy = _proxy_for(parsed)
        self._proxy_auth = _proxy_authorization(self._proxy)
        self._netloc = parsed.netloc  # no userinfo: refused above
        origin = f"{parsed.scheme}://{self._netloc}"
        self._target = (origin if self._proxy and not self._https else "") + self._prefix
        self._tls: Any = None  # one TLS context for every connection (loading the CAs is not free)
        # Connections between calls, the most recently used last. A
        # connection is either here or held by the one call using it.
        self._idle: List[http.client.HTTPConnection] = []
        self._idle_lock = threading.Lock()
        self._closed = False
        _TRANSPORTS.add(self)  # its kept connections are not a forked child's (_after_fork)

    def call(self, method: str, path: str, body: Any = None, *, safe: bool,
             idempotency_key: Optional[str] = None, timeout: Optional[float] = None,
             max_retries: Optional[int] = None, with_date: bool = False, abort: Optional[Abort] = None,
             retry_cutoff: Optional[Abort] = None, call_timeout: Optional[float] = None,
             read: Optional[Callable[[Dict[str, Any], str], Any]] = None) -> Any:
        """Sends method path (under /api/v1) and returns the decoded answer.

        safe says whether the call may be repeated after an answer was lost
        (network failure, timeout, 5xx): true for calls made idempotent by a
        key, an Idempotency-Key or a lease token. Failures the server says
        changed nothing (429, retry_request, 408, a database_unavailable
        with outcome not_applied) are repeated for any call. with_date
        returns (answer, the response's Date as a datetime or None), for
        lease lengths measured by the server's own clock. A call made with
        an abort that fires is not repeated: it fails with ConnectionLost
        when an attempt may have been applied, else with its last failure.
        retry_cutoff, once fired, ends the waits between attempts the same
        way but leaves an attempt in flight alone (a stopping worker's claim
        waiting out a 429). call_timeout (seconds, a caller's per-call
        timeout) bounds the whole call, its retries and the waits between
        them included, as a Go context's deadline does, in place of the
        per-attempt timeout: each attempt is given the time left, and cut at
        the bound (ConnectionLost "timeout"), and a wait that would end past
        the bound is not begun: the call raises its last failure at once
        (marked unconfirmed when an attempt may have been applied). read,
        when given, reads a 2xx answer against the request (with the
        response's X-Request-Id) and returns what call returns; its
        ValueError makes the answer unreadable, a lost answer as one cut
        short (a batch report's results naming other jobs).
        """
        # Refused before sending: http.client refused such a key at each
        # attempt with a ValueError that printed it, and a ".." id reached
        # another route.
        if idempotency_key and not _sendable_key(idempotency_key):
            raise ValueError(_header_unsendable("Idempotency-Key"))
        if _dot_segment(path):
            raise ValueError(DOT_SEGMENT)
        if call_timeout is None:
            return self._call(method, path, body, safe=safe, idempotency_key=idempotency_key, timeout=timeout,
                              max_retries=max_retries, with_date=with_date, abort=abort, retry_cutoff=retry_cutoff,
                              read=read)
        if isinstance(call_timeout, bool) or not (isinstance(call_timeout, (int, float))
                                                 and 0 < call_timeout < math.inf):
            raise ValueError("ratchet: timeout must be a positive number of seconds")
        deadline = time.monotonic() + call_timeout
        if abort is not None:  # the worker's own cut-offs: the sockets' timeouts bound each attempt
            return self._call(method, path, body, safe=safe, idempotency_key=idempotency_key, timeout=timeout,
                              max_retries=max_retries, with_date=with_date, abort=abort, retry_cutoff=retry_cutoff,
                              deadline=deadline, read=read)
        # A socket's timeout bounds each read, not the answer: one trickled
        # a byte at a time would outlast it. The bound shuts the socket of an
        # attempt still in flight, as a worker's stop does.
        cut = Abort("timeout", cuts_answers=True)
        timer = threading.Timer(call_timeout, cut.fire)
        timer.daemon = True
        timer.start()
        try:
            return self._call(method, path, body, safe=safe, idempotency_key=idempotency_key, timeout=timeout,
                              max_retries=max_retries, with_date=with_date, abort=cut, retry_cutoff=retry_cutoff,
                              deadline=deadline, sleep_through=cut, read=read)
        finally:
            timer.cancel()

    def _call(self, method: str, path: str, body: Any, *, safe: bool, idempotency_key: Optional[str],
              timeout: Optional[float], max_retries: Optional[int], with_date: bool, abort: Optional[Abort],
              retry_cutoff: Optional[Abort], deadline: Optional[float] = None,
              sleep_through: Optional[Abort] = None,
              read: Optional[Callable[[Dict[str, Any], str], Any]] = None) -> Any:
        """call, within deadline (time.monotonic()) when given; waits
        between attempts are plain sleeps when abort is sleep_through (the
        bound's own cut, which never fires during a wait that ends before
        it)."""
        data = None if body is None else _json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")
        retries = self.max_retries if max_retries is None else max_retries
        attempt = 0
        held = 0
        unsure = False  # an attempt may have been applied
        while True:
            # With a bound on the call, each attempt has the time left (a
            # socket timeout of 0 would not block at all).
            per_attempt = (timeout or self.timeout) if deadline is None else max(deadline - time.monotonic(), 0.001)
            polled = False  # a wait for a held key, not a retry
            try:
                answer, date = self._once(method, path, data, idempotency_key, per_attempt, safe, abort, read)
                return (answer, date) if with_date else answer
            except RatchetError as err:
                unsure = unsure or err.may_have_applied
                failure: Exception = err
                if idempotency_key and err.code == RETRY_REQUEST and held < MAX_KEY_HELD_WAITS and retries > 0:
                    # The server still acts on an earlier attempt under this
                    # key: wait as asked, outside the retry bound (but not
                    # with retries off, as the Go SDK's). The wait ends as a
                    # retry's does, at the abort or the retry cut-off too (a
                    # stopping worker's registration slept it out, past the
                    # stop's deadline, where Go's ends at the cut-off).
                    held += 1
                    polled = True
                    wait: float = max(err.retry_after_seconds, 1)
                else:
                    delay = self.retry_delay(err, attempt, safe)
                    if delay is None or attempt >= retries:
                        # An earlier attempt may have acted: this answer only
                        # says why the retries stopped (Go's unconfirmed).
                        err._unconfirmed = err._unconfirmed or unsure
                        raise
                    wait = delay
            except ConnectionLost as err:
                unsure = True
                if not safe or attempt >= retries or (abort is not None and abort.fired):
                    raise
                wait, failure = self.backoff(attempt), err
            if deadline is not None and time.monotonic() + wait >= deadline:
                # Waiting would outlive the call's bound: its last failure
                # now, as Go's (a serverless caller gets its time back).
                if isinstance(failure, RatchetError):
                    failure._unconfirmed = failure._unconfirmed or unsure
                raise failure
            if not polled:
                attempt += 1
            if (abort is None or abort is sleep_through) and retry_cutoff is None:
                self.sleep(wait)
            elif _wait_either(wait, abort, retry_cutoff):
                # Cut while waiting (a claim's 429 at a stop): the caller
                # learns whether anything may have been applied.
                raise self._cut_while_waiting(failure, unsure, method, path)

    def call_until(self, method: str, path: str, body: Any, *, may_wait: Callable[[float], bool],
                   on_retry: Callable[[], None] = lambda: None,
                   stop_on: Callable[[Exception], bool] = lambda err: False,
                   timeout: Optional[float] = None, abort: Optional[Abort] = None,
                   on_attempt: Callable[[], None] = lambda: None,
                   read: Optional[Callable[[Dict[str, Any], str], Any]] = None,
                   bare_may_pass: bool = False) -> Any:
        """Sends a call that is safe to repeat (a report), repeating it
        through every failure worth repeating for as long as may_wait(wait)
        allows the next wait (seconds) and abort has not fired; on_attempt
        runs before each attempt is sent, on_retry before each wait. Raises
        the last failure: a refusal, one may_wait gave up on, the abort's
        ConnectionLost, or a failure worth repeating (a RatchetError, a
        ConnectionLost) that stop_on(failure), told of each, says to hand
        back. An abort that fires while it waits between attempts ends the
        wait, as call's does: its last failure is raised (a ConnectionLost
        once an attempt may have been applied). read as call's.
        bare_may_pass repeats a 4xx without Ratchet's error envelope (no
        code: a proxy's or a load balancer's answer during a deploy or a
        misroute, a 404, a 408) as a 5xx, but a bare 413 (a body refused
        for good): a job's report (the Go SDK's reporter.retryDelay)."""
        attempt = 0
        unsure = False  # an attempt may have been applied
        while True:
            on_attempt()
            failure: Exception
            try:
                return self.call(method, path, body, safe=True, max_retries=0, timeout=timeout, abort=abort, read=read)
            except RatchetError as err:
                unsure = unsure or err.may_have_applied
                wait = self.retry_delay(err, attempt, True)
                if wait is None and bare_may_pass and not err.code and 400 <= err.status < 500 and err.status != 413:
                    wait = self.backoff(attempt)
                if wait is None or stop_on(err) or not may_wait(wait) or (abort is not None and abort.fired):
                    err._unconfirmed = err._unconfirmed or unsure
                    raise
                failure = err
            except ConnectionLost as lost:
                unsure = True
                wait = self.backoff(attempt)
                if (abort is not None and abort.fired) or stop_on(lost) or not may_wait(wait):
                    raise
                failure = lost
            on_retry()
            attempt += 1
            if abort is None:
                self.sleep(wait)
            elif _wait_either(wait, abort):
                # The abort ends the wait as it cuts an attempt in flight (a
                # worker's report waiting out a 429's minute when the stop
                # gave up slept it out, the stop's bound passed: review).
                raise self._cut_while_waiting(failure, unsure, method, path)

    def _cut_while_waiting(self, failure: Exception, unsure: bool, method: str, path: str) -> Exception:
        """What a call an abort cut while it waited between attempts raises:
        its last failure, or a ConnectionLost when an attempt may have been
        applied (unsure) and the last failure does not say so."""
        if unsure and not isinstance(failure, ConnectionLost):
            return self._called(ConnectionLost(f"ratchet: {method} {path.split('?')[0]}: given up"),
                                method, path, "given up")
        return failure

    def retry_delay(self, err: RatchetError, attempt: int, safe: bool) -> Optional[float]:
        """How long to wait before repeating a call that failed with err
        (after attempt repeats), or None when it must not be repeated."""
        if err.status == 429:
            # The limiter refused before acting: any call may repeat.
            return self.retry_after_wait(float(min(max(err.retry_after_seconds, 1), MAX_RATE_LIMIT_WAIT)))
        if err.code == RETRY_REQUEST:
            return float(err.retry_after_seconds)
        if err.code == REQUEST_TIMEOUT or (err.code == DATABASE_UNAVAILABLE
                                           and err.detail.get("outcome") == "not_applied"):
            return self.backoff(attempt)
        if err.status >= 500 and safe:
            # A 503's Retry-After is heeded up to the backoff's cap, so a
            # heartbeat does not sleep its lease away, and then spread as a
            # 429's is.
            return max(self.backoff(attempt), self.retry_after_wait(min(float(err.retry_after_seconds), BACKOFF_CAP)))
        return None

    def retry_after_wait(self, seconds: float) -> float:
        """The wait after a 429 or a 503 that asked for seconds: never
        less, and up to a fifth more, drawn at random (spread_retry_after)."""
        with self._jitter_lock:
            drawn = self._jitter.random()
        return spread_retry_after(seconds, drawn)

    def backoff(self, attempt: int) -> float:
        """Capped exponential backoff, half fixed and half random."""
        step = min(BACKOFF_BASE * (2.0 ** min(attempt, 10)), BACKOFF_CAP)
        with self._jitter_lock:
            return step / 2 + self._jitter.random() * step / 2

    def close(self) -> None:
        """Closes the idle connections and keeps no more: a call made after
        it still works, on a connection closed when it ends. Safe to call
        again."""
        with self._idle_lock:
            self._closed = True
        self.close_idle()

    def close_idle(self) -> None:
        """Closes the connections kept between calls (the next call opens
        one again)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection (opened by its first request): to the API, or to
        the proxy the environment names."""
        host, port = self._host, self._port
        if self._proxy is not None:
            host, port = self._proxy.hostname or "", self._proxy.port or 80
        if not self._https:
            return http.client.HTTPConnection(host, port, timeout=timeout)
        if self._tls is None:
            if ssl is None:
                raise ConnectionLost("ratchet: this Python has no ssl module for an https base_url")
            tls = ssl.create_default_context()
            tls.set_alpn_protocols(["http/1.1"])  # as urllib announced it
            self._tls = tls
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls)
        if self._proxy is not None:
            # TLS to the API inside the tunnel: the proxy sees only where.
            connection.set_tunnel(self._host, self._port or 443, headers=self._proxy_auth)
        return connection

    def _take(self, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        """A connection for one call, and whether it was kept from an
        earlier one: the most recently used idle connection that the server
        has not closed meanwhile, or a new one."""
        while True:
            with self._idle_lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._connect(timeout), False
            if _dropped(connection):
                connection.close()
                continue
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            return connection, True

    def _send(self, connection: http.client.HTTPConnection, method: str, path: str, data: Optional[bytes],
              headers: Dict[str, str], abort: Optional[Abort]) -> None:
        """Sends the request on connection, connected first when new so that
        an abort has a socket to shut (connections connect lazily)."""
        if abort is not None:
            if connection.sock is None:
                connection.connect()
            if not abort._attach(connection):
                raise ConnectionAbortedError("aborted")
        connection.request(method, self._target + path, body=data, headers=headers)

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._idle_lock:
            if not self._closed and connection.sock is not None and len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(connection)
                return
        connection.close()

    def _once(self, method: str, path: str, data: Optional[bytes], idempotency_key: Optional[str],
              timeout: float, safe: bool, abort: Optional[Abort] = None,
              read: Optional[Callable[[Dict[str, Any], str], Any]] = None) -> Any:
        headers = {"Authorization": "Bearer " + self._key, "Accept": "application/json",
                   "User-Agent": self.user_agent}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        if self._proxy is not None and not self._https:
            headers.update(self._proxy_auth)
        name = f"{method} {path.split('?')[0]}"
        # A call that is not safe to repeat never goes out on a kept
        # connection: one the server closes as the request leaves (its
        # keep-alive timeout) fails without saying whether the request was
        # read, and such a call could then only fail. A fresh connection
        # fails that way only as urllib's did.
        connection, reused = self._take(timeout) if safe else (self._connect(timeout), False)
        try:
            try:
                self._send(connection, method, path, data, headers, abort)
                response = connection.getresponse()
            except _STALE:
                if not (reused and safe) or (abort is not None and abort.fired):
                    raise
                # A kept connection the server had closed, found out before
                # any answer: the call is safe to repeat (the same rules let
                # call() repeat it), so once more at once on a new
                # connection, without spending one of its retries.
                if abort is not None:
                    abort._detach(connection)
                connection.close()
                connection, reused = self._connect(timeout), False
                self._send(connection, method, path, data, headers, abort)
                response = connection.getresponse()
            # Whether the answer says where it ends: http.client raises
            # IncompleteRead for a body shorter than its Content-Length or
            # without its last chunk (a 204 or a HEAD has no body).
            framed = response.chunked or response.length is not None
            raw = response.read()
            if abort is not None and abort.fired and (abort.cuts_answers or not framed):
                # Shut mid-answer: http.client reads the end of the socket
                # as the end of the head, or of a body without a length, so
                # what it read may be a cut answer passed off as a whole one
                # (QA: a claim's head cut after its status line at a stop's
                # deadline read as a 200 with no body, and the worker took
                # the claim as answered). Only a framed answer read whole is
                # kept; a head cut before its framing leaves none.
                raise ConnectionAbortedError("cut")
        except (OSError, http.client.HTTPException) as failure:
            # Connection refused, reset, timed out, or an answer cut short;
            # the connection is in an unknown state and is not kept.
            connection.close()
            if abort is not None and abort.fired:
                raise self._called(ConnectionLost(f"ratchet: {name}: {abort.reason}"), method, path,
                                   abort.reason) from None
            raise self._called(ConnectionLost(f"ratchet: {name}: {_reason(failure)}"), method, path,
                               net_kind(failure)) from None
        finally:
            if abort is not None:
                abort._detach(connection)
        # The whole answer was read: the connection may carry the next call
        # (unless the server said it closes it).
        if response.will_close:
            connection.close()
        else:
            self._give_back(connection)
        if not 200 <= response.status <= 299:
            raise self._called(_decode_error(response.status, response.headers, raw), method, path)
        date = _http_date(response.headers.get("Date"))
        try:
            answer = _json.loads(raw)
            if not isinstance(answer, dict):
                raise ValueError("not an object")
            if read is not None:
                return read(answer, response.headers.get("X-Request-Id", "")), date
            return answer, date
        except ValueError:
            # A 2xx whose body is not the object every route answers (cut
            # short by a proxy, or empty: a head cut after its status line
            # reads as one without a body): the call was applied, and its
            # answer lost as by a dropped connection (QA: claim and
            # register_worker raised AttributeError/TypeError on None, and a
            # worker's claim was forgotten instead of asked again).
            raise self._called(ConnectionLost(f"ratchet: {name}: unreadable answer"), method, path,
                               "unreadable answer") from None

    def _called(self, error: Exception, method: str, path: str, kind: Optional[str] = None) -> Exception:
        """error, marked with the call it answered (method, host and path,
        never the query) and, for a lost answer, its kind: what a worker's
        default failure log says of it instead of its text."""
        error._call = (method, self._netloc, self._prefix + path.split("?")[0])  # type: ignore[attr-defined]
        if kind is not None:
            error._kind = kind  # type: ignore[attr-defined]
        return error


def _proxy_for(base: urllib.parse.ParseResult) -> Optional[urllib.parse.SplitResult]:
    """The proxy the environment names for base (its scheme's *_PROXY, unless
    NO_PROXY exempts the host), read as urllib reads them, or None. The
    proxy itself is spoken to in plain HTTP, as urllib does (an https://
    proxy URL included)."""
    url = urllib.request.getproxies().get(base.scheme)
    if not url or urllib.request.proxy_bypass(base.hostname or ""):
        return None
    proxy = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    if proxy.scheme not in ("http", "https") or not proxy.hostname:
        raise ValueError(f"ratchet: {base.scheme}_proxy must be an http(s) URL with a host")
    return proxy


def _proxy_authorization(proxy: Optional[urllib.parse.SplitResult]) -> Dict[str, str]:
    """The Proxy-Authorization header for a proxy URL with credentials."""
    if proxy is None or proxy.username is None:
        return {}
    user = urllib.parse.unquote(proxy.username) + ":" + urllib.parse.unquote(proxy.password or "")
    return {"Proxy-Authorization": "Basic " + base64.b64encode(user.encode("utf-8")).decode("ascii")}


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection can no longer carry a request: closed, or
    readable, which between calls means the server closed it (an answer
    never comes unasked)."""
    sock = connection.sock
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _reason(failure: BaseException) -> str:
    return type(failure).__name__


def _decode_error(status: int, headers: Any, raw: bytes) -> RatchetError:
    request_id = headers.get("X-Request-Id", "") if headers else ""
    body: Any = None
    try:
        body = _json.loads(raw) if raw else None
    except ValueError:
        body = None
    envelope = body.get("error") if isinstance(body, dict) else None
    if not isinstance(envelope, dict):
        # Not the API's envelope (a proxy's page): no code, and the status's
        # reason phrase as the message, as the Go and TypeScript SDKs read
        # it (an invented "http_502" read as an API code, differently in
        # each SDK).
        envelope = {"code": "", "message": _reason_phrase(status)}
    given = envelope.get("detail")
    detail: Dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    if status in (429, 503) and "retry_after_seconds" not in detail and headers:
        seconds = _retry_after_header(headers.get("Retry-After", ""), _http_date(headers.get("Date")))
        if seconds:
            detail["retry_after_seconds"] = seconds
    return RatchetError(status, _text(envelope.get("code")), _text(envelope.get("message")),
                        detail, request_id, body)


def _reason_phrase(status: int) -> str:
    """The standard reason phrase of an HTTP status ("Bad Gateway"), or
    empty for one without (Go's http.StatusText)."""
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _text(value: Any) -> str:
    """An envelope's code or message as text: null (or missing) is empty, as
    the Go SDK decodes it, not "None"."""
    return "" if value is None else str(value)


def _http_date(value: Optional[str]) -> Optional[datetime]:
    try:
        return parsedate_to_datetime(value) if value else None
    except (TypeError, ValueError, IndexError):
        return None


def _retry_after_header(value: str, date: Optional[datetime] = None) -> int:
    """A Retry-After header in whole seconds from now: delay-seconds, or an
    HTTP date measured against the server's own clock (the answer's Date,
    as the Go SDK measures it) when it sent one; 0 when absent, unreadable
    or past."""
    value = (value or "").strip()
    # ASCII digits only: str.isdigit() takes a superscript two, which int()
    # refuses (a ValueError out of the call, and out of a worker's start()).
    if value.isascii() and value.isdigit():
        return int(value)
    try:
        now = date.timestamp() if date is not None else time.time()
        return max(0, math.ceil(parsedate_to_datetime(value).timestamp() - now))
    except (TypeError, ValueError, OverflowError, IndexError, AttributeError):
        return 0

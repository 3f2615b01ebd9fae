"""What the SDK decides on its own, against a fake server where it needs one."""

from __future__ import annotations

import concurrent.futures
import hmac
import inspect
import json
import logging
import math
import os
import pickle
import signal
import socket
import sys
import threading
import time
import typing
import unittest
import warnings
from datetime import datetime, timedelta, timezone, tzinfo
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional, Tuple
from unittest import mock

import getratchet
from getratchet import ConnectionLost, RatchetError, RetryableError, redact_message
from getratchet import _http, _json
from getratchet._http import Transport
from getratchet.worker import _beat_cutoff, _beat_wait, _key_refused, _read_decision

# A worker started without on_error logs its default failure log to
# "getratchet.worker", which with no handler anywhere went to stderr, into
# the tests' output: a handler that drops them keeps it quiet. The tests of
# that log (assertLogs, assertNoLogs) put their own handler in its place.
logging.getLogger("getratchet.worker").addHandler(logging.NullHandler())


class FakeServer:
    """Answers each request with the next (status, body, headers) of a
    script, recording method, path, headers and body, over HTTP/1.1
    connections kept alive as the API's are (``connections`` counts those
    accepted)."""

    def __init__(self, script) -> None:
        # A list of answers, or respond(method, path, body) -> answer.
        self.respond = script if callable(script) else (lambda m, p, b, queue=list(script): (
            queue.pop(0) if queue else (500, None, {})))
        self.seen: List[Tuple[str, str, dict, object]] = []
        self.lock = threading.Lock()
        self.open: List[socket.socket] = []
        self.connections = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # An answer's head and body are written apart: without this, a
            # kept connection waits out the client's delayed ACK (40 ms)
            # between them, which the API's server (Go) never makes it do.
            disable_nagle_algorithm = True

            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake.connections += 1
                    fake.open.append(self.connection)

            def finish(self) -> None:
                with fake.lock:
                    fake.open.remove(self.connection)
                super().finish()

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except RecursionError:
                    body = raw  # nested deeper than json reads: the bytes as sent
                fake.seen.append((self.command, self.path, dict(self.headers), body))
                status, answer, headers = fake.respond(self.command, self.path, body)
                if status == 0:  # drop the connection without an answer
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                # bytes are an answer's text as written (one json.dumps
                # cannot write: nested thousands of levels deep).
                raw = answer if isinstance(answer, bytes) else b"" if answer is None else json.dumps(answer).encode()
                if "Date" in headers:  # the script's (a skewed server clock's), not this machine's
                    self.send_response_only(status)
                else:
                    self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_CONNECT = handle_one

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # calls made all at once are all accepted (socketserver's is 5)

            def handle_error(self, request, client_address) -> None:
                # A client that hung up before its answer was written (a
                # test that cut a call, a stop): no traceback in the output.
                if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        # close() waits for serve_forever to see its shutdown, which it
        # checks once per poll interval (0.5 s by default, a test's worth).
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def drop_connections(self) -> None:
        """Closes every open connection, as a keep-alive timeout closes idle ones."""
        with self.lock:
            for connection in self.open:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        wait_until(lambda: not self.open)

    def close(self) -> None:
        self.server.shutdown()
        self.drop_connections()
        self.server.server_close()


# The redaction vectors the three SDKs' tests share.
REDACTION_VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "redaction_vectors.json")


def error(code: str, **detail) -> dict:
    return {"error": {"code": code, "message": code, "detail": detail}}


class TransportTest(unittest.TestCase):
    def transport(self, script) -> Tuple[Transport, FakeServer, List[float]]:
        server = FakeServer(script)
        self.addCleanup(server.close)
        waits: List[float] = []
        t = Transport(server.url, "rk_test", timeout=5, sleep=waits.append)
        self.addCleanup(t.close)
        return t, server, waits

    def test_a_429_is_repeated_after_the_servers_wait_for_any_call(self) -> None:
        t, server, waits = self.transport([(429, error("rate_limited", retry_after_seconds=7), {}),
                                           (201, {"id": "run_1"}, {})])
        self.assertEqual(t.call("POST", "/runs", {"name": "x"}, safe=False), {"id": "run_1"})
        self.assertEqual(len(waits), 1)
        self.assertTrue(7.0 <= waits[0] < 8.4, waits)  # and up to a fifth more, drawn at random
        self.assertEqual(len(server.seen), 2)
        method, path, headers, body = server.seen[0]
        self.assertEqual((method, path, headers["Authorization"], body), ("POST", "/api/v1/runs", "Bearer rk_test",
                                                                          {"name": "x"}))

    def test_a_429s_wait_is_spread_never_shortened(self) -> None:
        # The server's wait and up to a fifth more, drawn at random, never
        # less: every client the limiter refused in one window is told to
        # come back at its end, and waiting exactly that long brought them
        # all back at the same instant, most to be refused again (sdk QA).
        for seconds, drawn, want in [(7, 0.0, 7.0), (7, 0.25, 7.35), (10, 0.999, 11.998), (1, 0.5, 1.1),
                                     (3600, 0.5, 66.0)]:  # the minute's cap, then the spread
            self.assert_waited_once((429, error("rate_limited", retry_after_seconds=seconds), {}), drawn, want)

    def test_a_503s_retry_after_is_spread_never_shortened(self) -> None:
        # A 503's Retry-After (a proxy's maintenance page, a host shedding
        # load), heeded up to the backoff's 8 s cap, is spread as a 429's
        # is: waited exactly, it brought every client it turned away back at
        # one instant.
        for answer, drawn, want in [
                ((503, error("unavailable", retry_after_seconds=5), {}), 0.0, 5.0),
                ((503, error("unavailable", retry_after_seconds=5), {}), 0.5, 5.5),
                ((503, None, {"Retry-After": "5"}), 0.999, 5.999),  # a proxy's bare 503
                ((503, None, {"Retry-After": "3600"}), 0.5, 8.8)]:  # the backoff's cap, then the spread
            # The backoff's draw too: at most 0.5 s, below the Retry-After.
            self.assert_waited_once(answer, drawn, want)

    def assert_waited_once(self, answer, drawn: float, want: float) -> None:
        """A safe call answered answer, then 200, waits once: want seconds,
        the transport's jitter drawing drawn."""
        class Drawn:
            def random(self) -> float:
                return drawn

        t, server, waits = self.transport([answer, (200, {"id": "run_1"}, {})])
        t._jitter = Drawn()  # type: ignore[assignment]
        self.assertEqual(t.call("GET", "/runs/run_1", safe=True), {"id": "run_1"})
        self.assertEqual(len(waits), 1)
        self.assertAlmostEqual(waits[0], want, places=9, msg=(answer, drawn))

    def test_a_5xx_is_repeated_only_for_a_safe_call(self) -> None:
        t, server, waits = self.transport([(500, error("internal_error"), {}), (200, {"ok": 1}, {})])
        self.assertEqual(t.call("POST", "/jobs/j/report", {}, safe=True), {"ok": 1})
        self.assertEqual(len(waits), 1)
        self.assertTrue(0.25 <= waits[0] <= 0.5)
        t, server, waits = self.transport([(500, error("internal_error"), {"X-Request-Id": "req_1"})])
        with self.assertRaises(RatchetError) as failed:
            t.call("POST", "/runs", {}, safe=False)
        self.assertEqual((failed.exception.status, failed.exception.code, failed.exception.request_id),
                         (500, "internal_error", "req_1"))
        self.assertTrue(failed.exception.may_have_applied)
        self.assertEqual(len(server.seen), 1)

    def test_a_fired_abort_cuts_the_call_in_flight_and_refuses_the_next(self) -> None:
        # The answer never comes and the timeout is an hour: only the
        # abort can end the call (a hang guard, not a clock, tells if not).
        answered = threading.Event()

        def respond(method, path, body):
            answered.wait(3600)  # never answered
            return 200, {"ok": 1}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        waits: List[float] = []
        t = Transport(server.url, "rk_test", timeout=3600, sleep=waits.append)
        self.addCleanup(t.close)
        self.addCleanup(answered.set)  # before the server's close
        abort = _http.Abort()
        raised: List[BaseException] = []

        def call() -> None:
            try:
                t.call_until("POST", "/jobs/j/report", {}, may_wait=lambda wait: True, abort=abort)
            except BaseException as failure:  # noqa: B036 - handed to the test thread
                raised.append(failure)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_until(lambda: len(server.seen) == 1)  # in flight
        abort.fire()
        caller.join(60)
        self.assertFalse(caller.is_alive(), "the abort did not cut the call in flight")
        self.assertEqual([type(r) for r in raised], [ConnectionLost], raised)
        self.assertEqual(waits, [], "not repeated")
        with self.assertRaises(ConnectionLost):
            t.call("POST", "/jobs/j/report", {}, safe=True, abort=abort)
        self.assertEqual(len(server.seen), 1, "the second was never sent")

    def test_a_failure_that_changed_nothing_is_repeated_for_any_call(self) -> None:
        t, server, waits = self.transport([(503, error("database_unavailable", outcome="not_applied"), {}),
                                           (408, error("request_timeout"), {}), (201, {"id": "r"}, {})])
        self.assertEqual(t.call("POST", "/runs", {}, safe=False), {"id": "r"})
        self.assertEqual(len(server.seen), 3)

    def test_a_2xx_without_an_object_is_a_lost_answer(self) -> None:
        # Every route answers an object: an empty 2xx (a head cut after its
        # status line reads as one without a body) or another JSON value is
        # an answer lost, the call maybe applied, not None handed on (QA:
        # claim() raised AttributeError and register_worker() TypeError).
        for answer in (None, b"[]", b"null", b"3"):
            with self.subTest(answer=answer):
                t, server, _ = self.transport([(201, answer, {})])
                with self.assertRaises(ConnectionLost):  # the call may have been applied
                    t.call("POST", "/runs", {}, safe=False)
                self.assertEqual(len(server.seen), 1, "not repeated: it was not safe to")
        server = FakeServer([(200, None, {})] * 4)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        self.addCleanup(client.close)
        with self.assertRaises(ConnectionLost):
            client.claim("wrk_1")
        with self.assertRaises(ConnectionLost):
            client.register_worker([("t", "1")])

    def test_a_lost_answer_is_repeated_only_for_a_safe_call(self) -> None:
        t, server, _ = self.transport([(0, None, {}), (200, {"jobs": []}, {})])
        self.assertEqual(t.call("POST", "/workers/w/claim", {"limit": 1}, safe=True), {"jobs": []})
        self.assertEqual(server.seen[0][3], server.seen[1][3])  # the same body, claim id included
        t, server, _ = self.transport([(0, None, {})])
        with self.assertRaises(ConnectionLost):
            t.call("POST", "/runs", {}, safe=False)
        self.assertEqual(len(server.seen), 1)

    def test_retries_are_bounded(self) -> None:
        t, server, waits = self.transport([(502, None, {})] * 5)
        with self.assertRaises(RatchetError) as failed:
            t.call("GET", "/runs/r", safe=True)
        self.assertEqual((failed.exception.status, failed.exception.code), (502, ""))
        self.assertEqual(len(server.seen), 4)  # the call and three retries

    def test_an_answer_that_is_not_the_envelope_has_no_code(self) -> None:
        # A proxy's page: no API code and the status's reason phrase, as
        # the Go and TypeScript SDKs read it (it was code "http_502",
        # message "HTTP 502", unlike Go's empty code and "Bad Gateway").
        t, _, _ = self.transport([(502, None, {}), (418, None, {}), (599, None, {})])
        for status, text in ((502, "ratchet: 502: Bad Gateway"), (418, "ratchet: 418: I'm a Teapot"),
                             (599, "ratchet: 599")):
            with self.assertRaises(RatchetError) as failed:
                t.call("POST", "/runs", {}, safe=False)
            self.assertEqual((failed.exception.status, failed.exception.code, str(failed.exception)),
                             (status, "", text))

    def test_a_refusal_after_an_attempt_that_may_have_acted_says_it_may_have(self) -> None:
        # As the Go SDK's (unconfirmed): the last answer says only why the
        # retries stopped. A claim that met a 500 and then 429s kept its
        # claim id only if this says so; it was reset, and the jobs the
        # first attempt may have leased waited out their leases.
        t, server, waits = self.transport([(500, error("internal_error"), {}),
                                           (409, error("lease_expired"), {"X-Request-Id": "req_2"})])
        with self.assertRaises(RatchetError) as caught:
            t.call("POST", "/effects/e/report", {}, safe=True)
        self.assertEqual((caught.exception.status, caught.exception.code, caught.exception.request_id),
                         (409, "lease_expired", "req_2"))
        self.assertTrue(caught.exception.may_have_applied)
        t, server, waits = self.transport([(500, error("internal_error"), {})] +
                                          [(429, error("rate_limited", retry_after_seconds=1), {})] * 3)
        with self.assertRaises(RatchetError) as caught:
            t.call("POST", "/workers/w/claim", {"claimId": "c1"}, safe=True)
        self.assertEqual((caught.exception.status, caught.exception.may_have_applied), (429, True))
        self.assertEqual(len(server.seen), 4)
        # A call lost once and then turned away by call_until (a report's
        # loop) says so too.
        t, server, waits = self.transport([(0, None, {}), (409, error("lease_expired"), {})])
        with self.assertRaises(RatchetError) as caught:
            t.call_until("POST", "/effects/e/report", {}, may_wait=lambda wait: True)
        self.assertTrue(caught.exception.may_have_applied)
        # Nothing that may have acted: the refusal says so.
        for script in ([(409, error("lease_expired"), {})],
                       [(429, error("rate_limited"), {}), (409, error("lease_expired"), {})],
                       [(503, error("database_unavailable", outcome="not_applied"), {}),
                        (409, error("lease_expired"), {})]):
            t, server, waits = self.transport(script)
            with self.assertRaises(RatchetError) as caught:
                t.call("POST", "/effects/e/report", {}, safe=True)
            self.assertFalse(caught.exception.may_have_applied, script)

    def test_a_held_idempotency_key_is_waited_for(self) -> None:
        t, server, waits = self.transport([(409, error("retry_request", retry_after_seconds=1), {})] * 5
                                          + [(200, {"workerId": "wkr_1"}, {})])
        self.assertEqual(t.call("POST", "/workers/register", {}, safe=True, idempotency_key="k1"),
                         {"workerId": "wkr_1"})
        self.assertEqual({s[2]["Idempotency-Key"] for s in server.seen}, {"k1"})
        self.assertEqual(waits, [1.0] * 5)
        # With retries off nothing is repeated, not even for a held key.
        t, server, waits = self.transport([(409, error("retry_request", retry_after_seconds=1), {})] * 2)
        with self.assertRaises(RatchetError) as caught:
            t.call("POST", "/workers/register", {}, safe=True, idempotency_key="k1", max_retries=0)
        self.assertEqual((caught.exception.code, len(server.seen), waits), ("retry_request", 1, []))

    def test_a_held_key_is_waited_for_no_longer_than_a_retry(self) -> None:
        # A stopping worker's registration: the retry cut-off (its stop),
        # fired as the held key's answer comes, ends the wait for it at
        # once, as it ends a retry's wait and as Go's sleepCtx ends it; it
        # was slept out, past the stop's deadline.
        cut = _http.Abort()

        def respond(method, path, body):
            cut.fire()
            return 409, error("retry_request", retry_after_seconds=5), {}

        t, server, waits = self.transport(respond)
        with self.assertRaises(RatchetError) as caught:
            t.call("POST", "/workers/register", {}, safe=True, idempotency_key="k1", retry_cutoff=cut)
        self.assertEqual((caught.exception.code, len(server.seen), waits), ("retry_request", 1, []))

    def test_a_base_url_ending_in_the_api_path_is_taken_as_go_takes_it(self) -> None:
        # A base URL copied from the API's own paths ("…/api/v1", as the Go
        # SDK accepts it) went to /api/v1/api/v1/..., every call 404.
        server = FakeServer(lambda method, path, body: (200, {"path": path}, {}))
        self.addCleanup(server.close)
        for base in (server.url + "/api/v1", server.url + "/api/v1/", server.url + "/proxy/api/v1"):
            t = Transport(base, "rk_test", timeout=5)
            self.addCleanup(t.close)
            want = "/proxy/api/v1/runs/r" if "/proxy" in base else "/api/v1/runs/r"
            self.assertEqual(t.call("GET", "/runs/r", safe=True), {"path": want}, base)

    def test_a_base_url_holding_credentials_is_refused_without_them(self) -> None:
        # Stripped silently, they left a reader of the setting thinking
        # they were sent; the TypeScript and Go SDKs refuse them alike.
        for base in ("https://deploy:s3cret@ratchet.example", "https://deploy@ratchet.example/base",
                     "http://:s3cret@localhost:8787"):
            with self.assertRaises(ValueError) as caught:
                Transport(base, "rk_test")
            self.assertIn("must not hold credentials", str(caught.exception))
            self.assertNotIn("s3cret", str(caught.exception))
            self.assertNotIn("deploy", str(caught.exception))

    def test_bad_configuration_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            Transport("http://x", "")
        # A key no header can carry (a secret file read with its line end)
        # is refused here, without the key in the error, as the Go and
        # TypeScript SDKs refuse it: http.client refused it at each call
        # with a ValueError that printed the whole key. Spaces and tabs
        # around it pass: the server trims them.
        for key in ("rk_SECRET\n", "rk_SECRET\r\n", "rk_S\x00ECRET", "rk_S\u00c9CRET", "rk_SECRET\x7f"):
            with self.assertRaises(ValueError) as refused:
                Transport("http://x", key)
            self.assertNotIn("SECRET", str(refused.exception), repr(key))
        Transport("http://x", " rk_ok\t").close()
        # A client timeout is refused as a method's is: 0 timed every call
        # out at once, a negative one or NaN raised ValueError at each call.
        for timeout in (0, -1, float("nan"), float("inf"), None, True, "5"):
            with self.assertRaises(ValueError, msg=repr(timeout)):
                Transport("http://x", "k", timeout=timeout)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            Transport("ftp://x", "k")

    def test_unsendable_headers_and_dot_ids_are_refused_unsent(self) -> None:
        # An Idempotency-Key or a User-Agent no header can carry, and an id
        # of "." or "..", are refused before anything is sent, without the
        # value in the error, as the Go and TypeScript SDKs refuse them:
        # http.client raised a ValueError printing the header at each call,
        # and get_run("..") asked GET /api/v1 (a URL resolves a ".." step).
        server = FakeServer(lambda m, p, b: (200, {"id": "run_1"}, {}))
        self.addCleanup(server.close)
        waits: List[float] = []
        client = getratchet.Ratchet(server.url, "rk_test", timeout=5)
        self.addCleanup(client.close)
        client._transport.sleep = waits.append
        for key in ("k_SECRET\n", "k_SECRET\r\nX-Evil: 1", "k_S\x00ECRET", "k_S\u00c9CRET"):
            with self.assertRaises(ValueError) as refused:
                client.request("POST", "/runs", {"name": "n"}, safe=True, idempotency_key=key)
            self.assertNotIn("SECRET", str(refused.exception), repr(key))
            with self.assertRaises(ValueError) as refused:
                client.cancel_step("stp_1", idempotency_key=key)
            self.assertNotIn("SECRET", str(refused.exception), repr(key))
        for step_id in (".", ".."):
            with self.assertRaises(ValueError, msg=step_id):
                client.get_run(step_id)
            with self.assertRaises(ValueError, msg=step_id):
                client.cancel_step(step_id)
        self.assertEqual((server.seen, waits), ([], []))
        # Ids holding dots are ids, sent escaped as ever.
        self.assertEqual(client.get_run("..run")["id"], "run_1")
        self.assertEqual(server.seen[0][1], "/api/v1/runs/..run")
        for agent in ("app\n", "app\r\nX-Evil: 1", "app\x7f", "\u00e4pp"):
            with self.assertRaises(ValueError) as refused:
                Transport("http://x", "k", user_agent=agent)
            self.assertNotIn("pp", str(refused.exception), repr(agent))
        Transport("http://x", "k", user_agent="my-app/1.0 (contact)").close()


class KeepAliveTest(unittest.TestCase):
    def transport(self, script, **options) -> Tuple[Transport, FakeServer, List[float]]:
        server = FakeServer(script)
        self.addCleanup(server.close)
        waits: List[float] = []
        t = Transport(server.url, "rk_test", timeout=5, sleep=waits.append, **options)
        self.addCleanup(t.close)
        return t, server, waits

    @staticmethod
    def echo(method, path, body):
        return 200, {"path": path}, {}

    def test_sequential_calls_share_one_connection(self) -> None:
        t, server, _ = self.transport(self.echo)
        for n in range(10):
            self.assertEqual(t.call("POST", f"/jobs/j{n}/heartbeat", {"leaseToken": "t"}, safe=True),
                             {"path": f"/api/v1/jobs/j{n}/heartbeat"})
        self.assertEqual(server.connections, 1)
        # A call that is not safe to repeat is sent on a connection of its
        # own (a kept one closing under it could only fail it), which is
        # kept for the next safe call.
        t.call("POST", "/runs", {"name": "x"}, safe=False)
        t.call("GET", "/runs/r", safe=True)
        self.assertEqual(server.connections, 2)

    def test_a_connection_the_server_closed_while_idle_is_no_error(self) -> None:
        t, server, waits = self.transport(self.echo, max_retries=0)
        t.call("GET", "/runs/r", safe=True)
        self.assertFalse(_http._dropped(t._idle[-1]))
        server.drop_connections()  # the server's keep-alive timeout
        # Seen closed before it is used again.
        wait_until(lambda: _http._dropped(t._idle[-1]))
        self.assertEqual(t.call("POST", "/jobs/j/report", {}, safe=True), {"path": "/api/v1/jobs/j/report"})
        self.assertEqual(server.connections, 2)
        # Closed just after the check before reuse: the request fails
        # before any answer, and is sent once more on a new connection.
        server.drop_connections()
        with mock.patch.object(_http, "_dropped", lambda connection: False):
            self.assertEqual(t.call("POST", "/jobs/j/report", {}, safe=True), {"path": "/api/v1/jobs/j/report"})
        self.assertEqual((server.connections, waits), (3, []))

    def test_a_kept_connection_that_fails_is_tried_again_once_on_a_new_one(self) -> None:
        t, server, waits = self.transport([(200, {}, {}), (0, None, {}), (200, {"ok": 1}, {})], max_retries=0)
        t.call("GET", "/runs/r", safe=True)
        # The server drops the request on the kept connection: a safe call
        # is sent again at once, without a retry of its own (it has none).
        self.assertEqual(t.call("POST", "/jobs/j/report", {"leaseToken": "t"}, safe=True), {"ok": 1})
        self.assertEqual((len(server.seen), server.connections, waits), (3, 2, []))
        # Once only: a new connection that fails is the call's failure.
        t, server, waits = self.transport([(200, {}, {}), (0, None, {}), (0, None, {}), (200, {}, {})],
                                          max_retries=0)
        t.call("GET", "/runs/r", safe=True)
        with self.assertRaises(ConnectionLost):
            t.call("POST", "/jobs/j/report", {"leaseToken": "t"}, safe=True)
        self.assertEqual(len(server.seen), 3)

    def test_concurrent_calls_never_share_a_connection(self) -> None:
        def slow_echo(method, path, body):
            time.sleep(0.01)
            return 200, {"path": path, "body": body}, {}

        t, server, _ = self.transport(slow_echo)
        wrong: List[object] = []

        def calls(n: int) -> None:
            for i in range(15):
                path = f"/jobs/j{n}_{i}/heartbeat"
                answer = t.call("POST", path, {"n": n, "i": i}, safe=True)
                if answer != {"path": "/api/v1" + path, "body": {"n": n, "i": i}}:
                    wrong.append(answer)

        threads = [threading.Thread(target=calls, args=(n,)) for n in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        self.assertEqual(wrong, [])
        self.assertEqual(len(server.seen), 12 * 15)
        self.assertLessEqual(server.connections, 12 + 12)  # at most one per thread, and a few replaced
        self.assertLessEqual(len(t._idle), _http.MAX_IDLE_CONNECTIONS)

    @unittest.skipUnless(hasattr(os, "fork"), "fork is POSIX's")
    def test_a_forked_child_keeps_no_connection_of_its_parent(self) -> None:
        # A client made at import and used once before the fork (gunicorn's
        # --preload, a multiprocessing pool): the child shared its parent's
        # kept connection, and two processes reading one socket read each
        # other's answers (a begin answered another process's execute).
        t, server, _ = self.transport(self.echo)
        t.call("GET", "/runs/r", safe=True)
        self.assertEqual((server.connections, len(t._idle)), (1, 1))
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads running (the server's)
            pid = os.fork()
        if pid == 0:  # the child: it reports through the pipe, and never returns into the tests
            try:
                kept = len(t._idle)
                answer = t.call("GET", "/runs/child", safe=True)
                os.write(write, json.dumps([kept, answer, t.backoff(10)]).encode())
            finally:
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            kept, answer, child_backoff = json.loads(pipe.read())
        self.assertEqual(status, 0)
        self.assertEqual((kept, answer), (0, {"path": "/api/v1/runs/child"}))
        self.assertEqual(server.connections, 2)  # the child's own
        # The parent's kept connection is still its own, and open.
        self.assertEqual(t.call("GET", "/runs/parent", safe=True), {"path": "/api/v1/runs/parent"})
        self.assertEqual(server.connections, 2)
        # The child drew its jitter afresh, not the parent's next draws.
        self.assertNotEqual(child_backoff, t.backoff(10))

    def test_close_closes_the_kept_connections(self) -> None:
        server = FakeServer(self.echo)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.get_run("r")
        self.assertEqual(len(server.open), 1)
        client.close()
        client.close()
        wait_until(lambda: not server.open)
        # Still usable, without keeping the connection.
        self.assertEqual(client.get_run("r"), {"path": "/api/v1/runs/r"})
        wait_until(lambda: not server.open)
        self.assertEqual(server.connections, 2)


class ProxyTest(unittest.TestCase):
    """The proxy the environment names is used as urllib used it."""

    def env(self, **values) -> None:
        names = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                 "ALL_PROXY", "all_proxy", "REQUEST_METHOD")
        patcher = mock.patch.dict(os.environ, {k: v for k, v in values.items()})
        patcher.start()
        self.addCleanup(patcher.stop)
        for name in names:
            if name not in values:
                os.environ.pop(name, None)

    def test_plain_http_goes_to_the_proxy_as_absolute_uris(self) -> None:
        proxy = FakeServer(lambda m, p, b: (200, {"via": "proxy"}, {}))
        self.addCleanup(proxy.close)
        self.env(http_proxy=proxy.url.replace("http://", "http://us%40r:p%3Ass@"))
        t = Transport("http://api.example.test:8080/base", "rk_test", timeout=5)
        self.addCleanup(t.close)
        self.assertEqual(t.call("GET", "/runs/r", safe=True), {"via": "proxy"})
        method, path, headers, _ = proxy.seen[0]
        self.assertEqual((method, path), ("GET", "http://api.example.test:8080/base/api/v1/runs/r"))
        self.assertEqual(headers["Proxy-Authorization"], "Basic dXNAcjpwOnNz")  # us@r:p:ss
        self.assertEqual(headers["Authorization"], "Bearer rk_test")
        # Kept alive through the proxy as well.
        t.call("GET", "/runs/r", safe=True)
        self.assertEqual(proxy.connections, 1)

    def test_https_goes_through_a_connect_tunnel(self) -> None:
        proxy = FakeServer(lambda m, p, b: (407, None, {}))
        self.addCleanup(proxy.close)
        self.env(HTTPS_PROXY=proxy.url.replace("http://", "http://ops:pw@"))
        t = Transport("https://api.example.test", "rk_test", timeout=5, max_retries=0)
        self.addCleanup(t.close)
        with self.assertRaises(ConnectionLost):
            t.call("GET", "/runs/r", safe=True)  # the proxy refuses the tunnel
        method, target, headers, _ = proxy.seen[0]
        self.assertEqual((method, target), ("CONNECT", "api.example.test:443"))
        self.assertEqual(headers["Proxy-Authorization"], "Basic b3BzOnB3")
        self.assertNotIn("Authorization", headers, "the key goes only inside the tunnel")

    def test_no_proxy_and_no_setting_go_direct(self) -> None:
        server = FakeServer(lambda m, p, b: (200, {"direct": True}, {}))
        self.addCleanup(server.close)
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))
        self.addCleanup(dead.close)
        self.env(http_proxy="http://127.0.0.1:%d" % dead.getsockname()[1], no_proxy="127.0.0.1")
        t = Transport(server.url, "rk_test", timeout=5, max_retries=0)
        self.addCleanup(t.close)
        self.assertEqual(t.call("GET", "/runs/r", safe=True), {"direct": True})
        self.assertEqual(server.seen[0][1], "/api/v1/runs/r")
        self.env()
        self.assertIsNone(Transport(server.url, "rk_test")._proxy)
        self.env(https_proxy="socks5://127.0.0.1:1080")
        with self.assertRaises(ValueError):
            Transport("https://api.example.test", "rk_test")


class DecisionTest(unittest.TestCase):
    def test_classifier_decisions(self) -> None:
        self.assertEqual(_read_decision({"retryable": True}), (True, None))
        self.assertEqual(_read_decision({"retryable": False}), (False, None))
        self.assertEqual(_read_decision({"retryable": True, "retry_after_ms": 60000}), (True, 60000))
        # A fractional hint is a minimum wait: rounded up.
        self.assertEqual(_read_decision({"retryable": True, "retry_after_ms": 1500.2}), (True, 1501))
        # Out of range is read, then clamped and told by the worker.
        self.assertEqual(_read_decision({"retryable": True, "retry_after_ms": 10}), (True, 10))
        # Infinity and an integer beyond a float's range too: out of range,
        # clamped and told as a huge hint is.
        self.assertEqual(_read_decision({"retryable": True, "retry_after_ms": float("inf")}), (True, 86_400_001))
        self.assertEqual(_read_decision({"retryable": True, "retry_after_ms": 10**400}), (True, 10**400))
        for invalid in (None, True, {}, {"retryable": "yes"}, {"retryable": False, "retry_after_ms": 5000},
                        {"retryable": True, "retry_after_ms": float("nan")}, {"retryable": True, "retry_after_ms": True},
                        {"retryable": True, "retry_after_ms": "5000"}, {"retryable": True, "retryAfterMs": 5000}):
            self.assertIsNone(_read_decision(invalid), invalid)

    def test_retryable_error_hints_are_rounded_and_clamped_never_refused(self) -> None:
        # Raising a RetryableError must never fail: a ValueError there would
        # hand the failure to the classifier, which could end the job.
        cases = {1000: 1000, 1500.2: 1501, 999: 1000, 86_400_001: 86_400_000, 60e3: 60000,
                 None: None, True: None, "5000": None, float("inf"): 86_400_000, float("-inf"): 1000,
                 float("nan"): None, 10**400: 86_400_000}
        for given, want in cases.items():
            self.assertEqual(RetryableError("busy", retry_after_ms=given).retry_after_ms, want, given)


class RedactTest(unittest.TestCase):
    def test_the_shared_redaction_vectors(self) -> None:
        # The vectors the three SDKs share: credentials, personal data,
        # control characters, the byte bound.
        with open(REDACTION_VECTORS, encoding="utf-8") as file:
            vectors = json.load(file)["vectors"]
        self.assertTrue(vectors)
        for vector in vectors:
            self.assertEqual(redact_message(vector["input"]), vector["output"], vector["name"])

    def test_a_long_message_is_cut_before_it_is_scanned(self) -> None:
        # The patterns backtrack (30 kB of name characters took 45 s), so
        # only the first thousand characters are ever scanned (the Go SDK,
        # whose RE2 does not backtrack, scans them all).
        long = "a-" * 15_000
        self.assertEqual(redact_message(long), redact_message(long[:1000] + " tail"))
        self.assertEqual(redact_message(long), "[redacted]…")
        # The word the cut went through is dropped: no fragment of a secret.
        for separator in ("\n", "\t"):
            out = redact_message("Q" * 985 + separator + "AKIAIOSFODNN7EXAMPLE" + separator + "x")
            self.assertEqual(out, "[redacted]…", repr(separator))


class BlindKeyTest(unittest.TestCase):
    def test_blind_key_matches_hmac_sha256(self) -> None:
        # printf %s refund:order_551:full | openssl dgst -sha256 -hmac s3cret
        self.assertEqual(getratchet.blind_key("s3cret", "refund:order_551:full"),
                         "4b1cca52451781050091c5d62a2f211a")


class TypingTest(unittest.TestCase):
    """What a user's type checker (mypy, pyright) reads of the package."""

    def test_the_package_ships_its_py_typed_marker(self) -> None:
        # Without it an installed getratchet is skipped by mypy ("missing
        # library stubs or py.typed marker"): none of its annotations checked.
        package = os.path.dirname(getratchet.__file__)
        self.assertTrue(os.path.isfile(os.path.join(package, "py.typed")))
        with open(os.path.join(package, os.pardir, "pyproject.toml"), encoding="utf-8") as f:
            pyproject = f.read()
        # setuptools puts it in the wheel only when package-data names it.
        self.assertIn('[tool.setuptools.package-data]\ngetratchet = ["py.typed"]', pyproject)

    def test_the_worker_and_its_handlers_are_typed(self) -> None:
        # worker was Any, so nothing a user called on it was checked.
        self.assertIs(typing.get_type_hints(getratchet.Ratchet.worker.fget)["return"], getratchet.Worker)
        hints = typing.get_type_hints(getratchet.Ratchet.register_tool)
        self.assertEqual(hints["handler"], Callable[[typing.Any, getratchet.JobContext], typing.Any])
        self.assertEqual(hints["classify_error"],
                         typing.Optional[Callable[[BaseException, getratchet.JobContext], typing.Any]])

    def test_not_performed_declares_report_error(self) -> None:
        # It was set only when the report failed, undeclared: reading it
        # otherwise raised AttributeError, and mypy refused it.
        self.assertIsNone(getratchet.NotPerformed("rejected").report_error)
        self.assertEqual(typing.get_type_hints(getratchet.NotPerformed)["report_error"], typing.Optional[BaseException])

    def test_the_answer_types_are_exported(self) -> None:
        # Every TypedDict and Literal alias (EffectState...) of
        # getratchet.types is listed in its __all__ and importable from the
        # package, and a TypedDict's annotations resolve (a misspelled
        # forward reference would fail a user's type checker).
        from getratchet import types
        typeddicts = {name for name, value in vars(types).items() if not name.startswith("_")
                      and isinstance(value, type) and issubclass(value, dict) and hasattr(value, "__required_keys__")}
        literals = {name for name, value in vars(types).items() if not name.startswith("_")
                    and typing.get_origin(value) is typing.Literal}
        self.assertIn("EffectState", literals)
        self.assertEqual(sorted(typeddicts | literals), sorted(types.__all__))
        for name in types.__all__:
            self.assertIn(name, getratchet.__all__)
            self.assertIs(getattr(getratchet, name), getattr(types, name))
            if name in typeddicts:
                typing.get_type_hints(getattr(types, name))

    def test_the_answer_types_are_re_exported_by_name(self) -> None:
        # mypy reads a package's __all__ only from literal lists: with
        # `__all__ += types.__all__` a user's mypy --strict (no implicit
        # re-export) refused `from getratchet import Effect`. The names are
        # read here as mypy reads them, from the source.
        import ast
        from getratchet import types
        with open(getratchet.__file__, encoding="utf-8") as source:
            tree = ast.parse(source.read())
        listed = set()
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and target.id == "__all__" and isinstance(node.value, ast.List):
                listed |= {item.value for item in node.value.elts if isinstance(item, ast.Constant)}
        self.assertEqual(sorted(set(types.__all__) - listed), [])

    def test_enumerated_arguments_are_typed_with_their_literals(self) -> None:
        # list_run_steps' status filter was a str, where the TypeScript
        # SDK's is a JobStatus: a misspelled filter (status="EXHAUSTD")
        # type-checked and was refused 400 at run time. The contract's
        # retry preset, an answer's field too, is enumerated by the OpenAPI
        # document (tests/test_types.py holds the answer to it).
        hints = typing.get_type_hints(getratchet.Ratchet.list_run_steps)
        self.assertEqual(hints["status"], typing.Optional[getratchet.JobStatus])
        self.assertEqual(typing.get_type_hints(getratchet.Ratchet.list_runs)["status"],
                         typing.Optional[getratchet.RunStatus])
        publish = typing.get_type_hints(getratchet.Ratchet.publish_contract)
        self.assertEqual(publish["retry_preset"], typing.Optional[getratchet.RetryPreset])
        self.assertEqual(publish["status"], typing.Optional[getratchet.ContractStatus])
        self.assertEqual(typing.get_type_hints(getratchet.Contract)["retryPreset"], getratchet.RetryPreset)
        self.assertEqual(typing.get_args(getratchet.RetryPreset), ("STANDARD", "AGGRESSIVE", "RELAXED", "CUSTOM"))
        # enqueue's after_status was a str, where TypeScript's is
        # 'SUCCEEDED' | 'FAILED'; the endpoint attempts' outcome filter too.
        # AFTER_SUCCEEDED and AFTER_FAILED are typed so that they pass.
        after = typing.Optional[getratchet.AfterStatus]
        self.assertEqual(typing.get_type_hints(getratchet.Ratchet.enqueue)["after_status"], after)
        self.assertEqual(typing.get_args(getratchet.AfterStatus), ("SUCCEEDED", "FAILED"))
        self.assertEqual(typing.get_type_hints(getratchet.client)["AFTER_SUCCEEDED"], getratchet.AfterStatus)
        self.assertEqual(typing.get_type_hints(getratchet.client)["AFTER_FAILED"], getratchet.AfterStatus)
        self.assertEqual(typing.get_type_hints(getratchet.Ratchet.list_endpoint_attempts)["outcome"],
                         typing.Optional[getratchet.JobOutcome])
        self.assertEqual(typing.get_args(getratchet.JobOutcome), ("SUCCEEDED", "FAILED"))
        # The answers' presets, an endpoint's circuit, a step's dependency
        # and an attempt's outcome, which the OpenAPI document now
        # enumerates (tests/test_types.py holds them to it).
        self.assertEqual(typing.get_type_hints(getratchet.Endpoint)["policyPreset"], getratchet.RetryPreset)
        self.assertEqual(typing.get_type_hints(getratchet.RetrySchedule)["preset"], getratchet.RetryPreset)
        self.assertEqual(typing.get_type_hints(getratchet.RetryPolicySnapshot)["preset"], getratchet.RetryPreset)
        self.assertEqual(typing.get_type_hints(getratchet.EndpointCircuit)["state"], getratchet.CircuitState)
        self.assertEqual(typing.get_type_hints(getratchet.Step)["afterStatus"], after)
        self.assertEqual(typing.get_type_hints(getratchet.JobAttempt)["outcome"], typing.Optional[getratchet.JobOutcome])
        self.assertEqual(typing.get_type_hints(getratchet.EndpointAttempt)["outcome"],
                         typing.Optional[getratchet.JobOutcome])

    def test_effect_blocked_types_its_prior_attempt(self) -> None:
        # It was Optional[dict]: a type checker knew none of its fields.
        # PriorAttempt is declared in getratchet.errors, so its hint
        # resolves at run time too (no import cycle with getratchet.types).
        self.assertEqual(typing.get_type_hints(getratchet.EffectBlocked.__init__)["prior_attempt"],
                         typing.Optional[getratchet.PriorAttempt])
        self.assertIs(getratchet.errors.PriorAttempt, getratchet.types.PriorAttempt)

    def test_each_answer_is_typed(self) -> None:
        # Answers were `-> dict`: a user's type checker knew none of their
        # fields. Each public method now names its answer's TypedDict
        # (tests/test_types.py compares them with the server's schemas);
        # only request, which calls any route, answers Any.
        untyped = (dict, list, typing.Dict, typing.List, typing.List[dict], typing.Dict[str, typing.Any], typing.Any)
        methods = {name: fn for name, fn in vars(getratchet.Ratchet).items()
                   if callable(fn) and not name.startswith("_") and name != "request"}
        self.assertGreater(len(methods), 60)
        for name, fn in methods.items():
            with self.subTest(method=name):
                answer = typing.get_type_hints(fn).get("return", typing.Any)
                self.assertNotIn(answer, untyped)
        hints = {name: typing.get_type_hints(fn)["return"] for name, fn in methods.items()}
        self.assertIs(hints["get_effect"], getratchet.Effect)
        self.assertIs(hints["begin"], getratchet.BeginResponse)
        self.assertIs(hints["list_runs"], getratchet.RunPage)
        self.assertEqual(hints["claim"], List[getratchet.ClaimedJob])
        self.assertEqual(hints["report_jobs"], List[getratchet.BatchJobResult])
        self.assertIs(typing.get_type_hints(getratchet.verify_webhook)["return"], getratchet.WebhookEvent)
        # Still plain dicts: a TypedDict is dict at run time.
        self.assertIs(type(getratchet.Effect(id="eff_1")), dict)
        # What do_effect's action is handed of the begin's answer too.
        self.assertEqual(typing.get_type_hints(getratchet.Lease)["prior_attempt"],
                         typing.Optional[getratchet.PriorAttempt])


class IdleWorkerTest(unittest.TestCase):
    def idle(self) -> Tuple[getratchet.Ratchet, FakeServer]:
        """A client with one tool against a server that has no jobs."""
        server = FakeServer([(200, {"workerId": "wkr_1"}, {})] + [(200, {"jobs": []}, {})] * 100)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: None)
        return client, server

    def test_an_idle_worker_claims_once_per_poll_interval(self) -> None:
        client, server = self.idle()
        stop = threading.Event()
        client.worker.start(4, poll_interval=0.2, stop_event=stop, block=False)
        threading.Event().wait(1.0)
        self.assertTrue(client.worker.stop(5))
        claims = [s for s in server.seen if s[1].endswith("/claim")]
        # Five intervals of 0.2 s (±10 %): about five claims, never a busy loop.
        # At least two, not four: a loaded machine (the suites run beside
        # the others) made three in the second, and only the busy loop is a
        # fault.
        self.assertTrue(2 <= len(claims) <= 7, len(claims))
        self.assertEqual(claims[0][1], "/api/v1/workers/wkr_1/claim")
        self.assertEqual(claims[0][3]["limit"], 4)
        self.assertEqual(len({c[3]["claimId"] for c in claims}), len(claims))
        self.assertEqual(server.seen[0][3], {"tools": [{"name": "t", "version": "1"}]})

    def test_a_poll_interval_past_a_year_is_refused_before_anything_is_sent(self) -> None:
        # One past threading.TIMEOUT_MAX raised OverflowError out of the
        # worker's loop at its first idle wait, after it had registered.
        client, server = self.idle()
        self.addCleanup(lambda: client.worker.stop(5))
        for bad in (threading.TIMEOUT_MAX * 2, 366 * 24 * 3600.0):
            with self.subTest(bad), self.assertRaises(ValueError) as refused:
                client.worker.start(1, poll_interval=bad, block=False)
            self.assertIn("poll_interval", str(refused.exception))
        self.assertEqual(server.seen, [])

    def test_a_stop_event_ends_a_blocking_start(self) -> None:
        client, _ = self.idle()
        stop = threading.Event()
        returned = threading.Event()

        def run() -> None:
            client.worker.start(1, poll_interval=0.05, stop_event=stop)
            returned.set()

        threading.Thread(target=run, daemon=True).start()
        self.assertFalse(returned.wait(0.3))
        stop.set()
        self.assertTrue(returned.wait(5))
        with self.assertRaises(RuntimeError):
            client.worker.start(1)


class ErrorTextTest(unittest.TestCase):
    def test_a_refusal_names_what_the_key_lacks_and_the_request(self) -> None:
        # QA: Go's error said "(requires tool:big@1) (request req_…)", this
        # SDK's only "This key may not do that.": a worker refused at start
        # did not say which tool its key lacks.
        err = getratchet.RatchetError(403, "forbidden", "This key may not do that.",
                                      {"required": ["tool:a@1", "tool:b@2"]}, "req_1")
        self.assertEqual(str(err), "ratchet: 403 forbidden: This key may not do that. "
                                   "(requires tool:a@1, tool:b@2) (request req_1)")
        self.assertEqual(err.message, "This key may not do that.")
        err = getratchet.RatchetError(403, "forbidden", "No.", {"any_of": ["runs:read", "runs:write"],
                                                               "required": ["runs:read"]})
        self.assertEqual(str(err), "ratchet: 403 forbidden: No. (requires one of runs:read, runs:write)")
        # Read as Go's AnyOf() reads it (it was in the text alone).
        self.assertEqual((err.any_of, getratchet.RatchetError(403, "forbidden", "No.").any_of),
                         (["runs:read", "runs:write"], []))
        self.assertEqual(str(getratchet.RatchetError(500, "internal_error", "Oops.", {"required": "x"})),
                         "ratchet: 500 internal_error: Oops.")


    def test_an_envelope_with_null_or_odd_fields_reads_as_go_reads_it(self) -> None:
        # SDK QA: a null code and message read "None" ("ratchet: 400 None:
        # None"); Go reads them as empty and leaves them out of its text.
        err = _http._decode_error(400, {"X-Request-Id": "req_3"},
                                  b'{"error":{"code":null,"message":null,"detail":null}}')
        self.assertEqual((err.code, err.message, err.detail, str(err)), ("", "", {}, "ratchet: 400 (request req_3)"))
        err = _http._decode_error(400, {}, b'{"error":{"code":"bad","message":null,"detail":[1]}}')
        self.assertEqual((err.code, err.message, err.detail, str(err)), ("bad", "", {}, "ratchet: 400 bad"))
        self.assertEqual(str(getratchet.RatchetError(502, "", "Bad Gateway")), "ratchet: 502: Bad Gateway")


    def test_a_retry_after_date_is_measured_by_the_servers_clock(self) -> None:
        # As the Go SDK measures it (against the answer's Date): a server
        # whose clock is a year off asks for 30 s, not for none or a year.
        headers = {"Date": "Mon, 01 Jan 2001 00:00:00 GMT", "Retry-After": "Mon, 01 Jan 2001 00:00:30 GMT"}
        self.assertEqual(_http._decode_error(429, headers, b"").retry_after_seconds, 30)
        self.assertEqual(_http._decode_error(503, headers, b"").retry_after_seconds, 30)
        # Without a Date (or one that does not parse), by this clock.
        later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3600))
        for date in (None, "not a date"):
            headers = {"Retry-After": later} if date is None else {"Date": date, "Retry-After": later}
            self.assertIn(_http._decode_error(429, headers, b"").retry_after_seconds, range(3590, 3602))

    def test_every_error_of_the_sdk_survives_pickling(self) -> None:
        # multiprocessing, a ProcessPoolExecutor or a task queue's result
        # backend pickle an exception to raise it in another process:
        # RatchetError(status, code, message...) was pickled as its text
        # alone and unpickling it raised TypeError in its place (so did
        # most of the others, whose parameters are not their args).
        from getratchet import errors as e
        refusal = e.RatchetError(409, "lease_lost", "m", {"attempt": 2}, "req_1", {"error": {}})
        refusal._unconfirmed = True
        samples = [refusal, e.ConnectionLost("lost"), e.RetryableError("x", retry_after_ms=1500),
                   e.NonRetryableError("n"), e.InvalidDecisionError("t@1", {"retryable": 1}, True),
                   e.ReportNotRecorded("m", job_id="j", attempt=2, cause=refusal),
                   e.LeaseLost(job_id="j", attempt=1, tool="t@1", cause=refusal),
                   e.EffectBlocked("eff", {"attempt": 1, "started_at": "", "lease_expired_at": ""}),
                   e.ApprovalRequired("eff", "apr"), e.EffectDenied("eff", refusal), e.EffectInFlight("eff"),
                   e.NotPerformed("np"), e.ResultNotStored("eff", "payload_too_large", {"x": 1}),
                   e.OutcomeNotReported("eff", {"x": 1}, refusal), e.WebhookSignatureError("bad"),
                   e.NoWebhookSecretError()]
        for error in samples:
            again = pickle.loads(pickle.dumps(error))
            self.assertEqual((type(again), str(again), again.args), (type(error), str(error), error.args))
            self.assertEqual({k: repr(v) for k, v in vars(again).items()}, {k: repr(v) for k, v in vars(error).items()})
        again = pickle.loads(pickle.dumps(refusal))
        self.assertEqual((again.status, again.code, again.detail, again.request_id, again.may_have_applied),
                         (409, "lease_lost", {"attempt": 2}, "req_1", True))

    def test_a_retry_after_that_is_no_number_or_date_is_no_wait(self) -> None:
        # A proxy's header in digits str.isdigit() takes and int() does not
        # (a superscript two, as the latin-1 header reads byte 0xB2): it
        # raised ValueError out of the call, and a worker's start() with it,
        # where the Go and TypeScript SDKs read no wait.
        for value in ("\u00b2", "\u00b9\u00b3", "1.5", "-1", "soon"):
            self.assertEqual(_http._decode_error(429, {"Retry-After": value}, b"").retry_after_seconds, 0, value)


class RevokedKeyTest(unittest.TestCase):
    def test_a_claim_refused_401_stops_the_worker(self) -> None:
        # QA: a worker whose key was revoked polled on for ever, each claim
        # refused 401, and start() never returned. It now stops as stop()
        # would: no claim after the 401, the running handler finishes and is
        # reported, and a blocking start() raises the refusal.
        lock, order = threading.Lock(), []
        running, release = threading.Event(), threading.Event()

        def respond(method, path, body):
            with lock:
                if path.endswith("/register"):
                    return 200, {"workerId": "wkr_1"}, {}
                if path.endswith("/claim"):
                    order.append("claim")
                    if order.count("claim") == 1:
                        return 200, {"jobs": [WorkerRulesTest.job(1)]}, {}
                    return 401, error("unauthorized"), {}
                order.append("report")
                return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            running.set()
            release.wait(10)
            return {"ok": True}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", handler)
        errors, raised, returned = [], [], threading.Event()

        def run() -> None:
            try:
                client.worker.start(2, poll_interval=0.05, on_error=errors.append)
            except BaseException as err:  # noqa: BLE001 - the test reads it
                raised.append(err)
            returned.set()

        threading.Thread(target=run, daemon=True).start()
        self.assertTrue(running.wait(5))
        wait_until(lambda: order.count("claim") >= 2)
        release.set()
        self.assertTrue(returned.wait(10), "start() did not return after its key was refused")
        self.assertEqual(len(raised), 1)
        self.assertIsInstance(raised[0], getratchet.RatchetError)
        self.assertEqual(raised[0].status, 401)
        with lock:
            self.assertEqual(order, ["claim", "claim", "report"])
        self.assertTrue(client.worker.stop(1))  # and on_error has been told
        self.assertEqual([getattr(e, "status", None) for e in errors], [401])


class RefusedWorkerTest(unittest.TestCase):
    """A refusal no retry mends stops the worker, the same whichever call
    meets it, as in Go and TypeScript."""

    def test_a_revoked_key_stops_the_worker_whichever_call_meets_it(self) -> None:
        # SDK QA: a heartbeat's or a report's 401 did not stop the worker (it
        # heartbeated on until the lease lapsed, and claimed on until a claim
        # was refused). It stops as a stop whose deadline has passed: no
        # more claims, the handlers still running told to stop at once.
        for call in ("heartbeat", "report"):
            with self.subTest(call=call):
                lock, seen = threading.Lock(), {"claims": 0}

                def respond(method, path, body, call=call, seen=seen):
                    with lock:
                        if path.endswith("/register"):
                            return 200, {"workerId": "wkr_1"}, {}
                        if path.endswith("/claim"):
                            seen["claims"] += 1
                            if seen["claims"] > 1:
                                return 200, {"jobs": []}, {}
                            jobs = [dict(WorkerRulesTest.job(2, timeout_ms=60_000), name="long", leaseMs=3000)]
                            if call == "report":
                                jobs.insert(0, dict(WorkerRulesTest.job(1, timeout_ms=60_000), name="quick"))
                            return 200, {"jobs": jobs}, {}
                        if path.endswith("/heartbeat") and call == "heartbeat":
                            return 401, error("unauthorized"), {}
                        if path.endswith("/heartbeat"):
                            return 200, {"leaseExpiresAt": "2030-01-01T00:00:00Z", "cancelRequested": False}, {}
                        if call == "report" and "job_1" in path:
                            return 401, error("unauthorized"), {}
                        return 200, {"jobId": "job_2", "status": "RETRY_SCHEDULED", "attempt": 1}, {}

                reasons = []

                def long(input, context, reasons=reasons):
                    context.cancelled.wait(30)
                    reasons.append(context.cancel_reason)
                    raise RuntimeError("stopped")

                server = FakeServer(respond)
                self.addCleanup(server.close)
                client = getratchet.Ratchet(server.url, "rk_test")
                client.register_tool("quick", "1", lambda input, context: {"ok": True})
                client.register_tool("long", "1", long)
                errors, raised, returned = [], [], threading.Event()

                def run(client=client, errors=errors, raised=raised, returned=returned) -> None:
                    try:
                        client.worker.start(2, poll_interval=0.05, on_error=errors.append)
                    except BaseException as err:  # noqa: BLE001 - the test reads it
                        raised.append(err)
                    returned.set()

                threading.Thread(target=run, daemon=True).start()
                self.addCleanup(client.worker.stop, 1)
                self.assertTrue(returned.wait(20), f"the worker went on after a {call} refused 401")
                self.assertEqual(reasons, ["stopping"])
                self.assertEqual([getattr(e, "status", None) for e in raised], [401])
                claims = seen["claims"]
                time.sleep(0.2)
                self.assertEqual(seen["claims"], claims)
                first = errors[0]
                self.assertEqual(getattr(first, "status", getattr(first.__cause__, "status", None)), 401, errors)

    def started(self, client: getratchet.Ratchet, on_error) -> Tuple[List[BaseException], threading.Event]:
        """Runs the client's worker's blocking start() on a thread of its own
        (stopped at the test's end): what it raised, and an event set once
        it returned."""
        raised: List[BaseException] = []
        returned = threading.Event()

        def run() -> None:
            try:
                client.worker.start(1, poll_interval=0.01, on_error=on_error)
            except BaseException as err:  # noqa: BLE001 - the test reads it
                raised.append(err)
            returned.set()

        threading.Thread(target=run, daemon=True).start()
        self.addCleanup(client.worker.stop, 1)
        return raised, returned

    def test_start_raises_a_refusal_once_on_error_has_been_told_it(self) -> None:
        # Review: a blocking start() raised the refusal while it still waited
        # for on_error (a slow one, here), so a caller that read what on_error
        # had been told when start() raised missed it; as Go's Stop and
        # TypeScript's start().
        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            return 401, error("unauthorized"), {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        client.register_tool("t", "1", lambda input, context: None)
        errors: List[BaseException] = []

        def slow(err: BaseException) -> None:
            time.sleep(0.2)
            errors.append(err)

        self.addCleanup(client.worker.stop, 1)
        with self.assertRaises(RatchetError) as raised:
            client.worker.start(1, poll_interval=0.01, on_error=slow)
        self.assertEqual(raised.exception.status, 401)
        self.assertEqual([getattr(e, "status", None) for e in errors], [401])

    def test_a_claim_no_retry_mends_stops_the_worker(self) -> None:
        # SDK QA: a claim refused 400, 409 or 422 was asked again at every
        # backoff for as long as the worker ran. The claim's body is the
        # worker's own, so every claim would be refused alike: the worker
        # stops with the refusal. A 404 not_found registers again, once: a
        # claim under the new id answered 404 again, or a registration
        # refused, stops it too.
        cases = [(400, "invalid_request", 0, 1, 1), (409, "invalid_state", 0, 1, 1), (422, "invalid_request", 0, 1, 1),
                 (404, "not_found", 0, 2, 2), (404, "not_found", 400, 1, 2)]
        for status, code, register_again, claims, registrations in cases:
            with self.subTest(status=status, register_again=register_again):
                seen = {"claims": 0, "registrations": 0}

                def respond(method, path, body, status=status, code=code, register_again=register_again, seen=seen):
                    if path.endswith("/register"):
                        seen["registrations"] += 1
                        if seen["registrations"] > 1 and register_again:
                            return register_again, error("invalid_request"), {}
                        return 200, {"workerId": "wkr_1"}, {}
                    seen["claims"] += 1
                    return status, error(code), {}

                server = FakeServer(respond)
                self.addCleanup(server.close)
                client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
                client.register_tool("t", "1", lambda input, context: None)
                raised, returned = self.started(client, lambda err: None)
                self.assertTrue(returned.wait(10), "the worker went on claiming")
                self.assertEqual([getattr(e, "status", None) for e in raised], [register_again or status])
                self.assertEqual((seen["claims"], seen["registrations"]), (claims, registrations))

    def test_an_answer_that_is_not_ratchets_never_stops_the_worker(self) -> None:
        # Review: any 4xx without Ratchet's error envelope (a proxy, a load
        # balancer or a platform answering during a deploy or a misroute)
        # stopped the worker for good. A bare 404 (which registers nothing
        # again), 408, 400 or 401 to a claim, or a registration made again
        # answered a bare 400, may pass: the worker claims again after
        # backoff, as in Go and TypeScript. Ratchet's own refusal stops it.
        claims = [(404, b"Not Found"), (408, b""), (400, b"<html>Bad Request</html>"), (401, b"Unauthorized"),
                  (404, error("not_found")), (409, error("invalid_state"))]
        seen = {"claims": 0, "registrations": 0}

        def respond(method, path, body):
            if path.endswith("/register"):
                seen["registrations"] += 1
                if seen["registrations"] == 2:
                    return 400, b"Bad Request", {}
                return 200, {"workerId": "wkr_1"}, {}
            seen["claims"] += 1
            status, answer = claims[min(seen["claims"], len(claims)) - 1]
            return status, answer, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        client.register_tool("t", "1", lambda input, context: None)
        errors: List[BaseException] = []
        raised, returned = self.started(client, errors.append)
        self.assertTrue(returned.wait(10), "the worker did not stop at Ratchet's 409")
        self.assertEqual([(getattr(e, "status", None), getattr(e, "code", None)) for e in raised],
                         [(409, "invalid_state")])
        self.assertEqual((seen["claims"], seen["registrations"]), (len(claims), 2))
        self.assertTrue(client.worker.stop(1))
        self.assertEqual([getattr(e, "status", None) for e in errors], [404, 408, 400, 401, 404, 400, 409])

    def test_only_ratchets_own_401_says_the_key_was_revoked(self) -> None:
        # A heartbeat's or a report's bare 401 (a proxy's) is that call's
        # failure, not a revoked key that stops the worker.
        self.assertFalse(_key_refused(RatchetError(401, "", "Unauthorized")))
        self.assertTrue(_key_refused(RatchetError(401, "unauthorized", "revoked")))


class OutageTest(unittest.TestCase):
    """A worker never gives up on a server that is down or shedding load, as
    a River or Temporal worker keeps polling; only 401 and 403 stop it."""

    def client(self, respond, max_retries: int = 0) -> Tuple[getratchet.Ratchet, FakeServer]:
        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=max_retries)
        client.register_tool("t", "1", lambda input, context: None)
        return client, server

    def record_pauses(self, client: getratchet.Ratchet) -> List[float]:
        """Records the worker's waits, each cut to a moment; the drawn half
        of each failure's wait is drawn whole."""
        worker, waits = client.worker, []

        def pause(seconds: float) -> None:
            waits.append(seconds)
            worker._stopping.wait(min(seconds, 0.01))

        patcher = mock.patch.object(worker, "_pause", side_effect=pause)
        patcher.start()
        self.addCleanup(patcher.stop)
        drawn = mock.patch("getratchet.worker.random.random", return_value=1.0)
        drawn.start()
        self.addCleanup(drawn.stop)
        return waits

    def test_start_waits_out_an_outage_under_one_key(self) -> None:
        # Worker QA: start() gave up after max_retries, and a process that
        # logged the error ran no worker at all.
        def respond(method, path, body):
            if path.endswith("/register"):
                registrations = sum(1 for s in server.seen if s[1].endswith("/register"))
                return (503, error("service_unavailable"), {}) if registrations <= 3 else (200, {"workerId": "wkr_1"}, {})
            return 200, {"jobs": []}, {}

        client, server = self.client(respond)
        waits = self.record_pauses(client)
        errors: List[BaseException] = []
        client.worker.start(1, poll_interval=2.0, block=False, on_error=errors.append)
        self.addCleanup(client.worker.stop, 5)
        self.assertEqual(client.worker.worker_id, "wkr_1")
        self.assertEqual(waits[:3], [2.0, 4.0, 8.0])
        keys = [s[2].get("Idempotency-Key") for s in server.seen if s[1].endswith("/register")]
        self.assertEqual(len(keys), 4)
        self.assertEqual(len(set(keys)), 1, keys)
        self.assertTrue(client.worker.stop(5))
        self.assertEqual([getattr(e, "status", None) for e in errors], [503, 503, 503])

    def test_start_waits_out_answers_that_are_not_ratchets(self) -> None:
        # Review: start() raised a proxy's bare 400, 401 or 404 (no error
        # envelope) at once, while a running worker asked again after one.
        bare = [(400, b"<html>Bad Request</html>"), (401, b"Unauthorized"), (404, b"Not Found")]

        def respond(method, path, body):
            if path.endswith("/register"):
                registrations = sum(1 for s in server.seen if s[1].endswith("/register"))
                if registrations <= len(bare):
                    return bare[registrations - 1] + ({},)
                return 200, {"workerId": "wkr_1"}, {}
            return 200, {"jobs": []}, {}

        client, server = self.client(respond)
        self.record_pauses(client)
        errors: List[BaseException] = []
        client.worker.start(1, poll_interval=2.0, block=False, on_error=errors.append)
        self.addCleanup(client.worker.stop, 5)
        self.assertEqual(client.worker.worker_id, "wkr_1")
        self.assertTrue(client.worker.stop(5))
        self.assertEqual([getattr(e, "status", None) for e in errors], [400, 401, 404])

    def test_a_start_after_a_refused_one_tells_on_error(self) -> None:
        # start() raised the registration's refusal, its on_error thread
        # ended; a start() after it has a thread of its own to tell its
        # failures (the failed claim here), not one that ended with the first.
        def respond(method, path, body):
            if path.endswith("/register"):
                registrations = sum(1 for s in server.seen if s[1].endswith("/register"))
                return (403, error("forbidden"), {}) if registrations == 1 else (200, {"workerId": "wkr_1"}, {})
            claims = sum(1 for s in server.seen if s[1].endswith("/claim"))
            return (503, error("unavailable"), {}) if claims == 1 else (200, {"jobs": []}, {})

        client, server = self.client(respond)
        with self.assertRaises(RatchetError):
            client.worker.start(1, on_error=lambda err: None)
        errors: List[BaseException] = []
        client.worker.start(1, poll_interval=3600, block=False, on_error=errors.append)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: errors)
        self.assertTrue(client.worker.stop(5))
        self.assertEqual([getattr(e, "status", None) for e in errors], [503])

    def test_a_stop_ends_starts_wait_for_the_server(self) -> None:
        client, server = self.client(lambda method, path, body: (502, error("bad_gateway"), {}))
        raised, returned = start_blocking(client.worker)
        wait_until(lambda: server.seen or returned.is_set())
        self.assertFalse(returned.wait(0.3), raised)  # waiting for the server, not failed
        # The start waits an hour between tries (poll_interval): a stop that
        # did not cut that wait short would time out (False), with no clock
        # read here.
        self.assertTrue(client.worker.stop(5))
        self.assertTrue(returned.wait(5))
        self.assertEqual(raised, [])
        self.assertFalse(any(s[1].endswith("/claim") for s in server.seen))

    def test_claims_that_keep_failing_back_off_and_heed_retry_after(self) -> None:
        # Worker QA: a failed claim was followed by one poll interval, however
        # long the failures lasted, and a 429's Retry-After was heeded only
        # within max_retries.
        claims = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            claims.append(body["claimId"])
            if len(claims) == 4:
                return 429, error("rate_limited", retry_after_seconds=40), {}
            # Nothing was applied: not a lost answer, the claim id is not kept.
            return 503, error("database_unavailable", outcome="not_applied"), {}

        client, _ = self.client(respond)
        waits = self.record_pauses(client)
        errors: List[BaseException] = []
        client.worker.start(1, poll_interval=1.0, block=False, on_error=errors.append)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: len(waits) >= 9)
        self.assertTrue(client.worker.stop(5))
        # The 429's 40 s and its spread, all of it drawn (a fifth more).
        self.assertEqual(waits[:9], [1.0, 2.0, 4.0, 48.0, 16.0, 32.0, 60.0, 60.0, 60.0])
        self.assertGreaterEqual(len(errors), 9)
        self.assertEqual(len(set(claims)), len(claims))

    def test_a_lost_claim_is_asked_again_no_sooner_than_its_retry_after(self) -> None:
        claims = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            claims.append(body["claimId"])
            if len(claims) == 1:
                return 500, error("internal_error"), {}  # may have leased jobs: the claim id is kept
            return 429, error("rate_limited", retry_after_seconds=30), {}

        client, _ = self.client(respond, max_retries=1)
        waits = self.record_pauses(client)
        client.worker.start(1, poll_interval=3600, block=False, on_error=lambda err: None)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: len(waits) >= 1)
        self.assertTrue(client.worker.stop(5))
        self.assertEqual(waits[0], 36.0)  # the Retry-After's 30 s and its spread, all of it drawn
        self.assertEqual(claims[2], claims[0])  # asked again under its id

    def test_a_claim_or_registration_refused_403_stops_the_worker(self) -> None:
        for reregister in (False, True):
            with self.subTest(reregister=reregister):
                paths = []

                def respond(method, path, body):
                    paths.append(path)
                    if path.endswith("/register"):
                        if paths.count(path) > 1:
                            return 403, error("forbidden", required=["tool:t@1"]), {}
                        return 200, {"workerId": "wkr_1"}, {}
                    if reregister:
                        return 404, error("not_found"), {}
                    return 403, error("forbidden", required=["jobs:work"]), {}

                client, _ = self.client(respond)
                errors: List[BaseException] = []
                raised, returned = [], threading.Event()

                def run() -> None:
                    try:
                        client.worker.start(1, poll_interval=0.01, on_error=errors.append)
                    except BaseException as err:  # noqa: BLE001 - the test reads it
                        raised.append(err)
                    returned.set()

                threading.Thread(target=run, daemon=True).start()
                self.addCleanup(client.worker.stop, 1)
                self.assertTrue(returned.wait(10), "the worker went on claiming after a 403")
                self.assertEqual([getattr(e, "status", None) for e in raised], [403])
                self.assertEqual(sum(1 for p in paths if p.endswith("/claim")), 1)
                self.assertTrue(client.worker.stop(1))
                self.assertEqual(getattr(errors[-1], "status", None), 403)


SECRET = "s3cr3t-do-not-log"


def refused_port() -> int:
    """A port on 127.0.0.1 nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DefaultFailureLogTest(unittest.TestCase):
    """Without on_error a worker logs each problem as one line holding none of
    its text, paced to a line a minute (worker QA: a worker retrying against a
    dead or misconfigured server was silent for ever)."""

    def paced(self, client: getratchet.Ratchet, most: int = 1_000_000) -> threading.Event:
        """Paces the worker by a fake clock that each wait advances (the
        drawn half of a failure's wait drawn whole); the wait after the most
        failures blocks until the stop, setting the event it returns."""
        worker, clock, waits, waiting = client.worker, {"now": 0.0}, [], threading.Event()
        worker._failure_log.now = lambda: clock["now"]

        def pause(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) > most:
                waiting.set()
                worker._stopping.wait()
                return
            clock["now"] += seconds
            worker._stopping.wait(0.001)

        for patcher in (mock.patch.object(worker, "_pause", side_effect=pause),
                        mock.patch("getratchet.worker.random.random", return_value=1.0)):
            patcher.start()
            self.addCleanup(patcher.stop)
        return waiting

    def test_an_unreachable_server_is_logged_safely_a_line_a_minute(self) -> None:
        # Nine registrations fail over 183 s (waits of 1, 2, 4 ... 32 s, then
        # a minute): lines at 0 s, 63 s (five left out), 123 s and 183 s.
        port = refused_port()
        client = getratchet.Ratchet(f"http://127.0.0.1:{port}/prefix", "rk_" + SECRET, max_retries=0)
        client.register_tool("t", "1", lambda input, context: None)
        waiting = self.paced(client, most=8)
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            thread = threading.Thread(target=client.worker.start, kwargs={"poll_interval": 1.0}, daemon=True)
            thread.start()
            self.assertTrue(waiting.wait(10))
            self.assertTrue(client.worker.stop(5))
            thread.join(5)
        where = (f'ratchet worker: error=network kind="connection refused" method=POST host=127.0.0.1:{port} '
                 f"path=/prefix/api/v1/workers/register")
        self.assertEqual(logged.output, [f"WARNING:getratchet.worker:{where}",
                                         f"WARNING:getratchet.worker:{where} more_since_last_line=5",
                                         f"WARNING:getratchet.worker:{where}",
                                         f"WARNING:getratchet.worker:{where}"])
        self.assertNotIn(SECRET, "\n".join(logged.output))

    def test_an_api_error_is_logged_without_its_text_and_its_recovery_once(self) -> None:
        claims = []

        def respond(method, path, body):
            if path.endswith("/register"):
                if sum(1 for s in server.seen if s[1].endswith("/register")) <= 3:
                    return 503, {"error": {"code": "service_unavailable", "message": "down: " + SECRET,
                                           "detail": {"input": SECRET}}}, {"X-Request-Id": "req_logged"}
                return 200, {"workerId": "wkr_1"}, {}
            claims.append(body)
            return 200, {"jobs": []}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        client.register_tool("t", "1", lambda input, context: None)
        self.paced(client)
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            client.worker.start(1, poll_interval=1.0, block=False)
            self.addCleanup(client.worker.stop, 5)
            wait_until(lambda: len(claims) >= 20)  # idle claims: no more lines
            self.assertTrue(client.worker.stop(5))
        port = server.url.rsplit(":", 1)[1]
        self.assertEqual(logged.output, [
            "WARNING:getratchet.worker:ratchet worker: error=api status=503 code=service_unavailable "
            f"request_id=req_logged method=POST host=127.0.0.1:{port} path=/api/v1/workers/register",
            "WARNING:getratchet.worker:ratchet worker: recovered after 3 failures",
            # At the stop, the two failures left out are counted (worker QA:
            # their count was dropped), as in Go and TypeScript.
            "WARNING:getratchet.worker:ratchet worker stopped: more_since_last_line=2"])
        self.assertNotIn(SECRET, "\n".join(logged.output))

    def test_a_classifiers_exception_is_logged_by_its_class_alone(self) -> None:
        reported = threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                first = not any(s[1].endswith("/claim") for s in server.seen[:-1])
                return 200, {"jobs": [WorkerRulesTest.job(1)] if first else []}, {}
            reported.set()
            return 200, {"jobId": "job_1", "status": "RETRY_SCHEDULED", "attempt": 1}, {}

        def fail(input, context):
            raise ValueError("input " + SECRET)

        def classify(error, context):
            raise KeyError(str(error))

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", fail, classify_error=classify)
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            client.worker.start(1, poll_interval=0.05, block=False)
            self.addCleanup(client.worker.stop, 5)
            self.assertTrue(reported.wait(10))
            self.assertTrue(client.worker.stop(5))
        self.assertEqual(logged.output, [
            "WARNING:getratchet.worker:ratchet worker: error=KeyError (set on_error to see it)"])
        self.assertNotIn(SECRET, "\n".join(logged.output))

    def test_a_report_not_recorded_is_logged_in_the_go_sdks_shape(self) -> None:
        # SDK QA: it was logged as "error=ReportNotRecorded (set on_error to
        # see it)", Go's with its refusal's status, code and request id.
        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                first = not any(s[1].endswith("/claim") for s in server.seen[:-1])
                return 200, {"jobs": [WorkerRulesTest.job(1)] if first else []}, {}
            return 409, {"error": {"code": "invalid_state", "message": SECRET, "detail": {"leaseLapsed": True}}}, \
                {"X-Request-Id": "req_1"}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: {"secret": SECRET})
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            client.worker.start(1, poll_interval=0.05, block=False)
            self.addCleanup(client.worker.stop, 5)
            wait_until(lambda: any(s[1].endswith("/report") for s in server.seen))
            self.assertFalse(client.worker.stop(5))  # the report was lost
        host = server.url.split("//", 1)[1]
        self.assertEqual(logged.output, [
            "WARNING:getratchet.worker:ratchet worker: report=not_recorded job_id=job_1 attempt=1 error=api status=409 "
            f"code=invalid_state request_id=req_1 method=POST host={host} path=/api/v1/jobs/job_1/report"])

    def test_a_lost_lease_is_logged_by_its_job_and_tool(self) -> None:
        # As in Go and TypeScript: a heartbeat refused for good is logged by
        # what became of the lease, the job, attempt and tool, then the
        # refusal (its text left out); it was not logged at all.
        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                first = not any(s[1].endswith("/claim") for s in server.seen[:-1])
                # A 3 s lease: a heartbeat a second in.
                return 200, {"jobs": [dict(WorkerRulesTest.job(1, timeout_ms=60_000), leaseMs=3000)] if first else []}, {}
            if path.endswith("/heartbeat"):
                return 409, {"error": {"code": "lease_lost", "message": SECRET, "detail": {}}}, {"X-Request-Id": "req_1"}
            return 200, {"jobId": "job_1", "status": body["status"], "attempt": 1}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")

        def handler(input, context):
            context.cancelled.wait(20)
            return {"secret": SECRET}

        client.register_tool("t", "1", handler)
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            client.worker.start(1, poll_interval=0.05, block=False)
            self.addCleanup(client.worker.stop, 5)
            wait_until(lambda: any(s[1].endswith("/report") for s in server.seen), timeout=15)
            self.assertTrue(client.worker.stop(5))
        host = server.url.split("//", 1)[1]
        self.assertEqual(logged.output, [
            "WARNING:getratchet.worker:ratchet worker: lease=lost job_id=job_1 attempt=1 tool=t@1 error=api status=409 "
            f"code=lease_lost request_id=req_1 method=POST host={host} path=/api/v1/jobs/job_1/heartbeat"])

    def test_a_lapsed_lease_is_logged_by_its_job_and_tool(self) -> None:
        from getratchet._failurelog import summary
        self.assertEqual(summary(getratchet.LeaseLost(job_id="job_1", attempt=2, tool="send email@1")),
                         ("lease=lapsed job_id=job_1 attempt=2 tool=send?email@1", False))

    def test_the_refusal_that_stops_the_worker_is_logged_at_once(self) -> None:
        # A second after the line of a failed claim, within the minute: it
        # says why the worker claims no more, so it is not left out.
        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            first = sum(1 for s in server.seen if s[1].endswith("/claim")) == 1
            return (503, error("service_unavailable"), {}) if first else (401, error("unauthorized"), {"X-Request-Id": "req_2"})

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        client.register_tool("t", "1", lambda input, context: None)
        self.paced(client)
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            with self.assertRaises(RatchetError) as raised:
                client.worker.start(1, poll_interval=1.0)
            self.assertTrue(client.worker.stop(5))
        self.assertEqual(raised.exception.status, 401)
        host = server.url.split("//", 1)[1]
        self.assertEqual(logged.output, [
            "WARNING:getratchet.worker:ratchet worker: error=api status=503 code=service_unavailable method=POST "
            f"host={host} path=/api/v1/workers/wkr_1/claim",
            "WARNING:getratchet.worker:ratchet worker refused: error=api status=401 code=unauthorized request_id=req_2 "
            f"method=POST host={host} path=/api/v1/workers/wkr_1/claim"])

    def test_a_worker_that_stops_on_its_own_counts_once_after_its_reports(self) -> None:
        # As in Go and TypeScript: the problems left out are counted once,
        # after the reports of the handlers the refusal cancelled were
        # answered, a report refused among them (closing note 48: Go counted
        # once they were queued, and the report's refusal got a second line
        # at the stop).
        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                first = sum(1 for s in server.seen if s[1].endswith("/claim")) == 1
                return (200, {"jobs": [WorkerRulesTest.job(1, timeout_ms=60_000)]}, {}) if first else \
                    (403, error("forbidden"), {})
            if path.endswith("/heartbeat"):
                return 200, {"leaseExpiresAt": "2030-01-01T00:00:00Z", "cancelRequested": False}, {}
            return 400, error("invalid_request"), {}

        def handler(input, context):
            context.cancelled.wait(10)
            raise RuntimeError("cancelled")

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        client.register_tool("t", "1", handler)
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            with self.assertRaises(RatchetError):
                client.worker.start(2, poll_interval=0.01)
            self.assertFalse(client.worker.stop(5))  # the report was not recorded
        stopped = [line for line in logged.output if "ratchet worker stopped" in line]
        self.assertEqual(stopped, ["WARNING:getratchet.worker:ratchet worker stopped: more_since_last_line=1"],
                         logged.output)

    def test_on_error_replaces_the_log(self) -> None:
        client = getratchet.Ratchet(f"http://127.0.0.1:{refused_port()}", "rk_test", max_retries=0)
        client.register_tool("t", "1", lambda input, context: None)
        waiting = self.paced(client, most=70)
        errors: List[BaseException] = []
        with self.assertNoLogs("getratchet.worker"):
            thread = threading.Thread(target=client.worker.start, daemon=True,
                                      kwargs={"poll_interval": 1.0, "on_error": errors.append})
            thread.start()
            self.assertTrue(waiting.wait(10))
            self.assertTrue(client.worker.stop(5))
            thread.join(5)
        self.assertEqual(len(errors), 71)

    def test_the_summary_holds_no_query_message_or_detail(self) -> None:
        from getratchet._failurelog import summary
        err = RatchetError(502, "bad\ncode\x00", SECRET, {"x": SECRET}, "req 1")
        self.assertEqual(summary(err), ("error=api status=502 code=bad?code? request_id=req?1", True))

        class Request:  # a requests exception's request
            method, url = "POST", f"https://user:{SECRET}@api.example:8443/base/api/v1/jobs/claim?token={SECRET}"

        refused = ConnectionRefusedError(SECRET)
        refused.request = Request()  # type: ignore[attr-defined]
        self.assertEqual(summary(refused), ('error=network kind="connection refused" method=POST '
                                            "host=api.example:8443 path=/base/api/v1/jobs/claim", True))
        self.assertEqual(summary(socket.gaierror(SECRET)), ("error=network kind=dns", True))
        self.assertEqual(summary(TypeError(SECRET)), ("error=TypeError (set on_error to see it)", False))


class NoticesTest(unittest.TestCase):
    """The on_error queue (_Notices) and the default failure log it feeds,
    against the interrupts that may cut the steps that fill and close it."""

    @staticmethod
    def deliver(worker) -> threading.Thread:
        """Starts the worker's on_error thread, as start() does, and answers
        it once it waits for something to deliver."""
        thread = threading.Thread(target=worker._deliver_errors, daemon=True)
        thread.start()

        def waiting() -> bool:
            frame = sys._current_frames().get(thread.ident or 0)  # the innermost: the condition's wait
            return (frame is not None and frame.f_code.co_name == "wait" and frame.f_back is not None
                    and frame.f_back.f_code.co_name == "take")

        wait_until(waiting)
        return thread

    def test_a_close_cut_before_it_woke_the_thread_still_ends_it(self) -> None:
        # A signal storm cut every run of the close step (_despite_interrupts)
        # once it set the flag, before it woke the thread: the thread waited
        # for ever, and each flush after it waited its full second.
        worker = getratchet.Ratchet("http://127.0.0.1:1", "rk_test").worker
        worker._on_error = lambda error: None
        thread = self.deliver(worker)
        with mock.patch.object(worker._errors, "_wake", side_effect=KeyboardInterrupt):
            with self.assertRaises(KeyboardInterrupt):
                getratchet.worker._despite_interrupts(worker._close_errors)
        thread.join(10)  # hang guard: it ends once it looks at the flag
        self.assertFalse(thread.is_alive(), "the closed queue's thread was never woken")
        worker._flush_errors()
        self.assertEqual(worker._errors.unfinished_tasks, 0)

    def test_a_job_told_twice_is_counted_once_by_the_default_log(self) -> None:
        # A step cut after it told a job given up, before it marked it told,
        # is run again and tells it again (_tell_given_up): on_error hears of
        # it once, and the default log counted it twice among the problems
        # left out since its last line.
        worker = getratchet.Ratchet("http://127.0.0.1:1", "rk_test").worker
        worker._failure_log.now = lambda: 0.0  # all within a minute: one line, the rest left out
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            thread = self.deliver(worker)
            worker._tell(TypeError())
            notice = getratchet.ReportNotRecorded("given up", job_id="job_1", attempt=1)
            for _ in range(2):
                worker._tell(notice, key=("given up", "job_1", 1))
            worker._close_errors()
            thread.join(10)  # hang guard
        self.assertFalse(thread.is_alive())
        self.assertEqual(logged.output, [
            "WARNING:getratchet.worker:ratchet worker: error=TypeError (set on_error to see it)",
            "WARNING:getratchet.worker:ratchet worker stopped: more_since_last_line=1"])


def quick_backoff(test: unittest.TestCase) -> None:
    """Has the transport back off from 50 ms up to 200 ms (not 0.5 s up to
    8 s) between attempts until test ends, for a test about what is
    repeated rather than how long it waits."""
    for name, value in (("BACKOFF_BASE", 0.05), ("BACKOFF_CAP", 0.2)):
        patcher = mock.patch.object(_http, name, value)
        patcher.start()
        test.addCleanup(patcher.stop)


class WorkerRulesTest(unittest.TestCase):
    def serve(self, respond, handler, concurrency=1, poll_interval=0.05,
              stop_grace=1.0) -> Tuple[getratchet.Ratchet, FakeServer]:
        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", handler)
        client.worker.start(concurrency, poll_interval=poll_interval, block=False, stop_grace=stop_grace)
        self.addCleanup(client.worker.stop, 5)
        return client, server

    @staticmethod
    def job(n: int, timeout_ms: int = 5000) -> dict:
        return {"jobId": f"job_{n}", "stepId": "s", "runId": "r", "name": "t", "version": "1", "attempt": 1,
                "leaseToken": f"tok_{n}", "leaseMs": timeout_ms + 10_000, "timeoutMs": timeout_ms,
                "idempotencyKey": "k", "input": {}}

    def one_job_beats(self, lease_ms: int, beat, **said) -> Tuple[Callable, dict]:
        """A responder that registers the worker, leases it one job (a 60 s
        timeout, lease_ms, and the fields in said) at its first claim and
        none after, answers each heartbeat beat(n) (n from 1) and records each
        report; and what it saw."""
        lock, seen = threading.Lock(), {"claims": 0, "reports": [], "beats": 0}

        def respond(method, path, body):
            with lock:
                if path.endswith("/register"):
                    return 200, {"workerId": "wkr_1"}, {}
                if path.endswith("/claim"):
                    seen["claims"] += 1
                    return 200, {"jobs": [dict(self.job(1, timeout_ms=60_000), leaseMs=lease_ms, **said)]
                                 if seen["claims"] == 1 else []}, {}
                if path.endswith("/heartbeat"):
                    seen["beats"] += 1
                    return beat(seen["beats"])
                seen["reports"].append(body)
                return 200, {"jobId": "job_1", "status": body["status"], "attempt": 1}, {}

        return respond, seen

    def beat_waits(self) -> List[float]:
        """Has each heartbeat wait 10 ms instead of what it asks for, which
        goes in the list returned, its backoff's jitter drawing half."""
        drawn = mock.patch("getratchet.worker.random.random", return_value=0.5)
        drawn.start()
        self.addCleanup(drawn.stop)
        waits: List[float] = []
        real = getratchet.worker.Worker._beat_pause

        def pause(worker, active, seconds):
            waits.append(seconds)
            return real(worker, active, 0.01)

        patcher = mock.patch.object(getratchet.worker.Worker, "_beat_pause", autospec=True, side_effect=pause)
        patcher.start()
        self.addCleanup(patcher.stop)
        return waits

    def test_a_handler_that_ignores_its_timeout_keeps_its_slot(self) -> None:
        lock, state = threading.Lock(), {"running": 0, "most": 0, "claimed": 0}

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                with lock:
                    state["claimed"] += 1
                    n = state["claimed"]
                return 200, {"jobs": [self.job(n, timeout_ms=100)] if n <= 3 else []}, {}
            return 200, {"jobId": "x", "status": "RETRY_SCHEDULED", "attempt": 1}, {}

        def stubborn(input, context):
            with lock:
                state["running"] += 1
                state["most"] = max(state["most"], state["running"])
            time.sleep(0.4)  # ignores context.cancelled, past the grace (0.1 s here)
            with lock:
                state["running"] -= 1

        # The grace after a timeout, 1 s, shortened: what it is does not matter here.
        grace = mock.patch.object(getratchet.worker, "_TIMEOUT_GRACE", 0.1)
        grace.start()
        self.addCleanup(grace.stop)
        client, server = self.serve(respond, stubborn)
        wait_until(lambda: state["claimed"] > 3)
        self.assertEqual(state["most"], 1)
        timeouts = [s for s in server.seen if s[1].endswith("/report")]
        self.assertTrue(all(s[3]["error"]["message"] == "handler timed out after 100ms" for s in timeouts))

    def test_an_async_handler_is_awaited(self) -> None:
        # Its coroutine was reported as an output that is not JSON, a
        # non-retryable failure: every job exhausted without running.
        claims = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                claims.append(1)
                return 200, {"jobs": [self.job(1)] if len(claims) == 1 else []}, {}
            return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        async def handler(input, context):
            import asyncio
            await asyncio.sleep(0)
            return {"sent": context.job_id}

        _, server = self.serve(respond, handler)
        wait_until(lambda: any(s[1].endswith("/report") for s in server.seen))
        report = [s[3] for s in server.seen if s[1].endswith("/report")][0]
        self.assertEqual((report["status"], report.get("output")), ("SUCCEEDED", {"sent": "job_1"}))

    def test_a_generator_handler_is_refused_at_registration(self) -> None:
        # Its body never runs when called: the generator was reported as an
        # output that is not JSON, and every job exhausted unrun.
        client = getratchet.Ratchet("http://127.0.0.1:9", "rk_test")
        self.addCleanup(client.close)

        def handler(input, context):
            yield {"sent": True}

        async def async_handler(input, context):
            yield {"sent": True}

        for generator in (handler, async_handler):
            with self.assertRaisesRegex(TypeError, "generator function"):
                client.register_tool("t", "1", generator)

    def test_no_claim_while_a_report_is_failing(self) -> None:
        order, failures = [], {"left": 2}

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                order.append("claim")
                return 200, {"jobs": [self.job(1)] if order.count("claim") == 1 else []}, {}
            if failures["left"]:
                failures["left"] -= 1
                order.append("report failed")
                return 503, error("internal_error"), {}
            order.append("report")
            return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        # With a second slot free, only the failing report holds the claims.
        # The server logs a failure before the worker has read it, so a claim
        # sent in between would be logged after it (a CI flake at a 50 ms
        # poll): the idle wait is made far longer than that window.
        self.serve(respond, lambda input, context: {"ok": True}, concurrency=2, poll_interval=0.3)
        wait_until(lambda: order.count("claim") >= 3)
        first_report = order.index("report")
        self.assertEqual(order[:first_report + 1], ["claim", "report failed", "report failed", "report"])

    def test_a_report_failing_on_its_own_does_not_hold_the_claims(self) -> None:
        # QA: one report the server kept failing (a 500 for its output)
        # held every claim, though the server recorded other reports: the
        # worker stalled. As in Go, once the server records another report
        # after its failure began, it fails for a reason of its own.
        # job_1's slot is freed once its report is queued, before its first
        # failure: its lease, 3 s, within the 5 s margin, holds the claims
        # from then (_report_lapsing), so that no claim comes before it
        # fails, until it is found failing on its own.
        lock, order = threading.Lock(), []

        def respond(method, path, body):
            with lock:
                if path.endswith("/register"):
                    return 200, {"workerId": "wkr_1"}, {}
                if path.endswith("/claim"):
                    order.append("claim")
                    return 200, {"jobs": [dict(self.job(1), leaseMs=3000), self.job(2)]
                                 if order.count("claim") == 1 else []}, {}
                if ("job_1" in path or "job_1" in json.dumps(body)) and order.count("claim") < 2:
                    order.append("job_1 failed")
                    return 500, error("internal_error"), {}
                order.append("recorded")
                return 200, {"jobId": "job_x", "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            if context.job_id == "job_2":
                job_1_sent_again(order)  # reported after job_1's report began failing
            return {"ok": True}

        self.serve(respond, handler, concurrency=2)
        wait_until(lambda: order.count("claim") >= 2 and order.count("recorded") >= 2, timeout=15)
        with lock:
            second_claim = [i for i, o in enumerate(order) if o == "claim"][1]
            self.assertIn("job_1 failed", order[:second_claim])
            self.assertIn("recorded", order[:second_claim], "claims resumed once another report was recorded")

    def test_a_report_found_failing_on_its_own_wakes_the_claims(self) -> None:
        # A report found failing on its own stopped holding the claims, but
        # the claim loop saw it only at its next check (up to a second
        # late). With that check an hour apart, the claim comes only if the
        # change wakes it: job_1's deciding failure is answered once job_2's
        # slot is freed, so nothing else wakes the loop after it. job_1's
        # slot is freed once its report is queued, before its first failure:
        # its lease, 3 s, within the 5 s margin, holds the claims from then
        # (_report_lapsing), so that no claim comes before it fails.
        patcher = mock.patch("getratchet.worker._CLAIM_CHECK", 3600.0)
        patcher.start()
        self.addCleanup(patcher.stop)
        lock, order, worker = threading.Lock(), [], {}

        def settled() -> bool:
            w = worker["w"]
            with w._lock:
                return w._running == 0 and not any(k[0] == "job_2" for k in w._active)

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            with lock:
                if path.endswith("/claim"):
                    order.append("claim")
                    return 200, {"jobs": [dict(self.job(1), leaseMs=3000), self.job(2)]
                                 if order.count("claim") == 1 else []}, {}
                job_1 = "job_1" in path or "job_1" in json.dumps(body)
                if not job_1:
                    order.append("recorded")
                    return 200, {"jobId": "job_2", "status": "SUCCEEDED", "attempt": 1}, {}
                if order.count("claim") >= 2:
                    order.append("job_1 recorded")
                    return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}
                deciding = "recorded" in order
                order.append("job_1 failed")
            if deciding:
                wait_until(settled, timeout=10)
            return 500, error("internal_error"), {}

        def handler(input, context):
            if context.job_id == "job_2":
                job_1_sent_again(order)  # reported after job_1's report began failing
            return {"ok": True}

        quick_backoff(self)
        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", handler)
        worker["w"] = client.worker
        client.worker.start(2, poll_interval=0.05, block=False)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: order.count("claim") >= 2, timeout=10)
        with lock:
            second_claim = [i for i, o in enumerate(order) if o == "claim"][1]
            self.assertIn("recorded", order[:second_claim])
            self.assertIn("job_1 failed", order[:second_claim])

    def test_a_report_failing_on_its_own_holds_no_claim_after_its_lease_lapses(self) -> None:
        # A report the server keeps failing on while it records others held
        # the claims again once its lease lapsed (the lapsing check took it
        # for one not yet answered): one bad output stalled the worker.
        lock, order = threading.Lock(), []

        def respond(method, path, body):
            with lock:
                if path.endswith("/register"):
                    return 200, {"workerId": "wkr_1"}, {}
                if path.endswith("/claim"):
                    order.append("claim")
                    first = order.count("claim") == 1
                    return 200, {"jobs": [dict(self.job(1), leaseMs=500), self.job(2)] if first else []}, {}
                if "job_1" in path or "job_1" in json.dumps(body):
                    order.append("job_1 failed")
                    return 500, error("internal_error"), {}
                order.append("recorded")
                return 200, {"jobId": "job_2", "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            if context.job_id == "job_2":
                job_1_sent_again(order)  # reported after job_1's report began failing
            return {"ok": True}

        # The stop gives job_1's report up soon: twice the grace past its deadline.
        quick_backoff(self)
        client, _ = self.serve(respond, handler, concurrency=2, stop_grace=0.25)
        wait_until(lambda: "recorded" in order and order.count("job_1 failed") >= 3, timeout=15)
        time.sleep(0.7)  # job_1's lease (500 ms) has lapsed
        with lock:
            claims = order.count("claim")
        wait_until(lambda: order.count("claim") > claims + 2, timeout=5)
        client.worker.stop(0)  # job_1's report is given up at once, not 5 s on

    def test_a_report_that_hangs_does_not_hold_the_others(self) -> None:
        # QA: one hung delivery held every other report of the worker for its
        # 30 s; their leases lapsed and another worker ran those jobs again.
        lock, order, release = threading.Lock(), [], threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                with lock:
                    order.append("claim")
                    return 200, {"jobs": [self.job(1), self.job(2)] if order.count("claim") == 1 else []}, {}
            job = "job_1" if ("job_1" in path or "job_1" in json.dumps(body)) else "job_2"
            with lock:
                first = job == "job_1" and "sent job_1" not in order
                order.append("sent " + job)
            if first:
                release.wait(10)  # black-holed
            with lock:
                order.append("recorded " + job)
            return 200, {"jobId": job, "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            if context.job_id == "job_2":
                wait_until(lambda: "sent job_1" in order)  # finishes while job_1's delivery hangs
            return {"ok": True}

        self.serve(respond, handler, concurrency=2)
        self.addCleanup(release.set)  # before the stop, which would wait for it
        wait_until(lambda: "recorded job_2" in order, timeout=5)
        self.assertNotIn("recorded job_1", order, "job_2's report went while job_1's still hung")

    def test_a_stop_waits_for_a_second_attempt_of_a_job_whose_first_report_fails(self) -> None:
        # QA: with job_1's first report failing on its own, the worker claimed
        # job_1 again (attempt 2) once its lease lapsed; keyed by job id, the
        # second attempt's entry was overwritten and then removed by the
        # first's end, and stop() returned while attempt 2 still ran.
        lock, order, started2 = threading.Lock(), [], threading.Event()

        def respond(method, path, body):
            with lock:
                if path.endswith("/register"):
                    return 200, {"workerId": "wkr_1"}, {}
                if path.endswith("/claim"):
                    order.append("claim")
                    n = order.count("claim")
                    if n == 1:
                        return 200, {"jobs": [dict(self.job(1), leaseMs=500), self.job(2)]}, {}
                    if "recorded job_2" in order and not started2.is_set() and "job_1 failed" in order:
                        time.sleep(0.6)  # job_1's first lease (500 ms) has lapsed: attempt 2 is handed out
                        return 200, {"jobs": [dict(self.job(1), attempt=2, leaseToken="tok_1b")]}, {}
                    return 200, {"jobs": []}, {}
                text = path + json.dumps(body)
                if "tok_1b" in text:
                    order.append("recorded job_1 attempt 2")
                    return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 2}, {}
                if "job_1" in text:
                    order.append("job_1 failed")
                    if started2.is_set():
                        return 409, error("lease_lost", attempt=2), {}
                    return 500, error("internal_error"), {}
                order.append("recorded job_2")
                return 200, {"jobId": "job_2", "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            if context.job_id == "job_2":
                job_1_sent_again(order)  # reported after job_1's report began failing
            if context.attempt == 2:
                started2.set()
                time.sleep(0.5)
            return {"ok": True}

        quick_backoff(self)
        client, _ = self.serve(respond, handler, concurrency=2)
        self.assertTrue(started2.wait(15), order)
        client.worker.stop(10)
        with lock:
            self.assertIn("recorded job_1 attempt 2", order, "stop() returned before attempt 2 was reported")

    def test_a_report_delivery_that_hangs_is_sent_again(self) -> None:
        # QA: a delivery waited the client's whole timeout (60 s) on a
        # connection that hung, every other report behind it. Each now waits
        # at most the report timeout (30 s; here half a second) and is repeated.
        calls, release = {"n": 0}, threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                first = not calls.get("claimed")
                calls["claimed"] = True
                return 200, {"jobs": [self.job(1)] if first else []}, {}
            calls["n"] += 1
            if calls["n"] == 1:
                release.wait(10)  # the first delivery's answer never comes in time (until the test ends)
            return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(release.set)  # first: the server closes once its hung answer ends
        patcher = mock.patch("getratchet.worker._REPORT_TIMEOUT", 0.5)
        patcher.start()
        self.addCleanup(patcher.stop)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: {"ok": True})
        client.worker.start(1, poll_interval=0.05, block=False)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: calls["n"] >= 2, timeout=10)
        self.assertTrue(client.worker.stop(5))

    def test_a_heartbeat_refusal_ends_the_attempt_as_in_go_and_typescript(self) -> None:
        # The rule the three workers share (READMEs): a heartbeat answered
        # 409, 404 or 403 cancels the handler as lease lost and nothing is
        # reported but a success after lease_lost; anything else (a 502,
        # say; a 401 stops the worker) is a failed heartbeat, tried again
        # until the lease passes its end, when the handler is cancelled too
        # and its success reported.
        cases = [(409, "lease_lost", True), (409, "invalid_state", False), (404, "not_found", False),
                 (403, "forbidden", False), (502, "bad_gateway", True)]
        self.beat_waits()  # heartbeats 10 ms apart: the lease (1.5 s, room for a loaded machine) passes its end soon
        for status, code, success_reported in cases:
            respond, seen = self.one_job_beats(1500, lambda n, status=status, code=code: (status, error(code), {}))

            reasons = []

            def handler(input, context, reasons=reasons):
                context.cancelled.wait(20)
                reasons.append(context.cancel_reason)
                return {"ok": True}

            client, _ = self.serve(respond, handler)
            wait_until(lambda: reasons, timeout=15)
            self.assertEqual(reasons, ["lease_lost"], code)
            if success_reported:
                wait_until(lambda: seen["reports"], timeout=5)
            else:
                time.sleep(0.3)
            self.assertEqual([r["status"] for r in seen["reports"]], ["SUCCEEDED"] if success_reported else [], code)
            # A refusal ends the heartbeats at once; a failed one is tried
            # again until the lease's end.
            self.assertTrue(seen["beats"] == 1 if status != 502 else seen["beats"] >= 2, (code, seen["beats"]))

    def test_a_bare_heartbeat_refusal_is_a_failure_that_may_pass(self) -> None:
        # A 403, 404 or 409 without Ratchet's error envelope (a proxy's or a
        # load balancer's bare answer during a deploy or a misroute) says
        # nothing of the lease: a failed heartbeat, tried again, the handler
        # left running, as in Go and TypeScript (review: it was cancelled
        # as lease lost and its failure dropped).
        self.beat_waits()  # heartbeats 10 ms apart
        for status in (403, 404, 409):
            def beat(n, status=status):
                if n <= 2:
                    return status, {"message": "Not Found"}, {}
                return 200, {"leaseExpiresAt": "2099-01-01T00:00:00Z", "cancelRequested": False}, {}

            respond, seen = self.one_job_beats(60_000, beat)
            reasons = []

            def handler(input, context, reasons=reasons, seen=seen):
                wait_until(lambda: seen["beats"] >= 3 or context.cancelled.is_set(), timeout=15)
                reasons.append(context.cancel_reason)
                return {"ok": True}

            client, _ = self.serve(respond, handler)
            wait_until(lambda: seen["reports"], timeout=15)
            self.assertEqual(reasons, [None], status)
            self.assertEqual([r["status"] for r in seen["reports"]], ["SUCCEEDED"], status)

    def test_on_error_is_told_a_lost_lease_by_its_job_attempt_and_tool(self) -> None:
        # As in Go and TypeScript: the handler cancelled as lease_lost, on_error
        # is told a LeaseLost naming the attempt, with the heartbeat's
        # refusal as its cause, or none when the lease lapsed while
        # heartbeats failed (it was told nothing of either).
        self.beat_waits()  # heartbeats 10 ms apart: the lease (1.5 s, room for a loaded machine) lapses soon
        for status, code in ((409, "lease_lost"), (502, "bad_gateway")):
            respond, seen = self.one_job_beats(1500, lambda n, status=status, code=code: (status, error(code), {}))
            server = FakeServer(respond)
            self.addCleanup(server.close)
            client = getratchet.Ratchet(server.url, "rk_test")
            client.register_tool("t", "1", lambda input, context: context.cancelled.wait(20) and None)
            told: List[BaseException] = []
            client.worker.start(1, poll_interval=0.05, block=False, on_error=told.append)
            self.addCleanup(client.worker.stop, 5)
            wait_until(lambda: any(isinstance(e, getratchet.LeaseLost) for e in told), timeout=15)
            self.assertTrue(client.worker.stop(5))
            lost = [e for e in told if isinstance(e, getratchet.LeaseLost)]
            self.assertEqual([(e.job_id, e.attempt, e.tool) for e in lost], [("job_1", 1, "t@1")], code)
            if status == 409:
                self.assertIsInstance(lost[0].__cause__, RatchetError)
                self.assertEqual(lost[0].__cause__.code, "lease_lost")
            else:
                self.assertIsNone(lost[0].__cause__)
                self.assertIn("before it lapsed", str(lost[0]))

    def test_a_lease_a_long_poll_made_look_lapsed_is_heartbeated(self) -> None:
        # A long-polling claim is answered when a job falls due, up to
        # wait_seconds after it was sent, and the job's lease runs from then:
        # a lease shorter than the wait (a 1 s timeout and the server's 10 s
        # grace, under wait_seconds 20), read from the claim's sending, looks
        # lapsed before the handler starts. A heartbeat is tried before the
        # lease is taken for lost, as in Go and TypeScript (review: the
        # handler was cancelled as lease lost a second in, never
        # heartbeated, and its job ran again once its real lease lapsed).
        # Here the claim is answered 700 ms after it was sent, with a lease
        # of 500 ms.
        respond, seen = self.one_job_beats(
            500, lambda n: (200, {"leaseExpiresAt": "2099-01-01T00:00:00Z", "cancelRequested": False}, {}))
        held = threading.Event()

        def slow_first_claim(method, path, body):
            if path.endswith("/claim") and not held.is_set():
                held.set()
                time.sleep(0.7)  # the long poll waited; not a timing assertion
            return respond(method, path, body)

        server = FakeServer(slow_first_claim)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        reasons: List[Optional[str]] = []

        def handler(input, context):
            wait_until(lambda: seen["beats"] >= 1 or context.cancelled.is_set(), timeout=15)
            reasons.append(context.cancel_reason)
            return {"ok": True}

        client.register_tool("t", "1", handler)
        told: List[BaseException] = []
        client.worker.start(1, poll_interval=0.05, wait_seconds=20, block=False, on_error=told.append)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: seen["reports"], timeout=15)
        self.assertEqual(reasons, [None])
        self.assertEqual([r["status"] for r in seen["reports"]], ["SUCCEEDED"])
        self.assertEqual([e for e in told if isinstance(e, getratchet.LeaseLost)], [])

    def test_a_heartbeat_refused_once_the_handler_is_done_tells_no_lost_lease(self) -> None:
        # A heartbeat in flight when the handler returns, answered 409
        # invalid_state once the report landed, lost nothing: the report
        # settled the attempt, and on_error is told nothing of a lease.
        self.beat_waits()  # the first heartbeat goes out at once, not a third of the lease on
        told = self.heartbeat_answered_after_the_report(409, error("invalid_state"))
        self.assertEqual([e for e in told if isinstance(e, getratchet.LeaseLost)], [])

    def test_a_heartbeat_failed_once_the_handler_is_done_is_not_told(self) -> None:
        # Nor is one that failed (a 5xx, a lost answer) told to on_error: the attempt is
        # over, and the Go and TypeScript workers end the heartbeat before
        # reporting, so they never see its answer (review: this worker told
        # on_error, and its default log, of a heartbeat of a finished job).
        self.beat_waits()  # the first heartbeat goes out at once, not a third of the lease on
        told = self.heartbeat_answered_after_the_report(503, error("internal"))
        self.assertEqual([e for e in told if isinstance(e, RatchetError)], [])
        told = self.heartbeat_answered_after_the_report(0, None)  # no answer: a lost connection
        self.assertEqual([e for e in told if isinstance(e, ConnectionLost)], [])

    def test_a_heartbeat_refused_401_once_the_handler_is_done_does_not_stop_the_worker(self) -> None:
        # As in Go and TypeScript, which end the heartbeat as the handler
        # returns: a revoked key's 401 answering a heartbeat of a finished
        # job is not read (review: it stopped the worker after the report).
        self.beat_waits()  # the first heartbeat goes out at once, not a third of the lease on
        refused: List[bool] = []
        told = self.heartbeat_answered_after_the_report(401, error("unauthorized"), refused)
        self.assertEqual([e for e in told if isinstance(e, RatchetError)], [])
        self.assertEqual(refused, [False])

    def heartbeat_answered_after_the_report(self, status: int, body: dict,
                                            refused: Optional[List[bool]] = None) -> List[BaseException]:
        """Runs one job whose heartbeat is in flight when its handler
        returns, held until the report lands and then answered status and
        body; answers what on_error was told, and appends to refused
        whether the worker was refused before it was stopped. The report
        goes out once the heartbeats ended (they are ended, not awaited, as
        the handler returns; review: they were not joined)."""
        reported = threading.Event()
        seen = {"claims": 0, "beats": 0}
        beats_ended = threading.Event()
        beats_before_report: List[bool] = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                seen["claims"] += 1
                return 200, {"jobs": [dict(self.job(1, timeout_ms=60_000), leaseMs=3000)]
                             if seen["claims"] == 1 else []}, {}
            if path.endswith("/heartbeat"):
                seen["beats"] += 1
                reported.wait(10)
                return status, body, {}
            beats_before_report.append(beats_ended.is_set())
            reported.set()
            return 200, {"jobId": "job_1", "status": body["status"], "attempt": 1}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: wait_until(lambda: seen["beats"] >= 1) or {"ok": True})
        real = getratchet.worker.Worker._heartbeats

        def heartbeats(worker, active):
            real(worker, active)
            if refused is not None:
                # Held until the report lands, or a second at most: a report
                # sent without waiting for the heartbeats lands meanwhile.
                reported.wait(1)
            beats_ended.set()

        told: List[BaseException] = []
        with mock.patch.object(getratchet.worker.Worker, "_heartbeats", autospec=True, side_effect=heartbeats):
            client.worker.start(1, poll_interval=0.05, block=False, on_error=told.append)
            self.addCleanup(client.worker.stop, 5)
            self.assertTrue(beats_ended.wait(15))
            self.assertTrue(reported.wait(15))
            self.assertEqual(beats_before_report, [True])
            if refused is not None:
                refused.append(client.worker._refused is not None)
            self.assertTrue(client.worker.stop(5))  # on_error told what was queued
        return told

    def test_a_rate_limited_heartbeat_heeds_retry_after_within_the_lease(self) -> None:
        # As in Go and TypeScript: a heartbeat answered 429 is tried again
        # after its Retry-After when that comes before the next heartbeat
        # would, and at the usual third of the lease left when it would not
        # (sdk QA: Go waited out the whole Retry-After, this SDK ignored it).
        def beat(n):
            if n <= 2:
                return 429, error("rate_limited", retry_after_seconds=5 if n == 1 else 50), {}
            return 200, {"leaseExpiresAt": "2030-01-01T00:00:00Z", "cancelRequested": False}, {}

        # A 60 s timeout and a 70 s lease: a heartbeat every 20 s.
        respond, seen = self.one_job_beats(70_000, beat)

        def handler(input, context):
            wait_until(lambda: seen["beats"] >= 4)
            return {"ok": True}

        waits = self.beat_waits()
        client, _ = self.serve(respond, handler)
        wait_until(lambda: seen["beats"] >= 4)
        self.assertTrue(client.worker.stop(5))
        # The first Retry-After's 5 s and half of its fifth drawn as spread.
        self.assertEqual([round(w * 4) / 4 for w in waits[:4]], [20, 5.5, 20, 20])

    def test_a_stop_sends_a_returned_handlers_report_until_twice_the_grace(self) -> None:
        # One rule in the three SDKs: every report is sent until the stop's
        # deadline and twice the grace, whenever its handler returned (Go's
        # Stop gave the report of a handler that had returned one grace past
        # the deadline, and lost it). Here the handler returned before the
        # stop and the server takes reports from one and a half graces past
        # the deadline.
        grace, take_from, failing = 1.0, [float("inf")], threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                return 200, {"jobs": [self.job(1, timeout_ms=60_000)] if not failing.is_set() else []}, {}
            if time.monotonic() >= take_from[0]:
                return 200, {"jobId": "job_1", "status": body["status"], "attempt": 1}, {}
            failing.set()
            return 503, error("database_unavailable"), {}

        quick_backoff(self)
        client, _ = self.serve(respond, lambda input, context: {"ok": True}, stop_grace=grace)
        self.assertTrue(failing.wait(15))  # hang guard: the handler returned, its report is refused
        take_from[0] = time.monotonic() + 0.1 + 1.5 * grace
        self.assertTrue(client.worker.stop(0.1), "the report was given up before the deadline and twice the grace")

    def test_a_stop_with_no_deadline_sends_the_reports(self) -> None:
        # stop(math.inf), as Go's Stop under a context without a deadline:
        # threading's waits end by TIMEOUT_MAX, and it raised OverflowError
        # out of stop() and the worker's loop, the running job left
        # unreported. Its handler, released as the stop is asked, now
        # returns and is reported, and stop() answers True.
        respond, seen = self.one_job_beats(70_000, lambda n: (200, {"leaseExpiresAt": "2099-01-01T00:00:00Z",
                                                                    "cancelRequested": False}, {}))
        running, release = threading.Event(), threading.Event()

        def handler(input, context):
            running.set()
            release.wait(15)  # hang guard
            return {"ok": True}

        self.addCleanup(release.set)  # before the worker's stop, should an assertion fail first
        client, _ = self.serve(respond, handler)
        self.assertTrue(running.wait(15))  # hang guard
        stopped: List[object] = []
        stopping = threading.Thread(target=lambda: stopped.append(self.stop_catching(client, math.inf)))
        stopping.start()
        release.set()
        stopping.join(30)  # hang guard
        self.assertEqual((stopped, [r["status"] for r in seen["reports"]]), ([True], ["SUCCEEDED"]))
        with self.assertRaises(ValueError):
            client.worker.stop(float("nan"))

    @staticmethod
    def stop_catching(client: getratchet.Ratchet, timeout: float) -> object:
        try:
            return client.worker.stop(timeout)
        except BaseException as failure:  # noqa: BLE001 - the test compares it
            return failure

    def test_without_lease_ms_the_lease_is_read_from_its_expiry(self) -> None:
        # Drift QA: against a server that sends no leaseMs the worker assumed
        # the timeout plus 10 s (the server's default grace); the Go and
        # TypeScript workers read what is left of the lease by its
        # leaseExpiresAt, as this one now does.
        self.assert_lease_read_from_expiry(timedelta(0))

    def test_without_lease_ms_the_lease_is_read_by_the_servers_date(self) -> None:
        # The expiry less the claim answer's Date, as Go's worker and a gate
        # lease read it: a server clock an hour ahead made the 30 s lease
        # read as an hour and 30 s here (a heartbeat at 20 s, the timeout's
        # third), as one an hour behind made it read as lapsed.
        self.assert_lease_read_from_expiry(timedelta(hours=1))

    def assert_lease_read_from_expiry(self, skew: timedelta) -> None:
        """A 60 s timeout and a 30 s lease (a short grace) from a server
        whose clock (its expiries and its answers' Date) runs skew ahead of
        this process's, without leaseMs: a heartbeat within 10 s, not 20 s."""
        def server_now() -> datetime:
            return datetime.now(timezone.utc) + skew

        def in_30_s() -> str:
            return (server_now() + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")

        def beat(n):
            return 200, {"leaseExpiresAt": in_30_s(), "cancelRequested": False}, {}

        respond, seen = self.one_job_beats(0, beat, leaseExpiresAt=in_30_s())

        def dated(method, path, body):
            status, answer, headers = respond(method, path, body)
            return status, answer, dict(headers, Date=format_datetime(server_now(), usegmt=True))

        waits = self.beat_waits()
        client, _ = self.serve(dated, lambda input, context: wait_until(lambda: seen["beats"] >= 2) or {"ok": True})
        wait_until(lambda: seen["beats"] >= 2)
        self.assertTrue(client.worker.stop(5))
        self.assertTrue(len(waits) >= 2 and all(5 < w <= 10 for w in waits[:2]), waits)

    def test_a_failed_heartbeat_backs_off_within_the_lease(self) -> None:
        # As in Go and TypeScript: a heartbeat that failed (a 5xx, a lost
        # answer) is tried again after a backoff from a second, doubled at
        # each failure in a row (1, 2, 4 s), half of it drawn at random as
        # after failed claims (here half of that half: 0.75, 1.5, 3 s), never
        # past the third of the lease left, and after one that worked at that
        # third again (sdk QA: this SDK waited the third at once, Go retried
        # inside its client; every worker tried again at the same marks).
        waits = self.beat_waits()
        answers = {1: (500, error("internal_error"), {}), 2: (0, None, {}), 3: (503, error("service_unavailable"), {}),
                   5: (502, error("bad_gateway"), {})}
        ok = (200, {"leaseExpiresAt": "2030-01-01T00:00:00Z", "cancelRequested": False}, {})
        # Answered by the waits so far, so that a lost answer's one repeat on
        # a new connection (the transport's, within one try) is lost too.
        respond, seen = self.one_job_beats(70_000, lambda n: answers.get(len(waits), ok))

        def handler(input, context):
            wait_until(lambda: len(waits) >= 6)
            return {"ok": True}

        client, _ = self.serve(respond, handler)
        wait_until(lambda: seen["reports"])
        self.assertTrue(client.worker.stop(5))
        # A 60 s timeout and a 70 s lease: a heartbeat every 20 s.
        self.assertEqual([round(w * 4) / 4 for w in waits[:6]], [20, 0.75, 1.5, 3, 20, 0.75])

    def test_the_heartbeat_backoff_is_jittered_and_never_waits_past_a_third_of_the_lease_left(self) -> None:
        # As in Go and TypeScript: drawn between half and all of 1, 2, 4,
        # 8 s... as failed claims' backoff (sdk QA: every worker tried again
        # at the same marks after an outage), never past every, a third of
        # the lease left, nor is a Retry-After, which is honoured within it.
        down = RatchetError(503, "service_unavailable", "down")
        limited = RatchetError(429, "rate_limited", "slow down", {"retry_after_seconds": 30})
        unavailable = RatchetError(503, "", "Service Unavailable", {"retry_after_seconds": 30})  # a proxy's Retry-After
        cases = [(20.0, None, 0, 0.0, 20.0), (20.0, down, 1, 1.0, 1.0), (20.0, down, 1, 0.0, 0.5),
                 (20.0, ConnectionLost("lost"), 2, 1.0, 2.0), (20.0, ConnectionLost("lost"), 2, 0.5, 1.5),
                 (20.0, down, 4, 0.0, 4.0), (10.0, down, 5, 1.0, 10.0), (3.0, down, 3, 1.0, 3.0),
                 (60.0, down, 60, 1.0, 60.0), (20.0, limited, 1, 0.0, 20.0), (60.0, limited, 1, 0.0, 30.0),
                 (60.0, limited, 1, 0.5, 33.0),  # and up to a fifth more, drawn
                 (20.0, limited, 1, 1.0, 20.0),
                 (60.0, unavailable, 1, 0.0, 30.0), (60.0, unavailable, 1, 0.5, 33.0)]  # a 503's spread alike
        for every, failed, failures, drawn, want in cases:
            with mock.patch("getratchet.worker.random.random", return_value=drawn):
                self.assertEqual(_beat_wait(every, failed, failures), want, (every, failed, failures, drawn))

    def test_one_heartbeat_is_cut_off_at_a_third_of_the_lease_left(self) -> None:
        # As in Go and TypeScript: at least a second, so that a hung call
        # leaves two thirds of the lease for the tries after it (sdk QA:
        # this SDK cut it at 10 s, past the end of a short lease).
        for left, want in [(60.0, 20.0), (9.0, 3.0), (2.0, 1.0), (0.1, 1.0)]:
            self.assertEqual(_beat_cutoff(left), want, left)

    def test_a_stop_gives_cancelled_handlers_the_stop_grace_ten_seconds_by_default(self) -> None:
        # A handler told to stop at the deadline that returns within the
        # grace (a call it was in ended first) is reported as it returned:
        # the grace is 10 s by default, as in the Go and TypeScript workers
        # (it was 1 s here, and such a handler was left running unreported
        # beside the attempt another worker began once its lease lapsed);
        # stop_grace sets it. One that outlasts it is left unreported. The
        # worker's clock is frozen and moved on by the test, so nothing waits
        # the grace out: the supervisor waits for exactly the grace, still
        # waits once the clock is a millisecond short of its end, and gives
        # the handler up only once the clock reaches it.
        self.assertEqual(getratchet.worker.DEFAULT_STOP_GRACE, 10.0)
        clock = _MovedClock(frozen=True)
        moved = mock.patch("getratchet.worker.time", clock)
        moved.start()
        self.addCleanup(moved.stop)
        waits: List[Optional[float]] = []  # the supervisor's waits for its handler
        watch_supervisor_waits(self, waits.append)
        for stop_grace, grace in ((None, 10.0), (0.5, 0.5)):
            for returns in (True, False):
                with self.subTest(grace=grace, returns=returns):
                    del waits[:]
                    self.grace_case(clock, waits, stop_grace, grace, returns)
        with self.assertRaises(ValueError):
            getratchet.Ratchet("http://127.0.0.1:1", "rk_test").worker.start(1, stop_grace=-1)

    def grace_case(self, clock: "_MovedClock", waits: List[Optional[float]], stop_grace: Optional[float],
                   grace: float, returns: bool) -> None:
        client, reports = one_job(self, self.job(1, timeout_ms=60_000))
        running, release = threading.Event(), threading.Event()
        self.addCleanup(release.set)

        def handler(input, context):
            running.set()
            context.cancelled.wait(60)  # hang guard
            release.wait(60)  # a call it was in (hang guard: the test ends it sooner)
            return {"finished": context.cancel_reason}

        client.register_tool("t", "1", handler)
        errors: List[BaseException] = []
        options = {} if stop_grace is None else {"stop_grace": stop_grace}
        client.worker.start(1, poll_interval=0.05, on_error=errors.append, block=False, **options)
        self.assertTrue(running.wait(10))  # hang guard
        answers: List[bool] = []
        stopper = threading.Thread(target=lambda: answers.append(client.worker.stop(0)), daemon=True)
        stopper.start()
        wait_until(lambda: any(w is not None and abs(w - grace) < 1e-9 for w in waits))  # the grace begun, exactly
        wake = next(iter(client.worker._active.values())).wake
        if returns:
            clock.offset += grace - 0.001
            seen = len(waits)
            wake.set()
            wait_until(lambda: any(w is not None and w < 0.002 for w in waits[seen:]))  # its last millisecond
            release.set()
        else:
            clock.offset += grace
            wake.set()
        stopper.join(30)  # hang guard
        self.assertEqual(answers, [returns])
        self.assertEqual(reports, [{"leaseToken": "tok_1", "status": "SUCCEEDED", "output": {"finished": "stopping"}}]
                         if returns else [])
        self.assertEqual([type(e) for e in errors], [] if returns else [getratchet.ReportNotRecorded])

    def test_a_stop_cuts_a_delivery_still_in_flight_at_its_give_up_time(self) -> None:
        # QA: a report delivery in flight when the stop gave up was not cut;
        # it waited out its own timeout (30 s), stop() returned while the
        # thread still sent, and on_error heard of the loss later.
        hung, release, claims = threading.Event(), threading.Event(), {"n": 0}

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                claims["n"] += 1
                return 200, {"jobs": [self.job(1)] if claims["n"] == 1 else []}, {}
            hung.set()
            release.wait(60)  # the report's answer never comes
            return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(release.set)  # before the server's close, which waits for its connections
        errors: List[BaseException] = []
        # The answer never comes and the delivery's timeout is an hour: only
        # the stop's cut can end it. stop() waits at most its deadline and
        # twice the grace, so the worker being done when it returns, and
        # on_error told, show the cut.
        patched = mock.patch.object(getratchet.worker, "_REPORT_TIMEOUT", 3600.0)
        patched.start()
        self.addCleanup(patched.stop)
        client = getratchet.Ratchet(server.url, "rk_test", timeout=3600)
        client.register_tool("t", "1", lambda input, context: {"ok": True})
        client.worker.start(1, poll_interval=0.05, block=False, on_error=errors.append, stop_grace=0.25)
        self.assertTrue(hung.wait(10))
        self.assertFalse(client.worker.stop(0.2), "a report was not recorded")
        self.assertTrue(client.worker._done.is_set(), "the delivery in flight was not cut")
        self.assertTrue(any(isinstance(e, getratchet.ReportNotRecorded) and "job_1" in str(e) for e in errors),
                        errors)
        reports = [seen for seen in server.seen if seen[1].endswith("/report")]
        self.assertEqual(len(reports), 1, "not sent again after the cut")

    def test_a_stop_ends_a_reports_wait_between_attempts_at_its_give_up_time(self) -> None:
        # Review: a report waiting out a 429's Retry-After (a minute and up
        # to a fifth more) when the stop came slept it out whole: the give-up
        # time cut a delivery in flight but not the wait between two, so
        # stop() returned at its bound with the worker not done, on_error
        # told of the loss only a minute later, and a blocking start() held
        # that long past its deadline and twice the grace.
        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                first = not any(seen[1].endswith("/claim") for seen in server.seen[:-1])
                return 200, {"jobs": [self.job(1)] if first else []}, {}
            return 429, error("rate_limited"), {"Retry-After": "60"}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        errors: List[BaseException] = []
        client = getratchet.Ratchet(server.url, "rk_test", timeout=5)
        self.addCleanup(client.close)
        client.register_tool("t", "1", lambda input, context: {"ok": True})
        client.worker.start(1, poll_interval=0.05, block=False, on_error=errors.append, stop_grace=0.25)
        # The report was refused once and is waiting to be sent again (its
        # on_retry runs once the wait was allowed, just before it begins).
        wait_until(lambda: client.worker._failing)
        self.assertFalse(client.worker.stop(0.2), "a report was not recorded")
        self.assertTrue(client.worker._done.is_set(), "the report's wait outlasted the stop's give-up time")
        self.assertTrue(any(isinstance(e, getratchet.ReportNotRecorded) and "job_1" in str(e) for e in errors),
                        errors)
        reports = [seen for seen in server.seen if seen[1].endswith("/report")]
        self.assertEqual(len(reports), 1, "not sent again after the give-up time")

    def test_no_claim_while_a_report_in_flight_nears_its_lease_end(self) -> None:
        # QA: a report whose answer hangs (a black-holed connection) was
        # not "failing" until its 60 s timeout, so the worker kept claiming,
        # was handed its own lapsed job and ran it again.
        order, claims, claimed_again = [], {"n": 0}, threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                claims["n"] += 1
                order.append("claim")
                if claims["n"] == 2:
                    claimed_again.set()
                job = dict(self.job(1), leaseMs=2000)  # lapses 2 s after the claim
                return 200, {"jobs": [job] if claims["n"] == 1 else []}, {}
            if path.endswith("/heartbeat"):
                return 200, {"leaseExpiresAt": "2030-01-01T00:00:00Z", "cancelRequested": False}, {}
            order.append("report sent")
            time.sleep(2.0)  # the report's answer comes late
            order.append("report")
            return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            # A slot is free and nothing reports yet: the worker claims
            # again while the handler runs, as it may (flake hunt: on a
            # loaded machine that claim came before the report). The
            # handler ends once it did, and the next claim comes a poll
            # interval (1 s) after it, while the report (2 s) is in flight:
            # the one this test holds back.
            self.assertTrue(claimed_again.wait(10))
            return {"ok": True}

        self.serve(respond, handler, concurrency=2, poll_interval=1.0)
        wait_until(lambda: "report" in order and "claim" in order[order.index("report"):])
        self.assertEqual(order[:4], ["claim", "claim", "report sent", "report"])

    def test_a_batch_never_names_a_job_twice(self) -> None:
        # QA: two attempts of one job (the second claimed after the first's
        # lease lapsed) reported in one batch: the server refuses the second
        # (invalid_request, "appears twice"), and the newest outcome was lost.
        from getratchet.worker import _Report, _Reporter
        reporter = _Reporter(getratchet.Ratchet("http://127.0.0.1:9", "rk_test")._transport)
        reports = [_Report(job_id, {"status": "SUCCEEDED"}, lambda wait: True, lambda: None)
                   for job_id in ("job_1", "job_2", "job_1", "job_3")]
        reporter._queue.extend(reports)
        self.assertEqual([r.job_id for r in reporter._take()], ["job_1", "job_2", "job_3"])
        self.assertEqual(reporter._queue, [reports[2]])  # the newer attempt goes next, alone

    def test_a_batch_sent_report_by_report_sends_a_few_at_a_time(self) -> None:
        # Drift QA: a batch the server refused whole (413 "too much", say)
        # went out again as all its single reports at once, one per job
        # thread; the Go SDK sends them singleReportsInFlight at a time, and
        # so do the Python and TypeScript workers now.
        from getratchet.worker import _Reporter
        patched = mock.patch.object(getratchet.worker, "_SINGLE_REPORTS_IN_FLIGHT", 2)
        patched.start()
        self.addCleanup(patched.stop)
        total = 6
        cond = threading.Condition()
        state = {"in": 0, "peak": 0, "singles": []}

        class Transport:
            timeout = 30.0

            def call_until(self, method, path, body, **kwargs):
                if path == "/jobs/report":
                    raise RatchetError(413, "payload_too_large", "too many reports")
                with cond:
                    state["in"] += 1
                    state["peak"] = max(state["peak"], state["in"])
                    state["singles"].append(path)
                    # Held while more could come in (not a timing
                    # assertion: without the bound all six come in at once).
                    cond.wait_for(lambda: state["in"] > 2, timeout=0.2)
                    cond.notify_all()
                    state["in"] -= 1
                return {}

        reporter = _Reporter(Transport())
        with reporter._cond:
            reporter._in_flight = 3  # every report queues, to go as one batch
        threads = [threading.Thread(target=reporter.deliver, args=(f"job_{i}", {"status": "SUCCEEDED"}),
                                    kwargs={"may_wait": lambda wait: True, "on_retry": lambda: None})
                   for i in range(1, total + 1)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(reporter._queue) == total)
        with reporter._cond:
            reporter._in_flight = 0
            reporter._cond.notify_all()
        for thread in threads:
            thread.join(10)
        self.assertEqual(sorted(state["singles"]), [f"/jobs/job_{i}/report" for i in range(1, total + 1)])
        self.assertEqual(state["peak"], 2)

    def test_a_lost_claim_is_asked_again_after_a_backoff_not_a_poll_interval(self) -> None:
        # Go SDK QA (the same here): a claim whose answer was lost was asked
        # again only a whole poll interval later, and its jobs' leases lapsed.
        ids, reported = [], threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                ids.append(body["claimId"])
                if len(ids) <= 4:
                    return 502, error("bad_gateway"), {}  # the claim and its retries: a proxy lost the answers
                return 200, {"jobs": [self.job(1)] if len(ids) == 5 else []}, {}
            reported.set()
            return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        quick_backoff(self)  # 50 to 200 ms: still far from the poll interval
        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: {"ok": True})
        client.worker.start(1, poll_interval=3600, block=False)
        self.addCleanup(client.worker.stop, 5)
        self.assertTrue(reported.wait(20), ids)
        self.assertEqual(len(set(ids[:5])), 1, ids)

    def test_a_stop_asks_again_under_a_lost_claims_id(self) -> None:
        # Go SDK QA (the same here): a stop while a claim whose answer was
        # lost waited to be asked again ended the asking; its jobs lapsed.
        ids, answering, reported = [], threading.Event(), threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                ids.append(body["claimId"])
                if not answering.is_set():
                    return 502, error("bad_gateway"), {}  # a proxy lost the answer
                return 200, {"jobs": [self.job(1)]}, {}
            reported.set()
            return 200, {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}, {}

        quick_backoff(self)
        server = FakeServer(respond)
        self.addCleanup(server.close)
        errors: List[BaseException] = []
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: {"ok": True})
        client.worker.start(1, poll_interval=3600, block=False, on_error=errors.append)
        wait_until(lambda: len(ids) >= 4)  # the claim and its three retries, answers lost
        time.sleep(0.1)  # the worker waits a backoff to ask again, or asks and waits again
        result: List[bool] = []
        stopper = threading.Thread(target=lambda: result.append(client.worker.stop(15)))
        stopper.start()
        wait_until(lambda: client.worker._stopping.is_set())
        answering.set()
        stopper.join(20)
        self.assertEqual(result, [True], errors)
        self.assertTrue(reported.is_set())
        self.assertEqual(len(set(ids)), 1, ids)

    def test_a_stop_cuts_a_claim_still_unanswered_at_its_deadline(self) -> None:
        # QA: the transport went on retrying a black-holed claim after stop()
        # returned (a minute a try), and its jobs were leased to a worker
        # that had stopped. Cut at the deadline, the claim is given up: stop()
        # answers False and on_error says so.
        ids, release = [], threading.Event()

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            ids.append(body["claimId"])
            release.wait(3600)  # black-holed
            return 200, {"jobs": []}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(release.set)
        errors: List[BaseException] = []
        # The claim's timeout is an hour: only the cut at the deadline can
        # end it. stop() waits at most its deadline and twice the grace, so
        # the worker being done when it returns shows the cut.
        client = getratchet.Ratchet(server.url, "rk_test", timeout=3600)
        client.register_tool("t", "1", lambda input, context: None)
        client.worker.start(1, poll_interval=3600, block=False, on_error=errors.append, stop_grace=0.25)
        wait_until(lambda: len(ids) >= 1)
        self.assertFalse(client.worker.stop(0.5), "a claim that may have leased jobs was given up")
        self.assertTrue(client.worker._done.is_set(), "the unanswered claim was not cut")
        self.assertTrue(any("claim whose answer was lost" in str(e) for e in errors), errors)
        sent = len(ids)
        time.sleep(0.5)
        self.assertEqual(len(ids), sent, "nothing claimed after stop() returned")

    def test_a_claim_answer_the_stop_cuts_short_is_a_lost_claim_not_an_answer(self) -> None:
        # QA: a stop's deadline shuts the socket of a claim in flight, and
        # http.client reads the end of the socket as the end of the head or
        # of a body without a length: a head cut after its status line read
        # as a 200 with no body, the claim was taken as answered (None.get
        # raised out of the loop) and stop() answered True while the jobs it
        # leased were left to lapse. Go and TypeScript fail such a read (a
        # lost answer): the claim is given up, as one unanswered.
        heads = {"after its status line": b"HTTP/1.1 200 OK\r\n",
                 "in a body without a length": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"}
        for case, head in heads.items():
            with self.subTest(case):
                url, claims, release, held_out = self.cutting_server(head)
                errors: List[BaseException] = []
                client = getratchet.Ratchet(url, "rk_test")
                client.register_tool("t", "1", lambda input, context: None)
                client.worker.start(1, poll_interval=3600, block=False, on_error=errors.append)
                wait_until(lambda: claims)
                self.assertFalse(client.worker.stop(0.5), "a claim that may have leased jobs was given up")
                # The stop's deadline cut the claim: the server never let go
                # of it (QA: a head saying Connection: close left the abort
                # no socket to shut, and the stop waited for the server).
                self.assertEqual(held_out, [], "the stop waited for the server to end the claim")
                self.assertTrue(any("claim whose answer was lost" in str(e) for e in errors), errors)
                release.set()

    def cutting_server(self, head: bytes, cut: bytes = b"/claim") -> Tuple[str, list, threading.Event, list]:
        """A server that registers the worker and answers each call to a
        path ending with cut (its claims) with head alone, then nothing
        until released; its URL, the calls it cut, the release and the calls
        it ended itself, unreleased, once its hang guard (10 s) lapsed."""
        listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(listener.close)
        claims: list = []
        held_out: list = []
        release = threading.Event()
        self.addCleanup(release.set)

        def answer(conn: socket.socket) -> None:
            with conn, conn.makefile("rb") as rfile:
                while True:
                    line = rfile.readline()
                    if not line:
                        return
                    length = 0
                    for header in iter(rfile.readline, b"\r\n"):
                        if not header:
                            return
                        if header.lower().startswith(b"content-length:"):
                            length = int(header.split(b":")[1])
                    rfile.read(length)
                    if not line.split()[1].endswith(cut):
                        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{"workerId":"wkr_1"}')
                        continue
                    claims.append(line)
                    conn.sendall(head)
                    if not release.wait(10):  # hang guard
                        held_out.append(line)  # before the connection closes
                    return

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return  # the test ended
                threading.Thread(target=answer, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return "http://127.0.0.1:%d" % listener.getsockname()[1], claims, release, held_out

    def test_a_registration_the_stop_cuts_short_ends_start_as_the_stop_does(self) -> None:
        # The same cut of a registration in flight at the stop's deadline
        # read as a 200 with no body: start() raised a TypeError
        # (None["workerId"]) instead of returning, having run nothing.
        url, calls, _, _ = self.cutting_server(b"HTTP/1.1 200 OK\r\n", cut=b"/register")
        client = getratchet.Ratchet(url, "rk_test")
        client.register_tool("t", "1", lambda input, context: None)
        raised, returned = start_blocking(client.worker)
        wait_until(lambda: calls)
        client.worker.stop(0.5)
        self.assertTrue(returned.wait(10))
        self.assertEqual(raised, [])
        self.assertIsNone(client.worker.worker_id)

    def test_a_claim_answered_without_its_object_is_asked_again_under_its_id(self) -> None:
        # An empty 2xx is no claim's answer (a head cut after its status line
        # by the server's side reads as one): asked again under its id, as a
        # lost answer, not raised out of the loop (QA: None.get).
        ids = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            ids.append(body["claimId"])
            return (200, None, {}) if len(ids) == 1 else (200, {"jobs": []}, {})

        client, _ = self.serve(respond, lambda input, context: None, poll_interval=3600)
        wait_until(lambda: len(ids) >= 2)
        self.assertEqual(ids[0], ids[1])
        self.assertTrue(client.worker._loop_thread.is_alive())

    def test_a_stop_cuts_a_claims_rate_limit_wait(self) -> None:
        # QA: a claim waiting out a 429's Retry-After held stop() for it, then
        # to the stop's deadline. Ended at the stop; the 429 leased nothing, so
        # nothing was given up.
        errors: List[BaseException] = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            return 429, error("rate_limited", retry_after_seconds=3600), {"Retry-After": "3600"}

        # The wait and the stop's deadline are an hour: only the stop ending
        # the wait at once lets stop() return (the hang guard tells if not).
        patched = mock.patch.object(_http, "MAX_RATE_LIMIT_WAIT", 3600)
        patched.start()
        self.addCleanup(patched.stop)
        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: None)
        client.worker.start(1, poll_interval=3600, block=False, on_error=errors.append)
        wait_until(lambda: any(s[1].endswith("/claim") for s in server.seen))
        result: List[bool] = []
        stopper = threading.Thread(target=lambda: result.append(client.worker.stop(3600.0)), daemon=True)
        stopper.start()
        stopper.join(60)
        self.assertFalse(stopper.is_alive(), "stop() held for the 429's wait")
        self.assertEqual(result, [True], errors)
        self.assertFalse(any("claim whose answer was lost" in str(e) for e in errors), errors)
        # Nor is the 429 the stop cut told as a failed claim, as in Go and
        # TypeScript (QA: on_error got it at every stop of a rate-limited worker).
        self.assertEqual(errors, [])

    def test_a_claim_whose_answer_was_lost_is_asked_again_under_its_id(self) -> None:
        ids = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            ids.append(body["claimId"])
            if len(ids) <= 6:
                # The call and its three retries (and the one repeat of its
                # first, sent on a kept connection) lose their answers, and
                # so does the next claim's first attempt.
                return 0, None, {}
            return 200, {"jobs": []}, {}

        quick_backoff(self)
        self.serve(respond, lambda input, context: None)
        wait_until(lambda: len(ids) >= 8)
        # The next claim after the lost ones asks again under the same id;
        # an answered claim's successor gets a new one.
        self.assertEqual(len(set(ids[:7])), 1, ids)
        self.assertNotEqual(ids[7], ids[6])

    def test_an_unknown_worker_id_registers_again(self) -> None:
        claims = []

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_%d" % (len(claims) + 1)}, {}
            claims.append(path)
            if path == "/api/v1/workers/wkr_1/claim":
                return 404, error("not_found"), {}
            return 200, {"jobs": []}, {}

        self.serve(respond, lambda input, context: None)
        wait_until(lambda: len(claims) >= 2)
        self.assertEqual(claims[:2], ["/api/v1/workers/wkr_1/claim", "/api/v1/workers/wkr_2/claim"])


def deep(levels: int, inner: str = "[]") -> str:
    """A JSON text nesting levels objects {"a": ...} around inner."""
    return '{"a":' * levels + inner + "}" * levels


class DeepJSONTest(unittest.TestCase):
    """The API takes values nested 10 000 levels deep (a claim answer
    carries an input three levels further): the json module raises
    RecursionError near 1 000 (on Python 3.12 and later at the C stack's
    own limit), so one deep input made a whole claim answer unreadable and
    its jobs lapsed unrun, again at every claim."""

    def test_a_deep_value_reads_and_writes_as_sent_without_touching_the_recursion_limit(self) -> None:
        limit = sys.getrecursionlimit()
        text = deep(9990, '[1,-0.0,1e400,12345678901234567890123,"\\u00e9\\ud83d\\ude00",{"k":1,"k":2},null]')
        with self.assertRaises(RecursionError):
            json.loads(text)
        value = _json.loads(text.encode())
        inner = value
        for _ in range(9990):
            inner = inner["a"]
        self.assertEqual(repr(inner), repr([1, -0.0, float("inf"), 12345678901234567890123, "\u00e9\U0001F600",
                                            {"k": 2}, None]))
        # Written back as json.dumps writes (ensure_ascii): the escapes as
        # sent, the repeated key once, with its last value.
        self.assertEqual(_json.dumps(value, separators=(",", ":"), allow_nan=True),
                         text.replace("1e400", "Infinity").replace('"k":1,', ""))
        self.assertEqual(_json.dumps(value, allow_nan=True)[:12], '{"a": {"a": ')
        with self.assertRaises(ValueError):
            _json.dumps(value)  # Infinity is no JSON number, as json.dumps says
        self.assertEqual(sys.getrecursionlimit(), limit)

    def test_the_deep_reader_and_writer_answer_as_json_does(self) -> None:
        texts = ['{"a":1,"a":2,"b":3}', '{"b":1,"a":2,"b":3}', ' [1 , 2 ]\n', "1e400", "-1e400",
                 "[NaN,Infinity,-Infinity]",
                 "-0", "-0.0", "0.1e1", "1E+2", "5e-324", "1.7976931348623157e308", '"\\ud83d\\ude00"', '"\\ud800"',
                 '{"\\u0061":1}', "1" * 300, '"\\"\\\\\\/\\b\\f\\n\\r\\t"', "{}", "[]", "[{}]", '{"a":[]}',
                 '"\u00e9\u2028"', "true", "false", "null",
                 # and the same refusals, at the same place
                 "\ufeff[]", "[1,]", '{"a":1,}', "[1 2]", '{"a" 1}', "{1:2}", "01", "1.", ".5", "[-]", "nul",
                 '"\u0001"', "[\u0661]", '{"a":1}x', "", "tru", '"abc', "[", '{"a":', "1" * 5000]
        for text in texts + [t.encode() for t in texts] + ["[1]".encode("utf-16"), "[1]".encode("utf-32-le")]:
            with self.subTest(text=text[:40]):
                # A refusal's wording and place change between Python
                # versions (3.13 names a trailing comma); its kind does not.
                try:
                    want = ("ok", repr(json.loads(text)))
                except ValueError as err:
                    want = ("refused", type(err).__name__)
                try:
                    got = ("ok", repr(_json._loads(text)))
                except ValueError as err:
                    got = ("refused", type(err).__name__)
                self.assertEqual(got, want)
        values = [None, True, False, 0, -1, 2 ** 70, 1.5, -0.0, 0.1, 1e300, 5e-324, "",
                  "a\"b\\c\n\u0000\u007f\u00e9\ud800\U0001F600",
                  [], {}, [[], {}], {"k": [1, {"x": None}], "é": (1, 2)}, {1.5: 1, True: 2, None: 3, 7: 4, False: 5},
                  float("nan"), [float("inf")], {(1,): 1}, object(), [1, {1}]]
        cycle: list = []
        cycle.append(cycle)
        for value in values + [cycle]:
            for separators in (None, (",", ":")):
                with self.subTest(value=repr(value)[:40], separators=separators):
                    try:
                        want = ("ok", json.dumps(value, separators=separators, allow_nan=False))
                    except (TypeError, ValueError) as err:
                        want = (type(err).__name__,)
                    try:
                        got = ("ok", _json._dumps(value, *(separators or (", ", ": ")), False))
                    except (TypeError, ValueError) as err:
                        got = (type(err).__name__,)
                    self.assertEqual(got, want)

    def test_a_deep_input_is_run_beside_its_claims_other_job(self) -> None:
        reports = {}
        levels = 9990

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                if reports or any(p.endswith("/claim") for _, p, _, _ in server.seen[:-1]):
                    return 200, {"jobs": []}, {}
                normal = json.dumps(WorkerRulesTest.job(1))
                deep_job = json.dumps(WorkerRulesTest.job(2))[:-len('{}}')] + deep(levels) + "}"
                return 200, ('{"jobs":[' + deep_job + "," + normal + "]}").encode(), {}
            if path == "/api/v1/jobs/report":  # the two together, in one batch
                reports.update({item["jobId"]: item for item in body["reports"]})
                return 200, {"results": [{"jobId": item["jobId"], "status": "SUCCEEDED", "attempt": 1}
                                         for item in body["reports"]]}, {}
            reports[path.split("/")[-2]] = body
            return 200, {"jobId": "x", "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            depth = 0
            while isinstance(input, dict) and "a" in input:
                input, depth = input["a"], depth + 1
            return {"levels": depth} if context.job_id == "job_1" else {"a": {"echo": depth}}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", handler)
        client.worker.start(2, poll_interval=0.05, block=False)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: len(reports) == 2)
        self.assertEqual(reports["job_1"]["output"], {"levels": 0})
        self.assertEqual(reports["job_2"]["output"], {"a": {"echo": levels}})

    def test_a_deep_output_is_written_and_one_too_deep_fails_its_job_alone(self) -> None:
        # A report the server refuses at body: only the output can make it
        # unreadable (nested deeper than the server reads). Its lease
        # lapsed and the job ran again until its attempts ran out.
        reports = []
        levels = {"job_1": 9990, "job_2": 10000}  # arrays: the report's body is one level more

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                claims = sum(p.endswith("/claim") for _, p, _, _ in server.seen)
                return 200, {"jobs": [WorkerRulesTest.job(claims)] if claims <= 2 else []}, {}
            # As sent (the fake's json reads it, or not, by the Python
            # version's own limit).
            body = body if isinstance(body, bytes) else _json.dumps(body, separators=(",", ":")).encode()
            reports.append((path, body))
            if body.count(b"[") > 9999:
                return 400, error("invalid_request", validation=[{
                    "field": "body", "message": "nests arrays and objects more than 10000 levels deep"}]), {}
            return 200, {"jobId": "x", "status": "SUCCEEDED", "attempt": 1}, {}

        def handler(input, context):
            output = None
            for _ in range(levels[context.job_id]):
                output = [output]
            return output

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", handler)
        client.worker.start(1, poll_interval=0.05, block=False)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: len(reports) == 3)
        self.assertEqual([path for path, _ in reports],
                         ["/api/v1/jobs/job_1/report"] + ["/api/v1/jobs/job_2/report"] * 2)
        self.assertEqual(reports[0][1], b'{"leaseToken":"tok_1","status":"SUCCEEDED","output":' +
                         b"[" * 9990 + b"null" + b"]" * 9990 + b"}")
        self.assertEqual(json.loads(reports[2][1]), {"leaseToken": "tok_2", "status": "FAILED", "error": {
            "message": "handler output refused by the server at body", "retryable": False}})


class BatchedReportsTest(unittest.TestCase):
    """Reports of jobs that finish together go out as one batch, each
    answered in its own slot as its single report would be."""

    def setUp(self) -> None:
        # One delivery in flight, so that the reports made while job_1's is
        # held up form one batch: what a batch's answers mean does not depend
        # on how many are in flight (three, the worker's own; see
        # test_a_report_that_hangs_does_not_hold_the_others).
        patcher = mock.patch("getratchet.worker._REPORTS_IN_FLIGHT", 1)
        patcher.start()
        self.addCleanup(patcher.stop)

    def run_jobs(self, n: int, answer_item, batch_route: bool = True, poll_interval: float = 0.05,
                 garble=lambda results: results):
        """Runs n jobs claimed at once (job_1 returns first, the others once
        its report reached the server, which holds it until they returned)
        and stops the worker.
        answer_item(job_id, report) answers one report, single or batched
        (a batch fails whole, as the server's transaction does, when one of
        its reports meets a 5xx; garble(results) is a batch's answer). Returns the server, what it recorded (job
        id -> report), the requests in the order they were answered, the
        errors told and stop()'s answer."""
        lock = threading.Lock()
        state = {"claims": 0, "reports": 0, "others_done": 0}
        # job_1's report is the first the server sees, and it is held until
        # the others' handlers returned, whatever the machine's load (a
        # CI flake: with a fixed 0.1 s head start, job_1's thread ran late
        # under load and another job's report came first).
        first_report_seen, others_done = threading.Event(), threading.Event()
        if n == 1:
            others_done.set()
        recorded = {}
        answered = set()  # jobs whose report met an answer other than a 5xx
        order: List[Tuple[str, int]] = []

        def queued() -> int:
            reporter = client.worker._reporter
            with reporter._cond:
                return len(reporter._queue)

        def respond(method, path, body):
            answer = answer_request(method, path, body)
            order.append((path, answer[0]))
            return answer

        def answer_request(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                with lock:
                    state["claims"] += 1
                    first = state["claims"] == 1
                return 200, {"jobs": [WorkerRulesTest.job(i) for i in range(1, n + 1)] if first else []}, {}
            with lock:
                state["reports"] += 1
                first = state["reports"] == 1
            if first:
                first_report_seen.set()
                others_done.wait(10)  # the others finish meanwhile
                wait_until(lambda: queued() >= n - 1)  # and their reports are queued
            if path != "/api/v1/jobs/report":
                job_id = path.split("/")[-2]
                status, answer, headers = answer_item(job_id, body)
                if status == 200:
                    recorded[job_id] = body
                if status < 500:
                    answered.add(job_id)
                return status, answer, headers
            if not batch_route:
                return 404, error("not_found"), {}
            answers = [(item, answer_item(item["jobId"], item)) for item in body["reports"]]
            for item, (status, answer, headers) in answers:
                if status >= 500:
                    return status, answer, headers
            results = []
            for item, (status, answer, _) in answers:
                answered.add(item["jobId"])
                if status == 200:
                    recorded[item["jobId"]] = item
                    results.append({"jobId": item["jobId"], **answer})
                else:
                    results.append({"jobId": item["jobId"], "error": answer["error"]})
            return 200, {"results": garble(results)}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        self.addCleanup(client.close)

        def handler(input, context):
            if context.job_id != "job_1":
                first_report_seen.wait(10)
                with lock:
                    state["others_done"] += 1
                    if state["others_done"] == n - 1:
                        others_done.set()
            return {"job": context.job_id}

        client.register_tool("t", "1", handler)
        errors: List[BaseException] = []
        client.worker.start(n, poll_interval=poll_interval, on_error=errors.append, block=False)
        # Claims go on while the reports are sent (unless one is failing).
        wait_until(lambda: len(answered) == n)
        return server, recorded, order, errors, client.worker.stop(5)

    @staticmethod
    def accept(job_id, report):
        return 200, {"jobId": job_id, "status": report["status"], "attempt": 1}, {}

    @staticmethod
    def report_calls(server: FakeServer) -> list:
        return [(s[1], s[3]) for s in server.seen if s[1].endswith("/report")]

    def test_jobs_finishing_together_are_reported_in_fewer_calls(self) -> None:
        server, recorded, _, errors, clean = self.run_jobs(8, self.accept)
        calls = self.report_calls(server)
        self.assertEqual(calls[0][0], "/api/v1/jobs/job_1/report")  # alone: at once, on the single route
        self.assertEqual(len(calls), 2)
        self.assertEqual(calls[1][0], "/api/v1/jobs/report")
        self.assertEqual(sorted(r["jobId"] for r in calls[1][1]["reports"]), [f"job_{i}" for i in range(2, 9)])
        self.assertEqual(sorted(recorded), [f"job_{i}" for i in range(1, 9)])
        for job_id, report in recorded.items():
            self.assertEqual((report["status"], report["output"], report["leaseToken"]),
                             ("SUCCEEDED", {"job": job_id}, "tok_" + job_id[4:]))
        self.assertEqual((errors, clean), ([], True))

    def test_a_refusal_in_a_batch_is_that_jobs_alone_as_a_single_reports(self) -> None:
        def answer(job_id, report):
            if job_id == "job_2":  # superseded by a newer claim: this report is lost
                return 409, error("lease_lost", attempt=2), {}
            if job_id == "job_3":  # an earlier send of this very report landed
                return 409, error("lease_lost", attempt=1, reportedOutcome="SUCCEEDED"), {}
            if job_id == "job_4" and report["status"] == "SUCCEEDED":
                return 400, error("invalid_request", validation=[{"field": "output.job", "rule": "nul"}]), {}
            return self.accept(job_id, report)

        server, recorded, _, errors, clean = self.run_jobs(5, answer)
        calls = self.report_calls(server)
        self.assertEqual(sorted(r["jobId"] for r in calls[1][1]["reports"]), ["job_2", "job_3", "job_4", "job_5"])
        self.assertEqual(sorted(recorded), ["job_1", "job_4", "job_5"])
        # job_4's output can never be recorded: it is reported failed for
        # good instead, as after a single report's refusal.
        self.assertEqual(recorded["job_4"]["error"], {"message": "handler output refused by the server at output.job",
                                                      "retryable": False})
        told = sorted(str(e) for e in errors if isinstance(e, getratchet.ReportNotRecorded))
        self.assertEqual(len(told), 2, told)
        self.assertIn("the report of job job_2 attempt 1 was not recorded (lease_lost)", told[1])
        # QA: it said "its lease lapses and it runs again", though a newer
        # attempt already holds the job.
        self.assertIn("a newer attempt holds the job", told[1])
        self.assertNotIn("runs again", told[1])
        self.assertIn("job job_4 attempt 1: the server refuses the output", told[0])
        # job_2's refusal settles it elsewhere (a newer attempt holds it):
        # nothing stop() answers for was lost, as Go's Stop.
        self.assertTrue(clean)

    def test_no_claim_while_a_batch_is_failing(self) -> None:
        outage = {"left": 3}

        def answer(job_id, report):
            if job_id == "job_2" and outage["left"]:
                outage["left"] -= 1
                # Answered late: the claim made as job_1's report freed its
                # slot, before the worker knew, is answered first.
                time.sleep(0.2)
                return 503, error("database_unavailable"), {}
            return self.accept(job_id, report)

        # Claims every half second: the batch fails for longer than that
        # (three 200 ms answers and the backoffs between them).
        quick_backoff(self)
        server, recorded, order, errors, clean = self.run_jobs(4, answer, poll_interval=0.5)
        batches = [i for i, (path, _) in enumerate(order) if path == "/api/v1/jobs/report"]
        self.assertEqual([order[i][1] for i in batches], [503, 503, 503, 200])
        self.assertNotIn("/api/v1/workers/wkr_1/claim", [path for path, _ in order[batches[0]:batches[-1]]])
        self.assertEqual(sorted(recorded), [f"job_{i}" for i in range(1, 5)])
        self.assertEqual((errors, clean), ([], True))

    def test_a_server_without_the_batch_route_gets_single_reports(self) -> None:
        server, recorded, _, errors, clean = self.run_jobs(4, self.accept, batch_route=False)
        singles = sorted(path for path, _ in self.report_calls(server) if path != "/api/v1/jobs/report")
        self.assertEqual(singles, [f"/api/v1/jobs/job_{i}/report" for i in range(1, 5)])
        self.assertEqual(sorted(recorded), [f"job_{i}" for i in range(1, 5)])
        self.assertEqual((errors, clean), ([], True))

    def test_a_report_answered_a_bare_refusal_is_sent_again(self) -> None:
        # A 4xx without Ratchet's error envelope (a proxy's or a load
        # balancer's answer during a deploy or a misroute: a 404, a 408)
        # says nothing of the report, which its lease token makes safe to
        # send again, as after a 5xx, as in Go and TypeScript (review: it was
        # given up, and the job ran again once its lease lapsed).
        quick_backoff(self)
        for status in (400, 401, 403, 404, 408, 409):
            bare: typing.Dict[str, int] = {}

            def answer(job_id, report, status=status, bare=bare):
                if bare.setdefault(job_id, 0) < 2:
                    bare[job_id] += 1
                    return status, {"message": "Not Found"}, {}
                return self.accept(job_id, report)

            # Without the batch route, a batch goes report by report.
            _, recorded, _, errors, clean = self.run_jobs(3, answer, batch_route=False)
            self.assertEqual(sorted(recorded), ["job_1", "job_2", "job_3"], status)
            self.assertEqual([e for e in errors if isinstance(e, getratchet.ReportNotRecorded)], [], status)
            self.assertTrue(clean, status)

    def test_an_output_a_proxy_refuses_for_its_size_is_reported_failed(self) -> None:
        # A success report answered a bare 413 (a proxy's body limit before
        # the server, nginx's 1 MB by default: no error envelope) can never
        # be recorded, as after the server's own payload_too_large: reported
        # failed for good instead, so the handler runs once, as in Go and
        # TypeScript (review: given up, the job ran again at every lapse).
        def answer(job_id, report):
            if report["status"] == "SUCCEEDED":
                return 413, {"message": "Request Entity Too Large"}, {}
            return self.accept(job_id, report)

        _, recorded, _, errors, clean = self.run_jobs(1, answer)
        self.assertEqual(recorded["job_1"]["error"], {
            "message": "handler output exceeds the request size limit of a proxy before the server", "retryable": False})
        self.assertEqual([e.what for e in errors if isinstance(e, getratchet.ReportNotRecorded)], ["output_refused"])
        self.assertTrue(clean)

    def test_a_batch_failing_twice_with_a_500_is_sent_report_by_report(self) -> None:
        chokes = {"left": 3}

        def answer(job_id, report):
            if job_id == "job_3" and chokes["left"]:  # the server fails on this one for a while
                chokes["left"] -= 1
                return 500, error("internal_error"), {}
            return self.accept(job_id, report)

        server, recorded, _, errors, clean = self.run_jobs(4, answer)
        calls = [path for path, _ in self.report_calls(server)]
        self.assertEqual(calls[1:3], ["/api/v1/jobs/report"] * 2)
        self.assertEqual(sorted(calls[3:]), ["/api/v1/jobs/job_2/report", "/api/v1/jobs/job_3/report",
                                             "/api/v1/jobs/job_3/report", "/api/v1/jobs/job_4/report"])
        self.assertEqual(sorted(recorded), [f"job_{i}" for i in range(1, 5)])
        self.assertEqual((errors, clean), ([], True))

    def test_a_batch_answer_naming_other_jobs_is_sent_again(self) -> None:
        # Parity QA: a result naming another job than the report sent in
        # its slot made that report given up (counted lost, its job left to
        # run again) though the server may well have recorded it, and the
        # others in the same answer were trusted. The whole answer is lost:
        # the batch goes again, each report safe to repeat, and none is lost.
        mismatched = {"left": 1}

        def answer(job_id, report):
            if job_id == "job_3" and mismatched["left"]:
                mismatched["left"] -= 1
                return 200, {"jobId": "job_4", "status": report["status"], "attempt": 1}, {}
            return self.accept(job_id, report)

        server, recorded, _, errors, clean = self.run_jobs(4, answer)
        calls = [path for path, _ in self.report_calls(server)]
        self.assertEqual(calls[1:], ["/api/v1/jobs/report"] * 2)
        self.assertEqual(sorted(recorded), [f"job_{i}" for i in range(1, 5)])
        self.assertEqual((errors, clean), ([], True))


    def test_a_batch_whose_answers_never_line_up_is_sent_report_by_report(self) -> None:
        # A server whose batch answers never line up with the reports sent
        # (the results in another order, one left out: a protocol error,
        # not an outage) gets the batch report by report after two such
        # answers running, as a batch meeting a 500 twice running does, as
        # in the Go and TypeScript workers: each report is recorded on the
        # single-report route, and none is lost. The batch was sent again
        # whole for ever: no claim was made meanwhile, and the stop gave
        # every report of it up at its deadline.
        for what, garble in (("reversed", lambda results: results[::-1]), ("short", lambda results: results[1:])):
            with self.subTest(what):
                server, _, _, errors, clean = self.run_jobs(4, self.accept, garble=garble)
                calls = [path for path, _ in self.report_calls(server)]
                self.assertEqual(calls[1:3], ["/api/v1/jobs/report"] * 2, calls)
                self.assertEqual(sorted(calls[3:]), [f"/api/v1/jobs/job_{i}/report" for i in range(2, 5)], calls)
                self.assertEqual((errors, clean), ([], True))

class GateLeaseTest(unittest.TestCase):
    @staticmethod
    def leased(path: str, seconds: float = 60):
        """A fake gate's answer to a begin (execute, leased for a minute, or
        seconds) or a heartbeat (extended as long); None for any other path."""
        from datetime import timedelta, timezone
        expires = (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
        if path.endswith("/begin"):
            return 200, {"decision": "execute", "effect_id": "eff_1", "state": "leased", "attempt": 1,
                         "lease_token": "tok", "lease_expires_at": expires}, {}
        if path.endswith("/heartbeat"):
            return 200, {"effect_id": "eff_1", "lease_expires_at": expires}, {}
        return None

    def recording(self, calls: list):
        """A fake gate that leases, records every report, and notes each
        request's path and body in calls."""
        def respond(method, path, body):
            calls.append((path, body))
            return self.leased(path) or (200, {"id": "eff_1", "state": body["outcome"]}, {})
        return respond

    def client_of(self, respond) -> Tuple[getratchet.Ratchet, "FakeServer"]:
        """A client of a fake server answering with respond, both closed at the test's end."""
        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        self.addCleanup(client.close)
        return client, server

    def do_effect_in_thread(self, client: getratchet.Ratchet) -> list:
        """Runs do_effect (its report given up after 1 s) on a thread for at
        most 15 s, and answers what it raised."""
        raised = []

        def call():
            try:
                client.do_effect("email.send", "k", lambda lease: {"sent": True}, {})
            except Exception as err:  # noqa: BLE001 - recorded for the assertion
                raised.append(err)

        with mock.patch("getratchet.client._REPORT_TIMEOUT", 1.0):
            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            caller.join(15)
        self.assertFalse(caller.is_alive(), "do_effect still sending its report")
        return raised

    def test_the_action_is_told_its_lease_is_lost_when_heartbeats_are_rate_limited(self) -> None:
        from datetime import datetime, timedelta, timezone

        def respond(method, path, body):
            if path.endswith("/begin"):
                expires = (datetime.now(timezone.utc) + timedelta(seconds=4)).isoformat().replace("+00:00", "Z")
                return 200, {"decision": "execute", "effect_id": "eff_1", "state": "leased", "attempt": 1,
                             "lease_token": "tok", "lease_expires_at": expires}, {}
            if path.endswith("/heartbeat"):
                # A wait far past the lease: it must not be waited out.
                return 429, error("rate_limited", retry_after_seconds=20), {}
            return 409, error("lease_expired"), {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        self.addCleanup(client.close)
        told = []
        with self.assertRaises(getratchet.OutcomeNotReported):
            client.do_effect("email.send", "k", lambda lease: told.append(lease.lost.wait(15)), {})
        self.assertEqual(told, [True])

    def test_a_begin_whose_answers_are_lost_is_asked_again(self) -> None:
        # Past the transport's retries, under the same request_id (chaos QA):
        # the lease a lost answer granted is given back to the repeat. Given
        # up, it lapsed held by nobody, and the key turned indeterminate
        # though the action never ran. One that surely granted nothing
        # (not_applied) is given up with the transport's retries.
        def gate(lost: int, outcome: str, calls: list):
            def respond(method, path, body):
                calls.append((path, body))
                if path.endswith("/begin") and len(calls) <= lost:
                    return 503, {"error": {"code": "database_unavailable", "message": "m",
                                           "detail": {"outcome": outcome}}}, {}
                return self.leased(path) or (200, {"id": "eff_1", "state": body["outcome"]}, {})
            client, _ = self.client_of(respond)
            client._transport.sleep = lambda seconds: None
            return client

        calls: list = []
        client = gate(9, "unknown", calls)
        acted = []
        out = client.do_effect("email.send", "k", lambda lease: acted.append(lease.attempt) or {"sent": True}, {})
        self.assertEqual((out.result, acted), ({"sent": True}, [1]))
        begins = [body["request_id"] for path, body in calls if path.endswith("/begin")]
        self.assertEqual(len(begins), 10)
        self.assertEqual(len(set(begins)), 1, "one request_id")

        calls = []
        client = gate(100, "not_applied", calls)
        with self.assertRaises(RatchetError) as raised:
            client.do_effect("email.send", "k", lambda lease: acted.append(lease.attempt), {})
        self.assertFalse(raised.exception.may_have_applied)
        self.assertEqual(len(calls), 4, "the transport's retries only")

    def test_an_async_action_is_awaited_not_reported_failed(self) -> None:
        # An async action wrapped in a plain function (a lambda, a
        # decorator) was closed unrun and its attempt reported failed; but
        # the plain part may have acted, and the key's next begin ran it
        # again. Outside an event loop it is awaited, as is an async def.
        calls = []
        client, _ = self.client_of(self.recording(calls))
        ran = []

        async def send(lease):
            ran.append(lease.effect_id)
            return {"sent": len(ran)}

        self.assertEqual(client.do_effect("email.send", "k", lambda lease: send(lease), {}).result, {"sent": 1})
        self.assertEqual(client.do_effect("email.send", "k", send, {}).result, {"sent": 2})

        async def rejected(lease):
            raise getratchet.NotPerformed("rejected by the provider")

        with self.assertRaises(getratchet.NotPerformed):
            client.do_effect("email.send", "k", rejected, {})
        reports = [(body["outcome"], body.get("result")) for path, body in calls if path.endswith("/report")]
        self.assertEqual(reports, [("succeeded", {"sent": 1}), ("succeeded", {"sent": 2}), ("failed", None)])
        with self.assertRaises(TypeError):  # not callable: it would have left the key indeterminate
            client.do_effect("email.send", "k", {"to": "x"}, {})

    def test_an_async_action_in_a_running_loop_is_never_reported_failed(self) -> None:
        # do_effect called from a coroutine cannot await on the loop it
        # blocks: an async def is refused before begin; a coroutine a plain
        # function returns is closed with nothing reported, since the plain
        # part may have acted (here it did: reported failed, it ran twice).
        import asyncio
        calls = []
        client, _ = self.client_of(self.recording(calls))
        acted, ran = [], []

        async def send(lease):
            ran.append(lease)

        def acts_then_returns_coroutine(lease):
            acted.append("email")
            return send(lease)

        async def main():
            with self.assertRaisesRegex(TypeError, "do_effect_async"):
                client.do_effect("email.send", "k", send, {})
            self.assertEqual(calls, [])
            with self.assertRaises(TypeError):
                client.do_effect("email.send", "k", acts_then_returns_coroutine, {})

        asyncio.run(main())
        self.assertEqual([path for path, _ in calls if not path.endswith("/heartbeat")], ["/api/v1/effects/begin"])
        self.assertEqual((acted, ran), (["email"], []))

    def test_do_effect_async_awaits_the_action_on_the_calling_loop(self) -> None:
        import asyncio
        calls = []
        client, _ = self.client_of(self.recording(calls))
        loops = []

        async def send(lease):
            loops.append(asyncio.get_running_loop())
            await asyncio.sleep(0)
            return {"sent": True}

        async def main():
            first = await client.do_effect_async("email.send", "k", send, {})
            second = await client.do_effect_async("email.send", "k", lambda lease: send(lease), {})
            third = await client.do_effect_async("email.send", "k", lambda lease: {"plain": True}, {})
            with self.assertRaises(getratchet.NotPerformed):
                await client.do_effect_async("email.send", "k", lambda lease: (_ for _ in ()).throw(
                    getratchet.NotPerformed("no")), {})
            return asyncio.get_running_loop(), [first.result, second.result, third.result]

        loop, results = asyncio.run(main())
        self.assertEqual(results, [{"sent": True}, {"sent": True}, {"plain": True}])
        self.assertEqual(loops, [loop, loop])
        reports = [body["outcome"] for path, body in calls if path.endswith("/report")]
        self.assertEqual(reports, ["succeeded", "succeeded", "succeeded", "failed"])

    def test_a_bare_4xx_says_nothing_of_the_lease_or_the_report(self) -> None:
        # A proxy's, a load balancer's or a platform's 404 or 409 without
        # Ratchet's error envelope (a deploy, a misroute) told the action its
        # lease was lost and ended the heartbeats (the lease then lapsed for
        # real), and gave a report up at once (the performed action read
        # indeterminate): as for a job's heartbeat and report, it is a
        # failure that may pass, tried again within the lease.
        for status in (404, 409):
            with self.subTest(status=status):
                calls: List[str] = []
                bare = {"heartbeat": 1, "report": 1}

                def respond(method, path, body, calls=calls, bare=bare, status=status):
                    calls.append(path)
                    for route in bare:
                        if path.endswith("/" + route) and bare[route]:
                            bare[route] -= 1
                            return status, b"<html>Not here</html>", {}
                    return self.leased(path, seconds=6) or (200, {"id": "eff_1", "state": body["outcome"]}, {})

                client, _ = self.client_of(respond)
                client._transport.sleep = lambda seconds: time.sleep(min(seconds, 0.05))

                def send(lease):
                    # Until a heartbeat has extended the lease after the bare one.
                    wait_until(lambda: calls.count("/api/v1/effects/eff_1/heartbeat") >= 2 or lease.lost.is_set())
                    self.assertFalse(lease.lost.is_set())
                    return {"sent": True}

                outcome = client.do_effect("email.send", "k", send, {})
                self.assertEqual((outcome.result, outcome.duplicate), ({"sent": True}, False))
                self.assertEqual(calls.count("/api/v1/effects/eff_1/report"), 2)

    def test_do_effect_async_callers_waiting_in_flight_leave_the_threads_to_the_holders_report(self) -> None:
        # Tasks of one process wait for a key another of its tasks holds
        # (an agent's repeated tool call): as many as the default executor
        # has threads (min(32, CPUs + 4); 2 here) held each thread in their
        # in_flight waits, so the holder's report never got one, its
        # heartbeats kept its lease live, and every one of them waited for
        # ever (here: until in_flight_timeout, then EffectInFlight).
        import asyncio
        import concurrent.futures
        state = {"leased": False, "reported": False}
        begins = []

        def respond(method, path, body):
            if path.endswith("/begin"):
                begins.append(body["request_id"])
                if state["reported"]:
                    return 200, {"decision": "duplicate", "effect_id": "eff_1", "state": "succeeded", "attempt": 1,
                                 "result": {"sent": True}}, {}
                if state["leased"]:
                    return 200, {"decision": "in_flight", "effect_id": "eff_1", "state": "leased", "attempt": 1,
                                 "retry_after_seconds": 1}, {}
                state["leased"] = True
            if path.endswith("/report"):
                state["reported"] = True
                return 200, {"id": "eff_1", "state": body["outcome"]}, {}
            return self.leased(path)

        client, _ = self.client_of(respond)

        async def main():
            asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=2))
            acting, act = asyncio.Event(), asyncio.Event()

            async def send(lease):
                acting.set()
                await act.wait()
                return {"sent": True}

            holder = asyncio.ensure_future(client.do_effect_async("email.send", "k", send, {}))
            await acting.wait()
            waiters = [asyncio.ensure_future(client.do_effect_async("email.send", "k", send, {},
                                                                    in_flight_timeout=20)) for _ in range(2)]
            while len(set(begins)) < 3:  # both waiters were told in_flight
                await asyncio.sleep(0.01)
            act.set()
            return await asyncio.gather(holder, *waiters, return_exceptions=True)

        outcomes = asyncio.run(main())
        self.assertEqual([(o.result, o.duplicate) if isinstance(o, getratchet.EffectOutcome) else o for o in outcomes],
                         [({"sent": True}, False), ({"sent": True}, True), ({"sent": True}, True)])

    def test_do_effect_async_cancelled_during_begin_releases_the_lease(self) -> None:
        # The task is cancelled while its begin is on a thread; the lease
        # that begin then brings back is reported failed (the action surely
        # never ran), not left to lapse indeterminate and block the key.
        calls, begun, answer = [], threading.Event(), threading.Event()
        record = self.recording(calls)

        def respond(method, path, body):
            if path.endswith("/begin"):
                begun.set()
                answer.wait(10)
            return record(method, path, body)

        client, _ = self.client_of(respond)
        ran = []
        self.cancel_during_begin(client, lambda lease: ran.append(1), begun, answer)
        wait_until(lambda: any(path.endswith("/report") for path, _ in calls))
        self.assertEqual([body["outcome"] for path, body in calls if path.endswith("/report")], ["failed"])
        self.assertEqual(ran, [])

    def test_do_effect_async_cancelled_during_begin_sends_no_retry(self) -> None:
        # The begin already sent is awaited, but its transport's retries are
        # not sent once the task was cancelled, as Go's DoEffect's ctx and
        # TypeScript's signal end them: they went on through max_retries, and
        # an execute one brought was only released, spending an attempt.
        begins, begun, answer = [], threading.Event(), threading.Event()

        def respond(method, path, body):
            begins.append(path)
            begun.set()
            answer.wait(10)
            return 500, error("internal_error"), {}

        client, _ = self.client_of(respond)
        client._transport.sleep = lambda seconds: None
        self.cancel_during_begin(client, lambda lease: None, begun, answer)
        self.assertEqual(begins, ["/api/v1/effects/begin"])

    def cancel_during_begin(self, client: getratchet.Ratchet, action, begun: threading.Event,
                            answer: threading.Event) -> None:
        """Cancels a do_effect_async of action once its begin reached the
        server (begun), then lets the server answer it (answer); returns
        once the begin's thread ended (asyncio.run joins it)."""
        import asyncio

        async def main():
            task = asyncio.ensure_future(client.do_effect_async("email.send", "k", action, {}))
            while not begun.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            answer.set()

        asyncio.run(main())

    def test_do_effect_async_cancelled_while_acting_reports_nothing(self) -> None:
        import asyncio
        calls = []
        client, _ = self.client_of(self.recording(calls))

        async def main():
            started = asyncio.Event()

            async def send(lease):
                started.set()
                await asyncio.sleep(30)

            task = asyncio.ensure_future(client.do_effect_async("email.send", "k", send, {}))
            await started.wait()
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        self.assertEqual([path for path, _ in calls if path.endswith("/report")], [])

    def test_a_generator_a_plain_action_returns_is_its_result_not_a_failure(self) -> None:
        # A plain action that acted and returned a lazy result (a generator)
        # did happen: reported failed (review: the async refusal took every
        # unstarted generator for an action that never ran), the key's next
        # begin executes and the action runs twice. It is recorded, as any
        # result that is not JSON, with the placeholder.
        calls = []
        client, _ = self.client_of(self.recording(calls))
        sent = []

        def send(lease):
            sent.append("email")  # the effect happened
            return (message_id for message_id in ["msg_1"])

        with self.assertRaises(getratchet.ResultNotStored) as raised:
            client.do_effect("email.send", "k", send, {})
        self.assertEqual(raised.exception.reason, "result_not_json")
        reports = [body for path, body in calls if path.endswith("/report")]
        self.assertEqual([(r["outcome"], r.get("result")) for r in reports],
                         [("succeeded", {"ratchet": "result_not_recorded", "reason": "result_not_json"})])
        self.assertEqual(sent, ["email"])

    def test_a_result_refused_at_a_field_is_recorded_with_the_placeholder_go_records(self) -> None:
        # The gate refuses a field under result (a NUL in a string, say):
        # the success is recorded with the placeholder whose reason names
        # the code and the field, as the Go and TypeScript SDKs record it
        # (it named the field alone, so one key's placeholder read
        # differently by which SDK acted). The body too: only the result
        # can make a report's body unreadable (nested deeper than the gate
        # reads); it was raised as not reported, and the lease lapsed.
        for field in ("result.note", "body"):
            with self.subTest(field=field):
                calls = []

                def respond(method, path, body, field=field, calls=calls):
                    calls.append((path, body))
                    if path.endswith("/report") and body["result"].get("ratchet") != "result_not_recorded":
                        return 400, {"error": {"code": "invalid_request", "message": "bad", "detail": {
                            "validation": [{"field": field, "message": "refused"}]}}}, {}
                    return self.leased(path) or (200, {"id": "eff_1", "state": body["outcome"]}, {})

                client, _ = self.client_of(respond)
                with self.assertRaises(getratchet.ResultNotStored) as raised:
                    client.do_effect("email.send", "k", lambda lease: {"note": "a\u0000b"}, {})
                self.assertEqual(raised.exception.reason, "invalid_request at " + field)
                self.assertEqual([body.get("result") for path, body in calls if path.endswith("/report")][-1],
                                 {"ratchet": "result_not_recorded", "reason": "invalid_request at " + field})

    def test_a_result_a_proxy_refuses_for_its_size_is_recorded_with_the_placeholder(self) -> None:
        # A bare 413 (a proxy's body limit before the server, no Ratchet
        # envelope) refuses the result for good, as the server's own
        # payload_too_large does: the success is recorded with the
        # placeholder, as Go's DoEffect records it. It was raised as not
        # reported and the lease lapsed: indeterminate, and under
        # on_indeterminate retry the next caller acted again (sdk QA).
        calls = []

        def respond(method, path, body):
            calls.append((path, body))
            if path.endswith("/report") and body["result"].get("ratchet") != "result_not_recorded":
                return 413, b"<html><body>413 Request Entity Too Large</body></html>", {"Content-Type": "text/html"}
            return self.leased(path) or (200, {"id": "eff_1", "state": body["outcome"]}, {})

        client, _ = self.client_of(respond)
        with self.assertRaises(getratchet.ResultNotStored) as raised:
            client.do_effect("email.send", "k", lambda lease: {"pdf": "x" * 1000}, {})
        self.assertEqual(raised.exception.reason, "payload_too_large")
        self.assertEqual([body.get("result") for path, body in calls if path.endswith("/report")][-1],
                         {"ratchet": "result_not_recorded", "reason": "payload_too_large"})

    def test_a_duplicate_whose_result_only_looks_like_the_placeholder_is_a_result(self) -> None:
        # The placeholder is exactly {"ratchet", "reason"}, as Go reads it:
        # an action's own result with more fields is handed back (it was
        # raised as ResultNotStored, the result withheld).
        mine = {"ratchet": "result_not_recorded", "reason": "mine", "id": 7}
        placeholder = {"ratchet": "result_not_recorded", "reason": "payload_too_large"}

        def duplicate(result):
            return lambda method, path, body: (200, {"decision": "duplicate", "effect_id": "eff_1",
                                                     "state": "succeeded", "attempt": 1, "result": result}, {})

        client, _ = self.client_of(duplicate(mine))
        outcome = client.do_effect("email.send", "k", lambda lease: self.fail("acted"), {})
        self.assertEqual((outcome.duplicate, outcome.result), (True, mine))
        client, _ = self.client_of(duplicate(placeholder))
        with self.assertRaises(getratchet.ResultNotStored) as raised:
            client.do_effect("email.send", "k", lambda lease: self.fail("acted"), {})
        self.assertEqual(raised.exception.reason, "payload_too_large")

    def test_a_report_the_server_keeps_failing_is_given_up(self) -> None:
        # Heartbeats keep the lease while every report meets a 503: the
        # call gives up after the report timeout (as Go's DoEffect) and
        # raises OutcomeNotReported; it used to retry for ever.
        mended = threading.Event()

        def respond(method, path, body):
            if mended.is_set():
                return 200, {"id": "eff_1", "state": "succeeded"}, {}
            return self.leased(path) or (503, error("database_unavailable"), {})

        client, _ = self.client_of(respond)
        self.addCleanup(mended.set)  # lets a call that never gave up end, before the server closes
        raised = self.do_effect_in_thread(client)
        self.assertEqual(len(raised), 1)
        self.assertIsInstance(raised[0], getratchet.OutcomeNotReported)
        self.assertEqual(raised[0].result, {"sent": True})

    def test_a_report_attempt_that_hangs_is_cut_at_the_give_up_time(self) -> None:
        # As Go's: an attempt that hung took the transport's 60 s (review).
        release = threading.Event()

        def respond(method, path, body):
            answer = self.leased(path)
            if answer is None:
                release.wait(30)
                answer = 200, {"id": "eff_1", "state": "succeeded"}, {}
            return answer

        client, _ = self.client_of(respond)
        self.addCleanup(release.set)  # before the server closes: it waits for the hung answer
        raised = self.do_effect_in_thread(client)
        self.assertEqual(len(raised), 1)
        self.assertIsInstance(raised[0], getratchet.OutcomeNotReported)

    def test_a_report_that_landed_before_a_newer_attempt_is_recorded(self) -> None:
        # The first send landed and its answer was lost; the retry met a
        # newer attempt: lease_lost naming the outcome recorded is the report
        # recorded, as Go's reads it (SDK gate QA: said not recorded).
        reports = []

        def respond(method, path, body):
            answer = self.leased(path)
            if answer is None:
                reports.append(body)
                answer = ((502, error("internal_error"), {}) if len(reports) == 1 else
                          (409, error("lease_lost", attempt=1, reported_outcome="succeeded"), {}))
            return answer

        client, _ = self.client_of(respond)
        outcome = client.do_effect("email.send", "k", lambda lease: {"sent": True}, {})
        self.assertEqual(outcome.result, {"sent": True})
        self.assertEqual(len(reports), 2)

    def test_in_flight_asks_again_at_its_timeout(self) -> None:
        # Pauses of 0.25, 0.5 and 1 s reach 1.75 s; the next (2 s) would
        # pass the 3.5 s timeout, so it is cut to end there and asks once
        # more, finding the holder's result. It used to give up at 1.75 s.
        # All of it a tenth as long here: pauses from 25 ms, a 0.35 s timeout.
        # The holder's result is there from a few ms before the timeout, and
        # the first ask is always answered in_flight (on a loaded machine the
        # asks are slow, and a count of asks would fail a correct client).
        first = mock.patch.object(getratchet.client, "_FIRST_IN_FLIGHT_WAIT", 0.025)
        first.start()
        self.addCleanup(first.stop)
        begins = []
        timeout = 0.35
        result_from = [float("inf")]

        def respond(method, path, body):
            begins.append(path)
            if len(begins) == 1 or time.monotonic() < result_from[0]:
                return 200, {"decision": "in_flight", "effect_id": "eff_1", "state": "leased", "attempt": 1,
                             "retry_after_seconds": 30}, {}
            return 200, {"decision": "duplicate", "effect_id": "eff_1", "state": "succeeded", "attempt": 1,
                         "result": {"sent": True}}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        self.addCleanup(client.close)
        result_from[0] = time.monotonic() + timeout - 0.005
        out = client.do_effect("email.send", "k", lambda lease: self.fail("acted"), {}, in_flight_timeout=timeout)
        self.assertEqual((out.duplicate, out.result), (True, {"sent": True}))
        self.assertGreaterEqual(len(begins), 2)

    def test_a_short_lease_is_heartbeated_before_it_is_given_up(self) -> None:
        # A lease of 2 s (a begin's lease_seconds may shorten the policy's)
        # left no time to beat a second before its end: it was given up as
        # lost without one heartbeat tried, and lapsed under an action still
        # running, which another caller could then be granted (sdk QA). As
        # Go's DoEffect, one heartbeat is tried before a lease is given up,
        # and the lease it extends is kept.
        beat = threading.Event()

        def respond(method, path, body):
            if path.endswith("/begin"):
                return self.leased(path, 2)
            if path.endswith("/heartbeat"):
                beat.set()
                return self.leased(path)
            return 200, {"id": "eff_1", "state": body["outcome"]}, {}

        client, _ = self.client_of(respond)
        seen = []

        def action(lease):
            seen.append(beat.wait(15))
            seen.append(lease.lost.is_set())
            return {"sent": True}

        client.do_effect("email.send", "k", action, {})
        self.assertEqual(seen, [True, False])

    def test_the_action_is_told_before_its_lease_lapses_when_a_heartbeat_hangs(self) -> None:
        # A heartbeat that is never answered (a partition, a stalled proxy)
        # is given up in time to tell the action a second before the 4 s
        # lease ends; it used to be waited on for 10 s, past the lapse, when
        # another caller may be granted execute.
        release = threading.Event()

        def respond(method, path, body):
            if path.endswith("/begin"):
                return self.leased(path, 4)
            if path.endswith("/heartbeat"):
                release.wait(30)
                return 409, error("lease_expired"), {}
            return 409, error("lease_expired"), {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(release.set)  # first: the hung heartbeat's handler ends
        client = getratchet.Ratchet(server.url, "rk_test")
        self.addCleanup(client.close)
        told = []
        with self.assertRaises(getratchet.OutcomeNotReported):
            client.do_effect("email.send", "k", lambda lease: told.append(lease.lost.wait(8)), {})
        self.assertEqual(told, [True])


class OperatorCallsTest(unittest.TestCase):
    """Which operator calls are repeated after a 5xx, and under which
    Idempotency-Key, as the Go SDK's."""

    def client(self, script) -> Tuple[getratchet.Ratchet, FakeServer]:
        server = FakeServer(script)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=1)
        client._transport.sleep = lambda seconds: None
        self.addCleanup(client.close)
        return client, server

    def test_creates_are_repeated_under_one_idempotency_key(self) -> None:
        calls = {
            "POST /api/v1/webhooks": lambda c: c.create_webhook("https://x.test/h", ["run.finished"]),
            "POST /api/v1/keys": lambda c: c.create_key("k", preset="AGENT"),
            "POST /api/v1/tools/a%23b/contracts": lambda c: c.publish_contract("a#b", handler_version="1",
                                                                                input_schema={}),
            "POST /api/v1/tools/a%23b/test": lambda c: c.test_tool("a#b", "1", {"x": 1}),
            "POST /api/v1/webhooks/wh%2F1/deliveries/retry": lambda c: c.retry_webhook_deliveries("wh/1", ["d"]),
            "POST /api/v1/webhooks/wh_1/rotate-secret": lambda c: c.rotate_webhook_secret("wh_1"),
            "POST /api/v1/reconcile": lambda c: c.reconcile("t", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            # A run's start and a group's open, whose body key is optional.
            "POST /api/v1/runs": lambda c: c.start_run("r"),
            "POST /api/v1/groups": lambda c: c.create_group("g"),
        }
        for route, call in calls.items():
            client, server = self.client([(500, error("internal_error"), {}), (200, {"id": "x_1"}, {})])
            self.assertEqual(call(client), {"id": "x_1"}, route)
            self.assertEqual([f"{m} {p}" for m, p, _, _ in server.seen], [route] * 2)
            keys = {headers.get("Idempotency-Key") for _, _, headers, _ in server.seen}
            self.assertEqual(len(keys), 1, route)
            self.assertTrue(keys.pop(), route)
        # A key of the caller's is sent as it is.
        client, server = self.client([(201, {"id": "key_1"}, {})])
        client.create_key("k", preset="AGENT", idempotency_key="mint:k")
        self.assertEqual(server.seen[0][2]["Idempotency-Key"], "mint:k")
        self.assertEqual(server.seen[0][3], {"name": "k", "tools": None, "preset": "AGENT"})

    def test_answers_with_a_secret_print_it_masked(self) -> None:
        # A script that printed the key it minted, or a log of a begin's or a
        # claim's answer, wrote the credential: repr and str mask it, while
        # the field, equality and JSON keep it.
        secret = "s3cr3t-never-printed"
        calls = {
            "create_key": (lambda c: c.create_key("k", preset="AGENT"), {"id": "key_1", "secret": secret}),
            "create_webhook": (lambda c: c.create_webhook("https://x.test/h", ["run.finished"]),
                               {"id": "wh_1", "secret": secret}),
            "rotate_webhook_secret": (lambda c: c.rotate_webhook_secret("wh_1"), {"id": "wh_1", "secret": secret}),
            "begin": (lambda c: c.begin("email.send", "k"),
                      {"decision": "execute", "effect_id": "eff_1", "lease_token": secret}),
            "claim": (lambda c: c.claim("wkr_1")[0],
                      {"jobs": [{"jobId": "job_1", "leaseToken": secret, "input": {"a": 1}}]}),
        }
        for name, (call, body) in calls.items():
            client, _ = self.client([(200, body, {})])
            answer = call(client)
            for printed in (repr(answer), str(answer), f"{answer}", "%s" % (answer,), repr([answer])):
                self.assertNotIn(secret, printed, name)
                self.assertIn("[redacted]", printed, name)
            self.assertIsInstance(answer, dict, name)
            field = "leaseToken" if name == "claim" else "lease_token" if name == "begin" else "secret"
            self.assertEqual(answer[field], secret, name)
            self.assertIn(secret, json.dumps(answer), name)
            self.assertEqual(answer, body["jobs"][0] if name == "claim" else body, name)

    def test_actions_are_repeated_under_an_idempotency_key_of_their_own(self) -> None:
        # A close whose answer was lost, retried without a key after the
        # breaker tripped again, closed the new trip; a cancel retried after a
        # replay cancelled the replay. Each action that would undo another
        # actor's change sends a key of the call's own, the same on its retry
        # and another on the next call, as the Go SDK's.
        calls = {
            "POST /api/v1/circuits/a%20b/open": lambda c: c.open_circuit("a b", action="deny"),
            "POST /api/v1/circuits/email.send/close": lambda c: c.close_circuit("email.send"),
            "POST /api/v1/circuits/stop": lambda c: c.emergency_stop(reason="incident"),
            "POST /api/v1/circuits/release": lambda c: c.release_emergency_stop(),
            "POST /api/v1/steps/stp_1/cancel": lambda c: c.cancel_step("stp_1"),
            "POST /api/v1/endpoints/end_1/pause": lambda c: c.pause_endpoint("end_1"),
            "POST /api/v1/endpoints/end_1/resume": lambda c: c.resume_endpoint("end_1"),
            "POST /api/v1/endpoints/end_1/circuit/close": lambda c: c.close_endpoint_circuit("end_1"),
            "PATCH /api/v1/webhooks/whk_1": lambda c: c.update_webhook("whk_1", disabled=False),
            # An update without expected_version retried after another
            # operator's wrote over theirs; with it, it met its own version.
            "PUT /api/v1/policies/a%2Fb": lambda c: c.update_effect_policy("a/b", mode="deny"),
        }
        for route, call in calls.items():
            client, server = self.client([(502, error("internal_error"), {}), (200, {"ok": True}, {}),
                                          (200, {"ok": True}, {})])
            self.assertEqual(call(client), {"ok": True}, route)
            self.assertEqual(call(client), {"ok": True}, route)
            self.assertEqual([f"{m} {p}" for m, p, _, _ in server.seen], [route] * 3)
            keys = [headers.get("Idempotency-Key") for _, _, headers, _ in server.seen]
            self.assertTrue(keys[0] and keys[2], route)
            self.assertEqual(keys[1], keys[0], route)
            self.assertNotEqual(keys[2], keys[0], route)

    def test_every_keyed_action_takes_the_callers_idempotency_key(self) -> None:
        # A caller's own retry from a new process could not reuse the first
        # call's key: each call sent a fresh one, and took none.
        calls = {
            "POST /api/v1/circuits/t/open": lambda c, k: c.open_circuit("t", action="deny", idempotency_key=k),
            "POST /api/v1/circuits/t/close": lambda c, k: c.close_circuit("t", idempotency_key=k),
            "POST /api/v1/circuits/stop": lambda c, k: c.emergency_stop(reason="incident", idempotency_key=k),
            "POST /api/v1/circuits/release": lambda c, k: c.release_emergency_stop(idempotency_key=k),
            "POST /api/v1/steps/stp_1/cancel": lambda c, k: c.cancel_step("stp_1", idempotency_key=k),
            "POST /api/v1/endpoints/end_1/pause": lambda c, k: c.pause_endpoint("end_1", idempotency_key=k),
            "POST /api/v1/endpoints/end_1/resume": lambda c, k: c.resume_endpoint("end_1", idempotency_key=k),
            "POST /api/v1/endpoints/end_1/circuit/close": lambda c, k: c.close_endpoint_circuit("end_1",
                                                                                               idempotency_key=k),
            "PATCH /api/v1/webhooks/whk_1": lambda c, k: c.update_webhook("whk_1", disabled=True, idempotency_key=k),
            "PUT /api/v1/policies/t": lambda c, k: c.update_effect_policy("t", mode="deny", idempotency_key=k),
        }
        self.assert_callers_key_is_sent_again(calls)

    def assert_callers_key_is_sent_again(self, calls: typing.Dict[str, typing.Any]) -> None:
        """Each call, given the caller's key, sends it in the header (not
        the body) and again on its retry after a 500."""
        for route, call in calls.items():
            client, server = self.client([(500, error("internal_error"), {}), (200, {"ok": True}, {})])
            self.assertEqual(call(client, "ops:1"), {"ok": True}, route)
            self.assertEqual([f"{m} {p}" for m, p, _, _ in server.seen], [route] * 2)
            self.assertEqual([headers.get("Idempotency-Key") for _, _, headers, _ in server.seen], ["ops:1"] * 2,
                             route)
            self.assertNotIn("ops:1", json.dumps(server.seen[0][3]), route)

    def test_every_keyed_create_takes_the_callers_idempotency_key(self) -> None:
        # Parity QA: reconcile, publish_contract, test_tool,
        # rotate_webhook_secret and retry_webhook_deliveries took no key of
        # the caller's, as TypeScript's do, so a caller whose retries ran out
        # could not ask again for the first answer (the secret, what
        # reconcile resolved).
        calls = {
            "POST /api/v1/reconcile": lambda c, k: c.reconcile("t", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z",
                                                               idempotency_key=k),
            "POST /api/v1/tools/t/contracts": lambda c, k: c.publish_contract("t", handler_version="1",
                                                                               input_schema={}, idempotency_key=k),
            "POST /api/v1/tools/t/test": lambda c, k: c.test_tool("t", "1", {"x": 1}, idempotency_key=k),
            "POST /api/v1/webhooks/wh_1/rotate-secret": lambda c, k: c.rotate_webhook_secret("wh_1",
                                                                                             idempotency_key=k),
            "POST /api/v1/webhooks/wh_1/deliveries/retry": lambda c, k: c.retry_webhook_deliveries(
                "wh_1", ["d"], idempotency_key=k),
        }
        self.assert_callers_key_is_sent_again(calls)

    def test_low_level_worker_calls(self) -> None:
        # Parity QA: the worker routes were the Go SDK's alone (RegisterWorker,
        # ClaimKeyed, HeartbeatJob, ReportJob, ReportJobs); Python reached
        # them only through its worker runtime.
        client, server = self.client([(500, error("internal_error"), {}), (201, {"workerId": "wkr_1"}, {})])
        self.assertEqual(client.register_worker([("send", "1"), {"name": "bill", "version": "2"}],
                                                idempotency_key="boot:host1"), "wkr_1")
        self.assertEqual([(m, p, h.get("Idempotency-Key"), b) for m, p, h, b in server.seen],
                         [("POST", "/api/v1/workers/register", "boot:host1",
                           {"tools": [{"name": "send", "version": "1"}, {"name": "bill", "version": "2"}]})] * 2)

        job = {"jobId": "job_1", "leaseToken": "tok", "attempt": 1}
        client, server = self.client([(500, error("internal_error"), {}), (200, {"jobs": [job]}, {})])
        self.assertEqual(client.claim("wkr/1", limit=5, wait_seconds=2, claim_id="c1"), [job])
        self.assertEqual([(p, b) for _, p, _, b in server.seen],
                         [("/api/v1/workers/wkr%2F1/claim", {"limit": 5, "waitSeconds": 2, "claimId": "c1"})] * 2)
        client, server = self.client([(500, error("internal_error"), {}), (200, {"jobs": []}, {})])
        self.assertEqual(client.claim("wkr_1"), [])
        ids = {b["claimId"] for _, _, _, b in server.seen}
        self.assertEqual(len(ids), 1)
        self.assertTrue(ids.pop())

        client, server = self.client([(409, error("lease_lost"), {})])
        with self.assertRaises(RatchetError) as caught:
            client.heartbeat_job("job_1", "tok")
        self.assertEqual(caught.exception.code, "lease_lost")
        self.assertEqual(server.seen[0][1:4:2], ("/api/v1/jobs/job_1/heartbeat", {"leaseToken": "tok"}))

        client, server = self.client([(500, error("internal_error"), {}), (200, {"jobId": "job_1"}, {})])
        client.report_job("job_1", "tok", "FAILED", error={"message": "down", "retryable": True,
                                                           "retryAfterMs": 5000})
        self.assertEqual([(p, b) for _, p, _, b in server.seen],
                         [("/api/v1/jobs/job_1/report", {"leaseToken": "tok", "status": "FAILED",
                                                         "error": {"message": "down", "retryable": True,
                                                                   "retryAfterMs": 5000}})] * 2)

        results = {"results": [{"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1, "nextDueAt": None},
                               {"jobId": "job_2", "error": {"code": "lease_lost", "message": "m",
                                                            "detail": {"x": 1}}}]}
        client, server = self.client([(200, results, {})])
        got = client.report_jobs([{"job_id": "job_1", "lease_token": "t1", "status": "SUCCEEDED", "output": {"ok": 1}},
                                  {"job_id": "job_2", "lease_token": "t2", "status": "SUCCEEDED"}])
        self.assertEqual(server.seen[0][1:4:2], ("/api/v1/jobs/report", {"reports": [
            {"jobId": "job_1", "leaseToken": "t1", "status": "SUCCEEDED", "output": {"ok": 1}},
            {"jobId": "job_2", "leaseToken": "t2", "status": "SUCCEEDED"}]}))
        self.assertEqual(got[0], {**results["results"][0], "error": None})
        self.assertEqual((got[1]["error"].status, got[1]["error"].code, got[1]["error"].detail), (409, "lease_lost",
                                                                                                 {"x": 1}))
        client, server = self.client([(200, {"results": [{"jobId": "job_9"}]}, {})] * 2)
        with self.assertRaises(getratchet.ConnectionLost):
            client.report_jobs([{"job_id": "job_1", "lease_token": "t1", "status": "SUCCEEDED"}])
        self.assertEqual(len(server.seen), 2)  # a lost answer: asked again

    def test_request_takes_a_timeout_of_its_own(self) -> None:
        # Parity QA: a Go caller bounds one call with its context; request()
        # had only the client's timeout (60 s here).
        release = threading.Event()

        def respond(method, path, body):
            release.wait(10)  # without the call's own timeout, it is answered
            return 200, {"ok": True}, {}
        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(release.set)  # before the server closes
        client = getratchet.Ratchet(server.url, "rk_test", timeout=60, max_retries=0)
        self.addCleanup(client.close)
        with self.assertRaises(getratchet.ConnectionLost):
            client.request("GET", "/queue/health", timeout=0.2)
        self.assertEqual(server.seen[0][:2], ("GET", "/api/v1/queue/health"))

    def test_updates_are_not_repeated(self) -> None:
        client, server = self.client([(500, error("internal_error"), {}), (200, {}, {})])
        with self.assertRaises(RatchetError):
            client.update_endpoint_policy("ep_1", 3, maxConcurrent=None)
        self.assertEqual(len(server.seen), 1)

    def test_a_run_or_group_body_key_goes_beside_a_header_key_of_the_calls_own(self) -> None:
        # The body key (the run's or group's own, for another process's
        # retry) is no Idempotency-Key: each call makes its own header key.
        for call, body in ((lambda c: c.create_group("g", idempotency_key="checkout:1"),
                            {"name": "g", "idempotency_key": "checkout:1"}),
                           (lambda c: c.start_run("r", idempotency_key="onboard:1"),
                            {"name": "r", "idempotencyKey": "onboard:1"})):
            client, server = self.client([(500, error("internal_error"), {}), (200, {"id": "x_1"}, {}),
                                          (200, {"id": "x_1"}, {})])
            self.assertEqual(call(client), {"id": "x_1"})
            call(client)
            self.assertEqual([b for _, _, _, b in server.seen], [body] * 3)
            keys = [h.get("Idempotency-Key") for _, _, h, _ in server.seen]
            self.assertEqual(keys[0], keys[1])
            self.assertNotEqual(keys[1], keys[2])
            self.assertNotIn(keys[0], ("checkout:1", "onboard:1"))

    def test_reads_and_repeatable_changes_are_repeated(self) -> None:
        # Without an Idempotency-Key: the actions a repeat of which would undo
        # another's change (a breaker's, a pause) are keyed, in
        # test_actions_are_repeated_under_an_idempotency_key_of_their_own.
        calls = {
            "GET /api/v1/approvals?state=pending&limit=5": lambda c: c.list_approvals(state="pending", limit=5),
            "GET /api/v1/keys?created_by=key_1&limit=2": lambda c: c.list_keys(created_by="key_1", limit=2),
            # Empty is sent (and refused), never read as every key.
            "GET /api/v1/keys?created_by=": lambda c: c.list_keys(created_by=""),
            "POST /api/v1/approvals/ap_1/approve": lambda c: c.approve("ap_1"),
            "DELETE /api/v1/keys/key_1": lambda c: c.revoke_key("key_1"),
            "DELETE /api/v1/keys/key_2?include_minted=true": lambda c: c.revoke_key("key_2", include_minted=True),
            "DELETE /api/v1/keys/key_3": lambda c: c.revoke_key("key_3", include_minted=False),
            "DELETE /api/v1/webhooks/wh_1": lambda c: c.delete_webhook("wh_1"),
            "POST /api/v1/endpoints": lambda c: c.create_endpoint("e", preset="RELAXED"),
            "GET /api/v1/endpoints/ep_1/attempts?outcome=FAILED&cursor=c1":
                lambda c: c.list_endpoint_attempts("ep_1", outcome="FAILED", cursor="c1"),
            "POST /api/v1/groups/grp_1/unwind": lambda c: c.unwind_group("grp_1"),
            "GET /api/v1/queue/health?limit=2": lambda c: c.list_queue_health(limit=2),
            "GET /api/v1/groups/grp%2F1/steps?limit=200&cursor=eff_1":
                lambda c: c.list_group_steps("grp/1", limit=200, cursor="eff_1"),
            "GET /api/v1/steps/stp_1/attempts?cursor=50": lambda c: c.list_step_attempts("stp_1", cursor="50"),
            "GET /api/v1/steps/stp_1/replays?limit=5": lambda c: c.list_step_replays("stp_1", limit=5),
            # The structuring read no SDK made (parity QA).
            "GET /api/v1/policies/a%2Fb/structuring": lambda c: c.get_policy_structuring("a/b"),
        }
        for route, call in calls.items():
            client, server = self.client([(500, error("internal_error"), {}), (200, {"ok": True}, {})])
            self.assertEqual(call(client), {"ok": True}, route)
            self.assertEqual([f"{m} {p}" for m, p, _, _ in server.seen], [route] * 2)
            self.assertNotIn("Idempotency-Key", server.seen[0][2], route)

    def test_bodies_leave_unset_options_out(self) -> None:
        client, server = self.client([(200, {}, {})] * 4)
        client.approve("ap_1")
        client.rotate_webhook_secret("wh_1", previous_expires_in=0.2, replace_previous=True)
        client.publish_contract("t", handler_version="1", input_schema={"type": "object"}, retry_preset="CUSTOM",
                                retry_policy={"preset": "CUSTOM", "maxAttempts": 2})
        client.update_endpoint_policy("ep_1", 3, {"preset": "CUSTOM"}, maxConcurrent=None)
        self.assertEqual([body for _, _, _, body in server.seen], [
            {},
            {"previous_secret_expires_in_seconds": 1, "replace_previous": True},
            {"handlerVersion": "1", "inputSchema": {"type": "object"}, "retryPreset": "CUSTOM",
             "retryPolicy": {"maxAttempts": 2}},
            {"preset": "CUSTOM", "maxConcurrent": None, "expectedVersion": 3}])
        with self.assertRaises(ValueError):
            client.reconcile("t", datetime(2026, 1, 1), "2026-01-02T00:00:00Z")

    def test_a_resolve_sends_its_attempt_only_when_given(self) -> None:
        # Resolve QA: a resolve names the attempt verified, so a retry can
        # never settle a later one; left out, the body is as before.
        client, server = self.client([(200, {}, {})] * 3)
        client.resolve_effect("eff_1", "failed", note="n", attempt=2)
        client.resolve_effect("eff_1", "succeeded")
        self.assertEqual([body for _, _, _, body in server.seen],
                         [{"outcome": "failed", "note": "n", "attempt": 2}, None, {"outcome": "succeeded"}])

    def test_a_resolve_without_attempt_names_the_unknown_one(self) -> None:
        # Retry QA: a resolve is retried; without an attempt a repeat could
        # settle a later attempt nobody verified, so the attempt unknown now
        # is read and sent (none when the key may not read effects).
        effect = {"id": "eff_1", "attempts": [{"attempt": 1, "outcome": "indeterminate"},
                                              {"attempt": 2, "outcome": "failed"}]}
        client, server = self.client([(200, effect, {}), (200, {}, {}),
                                      (403, {"error": {"code": "forbidden", "message": "m"}}, {}), (200, {}, {})])
        client.resolve_effect("eff_1", "failed")
        client.resolve_effect("eff_1", "failed")
        self.assertEqual([(method, body) for method, _, _, body in server.seen],
                         [("GET", None), ("POST", {"outcome": "failed", "attempt": 1}),
                          ("GET", None), ("POST", {"outcome": "failed"})])

    def test_a_resolve_whose_read_fails_otherwise_sends_nothing(self) -> None:
        # Only a 403 (the key may not read effects) lets the resolve go
        # without an attempt; any other failed read (here the effect is not
        # found) fails the call before a resolve that could settle an
        # attempt nobody named is sent.
        client, server = self.client([(404, {"error": {"code": "not_found", "message": "m"}}, {})])
        with self.assertRaises(RatchetError) as caught:
            client.resolve_effect("eff_1", "failed")
        self.assertEqual(caught.exception.code, "not_found")
        self.assertEqual([method for method, _, _, _ in server.seen], ["GET"])

    def test_a_batch_answer_naming_other_jobs_is_asked_again(self) -> None:
        # Parity QA: Go failed report_jobs on a result in a slot naming
        # another job; the worker gave up only that report. An answer that
        # does not match the reports cannot be trusted for any of them: it
        # is a lost answer, and the batch (safe to repeat) is asked again.
        reports = [{"job_id": "job_1", "lease_token": "t1", "status": "SUCCEEDED"},
                   {"job_id": "job_2", "lease_token": "t2", "status": "SUCCEEDED"}]
        swapped = {"results": [{"jobId": "job_2", "status": "SUCCEEDED", "attempt": 1},
                               {"jobId": "job_1", "status": "SUCCEEDED", "attempt": 1}]}
        right = {"results": swapped["results"][::-1]}
        client, server = self.client([(200, swapped, {}), (200, right, {})])
        self.assertEqual([r["jobId"] for r in client.report_jobs(reports)], ["job_1", "job_2"])
        self.assertEqual(len(server.seen), 2)

    def test_a_refusal_in_a_batch_carries_the_batch_request_id(self) -> None:
        # Parity QA: a single report's refusal carried its X-Request-Id, the
        # same refusal in a batch none.
        results = {"results": [{"jobId": "job_1", "error": {"code": "lease_lost", "message": "m"}},
                               {"jobId": "job_2", "status": "SUCCEEDED", "attempt": 1}]}
        client, _ = self.client([(200, results, {"X-Request-Id": "req_batch"})])
        got = client.report_jobs([{"job_id": "job_1", "lease_token": "t1", "status": "SUCCEEDED"},
                                  {"job_id": "job_2", "lease_token": "t2", "status": "SUCCEEDED"}])
        self.assertEqual(got[0]["error"].request_id, "req_batch")
        self.assertIn("(request req_batch)", str(got[0]["error"]))
        self.assertIsNone(got[1]["error"])


class NaiveDatetimeTest(unittest.TestCase):
    """One rule for every datetime the SDK takes: a naive one (no zone:
    datetime.utcnow()'s, or datetime.now()'s local time) raises ValueError
    naming the argument, and nothing is sent or checked. verify_webhook
    read one as UTC while reconcile refused it."""

    def test_a_naive_datetime_is_refused_wherever_one_is_taken(self) -> None:
        server = FakeServer([(200, {}, {})] * 2)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        self.addCleanup(client.close)
        naive = datetime(2030, 1, 1)
        secret, body = "whsec_x", b"{}"
        header = "t=1893456000,v1=" + hmac.new(secret.encode(), b"1893456000." + body, "sha256").hexdigest()
        calls = {
            "from_": lambda when: client.reconcile("t", when, "2030-01-02T00:00:00Z"),
            "to": lambda when: client.reconcile("t", "2029-12-31T00:00:00Z", when),
            "verify_webhook's now": lambda when: getratchet.verify_webhook(secret, header, body, now=when),
        }
        for name, call in calls.items():
            with self.assertRaises(ValueError, msg=name) as refused:
                call(naive)
            self.assertIn(f"ratchet: {name} must be an aware datetime: a naive one names no zone",
                          str(refused.exception))
            # A tzinfo whose utcoffset is None is naive too.
            with self.assertRaises(ValueError, msg=name):
                call(naive.replace(tzinfo=_NoOffset()))
        self.assertEqual(server.seen, [], "nothing was sent")
        # An aware one is the time it names, in any zone.
        aware = naive.replace(tzinfo=timezone.utc)
        self.assertEqual(getratchet.verify_webhook(secret, header, body, now=aware), {})
        self.assertEqual(getratchet.verify_webhook(secret, header, body,
                                                   now=aware.astimezone(timezone(timedelta(hours=9)))), {})
        client.reconcile("t", aware, aware + timedelta(days=1))
        self.assertEqual(server.seen[0][3]["from"], "2030-01-01T00:00:00+00:00")


class _NoOffset(tzinfo):
    def utcoffset(self, dt):
        return None

    def dst(self, dt):
        return None


def stubborn_handlers(test: unittest.TestCase, jobs: int = 1, release: Optional[threading.Event] = None,
                      input: object = None, then: Tuple[int, object, dict] = (200, {"jobs": []}, {})):
    """A client of a fake server that hands out job_1 to job_<jobs> in its
    first claim (ten minutes' timeout; input, if given, as each job's
    input) and answers each later claim then, whose tool's handler ignores
    its cancellation (until release is set, or the test ends); the server,
    and an event set once every handler runs."""
    release = threading.Event() if release is None else release
    test.addCleanup(release.set)
    running = threading.Event()
    handed = threading.Event()
    started: List[str] = []
    lock = threading.Lock()

    def respond(method, path, body):
        if path.endswith("/register"):
            return 200, {"workerId": "wkr_1"}, {}
        if path.endswith("/claim"):
            if handed.is_set():
                return then
            handed.set()
            # Ten minutes each: no timeout ends a handler while the test runs.
            return 200, {"jobs": [dict(WorkerRulesTest.job(i, 600_000), input={} if input is None else input)
                                  for i in range(1, jobs + 1)]}, {}
        return 200, {}, {}

    server = FakeServer(respond)
    test.addCleanup(server.close)
    client = getratchet.Ratchet(server.url, "rk_test")
    test.addCleanup(client.close)

    def handler(input, context):
        with lock:
            started.append(context.job_id)
            if len(started) == jobs:
                running.set()
        release.wait(60)  # hang guard: the test ends it sooner

    client.register_tool("t", "1", handler)
    return client, server, running


def quick_beats(test: unittest.TestCase) -> None:
    """Has each heartbeat wait 10 ms instead of what it asks for until test
    ends."""
    real_pause = getratchet.worker.Worker._beat_pause
    quick = mock.patch.object(getratchet.worker.Worker, "_beat_pause", autospec=True,
                              side_effect=lambda worker, active, seconds: real_pause(worker, active, 0.01))
    quick.start()
    test.addCleanup(quick.stop)


def watch_supervisor_waits(test: unittest.TestCase, seen: Callable[[Optional[float]], None]) -> None:
    """Has each job's supervisor call seen(timeout) as it waits for its
    handler (its wake's wait), until test ends."""

    class Wake(threading.Event):
        def wait(self, timeout: Optional[float] = None) -> bool:
            seen(timeout)
            return super().wait(timeout)

    init = getratchet.worker._Active.__init__

    def active_init(active, *args) -> None:
        init(active, *args)
        active.wake = Wake()

    patched = mock.patch.object(getratchet.worker._Active, "__init__", active_init)
    patched.start()
    test.addCleanup(patched.stop)


def frozen_supervisor_clock(test: unittest.TestCase) -> Tuple["_MovedClock", List[Optional[float]]]:
    """Quick heartbeats, and the worker's clock frozen (moved on by the
    test) until test ends. Answers the clock and the list of when each
    supervisor's wait for its handler ends, by that clock (None: no end)."""
    quick_beats(test)
    clock = _MovedClock(frozen=True)
    moved = mock.patch("getratchet.worker.time", clock)
    moved.start()
    test.addCleanup(moved.stop)
    waits: List[Optional[float]] = []
    watch_supervisor_waits(test, lambda timeout: waits.append(None if timeout is None else clock.monotonic() + timeout))
    return clock, waits


def ignoring_a_settled_job(test: unittest.TestCase, answer: str, refusing: threading.Event):
    """A client of a fake server that hands out job_1 (ten minutes'
    timeout) in its first claim and nothing after, and answers its
    heartbeats, once refusing is set, 409 lease_lost (answer "lease_lost")
    or cancelRequested; whose tool's handler ignores its cancellation until
    the test ends. Answers the client, an event set once the handler runs,
    one set once it was cancelled, the cancel_reason it saw, and the
    reports the server was sent."""
    running, cancelled, release = threading.Event(), threading.Event(), threading.Event()
    test.addCleanup(release.set)
    reasons: List[Optional[str]] = []

    def beat() -> Tuple[int, dict, dict]:
        if refusing.is_set() and answer == "lease_lost":
            return 409, error("lease_lost"), {}
        return 200, {"leaseExpiresAt": "2030-01-01T00:00:00Z", "cancelRequested": refusing.is_set()}, {}

    client, reports = one_job(test, WorkerRulesTest.job(1, 600_000), beat)

    def handler(input, context):
        running.set()
        context.cancelled.wait(60)  # hang guard
        reasons.append(context.cancel_reason)
        cancelled.set()
        release.wait(60)  # ignores its cancellation (hang guard: the test ends it sooner)

    client.register_tool("t", "1", handler)
    return client, running, cancelled, reasons, reports


def one_job(test: unittest.TestCase, job: dict, beat: Optional[Callable[[], Tuple[int, dict, dict]]] = None):
    """A client of a fake server that hands out job in its first claim and
    nothing after, answers each heartbeat beat() (by default: the lease
    extended), and records the reports it is sent (the list answered)."""
    reports: List[dict] = []
    claims = {"n": 0}

    def respond(method, path, body):
        if path.endswith("/register"):
            return 200, {"workerId": "wkr_1"}, {}
        if path.endswith("/claim"):
            claims["n"] += 1
            return 200, {"jobs": [job] if claims["n"] == 1 else []}, {}
        if path.endswith("/heartbeat"):
            return beat() if beat else (200, {"leaseExpiresAt": "2030-01-01T00:00:00Z", "cancelRequested": False}, {})
        reports.append(body)
        return 200, {"jobId": job["jobId"], "status": body["status"], "attempt": 1}, {}

    server = FakeServer(respond)
    test.addCleanup(server.close)
    client = getratchet.Ratchet(server.url, "rk_test")
    test.addCleanup(client.close)
    return client, reports

class LeftUnreportedTest(unittest.TestCase):
    """A stop (stop(), a refused key) whose grace ends with a handler still
    running leaves its job unreported (its lease lapses and the job runs
    again elsewhere) and tells on_error so, once per job, naming its job id
    and attempt (never its input), before stop() returns or a blocking
    start() raises, as the Go and TypeScript workers do (QA: only stop()'s
    False said so, and not which job would run again); without on_error,
    the default log writes a line of it."""

    def assert_told_once(self, errors: List[BaseException], job_ids: List[str]) -> None:
        lost = [e for e in errors if isinstance(e, getratchet.ReportNotRecorded)]
        self.assertEqual(sorted(e.job_id for e in lost), sorted(job_ids), errors)
        for notice in lost:
            self.assertEqual((notice.attempt, notice.what, notice.__cause__), (1, "not_recorded", None))
            self.assertIn(f"job {notice.job_id} attempt 1 was left unreported, its handler still running when the "
                          "stop grace (0.05 s) ended", str(notice))
            self.assertNotIn(SECRET, str(notice))

    def test_a_stop_tells_on_error_of_each_job_its_grace_left_unreported(self) -> None:
        client, server, running = stubborn_handlers(self, 2, input={"card": SECRET})
        errors: List[BaseException] = []
        client.worker.start(2, poll_interval=0.05, on_error=errors.append, block=False, stop_grace=0.05)
        self.assertTrue(running.wait(10))  # hang guard
        # The handlers never return (until the test ends): the grace ends,
        # whatever its length. stop() waits at most its deadline, twice the
        # grace and two seconds.
        self.assertFalse(client.worker.stop(0), "two jobs were left unreported")
        # Told before stop() returned: read at once, not waited for.
        self.assert_told_once(errors, ["job_1", "job_2"])
        self.assertEqual(len(errors), 2, errors)
        self.assertFalse([p for m, p, h, b in server.seen if "report" in p], "a job left running was reported")
        self.assertFalse(client.worker.stop(0), "asked again")
        self.assertEqual(len(errors), 2, "told again by a second stop()")

    def test_without_on_error_the_default_log_names_each_job_left_unreported(self) -> None:
        client, server, running = stubborn_handlers(self, input={"card": SECRET})
        with self.assertLogs("getratchet.worker", "WARNING") as logged:
            client.worker.start(1, poll_interval=0.05, block=False, stop_grace=0.05)
            self.assertTrue(running.wait(10))  # hang guard
            self.assertFalse(client.worker.stop(0))
        self.assertEqual(logged.output, ["WARNING:getratchet.worker:ratchet worker: report=not_recorded job_id=job_1 "
                                         "attempt=1 error=ReportNotRecorded (set on_error to see it)"])

    def test_a_refused_key_tells_on_error_before_start_raises(self) -> None:
        # The second claim is refused 401: the worker stops as a stop() whose
        # deadline passed, the handler ignores its cancellation, and start()
        # raises the refusal once on_error was told both.
        client, server, running = stubborn_handlers(self, input={"card": SECRET}, then=(401, error("unauthorized"), {}))
        errors: List[BaseException] = []
        raised: List[BaseException] = []
        returned = threading.Event()

        def run() -> None:
            try:
                client.worker.start(2, poll_interval=0.05, on_error=errors.append, stop_grace=0.05)
            except BaseException as err:  # noqa: BLE001 - the test reads it
                raised.append(err)
            returned.set()

        threading.Thread(target=run, daemon=True).start()
        self.assertTrue(returned.wait(30), "start() did not return after its key was refused")  # hang guard
        self.assertEqual([getattr(err, "status", None) for err in raised], [401])
        # Read at once: told before start() raised.
        self.assertEqual([type(e) for e in errors], [getratchet.RatchetError, getratchet.ReportNotRecorded], errors)
        self.assert_told_once(errors, ["job_1"])
        self.assertFalse(client.worker.stop(0))

    def test_a_handler_ignoring_a_lost_lease_or_a_cancel_is_left_running_and_not_told_as_left_unreported(self) -> None:
        # A handler that ignores a cancellation other than the stop's, a
        # lost lease (told to on_error as LeaseLost) or the server's cancel
        # request (the job is cancelled: it runs no more), whether it came
        # before the stop's deadline or during its grace, is waited for the
        # grace at most, as one the stop cancelled, and stop() answers False
        # (a handler was left running); but on_error is not told its job was
        # left unreported to run again (sdk QA: a lease lost during the grace
        # was told "the job runs again once its lease lapses", as in the Go
        # and TypeScript workers).
        quick_beats(self)
        # The worker's clock, moved on by the test to end the grace: a grace
        # of a minute (a hang guard) never ends on its own.
        clock = _MovedClock()
        moved = mock.patch("getratchet.worker.time", clock)
        moved.start()
        self.addCleanup(moved.stop)
        for answer, before in (("lease_lost", True), ("cancelRequested", True), ("lease_lost", False)):
            with self.subTest(answer=answer, before=before):
                self.left_running_untold(clock, answer, before)

    def test_a_stop_gives_a_handler_ignoring_a_lost_lease_or_a_cancel_its_deadline_then_the_grace(self) -> None:
        # A stop with a deadline waits for a handler that ignores a lost
        # lease or the server's cancel request, cancelled before the stop, as
        # for the others: until the deadline, and only then the grace, as it
        # gives a handler it cancels at the deadline (the Go SDK's Stop began
        # that grace at its call, giving such a handler up before the
        # deadline; the TypeScript worker waits as this one does). The
        # worker's clock is frozen and moved on by the test: the supervisor's
        # wait of exactly the grace comes only once the clock reached the
        # deadline.
        clock, waits = frozen_supervisor_clock(self)
        for answer in ("lease_lost", "cancelRequested"):
            with self.subTest(answer=answer):
                del waits[:]
                self.deadline_then_grace(clock, waits, answer)

    def test_a_stop_with_no_deadline_gives_a_handler_ignoring_a_lost_lease_or_a_cancel_the_grace(self) -> None:
        # stop(math.inf) sets no deadline: a handler that ignores a lost
        # lease or the server's cancel request has nothing left to report,
        # and gets the grace from stop()'s call, or from the loss if it
        # comes later, as under Go's Stop without a deadline and the
        # TypeScript worker's stop({ timeoutMs: Infinity }); then it is left
        # running, nothing told, and stop() answers False (review: its grace
        # began only at the deadline, a year on, so stop() waited for it that
        # long). The worker's clock is frozen and moved on by the test.
        clock, waits = frozen_supervisor_clock(self)
        for answer, before in (("lease_lost", True), ("cancelRequested", True), ("lease_lost", False),
                               ("cancelRequested", False)):
            with self.subTest(answer=answer, before=before):
                del waits[:]
                self.undated_grace(clock, waits, answer, before)

    def undated_grace(self, clock: "_MovedClock", waits: List[Optional[float]], answer: str, before: bool) -> None:
        grace, later = 7.0, 5.0
        refusing = threading.Event()
        if before:
            refusing.set()
        client, running, cancelled, reasons, reports = ignoring_a_settled_job(self, answer, refusing)
        errors: List[BaseException] = []
        client.worker.start(1, poll_interval=0.05, on_error=errors.append, block=False, stop_grace=grace)
        self.assertTrue(running.wait(10))  # hang guard
        if before:
            self.assertTrue(cancelled.wait(10))  # hang guard
        answers: List[bool] = []
        called = clock.monotonic()
        stopper = threading.Thread(target=lambda: answers.append(client.worker.stop(math.inf)), daemon=True)
        stopper.start()
        wait_until(lambda: client.worker._stop_at is not None)
        if not before:
            # The loss comes later than the stop's call: its grace runs
            # from the loss, not from the call.
            with client.worker._lock:
                pass  # the stop's request is made
            clock.offset += later
            refusing.set()
            self.assertTrue(cancelled.wait(10))  # hang guard
        self.assertEqual(reasons, ["lease_lost" if answer == "lease_lost" else "cancelled"])
        end = (called if before else called + later) + grace
        wait_until(lambda: any(w is not None and abs(w - end) < 1e-9 for w in waits))
        self.assertEqual([w for w in waits if w is not None and w < end - 1e-9], [],
                         "a grace began before the stop's call or the loss")
        self.assertTrue(stopper.is_alive(), "the handler was given up before the grace ended")
        clock.offset += grace
        for active in list(client.worker._active.values()):
            active.wake.set()
        stopper.join(30)  # hang guard
        self.assertFalse(stopper.is_alive(), "stop() still waits for the handler")
        self.assertEqual(answers, [False], "a handler was left running")
        self.assertEqual(reports, [])
        self.assertEqual([e for e in errors if isinstance(e, getratchet.ReportNotRecorded)], [])
        if answer == "lease_lost":
            self.assertTrue(any(isinstance(e, getratchet.LeaseLost) for e in errors))

    def deadline_then_grace(self, clock: "_MovedClock", waits: List[Optional[float]], answer: str) -> None:
        grace, timeout = 7.0, 45.0
        refusing = threading.Event()
        refusing.set()
        client, running, cancelled, reasons, reports = ignoring_a_settled_job(self, answer, refusing)
        errors: List[BaseException] = []
        client.worker.start(1, poll_interval=0.05, on_error=errors.append, block=False, stop_grace=grace)
        self.assertTrue(running.wait(10))  # hang guard
        self.assertTrue(cancelled.wait(10))  # hang guard
        self.assertEqual(reasons, ["lease_lost" if answer == "lease_lost" else "cancelled"])
        if answer == "lease_lost":
            wait_until(lambda: any(isinstance(e, getratchet.LeaseLost) for e in errors))
        deadline, end = clock.monotonic() + timeout, clock.monotonic() + timeout + grace
        answers: List[bool] = []
        stopper = threading.Thread(target=lambda: answers.append(client.worker.stop(timeout)), daemon=True)
        stopper.start()
        wait_until(lambda: client.worker._stop_at is not None)
        with client.worker._lock:
            pass  # the stop's request is made
        # The supervisor looks again, now that the stop was asked for: it
        # still waits for the handler with no end (no grace before the
        # deadline).
        (active,) = client.worker._active.values()
        seen = len(waits)
        active.wake.set()
        wait_until(lambda: len(waits) > seen)
        self.assertEqual(waits[seen:], [None], "a grace began before the deadline")
        # The deadline: the clock reaches it, and the stop's wait for the
        # handlers wakes to see it; the supervisor then waits for exactly
        # the grace from there (a grace begun at stop()'s call would end
        # before it, and the handler would be given up at once).
        clock.offset += timeout
        with client.worker._lock:
            client.worker._lock.notify_all()
        wait_until(lambda: any(w is not None and abs(w - end) < 1e-9 for w in waits) or not stopper.is_alive())
        self.assertTrue(stopper.is_alive(), "the handler was given up at the deadline")
        self.assertEqual([w for w in waits if w is not None and w < deadline], [], "a grace began before the deadline")
        clock.offset += grace
        for active in list(client.worker._active.values()):
            active.wake.set()
        stopper.join(30)  # hang guard
        self.assertEqual(answers, [False], "a handler was left running")
        self.assertEqual(reports, [])
        self.assertEqual([e for e in errors if isinstance(e, getratchet.ReportNotRecorded)], [])

    def left_running_untold(self, clock: "_MovedClock", answer: str, before: bool) -> None:
        refusing = threading.Event()
        if before:
            refusing.set()
        client, running, cancelled, reasons, reports = ignoring_a_settled_job(self, answer, refusing)
        errors: List[BaseException] = []
        client.worker.start(1, poll_interval=0.05, on_error=errors.append, block=False, stop_grace=60)
        self.assertTrue(running.wait(10))  # hang guard
        answers: List[bool] = []
        stopper = threading.Thread(target=lambda: answers.append(client.worker.stop(0)), daemon=True)
        if before:
            self.assertTrue(cancelled.wait(10))  # hang guard
            self.assertEqual(reasons, ["lease_lost" if answer == "lease_lost" else "cancelled"])
            stopper.start()
        else:
            stopper.start()
            self.assertTrue(cancelled.wait(10))  # hang guard
            self.assertEqual(reasons, ["stopping"])
            refusing.set()
        if answer == "lease_lost":
            wait_until(lambda: any(isinstance(e, getratchet.LeaseLost) for e in errors))
        # The grace ends: the clock moves on past it, and the supervisor
        # wakes to see it (again, until stop() returns: once it has begun).
        guard = time.monotonic() + 60  # hang guard
        while stopper.is_alive() and time.monotonic() < guard:
            clock.offset += 61
            for active in list(client.worker._active.values()):
                active.wake.set()
            stopper.join(0.02)
        self.assertEqual(answers, [False], "a handler was left running")
        self.assertEqual(reports, [])
        self.assertEqual([e for e in errors if isinstance(e, getratchet.ReportNotRecorded)], [])


class _MovedClock:
    """The time module, its monotonic clock moved on by offset seconds
    (frozen: standing still but for that)."""

    def __init__(self, frozen: bool = False) -> None:
        self.offset = 0.0
        self.frozen = time.monotonic() if frozen else None

    def monotonic(self) -> float:
        return (time.monotonic() if self.frozen is None else self.frozen) + self.offset

    def __getattr__(self, name: str):
        return getattr(time, name)

class FullReportQueueTest(unittest.TestCase):
    """A worker stopped (stop(), its stop_event, a KeyboardInterrupt) while
    the server refuses or holds every report and more reports wait in the
    reporter's queue than its deliveries in flight hold (the Go SDK's defect:
    a full queue's reports were retried for ever once Start's context ended)
    gives every report up at the stop's deadline and twice its grace, each
    told once naming its job and counted lost, leaves no thread running and
    returns."""

    JOBS = 8

    def setUp(self) -> None:
        # One delivery of at most two reports in flight: six of the eight
        # wait in the queue, as reports beyond the API's 100 a batch and the
        # three deliveries in flight would.
        for name, value in (("_REPORTS_IN_FLIGHT", 1), ("_REPORT_BATCH_MAX", 2)):
            patcher = mock.patch.object(getratchet.worker, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)
        quick_backoff(self)
        self.release = threading.Event()  # ends the held reports' requests (the server's close waits for them)
        self.errors: List[BaseException] = []
        self.before = set(threading.enumerate())  # another test's threads are not this worker's

    def serve(self, hold: bool) -> getratchet.Ratchet:
        """A client whose worker's first claim leases JOBS jobs, against a
        server that answers every report 503 (hold=False) or never (hold)."""
        claims = {"n": 0}

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                claims["n"] += 1
                jobs = [WorkerRulesTest.job(i) for i in range(1, self.JOBS + 1)] if claims["n"] == 1 else []
                return 200, {"jobs": jobs}, {}
            if hold:
                self.release.wait(60)
            return 503, error("unavailable"), {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(self.release.set)
        client = getratchet.Ratchet(server.url, "rk_test")
        self.addCleanup(client.close)
        client.register_tool("t", "1", lambda input, context: {"job": context.job_id})
        return client

    def queue_full(self, worker) -> None:
        """Waits until every handler returned and the reports not in flight
        wait in the reporter's queue (the queue is full of them)."""
        def full() -> bool:
            with worker._reporter._cond:
                # The first report may have gone alone (the others not yet made).
                return len(worker._reporter._queue) >= self.JOBS - 2 and worker._reporter._in_flight == 1
        wait_until(full)

    def assert_every_report_given_up_once(self, worker) -> None:
        self.assertTrue(worker._done.is_set(), "the stop never ended")
        lost = [e for e in self.errors if isinstance(e, getratchet.ReportNotRecorded)]
        self.assertEqual(sorted(e.job_id for e in lost), sorted(f"job_{i}" for i in range(1, self.JOBS + 1)), lost)
        for notice in lost:
            self.assertIn(notice.job_id, str(notice))
        self.assertEqual(worker._lost_reports, self.JOBS)
        self.assertFalse(worker._active)
        with worker._reporter._cond:
            self.assertEqual((worker._reporter._queue, worker._reporter._in_flight), ([], 0))
        self.assertFalse(worker._claim_cut is not None and worker._claim_cut.is_alive(), "the claim cut's timer runs on")
        # The job, handler, heartbeat, on_error and stop_event threads end
        # (those ending when stop() returned end a moment later).
        def running() -> List[str]:
            return [t.name for t in threading.enumerate() if t.name.startswith("ratchet-") and t not in self.before]
        try:
            wait_until(lambda: not running())
        except AssertionError:
            self.fail(f"still running: {running()}")

    def test_a_stop_gives_up_a_full_queue_of_refused_reports(self) -> None:
        client = self.serve(hold=False)
        client.worker.start(self.JOBS, poll_interval=0.05, on_error=self.errors.append, block=False, stop_grace=0.1)
        self.queue_full(client.worker)
        self.assertFalse(client.worker.stop(0), "every report was lost")
        self.assert_every_report_given_up_once(client.worker)

    def test_a_stop_gives_up_a_full_queue_behind_a_delivery_that_hangs(self) -> None:
        # The delivery in flight never ends on its own (its timeout is an
        # hour): the give-up time cuts it, and the reports waiting behind it
        # fail at once, each told.
        patched = mock.patch.object(getratchet.worker, "_REPORT_TIMEOUT", 3600.0)
        patched.start()
        self.addCleanup(patched.stop)
        client = self.serve(hold=True)
        client.worker.start(self.JOBS, poll_interval=0.05, on_error=self.errors.append, block=False, stop_grace=0.1)
        self.queue_full(client.worker)
        self.assertFalse(client.worker.stop(0), "every report was lost")
        self.assert_every_report_given_up_once(client.worker)

    def start_blocking_until_full(self, client, stop_event=None) -> Tuple[List[BaseException], threading.Event]:
        """Starts client's worker blocking on a thread of its own, with a
        stop deadline of 0 for its stop_event and a KeyboardInterrupt
        (stop()'s 30 s otherwise), and waits until its report queue is full."""
        patched = mock.patch.object(getratchet.worker, "_IMPLICIT_STOP_TIMEOUT", 0.0)
        patched.start()
        self.addCleanup(patched.stop)
        raised: List[BaseException] = []
        returned = threading.Event()

        def on_error(err: BaseException) -> None:
            # A little slow, as a logger's I/O: start() returned while the
            # last losses were still being told (a program ending then never
            # heard of them), where it now waits as stop() does.
            time.sleep(0.01)
            self.errors.append(err)

        def run() -> None:
            try:
                # A slot to spare: the loop waits on the failing reports
                # (_reports_holding), not on a slot.
                client.worker.start(self.JOBS + 1, poll_interval=0.05, on_error=on_error, stop_event=stop_event,
                                    stop_grace=0.1)
            except BaseException as err:  # noqa: BLE001 - the test reads it
                raised.append(err)
            returned.set()

        threading.Thread(target=run, daemon=True).start()
        wait_until(lambda: client.worker.worker_id is not None)
        self.queue_full(client.worker)
        return raised, returned

    def test_a_stop_event_gives_up_a_full_queue_of_refused_reports(self) -> None:
        client = self.serve(hold=False)
        stop = threading.Event()
        raised, returned = self.start_blocking_until_full(client, stop)
        stop.set()
        self.assertTrue(returned.wait(10), "start() never returned")
        self.assertEqual(raised, [])
        self.assert_every_report_given_up_once(client.worker)

    def test_a_keyboard_interrupt_gives_up_a_full_queue_of_refused_reports(self) -> None:
        client = self.serve(hold=False)
        worker = client.worker
        interrupt = threading.Event()
        holding = worker._reports_holding

        def interrupted() -> bool:
            # Ctrl-C, as the thread running start() waits to claim while the
            # reports fail.
            if interrupt.is_set():
                interrupt.clear()
                raise KeyboardInterrupt
            return holding()

        worker._reports_holding = interrupted
        raised, returned = self.start_blocking_until_full(client)
        interrupt.set()
        self.assertTrue(returned.wait(10), "start() never returned")
        self.assertEqual([type(err) for err in raised], [KeyboardInterrupt])
        self.assert_every_report_given_up_once(worker)

    def interrupt_while_draining(self, worker, ready: Callable[[], None],
                                 then: Callable[[], bool] = lambda: True, **start) -> None:
        """Runs worker.start(**start) on the main thread, sets its
        stop_event (30 s for the jobs) once ready() returned, and then, once
        start() drains and then() is true, sends the process a real SIGINT:
        start() must raise it again, the worker done."""
        self.default_sigint()
        stop = threading.Event()

        def interrupt() -> None:
            wait_until(lambda: worker.worker_id is not None)
            ready()
            stop.set()
            wait_until(lambda: main_thread_in("_drain"))
            wait_until(then)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        with self.assertRaises(KeyboardInterrupt):
            worker.start(on_error=self.errors.append, stop_event=stop, **start)

    def default_sigint(self) -> None:
        """Has a SIGINT raise KeyboardInterrupt in the main thread for this
        test, whatever handler the runner set (restored after)."""
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            self.addCleanup(signal.signal, signal.SIGINT, signal.getsignal(signal.SIGINT))
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def assert_given_up_at_once(self, worker, job_ids: List[str]) -> None:
        """The worker is done, its claim cut's timer cancelled, each job of
        job_ids told once as not recorded, naming it, nothing else told, and
        no thread of its own left running."""
        self.assertTrue(worker._done.is_set(), "the worker never ended")
        # Cancelled, the timer's thread ends a moment later.
        try:
            wait_until(lambda: worker._claim_cut is None or not worker._claim_cut.is_alive())
        except AssertionError:
            self.fail("the claim cut's timer runs on")
        lost = [e for e in self.errors if isinstance(e, getratchet.ReportNotRecorded)]
        self.assertEqual(sorted(e.job_id for e in lost), sorted(job_ids), self.errors)
        for notice in lost:
            self.assertIn(notice.job_id, str(notice))

        def running() -> List[str]:
            return [t.name for t in threading.enumerate()
                    if t.name.startswith("ratchet-") and not t.name.startswith("ratchet-handler-")
                    and t not in self.before]
        try:
            wait_until(lambda: not running())
        except AssertionError:
            self.fail(f"still running: {running()}")
        self.assertEqual(len(self.errors), len(lost), "more was told after the jobs given up")
        self.assertFalse(worker.stop(0), "a stop given up lost its jobs")

    def test_a_second_interrupt_gives_up_the_reports_at_once(self) -> None:
        # The interrupt comes while start() waits on the reports the server
        # refuses (a minute's grace). Without the handling, the drain was
        # skipped: the worker never done, its on_error thread and claim
        # cut's timer alive until the deadline, the reports still retried.
        client = self.serve(hold=False)
        worker = client.worker
        self.interrupt_while_draining(worker, lambda: self.queue_full(worker), concurrency=self.JOBS + 1,
                                      poll_interval=0.05, stop_grace=60)
        self.assert_given_up_at_once(worker, [f"job_{i}" for i in range(1, self.JOBS + 1)])

    def test_a_second_interrupt_gives_up_a_running_handler_at_once(self) -> None:
        # The handler ignores its cancellation: start() waited for it the
        # stop's 30 s and a minute's grace; it is left running, unwaited.
        client, server, running = stubborn_handlers(self)
        self.interrupt_while_draining(client.worker, lambda: wait_until(running.is_set), poll_interval=0.05,
                                      stop_grace=60)
        self.assert_given_up_at_once(client.worker, ["job_1"])
        self.assertIn("handler still running", str(self.errors[0]))
        self.assertFalse([p for m, p, h, b in server.seen if p.endswith("/complete") or "report" in p],
                         "the job left running was reported")
        # Its supervisor, waiting for nothing more, then left the job
        # unreported (it ended: assert_given_up_at_once): told already, the
        # job is not queued again for on_error, whose thread has ended.
        wait_until(lambda: client.worker._left_unreported == 1)
        self.assertFalse(client.worker._errors._items, "the job given up was told again")

    def test_a_job_the_grace_left_and_a_second_interrupt_gave_up_is_told_once(self) -> None:
        # The stop grace ends with the handler running, and its supervisor
        # tells the job; a second interrupt then gives the stop up while the
        # job is still among the active ones: it is not told again.
        client, server, running = stubborn_handlers(self)
        worker = client.worker
        told = threading.Event()

        class Active(dict):
            def pop(self, key, *default):
                # The supervisor's last step, under the worker's lock, once
                # it told the job: it waits (the lock released) until the
                # second interrupt gave the stop up.
                if not worker._abandoned:
                    told.set()
                    worker._lock.wait_for(lambda: worker._abandoned, 30)  # hang guard
                return dict.pop(self, key, *default)

        worker._active = Active()
        patched = mock.patch.object(getratchet.worker, "_IMPLICIT_STOP_TIMEOUT", 0.0)  # the stop_event's deadline
        patched.start()
        self.addCleanup(patched.stop)
        self.interrupt_while_draining(worker, lambda: wait_until(running.is_set), told.is_set, poll_interval=0.05,
                                      stop_grace=0.05)
        self.assert_given_up_at_once(worker, ["job_1"])
        self.assertIn("stop grace (0.05 s) ended", str(self.errors[0]))
        self.assertEqual(worker._left_unreported, 1)

    def test_an_interrupt_while_stop_waits_gives_up_at_once(self) -> None:
        # start(block=False) drains on the worker's own thread; the program's
        # stop() waits for it, and a Ctrl-C then gives up the handler that
        # ignores its cancellation. Without the handling, the
        # KeyboardInterrupt left stop() at once and the drain ran on, the
        # worker not done, for the stop's 30 s and a minute's grace.
        client, server, running = stubborn_handlers(self)
        worker = client.worker
        worker.start(on_error=self.errors.append, poll_interval=0.05, stop_grace=60, block=False)
        wait_until(running.is_set)
        self.interrupt_stop(worker)
        self.assert_given_up_at_once(worker, ["job_1"])
        self.assertIn("handler still running", str(self.errors[0]))

    def test_an_interrupt_while_stop_waits_does_not_tell_a_lost_lease_as_run_again(self) -> None:
        # A handler ignoring its lost lease (told to on_error as LeaseLost:
        # a newer attempt holds the job) is given up by a Ctrl-C during
        # stop() as any other, but on_error is not told its job was left to
        # run again (sdk QA: it was, "the job runs again once its lease
        # lapses").
        quick_beats(self)
        refusing = threading.Event()
        refusing.set()
        client, running, cancelled, reasons, reports = ignoring_a_settled_job(self, "lease_lost", refusing)
        worker = client.worker
        worker.start(on_error=self.errors.append, poll_interval=0.05, stop_grace=60, block=False)
        self.assertTrue(cancelled.wait(10))  # hang guard
        wait_until(lambda: self.errors)
        self.assertEqual(reasons, ["lease_lost"])
        self.interrupt_stop(worker)
        self.assertTrue(worker._done.is_set(), "the worker never ended")
        self.assertEqual([type(e) for e in self.errors], [getratchet.LeaseLost], self.errors)
        self.assertEqual(reports, [])

    def interrupt_stop(self, worker) -> None:
        """Calls worker.stop(30) on this (the main) thread and interrupts
        it with a real SIGINT once it waits, checking it raises the
        KeyboardInterrupt."""
        self.default_sigint()

        def stopping() -> bool:
            return main_thread_in("stop") and worker._stopping.is_set()

        def interrupt() -> None:
            wait_until(stopping)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        with self.assertRaises(KeyboardInterrupt):
            worker.stop(30)

    def start_to_interrupt(self, worker, handling: bool = False
                           ) -> Tuple[threading.Event, List[BaseException], threading.Event]:
        """Starts worker blocking (two slots, a minute's grace) on a thread
        of its own, inside an `except KeyboardInterrupt:` block when
        handling; answers an event that, once set, has that thread raise a
        KeyboardInterrupt (the worker's first Ctrl-C) as it waits to claim,
        what start() raised, and an event set once it returned."""
        interrupt = threading.Event()
        holding = worker._reports_holding

        def first() -> bool:
            if interrupt.is_set():
                interrupt.clear()
                raise KeyboardInterrupt
            return holding()

        worker._reports_holding = first
        raised: List[BaseException] = []
        returned = threading.Event()

        def start() -> None:
            try:
                # A slot to spare: the loop looks at the reports, not at a slot.
                worker.start(2, poll_interval=0.05, on_error=self.errors.append, stop_grace=60)
            except BaseException as err:  # noqa: BLE001 - the test reads it
                raised.append(err)

        def run() -> None:
            if handling:
                try:
                    raise KeyboardInterrupt  # the caller's own
                except KeyboardInterrupt:
                    start()
            else:
                start()
            returned.set()

        threading.Thread(target=run, daemon=True).start()
        return interrupt, raised, returned

    def interrupted_again_before_draining(self, asked: bool) -> None:
        """A second KeyboardInterrupt in a blocking start() comes as the
        first's stop is asked for, once it was (asked) or before: start()
        must give up the handler that ignores its cancellation at once, as
        a second one during the drain does, not drain as after one."""
        client, server, running = stubborn_handlers(self)
        worker = client.worker
        request_stop = worker._request_stop

        def second(timeout: float) -> None:
            worker._request_stop = request_stop
            if asked:
                request_stop(timeout)
            raise KeyboardInterrupt

        interrupt, raised, returned = self.start_to_interrupt(worker)
        wait_until(running.is_set)
        worker._request_stop = second
        interrupt.set()
        self.assertTrue(returned.wait(10), "start() drained as after one interrupt")
        self.assertEqual([type(err) for err in raised], [KeyboardInterrupt])
        self.assert_given_up_at_once(worker, ["job_1"])
        self.assertIn("handler still running", str(self.errors[0]))

    def test_a_second_interrupt_as_the_stop_is_asked_for_gives_up_at_once(self) -> None:
        # It was taken as the first: the drain waited the stop's 30 s and a
        # minute's grace for the handler.
        self.interrupted_again_before_draining(asked=True)

    def test_a_second_interrupt_before_the_stop_was_asked_for_gives_up_at_once(self) -> None:
        # No stop deadline was set: the drain waited for the handler for ever.
        self.interrupted_again_before_draining(asked=False)

    def test_an_interrupt_is_second_only_after_one_of_the_workers_own(self) -> None:
        # start() called while its caller handles a KeyboardInterrupt
        # (before): the worker's first interrupt, its context that one, is
        # not a second; one raised while the worker's first was handled is,
        # directly or through what was raised meanwhile.
        from getratchet.worker import _interrupted_again
        before = KeyboardInterrupt()
        before.__context__ = KeyboardInterrupt()  # the caller's own second Ctrl-C
        first = KeyboardInterrupt()
        first.__context__ = before
        meanwhile = ValueError()
        meanwhile.__context__ = first
        second, third = KeyboardInterrupt(), KeyboardInterrupt()
        second.__context__, third.__context__ = first, meanwhile
        self.assertFalse(_interrupted_again(first, before))
        self.assertFalse(_interrupted_again(before, before))
        self.assertFalse(_interrupted_again(None, None))
        self.assertFalse(_interrupted_again(meanwhile, before), "not an interrupt")
        self.assertTrue(_interrupted_again(second, before))
        self.assertTrue(_interrupted_again(third, before))
        self.assertTrue(_interrupted_again(second, None))

    def interrupted_a_third_time_in(self, name: str, after: bool = False, times: int = 1) -> int:
        """Runs interrupt_while_draining with two handlers that ignore their
        cancellation, the worker's method name (its transport's, for
        close_idle) raising a KeyboardInterrupt (a third Ctrl-C) at each of
        its first times calls once the second gave the stop up, before the
        method ran or, with after, once it had: the giving up must still be
        done, each job told once. Answers how many calls were made since."""
        client, server, running = stubborn_handlers(self, 2)
        worker = self.worker = client.worker
        owner = worker._transport if name == "close_idle" else worker
        step = getattr(owner, name)
        calls = [0]

        def interrupted(*args, **kwargs):
            if not worker._abandoned:
                return step(*args, **kwargs)
            calls[0] += 1
            if calls[0] > times:
                return step(*args, **kwargs)
            if after:
                step(*args, **kwargs)
            raise KeyboardInterrupt

        def ready() -> None:
            wait_until(running.is_set)
            setattr(owner, name, interrupted)

        self.addCleanup(vars(owner).pop, name, None)  # before the client closes
        self.interrupt_while_draining(worker, ready, concurrency=2, poll_interval=0.05, stop_grace=60)
        self.assertTrue(calls[0], f"{name} was never interrupted")
        self.assert_given_up_at_once(worker, ["job_1", "job_2"])
        self.assertTrue(worker._reporter._abort.fired, "the report deliveries were not cut")
        self.assertTrue(worker._claim_abort.fired, "the claim was not cut")
        return calls[0]

    def test_a_third_interrupt_as_a_job_is_given_up_leaves_none_untold(self) -> None:
        # It cut the giving up short: job_1 marked told but never told,
        # job_2 neither cancelled nor told, nothing cut.
        self.interrupted_a_third_time_in("_tell")

    def test_a_third_interrupt_once_a_job_was_told_tells_it_once(self) -> None:
        # It landed after job_1 was queued for on_error and before it was
        # marked told: the giving up, done again, told job_1 twice.
        self.interrupted_a_third_time_in("_tell", after=True)

    def test_a_third_interrupt_as_the_stop_ends_leaves_no_thread_running(self) -> None:
        # It cut the drain's end short: the on_error thread was never told
        # to end, and ran on.
        self.interrupted_a_third_time_in("_close_errors")

    def test_a_third_interrupt_once_on_error_was_told_to_end_ends_it_once(self) -> None:
        # It landed once the on_error thread's end was queued: done again,
        # the close queued a second end, which no thread took, and each
        # flush after it (stop()'s, start()'s) waited its full second.
        self.interrupted_a_third_time_in("_close_errors", after=True)
        # Its thread ended (assert_given_up_at_once): nothing may be left for it.
        self.assertEqual(self.worker._errors.unfinished_tasks, 0, "an end was queued twice")

    def test_a_step_interrupted_again_and_again_is_given_up_and_the_rest_done(self) -> None:
        # A step cut each time it is run (a signal storm, or a step that
        # raises KeyboardInterrupt itself) was run again for ever; it is run
        # a few times, and the worker still ends (the steps after it done).
        calls = self.interrupted_a_third_time_in("close_idle", times=100)
        self.assertEqual(calls, 1 + getratchet.worker._INTERRUPT_RERUNS, "run again without bound")

    def test_a_step_cut_by_a_signal_at_every_run_is_still_done(self) -> None:
        # A storm of real SIGINTs that cut every run of a step before its
        # effect left it undone once the reruns ran out: the last run holds
        # the handler off, and the interrupt is raised once the steps are done.
        self.default_sigint()
        done: List[str] = []

        def stormed() -> None:
            signal.raise_signal(signal.SIGINT)  # its handler runs here, at every run
            done.append("stormed")

        with self.assertRaises(KeyboardInterrupt):
            getratchet.worker._despite_interrupts(stormed, lambda: done.append("after"))
        self.assertEqual(done, ["stormed", "after"])
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler, "the handler was not put back")

    def test_a_signal_storm_as_the_stop_ends_still_ends_the_on_error_thread(self) -> None:
        # The drain's close of the on_error queue, cut by a real SIGINT at
        # every run, was left undone: its thread waited for ever.
        self.default_sigint()
        worker = getratchet.Ratchet("http://127.0.0.1:1", "rk_test").worker
        self.addCleanup(worker._transport.close)
        worker._on_error = lambda error: None
        thread = NoticesTest.deliver(worker)
        close = worker._errors.close

        def stormed() -> None:
            signal.raise_signal(signal.SIGINT)
            close()

        with mock.patch.object(worker._errors, "close", side_effect=stormed):
            with self.assertRaises(KeyboardInterrupt):
                worker._drain(None)
        thread.join(10)  # hang guard
        self.assertFalse(thread.is_alive(), "the on_error thread was never told to end")
        self.assertTrue(worker._done.is_set())
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)

    def test_a_start_called_while_its_caller_handles_an_interrupt_drains_on_its_first(self) -> None:
        # start() called in its caller's own `except KeyboardInterrupt:`
        # block: the worker's first interrupt has the caller's as its context
        # and must not count as a second (_loop's before). Taken as one, the
        # running handler was given up at once and left unreported.
        release = threading.Event()
        client, server, running = stubborn_handlers(self, release=release)
        worker = client.worker
        draining = threading.Event()
        wait_for_jobs = worker._wait_for_jobs

        def drain() -> None:
            draining.set()
            wait_for_jobs()

        worker._wait_for_jobs = drain
        interrupt, raised, returned = self.start_to_interrupt(worker, handling=True)
        wait_until(running.is_set)
        interrupt.set()
        wait_until(lambda: draining.is_set() or returned.is_set())
        release.set()  # the handler returns, once the drain waits for it
        self.assertTrue(returned.wait(10), "start() never returned")
        self.assertEqual([type(err) for err in raised], [KeyboardInterrupt])
        self.assert_drained_on_the_first(worker, server)

    def assert_drained_on_the_first(self, worker, server) -> None:
        """The worker's first interrupt drained gracefully: not taken for a
        second, job_1's handler reported as it returned (SUCCEEDED), nothing
        told lost, and stop() answers that nothing was."""
        self.assertFalse(worker._abandoned, "the worker's first interrupt was taken as a second")
        self.assertEqual([e for e in self.errors if isinstance(e, getratchet.ReportNotRecorded)], [])
        reports = [b for m, p, h, b in server.seen if p == "/api/v1/jobs/job_1/report"]
        self.assertEqual([r["status"] for r in reports], ["SUCCEEDED"], server.seen)
        self.assertTrue(worker.stop(0), "the drain lost the job")

    def test_a_real_interrupt_of_a_start_called_in_its_callers_interrupt_handler_drains(self) -> None:
        # End to end, as a program meets it: a blocking start() on the main
        # thread, called in the caller's own `except KeyboardInterrupt:`
        # block, gets one real SIGINT while a job runs. That interrupt has
        # the caller's as its context and is the worker's first (_loop's
        # before): the stop drains, waiting for the handler, which is
        # reported as it returned, and start() raises the interrupt again.
        # With before not passed to the drain (None), it was taken for a
        # second: the handler given up at once and left unreported.
        self.default_sigint()
        release = threading.Event()
        client, server, running = stubborn_handlers(self, release=release)
        worker = client.worker

        def interrupt() -> None:
            try:
                wait_until(running.is_set)
                os.kill(os.getpid(), signal.SIGINT)  # the worker's one interrupt
                wait_until(lambda: main_thread_in("_wait_for_jobs") or worker._done.is_set())
            finally:
                release.set()  # the handler returns, once the drain waits for it (or the worker gave it up)

        threading.Thread(target=interrupt, daemon=True).start()
        raised: List[BaseException] = []
        try:
            raise KeyboardInterrupt  # the caller's own
        except KeyboardInterrupt as caller:
            try:
                worker.start(1, poll_interval=0.05, on_error=self.errors.append, stop_grace=60)
            except KeyboardInterrupt as err:
                raised.append(err)
            self.assertEqual(len(raised), 1, "start() did not raise the worker's interrupt")
            self.assertIsNot(raised[0], caller)
        self.assert_drained_on_the_first(worker, server)

    def test_a_start_stopped_while_registering_in_its_callers_interrupt_handler_loses_nothing(self) -> None:
        # start() called in the caller's `except KeyboardInterrupt:` block
        # handling a second Ctrl-C (its interrupt has another as its
        # context), stopped (its stop_event) while it waits for the server
        # to register it: it returns having run nothing, and its drain does
        # not take the caller's interrupt for a second of the worker's
        # (start()'s before). Taken as one, the stop was given up and stop()
        # answered that the worker lost jobs it never had.
        server = FakeServer(lambda method, path, body: (503, error("unavailable"), {}))
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        self.addCleanup(client.close)
        client.register_tool("t", "1", lambda input, context: None)
        worker = client.worker
        stop = threading.Event()
        stop.set()  # heard while start() waits for the server
        try:
            try:
                raise KeyboardInterrupt  # the caller's first Ctrl-C
            except KeyboardInterrupt:
                raise KeyboardInterrupt  # and its second, handled below
        except KeyboardInterrupt:
            worker.start(1, poll_interval=0.05, on_error=self.errors.append, stop_event=stop)
        self.assertIsNone(worker.worker_id, "the worker registered")
        self.assertTrue(worker._done.is_set(), "the worker never ended")
        self.assertFalse(worker._abandoned, "the caller's interrupt was taken for the worker's second")
        self.assertTrue(worker.stop(0), "a worker that ran nothing answered that it lost jobs")

def start_blocking(worker) -> Tuple[List[BaseException], threading.Event]:
    """Starts worker blocking (an hour's poll interval, failures dropped)
    on a thread of its own; what start() raised, and set once it returned."""
    raised: List[BaseException] = []
    returned = threading.Event()

    def run() -> None:
        try:
            worker.start(1, poll_interval=3600, on_error=lambda err: None)
        except BaseException as err:  # noqa: BLE001 - the test reads it
            raised.append(err)
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    return raised, returned


def job_1_sent_again(order: List[str]) -> None:
    """Waits until the server has failed job_1's report twice: the worker
    sends it again only once it read the first failure, so its report has
    begun failing as the worker sees it (a fixed sleep flipped the order on
    a loaded machine)."""
    wait_until(lambda: order.count("job_1 failed") >= 2, timeout=15)


def main_thread_in(name: str) -> bool:
    """Whether the main thread is running a function named name (anywhere
    in its stack)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    return frame is not None


def wait_until(probe, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError("never happened")
        time.sleep(0.02)


if __name__ == "__main__":
    unittest.main()


# Every method that calls the API, with arguments it sends as they are:
# each takes a keyword-only timeout, as every Go method takes a context.
EVERY_CALL = {
    "start_run": ("r",),
    "enqueue": ({},),
    "finish_run": ("run_1",),
    "get_run": ("run_1",),
    "list_runs": (),
    "list_run_steps": ("run_1",),
    "get_step": ("s",),
    "list_step_attempts": ("s",),
    "list_step_replays": ("s",),
    "cancel_step": ("s",),
    "replay_preview": ("s",),
    "replay": ("s",),
    "begin": ("t", "k"),
    "report_effect": ("e", "tok", "succeeded"),
    "heartbeat_effect": ("e", "tok"),
    "get_effect": ("e",),
    "resolve_effect": ("e", "failed"),
    "list_effects": (),
    "register_worker": ([("n", "1")],),
    "claim": ("wkr_1",),
    "heartbeat_job": ("j", "tok"),
    "report_job": ("j", "tok", "SUCCEEDED"),
    "report_jobs": ([{"job_id": "j", "lease_token": "tok", "status": "SUCCEEDED"}],),
    "list_effect_policies": (),
    "get_effect_policy": ("t",),
    "get_policy_structuring": ("t",),
    "update_effect_policy": ("t", {"mode": "deny"}),
    "list_approvals": (),
    "get_approval": ("a",),
    "approve": ("a",),
    "reject": ("a",),
    "list_circuits": (),
    "open_circuit": ("t",),
    "close_circuit": ("t",),
    "emergency_stop": (),
    "get_emergency_stop": (),
    "release_emergency_stop": (),
    "create_group": ("g",),
    "get_group": ("g",),
    "list_group_steps": ("g",),
    "commit_group": ("g",),
    "unwind_group": ("g",),
    "create_webhook": ("https://example.com/h", ["effect.succeeded"]),
    "list_webhooks": (),
    "get_webhook": ("w",),
    "delete_webhook": ("w",),
    "update_webhook": ("w",),
    "list_webhook_deliveries": ("w",),
    "retry_webhook_deliveries": ("w", ["d"]),
    "rotate_webhook_secret": ("w",),
    "create_key": ("k",),
    "list_keys": (),
    "current_key": (),
    "revoke_key": ("k",),
    "list_endpoints": (),
    "create_endpoint": ("ep",),
    "get_endpoint": ("ep",),
    "update_endpoint_policy": ("ep", 1),
    "pause_endpoint": ("ep",),
    "resume_endpoint": ("ep",),
    "close_endpoint_circuit": ("ep",),
    "list_endpoint_attempts": ("ep",),
    "publish_contract": ("n",),
    "list_contracts": ("n",),
    "test_tool": ("n", "1", {}),
    "reconcile": ("t", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
    "list_queue_health": (),
}
# The keyword arguments of those that take some.
CALL_KEYWORDS = {
    "enqueue": {"name": "n", "version": "1", "run_id": "run_1"},
    "update_webhook": {"disabled": True},
    "create_key": {"preset": "AGENT"},
    "update_endpoint_policy": {"maxConcurrent": 2},
    "publish_contract": {"handler_version": "1", "input_schema": {}},
}


class CallTimeoutTest(unittest.TestCase):
    """A per-call timeout on every method, bounding the whole call."""

    def hanging(self):
        """A server that answers nothing until the test ends (or a generous
        hang guard passes): only a call's own timeout can end a call to it
        (the client's is a minute)."""
        release = threading.Event()

        def respond(method, path, body):
            release.wait(10)  # hang guard: answered then, the call would return
            return 200, {}, {}
        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(release.set)  # before the server closes
        client = getratchet.Ratchet(server.url, "rk_test", timeout=60)
        self.addCleanup(client.close)
        return server, client

    def test_every_method_takes_one(self) -> None:
        calls = {name for name, member in vars(getratchet.Ratchet).items()
                 if callable(member) and not name.startswith("_")}
        # Not request (it takes one too, tested apart), do_effect and
        # do_effect_async (protocols with bounds of their own),
        # register_tool and close (no call).
        self.assertEqual(set(EVERY_CALL), calls - {"request", "do_effect", "do_effect_async", "register_tool",
                                                   "close"})
        server, client = self.hanging()

        def call(name: str, args: tuple) -> object:
            try:
                return getattr(client, name)(*args, timeout=0.5, **CALL_KEYWORDS.get(name, {}))
            except Exception as failure:  # noqa: BLE001 - checked below
                return failure

        # All at once (the client is thread-safe): one bound's wait, not 67.
        with concurrent.futures.ThreadPoolExecutor(len(EVERY_CALL)) as pool:
            outcomes = {name: pool.submit(call, name, args) for name, args in EVERY_CALL.items()}
        for name, outcome in outcomes.items():
            with self.subTest(name):
                self.assertIsInstance(outcome.result(), ConnectionLost)
        self.assertEqual(len(server.seen), len(EVERY_CALL))

    def test_a_bad_timeout_is_refused(self) -> None:
        client = getratchet.Ratchet("http://127.0.0.1:9", "rk_test")
        for bad in (0, -1, float("inf"), float("nan"), "1"):
            with self.subTest(bad), self.assertRaises(ValueError):
                client.get_step("s", timeout=bad)

    def test_it_bounds_the_waits_between_retries(self) -> None:
        # A 503 asking for 5 s: each attempt is quick, so only a bound on
        # the whole call stops the retry (per attempt, it waited 5 s and got
        # the 200).
        server = FakeServer([(503, {"error": {"code": "unavailable", "message": "m",
                                              "detail": {"retry_after_seconds": 5}}}, {}),
                             (200, {"id": "run_1"}, {})])
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", timeout=60)
        self.addCleanup(client.close)
        with self.assertRaises(RatchetError) as raised:
            client.get_run("run_1", timeout=1)
        self.assertEqual(raised.exception.status, 503)
        self.assertEqual(len(server.seen), 1)

    def test_a_retry_is_given_the_time_left(self) -> None:
        # The first attempt fails at once, the retry hangs: the call ends by
        # its own bound, not the client's minute.
        release = threading.Event()
        answers = [(500, {"error": {"code": "internal_error", "message": "m"}}, {})]

        def respond(method, path, body):
            if answers:
                return answers.pop(0)
            release.wait(10)  # hang guard
            return 200, {}, {}
        server = FakeServer(respond)
        self.addCleanup(server.close)
        self.addCleanup(release.set)
        client = getratchet.Ratchet(server.url, "rk_test", timeout=60)
        self.addCleanup(client.close)
        quick_backoff(self)  # the retry's wait, 25 to 50 ms, well inside the bound
        with self.assertRaises(ConnectionLost):
            client.get_step("s", timeout=2)
        self.assertEqual(len(server.seen), 2)

    def test_it_bounds_an_answer_trickled_a_byte_at_a_time(self) -> None:
        # Each read gets a byte well within any socket timeout, so only a
        # bound on the whole attempt ends it; at the hang guard the answer
        # completes, and the call would return.
        listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(listener.close)
        done = threading.Event()
        self.addCleanup(done.set)

        def trickle() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Pad: ")
                give_up = time.monotonic() + 10  # hang guard
                while not done.wait(0.05) and time.monotonic() < give_up:
                    try:
                        conn.sendall(b"a")
                    except OSError:
                        return  # the client cut it
                try:
                    conn.sendall(b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                except OSError:
                    pass
        threading.Thread(target=trickle, daemon=True).start()
        client = getratchet.Ratchet("http://127.0.0.1:%d" % listener.getsockname()[1], "rk_test", timeout=60,
                                    max_retries=0)
        self.addCleanup(client.close)
        with self.assertRaises(ConnectionLost) as raised:
            client.get_step("s", timeout=0.5)
        self.assertIn("timeout", str(raised.exception))


class ReportRetryingTest(unittest.TestCase):
    """A report whose delivery keeps failing for a reason that may pass is
    told to on_error every 30 s while it is retried (a ReportNotRecorded,
    what "retrying"), as the Go SDK's reporter tells OnError, naming its
    job and attempt and never its body; the worker's clock is moved on by
    the fake server, so no test waits 30 s."""

    SECRET_OUTPUT = {"card": "4242-4242-secret"}

    def setUp(self) -> None:
        quick_backoff(self)
        self.clock = _MovedClock(frozen=True)
        patcher = mock.patch("getratchet.worker.time", self.clock)
        patcher.start()
        self.addCleanup(patcher.stop)

    def failing_then_recorded(self, on_report):
        """A responder that answers the first four reports (or batches) 503,
        moving the worker's clock on 31 s before the second and 30 s before
        the fourth, and records the fifth; on_report(path) runs first."""
        state = {"reports": 0}

        def answer(path: str):
            on_report(path)
            state["reports"] += 1
            n = state["reports"]
            if n in (2, 4):
                self.clock.offset += 31 if n == 2 else 30
            if n <= 4:
                return 503, error("unavailable"), {}
            if path == "/api/v1/jobs/report":
                return 200, {"results": [{"jobId": "job_1", "status": "SUCCEEDED"},
                                         {"jobId": "job_2", "status": "SUCCEEDED"}]}, {}
            return 200, {"jobId": path.split("/")[-2], "status": "SUCCEEDED", "attempt": 1}, {}
        return answer

    def assert_told(self, told: List[BaseException], job_id: str, attempt: int, more: int) -> None:
        retrying = [e for e in told if isinstance(e, getratchet.ReportNotRecorded) and e.what == "retrying"]
        # Failures 1 to 4: the first starts the count, the second is 31 s
        # on (told), the third 0 s after it (not), the fourth 30 s (told).
        self.assertEqual(len(retrying), 2, told)
        for notice, seconds in zip(retrying, ("31s", "61s")):
            self.assertEqual((notice.job_id, notice.attempt), (job_id, attempt))
            self.assertIsInstance(notice.__cause__, RatchetError)
            self.assertEqual(notice.__cause__.status, 503)
            self.assertIn(f"(and {more} more in its batch) not recorded for {seconds}", str(notice))
            self.assertIn("still retrying", str(notice))
            for secret in ("4242", "tok_", "rk_test"):
                self.assertNotIn(secret, str(notice))
                self.assertNotIn(secret, repr(notice.__cause__))

    def test_a_failing_report_is_told_every_30s_while_retried(self) -> None:
        told: List[BaseException] = []
        respond = self.failing_then_recorded(lambda path: None)
        server = FakeServer(lambda method, path, body: respond(path))
        self.addCleanup(server.close)
        transport = Transport(server.url, "rk_test", timeout=5)
        self.addCleanup(transport.close_idle)
        reporter = getratchet.worker._Reporter(transport, told.append)
        reporter.deliver("job_1", {"leaseToken": "tok_1", "status": "SUCCEEDED", "output": self.SECRET_OUTPUT},
                         may_wait=lambda wait: True, on_retry=lambda: None, attempt=2)
        self.assert_told(told, "job_1", 2, 0)

    def deliver_behind_one_in_flight(self, then, attempt: int):
        """Delivers job_0's report, holding the one delivery in flight until
        job_1's and job_2's are queued behind it, so that they go as one
        batch; then (path) answers every request after job_0's. Answers what
        was told, the server and the jobs whose deliver returned."""
        told: List[BaseException] = []
        first_sent = threading.Event()
        second_queued = threading.Event()
        patcher = mock.patch("getratchet.worker._REPORTS_IN_FLIGHT", 1)
        patcher.start()
        self.addCleanup(patcher.stop)
        state = {"n": 0}

        def answer(method, path, body):
            state["n"] += 1
            if state["n"] == 1:
                first_sent.set()
                second_queued.wait(10)
                return 200, {"jobId": "job_0", "status": "SUCCEEDED", "attempt": 1}, {}
            return then(path)

        server = FakeServer(answer)
        self.addCleanup(server.close)
        transport = Transport(server.url, "rk_test", timeout=5)
        self.addCleanup(transport.close_idle)
        reporter = getratchet.worker._Reporter(transport, told.append)
        results: List[object] = []

        def deliver(job_id: str) -> None:
            reporter.deliver(job_id, {"leaseToken": f"tok_{job_id}", "status": "SUCCEEDED",
                                      "output": self.SECRET_OUTPUT},
                             may_wait=lambda wait: True, on_retry=lambda: None, attempt=attempt)
            results.append(job_id)

        threads = [threading.Thread(target=deliver, args=("job_0",))]
        threads[0].start()
        first_sent.wait(10)
        for job_id in ("job_1", "job_2"):
            threads.append(threading.Thread(target=deliver, args=(job_id,)))
            threads[-1].start()
        wait_until(lambda: len(reporter._queue) == 2)
        second_queued.set()
        for thread in threads:
            thread.join(10)
        return told, server, results

    def test_a_failing_batch_is_told_once_for_its_reports(self) -> None:
        told, server, results = self.deliver_behind_one_in_flight(
            self.failing_then_recorded(lambda path: None), attempt=3)
        self.assertEqual(sorted(results), ["job_0", "job_1", "job_2"])
        self.assertEqual(server.seen[1][1], "/api/v1/jobs/report")
        self.assert_told(told, "job_1", 3, 1)

    def test_a_report_sent_alone_after_its_batch_is_told_as_well(self) -> None:
        # The server refuses the batch whole (400): each report goes alone
        # on the single-report route, with its own retries and notices.
        respond = self.failing_then_recorded(lambda path: None)

        def then(path):
            if path == "/api/v1/jobs/report":
                return 400, error("invalid_request"), {}
            if "job_2" in path:
                return 200, {"jobId": "job_2", "status": "SUCCEEDED", "attempt": 1}, {}
            return respond(path)

        told, server, _ = self.deliver_behind_one_in_flight(then, attempt=4)
        self.assertEqual(server.seen[1][1], "/api/v1/jobs/report")
        self.assert_told(told, "job_1", 4, 0)

    def test_the_worker_tells_on_error(self) -> None:
        told: List[BaseException] = []
        respond = self.failing_then_recorded(lambda path: None)
        claims = {"n": 0}

        def answer(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                claims["n"] += 1
                return 200, {"jobs": [WorkerRulesTest.job(1)] if claims["n"] == 1 else []}, {}
            return respond(path)

        server = FakeServer(answer)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: self.SECRET_OUTPUT)
        client.worker.start(1, poll_interval=0.05, block=False, on_error=told.append, stop_grace=1.0)
        wait_until(lambda: sum(1 for s in server.seen if s[1].endswith("/report")) >= 5)
        self.assertTrue(client.worker.stop(5))
        self.assert_told(told, "job_1", 1, 0)
        self.assertEqual([e for e in told if not (isinstance(e, getratchet.ReportNotRecorded)
                                                   and e.what == "retrying")], [])

    def test_the_default_log_names_a_report_still_retried_by_its_failure(self) -> None:
        # As the Go SDK logs its notice, which wraps the delivery's failure:
        # a failed call to the server, owed a recovery line.
        from getratchet._failurelog import summary
        cause = RatchetError(503, "unavailable", "down", request_id="req_1")
        notice = getratchet.ReportNotRecorded("still retrying", job_id="job_1", attempt=1, what="retrying",
                                              cause=cause)
        self.assertEqual(summary(notice), summary(cause))
        self.assertEqual(summary(notice), ("error=api status=503 code=unavailable request_id=req_1", True))


class ReportQueuedSlotTest(unittest.TestCase):
    """A job's slot is freed once its report is queued, as the Go worker
    frees it: the reporter delivers it meanwhile. Only while fewer than
    _REPORT_BATCH_MAX reports wait before it in the queue (the Go reporter's
    queue holds as many): beyond that the slot is kept, so that a slow
    server slows claiming instead of piling up reports."""

    def serve(self, jobs: int):
        """A worker of one slot whose claims lease job_1, job_2... up to
        jobs, one a claim, against a server that holds every report until
        release is set; and what it saw."""
        state = {"claims": 0, "ran": []}
        release = threading.Event()
        self.addCleanup(release.set)  # before the server's close: its handlers wait on it

        def respond(method, path, body):
            if path.endswith("/register"):
                return 200, {"workerId": "wkr_1"}, {}
            if path.endswith("/claim"):
                state["claims"] += 1
                n = state["claims"]
                return 200, {"jobs": [WorkerRulesTest.job(n)] if n <= jobs else []}, {}
            release.wait(30)
            if path == "/api/v1/jobs/report":
                return 200, {"results": [{"jobId": r["jobId"], "status": "SUCCEEDED"} for r in body["reports"]]}, {}
            return 200, {"jobId": path.split("/")[-2], "status": "SUCCEEDED", "attempt": 1}, {}

        server = FakeServer(respond)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test")
        client.register_tool("t", "1", lambda input, context: state["ran"].append(context.job_id))
        return client, server, state, release

    def queued(self, client: getratchet.Ratchet) -> int:
        reporter = client.worker._reporter
        with reporter._cond:
            return len(reporter._queue)

    def test_a_slot_is_freed_once_its_report_is_queued(self) -> None:
        client, server, state, release = self.serve(2)
        client.worker.start(1, poll_interval=0.05, block=False)
        self.addCleanup(client.worker.stop, 5)
        # job_1's report is held by the server; the worker of one slot runs
        # job_2 meanwhile (it waited for job_1's report to be recorded).
        wait_until(lambda: state["ran"] == ["job_1", "job_2"])
        self.assertFalse(release.is_set())
        release.set()
        self.assertTrue(client.worker.stop(5))
        reported = sorted(s[1] for s in server.seen if s[1].endswith("/report"))
        self.assertEqual(reported, ["/api/v1/jobs/job_1/report", "/api/v1/jobs/job_2/report"])

    def test_a_report_that_moves_up_frees_its_slot_while_the_delivery_before_it_is_held(self) -> None:
        # Review: a report whose own thread took the batch ahead of it into
        # a delivery freed its slot only once that delivery ended: moved up
        # into room, its slot stayed held for the whole delivery before it.
        for name, value in (("_REPORTS_IN_FLIGHT", 1), ("_REPORT_BATCH_MAX", 1)):
            patcher = mock.patch.object(getratchet.worker, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)
        first_held, release_first = threading.Event(), threading.Event()
        second_held, release_second = threading.Event(), threading.Event()
        self.addCleanup(release_first.set)
        self.addCleanup(release_second.set)

        def answer(method, path, body):
            job_id = path.split("/")[-2]
            if job_id == "job_0":
                first_held.set()
                release_first.wait(30)
            if job_id == "job_1":
                second_held.set()
                release_second.wait(30)
            return 200, {"jobId": job_id, "status": "SUCCEEDED", "attempt": 1}, {}

        server = FakeServer(answer)
        self.addCleanup(server.close)
        transport = Transport(server.url, "rk_test", timeout=5)
        self.addCleanup(transport.close_idle)
        reporter = getratchet.worker._Reporter(transport, lambda e: None)
        queued = {job_id: threading.Event() for job_id in ("job_0", "job_1", "job_2")}
        # job_1's thread stays in its on_queued (the worker's slot release)
        # until the end, so that job_2's thread is the one to take job_1's
        # report into a delivery.
        job_1_back = threading.Event()
        self.addCleanup(job_1_back.set)

        def on_queued(job_id: str) -> None:
            queued[job_id].set()
            if job_id == "job_1":
                job_1_back.wait(30)

        def deliver(job_id: str) -> None:
            reporter.deliver(job_id, {"leaseToken": f"tok_{job_id}", "status": "SUCCEEDED"},
                             may_wait=lambda wait: True, on_retry=lambda: None,
                             on_queued=lambda: on_queued(job_id))

        threads = [threading.Thread(target=deliver, args=(job_id,)) for job_id in ("job_0", "job_1", "job_2")]
        threads[0].start()
        self.assertTrue(first_held.wait(10))
        threads[1].start()
        self.assertTrue(queued["job_1"].wait(10), "job_1's report waits first in the queue: queued")
        threads[2].start()
        wait_until(lambda: len(reporter._queue) == 2)
        self.assertFalse(queued["job_2"].is_set(), "job_2's waits behind a full queue")
        release_first.set()
        # job_2's thread took job_1's report into a delivery, held now:
        # job_2's report, first in the queue, is in room, and its slot is
        # freed before that delivery ends.
        self.assertTrue(second_held.wait(10))
        self.assertTrue(queued["job_2"].wait(10), "job_2's report moved up but kept its slot")
        self.assertFalse(release_second.is_set())
        release_second.set()
        job_1_back.set()
        for thread in threads:
            thread.join(10)
        self.assertEqual(sorted(s[1] for s in server.seen),
                         [f"/api/v1/jobs/job_{n}/report" for n in range(3)])

    def test_a_report_that_waits_behind_a_full_queue_keeps_its_slot(self) -> None:
        # One delivery in flight, and a queue of one: job_1's report is held
        # in flight, job_2's waits first in the queue (its slot freed),
        # job_3's waits behind it and keeps its slot, so the worker claims
        # no job_4 until the server answers.
        for name, value in (("_REPORTS_IN_FLIGHT", 1), ("_REPORT_BATCH_MAX", 1)):
            patcher = mock.patch.object(getratchet.worker, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)
        client, server, state, release = self.serve(4)
        client.worker.start(1, poll_interval=0.05, block=False)
        self.addCleanup(client.worker.stop, 5)
        wait_until(lambda: self.queued(client) == 2)
        with client.worker._lock:
            self.assertEqual(client.worker._running, 1)
        self.assertEqual(state["ran"], ["job_1", "job_2", "job_3"])
        self.assertEqual(state["claims"], 3)
        release.set()
        wait_until(lambda: state["ran"] == ["job_1", "job_2", "job_3", "job_4"])
        self.assertTrue(client.worker.stop(5))


class EffectLeaseMarginTest(unittest.TestCase):
    """do_effect tells the action its lease is lost, while heartbeats fail,
    at most a quarter of the lease as granted before its end (a second for
    leases of 4 s and more), as the Go SDK's effectLeaseMargin: a 2 s lease
    was given up a second early, half of it. The heartbeats' clock is
    frozen and moved on by each of their waits."""

    def lost_at(self, lease: float) -> Tuple[float, List[float]]:
        """When (seconds after the grant) the action is told, a lease of
        lease seconds granted and every heartbeat answered 503; and the
        waits between heartbeats."""
        clock = _MovedClock(frozen=True)
        patcher = mock.patch("getratchet.client.time", clock)
        patcher.start()
        self.addCleanup(patcher.stop)
        server = FakeServer(lambda method, path, body: (503, error("unavailable"), {}))
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=0)
        self.addCleanup(client.close)
        waits: List[float] = []

        class Stop:
            def wait(self, seconds: float) -> bool:
                waits.append(seconds)
                clock.offset += seconds
                return len(waits) > 20  # hang guard

        lost = threading.Event()
        start = clock.monotonic()
        client._heartbeat_effect("eff_1", "tok", {"end": start + lease}, Stop(), lost)  # type: ignore[arg-type]
        self.assertTrue(lost.is_set())
        self.assertTrue(any(s[1] == "/api/v1/effects/eff_1/heartbeat" for s in server.seen))
        return clock.monotonic() - start, waits

    def test_a_short_lease_is_given_up_a_quarter_of_it_before_its_end(self) -> None:
        at, waits = self.lost_at(2.0)
        self.assertAlmostEqual(at, 1.5)  # Go: 2 s less min(1 s, 2 s / 4)
        self.assertAlmostEqual(waits[0], 1.0)

    def test_a_longer_lease_is_given_up_a_second_before_its_end(self) -> None:
        at, _ = self.lost_at(6.0)
        self.assertAlmostEqual(at, 5.0)

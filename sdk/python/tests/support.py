"""Helpers for the tests that run the SDK against a real Ratchet server.

RATCHET_TEST_BASE_URL names the server (lib/sdktest's TestPythonSDK starts
one over a real PostgreSQL and runs these tests against it). Each test
signs up a workspace of its own, so tests never see each other's jobs.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import unittest
import urllib.request
import uuid
from typing import Any, Callable, List

import getratchet

BASE_URL = os.environ.get("RATCHET_TEST_BASE_URL", "")

# A worker started without on_error logs its default failure log to
# "getratchet.worker", which with no handler anywhere went to stderr, into
# the tests' output: a handler that drops them keeps it quiet.
logging.getLogger("getratchet.worker").addHandler(logging.NullHandler())


def require_server(test: unittest.TestCase) -> None:
    if not BASE_URL:
        test.skipTest("RATCHET_TEST_BASE_URL is not set: run `go test ./lib/sdktest -run TestPythonSDK`")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


class Workspace:
    """A workspace of its own with its operator key."""

    def __init__(self) -> None:
        request = urllib.request.Request(BASE_URL + "/api/v1/workspaces", method="POST",
                                         data=json.dumps({"name": unique("py")}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            self.operator_key = json.loads(response.read())["key"]["secret"]
        self.operator = getratchet.Ratchet(BASE_URL, self.operator_key)

    def key(self, preset: str, tools: Any = None) -> str:
        body = {"name": unique(preset.lower()), "preset": preset, "tools": tools}
        return self.operator.request("POST", "/keys", body)["secret"]

    def client(self, preset: str, tools: Any = None) -> getratchet.Ratchet:
        return getratchet.Ratchet(BASE_URL, self.key(preset, tools))

    def fast_endpoint(self, name: str, max_attempts: int = 3) -> None:
        """An endpoint whose CUSTOM schedule brings a retry due in a second."""
        self.operator.request("POST", "/endpoints", {
            "name": name, "preset": "CUSTOM", "maxAttempts": max_attempts, "initialDelayMs": 1000,
            "multiplier": 1, "maxDelayMs": 1000, "jitterPercent": 0})


class Errors:
    """Collects a worker's on_error calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: List[BaseException] = []

    def __call__(self, error: BaseException) -> None:
        with self.lock:
            self.items.append(error)

    def of(self, kind: type) -> List[BaseException]:
        with self.lock:
            return [e for e in self.items if isinstance(e, kind)]


def start_worker(test: unittest.TestCase, client: getratchet.Ratchet, concurrency: int = 1) -> Errors:
    """Starts client's worker in the background with a short poll interval
    (tests must not wait 30 s for a claim) and stops it when the test ends."""
    errors = Errors()
    client.worker.start(concurrency, poll_interval=0.1, on_error=errors, block=False)
    test.addCleanup(client.worker.stop, 10.0)
    return errors


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Calls probe until it answers something true, failing after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what} never happened; last: {last!r}")


def wait_run_ended(client: getratchet.Ratchet, run_id: str) -> dict:
    def ended() -> Any:
        run = client.get_run(run_id)
        return run if run["status"] != "RUNNING" else None
    return wait_for(f"run {run_id} ending", ended)


def step_of(run: dict, step_id: str) -> dict:
    for step in run["steps"]:
        if step["id"] == step_id:
            return step
    raise AssertionError(f"run {run['id']} has no step {step_id}")

"""Runs the Python SDK's worker against RATCHET_RECORDER_URL (workerRecorder
in worker_requests_test.go), which compares what it sent with the OpenAPI
document: j1 waits for its heartbeat, j2 fails, j3 succeeds; j2's and j3's
reports queue behind j1's held one and go as one batch."""

import importlib
import json
import os
import threading
import time
import urllib.request

from getratchet import Ratchet

worker_module = importlib.import_module("getratchet.worker")
worker_module._REPORTS_IN_FLIGHT = 1  # j2's and j3's reports wait for j1's, then go together

base = os.environ["RATCHET_RECORDER_URL"]


def until(done):
    while not done(json.load(urllib.request.urlopen(base + "/__state"))):
        time.sleep(0.02)


def handler(job_input, context):
    if job_input["job"] == "j1":
        until(lambda s: s["heartbeats"] >= 1)
        return {"ok": True}
    until(lambda s: s["held"] >= 1)  # j1's report is sent, and held
    if job_input["job"] == "j2":
        raise ValueError("fails")
    return {"ok": True}


r = Ratchet(base, "rk_test")
r.register_tool("t", "1", handler)


def drive():
    reporter = r.worker._reporter
    while len(reporter._queue) < 2:  # j2's and j3's reports queued behind j1's
        time.sleep(0.02)
    urllib.request.urlopen(urllib.request.Request(base + "/__release", method="POST"))
    until(lambda s: s["reported"] >= 3)
    r.worker.stop(10)


threading.Thread(target=drive, daemon=True).start()
r.worker.start(concurrency=3, poll_interval=0.05)

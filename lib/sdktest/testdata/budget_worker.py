"""Runs the Python SDK's worker against BUDGET_BASE_URL (budgetProxy in
batch_budget_test.go), which holds report requests until released: the
first job's report is held (one delivery in flight), and the two others,
costly successes, queue behind it and go as one batch once released, which
the service refuses whole; the worker must send them report by report."""

import importlib
import json
import os
import threading
import time
import urllib.request

from getratchet import Ratchet

worker_module = importlib.import_module("getratchet.worker")
worker_module._REPORTS_IN_FLIGHT = 1  # the costly reports wait for the first, then go together

base = os.environ["BUDGET_BASE_URL"]
jobs = int(os.environ["BUDGET_JOBS"])
items = int(os.environ["BUDGET_ITEMS"])


def state():
    return json.load(urllib.request.urlopen(base + "/__state"))


def until(done):
    while not done(state()):
        time.sleep(0.02)


calls = 0
lock = threading.Lock()


def handler(job_input, context):
    global calls
    with lock:
        calls += 1
        k = calls
    if k == 1:
        return []
    until(lambda s: s["held"] >= 1)  # the first report is sent, and held
    return [0] * items


r = Ratchet(base, os.environ["BUDGET_KEY"])
r.register_tool(os.environ["BUDGET_TOOL"], "1", handler)


def drive():
    reporter = r.worker._reporter
    while len(reporter._queue) < jobs - 1:  # the costly reports queued behind the first
        time.sleep(0.02)
    urllib.request.urlopen(urllib.request.Request(base + "/__release", method="POST"))
    until(lambda s: s["recorded"] >= jobs)
    r.worker.stop(10)


threading.Thread(target=drive, daemon=True).start()
r.worker.start(concurrency=jobs, poll_interval=0.05, on_error=lambda err: print("on_error:", type(err).__name__, err))

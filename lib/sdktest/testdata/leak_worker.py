"""The Python SDK's worker with its default log, for
TestTheSDKWorkersLogNothingUserControlled: every handler's input carries a
mark, and each fails a way the worker logs (its report refused by the test's
proxy, a classifier that raises with the mark, an output that is not JSON,
its exception naming the mark); then a worker whose key is refused at its
start, and one whose claims the test's other proxy refuses."""

import logging
import os
import sys
import threading

logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")

from getratchet import Ratchet, _failurelog  # noqa: E402

_failurelog.LOG_EVERY = 0.0  # every problem its line, not one a minute

base, key, bad, tool, revoking = (os.environ[k] for k in ("LEAK_BASE_URL", "LEAK_KEY", "LEAK_BAD_KEY", "LEAK_TOOL",
                                                          "LEAK_REVOKING_BASE_URL"))
lock, ran, done = threading.Lock(), [0], threading.Event()


def handler(job_input, context):
    try:
        kind, value = job_input["kind"], job_input["to"]
        if kind == "raise":
            raise ValueError(value)
        if kind == "classify":
            raise KeyError(value)
        return {"out": type(value, (), {})()}  # not JSON: its TypeError names the class, the mark
    finally:
        with lock:
            ran[0] += 1
            if ran[0] == 3:
                done.set()


def classify(error, context):
    if isinstance(error, KeyError):
        raise RuntimeError("classifier: " + str(error))
    return {"retryable": False}


worker = Ratchet(base, key)
worker.register_tool(tool, "1", handler, classify_error=classify)
threading.Thread(target=lambda: (done.wait(60), worker.worker.stop(10)), daemon=True).start()
try:
    worker.worker.start(concurrency=3, poll_interval=0.1)
except Exception as e:  # its text is the test's to check, not to print
    print("stopped:", type(e).__name__)
print("handlers ran:", ran[0])

# A key refused at the start, then one refused while the worker runs.
for url, k in ((base, bad), (revoking, key)):
    refused = Ratchet(url, k)
    refused.register_tool(tool, "1", handler)
    try:
        refused.worker.start(poll_interval=0.1)
    except Exception as e:  # its text is the test's to check, not to print
        print("refused:", type(e).__name__)

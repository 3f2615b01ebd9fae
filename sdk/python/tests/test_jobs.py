"""The producer and the worker runtime against a real server."""

from __future__ import annotations

import threading
import time
import unittest

import getratchet
from getratchet import InvalidDecisionError, NonRetryableError, RetryableError
from support import Errors, Workspace, require_server, start_worker, step_of, unique, wait_for, wait_run_ended


class JobsTest(unittest.TestCase):
    def setUp(self) -> None:
        require_server(self)
        self.ws = Workspace()
        self.producer = self.ws.client("INGEST")

    def worker(self, tool: str, version: str = "1") -> getratchet.Ratchet:
        return self.ws.client("WORKER", [f"{tool}@{version}"])

    def attempts(self, step_id: str) -> list:
        return self.ws.operator.get_step(step_id)["durableJob"]["attempts"]

    def serve_one(self, prefix: str, handler, classify_error=None, **options) -> dict:
        """Serves handler as a new tool on a worker of its own, then starts
        a run and enqueues one step of it with options; returns the step."""
        tool = unique(prefix)
        worker = self.worker(tool)
        worker.register_tool(tool, "1", handler, classify_error=classify_error)
        self.errors = start_worker(self, worker)
        self.producer.start_run(prefix)
        return self.producer.enqueue({}, name=tool, version="1", **options)

    def job_when(self, step_id: str, status: str) -> dict:
        """The step's durable job once it reaches status."""
        def probe():
            job = self.ws.operator.get_step(step_id)["durableJob"]
            return job if job["status"] == status else None
        return wait_for(f"step {step_id} {status}", probe)

    def test_seed_onboarding_run_succeeds_and_enqueue_deduplicates(self) -> None:
        tool = unique("send_welcome_email")
        seen = []
        worker = self.worker(tool)

        def send_welcome(input, context):
            seen.append((input, context.idempotency_key, context.attempt, context.max_attempts))
            return {"messageId": "msg_" + input["customerId"]}

        worker.register_tool(tool, "1", send_welcome)
        start_worker(self, worker, concurrency=4)
        run = self.producer.start_run("Customer onboarding")
        self.assertEqual(run["status"], "RUNNING")
        step = self.producer.enqueue({"customerId": "cus_2048"}, name=tool, version="1", endpoint="Email service",
                                     idempotency_key="welcome:cus_2048", timeout_ms=30_000, max_attempts=5)
        self.assertFalse(step["deduplicated"])
        again = self.producer.enqueue({"customerId": "cus_2048"}, name=tool, version="1", endpoint="Email service",
                                      idempotency_key="welcome:cus_2048", timeout_ms=30_000, max_attempts=5)
        self.assertTrue(again["deduplicated"])
        self.assertEqual(again["stepId"], step["stepId"])
        self.producer.finish_run()
        done = wait_run_ended(self.producer, run["id"])
        self.assertEqual(done["status"], "SUCCEEDED")
        self.assertEqual(seen, [({"customerId": "cus_2048"}, "welcome:cus_2048", 1, 5)])
        job = step_of(done, step["stepId"])["durableJob"]
        self.assertEqual((job["status"], job["attempt"], job["maxAttempts"]), ("SUCCEEDED", 1, 5))
        # The run and its steps page through the lists too.
        runs = self.producer.list_runs(status="SUCCEEDED")
        self.assertEqual(([r["id"] for r in runs["data"]], runs["nextCursor"]), ([run["id"]], None))
        self.assertNotIn("steps", runs["data"][0])
        steps = self.producer.list_run_steps(run["id"], limit=1)
        self.assertEqual([s["id"] for s in steps["data"]], [step["stepId"]])
        self.assertIsNone(steps["nextCursor"])

    def test_low_level_worker_calls_run_jobs_by_hand(self) -> None:
        # register_worker, claim, heartbeat_job, report_job and report_jobs,
        # as the Go SDK's RegisterWorker... (parity QA), against the server.
        tool = unique("by_hand")
        worker = self.worker(tool)
        boot = unique("boot")
        worker_id = worker.register_worker([(tool, "1")], idempotency_key=boot)
        self.assertEqual(worker.register_worker([{"name": tool, "version": "1"}], idempotency_key=boot), worker_id)
        run = self.producer.start_run("by hand")
        steps = {self.producer.enqueue({"n": n}, name=tool, version="1")["stepId"] for n in (1, 2)}
        jobs: list = []

        def claimed():
            jobs.extend(worker.claim(worker_id, limit=2, wait_seconds=1))
            return len(jobs) == 2
        wait_for("two claimed jobs", claimed)
        self.assertEqual({j["stepId"] for j in jobs}, steps)
        first, second = jobs
        beat = worker.heartbeat_job(first["jobId"], first["leaseToken"])
        self.assertFalse(beat["cancelRequested"])
        self.assertTrue(beat["leaseExpiresAt"])
        done = worker.report_job(first["jobId"], first["leaseToken"], "SUCCEEDED", output={"n": first["input"]["n"]})
        self.assertEqual((done["jobId"], done["status"]), (first["jobId"], "SUCCEEDED"))
        results = worker.report_jobs([
            {"job_id": second["jobId"], "lease_token": second["leaseToken"], "status": "SUCCEEDED", "output": {}},
            {"job_id": first["jobId"], "lease_token": second["leaseToken"], "status": "SUCCEEDED"}])
        self.assertEqual((results[0]["status"], results[0]["error"]), ("SUCCEEDED", None))
        self.assertIsInstance(results[1]["error"], getratchet.RatchetError)
        self.assertEqual(results[1]["error"].status, 409)
        self.producer.finish_run()
        self.assertEqual(wait_run_ended(self.producer, run["id"])["status"], "SUCCEEDED")

    def test_generated_keys_deduplicate_the_same_operation(self) -> None:
        tool = unique("tool")
        run = self.producer.start_run("keys")
        first = self.producer.enqueue({"b": 1, "a": [1, 2]}, name=tool, version="1")
        same = self.producer.enqueue({"a": [1, 2], "b": 1}, name=tool, version="1")
        other = self.producer.enqueue({"a": [2, 1], "b": 1}, name=tool, version="1")
        self.assertTrue(same["deduplicated"])
        self.assertEqual(same["idempotencyKey"], first["idempotencyKey"])
        self.assertFalse(other["deduplicated"])
        self.assertEqual(self.producer.run_id, run["id"])

    def test_retryable_error_then_success(self) -> None:
        tool = unique("flaky")
        self.ws.fast_endpoint("fast")
        worker = self.worker(tool)

        def flaky(input, context):
            if context.attempt == 1:
                raise RetryableError("provider busy", retry_after_ms=1000)
            return {"ok": True}

        worker.register_tool(tool, "1", flaky)
        start_worker(self, worker)
        self.producer.start_run("retry")
        step = self.producer.enqueue({}, name=tool, version="1", endpoint="fast")
        self.producer.finish_run()
        done = wait_run_ended(self.producer, self.producer.run_id)
        self.assertEqual(done["status"], "SUCCEEDED")
        attempts = self.attempts(step["stepId"])
        self.assertEqual([a["outcome"] for a in attempts], ["FAILED", "SUCCEEDED"])
        self.assertEqual((attempts[0]["retryable"], attempts[0]["retryAfterMs"], attempts[0]["errorMessage"]),
                         (True, 1000, "provider busy"))

    def test_non_retryable_error_exhausts_and_fails_the_run(self) -> None:
        def strict(input, context):
            raise NonRetryableError("Invalid recipient bob@example.com")

        step = self.serve_one("strict", strict, max_attempts=5)
        self.producer.finish_run()
        done = wait_run_ended(self.producer, self.producer.run_id)
        self.assertEqual(done["status"], "FAILED")
        self.assertEqual(step_of(done, step["stepId"])["durableJob"]["status"], "EXHAUSTED")
        attempts = self.attempts(step["stepId"])
        self.assertEqual(len(attempts), 1)
        # Only a redacted message leaves the process.
        self.assertEqual((attempts[0]["retryable"], attempts[0]["errorMessage"]), (False, "Invalid recipient [email]"))

    def test_classifier_precedence_and_fallback(self) -> None:
        self.ws.fast_endpoint("fast")
        cases = {
            # The classifier decides an unknown error.
            "says_no": (lambda e, c: {"retryable": False}, ValueError("bad input"), 1, False),
            # An explicit SDK error is not given to the classifier.
            "explicit": (lambda e, c: {"retryable": False}, RetryableError("busy"), 3, True),
            # A classifier that raises falls back to retryable.
            "raises": (lambda e, c: 1 / 0, ValueError("x"), 3, True),
            # An invalid decision (a hint with retryable False) too.
            "invalid": (lambda e, c: {"retryable": False, "retry_after_ms": 5000}, ValueError("x"), 3, True),
        }
        keys = {case: unique(case) for case in cases}
        worker = self.ws.client("WORKER", [f"{tool}@1" for tool in keys.values()])
        for case, (classify, error, _, _) in cases.items():
            def handler(input, context, error=error):
                raise error
            worker.register_tool(keys[case], "1", handler, classify_error=classify)
        errors = start_worker(self, worker, concurrency=4)
        self.producer.start_run("classify")
        steps = {case: self.producer.enqueue({}, name=keys[case], version="1", endpoint="fast")["stepId"]
                 for case in cases}
        for case, (_, _, attempts, retryable) in cases.items():
            job = self.job_when(steps[case], "EXHAUSTED")
            self.assertEqual(len(job["attempts"]), attempts, case)
            self.assertEqual({a["retryable"] for a in job["attempts"]}, {retryable}, case)
        wait_for("on_error", lambda: errors.of(ZeroDivisionError) and errors.of(InvalidDecisionError))

    def test_classifier_hint_out_of_range_is_clamped_and_told(self) -> None:
        def handler(input, context):
            raise ValueError("rate limited")

        step = self.serve_one("hinted", handler,
                              classify_error=lambda e, c: {"retryable": True, "retry_after_ms": 3 * 86_400_000})
        job = self.job_when(step["stepId"], "RETRY_SCHEDULED")
        self.assertEqual(job["attempts"][0]["retryAfterMs"], 86_400_000)
        clamped = wait_for("on_error", lambda: self.errors.of(InvalidDecisionError))
        self.assertTrue(clamped[0].clamped)

    def test_timeout_cancels_the_handler(self) -> None:
        reasons = []

        def slow(input, context):
            context.cancelled.wait(30)
            reasons.append(context.cancel_reason)
            raise TimeoutError("gave up")

        step = self.serve_one("slow", slow, timeout_ms=1000, max_attempts=1)
        job = self.job_when(step["stepId"], "EXHAUSTED")
        self.assertEqual(reasons, ["timeout"])
        self.assertEqual(job["attempts"][0]["errorMessage"], "handler timed out after 1000ms")
        self.assertTrue(job["attempts"][0]["retryable"])

    def test_a_handler_that_ignores_its_timeout_is_reported_without_it(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)

        def stubborn(input, context):
            release.wait(30)
            return {"late": True}

        step = self.serve_one("stubborn", stubborn, timeout_ms=1000, max_attempts=1)
        job = self.job_when(step["stepId"], "EXHAUSTED")
        self.assertEqual(job["attempts"][0]["errorMessage"], "handler timed out after 1000ms")

    def test_cancel_step_reaches_the_handler(self) -> None:
        running = threading.Event()
        reasons = []
        classified = []

        def handler(input, context):
            running.set()
            context.cancelled.wait(30)
            reasons.append(context.cancel_reason)
            raise RuntimeError("stopped")

        def classify(error, context):
            classified.append(error)
            return {"retryable": True}

        # Seed 000: cancellation remains non-retryable and takes priority over
        # the classifier, which would have called this failure retryable.
        step = self.serve_one("cancellable", handler, classify_error=classify, timeout_ms=3000)
        self.assertTrue(running.wait(30))
        cancelled = self.producer.cancel_step(step["stepId"])
        self.assertEqual(cancelled["status"], "CANCELLED")
        job = wait_for("reported", lambda: (lambda j: j if j["attempts"][0]["outcome"] else None)(
            self.ws.operator.get_step(step["stepId"])["durableJob"]))
        self.assertEqual(reasons, ["cancelled"])
        self.assertEqual((job["status"], job["attempts"][0]["retryable"], job["attempts"][0]["errorMessage"]),
                         ("CANCELLED", False, "cancelled at the server's request"))
        self.assertEqual(classified, [], "a cancellation is not given to the classifier")

    def test_a_handler_that_succeeds_is_not_given_to_the_classifier(self) -> None:
        # Seed 000: "successful handlers do not run the classifier".
        classified = []

        def classify(error, context):
            classified.append(error)
            return {"retryable": False}

        step = self.serve_one("succeeds", lambda input, context: {"sent": True}, classify_error=classify)
        job = self.job_when(step["stepId"], "SUCCEEDED")
        self.assertEqual((len(job["attempts"]), job["attempts"][0]["outcome"]), (1, "SUCCEEDED"))
        self.assertEqual(classified, [])

    def test_graceful_stop_lets_running_handlers_report(self) -> None:
        tool = unique("graceful")
        worker = self.worker(tool)
        running = threading.Event()

        def handler(input, context):
            running.set()
            time.sleep(0.5)
            return {"done": True}

        worker.register_tool(tool, "1", handler)
        worker.worker.start(2, poll_interval=0.1, block=False)
        self.producer.start_run("graceful")
        step = self.producer.enqueue({}, name=tool, version="1")
        self.assertTrue(running.wait(30))
        self.assertTrue(worker.worker.stop(10.0))
        job = self.ws.operator.get_step(step["stepId"])["durableJob"]
        self.assertEqual((job["status"], job["attempts"][0]["outcome"]), ("SUCCEEDED", "SUCCEEDED"))

    def test_stop_leaves_a_handler_that_will_not_return_unreported(self) -> None:
        tool = unique("stuck")
        worker = self.worker(tool)
        running, release = threading.Event(), threading.Event()
        self.addCleanup(release.set)
        reasons = []

        def stuck(input, context):
            running.set()
            context.cancelled.wait(30)
            reasons.append(context.cancel_reason)
            release.wait(30)

        worker.register_tool(tool, "1", stuck)
        errors = Errors()
        # A short grace: the handler never returns, so the stop waits it out.
        worker.worker.start(1, poll_interval=0.1, block=False, on_error=errors, stop_grace=0.1)
        self.producer.start_run("stuck")
        step = self.producer.enqueue({}, name=tool, version="1", timeout_ms=60_000)
        self.assertTrue(running.wait(30))
        self.assertFalse(worker.worker.stop(0.2))
        self.assertEqual(reasons, ["stopping"])
        job = self.ws.operator.get_step(step["stepId"])["durableJob"]
        # Nothing reported: the lease lapses and another worker runs it again.
        self.assertEqual((job["status"], job["attempts"][0]["outcome"]), ("RUNNING", None))
        # on_error was told so, by the job's id, before stop() returned.
        self.assertEqual([(type(e).__name__, getattr(e, "job_id", None), getattr(e, "attempt", None))
                          for e in errors.items], [("ReportNotRecorded", job["id"], 1)])

    def test_output_refused_by_the_contract_ends_the_job_once(self) -> None:
        tool = unique("contracted")
        contract = self.ws.operator.request("POST", f"/tools/{tool}/contracts", {
            "handlerVersion": "1", "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "required": ["id"]}, "timeoutMs": 5000,
            "retryPreset": "STANDARD", "status": "ACTIVE"})
        worker = self.worker(tool)
        worker.register_tool(tool, "1", lambda input, context: {"no_id": True})
        errors = start_worker(self, worker)
        self.producer.start_run("contract")
        step = self.producer.enqueue({}, name=tool, version="1", contract_version=contract["contractVersion"])
        job = self.job_when(step["stepId"], "EXHAUSTED")
        # The server records the rejection itself: one attempt, reported.
        self.assertEqual(len(job["attempts"]), 1)
        self.assertEqual((job["attempts"][0]["outcome"], job["attempts"][0]["retryable"]), ("FAILED", False))
        self.assertIn("output", job["attempts"][0]["warning"])
        self.assertEqual(errors.of(getratchet.ReportNotRecorded), [])

    def test_output_the_server_can_never_record_is_reported_failed_once(self) -> None:
        nul, not_json = unique("nul"), unique("notjson")
        worker = self.ws.client("WORKER", [f"{nul}@1", f"{not_json}@1"])
        runs = []

        def with_nul(input, context):
            runs.append(nul)
            return {"id": "has\x00nul"}

        def with_set(input, context):
            runs.append(not_json)
            return {"ids": {1, 2}}

        worker.register_tool(nul, "1", with_nul)
        worker.register_tool(not_json, "1", with_set)
        errors = start_worker(self, worker, concurrency=2)
        self.producer.start_run("unrecordable")
        steps = {tool: self.producer.enqueue({}, name=tool, version="1", max_attempts=3)["stepId"]
                 for tool in (nul, not_json)}
        messages = {}
        for tool, step_id in steps.items():
            job = self.job_when(step_id, "EXHAUSTED")
            self.assertEqual(len(job["attempts"]), 1, tool)
            self.assertFalse(job["attempts"][0]["retryable"], tool)
            messages[tool] = job["attempts"][0]["errorMessage"]
        self.assertEqual(messages, {nul: "handler output refused by the server at output.id",
                                    not_json: "handler output is not JSON"})
        self.assertEqual(sorted(runs), sorted([nul, not_json]))
        self.assertEqual(len(errors.of(getratchet.ReportNotRecorded)), 1)
        self.assertEqual(len(errors.of(TypeError)), 1)

    def test_jobs_finishing_together_are_reported_in_batches(self) -> None:
        tool = unique("batch")
        worker = self.worker(tool)
        sent = []
        call = worker._transport.call

        def recording(method, path, *args, **kwargs):
            sent.append(path)
            return call(method, path, *args, **kwargs)

        worker._transport.call = recording  # type: ignore[method-assign]
        together = threading.Barrier(10)

        def handler(input, context):
            together.wait(30)
            return {"n": input["n"]}

        worker.register_tool(tool, "1", handler)
        errors = start_worker(self, worker, concurrency=10)
        self.producer.start_run("batched reports")
        steps = [self.producer.enqueue({"n": n}, name=tool, version="1")["stepId"] for n in range(10)]
        for step_id in steps:
            self.job_when(step_id, "SUCCEEDED")
        reports = [p for p in sent if p.endswith("/report")]
        self.assertIn("/jobs/report", reports)
        self.assertLess(len(reports), 10)
        self.assertEqual(errors.items, [])

    def test_dependency_and_replay_after_exhaustion(self) -> None:
        tool, fallback = unique("charge"), unique("notify")
        worker = self.ws.client("WORKER", [f"{tool}@1", f"{fallback}@1"])
        fail = {"on": True}

        def charge(input, context):
            if fail["on"]:
                raise NonRetryableError("card declined")
            return {"charged": True}

        worker.register_tool(tool, "1", charge)
        worker.register_tool(fallback, "1", lambda input, context: {"notified": True})
        self.producer.start_run("replay")
        first = self.producer.enqueue({"amount": 100}, name=tool, version="1")
        branch = self.producer.enqueue({}, name=fallback, version="1", after_step_id=first["stepId"],
                                       after_status=getratchet.AFTER_FAILED)
        # The worker starts only now: started earlier, it could fail the charge
        # before the branch is enqueued, and the branch would be born QUEUED.
        self.assertEqual(branch["status"], "WAITING")
        start_worker(self, worker, concurrency=2)
        wait_for("branch ran", lambda: self.ws.operator.get_step(branch["stepId"])["status"] == "SUCCEEDED")
        preview = self.ws.operator.replay_preview(first["stepId"])
        self.assertTrue(preview["eligible"])
        fail["on"] = False
        replayed = self.ws.operator.replay(first["stepId"], reason="card updated", max_attempts=1,
                                          expected_attempt=preview["attempt"])
        self.assertEqual(replayed["status"], "QUEUED")
        wait_for("replay ran", lambda: self.ws.operator.get_step(first["stepId"])["status"] == "SUCCEEDED")
        job = self.ws.operator.get_step(first["stepId"])["durableJob"]
        self.assertEqual((job["attemptsTruncated"], job["replaysTruncated"]), (False, False))
        # The pages of a step's attempts and replays (its read holds the last 50 of each).
        attempts = self.ws.operator.list_step_attempts(first["stepId"], limit=1)
        self.assertEqual([a["attempt"] for a in attempts["data"]], [1])
        rest = self.ws.operator.list_step_attempts(first["stepId"], cursor=attempts["nextCursor"])
        self.assertEqual(([a["attempt"] for a in rest["data"]], rest["nextCursor"]), ([2], None))
        replays = self.ws.operator.list_step_replays(first["stepId"])
        self.assertEqual(([r["reason"] for r in replays["data"]], replays["nextCursor"]), (["card updated"], None))
        with self.assertRaises(getratchet.RatchetError) as refused:
            self.ws.operator.replay(first["stepId"], reason="again")
        self.assertEqual(refused.exception.code, "invalid_state")

    def test_a_deeply_nested_input_runs_beside_the_other_job_of_its_claim(self) -> None:
        # The API takes a body nested 10 000 levels deep; json.loads raises
        # RecursionError near 1 000, so such an input made the whole claim
        # answer unreadable: both jobs lapsed unrun, and came back at every
        # claim. Its output, as deep, is written as json.dumps would.
        tool, levels = unique("deep"), 9990
        deep: dict = {"leaf": True}
        for _ in range(levels):
            deep = {"a": deep}
        self.producer.start_run("deep input")
        steps = [self.producer.enqueue(deep, name=tool, version="1"),
                 self.producer.enqueue({"a": {"leaf": True}}, name=tool, version="1")]
        self.producer.finish_run()
        seen = {}

        def measure(input, context):
            depth = 0
            while "a" in input:
                input, depth = input["a"], depth + 1
            seen[context.job_id] = depth
            output: dict = {"depth": depth}
            for _ in range(depth):
                output = {"a": output}
            return output

        worker = self.worker(tool)
        worker.register_tool(tool, "1", measure)
        errors = start_worker(self, worker, concurrency=2)  # both jobs in one claim
        done = wait_run_ended(self.producer, self.producer.run_id)
        self.assertEqual(done["status"], "SUCCEEDED", errors.items)
        self.assertEqual(sorted(seen.values()), [1, levels])
        for step in steps:
            job = step_of(done, step["stepId"])["durableJob"]
            self.assertEqual((job["status"], job["attempt"]), ("SUCCEEDED", 1))
        self.assertEqual(errors.items, [])

    def test_worker_key_must_list_the_tool(self) -> None:
        worker = self.ws.client("WORKER", ["other@1"])
        worker.register_tool("mine", "1", lambda input, context: None)
        with self.assertRaises(getratchet.RatchetError) as refused:
            worker.worker.start(1, block=False)
        self.assertEqual((refused.exception.status, refused.exception.code), (403, "forbidden"))


if __name__ == "__main__":
    unittest.main()

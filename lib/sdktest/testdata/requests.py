"""Calls every Ratchet method of the Python SDK that sends a request, each
option set, against RATCHET_RECORDER_URL, which answers {} to all:
requests_test.go compares what was sent with the OpenAPI document. An answer
of {} may not satisfy a method; only the request matters here."""

import datetime
import os

import getratchet

r = getratchet.Ratchet(os.environ["RATCHET_RECORDER_URL"], "rk_test", max_retries=0)
now = datetime.datetime.now(datetime.timezone.utc)
page = {"limit": 1, "cursor": "c"}
err = {"message": "m", "retryable": True, "retryAfterMs": 2000}  # passed as sent, as documented
calls = [
    lambda: r.start_run("run", idempotency_key="k", budget_micros=5),
    lambda: r.enqueue({"a": 1}, name="n", version="1", endpoint="e", idempotency_key="k", timeout_ms=1000,
                      max_attempts=2, contract_version=1, after_step_id="s", after_status="SUCCEEDED", delay_ms=1000,
                      run_id="r"),
    lambda: r.finish_run("r"),
    lambda: r.get_run("r"),
    lambda: r.list_runs(status="FAILED", **page),
    lambda: r.list_run_steps("r", status="EXHAUSTED", **page),
    lambda: r.get_step("s"),
    lambda: r.list_step_attempts("s", **page),
    lambda: r.list_step_replays("s", **page),
    lambda: r.cancel_step("s", idempotency_key="k"),
    lambda: r.replay_preview("s"),
    lambda: r.replay("s", reason="r", max_attempts=1, acknowledge_duplicate_risk=True, target_contract_version=2,
                     expected_handler_version="1", acknowledge_version_change=True, expected_attempt=2),
    lambda: r.begin("e", "k", 1, cost_micros=1, dimensions={"d": "v"}, run_id="r", group_id="g",
                    compensation={"effect_type": "u", "payload": 1}, compensates_effect_id="x", lease_seconds=5,
                    request_id="0123456789abcdef"),
    lambda: r.report_effect("e", "lt", "succeeded", 1),
    lambda: r.heartbeat_effect("e", "lt"),
    lambda: r.get_effect("e"),
    lambda: r.resolve_effect("e", "succeeded", 1, note="n", attempt=1),
    lambda: r.list_effects(state="indeterminate", effect_type="e", **page),
    lambda: r.list_effect_policies(**page),
    lambda: r.get_effect_policy("e"),
    lambda: r.get_policy_structuring("e"),
    lambda: r.update_effect_policy("e", {"max_attempts": 3}, expected_version=3, idempotency_key="k"),
    lambda: r.list_approvals(state="pending", **page),
    lambda: r.get_approval("a"),
    lambda: r.approve("a", note="n"),
    lambda: r.reject("a", note="n"),
    lambda: r.list_circuits(**page),
    lambda: r.open_circuit("e", action="deny", reason="r", idempotency_key="k"),
    lambda: r.close_circuit("e", idempotency_key="k"),
    lambda: r.emergency_stop(action="deny", reason="r", idempotency_key="k"),
    lambda: r.get_emergency_stop(),
    lambda: r.release_emergency_stop(idempotency_key="k"),
    lambda: r.create_group("g", idempotency_key="k"),
    lambda: r.get_group("g"),
    lambda: r.list_group_steps("g", **page),
    lambda: r.commit_group("g"),
    lambda: r.unwind_group("g"),
    lambda: r.create_webhook("https://example.com/hook", ["run.finished"], idempotency_key="k"),
    lambda: r.list_webhooks(**page),
    lambda: r.get_webhook("w"),
    lambda: r.update_webhook("w", url="https://example.com/hook", events=["run.finished"], disabled=True,
                             idempotency_key="k"),
    lambda: r.delete_webhook("w"),
    lambda: r.list_webhook_deliveries("w", **page),
    lambda: r.retry_webhook_deliveries("w", ["d"], idempotency_key="k"),
    lambda: r.rotate_webhook_secret("w", previous_expires_in=90, replace_previous=True, idempotency_key="k"),
    lambda: r.create_key("n", preset="WORKER", scopes=["jobs:work"], tools=["t@1"], daily_spend_ceiling_micros=1,
                         rate_limit_per_minute=2, idempotency_key="k"),
    lambda: r.list_keys(created_by="k", **page),
    lambda: r.current_key(),
    lambda: r.revoke_key("k", include_minted=True),
    lambda: r.list_endpoints(**page),
    lambda: r.create_endpoint("e", {"maxAttempts": 3}),
    lambda: r.get_endpoint("e"),
    lambda: r.update_endpoint_policy("e", 1, {"maxAttempts": 3}),
    lambda: r.pause_endpoint("e", idempotency_key="k"),
    lambda: r.resume_endpoint("e", idempotency_key="k"),
    lambda: r.close_endpoint_circuit("e", idempotency_key="k"),
    lambda: r.list_endpoint_attempts("e", outcome="FAILED", **page),
    lambda: r.publish_contract("t", handler_version="1", input_schema={}, output_schema={}, timeout_ms=1000,
                               retry_preset="CUSTOM",
                               retry_policy={"maxAttempts": 2, "initialDelayMs": 1, "multiplier": 2,
                                             "maxDelayMs": 2, "jitterPercent": 1},
                               status="ACTIVE", idempotency_key="k"),
    lambda: r.list_contracts("t", **page),
    lambda: r.test_tool("t", "1", 1, idempotency_key="k"),
    lambda: r.reconcile("e", now, now, [{"idempotency_key": "k", "status": "succeeded", "amount_micros": 1}],
                        idempotency_key="k"),
    lambda: r.list_queue_health(**page),
    lambda: r.register_worker([{"name": "t", "version": "1"}], idempotency_key="k"),
    lambda: r.claim("w", limit=1, wait_seconds=1, claim_id="c"),
    lambda: r.heartbeat_job("j", "lt"),
    lambda: r.report_job("j", "lt", "FAILED", output={}, error=err),
    lambda: r.report_jobs([{"job_id": "j", "lease_token": "lt", "status": "FAILED", "output": {}, "error": err}]),
]
for call in calls:
    try:
        call()
    except TypeError as e:
        # Raised by the call itself (no frame below the lambda's): a keyword
        # the method does not take, so nothing was sent.
        if e.__traceback__ is not None and e.__traceback__.tb_next is not None \
                and e.__traceback__.tb_next.tb_next is None:
            raise
    except Exception:  # an answer of {} may not satisfy the method: the request was sent
        pass

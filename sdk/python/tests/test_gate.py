"""The effect gate helper against a real server: every decision."""

from __future__ import annotations

import time
import unittest

import getratchet
from getratchet import (ApprovalRequired, EffectBlocked, EffectDenied, EffectInFlight, NotPerformed,
                        ResultNotStored)
from support import Workspace, require_server, unique


class GateTest(unittest.TestCase):
    def setUp(self) -> None:
        require_server(self)
        self.ws = Workspace()
        self.agent = self.ws.client("AGENT")

    def policy(self, effect_type: str, **fields) -> None:
        current = self.ws.operator.request("GET", f"/policies/{effect_type}")
        self.ws.operator.request("PUT", f"/policies/{effect_type}",
                                 dict(fields, expected_version=current["version"]))

    def test_execute_then_duplicate_returns_the_recorded_result(self) -> None:
        key, calls = unique("welcome-email:user"), []

        def send(lease):
            calls.append(lease.attempt)
            self.assertFalse(lease.probe)
            return {"message_id": "m_1"}

        first = self.agent.do_effect("email.send", key, send, {"to": "user_123"})
        self.assertEqual((first.result, first.duplicate, first.attempt), ({"message_id": "m_1"}, False, 1))
        again = self.agent.do_effect("email.send", key, send, {"to": "user_123"})
        self.assertEqual((again.result, again.duplicate, again.effect_id), ({"message_id": "m_1"}, True, first.effect_id))
        self.assertEqual(calls, [1])
        self.assertEqual(self.ws.operator.get_effect(first.effect_id)["state"], "succeeded")

    def test_a_deeply_nested_payload_and_result_are_sent_and_read_back(self) -> None:
        # The gate takes values nested nearly 10 000 levels deep: json raised
        # RecursionError sending such a payload or result, and reading a
        # duplicate's recorded result.
        key, levels = unique("deep"), 9990
        value: list = ["leaf"]
        for _ in range(levels - 1):
            value = [value]
        first = self.agent.do_effect("deep.write", key, lambda lease: value, {"payload": value})
        again = self.agent.do_effect("deep.write", key, lambda lease: None, {"payload": value})
        self.assertEqual((first.duplicate, again.duplicate, again.effect_id), (False, True, first.effect_id))
        read = again.result
        for _ in range(levels - 1):
            self.assertEqual(len(read), 1)
            read = read[0]
        self.assertEqual(read, ["leaf"])

    def test_not_performed_reports_failed_and_allows_a_new_attempt(self) -> None:
        key = unique("charge")

        def declined(lease):
            raise NotPerformed("card declined before the charge")

        with self.assertRaises(NotPerformed):
            self.agent.do_effect("payment.charge", key, declined, {"amount": 1}, cost_micros=1_000_000)
        effect = self.agent.do_effect("payment.charge", key, lambda lease: {"charged": lease.attempt},
                                      {"amount": 1}, cost_micros=1_000_000)
        self.assertEqual((effect.result, effect.attempt), ({"charged": 2}, 2))
        attempts = self.ws.operator.get_effect(effect.effect_id)["attempts"]
        self.assertEqual([a["outcome"] for a in attempts], ["failed", "succeeded"])

    def test_an_unsure_failure_reports_nothing(self) -> None:
        key = unique("unsure")

        def timeout(lease):
            raise TimeoutError("vendor did not answer")

        with self.assertRaises(TimeoutError):
            self.agent.do_effect("email.send", key, timeout, {"to": "x"}, lease_seconds=5)
        begun = self.agent.begin("email.send", key, {"to": "x"})
        self.assertEqual(begun["decision"], "in_flight")
        time.sleep(5.5)
        # The lease lapsed unreported: an honest indeterminate, and the
        # default policy (on_indeterminate: block) blocks the key.
        with self.assertRaises(EffectBlocked) as blocked:
            self.agent.do_effect("email.send", key, lambda lease: None, {"to": "x"})
        self.assertEqual(blocked.exception.prior_attempt["attempt"], 1)
        self.assertEqual(self.ws.operator.get_effect(blocked.exception.effect_id)["state"], "indeterminate")

    def test_in_flight_waits_then_gives_up(self) -> None:
        key = unique("held")
        held = self.agent.begin("email.send", key, {"to": "y"})
        self.assertEqual(held["decision"], "execute")
        with self.assertRaises(EffectInFlight):
            self.agent.do_effect("email.send", key, lambda lease: None, {"to": "y"}, in_flight_timeout=0.6)
        self.agent.report_effect(held["effect_id"], held["lease_token"], "succeeded", {"sent": True})
        done = self.agent.do_effect("email.send", key, lambda lease: None, {"to": "y"}, in_flight_timeout=5)
        self.assertEqual((done.duplicate, done.result), (True, {"sent": True}))

    def test_denied_and_approval_required(self) -> None:
        denied_type, held_type = unique("vendor.call"), unique("wire.send")
        self.policy(denied_type, mode="deny")
        self.policy(held_type, mode="require_approval")
        with self.assertRaises(EffectDenied) as denied:
            self.agent.do_effect(denied_type, unique("k"), lambda lease: None, {})
        self.assertEqual(denied.exception.code, "policy_denied")
        # The 403's X-Request-Id, to quote to support (SDK QA: it was empty).
        self.assertTrue(denied.exception.request_id.startswith("req_"), denied.exception.request_id)
        self.assertEqual(denied.exception.error.request_id, denied.exception.request_id)
        with self.assertRaises(ApprovalRequired) as held:
            self.agent.do_effect(held_type, unique("k"), lambda lease: None, {})
        self.assertTrue(held.exception.approval_id.startswith("apr_"))

    def test_an_indeterminate_effect_is_listed_and_resolved(self) -> None:
        effect_type, key = unique("payment.charge"), unique("charge")
        begun = self.ws.operator.begin(effect_type, key, {"amount": 1}, lease_seconds=1)
        self.assertEqual(begun["decision"], "execute")
        deadline = time.monotonic() + 30
        while True:  # the 1 s lease lapses unreported: indeterminate at once on read
            page = self.ws.operator.list_effects(state="indeterminate", effect_type=effect_type, limit=10)
            if page["data"] or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        self.assertEqual([e["id"] for e in page["data"]], [begun["effect_id"]])
        self.assertIsNone(page["next_cursor"])
        with self.assertRaises(ValueError):
            self.ws.operator.resolve_effect(begun["effect_id"], "maybe")
        # Naming another attempt than the unknown one is refused, naming it.
        with self.assertRaises(getratchet.RatchetError) as other:
            self.ws.operator.resolve_effect(begun["effect_id"], "succeeded", attempt=2)
        self.assertEqual((other.exception.code, other.exception.detail.get("unresolved_attempt")), ("invalid_state", 1))
        resolved = self.ws.operator.resolve_effect(begun["effect_id"], "succeeded", {"charge": "ch_1"}, note="found",
                                                   attempt=1)
        self.assertEqual(resolved["state"], "succeeded")
        self.assertEqual(resolved["attempts"][0]["resolve_note"], "found")
        again = self.ws.operator.begin(effect_type, key, {"amount": 1})
        self.assertEqual((again["decision"], again["result"]), ("duplicate", {"charge": "ch_1"}))

    def test_a_denials_detail_reads_through_the_error(self) -> None:
        effect_type = unique("payout.send")
        self.policy(effect_type, dimension_limits={"payee": {"daily_count": 1}})

        def pay(key: str) -> dict:
            return self.agent.begin(effect_type, key, {}, cost_micros=1, dimensions={"payee": "p1"})

        self.assertEqual(pay(unique("k"))["decision"], "execute")
        with self.assertRaises(EffectDenied) as denied:
            self.agent.do_effect(effect_type, unique("k"), lambda lease: None, {}, cost_micros=1,
                                 dimensions={"payee": "p1"})
        err = denied.exception.error
        self.assertEqual((err.code, err.dimension), ("dimension_limit_exceeded", "payee"))
        self.assertTrue(err.resets_at.endswith("T00:00:00Z"), err.resets_at)
        with self.assertRaises(getratchet.RatchetError) as refused:
            self.agent.get_effect(pay(unique("k"))["effect_id"])
        self.assertEqual(refused.exception.required, ["effects:read"])
        self.assertIsNone(refused.exception.resets_at)
        self.assertIsNone(refused.exception.dimension)

    def test_a_refused_result_is_replaced_by_a_placeholder(self) -> None:
        cases = {"big": ({"blob": "x" * (300 * 1024)}, "payload_too_large"),
                 "huge": ({"blob": "x" * (2 * 1024 * 1024)}, "payload_too_large"),
                 "not_json": ({"ids": {1, 2}}, "result_not_json")}
        for name, (result, reason) in cases.items():
            key = unique(name)
            with self.assertRaises(ResultNotStored) as refused:
                self.agent.do_effect("report.export", key, lambda lease: result, {})
            self.assertEqual((refused.exception.reason, refused.exception.result), (reason, result), name)
            # The key is settled: a later caller does not act again, and is
            # told the recorded result is a placeholder.
            with self.assertRaises(ResultNotStored) as again:
                self.agent.do_effect("report.export", key, lambda lease: self.fail("acted again"), {})
            self.assertEqual(again.exception.reason, reason, name)
            self.assertEqual(self.ws.operator.get_effect(refused.exception.effect_id)["state"], "succeeded")

    def test_a_lease_outlives_its_length_while_the_action_runs(self) -> None:
        key = unique("long")

        def slow(lease):
            time.sleep(7)  # longer than the 5 s lease: the heartbeats keep it
            self.assertFalse(lease.lost.is_set())
            return {"done": True}

        effect = self.agent.do_effect("email.send", key, slow, {"to": "z"}, lease_seconds=5)
        self.assertEqual(self.ws.operator.get_effect(effect.effect_id)["state"], "succeeded")

    def test_reusing_a_key_for_another_payload_is_refused(self) -> None:
        key = unique("reuse")
        self.agent.do_effect("email.send", key, lambda lease: {"ok": 1}, {"to": "a"})
        with self.assertRaises(getratchet.RatchetError) as reused:
            self.agent.do_effect("email.send", key, lambda lease: {"ok": 1}, {"to": "b"})
        self.assertEqual((reused.exception.status, reused.exception.code), (409, "idempotency_key_reuse"))


if __name__ == "__main__":
    unittest.main()

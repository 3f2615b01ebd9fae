"""The operator calls against a real server: each method once, its status
and a field that says it did what it says."""

from __future__ import annotations

import unittest
from datetime import datetime, timedelta, timezone

from getratchet import ApprovalRequired, RatchetError
from support import Workspace, require_server, unique, wait_for
from test_webhooks import Receiver, sweep


class OperatorTest(unittest.TestCase):
    def setUp(self) -> None:
        require_server(self)
        self.ws = Workspace()
        self.op = self.ws.operator

    def test_policies(self) -> None:
        effect_type = unique("py.ops").replace("_", ".")
        policy = self.op.get_effect_policy(effect_type)
        self.assertEqual((policy["effect_type"], policy["version"], policy["mode"]), (effect_type, 0, "allow"))
        updated = self.op.update_effect_policy(effect_type, {"mode": "require_approval"}, expected_version=0,
                                               max_cost_micros=5_000_000)
        self.assertEqual((updated["mode"], updated["max_cost_micros"], updated["version"]),
                         ("require_approval", 5_000_000, 1))
        # None clears a nullable field; a stale version is refused.
        cleared = self.op.update_effect_policy(effect_type, expected_version=1, max_cost_micros=None)
        self.assertIsNone(cleared["max_cost_micros"])
        with self.assertRaises(RatchetError) as stale:
            self.op.update_effect_policy(effect_type, expected_version=1, mode="deny")
        self.assertEqual((stale.exception.status, stale.exception.code), (409, "version_conflict"))
        page = self.op.list_effect_policies(limit=200)
        self.assertIn(effect_type, [p["effect_type"] for p in page["data"]])
        self.assertIn("next_cursor", page)

    def test_approvals(self) -> None:
        effect_type = unique("py.approve").replace("_", ".")
        self.op.update_effect_policy(effect_type, mode="require_approval")
        agent = self.ws.client("AGENT")
        held = []
        for key in (unique("a"), unique("b")):
            with self.assertRaises(ApprovalRequired) as asked:
                agent.do_effect(effect_type, key, lambda lease: {"ok": True})
            held.append((key, asked.exception.approval_id))
        pending = self.op.list_approvals(state="pending", limit=10)
        self.assertEqual({a["id"] for a in pending["data"]}, {approval for _, approval in held})
        self.assertIsNone(pending["next_cursor"])
        first = self.op.get_approval(held[0][1])
        self.assertEqual((first["state"], first["effect_type"]), ("pending", effect_type))
        approved = self.op.approve(held[0][1], note="checked")
        self.assertEqual((approved["state"], approved["note"]), ("approved", "checked"))
        self.assertEqual(self.op.approve(held[0][1])["state"], "approved", "approving again answers it")
        rejected = self.op.reject(held[1][1])
        self.assertEqual(rejected["state"], "rejected")
        done = agent.do_effect(effect_type, held[0][0], lambda lease: {"sent": 1})
        self.assertEqual(done.result, {"sent": 1})
        self.assertEqual(agent.begin(effect_type, held[1][0])["decision"], "denied")

    def test_circuits_and_the_emergency_stop(self) -> None:
        effect_type = unique("py.circuit").replace("_", ".")
        opened = self.op.open_circuit(effect_type, action="deny", reason="vendor incident")
        self.assertEqual((opened["state"], opened["opened_by"], opened["action"], opened["reason"]),
                         ("open", "manual", "deny", "vendor incident"))
        page = self.op.list_circuits(limit=200)
        self.assertIn((effect_type, "open"), [(c["effect_type"], c["state"]) for c in page["data"]])
        self.assertIn("next_cursor", page)
        self.assertEqual(self.op.close_circuit(effect_type)["state"], "closed")
        self.assertEqual(self.op.get_emergency_stop()["state"], "closed")
        stopped = self.op.emergency_stop(reason="drill")
        self.assertIn("data", stopped)
        stop = self.op.get_emergency_stop()
        self.assertEqual((stop["state"], stop["action"], stop["reason"]), ("open", "require_approval", "drill"))
        released = self.op.release_emergency_stop()
        self.assertIn("data", released)
        self.assertEqual(self.op.get_emergency_stop()["state"], "closed")

    def test_groups(self) -> None:
        # A group is its creating agent key's: that key's begins join it.
        agent = self.ws.client("AGENT")
        key = unique("checkout")
        group = agent.create_group("checkout", idempotency_key=key)
        self.assertEqual(group["state"], "open")
        again = agent.create_group("checkout", idempotency_key=key)
        self.assertEqual((again["id"], again["deduplicated"]), (group["id"], True))
        self.assertNotEqual(agent.create_group("checkout")["id"], group["id"])

        charged = agent.do_effect("payment.charge", unique("charge"), lambda lease: {"charge": "ch_1"},
                                  cost_micros=1_000_000, group_id=group["id"],
                                  compensation={"effect_type": "payment.refund", "payload": {"charge": "ch_1"}})
        read = self.op.get_group(group["id"])
        self.assertEqual([s["effect_id"] for s in read["steps"]], [charged.effect_id])
        self.assertFalse(read["steps_truncated"])
        steps = agent.list_group_steps(group["id"])
        self.assertEqual(([s["effect_id"] for s in steps["data"]], steps["next_cursor"]), ([charged.effect_id], None))
        after = agent.list_group_steps(group["id"], cursor=charged.effect_id)
        self.assertEqual((after["data"], after["next_cursor"]), ([], None))
        committed = agent.commit_group(group["id"])
        self.assertEqual(committed["state"], "committed")
        unwind = self.op.unwind_group(group["id"])
        self.assertEqual(unwind["state"], "unwinding")
        self.assertEqual([p["effect_id"] for p in unwind["plan"]], [charged.effect_id])
        self.assertEqual(unwind["plan"][0]["compensation"]["effect_type"], "payment.refund")

    def test_webhooks(self) -> None:
        receiver = Receiver(self)
        key = unique("hook")
        hook = self.op.create_webhook(receiver.url, ["circuit.tripped"], idempotency_key=key)
        self.assertTrue(hook["secret"].startswith("whsec_"))
        # The same Idempotency-Key answers the same subscription and secret.
        again = self.op.create_webhook(receiver.url, ["circuit.tripped"], idempotency_key=key)
        self.assertEqual((again["id"], again["secret"]), (hook["id"], hook["secret"]))
        self.assertNotEqual(self.op.create_webhook(receiver.url, ["run.finished"])["id"], hook["id"])
        self.assertEqual(self.op.get_webhook(hook["id"])["events"], ["circuit.tripped"])
        page = self.op.list_webhooks(limit=10)
        self.assertIn(hook["id"], [w["id"] for w in page["data"]])
        self.assertIn("next_cursor", page)

        self.op.open_circuit(unique("py.hook").replace("_", "."), action="deny")
        wait_for("a delivery", lambda: sweep() or receiver.received())
        deliveries = wait_for("the delivery delivered", lambda: [
            d for d in self.op.list_webhook_deliveries(hook["id"], limit=10)["data"] if d["state"] == "delivered"])
        self.assertEqual((len(deliveries), deliveries[0]["event_type"]), (1, "circuit.tripped"))
        retried = self.op.retry_webhook_deliveries(hook["id"], [deliveries[0]["id"]])
        self.assertEqual([(d["id"], d["state"]) for d in retried["deliveries"]], [(deliveries[0]["id"], "pending")])

        # Changed without deleting it: disabled, enabled again, moved.
        disabled = self.op.update_webhook(hook["id"], disabled=True)
        self.assertEqual((disabled["disabled"], disabled["url"]), (True, receiver.url))
        self.assertIsNotNone(disabled["disabled_at"])
        self.assertEqual(self.op.get_webhook(hook["id"]), disabled)
        moved = self.op.update_webhook(hook["id"], disabled=False, url=receiver.url + "/moved",
                                       events=["circuit.tripped", "run.finished"])
        self.assertEqual((moved["disabled"], moved["disabled_at"], moved["url"], moved["events"]),
                         (False, None, receiver.url + "/moved", ["circuit.tripped", "run.finished"]))
        with self.assertRaises(RatchetError) as empty:
            self.op.update_webhook(hook["id"])
        self.assertEqual((empty.exception.status, empty.exception.code), (400, "invalid_request"))

        rotated = self.op.rotate_webhook_secret(hook["id"], previous_expires_in=60)
        self.assertNotEqual(rotated["secret"], hook["secret"])
        self.assertIsNotNone(rotated["previous_secret_expires_at"])
        with self.assertRaises(RatchetError) as refused:
            self.op.rotate_webhook_secret(hook["id"])
        self.assertEqual(refused.exception.code, "invalid_state")
        self.assertNotEqual(self.op.rotate_webhook_secret(hook["id"], replace_previous=True)["secret"],
                            rotated["secret"])
        deleted = self.op.delete_webhook(hook["id"])
        self.assertEqual(deleted["id"], hook["id"])
        with self.assertRaises(RatchetError) as gone:
            self.op.get_webhook(hook["id"])
        self.assertEqual(gone.exception.status, 404)

    def test_keys(self) -> None:
        key = unique("mint")
        created = self.op.create_key("reporting agent", preset="AGENT", rate_limit_per_minute=120,
                                     idempotency_key=key)
        self.assertEqual((sorted(created["scopes"]), created["rate_limit_per_minute"], created["tools"]),
                         (["effects:begin", "effects:report"], 120, None))
        self.assertTrue(created["secret"])
        again = self.op.create_key("reporting agent", preset="AGENT", rate_limit_per_minute=120,
                                   idempotency_key=key)
        self.assertEqual((again["id"], again["secret"]), (created["id"], created["secret"]))
        worker = self.op.create_key("mailer", preset="WORKER", tools=["send_email@1"])
        self.assertEqual((worker["scopes"], worker["tools"]), (["jobs:work"], ["send_email@1"]))
        page = self.op.list_keys(limit=200)
        self.assertTrue({created["id"], worker["id"]} <= {k["id"] for k in page["data"]})
        self.assertNotIn("secret", page["data"][0])
        # Each names the key that minted it, whose mints list it.
        me = self.op.current_key()
        self.assertEqual((me["created_by_key_id"], created["created_by_key_id"]), (None, me["id"]))
        minted = self.op.list_keys(created_by=me["id"], limit=200)["data"]
        self.assertTrue({created["id"], worker["id"]} <= {k["id"] for k in minted})
        self.assertEqual({k["created_by_key_id"] for k in minted}, {me["id"]})
        self.assertEqual(self.op.list_keys(created_by=worker["id"])["data"], [])
        with self.assertRaises(RatchetError) as malformed:
            self.op.list_keys(created_by="")
        self.assertEqual((malformed.exception.status, malformed.exception.code), (400, "invalid_request"))
        import getratchet
        from support import BASE_URL
        agent = getratchet.Ratchet(BASE_URL, created["secret"])
        self.assertEqual(agent.current_key()["id"], created["id"])
        revoked = self.op.revoke_key(created["id"])
        self.assertIsNotNone(revoked["revoked_at"])
        with self.assertRaises(RatchetError) as refused:
            agent.current_key()
        self.assertEqual(refused.exception.status, 401)
        self.assertNotIn("minted_revoked", revoked)
        # A key found compromised, revoked with every key minted from it.
        leaky = self.op.create_key(unique("leaky"), scopes=["keys:write", "effects:begin"])
        child = getratchet.Ratchet(BASE_URL, leaky["secret"]).create_key(unique("child"), scopes=["effects:begin"])
        tree = self.op.revoke_key(leaky["id"], include_minted=True)
        self.assertEqual((tree["id"], tree.get("minted_revoked")), (leaky["id"], [child["id"]]))
        with self.assertRaises(RatchetError) as refused:
            getratchet.Ratchet(BASE_URL, child["secret"]).current_key()
        self.assertEqual(refused.exception.status, 401)

    def test_endpoints(self) -> None:
        name = unique("Email service")
        endpoint = self.op.create_endpoint(name, {"preset": "CUSTOM"}, maxAttempts=4, initialDelayMs=1000,
                                           multiplier=2, maxDelayMs=8000, jitterPercent=0)
        self.assertEqual((endpoint["name"], endpoint["policyPreset"], endpoint["maxAttempts"]), (name, "CUSTOM", 4))
        page = self.op.list_endpoints(limit=200)
        self.assertIn(endpoint["id"], [e["id"] for e in page["data"]])
        self.assertIn("nextCursor", page)
        read = self.op.get_endpoint(endpoint["id"])
        updated = self.op.update_endpoint_policy(endpoint["id"], read["version"], maxConcurrent=2)
        self.assertEqual((updated["maxConcurrent"], updated["version"]), (2, read["version"] + 1))
        lifted = self.op.update_endpoint_policy(endpoint["id"], updated["version"], {"maxConcurrent": None})
        self.assertIsNone(lifted["maxConcurrent"])
        with self.assertRaises(RatchetError) as stale:
            self.op.update_endpoint_policy(endpoint["id"], read["version"], maxConcurrent=3)
        self.assertEqual(stale.exception.code, "version_conflict")
        self.assertTrue(self.op.pause_endpoint(endpoint["id"])["paused"])
        self.assertFalse(self.op.resume_endpoint(endpoint["id"])["paused"])
        self.assertEqual(self.op.close_endpoint_circuit(endpoint["id"])["circuit"]["state"], "closed")
        attempts = self.op.list_endpoint_attempts(endpoint["id"], outcome="FAILED", limit=5)
        self.assertEqual((attempts["data"], attempts["nextCursor"]), ([], None))

    def test_contracts_tool_test_and_queue_health(self) -> None:
        name = unique("send#email")  # '#' reaches the route only escaped
        schema = {"type": "object", "required": ["to"], "properties": {"to": {"type": "string"}}}
        published = self.op.publish_contract(name, handler_version="1", input_schema=schema, timeout_ms=5000,
                                             retry_preset="CUSTOM",
                                             retry_policy={"preset": "CUSTOM", "maxAttempts": 2,
                                                           "initialDelayMs": 1000, "multiplier": 1,
                                                           "maxDelayMs": 1000, "jitterPercent": 0})
        self.assertEqual((published["name"], published["contractVersion"], published["status"]), (name, 1, "ACTIVE"))
        second = self.op.publish_contract(name, handler_version="2", input_schema=schema, status="FORBIDDEN")
        self.assertEqual((second["contractVersion"], second["status"]), (2, "FORBIDDEN"))
        page = self.op.list_contracts(name, limit=1)
        self.assertEqual([c["contractVersion"] for c in page["data"]], [1])
        rest = self.op.list_contracts(name, cursor=page["nextCursor"])
        self.assertEqual([c["contractVersion"] for c in rest["data"]], [2])

        with self.assertRaises(RatchetError) as invalid:
            self.op.test_tool(name, "1", {"to": 5})
        self.assertEqual(invalid.exception.status, 400)
        test = self.op.test_tool(name, "1", {"to": "user@example.com"})
        self.assertEqual((test["name"], test["version"], test["maxAttempts"], test["status"]), (name, "1", 1, "QUEUED"))
        self.assertEqual(self.op.get_run(test["runId"])["steps"][0]["id"], test["stepId"])

        health = self.op.list_queue_health(limit=200)
        mine = [h for h in health["data"] if h["name"] == name]
        self.assertEqual([(h["version"], h["queued"], h["workersSeen"]) for h in mine], [("1", 1, 0)])
        self.assertTrue(mine[0]["message"])
        self.assertIn("nextCursor", health)

    def test_reconcile(self) -> None:
        agent = self.ws.client("AGENT")
        effect_type = unique("py.recon").replace("_", ".")
        key = unique("charge")
        agent.do_effect(effect_type, key, lambda lease: {"charge": "ch_1"}, cost_micros=2_000_000)
        now = datetime.now(timezone.utc)
        report = self.op.reconcile(effect_type, now - timedelta(hours=1), now + timedelta(minutes=1), [
            {"idempotency_key": key, "status": "succeeded", "amount_micros": 2_000_000},
            {"idempotency_key": unique("stray"), "status": "succeeded", "amount_micros": 1}])
        self.assertEqual((report["effect_type"], report["counts"]["matched"], report["counts"]["unknown_to_ratchet"]),
                         (effect_type, 1, 1))
        self.assertEqual(report["matched"][0]["idempotency_key"], key)
        with self.assertRaises(ValueError):
            self.op.reconcile(effect_type, datetime(2026, 1, 1), now)


if __name__ == "__main__":
    unittest.main()

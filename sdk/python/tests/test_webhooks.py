"""verify_webhook: what it accepts and refuses, as the Go SDK's VerifyWebhook,
and a delivery from the real server (before and after a secret rotation)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import os
import threading
import time
import unittest
import urllib.request
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Tuple

import getratchet
from getratchet import NoWebhookSecretError, WebhookSignatureError, verify_webhook
from support import BASE_URL, Workspace, require_server, unique, wait_for

SECRET = "whsec_0123456789abcdef"
PREVIOUS = "whsec_previous"
BODY = (b'{"id":"evt_1","type":"run.finished","created_at":"2030-01-01T00:00:00Z",'
        b'"workspace_id":"ws_1","subject_id":"run_1","data":{"status":"SUCCEEDED"}}')
AT = 1893456000  # 2030-01-01T00:00:00Z
# The webhook vectors the server's and the three SDKs' tests share.
WEBHOOK_VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "webhook_vectors.json")
with open(WEBHOOK_VECTORS, encoding="utf-8") as _file:
    VECTORS = json.load(_file)
# lib/webhooks.Sign(AT, BODY, SECRET, PREVIOUS), as the server signs a
# delivery while a rotated secret still signs: the shared vector a Go test
# holds the server's Sign to, so that these tests do not only agree with a
# signer of their own.
GO_SIGNED = next(v["header"] for v in VECTORS["signed"] if v["secrets"] == [SECRET, PREVIOUS]
                 and v["t"] == AT and v["body"] == BODY.decode())


def sign(t: int, body: bytes, *secrets: str) -> str:
    """A header as lib/webhooks.Sign writes it."""
    out = f"t={t}"
    for secret in secrets:
        out += ",v1=" + hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return out


class VerifyWebhookTest(unittest.TestCase):
    def refused(self, secret, signature, body=BODY, now=AT, **options) -> WebhookSignatureError:
        with self.assertRaises(WebhookSignatureError) as refused:
            verify_webhook(secret, signature, body, now=now, **options)
        self.assertNotIn(SECRET, str(refused.exception), "the secret is never echoed")
        self.assertTrue(str(refused.exception).startswith("ratchet: webhook signature does not verify: "))
        return refused.exception

    def test_a_delivery_the_server_signed_verifies_and_decodes(self) -> None:
        self.assertEqual(sign(AT, BODY, SECRET, PREVIOUS), GO_SIGNED, "the test's signer is the server's")
        event = verify_webhook(SECRET, sign(AT, BODY, SECRET), BODY, now=AT + 240)
        self.assertEqual(event, json.loads(BODY))
        self.assertEqual((event["id"], event["type"], event["subject_id"]), ("evt_1", "run.finished", "run_1"))
        # bytes-like bodies, a datetime clock, spaces around the parts.
        self.assertEqual(verify_webhook(SECRET, GO_SIGNED, bytearray(BODY), now=AT)["id"], "evt_1")
        self.assertEqual(verify_webhook(SECRET, GO_SIGNED, memoryview(BODY),
                                        now=datetime(2030, 1, 1, 0, 4, tzinfo=timezone.utc))["id"], "evt_1")
        self.assertEqual(verify_webhook(SECRET, GO_SIGNED.replace(",", " , "), BODY, now=AT)["id"], "evt_1")
        # Any matching v1 will do, in any place; unknown entries are ignored.
        self.assertEqual(verify_webhook(SECRET, "v1=00,v0=zz," + sign(AT, BODY, SECRET), BODY, now=AT)["id"], "evt_1")
        self.assertEqual(verify_webhook(SECRET, sign(AT, BODY, SECRET).upper().replace("T=", "t=").replace("V1=", "v1="),
                                        BODY, now=AT)["id"], "evt_1", "hex in either case")

    def test_a_naive_now_is_refused(self) -> None:
        # A naive datetime names no zone (datetime.utcnow()'s is UTC,
        # datetime.now()'s local time): refused, as every datetime the SDK
        # takes (reconcile's from_ and to), whatever the machine's zone.
        header = sign(AT, BODY, SECRET)
        naive = datetime.fromtimestamp(AT + 240, timezone.utc).replace(tzinfo=None)
        saved = os.environ.get("TZ")
        os.environ["TZ"] = "Asia/Tokyo"  # UTC+9, no daylight saving
        time.tzset()
        try:
            with self.assertRaisesRegex(ValueError, "verify_webhook's now must be an aware datetime"):
                verify_webhook(SECRET, header, BODY, now=naive)
            self.assertEqual(verify_webhook(SECRET, header, BODY,
                                            now=naive.replace(tzinfo=timezone.utc))["id"], "evt_1")
            tokyo = timezone(timedelta(hours=9))
            self.assertEqual(verify_webhook(SECRET, header, BODY, now=naive.replace(tzinfo=timezone.utc)
                                            .astimezone(tokyo))["id"], "evt_1", "an aware one is the time it names")
            self.assertIn("ago", str(self.refused(SECRET, header,
                                                  now=naive.replace(tzinfo=timezone.utc) + timedelta(minutes=6))))
        finally:
            if saved is None:
                del os.environ["TZ"]
            else:
                os.environ["TZ"] = saved
            time.tzset()

    def test_the_shared_vectors(self) -> None:
        # What the server signs verifies with each of its secrets, and each
        # header, body, secret, clock and tolerance is answered as the Go
        # and TypeScript SDKs answer it.
        self.assertTrue(VECTORS["signed"] and VECTORS["verify"])
        for vector in VECTORS["signed"]:
            for secret in vector["secrets"]:
                verify_webhook(secret, vector["header"], vector["body"].encode(), now=vector["t"])
        for vector in VECTORS["verify"]:
            name = vector["name"]
            try:
                body = base64.b64decode(vector["body_base64"]) if "body_base64" in vector else vector["body"].encode()
                event = verify_webhook(vector["secret"], vector["header"], body,
                                       tolerance=vector["tolerance"], now=vector["now"])
            except NoWebhookSecretError:
                self.assertEqual(vector["outcome"], "no_secret", name)
            except WebhookSignatureError as refused:
                self.assertEqual(vector["outcome"], "signature", name)
                self.assertEqual(refused.reason, vector["reason"], name)
            except ValueError:
                self.assertEqual(vector["outcome"], "decode", name)
            else:
                self.assertEqual(vector["outcome"], "ok", name)
                self.assertEqual(event.get("id") or "", vector["id"], name)

    def test_each_secret_of_a_rotation_verifies(self) -> None:
        for secret in (SECRET, PREVIOUS):
            self.assertEqual(verify_webhook(secret, GO_SIGNED, BODY, now=AT)["id"], "evt_1", secret)
        self.assertEqual(self.refused("whsec_third", GO_SIGNED).reason, "no v1 signature matches")

    def test_another_secret_or_body_is_refused(self) -> None:
        self.assertEqual(self.refused("whsec_other", sign(AT, BODY, SECRET)).reason, "no v1 signature matches")
        tampered = BODY.replace(b"SUCCEEDED", b"FAILED")
        self.assertEqual(self.refused(SECRET, sign(AT, BODY, SECRET), tampered).reason, "no v1 signature matches")
        # The time is part of what was signed: another t with the same v1 fails.
        moved = sign(AT, BODY, SECRET).replace(f"t={AT}", f"t={AT + 1}")
        self.assertEqual(self.refused(SECRET, moved).reason, "no v1 signature matches")
        self.refused(SECRET, sign(AT, BODY + b" ", SECRET))

    def test_a_time_out_of_tolerance_is_refused_and_said_which_way(self) -> None:
        sig = sign(AT, BODY, SECRET)
        self.assertEqual(verify_webhook(SECRET, sig, BODY, now=AT + 300)["id"], "evt_1", "5 minutes exactly")
        self.assertEqual(verify_webhook(SECRET, sig, BODY, now=AT - 300)["id"], "evt_1")
        self.assertEqual(self.refused(SECRET, sig, now=AT + 301).reason, "signed 5m1s ago, beyond 5m0s")
        self.assertEqual(self.refused(SECRET, sig, now=AT + 400).reason, "signed 6m40s ago, beyond 5m0s")
        self.assertEqual(self.refused(SECRET, sig, now=AT - 400).reason, "signed 6m40s in the future, beyond 5m0s")
        self.assertEqual(self.refused(SECRET, sig, now=AT + 7200.6).reason, "signed 2h0m1s ago, beyond 5m0s")
        # A tolerance of one's own; 0 or less is the default.
        self.assertEqual(self.refused(SECRET, sig, now=AT + 11, tolerance=10).reason, "signed 11s ago, beyond 10s")
        self.assertEqual(self.refused(SECRET, sig, now=AT + 2, tolerance=1.5).reason, "signed 2s ago, beyond 1.5s")
        self.assertEqual(verify_webhook(SECRET, sig, BODY, tolerance=3600, now=AT + 3000)["id"], "evt_1")
        self.assertEqual(verify_webhook(SECRET, sig, BODY, tolerance=0, now=AT + 299)["id"], "evt_1")
        self.assertEqual(self.refused(SECRET, sig, now=AT + 301, tolerance=0).reason, "signed 5m1s ago, beyond 5m0s")
        # By default the clock is now: a delivery signed now verifies, one
        # signed in 2030 does not.
        import time
        fresh = sign(int(time.time()), BODY, SECRET)
        self.assertEqual(verify_webhook(SECRET, fresh, BODY)["id"], "evt_1")
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(SECRET, sig, BODY)

    def test_a_timestamp_in_milliseconds_is_said_to_be_no_time_near_now(self) -> None:
        millis = sign(AT * 1000, BODY, SECRET)
        self.assertEqual(self.refused(SECRET, millis).reason, "its timestamp is not a time near now (seconds since 1970)")
        far = AT - (1 << 32)
        self.assertEqual(self.refused(SECRET, sign(far - 1, BODY, SECRET)).reason,
                         "its timestamp is not a time near now (seconds since 1970)")
        self.assertEqual(self.refused(SECRET, sign(far, BODY, SECRET)).reason,
                         "signed 1193046h28m16s ago, beyond 5m0s", "2^32 seconds is still a time")

    def test_malformed_headers_are_refused(self) -> None:
        sig = sign(AT, BODY, SECRET)
        t_part, v1_part = sig.split(",")
        v1 = v1_part[len("v1="):]
        malformed = {
            "no header": None,
            "an empty header": "",
            "no t": v1_part,
            "no v1": t_part,
            "two t": sig + f",t={AT}",
            "two t, the second first": f"t={AT}," + sig,
            "an empty t": f"t=,{v1_part}",
            "t not a number": f"t=soon,{v1_part}",
            "t with a fraction": f"t={AT}.0,{v1_part}",
            "t with an underscore": f"t=1_893_456_000,{v1_part}",
            "t beyond 64 bits": f"t={2 ** 63},{v1_part}",
            "v1 not hex": f"{t_part},v1=zz",
            "v1 of odd length": f"{t_part},v1={v1}0",
            "v1 with a space inside": f"{t_part},v1={v1[:10]} {v1[10:]}",
            "a part without =": f"{sig},v1",
            "an empty part": f"{sig},",
            "nine v1": sig + ",v1=00" * 8,
            "over 4096 characters": sig + ",x=" + "a" * (4096 - len(sig) - 2),
            "over 4096 bytes": sig + ",x=" + "\u00e9" * 2048,
            "t in hex": f"t=0x70dbd880,{v1_part}",
        }
        for name, header in malformed.items():
            with self.subTest(name):
                self.assertEqual(self.refused(SECRET, header).reason, "malformed Ratchet-Signature")
        # Parts are trimmed of what Go's strings.TrimSpace trims, and no more:
        # NBSP and NEL are space, a BOM or an information separator is not
        # (its v1 is then an unknown entry, so none is left).
        self.assertEqual(verify_webhook(SECRET, f"\u3000{t_part},\u00a0{v1_part}\u0085", BODY, now=AT)["id"], "evt_1")
        for junk in ("\ufeff", "\x1c"):
            self.assertEqual(self.refused(SECRET, f"{t_part},{junk}{v1_part}").reason, "malformed Ratchet-Signature")
        # The limits' own edges verify: eight v1 and 4096 characters.
        self.assertEqual(verify_webhook(SECRET, sig + ",v1=00" * 7, BODY, now=AT)["id"], "evt_1")
        edge = sig + ",x=" + "a" * (4096 - len(sig) - 3)
        self.assertEqual(len(edge), 4096)
        self.assertEqual(verify_webhook(SECRET, edge, BODY, now=AT)["id"], "evt_1")
        self.assertEqual(len(malformed["over 4096 characters"]), 4097)

    def test_a_header_given_as_its_lines_is_read_joined(self) -> None:
        # A framework's repeated header (request.headers.getlist, aiohttp's
        # getall) read as the Go WebhookHandler and the TypeScript SDK (Node)
        # read it: joined by commas, so two signatures are two t, refused as
        # ambiguous, and a t and a v1 on lines of their own verify. A list
        # was refused with TypeError.
        sig, older = sign(AT, BODY, SECRET), sign(AT - 1, BODY, SECRET)
        self.assertEqual(verify_webhook(SECRET, [sig], BODY, now=AT)["id"], "evt_1")
        self.assertEqual(verify_webhook(SECRET, tuple(sig.split(",")), BODY, now=AT)["id"], "evt_1")
        self.assertEqual(self.refused(SECRET, [sig, older]).reason, "malformed Ratchet-Signature")
        with self.assertRaises(TypeError):
            verify_webhook(SECRET, [sig, 1], BODY, now=AT)  # type: ignore[list-item]

    def test_no_secret_verifies_nothing(self) -> None:
        for secret in ("", None):
            with self.assertRaises(NoWebhookSecretError) as missing:
                verify_webhook(secret, sign(AT, BODY, ""), BODY, now=AT)
            self.assertNotIsInstance(missing.exception, WebhookSignatureError, "a misconfiguration, not a forgery")
        self.assertFalse(issubclass(NoWebhookSecretError, WebhookSignatureError))
        self.assertFalse(issubclass(WebhookSignatureError, NoWebhookSecretError))
        self.assertIs(getratchet.errors.NoWebhookSecretError, NoWebhookSecretError)
        self.assertIs(getratchet.errors.WebhookSignatureError, WebhookSignatureError)

    def test_signatures_are_compared_in_constant_time(self) -> None:
        source = inspect.getsource(getratchet.webhooks)
        self.assertIn("hmac.compare_digest(mac, want)", source)
        self.assertNotRegex(source, r"\bmac\s*[!=]=\s*want\b|\bwant\s*[!=]=\s*mac\b")

    def test_a_body_must_be_the_bytes_received(self) -> None:
        with self.assertRaisesRegex(TypeError, "bytes received, not str"):
            verify_webhook(SECRET, sign(AT, BODY, SECRET), BODY.decode(), now=AT)
        with self.assertRaises(TypeError):
            verify_webhook(SECRET, sign(AT, BODY, SECRET), json.loads(BODY), now=AT)

    def test_a_verified_body_that_is_no_event_is_not_a_signature_error(self) -> None:
        for body in (b"not json", b"[1, 2]", b"null", b'{"n": NaN}', b'\xef\xbb\xbf{"id": "evt_1"}', b'{"id": \xff}'):
            with self.subTest(body):
                with self.assertRaisesRegex(ValueError, "^ratchet: decode webhook event: ") as bad:
                    verify_webhook(SECRET, sign(AT, body, SECRET), body, now=AT)
                self.assertNotIsInstance(bad.exception, WebhookSignatureError)
        # Bytes that are not UTF-8, even in a string, are refused, by the
        # three SDKs alike (they read them as U+FFFD before; the shared
        # vectors hold the rest of the rules).
        odd = b'{"id": "evt_\xff"}'
        with self.assertRaisesRegex(ValueError, "^ratchet: decode webhook event: .*utf-8"):
            verify_webhook(SECRET, sign(AT, odd, SECRET), odd, now=AT)
        # Unverified, it is a signature error first: nothing is decoded before a match.
        self.refused("whsec_other", sign(AT, b"not json", SECRET), b"not json")


class UpdateWebhookTest(unittest.TestCase):
    """update_webhook sends what it is given, and is repeated after a 5xx
    (the same update again changes nothing)."""

    def test_it_sends_only_what_it_is_given_and_is_repeated(self) -> None:
        from test_units import FakeServer, error
        answer = {"id": "whk_1", "url": "https://x.test/h", "events": ["run.finished"], "disabled": True,
                  "disabled_at": "2030-01-01T00:00:00Z"}
        server = FakeServer([(500, error("internal_error"), {})] + [(200, answer, {})] * 4)
        self.addCleanup(server.close)
        client = getratchet.Ratchet(server.url, "rk_test", max_retries=1)
        client._transport.sleep = lambda seconds: None
        self.addCleanup(client.close)
        self.assertEqual(client.update_webhook("whk/1", disabled=True), answer)
        client.update_webhook("whk_1", disabled=False)
        client.update_webhook("whk_1", url="https://x.test/h", events=("run.finished",))
        client.update_webhook("whk_1", events=[])
        self.assertEqual([(m, p, body) for m, p, _, body in server.seen], [
            ("PATCH", "/api/v1/webhooks/whk%2F1", {"disabled": True}),
            ("PATCH", "/api/v1/webhooks/whk%2F1", {"disabled": True}),
            ("PATCH", "/api/v1/webhooks/whk_1", {"disabled": False}),
            ("PATCH", "/api/v1/webhooks/whk_1", {"url": "https://x.test/h", "events": ["run.finished"]}),
            ("PATCH", "/api/v1/webhooks/whk_1", {"events": []}),
        ])
        # One Idempotency-Key of the call's own spans its retry, so a retry
        # never undoes another update made since; the next call has another.
        keys = [headers.get("Idempotency-Key") for _, _, headers, _ in server.seen]
        self.assertTrue(all(keys))
        self.assertEqual(keys[1], keys[0])
        self.assertEqual(len(set(keys)), 4)


class Receiver:
    """A local webhook receiver recording each delivery's headers and raw body."""

    def __init__(self, test: unittest.TestCase) -> None:
        self.lock = threading.Lock()
        self.deliveries: List[Tuple[dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.deliveries.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        test.addCleanup(self.server.server_close)
        test.addCleanup(self.server.shutdown)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ratchet"

    def received(self) -> List[Tuple[dict, bytes]]:
        with self.lock:
            return list(self.deliveries)


def sweep() -> None:
    """Runs one pass of the server's sweeper (its cron route), which sends
    due webhook deliveries."""
    request = urllib.request.Request(BASE_URL + "/api/cron/sweep", method="POST", headers={
        "Authorization": "Bearer " + os.environ.get("RATCHET_TEST_CRON_SECRET", "")})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, response.status


class WebhookDeliveryTest(unittest.TestCase):
    def setUp(self) -> None:
        require_server(self)
        if not os.environ.get("RATCHET_TEST_CRON_SECRET"):
            self.fail("RATCHET_TEST_CRON_SECRET is not set: run `go test ./lib/sdktest -run TestPythonSDK`")
        self.ws = Workspace()

    def deliver(self, receiver: Receiver, seen: int, effect_type: str) -> Tuple[dict, bytes]:
        """Opens effect_type's circuit (a circuit.tripped event) and sweeps
        until the receiver has its delivery."""
        self.ws.operator.request("POST", f"/circuits/{effect_type}/open", {"action": "deny"})
        # Another server's pass over the same database may send it first:
        # either way it reaches this receiver.
        got = wait_for(f"the delivery of {effect_type}'s circuit.tripped",
                       lambda: sweep() or len(receiver.received()) > seen and receiver.received())
        self.assertEqual(len(got), seen + 1, "one delivery per event")
        return got[seen]

    def test_a_delivery_verifies_with_each_secret_of_a_rotation(self) -> None:
        receiver = Receiver(self)
        hook = self.ws.operator.request("POST", "/webhooks", {"url": receiver.url, "events": ["circuit.tripped"]},
                                        idempotency_key=unique("hook"))
        self.addCleanup(self.ws.operator.request, "DELETE", f"/webhooks/{hook['id']}")
        secret = hook["secret"]
        self.assertTrue(secret.startswith("whsec_"))

        first_type = unique("py.hook").replace("_", ".")
        headers, body = self.deliver(receiver, 0, first_type)
        signature = headers["ratchet-signature"]
        self.assertEqual(signature.count("v1="), 1, signature)
        event = verify_webhook(secret, signature, body)
        self.assertEqual(event["id"], headers["ratchet-event-id"])
        self.assertEqual(event["type"], "circuit.tripped")
        self.assertEqual(event["subject_id"], first_type)
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(secret + "x", signature, body)
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(secret, signature, body + b"\n")

        rotated = self.ws.operator.request("POST", f"/webhooks/{hook['id']}/rotate-secret", {},
                                           idempotency_key=unique("rotate"))
        self.assertNotEqual(rotated["secret"], secret)
        self.assertIsNotNone(rotated["previous_secret_expires_at"])

        second_type = unique("py.hook").replace("_", ".")
        headers, body = self.deliver(receiver, 1, second_type)
        signature = headers["ratchet-signature"]
        self.assertEqual(signature.count("v1="), 2, signature)
        for which in (rotated["secret"], secret):
            event = verify_webhook(which, signature, body)
            self.assertEqual((event["id"], event["subject_id"]), (headers["ratchet-event-id"], second_type))
        with self.assertRaises(WebhookSignatureError):
            verify_webhook("whsec_neither", signature, body)
        # Each v1 is its own secret's: the new one's first, as the server sends them.
        t_part, new_v1, previous_v1 = signature.split(",")
        verify_webhook(rotated["secret"], f"{t_part},{new_v1}", body)
        verify_webhook(secret, f"{t_part},{previous_v1}", body)
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(secret, f"{t_part},{new_v1}", body)


if __name__ == "__main__":
    unittest.main()

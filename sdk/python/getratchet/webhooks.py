"""Verifying a webhook delivery's Ratchet-Signature, as the Go SDK's
VerifyWebhook does (the same header limits, checks and order)."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import time
from datetime import datetime
from typing import Any, Optional, Union

from ._time import aware
from .errors import NoWebhookSecretError, WebhookSignatureError

# How far a delivery's signed time may be from the receiver's clock, in
# seconds: every attempt is signed as it is sent, so a delivery captured and
# replayed later fails.
DEFAULT_WEBHOOK_TOLERANCE = 300.0

# The header read is bounded, and so are the v1 entries in it (the server
# sends one, two while a rotated secret still signs).
_MAX_SIGNATURE_HEADER = 4096
_MAX_SIGNATURES = 8
# A timestamp further than this from now (one in milliseconds, say) is as
# far off as any, and said so.
_FAR_SECONDS = 1 << 32
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# What Go's strings.TrimSpace trims (unicode.IsSpace), which is not quite
# str.strip()'s set: a part is trimmed exactly as the Go SDK trims it.
_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
         "\u2028\u2029\u202f\u205f\u3000"
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")

_MALFORMED = "malformed Ratchet-Signature"


def verify_webhook(secret: Optional[str], signature: Optional[str], body: Union[bytes, bytearray, memoryview],
                   tolerance: float = DEFAULT_WEBHOOK_TOLERANCE,
                   now: Union[None, float, datetime] = None) -> dict:
    """Checks a delivery's ``Ratchet-Signature`` header (``signature``) over
    its raw ``body`` with the subscription's ``secret``, refuses a signed
    time more than ``tolerance`` seconds (5 minutes; the default too when 0
    or less) from ``now`` (the clock when None; seconds since 1970 or an
    aware datetime: a naive one, such as ``datetime.utcnow()``'s, raises
    ValueError, as every datetime the SDK takes), and returns the decoded event:
    ``{"id", "type", "created_at", "workspace_id", "subject_id", "data"}``.

    ``body`` must be the bytes received, unmodified: a ``str`` is refused
    (TypeError), as decoding and encoding it again may change the bytes
    signed. A header with several ``v1`` (a rotation's) verifies when any
    of them does.

    Raises WebhookSignatureError for a delivery whose signature is missing,
    malformed, wrong or outside the tolerance (answer it 401), and
    NoWebhookSecretError when ``secret`` is empty or None (nothing is
    accepted with no key; a misconfiguration, not a forgery). A verified
    body that is not a JSON object raises ValueError.
    """
    if isinstance(body, str):
        raise TypeError("ratchet: verify_webhook takes the body as the bytes received, not str "
                        "(decoding and encoding it again may change what was signed)")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"ratchet: verify_webhook takes the body as bytes, not {type(body).__name__}")
    if secret is not None and not isinstance(secret, str):
        raise TypeError(f"ratchet: verify_webhook takes the secret as str, not {type(secret).__name__}")
    if signature is not None and not isinstance(signature, str):
        raise TypeError(f"ratchet: verify_webhook takes the signature header as str, not {type(signature).__name__}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or math.isnan(tolerance):
        raise TypeError("ratchet: verify_webhook's tolerance is a number of seconds")
    if now is None:
        now_s = time.time()
    elif isinstance(now, datetime):
        # datetime.timestamp() reads a naive datetime as local time (off a
        # UTC machine datetime.utcnow() was hours off, every delivery refused
        # as signed hours ago or ahead), and reading it as UTC would guess
        # wrong for datetime.now(): refused, as everywhere in the SDK.
        now_s = aware(now, "verify_webhook's now").timestamp()
    elif isinstance(now, (int, float)) and not isinstance(now, bool) and math.isfinite(now):
        now_s = now
    else:
        raise TypeError("ratchet: verify_webhook's now is seconds since 1970 or a datetime")

    if not secret:
        raise NoWebhookSecretError()
    if tolerance <= 0:
        tolerance = DEFAULT_WEBHOOK_TOLERANCE
    signature = signature or ""
    # Bounded as the Go SDK bounds it: by its UTF-8 length.
    if len(signature) > _MAX_SIGNATURE_HEADER or len(signature.encode("utf-8", "surrogatepass")) > _MAX_SIGNATURE_HEADER:
        raise WebhookSignatureError(_MALFORMED)
    ts: str = ""
    signed: list = []
    for part in signature.split(","):
        key, eq, value = part.strip(_SPACE).partition("=")
        if not eq:
            raise WebhookSignatureError(_MALFORMED)
        if key == "t":
            if ts != "":
                raise WebhookSignatureError(_MALFORMED)  # two times: which one was signed is ambiguous
            ts = value
        elif key == "v1":
            if not _HEX.fullmatch(value) or len(signed) == _MAX_SIGNATURES:
                raise WebhookSignatureError(_MALFORMED)
            signed.append(bytes.fromhex(value))
    if not _DECIMAL.fullmatch(ts) or not signed:
        raise WebhookSignatureError(_MALFORMED)
    unix = int(ts)
    if not _INT64_MIN <= unix <= _INT64_MAX:
        raise WebhookSignatureError(_MALFORMED)
    now_unix = math.floor(now_s)
    if unix > now_unix + _FAR_SECONDS or unix < now_unix - _FAR_SECONDS:
        raise WebhookSignatureError("its timestamp is not a time near now (seconds since 1970)")
    age = now_s - unix
    if age > tolerance:
        raise WebhookSignatureError(f"signed {_go_duration(_round_seconds(age))} ago, beyond {_go_duration(tolerance)}")
    if age < -tolerance:
        raise WebhookSignatureError(f"signed {_go_duration(_round_seconds(-age))} in the future, "
                                    f"beyond {_go_duration(tolerance)}")
    want = hmac.new(_secret_bytes(secret), ts.encode("ascii") + b"." + bytes(body), hashlib.sha256).digest()
    for mac in signed:
        if hmac.compare_digest(mac, want):
            return _decode_event(bytes(body))
    raise WebhookSignatureError("no v1 signature matches")


def _secret_bytes(secret: str) -> bytes:
    """The secret's bytes: UTF-8, and a value read from the environment
    whose bytes were not UTF-8 gets those bytes back (os.fsencode's way)."""
    try:
        return secret.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return secret.encode("utf-8", "surrogatepass")


def _decode_event(body: bytes) -> dict:
    """The event a verified body carries: a JSON object, read as the Go SDK
    reads it (no NaN or Infinity, no byte-order mark; bytes that are not
    UTF-8 read as U+FFFD)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")
    try:
        event = json.loads(body.decode("utf-8", "replace"), parse_constant=refuse)
    except ValueError as error:  # JSONDecodeError included
        raise ValueError(f"ratchet: decode webhook event: {error}") from error
    if not isinstance(event, dict):
        raise ValueError(f"ratchet: decode webhook event: a JSON {type(event).__name__}, not an object")
    return event


def _round_seconds(seconds: float) -> int:
    """seconds to the nearest whole second, halves away from zero (Go's
    Duration.Round(time.Second))."""
    return math.floor(seconds + 0.5) if seconds >= 0 else -math.floor(-seconds + 0.5)


def _go_duration(seconds: float) -> str:
    """seconds as Go's time.Duration prints it ("6m40s", "5m0s", "1.5s",
    "500ms"), so that the SDKs word a refusal alike."""
    if math.isinf(seconds):
        return "forever"
    ns = round(seconds * 1_000_000_000)
    if ns == 0:
        return "0s"
    sign, u = ("-", -ns) if ns < 0 else ("", ns)

    def fixed(value: int, digits: int) -> str:
        whole, frac = divmod(value, 10 ** digits)
        frac_s = str(frac).rjust(digits, "0").rstrip("0")
        return f"{whole}.{frac_s}" if frac_s else str(whole)

    if u < 1_000_000_000:
        if u < 1_000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            return f"{sign}{fixed(u, 3)}µs"
        return f"{sign}{fixed(u, 6)}ms"
    minutes, rest = divmod(u, 60 * 1_000_000_000)
    out = fixed(rest, 9) + "s"
    if minutes:
        hours, minutes = divmod(minutes, 60)
        out = f"{minutes}m" + out
        if hours:
            out = f"{hours}h" + out
    return sign + out

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
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, cast

from ._time import aware
from .errors import NoWebhookSecretError, WebhookSignatureError
from .types import WebhookEvent

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
# The white space read off the ends of a secret: ASCII's, none of which a
# secret the server makes holds (whsec_ and hex digits).
_SECRET_SPACE = "\t\n\v\f\r "
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")

_MALFORMED = "malformed Ratchet-Signature"


def verify_webhook(secret: Optional[str], signature: Union[None, str, Sequence[str]], body: Union[bytes, bytearray, memoryview],
                   tolerance: float = DEFAULT_WEBHOOK_TOLERANCE,
                   now: Union[None, float, datetime] = None) -> WebhookEvent:
    """Checks a delivery's ``Ratchet-Signature`` header (``signature``) over
    its raw ``body`` with the subscription's ``secret`` (without the ASCII
    white space around it: one read from a file with its line end
    verifies), refuses a signed time more than ``tolerance`` seconds (5 minutes; the default too when 0
    or less) from ``now`` (the clock when None; seconds since 1970 or an
    aware datetime: a naive one, such as ``datetime.utcnow()``'s, raises
    ValueError, as every datetime the SDK takes), and returns the decoded event:
    ``{"id", "type", "created_at", "workspace_id", "subject_id", "data"}``.

    ``body`` must be the bytes received, unmodified: a ``str`` is refused
    (TypeError), as decoding and encoding it again may change the bytes
    signed. A header with several ``v1`` (a rotation's) verifies when any
    of them does. A header sent as several lines may be given as a list of
    them: it is read joined by commas, as the Go and TypeScript SDKs read
    it (two signatures are two ``t``, refused).

    Raises WebhookSignatureError for a delivery whose signature is missing,
    malformed, wrong or outside the tolerance (answer it 401), and
    NoWebhookSecretError when ``secret`` is empty, white space or None (nothing is
    accepted with no key; a misconfiguration, not a forgery). A verified
    body that is not an event as the three SDKs read one, strictly (one
    JSON object in UTF-8, no name twice, no number beyond float64, nesting
    at most 64 levels, the event's fields typed: _decode_event), raises
    ValueError.
    """
    if isinstance(body, str):
        raise TypeError("ratchet: verify_webhook takes the body as the bytes received, not str "
                        "(decoding and encoding it again may change what was signed)")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"ratchet: verify_webhook takes the body as bytes, not {type(body).__name__}")
    if secret is not None and not isinstance(secret, str):
        raise TypeError(f"ratchet: verify_webhook takes the secret as str, not {type(secret).__name__}")
    # A header given as its lines (a framework's repeated header:
    # request.headers.getlist, aiohttp's getall) is read joined, as Node
    # joins a repeated header and the Go and TypeScript SDKs read it: two
    # signatures are two t, refused as ambiguous.
    if isinstance(signature, (list, tuple)) and all(isinstance(line, str) for line in signature):
        signature = ",".join(signature)
    if signature is not None and not isinstance(signature, str):
        raise TypeError(f"ratchet: verify_webhook takes the signature header as str (or a list of its lines), "
                        f"not {type(signature).__name__}")
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

    # A secret read from a file with its line end, or pasted with spaces
    # around it, verified no delivery at all: its ASCII white space is not
    # the secret's (none is in one the server makes: whsec_ and hex digits),
    # as in the Go and TypeScript SDKs.
    if secret:
        secret = secret.strip(_SECRET_SPACE)
    if not secret:
        raise NoWebhookSecretError()
    if tolerance <= 0:
        tolerance = DEFAULT_WEBHOOK_TOLERANCE
    signature = signature or ""
    # Bounded as the Go SDK bounds it: by its UTF-8 length.
    if len(signature) > _MAX_SIGNATURE_HEADER or len(signature.encode("utf-8", "surrogatepass")) > _MAX_SIGNATURE_HEADER:
        raise WebhookSignatureError(_MALFORMED)
    ts: str = ""
    signed: List[bytes] = []
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
            return cast(WebhookEvent, _decode_event(bytes(body)))
    raise WebhookSignatureError("no v1 signature matches")


def _secret_bytes(secret: str) -> bytes:
    """The secret's bytes: UTF-8, and a value read from the environment
    whose bytes were not UTF-8 gets those bytes back (os.fsencode's way)."""
    try:
        return secret.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return secret.encode("utf-8", "surrogatepass")


# The body of a delivery is read alike by the three SDKs (the shared vectors
# in sdk/webhook_vectors.json hold them to it), and strictly: the server
# sends an event as Go's encoding/json writes it, so anything odd is no event
# of Ratchet's. A body is one JSON object in UTF-8 (no byte-order mark; JSON
# whitespace around it), nesting at most _MAX_NESTING levels, with no name
# twice in any object, no number beyond float64 and no lone UTF-16 surrogate
# escape; id, type, workspace_id and subject_id are strings (or null),
# created_at an RFC 3339 time (or null) as _RFC3339 reads it.

# How deep arrays and objects nest in an event (the event object is the
# first level): an event carries ids and states, and the json module
# recurses once a level (RecursionError, not ValueError, past about 1 000).
_MAX_NESTING = 64
_STRING_FIELDS = ("id", "type", "workspace_id", "subject_id")
# RFC 3339 as the server writes it: upper-case T and Z, at most nine
# fraction digits (the fields' ranges are checked apart).
_RFC3339 = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
                      r"(Z|[+-]([0-9]{2}):([0-9]{2}))")
_FLOAT_MAX = float.fromhex("0x1.fffffffffffffp+1023")


def _decode_event(body: bytes) -> Dict[str, Any]:
    """The event a verified body carries, read by the shared rules above."""
    try:
        event = _strict_loads(body)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError included
        raise ValueError(f"ratchet: decode webhook event: {error}") from error
    if not isinstance(event, dict):
        raise ValueError(f"ratchet: decode webhook event: a JSON {type(event).__name__}, not an object")
    for name in _STRING_FIELDS:
        if event.get(name) is not None and not isinstance(event[name], str):
            raise ValueError(f'ratchet: decode webhook event: "{name}" is not a string')
    created = event.get("created_at")
    if created is not None and not (isinstance(created, str) and _valid_time(created)):
        raise ValueError('ratchet: decode webhook event: "created_at" is not an RFC 3339 time')
    return event


def _strict_loads(body: bytes) -> Any:
    text = body.decode("utf-8")  # strict: bytes that are not UTF-8 raise
    _scan_text(text)

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    def number(literal: str) -> Any:
        # float() of an integer literal too long for float64 is inf, as
        # of 1e400: both refused, as by the other SDKs.
        if abs(float(literal)) > _FLOAT_MAX:
            raise ValueError(f"the number {literal[:20]}… is beyond float64")
        return float(literal) if any(c in literal for c in ".eE") else int(literal)

    def members(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for name, value in pairs:
            if name in out:
                raise ValueError(f"the name {json.dumps(name)} twice in one object")
            out[name] = value
        return out

    return json.loads(text, parse_constant=refuse, parse_float=number, parse_int=number, object_pairs_hook=members)


def _scan_text(text: str) -> None:
    """Bounds the nesting, and refuses a \\u escape of a lone UTF-16
    surrogate (no character: Go reads it as U+FFFD). Syntax is json's."""
    depth, in_string, i, n = 0, False, 0, len(text)
    while i < n:
        c = text[i]
        if in_string:
            if c == '"':
                in_string = False
            elif c == "\\" and i + 1 < n:
                i += 1
                if text[i] == "u":
                    unit = _hex4(text, i + 1)
                    if unit is not None:
                        i += 4
                        if 0xD800 <= unit < 0xDC00:
                            low = _hex4(text, i + 3) if text[i + 1:i + 3] == "\\u" else None
                            if low is None or not 0xDC00 <= low < 0xE000:
                                raise ValueError("a lone surrogate escape")
                            i += 6
                        elif 0xDC00 <= unit < 0xE000:
                            raise ValueError("a lone surrogate escape")
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
            if depth > _MAX_NESTING:
                raise ValueError(f"nests deeper than {_MAX_NESTING} levels")
        elif c in "}]":
            depth -= 1
        i += 1


def _hex4(text: str, i: int) -> Optional[int]:
    digits = text[i:i + 4]
    if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return int(digits, 16)
    return None


def _valid_time(value: str) -> bool:
    """Whether value is an RFC 3339 time as _RFC3339 says, its fields in
    range and its date one of the calendar's."""
    m = _RFC3339.fullmatch(value)
    if m is None:
        return False
    year, month, day, hour, minute, second = (int(m.group(k)) for k in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day and hour <= 23 and minute <= 59 and second <= 59):
        return False
    if m.group(8) != "Z" and (int(m.group(9)) > 23 or int(m.group(10)) > 59):
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return day <= (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]


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

"""The one rule the SDK has for a datetime it is given: it must be aware.

A naive datetime names no zone: datetime.now() gives the machine's local
time, datetime.utcnow() UTC, and nothing tells them apart. Reading one as
UTC (as verify_webhook did) or refusing it (as reconcile did) were two
answers to one question; both now refuse it, before anything is sent or
checked, rather than guess a window or a clock hours off.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Optional


def aware(value: datetime, name: str) -> datetime:
    """value when it names its zone; ValueError naming the argument when
    it is naive."""
    if value.utcoffset() is None:
        raise ValueError(f"ratchet: {name} must be an aware datetime: a naive one names no zone "
                         "(use datetime.now(timezone.utc), not datetime.utcnow())")
    return value


def parse_time(timestamp: Any) -> Optional[datetime]:
    """An RFC 3339 timestamp of the server's, or None when it does not parse."""
    match = RFC3339.match(str(timestamp or ""))
    if not match:
        return None
    whole, fraction, zone = match.groups()
    zone = "+00:00" if zone in ("Z", "z") else zone
    # Python 3.10's fromisoformat takes exactly three or six fractional
    # digits; the server writes up to nine, trailing zeros trimmed.
    digits = (fraction or ".")[1:7].ljust(6, "0")
    try:
        return datetime.fromisoformat(f"{whole}.{digits}{zone}")
    except ValueError:
        return None


def lease_seconds(expires: Any, date: Optional[datetime]) -> float:
    """A lease's length by the server's clock: its expiry less the
    answer's Date (whole seconds, so less a second), or by this process's
    clock without one; 0 when unknown."""
    end = parse_time(expires)
    if end is None:
        return 0.0
    if date is None:
        return max((end - datetime.now(timezone.utc)).total_seconds(), 0.0)
    return max((end - date).total_seconds() - 1.0, 0.0)


RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

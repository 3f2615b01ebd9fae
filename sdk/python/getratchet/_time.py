"""The one rule the SDK has for a datetime it is given: it must be aware.

A naive datetime names no zone: datetime.now() gives the machine's local
time, datetime.utcnow() UTC, and nothing tells them apart. Reading one as
UTC (as verify_webhook did) or refusing it (as reconcile did) were two
answers to one question; both now refuse it, before anything is sent or
checked, rather than guess a window or a clock hours off.
"""

from __future__ import annotations

from datetime import datetime


def aware(value: datetime, name: str) -> datetime:
    """value when it names its zone; ValueError naming the argument when
    it is naive."""
    if value.utcoffset() is None:
        raise ValueError(f"ratchet: {name} must be an aware datetime: a naive one names no zone "
                         "(use datetime.now(timezone.utc), not datetime.utcnow())")
    return value

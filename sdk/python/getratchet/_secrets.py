"""Answers that carry a secret, printed with it masked."""

from typing import Any

# The fields of an answer that hold a credential: a begin's or a claimed
# job's lease token, a minted key's or a webhook's signing secret.
_SECRET_FIELDS = frozenset({"secret", "lease_token", "leaseToken"})


class SecretAnswer(dict):  # type: ignore[type-arg]
    """An answer that carries a secret: the plain dict the API's JSON
    decodes to (its fields read, compare and json.dumps as any other's),
    whose repr and str (print, logging, an f-string, pprint) show
    "[redacted]" in place of its secret, so that logging it whole does not
    write the credential. Read the field to use it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr({k: "[redacted]" if k in _SECRET_FIELDS and v else v for k, v in self.items()})

    __str__ = __repr__


def hide_secrets(answer: Any) -> Any:
    """answer as a SecretAnswer when it is a dict (anything else as it is)."""
    return SecretAnswer(answer) if isinstance(answer, dict) else answer

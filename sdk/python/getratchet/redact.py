"""The form of an error message that may leave the worker's process."""

from __future__ import annotations

import re
import unicodedata

# Bounds the error message a worker sends to the API, in UTF-8 bytes.
MAX_ERROR_MESSAGE_BYTES = 500
# How much of a message is looked at: Python's regular expressions
# backtrack (the Go SDK's RE2 does not), and the secret-name pattern is
# quadratic in a long run of name characters (30 kB took 45 s, holding the
# GIL). A thousand characters take a few milliseconds and still fill the
# 500 bytes that are sent.
_MAX_SCANNED_CHARS = 1000
# The white space before the last word (any white space: a newline or a tab
# separates a secret as well as a space does).
_LAST_WORD = re.compile(r"\s\S*$")

# Combining marks (and the scripts written with them) for the e-mail
# pattern's class, where Python's \w has no \p{M}.
_MARKS = ("\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06ed"
          "\u0900-\u0dff\u0e00-\u0eff\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f")


def _ascii(pattern: str) -> "re.Pattern[str]":
    # ASCII classes (\w, \s, \b), as in the Go SDK's RE2 patterns.
    return re.compile(pattern, re.ASCII)


# What commonly leaks into error text: credentials, e-mail addresses, URL
# query strings, long tokens and long digit runs (card or phone numbers).
# Specific patterns run before generic ones. The same list as the Go SDK's.
_REDACTIONS = [
    # An Authorization header's whole value, whatever its scheme.
    (_ascii(r"(?i)\b((?:proxy-)?authorization)(\\?[\"']?\s*[=:]\s*)[^\r\n,;]+"), r"\1\2[redacted]"),
    (_ascii(r"(?i)\b(bearer|basic|token|apikey|digest)\s+[^\s,;]+"), r"\1 [redacted]"),
    # A name containing a secret's word (client_secret, access_token,
    # AWS_SECRET_ACCESS_KEY), also as JSON quoted inside a message.
    (_ascii(r"(?i)\b([\w.-]*(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|private[_-]?key"
                r"|access[_-]?key|credential|cookie)[\w.-]*)(\\?[\"']?\s*[=:]\s*)"
                r"(\\\"(?:[^\"\\]|\\[^\"])*\\\"|\"[^\"]*\"|'[^']*'|[^\s,;&]+)"), r"\1\2[redacted]"),
    (_ascii(r"://[^/\s:@]+:[^/\s@]+@"), "://[redacted]@"),
    (_ascii(r"\?[^\s\"']+"), "?[redacted]"),
    # An e-mail address in any script, also URL-encoded in a path: Unicode
    # word characters (unlike the patterns around it) and the combining
    # marks \w leaves out, which Go's and JavaScript's \p{M} hold (review:
    # नमस्ते@example.in and a decomposed é got through): the combining blocks
    # and the Indic, Sinhala, Thai and Lao blocks whole. One class, not an
    # alternation, so a long run without an @ is scanned in linear time.
    (re.compile(r"[\w.%+\-" + _MARKS + r"]+(?:@|%40)[\w\-" + _MARKS + r"]+(?:\.[\w\-" + _MARKS + r"]+)+"),
     "[email]"),
    # Credentials known by their form: Stripe-style keys, GitHub, Slack,
    # AWS access key ids, Google API keys, JWTs.
    (_ascii(r"(^|[^A-Za-z0-9])(?:(?:sk|rk|pk)_(?:live|test)_|whsec_|gh[pousr]_|xox[abposr]-|ya29\.)[A-Za-z0-9_\-]+"),
     r"\1[redacted]"),
    (_ascii(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bAIza[0-9A-Za-z_\-]{20,}"), "[redacted]"),
    (_ascii(r"\beyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]*)?"), "[redacted]"),
    (_ascii(r"[A-Za-z0-9_\-+/=]{32,}"), "[redacted]"),
    (_ascii(r"\(?\d[\d \-().]{7,}\d"), "[number]"),
]


def redact_message(message: str) -> str:
    """Control characters flattened, likely secrets and personal data
    masked, at most MAX_ERROR_MESSAGE_BYTES of UTF-8. Workers apply it to
    every error message they report; use it for your own logs too."""
    cut = len(message) > _MAX_SCANNED_CHARS
    if cut:
        message = message[:_MAX_SCANNED_CHARS]
        # Drop the word the cut went through, so no fragment of a secret
        # too short for the patterns to recognise is left at the end.
        last_space = _LAST_WORD.search(message)
        if last_space and last_space.start() > 0:
            message = message[:last_space.start()]
    # Control characters, lone surrogates and U+FFFD (to the Go SDK, the
    # last two are invalid UTF-8, and an invalid byte reads as U+FFFD)
    # become spaces.
    message = "".join(" " if ch == "\ufffd" or unicodedata.category(ch) in ("Cc", "Cs") else ch for ch in message)
    for pattern, replacement in _REDACTIONS:
        message = pattern.sub(replacement, message)
    message = " ".join(message.split())
    encoded = message.encode("utf-8")
    if cut or len(encoded) > MAX_ERROR_MESSAGE_BYTES:
        ellipsis = "…"
        kept = encoded[:MAX_ERROR_MESSAGE_BYTES - len(ellipsis.encode("utf-8"))]
        message = kept.decode("utf-8", errors="ignore") + ellipsis
    return message or "error"

"""JSON read and written as the json module does, at any depth.

The API takes values nested up to 10 000 levels (a job's input, an
effect's payload and result, a step's output), and a claim answer carries
an input three levels further down. The json module's reader and writer
recurse once a level: they raise RecursionError past about the interpreter's
recursion limit (1 000 by default; on Python 3.12 and later the C stack's
own, which no setting moves), so one deep input made a whole claim answer
unreadable (its jobs lapsed unrun and came back on every claim) and a deep
output unsendable. loads and dumps are json.loads and json.dumps where
those answer, and on their RecursionError the same reading and writing done
with a list for a stack instead of the call stack: the same values (ints of
any size, floats, escapes, the last of a repeated key at the first one's
place) and the same text, byte for byte. Nothing global (the recursion
limit) is touched.
"""

from __future__ import annotations

import json
import json.decoder
import json.encoder
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

# The json module's own string reader and writer (the C ones where built):
# typeshed leaves them out, so their types are stated here.
scanstring: Callable[[str, int, bool], Tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
encode_basestring_ascii: Callable[[str], str] = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]

# json.scanner.NUMBER_RE with ASCII digits only, as the C scanner (the one
# json.loads uses) reads them: Python's \d takes other scripts' digits too.
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_INFINITY = float("inf")


def loads(data: Any) -> Any:
    """json.loads(data), at any depth."""
    try:
        return json.loads(data)
    except RecursionError:
        pass  # read again below, out of this handler (its stack unwound)
    return _loads(data)


def dumps(value: Any, *, separators: Optional[Tuple[str, str]] = None, allow_nan: bool = False) -> str:
    """json.dumps(value, separators=separators, allow_nan=allow_nan), at any
    depth."""
    try:
        return json.dumps(value, separators=separators, allow_nan=allow_nan)
    except RecursionError:
        pass
    item_separator, key_separator = separators if separators is not None else (", ", ": ")
    return _dumps(value, item_separator, key_separator, allow_nan)


def _loads(data: Any) -> Any:
    # As json.loads: bytes in the encoding they are in, and a str that
    # begins with a byte order mark refused.
    if isinstance(data, (bytes, bytearray)):
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    elif not isinstance(data, str):
        raise TypeError(f"the JSON object must be str, bytes or bytearray, not {data.__class__.__name__}")
    elif data.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    value, end = _parse(data, _skip(data, 0))
    end = _skip(data, end)
    if end != len(data):
        raise json.JSONDecodeError("Extra data", data, end)
    return value


def _parse(s: str, idx: int) -> Tuple[Any, int]:
    """The value at s[idx] and where it ends, as the C scanner reads it;
    the arrays and objects being read are on stack, each with the key its
    next member goes under."""
    stack: List[List[Any]] = []  # [container, key]
    while True:
        # A value begins at idx.
        c = s[idx:idx + 1]
        if c == "{":
            idx = _skip(s, idx + 1)
            c = s[idx:idx + 1]
            if c == "}":
                value: Any = {}
                idx += 1
            elif c == '"':
                key, idx = scanstring(s, idx + 1, True)
                idx = _colon(s, idx)
                stack.append([{}, key])
                continue
            else:
                raise json.JSONDecodeError("Expecting property name enclosed in double quotes", s, idx)
        elif c == "[":
            idx = _skip(s, idx + 1)
            if s[idx:idx + 1] == "]":
                value = []
                idx += 1
            else:
                stack.append([[], None])
                continue
        elif c == '"':
            value, idx = scanstring(s, idx + 1, True)
        elif c == "n" and s[idx:idx + 4] == "null":
            value, idx = None, idx + 4
        elif c == "t" and s[idx:idx + 4] == "true":
            value, idx = True, idx + 4
        elif c == "f" and s[idx:idx + 5] == "false":
            value, idx = False, idx + 5
        else:
            m = _NUMBER.match(s, idx)
            if m is not None:
                integer, frac, exp = m.groups()
                value = float(integer + (frac or "") + (exp or "")) if frac or exp else int(integer)
                idx = m.end()
            elif c == "N" and s[idx:idx + 3] == "NaN":
                value, idx = _CONSTANTS["NaN"], idx + 3
            elif c == "I" and s[idx:idx + 8] == "Infinity":
                value, idx = _CONSTANTS["Infinity"], idx + 8
            elif c == "-" and s[idx:idx + 9] == "-Infinity":
                value, idx = _CONSTANTS["-Infinity"], idx + 9
            else:
                raise json.JSONDecodeError("Expecting value", s, idx)
        # A value ended at idx: it goes into the container being read, which
        # then takes its next member, or ends (and is itself the value).
        while True:
            if not stack:
                return value, idx
            frame = stack[-1]
            container = frame[0]
            if frame[1] is None:
                container.append(value)
            else:
                container[frame[1]] = value
            idx = _skip(s, idx)
            c = s[idx:idx + 1]
            if c == ",":
                idx = _skip(s, idx + 1)
                if frame[1] is not None:
                    if s[idx:idx + 1] != '"':
                        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", s, idx)
                    frame[1], idx = scanstring(s, idx + 1, True)
                    idx = _colon(s, idx)
                break
            if c != ("]" if frame[1] is None else "}"):
                raise json.JSONDecodeError("Expecting ',' delimiter", s, idx)
            stack.pop()
            value = container
            idx += 1


def _skip(s: str, idx: int) -> int:
    """Where the whitespace at s[idx] ends."""
    m = _WHITESPACE.match(s, idx)
    assert m is not None  # [ \t\n\r]* matches at any index, if only ""
    return m.end()


def _colon(s: str, idx: int) -> int:
    """Where the member's value begins, after the ':' following its key."""
    idx = _skip(s, idx)
    if s[idx:idx + 1] != ":":
        raise json.JSONDecodeError("Expecting ':' delimiter", s, idx)
    return _skip(s, idx + 1)


def _float(value: float, allow_nan: bool) -> str:
    if value != value:
        text = "NaN"
    elif value == _INFINITY:
        text = "Infinity"
    elif value == -_INFINITY:
        text = "-Infinity"
    else:
        return float.__repr__(value)
    if not allow_nan:
        raise ValueError("Out of range float values are not JSON compliant: " + repr(value))
    return text


def _key(key: Any, allow_nan: bool) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return _float(key, allow_nan)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


def _dumps(value: Any, item_separator: str, key_separator: str, allow_nan: bool) -> str:
    """json.dumps's text (ensure_ascii, no indent, check_circular), written
    with the lists and objects being written on a stack of their
    iterators."""
    out: List[str] = []
    markers: Dict[int, Any] = {}  # ids of the containers being written: a cycle
    stack: List[List[Any]] = []  # [iterator, is_object, marker, first]
    while True:
        # Write value.
        if isinstance(value, str):
            out.append(encode_basestring_ascii(value))
        elif value is None:
            out.append("null")
        elif value is True:
            out.append("true")
        elif value is False:
            out.append("false")
        elif isinstance(value, int):
            out.append(int.__repr__(value))
        elif isinstance(value, float):
            out.append(_float(value, allow_nan))
        elif isinstance(value, (list, tuple, dict)):
            is_object = isinstance(value, dict)
            if not value:
                out.append("{}" if is_object else "[]")
            else:
                marker = id(value)
                if marker in markers:
                    raise ValueError("Circular reference detected")
                markers[marker] = value
                out.append("{" if is_object else "[")
                stack.append([iter(value.items()) if isinstance(value, dict) else iter(value), is_object, marker, True])
        else:
            raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")
        # The next value to write, closing the containers it ends.
        while stack:
            frame = stack[-1]
            try:
                item = next(frame[0])
            except StopIteration:
                out.append("}" if frame[1] else "]")
                del markers[frame[2]]
                stack.pop()
                continue
            if not frame[3]:
                out.append(item_separator)
            frame[3] = False
            if frame[1]:
                key, value = item
                out.append(encode_basestring_ascii(_key(key, allow_nan)))
                out.append(key_separator)
            else:
                value = item
            break
        else:
            return "".join(out)

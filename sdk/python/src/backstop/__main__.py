"""python -m backstop decide --policy FILE|PRESET

Failures in (JSON lines, the vector `input` shape), decisions out (one JSON
line each, in order: {"action","delay_ms","reason","class"} or {"error"}),
like the Go `backstop decide` command: for the same input, every host's
command writes the same bytes (testdata/vectors/README.md, "Input lines").
Every input line gets exactly one output line. A line without random (or
with null) gets a uniform draw in [0, 1) (jitter scales the delay by it; 0
would make every delay of full jitter 0); --random X gives such a line X
instead, so the output depends on the input only. An absent now_ms is 0, as
in the vectors. A line's duration_ms (how long the call took) is recorded
before its failure is decided, for a slow-call-rate breaker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
from itertools import accumulate
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

from ._errors import BackstopError, InputError, PolicyError
from ._host import abi as _abi
from ._host._contract import FIELDS as _CONTRACT_FIELDS
from ._host.abi import well_formed as _well_formed
from ._policy import Policy, load_policy

# duration_ms: the line's own member (the call's duration), not a failure field.
_FIELDS = frozenset([f.name for f in _CONTRACT_FIELDS] + ["duration_ms"])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backstop", description="backstop's retry policy.")
    sub = parser.add_subparsers(dest="command", required=True)
    dec = sub.add_parser("decide", help="read failures as JSON lines on stdin, write decisions as JSON lines")
    dec.add_argument("--policy", default="default", help="policy file (JSON or YAML) or preset name")
    dec.add_argument("--random", default="draw", type=_absent_random, metavar="draw|X",
                     help="the random of a line that sets none: draw (a uniform draw in [0, 1) per line) or a number in [0, 1)")
    args = parser.parse_args(argv)
    global _absent_random_value
    _absent_random_value = args.random

    # A file wins over a preset of the same name, as in the Go command.
    src = Path(args.policy)
    try:
        policy = load_policy(src if src.is_file() else args.policy)
    except PolicyError as e:
        what = "" if src.is_file() else " (no such file, and not a valid preset or policy text)"
        print("backstop: %s%s: %s" % (args.policy, what, e), file=sys.stderr)
        return 1
    try:
        _decide_stream(policy, sys.stdin.buffer, sys.stdout.buffer)
    except BrokenPipeError:  # the reader went away
        sys.stderr.close()
    return 0


def _absent_random(flag: str) -> Callable[[], float]:
    if flag == "draw":
        return random.random
    try:
        r = float(flag) if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", flag) else math.nan
    except ValueError:
        r = math.nan
    if not 0 <= r < 1:
        raise argparse.ArgumentTypeError("must be draw or a number in [0, 1), got %s" % json.dumps(flag))
    return lambda: r


# What a line without random gets (--random).
_absent_random_value: Callable[[], float] = random.random

# The limits of a line (internal/vector/line.go).
_MAX_LINE_BYTES = 4 << 20
_MAX_DEPTH = 32
_MAX_NUMBER_CHARS = 32


def _decide_stream(policy: Policy, stdin: BinaryIO, stdout: BinaryIO) -> None:
    # Every input line gets exactly one output line, in order: a blank,
    # invalid or overlong one too, and a last line without "\n". Read what
    # is available and answer it, then flush before reading again: a
    # process that writes one line and waits gets its answer, and a long
    # stream is not written line by line.
    fd = stdin.fileno()
    parts: List[bytes] = []  # the current line's pieces; none past the limit
    size = 0
    too_long = False
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        out = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            if end > start:
                size += end - start
                if size > _MAX_LINE_BYTES:
                    too_long, parts = True, []
                elif not too_long:
                    parts.append(chunk[start:end])
            if nl < 0:
                break
            out.append(_answer(policy, b"".join(parts), too_long))
            parts, size, too_long = [], 0, False
            start = nl + 1
        if out:
            stdout.write(b"".join(out))
            stdout.flush()
    if size or too_long:
        stdout.write(_answer(policy, b"".join(parts), too_long))
    stdout.flush()


def _answer(policy: Policy, line: bytes, too_long: bool = False) -> bytes:
    """The answer line to one input line (its bytes without the "\n")."""
    return _line(_answer_of(policy, line, too_long))


def _bad(reason: str) -> Dict[str, Any]:
    return {"error": "invalid input line: " + reason}


def _answer_of(policy: Policy, line: bytes, too_long: bool) -> Dict[str, Any]:
    if too_long:
        return _bad("longer than %d bytes" % _MAX_LINE_BYTES)
    if not line.strip(b" \t\r"):
        return _bad("empty")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return _bad("not UTF-8")
    depth, long_number = _scan(text)
    if depth > _MAX_DEPTH:
        return _bad("nested deeper than %d levels" % _MAX_DEPTH)
    if long_number:
        return _bad("a number longer than %d characters" % _MAX_NUMBER_CHARS)
    try:
        obj = json.loads(text, parse_constant=_not_json)
    except ValueError:
        return _bad("not valid JSON")
    if not isinstance(obj, dict):
        return _bad("expected a JSON object")
    unknown = [_well_formed(k) for k in obj if k not in _FIELDS]
    if unknown:
        return {"error": "%s: unknown field" % min(unknown)}
    # duration_ms is the line's, not the failure's: how long the call took,
    # recorded (at a valid now_ms) before the failure is decided, as a loop
    # does (internal/vector/line.go, DecodeCallLine).
    duration = obj.pop("duration_ms", None)
    if obj.get("random") is None:
        obj["random"] = _absent_random_value()
    if obj.get("now_ms") is None:
        obj["now_ms"] = 0
    try:
        if duration is not None:
            ms = _abi.int64("duration_ms", duration, False)
            if ms < 0:
                raise InputError("duration_ms", "must be >= 0 (got %d)" % ms)
            try:
                now = _abi.int64("now_ms", obj["now_ms"], True)
            except BackstopError:
                now = None  # the failure's error says so
            if now is not None:
                policy.record_duration(ms, now)
        return policy.decide(obj).to_dict()
    except BackstopError as e:  # InputError: "field: reason", as Go prints it
        return {"error": str(e)}


def _not_json(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)  # NaN, Infinity, -Infinity


# A string (to the next unescaped '"', or the end), or the text between.
_STRING = re.compile(r'"[^"\\]*(?:\\[\s\S]?[^"\\]*)*(?:"|\Z)')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_LONG_NUMBER = re.compile(r"[-+.eE0-9]{%d}" % (_MAX_NUMBER_CHARS + 1))
_DEPTH = {"[": 1, "{": 1, "]": -1, "}": -1}


def _scan(text: str) -> Tuple[int, bool]:
    """The deepest nesting of brackets outside strings, and whether a run of
    number characters outside strings is longer than _MAX_NUMBER_CHARS. A
    string runs from '"' to the next '"' not escaped by '\\'; an
    unterminated one to the end (internal/vector/line.go, scanLine)."""
    outside = _STRING.sub('""', text) if '"' in text else text
    brackets = _NOT_BRACKETS.sub("", outside)
    depth = max(accumulate(map(_DEPTH.__getitem__, brackets)), default=0) if brackets else 0
    return max(depth, 0), _LONG_NUMBER.search(outside) is not None


def _line(obj: object) -> bytes:
    # As Go's encoder with SetEscapeHTML(false): UTF-8 as is, only U+2028
    # and U+2029 escaped, so outputs compare byte for byte.
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return (s.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") + "\n").encode("utf-8")


if __name__ == "__main__":
    sys.exit(main())

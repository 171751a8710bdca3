"""python -m backstop decide --policy FILE|PRESET

Failures in (JSON lines, the vector `input` shape), decisions out (one JSON
line each, in order: {"action","delay_ms","reason","class"} or {"error"}),
like the Go `backstop decide` command, so the hosts can be compared line for
line. An absent random or now_ms is 0 here, as in the vectors: the output
depends on the input only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import BinaryIO, List, Optional

from ._errors import BackstopError, PolicyError
from ._policy import Policy, load_policy

_FIELDS = ("attempt", "http_status", "grpc_code", "error_kind", "retry_after", "grpc_retry_pushback_ms",
           "method", "idempotency_key", "elapsed_ms", "now_ms", "random", "prev_delay_ms")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backstop", description="backstop's retry policy.")
    sub = parser.add_subparsers(dest="command", required=True)
    dec = sub.add_parser("decide", help="read failures as JSON lines on stdin, write decisions as JSON lines")
    dec.add_argument("--policy", default="default", help="policy file (JSON or YAML) or preset name")
    args = parser.parse_args(argv)

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


def _decide_stream(policy: Policy, stdin: BinaryIO, stdout: BinaryIO) -> None:
    # Read what is available and answer it, then flush before reading again:
    # a process that writes one line and waits gets its answer, and a long
    # stream is not written line by line.
    fd = stdin.fileno()
    rest = b""
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        *lines, rest = (rest + chunk).split(b"\n")
        out = b"".join(_answer(policy, line) for line in lines if line.strip())
        if out:
            stdout.write(out)
            stdout.flush()
    if rest.strip():
        stdout.write(_answer(policy, rest))
    stdout.flush()


def _answer(policy: Policy, line: bytes) -> bytes:
    try:
        obj = json.loads(line)
    except ValueError as e:
        return _line({"error": "invalid input line: %s" % e})
    if not isinstance(obj, dict):
        return _line({"error": "invalid input line: expected a JSON object"})
    unknown = next((k for k in obj if k not in _FIELDS), None)
    if unknown is not None:
        return _line({"error": "invalid input line: unknown field %s" % json.dumps(unknown)})
    obj.setdefault("random", 0)
    obj.setdefault("now_ms", 0)
    try:
        return _line(policy.decide(obj).to_dict())
    except BackstopError as e:  # InputError: "field: reason", as Go prints it
        return _line({"error": str(e)})


def _line(obj: object) -> bytes:
    # As Go's encoder with SetEscapeHTML(false): UTF-8 as is, only U+2028
    # and U+2029 escaped, so outputs compare byte for byte.
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return (s.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") + "\n").encode("utf-8")


if __name__ == "__main__":
    sys.exit(main())

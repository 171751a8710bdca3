"""The ```python blocks of the documentation run as written (issue 13, "Docs
that run").

The blocks of one document run in order in one namespace, as a reader
would paste them, against a real redis-server. The namespace starts with
PRELUDE: what the snippets leave to the reader. A top-level expression
followed by a comment that is a value (``d.action  # ('retry', 2000)``) is
an assertion: the comment must be the value's repr when it shows a class
(``Decision(...)``), else evaluate to an equal value. A block can only be
left out with ``<!-- snippet: skip=why -->`` on the line before its fence.
"""
import ast
import io
import re
import threading
import tokenize
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[3]

# The documents whose blocks must run (internal/integration/docs reads the same list).
FILES = ["README.md", "sdk/node/README.md", "sdk/python/README.md", "queue/redisqueue/README.md", "queue/rabbitmq/README.md"] + sorted(
    "docs/" + p.name for p in (ROOT / "docs").glob("*.md"))

MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->$")


def python_blocks(text: str) -> List[Tuple[int, str, str]]:
    """The ```python blocks of a markdown text: (line, marker, code)."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i].strip())
        if not fence:
            i += 1
            continue
        start = i
        m = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        i += 1
        if fence.group(1) == "python":
            out.append((start + 1, m.group(1) if m else "", "\n".join(body)))
    return out


def value_comments(code: str) -> Dict[int, str]:
    """The trailing comments of a block that are values, by line."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text = tok.string[1:].strip()
        try:
            expr = ast.parse(text, mode="eval").body
        except SyntaxError:
            continue
        if not isinstance(expr, (ast.Name, ast.Attribute)):  # "# ack" is prose
            out[tok.start[0]] = text
    return out


def check_value(where: str, source: str, value: Any, comment: str, ns: Dict[str, Any]) -> None:
    shown = ast.parse(comment, mode="eval").body
    if isinstance(shown, ast.Call) and isinstance(shown.func, ast.Name) and shown.func.id[:1].isupper():
        assert repr(value) == comment, "%s: %s is %s, the document shows %s" % (where, source, repr(value), comment)
        return
    want = eval(compile(comment, where, "eval"), dict(ns, timedelta=timedelta))
    assert value == want, "%s: %s is %r, the document shows %s" % (where, source, value, comment)


def run_block(where: str, code: str, ns: Dict[str, Any]) -> None:
    """Runs a block statement by statement, checking the value comments."""
    comments = value_comments(code)
    tree = ast.parse(code, where)
    for stmt in tree.body:
        comment = comments.get(stmt.end_lineno) if isinstance(stmt, ast.Expr) else None
        if comment is None:
            exec(compile(ast.Module([stmt], []), where, "exec"), ns)
            continue
        value = eval(compile(ast.Expression(stmt.value), where, "eval"), ns)
        check_value("%s+%d" % (where, stmt.lineno), ast.get_source_segment(code, stmt), value, comment, ns)


def prelude(redis_url: str) -> Dict[str, Any]:
    """What the snippets leave to the reader."""
    handled: List[bytes] = []
    stop = threading.Event()
    stop.set()  # q.work returns at once: the loop before it took the job
    return {
        "__name__": "docs",
        "key": "order-42",
        "redis_url": redis_url,
        "log_retry": lambda state: None,
        "handle": handled.append,
        "handle_job": lambda job: handled.append(job.payload),
        "event": stop,
        "handled": handled,
    }


@pytest.mark.parametrize("doc", [f for f in FILES if python_blocks((ROOT / f).read_text())])
def test_python_blocks_run_as_written(doc, redis_server):
    import redis

    r = redis.Redis(port=redis_server.port)
    keys = r.keys("{orders}:*")
    if keys:
        r.delete(*keys)  # the snippets' queue starts empty
    r.close()
    # README.md's blocks are pasteable as is (issue 42): they define what
    # they use, so they run without the prelude.
    ns = {"__name__": "docs"} if doc == "README.md" else prelude("redis://127.0.0.1:%d/0" % redis_server.port)
    postgres = None
    try:
        for line, marker, code in python_blocks((ROOT / doc).read_text()):
            where = "%s:%d" % (doc, line)
            if marker.startswith("skip=") and marker[5:].strip():
                continue
            assert marker == "", "%s: unknown marker <!-- snippet: %s -->: want skip=why" % (where, marker)
            if "database_url" in code and postgres is None:  # a private postgres, for the blocks that use one
                from pgserver import PostgresServer

                postgres = PostgresServer()
                ns["database_url"] = postgres.url
            run_block(where, code, ns)
    finally:
        if postgres is not None:
            postgres.stop()
    if "q" in ns:  # the queue block: its loop ran the job it enqueued, and acked it
        assert ns["handled"] == [b'{"sku": 7}'], "%s: handled %r" % (doc, ns["handled"])
        assert ns["q"].stats().counters.get("attempts:success") == 1, "%s: %r" % (doc, ns["q"].stats())


def test_value_comments_are_assertions():
    ns: Dict[str, Any] = {}
    run_block("t", "x = (1, 'a')\nx  # (1, 'a')\nx  # prose, not a value\nx  # ack", ns)
    with pytest.raises(AssertionError, match=r"x is \(1, 'a'\), the document shows \(2, 'a'\)"):
        run_block("t", "x  # (2, 'a')", ns)
    with pytest.raises(AssertionError, match="the document shows Thing"):
        run_block("t", "x  # Thing(1, 'a')", ns)
    assert python_blocks("<!-- snippet: skip=no -->\n```python\na = 1\n```\n```sh\nb\n```\n") == [(2, "skip=no", "a = 1")]

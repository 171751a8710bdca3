"""python -m backstop decide: the cross-host command."""

import json
import select
import subprocess
import sys

from conftest import load_vectors

CMD = [sys.executable, "-m", "backstop", "decide", "--policy"]


def run(policy, stdin, *flags):
    r = subprocess.run(CMD + [policy, *flags], input=stdin.encode(), capture_output=True, timeout=60)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def expected_line(want):
    if "error" in want:
        want = {"error": want["error"]}  # the vectors also carry "delay_ms": 0
    return json.dumps(want, separators=(",", ":"))


def test_every_stateless_vector(tmp_path):
    for i, g in enumerate(load_vectors()["groups"]):
        if g.get("stateful"):
            continue
        if g.get("preset"):
            policy = g["preset"]
        else:
            policy = str(tmp_path / ("%d.json" % i))
            with open(policy, "w") as f:
                json.dump(g["policy"], f)
        cases = [c for c in g["cases"] if "input" in c]  # decisions: the CLI has no attempt_timeout op
        if not cases:
            continue
        lines = [json.dumps(c["input"]) for c in cases]
        # No final newline: the last line still counts. --random 0: the
        # vectors read an absent random as 0; the command draws one.
        code, out, err = run(policy, "\n".join(lines), "--random", "0")
        assert code == 0, err
        assert out.splitlines() == [expected_line(c["expect"]) for c in cases], g["name"]


def test_bad_lines_do_not_stop_the_stream():
    code, out, _ = run("default", '{"attempt":1,"http_status":503,"random":0}\nnot json\n[1]\n{"attempt":1,"colour":1}\n\n{"attempt":0}\n')
    lines = out.splitlines()
    assert lines[0] == '{"action":"retry","delay_ms":0,"reason":"transient","class":"retryable"}'
    assert lines[1].startswith('{"error":"invalid input line: ')
    assert lines[2] == '{"error":"invalid input line: expected a JSON object"}'
    assert lines[3] == '{"error":"colour: unknown field"}'
    assert lines[4] == '{"error":"invalid input line: empty"}'
    assert lines[5] == '{"error":"attempt: must be >= 1 (got 0)"}'
    assert len(lines) == 6 and code == 0


def test_records_a_lines_duration_before_deciding(tmp_path):
    # Three slow calls that fail permanently, and the fourth, a 503, finds
    # the breaker opened by the slow-call rate (without durations: retry).
    policy = tmp_path / "slow.yaml"
    policy.write_text("circuit_breaker: {type: failure_rate, slow_call_rate_threshold: 50, slow_call_duration_threshold: 100ms, "
                      "sliding_window: {type: count, size: 4}, minimum_calls: 4, open_for: 30s}")
    stdin = "".join('{"attempt":1,"http_status":%d,"now_ms":%d,"duration_ms":%d}\n' % (s, 1000 + i, d)
                    for i, (s, d) in enumerate([(400, 500), (400, 500), (400, -1), (400, 500), (503, 500)]))
    code, out, err = run(str(policy), stdin, "--random", "0")
    lines = out.splitlines()
    assert code == 0, err
    assert lines[2] == '{"error":"duration_ms: must be >= 0 (got -1)"}'
    assert lines[4] == '{"action":"dead_letter","delay_ms":0,"reason":"circuit_open","class":"retryable"}'
    assert len(lines) == 5


def test_bad_policy():
    code, _, err = run("no-such-preset", "")
    assert code == 1 and "no-such-preset" in err


def test_answers_each_line_before_the_next_arrives():
    # A process that writes one line and waits must get its answer.
    p = subprocess.Popen(CMD + ["critical"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        for attempt in (1, 2, 3):
            p.stdin.write(b'{"attempt":%d,"http_status":503,"random":0.5}\n' % attempt)
            p.stdin.flush()
            ready, _, _ = select.select([p.stdout], [], [], 60)  # 60 s only guards against a hang
            assert ready, "no answer"
            assert json.loads(p.stdout.readline())["action"] == ("dead_letter" if attempt == 3 else "retry")
    finally:
        p.stdin.close()
        p.wait(60)

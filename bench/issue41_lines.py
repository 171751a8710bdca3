#!/usr/bin/env python3
"""Issue 41's line count of each SDK's hand-written host and runner code,
two ways (BENCHMARKS.md, "Hand-written host and runner lines"):

(a) the file sets fixed before the work began: `git show 1c562f0:<f> | wc -l`
    against `wc -l <f>`; a generated file (first line "Code generated ...")
    counts 0, a new hand-written file counts;
(b) (a) plus the verbatim lines of that language's contractgen templates: a
    template line with no {{action}} outside every {{range}} is hand-written
    code that only moved into a template. Before, there were no templates.

Run from the repository root: python3 bench/issue41_lines.py [commit]
(commit: count that commit's files instead of the work tree's)."""

import glob
import re
import subprocess
import sys

BEFORE = "1c562f0"
J = "sdk/java/src/main/java/dev/backstop/"
SETS = {
    "Node": (["sdk/node/lib/host/policy.js", "sdk/node/lib/outcome.js", "sdk/node/lib/runner.js", "sdk/node/index.d.ts"],
             "node_*.tmpl"),
    "Python": (["sdk/python/src/backstop/_host/abi.py", "sdk/python/src/backstop/_policy.py",
                "sdk/python/src/backstop/_decide.py", "sdk/python/src/backstop/_decision.py"], "python_*.tmpl"),
    "Java": ([J + f + ".java" for f in ("Failure", "Decision", "ModuleInstance", "Policy", "PolicyRuntime", "FailureReader")],
             "java_*.tmpl"),
}


def text(path, commit):
    if commit is None:
        try:
            return open(path, encoding="utf-8").read()
        except FileNotFoundError:
            return ""
    r = subprocess.run(["git", "show", commit + ":" + path], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else ""


def hand(path, commit):
    t = text(path, commit)
    return 0 if t.startswith(("// Code generated", "# Code generated")) else t.count("\n")


def verbatim(t):
    stack, n, comment = [], 0, False
    for line in t.splitlines():
        if not ("{{" in line or comment) and "range" not in stack:
            n += 1
        if "{{/*" in line and "*/}}" not in line:
            comment = True
        elif comment and "*/}}" in line:
            comment = False
        for m in re.finditer(r"\{\{-?\s*(range|if|with|define|block|end)\b", line):
            if m.group(1) == "end":
                stack and stack.pop()
            else:
                stack.append(m.group(1))
    return n


def main():
    commit = sys.argv[1] if len(sys.argv) > 1 else None
    tdir = "internal/contractgen/templates/"
    for sdk, (files, tmpl) in SETS.items():
        before = sum(text(f, BEFORE).count("\n") for f in files)
        after = sum(hand(f, commit) for f in files)
        if commit is None:
            tmpls = sorted(glob.glob(tdir + tmpl))
        else:
            ls = subprocess.run(["git", "ls-tree", "--name-only", commit, tdir], capture_output=True, text=True).stdout.split()
            tmpls = [p for p in ls if re.fullmatch(tdir + tmpl.replace("*", ".*"), p)]
        v = sum(verbatim(text(p, commit)) for p in tmpls)
        print("%-6s (a) %4d -> %4d (%+.1f %%)   (b) %4d -> %4d (%+.1f %%; templates' verbatim lines %d)" % (
            sdk, before, after, 100 * (after - before) / before, before, after + v, 100 * (after + v - before) / before, v))


main()

"""Summarises bench/node/startup.sh's output: python3 startup_ratio.py OUT

Each line is "TREE wall_s user_s sys_s max_rss_kib". Prints each tree's
medians (wall, user + system CPU, peak RSS) and, for every later tree, the
median (min-max) of its per-round ratios to each earlier tree's.
"""

import collections
import statistics as st
import sys

runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 5:
        runs[p[0]].append((float(p[1]) * 1000, (float(p[2]) + float(p[3])) * 1000, int(p[4]) / 1024))
trees = list(runs)
for t in trees:
    v = runs[t]
    print("%s: n=%d wall %.0f ms, CPU %.0f ms (fastest %.0f), peak RSS %.0f MiB" % (
        t, len(v), st.median(x[0] for x in v), st.median(x[1] for x in v), min(x[1] for x in v), st.median(x[2] for x in v)))
for i, t in enumerate(trees):
    for b in trees[:i]:
        cpu = [a[1] / z[1] for a, z in zip(runs[t], runs[b])]
        wall = [a[0] / z[0] for a, z in zip(runs[t], runs[b])]
        print("%s / %s: CPU %.3f (%.2f-%.2f), wall %.3f" % (t, b, st.median(cpu), min(cpu), max(cpu), st.median(wall)))

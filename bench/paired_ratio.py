"""Medians and paired ratios of bench/paired.sh's output:

    python3 bench/paired_ratio.py OUT REGEX

REGEX (one group: the number) is applied to OUT.before and OUT.after; the
i-th match of each is round i. Prints the median (min–max) of each side and
the median (min–max) of the per-round ratios after/before.
"""

import re
import statistics
import sys

out, rx = sys.argv[1], re.compile(sys.argv[2])
side = {k: [float(m.group(1)) for m in rx.finditer(open(out + "." + k).read())] for k in ("before", "after")}
n = min(len(side["before"]), len(side["after"]))
ratios = [a / b for b, a in zip(side["before"][:n], side["after"][:n])]


def f(xs):
    return "%.4g (%.4g–%.4g)" % (statistics.median(xs), min(xs), max(xs))


print("%s: n=%d before %s after %s ratio %s" % (out, n, f(side["before"][:n]), f(side["after"][:n]), f(ratios)))

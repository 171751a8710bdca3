#!/bin/sh
# Node start-up, whole process: loadPolicy('default') in a fresh `node` of each
# sdk/node tree in turn, ROUNDS rounds, the order reversed every other round;
# GNU time's wall, user + system CPU and peak RSS of each run are appended to
# OUT (default /tmp/node-startup.out), then summarised by startup_ratio.py
# (medians, and each tree's per-round CPU ratio to the first tree's).
#   ROUNDS=20 bench/node/startup.sh BEFORE/sdk/node AFTER/sdk/node [MORE...]
set -e
rounds=${ROUNDS:-20} out=${OUT:-/tmp/node-startup.out}
i=0
while [ "$i" -lt "$rounds" ]; do
	if [ $((i % 2)) -eq 0 ]; then order="$*"; else order=$(printf '%s\n' "$@" | tac | tr '\n' ' '); fi
	for d in $order; do
		/usr/bin/time -a -o "$out" -f "$d %e %U %S %M" \
			node --input-type=module -e "import {loadPolicy} from '$d/index.js'; await loadPolicy('default')"
	done
	i=$((i + 1))
done
python3 "$(dirname "$0")/startup_ratio.py" "$out"

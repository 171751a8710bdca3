#!/bin/sh
# paired.sh OUT ROUNDS BEFORE_CMD AFTER_CMD: runs the two commands in turn,
# ROUNDS times, the order swapped every round (so neither always runs first on
# a machine whose speed drifts); appends each one's output to OUT.before and
# OUT.after, and the load average before each round to OUT.load.
set -e
out=$1 rounds=$2 before=$3 after=$4
i=0
while [ "$i" -lt "$rounds" ]; do
	cut -d' ' -f1-3 /proc/loadavg >>"$out.load"
	if [ $((i % 2)) -eq 0 ]; then
		sh -c "$before" >>"$out.before" 2>&1
		sh -c "$after" >>"$out.after" 2>&1
	else
		sh -c "$after" >>"$out.after" 2>&1
		sh -c "$before" >>"$out.before" 2>&1
	fi
	i=$((i + 1))
done

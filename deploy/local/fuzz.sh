#!/usr/bin/env bash
# Runs every fuzz target of the given packages for FUZZTIME each.
#
# Under heavy load Go's fuzzing coordinator can stop with "context deadline
# exceeded" when -fuzztime runs out while a worker is still starting, with no
# failing input: that run is repeated once. A real failure (a failing input
# written to testdata/fuzz, a crash, a failed seed) fails at once.
set -uo pipefail
go=${GO:-go}
fuzztime=${FUZZTIME:-20s}
for p in "$@"; do
	for t in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$p"*_test.go); do
		for attempt in 1 2; do
			echo "== $p $t"
			out=$("$go" test -run '^$' -fuzz "^$t\$" -fuzztime "$fuzztime" "$p" 2>&1)
			rc=$?
			echo "$out"
			[ $rc -eq 0 ] && break
			if [ $attempt -eq 1 ] && grep -q 'context deadline exceeded' <<<"$out" &&
				! grep -qE 'Failing input written|panic:|--- FAIL: Fuzz[A-Za-z0-9_]+/' <<<"$out"; then
				echo "(the fuzzing engine ran out of time without a failing input; running $t again)"
				continue
			fi
			exit 1
		done
	done
done

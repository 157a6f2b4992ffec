#!/usr/bin/env bash
# Runs every fuzz target of the given packages for FUZZTIME each.
#
# Go's fuzzing coordinator stops with "context deadline exceeded", with no
# failing input, when -fuzztime runs out before its workers have run the seed
# corpus (a target with hundreds of seeds, or a loaded machine): that run is
# repeated once for FUZZ_RETRY_TIME (default 10s). A real
# failure (a failing input written to testdata/fuzz, a crash, a failed seed)
# fails at once.
set -uo pipefail
go=${GO:-go}
fuzztime=${FUZZTIME:-20s}
retrytime=${FUZZ_RETRY_TIME:-10s}
for p in "$@"; do
	for t in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$p"*_test.go); do
		for attempt in 1 2; do
			echo "== $p $t"
			budget=$fuzztime
			[ $attempt -eq 2 ] && budget=$retrytime
			out=$("$go" test -run '^$' -fuzz "^$t\$" -fuzztime "$budget" "$p" 2>&1)
			rc=$?
			echo "$out"
			[ $rc -eq 0 ] && break
			if [ $attempt -eq 1 ] && grep -q 'context deadline exceeded' <<<"$out" &&
				! grep -qE 'Failing input written|panic:|--- FAIL: Fuzz[A-Za-z0-9_]+/' <<<"$out"; then
				echo "(the fuzzing engine ran out of time without a failing input; running $t again for $retrytime)"
				continue
			fi
			exit 1
		done
	done
done

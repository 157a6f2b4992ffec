#!/usr/bin/env bash
# Runs every fuzz target of the given packages for FUZZTIME each.
#
# Go's fuzzing coordinator can stop with "context deadline exceeded", with no
# failing input, when a -fuzztime given as a duration runs out while a worker
# is mid-call (golang/go#75804, fixed in Go 1.27). Such a run is repeated once
# with a count budget (-fuzztime Nx, N the executions the first run reached,
# at least FUZZ_RETRY_EXECS), which has no deadline to race. A real failure (a
# failing input written to testdata/fuzz, a crash, a failed seed) fails at once.
set -uo pipefail
go=${GO:-go}
fuzztime=${FUZZTIME:-20s}
retryexecs=${FUZZ_RETRY_EXECS:-2000}
for p in "$@"; do
	for t in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$p"*_test.go); do
		budget=$fuzztime
		for attempt in 1 2; do
			echo "== $p $t (-fuzztime $budget)"
			out=$("$go" test -run '^$' -fuzz "^$t\$" -fuzztime "$budget" "$p" 2>&1)
			rc=$?
			echo "$out"
			[ $rc -eq 0 ] && break
			if [ $attempt -eq 1 ] && grep -q 'context deadline exceeded' <<<"$out" &&
				! grep -qE 'Failing input written|panic:|--- FAIL: Fuzz[A-Za-z0-9_]+/' <<<"$out"; then
				n=$(sed -n 's/.*execs: \([0-9]*\) .*/\1/p' <<<"$out" | tail -1)
				[ -z "$n" ] || [ "$n" -lt "$retryexecs" ] && n=$retryexecs
				budget="${n}x"
				echo "(the fuzzing engine's deadline raced a worker, with no failing input; running $t again for $budget executions)"
				continue
			fi
			exit 1
		done
	done
done

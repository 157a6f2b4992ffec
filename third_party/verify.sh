#!/usr/bin/env bash
# verify.sh checks that each fork in third_party/ is its upstream module with
# its patch series applied, and nothing else (third_party/README.md).
#
# For each module (third_party/patches/<module>/, or the ones named as
# arguments): the pristine module is fetched through the Go module proxy
# (go mod download) and copied to a temporary directory; the series
# (NNNN-*.patch, in order) is applied to the whole module, upstream's tests
# included, with patch -p1 and no fuzz (git apply without patch(1)); the files the manifest
# (patches/<module>/files) keeps are compared with diff -r against
# third_party/<module>/, which must hold exactly those files; and the
# regression tests the upstream-ready patches add (their "Upstream-Test:
# <package> <test> [GOARCH=<arch>]" lines) are run in the patched copy.
#
# Environment: GO (default go); VERIFY_FORKS_TESTS=0 skips the regression
# tests. Exits non-zero with a message naming the module and patch on any
# difference.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GO=${GO:-go}
export GOWORK=off GOFLAGS=-mod=mod

tmp=$(mktemp -d)
cleanup() {
	chmod -R u+w "$tmp" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

failures=0
fail() {
	echo "verify-forks: $*" >&2
	failures=$((failures + 1))
}

# patches_touching MODULE FILE lists the patches of MODULE whose diff has FILE.
patches_touching() {
	local p names=()
	for p in "$here/patches/$1"/[0-9][0-9][0-9][0-9]-*.patch; do
		if grep -qxF -e "+++ b/$2" -e "--- a/$2" "$p"; then
			names+=("$(basename "$p")")
		fi
	done
	if ((${#names[@]})); then
		echo "${names[*]}"
	else
		echo "none: the file is upstream's as it is"
	fi
}

# apply_patch DIR PATCH applies PATCH to DIR: with patch(1), no fuzz, or
# where it is missing with git apply in a repository made for DIR.
apply_patch() {
	if command -v patch >/dev/null; then
		(cd "$1" && patch -p1 -F0 -N --batch --no-backup-if-mismatch -r - <"$2")
	else
		[[ -d $1/.git ]] || git -C "$1" init -q
		git -C "$1" apply -p1 "$2"
	fi
}

# manifest MODULE KEY prints the values of the manifest's KEY lines.
manifest() {
	sed -e 's/[[:space:]]*#.*//' "$here/patches/$1/files" | awk -v k="$2" '$1 == k { print $2 }'
}

verify() {
	local m=$1 dir="$here/patches/$1" fork="$here/$1"
	local module version src full kept p f out
	module=$(manifest "$m" module)
	version=$(manifest "$m" version)
	if [[ -z $module || -z $version ]]; then
		fail "$m: $dir/files names no module or version"
		return
	fi
	local before=$failures

	if ! out=$("$GO" mod download -json "$module@$version" 2>&1); then
		fail "$m: cannot download $module@$version through the Go module proxy ($("$GO" env GOPROXY)):"
		echo "$out" >&2
		return
	fi
	src=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$out")
	if [[ -z $src || ! -d $src ]]; then
		fail "$m: go mod download gave no directory for $module@$version:"
		echo "$out" >&2
		return
	fi
	full="$tmp/$m/module"
	kept="$tmp/$m/kept"
	mkdir -p "$tmp/$m"
	cp -R "$src" "$full"
	chmod -R u+w "$full"

	local applied=()
	for p in "$dir"/[0-9][0-9][0-9][0-9]-*.patch; do
		[[ -e $p ]] || continue
		if ! out=$(apply_patch "$full" "$p" 2>&1); then
			fail "$m: $(basename "$p") does not apply to $module@$version${applied:+ after ${applied[*]}}:"
			echo "$out" >&2
			return
		fi
		applied+=("$(basename "$p")")
	done

	# The fork holds exactly the files the manifest keeps.
	local listed actual
	listed=$(manifest "$m" keep | LC_ALL=C sort)
	actual=$(cd "$fork" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)
	while IFS= read -r f; do
		[[ -n $f ]] && fail "$m: third_party/$m/$f is not explained: not kept in patches/$m/files (every file of the fork is upstream's or added by a patch, and listed there)"
	done < <(LC_ALL=C comm -13 <(echo "$listed") <(echo "$actual"))
	while IFS= read -r f; do
		[[ -n $f ]] && fail "$m: third_party/$m/$f is kept in patches/$m/files but missing from the fork"
	done < <(LC_ALL=C comm -23 <(echo "$listed") <(echo "$actual"))

	mkdir -p "$kept"
	while IFS= read -r f; do
		[[ -n $f ]] || continue
		if [[ ! -f $full/$f ]]; then
			fail "$m: $f (kept in patches/$m/files) is neither in $module@$version nor added by a patch"
			continue
		fi
		mkdir -p "$kept/$(dirname "$f")"
		cp -p "$full/$f" "$kept/$f"
	done <<<"$listed"

	# Every Go file of a kept package is kept or omitted: a file a new
	# upstream version adds to a package the fork keeps is not lost unseen.
	local omitted
	omitted=$(manifest "$m" omit | LC_ALL=C sort)
	while IFS= read -r f; do
		[[ -n $f ]] || continue
		fail "$m: upstream's $f, in a package the fork keeps, is neither kept nor omitted in patches/$m/files"
	done < <(cd "$full" && for d in $(dirname $(echo "$listed" | grep '\.go$') | LC_ALL=C sort -u); do
		find "$d" -maxdepth 1 -type f -name '*.go' ! -name '*_test.go' | sed 's|^\./||'
	done | LC_ALL=C sort -u | LC_ALL=C comm -23 - <(printf '%s\n%s\n' "$listed" "$omitted" | LC_ALL=C sort -u))

	if ! out=$(diff -r -u "$kept" "$fork" 2>&1); then
		local files
		files=$(sed -n "s|^diff -r -u $kept/\([^ ]*\) .*|\1|p" <<<"$out")
		for f in $files; do
			fail "$m: third_party/$m/$f differs from $module@$version with the series applied (patches touching it: $(patches_touching "$m" "$f"))"
		done
		echo "$out" | grep -v '^Only in ' | head -n 60 >&2
	fi

	if ((failures == before)) && [[ ${VERIFY_FORKS_TESTS:-1} != 0 ]]; then
		run_tests "$m" "$full"
	fi
	if ((failures == before)); then
		echo "verify-forks: $m: $module@$version + ${#applied[@]} patches = third_party/$m"
	fi
}

# run_tests MODULE DIR runs the Upstream-Test lines of MODULE's patches in DIR.
run_tests() {
	local m=$1 full=$2 p pkg test env arch host out
	host=$("$GO" env GOHOSTARCH)
	for p in "$here/patches/$m"/[0-9][0-9][0-9][0-9]-*.patch; do
		while read -r _ pkg test env; do
			arch=${env#GOARCH=}
			if [[ -n $env && ! ($arch == "$host" || ($arch == 386 && $host == amd64)) ]]; then
				echo "verify-forks: $m: $(basename "$p"): $test ($pkg, $env) skipped: a $host host does not run $arch binaries"
				continue
			fi
			if ! out=$(cd "$full" && env ${env:+CGO_ENABLED=0 "$env"} "$GO" test -trimpath -count=1 -timeout 120s -run "^${test}\$" "$pkg" 2>&1); then
				fail "$m: $(basename "$p"): its regression test $test ($pkg${env:+, $env}) fails in the patched upstream module:"
				echo "$out" | tail -n 40 >&2
			elif grep -q 'no tests to run' <<<"$out"; then
				fail "$m: $(basename "$p"): its regression test $test ($pkg) is not in the patched upstream module"
			fi
		done < <(grep '^Upstream-Test: ' "$p" || true)
	done
}

modules=("$@")
if ((${#modules[@]} == 0)); then
	for d in "$here"/patches/*/; do
		modules+=("$(basename "$d")")
	done
fi
for m in "${modules[@]}"; do
	if [[ ! -f $here/patches/$m/files ]]; then
		fail "$m: no third_party/patches/$m/files"
		continue
	fi
	verify "$m"
done
if ((failures)); then
	echo "verify-forks: $failures problem(s): the forks must be their upstream modules with the series of third_party/patches/ applied (third_party/README.md)" >&2
	exit 1
fi

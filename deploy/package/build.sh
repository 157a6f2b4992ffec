#!/usr/bin/env bash
# build.sh is `make release` and `make package`: static Linux binaries and
# Debian packages, in dist/.
#
# Usage:
#   deploy/package/build.sh release [ARCH...]  # dist/{gatewayd,gatewayctl,devicesim}_linux_SUFFIX
#   deploy/package/build.sh package [ARCH...]  # dist/greenhouse-gateway_DEBVERSION_ARCH.deb
#   deploy/package/build.sh deb-version         # the Debian version VERSION makes
#
# ARCH is a Debian architecture: amd64, arm64 (64-bit Raspberry Pi OS) or
# armhf (32-bit Raspberry Pi OS: GOARCH=arm GOARM=7); default all three.
# Binary suffixes: amd64, arm64, armv7. Binaries are built with
# CGO_ENABLED=0 -trimpath and -X main.version=$VERSION, so
# `gatewayd --version` prints VERSION.
#
# Environment: VERSION (default: git describe --tags --always --dirty),
# DEB_VERSION (default: derived from VERSION, see deb_version), DIST (output
# directory, default dist), GO (default go), DEB_MAINTAINER.
#
# Packages are built by nfpm v2.45.2, run with `go run` (newer nfpm releases,
# and nfpm as a library in go.mod, need a module that is not served), from
# deploy/package/nfpm.yaml with the architecture in the environment.
set -euo pipefail

readonly NFPM="github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2"
readonly ALL_ARCHES=(amd64 arm64 armhf)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly REPO_ROOT
cd "${REPO_ROOT}"

GO="${GO:-go}"
VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
DIST="${DIST:-dist}"
DEB_MAINTAINER="${DEB_MAINTAINER:-Greenhouse gateway maintainers <greenhouse-gateway@localhost>}"

die() {
	echo "build.sh: $*" >&2
	exit 1
}

usage() {
	echo "usage: $(basename "$0") release|package [amd64|arm64|armhf ...]" >&2
	exit 2
}

# go_env ARCH: prints "GOARCH GOARM SUFFIX" of a Debian architecture.
go_env() {
	case "$1" in
	amd64) echo "amd64 - amd64" ;;
	arm64) echo "arm64 - arm64" ;;
	armhf) echo "arm 7 armv7" ;;
	*) die "unknown architecture $1 (amd64, arm64 or armhf)" ;;
	esac
}

# deb_version VERSION: a Debian version (must start with a digit) from git
# describe's output:
#   v1.2.3                    -> 1.2.3
#   v1.2.3-rc1                -> 1.2.3~rc1            (sorts before 1.2.3)
#   v1.2.3-4-gabc1234[-dirty] -> 1.2.3+4.gabc1234[.dirty] (after 1.2.3)
#   abc1234[-dirty], dev      -> 0.0.0~git.abc1234[.dirty] (no tag yet)
deb_version() {
	local v="${1#v}"
	if [[ ! "${v}" =~ ^[0-9] ]]; then
		echo "0.0.0~git.${v//-/.}"
		return
	fi
	local base="${v%%-*}" rest=""
	[[ "${v}" == *-* ]] && rest="${v#*-}"
	if [[ -z "${rest}" ]]; then
		echo "${base}"
	elif [[ "${rest}" =~ ^[0-9]+-g[0-9a-f]+(-dirty)?$ ]]; then
		echo "${base}+${rest//-/.}"
	else
		echo "${base}~${rest//-/.}"
	fi
}

# build ARCH BINARY...: static binaries into DIST.
build() {
	local arch="$1"
	shift
	local goarch goarm suffix
	read -r goarch goarm suffix <<<"$(go_env "${arch}")"
	[[ "${goarm}" == "-" ]] && goarm=""
	mkdir -p "${DIST}"
	local bin
	for bin in "$@"; do
		echo "build.sh: ${DIST}/${bin}_linux_${suffix} (${VERSION})" >&2
		CGO_ENABLED=0 GOOS=linux GOARCH="${goarch}" GOARM="${goarm}" \
			"${GO}" build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
			-o "${DIST}/${bin}_linux_${suffix}" "./cmd/${bin}"
	done
}

# package ARCH: the .deb of ARCH into DIST, replacing older ones of ARCH.
package() {
	local arch="$1" goarch goarm suffix
	read -r goarch goarm suffix <<<"$(go_env "${arch}")"
	build "${arch}" gatewayd gatewayctl
	local debver="${DEB_VERSION:-$(deb_version "${VERSION}")}"
	[[ "${debver}" =~ ^[0-9][A-Za-z0-9.+~]*$ ]] || die "bad Debian version ${debver} (from VERSION=${VERSION}); set DEB_VERSION"
	local target="${DIST}/greenhouse-gateway_${debver}_${arch}.deb"
	rm -f "${DIST}"/greenhouse-gateway_*_"${arch}".deb
	echo "build.sh: ${target}" >&2
	DEB_ARCH="${arch}" BIN_SUFFIX="${suffix}" DEB_VERSION="${debver}" DEB_MAINTAINER="${DEB_MAINTAINER}" DIST="${DIST}" \
		"${GO}" run "${NFPM}" package --config deploy/package/nfpm.yaml --packager deb --target "${target}" >&2
}

main() {
	[[ $# -ge 1 ]] || usage
	local cmd="$1"
	shift
	local -a arches=("$@")
	[[ ${#arches[@]} -gt 0 ]] || arches=("${ALL_ARCHES[@]}")
	local arch
	for arch in "${arches[@]}"; do
		go_env "${arch}" >/dev/null
	done
	case "${cmd}" in
	release)
		for arch in "${arches[@]}"; do
			build "${arch}" gatewayd gatewayctl devicesim
		done
		;;
	package)
		for arch in "${arches[@]}"; do
			package "${arch}"
		done
		;;
	deb-version)
		deb_version "${VERSION}"
		;;
	*) usage ;;
	esac
}

main "$@"

#!/usr/bin/env bash
# Installs, in one apt run, the Debian packages the integration tests use:
# mosquitto and its clients (external-broker mode, independent MQTT clients),
# promtool and the Pushgateway (metrics and alert rules), chromium (the status
# page in a real browser), qemu-user (the 32-bit ARM store test) and
# systemd-analyze (the unit's checks), python3-jsonschema (the firmware contract's
# schemas checked by a real validator), awscli (an independent DynamoDB client:
# make smoke and the cloud read tests). Each test can install what it misses by
# itself, but test packages run in parallel and apt allows one run at a time:
# installing everything first keeps them from queueing on apt's lock.
# Needs root; otherwise it says what is missing and leaves it to the tests.
# With package names as arguments (test-deps.sh awscli), only those.
set -euo pipefail

declare -A need=(
	[mosquitto]=/usr/sbin/mosquitto
	[mosquitto-clients]=mosquitto_pub
	[prometheus]=promtool
	[prometheus-pushgateway]=prometheus-pushgateway
	[chromium]=chromium
	[qemu-user]=qemu-arm
	[systemd]=systemd-analyze
	[python3-jsonschema]=/usr/lib/python3/dist-packages/jsonschema/__init__.py
	[awscli]=/usr/bin/aws
)
wanted=("$@")
[ $# -gt 0 ] || wanted=("${!need[@]}")
missing=()
for pkg in "${wanted[@]}"; do
	[ -n "${need[$pkg]:-}" ] || { echo "test-deps: ${pkg} is not one of: ${!need[*]}" >&2; exit 2; }
	[ -e "${need[$pkg]}" ] || command -v "${need[$pkg]}" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: missing Debian packages: ${missing[*]} (the tests that need them install them as root, or skip)" >&2
	exit 0
fi
echo "test-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update -qq
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

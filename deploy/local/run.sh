#!/usr/bin/env bash
# run.sh is `make run`: a complete local gateway on this machine.
#
# It starts AWS DynamoDB Local (in memory), creates the four tables and a
# development API key, starts gatewayd with its embedded MQTT broker and
# HTTP API, starts a few simulated devices, and prints where to look. The
# devices enroll with that fleet key and keep the device keys they are issued
# in .run/device-keys.json, next to the gateway's buffer in .run/data, so both
# sides still agree after a restart.
#
# Ctrl-C stops everything. So does RUN_FOR (e.g. 60s, 5m, 1h), a bound on the
# run for machines, after which it stops as on Ctrl-C and exits 0. If any
# process it started exits on its own, it says which, shows the end of that
# process's log, stops the others and exits 1.
#
# Settings, from the environment: DYNAMODB_PORT (8000), MQTT_PORT (1883),
# HTTP_PORT (8080), DEVICES (3), INTERVAL (5s), REBOOT_EVERY (2m: devices
# reboot about that often), CLOCK_SYNC_AFTER (15s: after each boot, devices
# have no NTP time that long).
#
# UPLINK=lambda (`make run UPLINK=lambda`) forwards through the Lambda path
# instead: gatewayd's uplink invokes the readings function (bin/lambda/bootstrap,
# `make lambda`) under the AWS Lambda Runtime Interface Emulator (RIE_BIN, which
# `make run UPLINK=lambda` builds), behind bin/invokeproxy (the emulator crashes
# on two invokes at once), and the function writes DynamoDB Local. Ports:
# LAMBDA_PORT (9000, the proxy), RIE_PORT (9001), RIE_API_PORT (9002).
set -Eeuo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${REPO_ROOT}"

DYNAMODB_PORT="${DYNAMODB_PORT:-8000}"
MQTT_PORT="${MQTT_PORT:-1883}"
HTTP_PORT="${HTTP_PORT:-8080}"
DEVICES="${DEVICES:-3}"
INTERVAL="${INTERVAL:-5s}"
REBOOT_EVERY="${REBOOT_EVERY:-2m}"
CLOCK_SYNC_AFTER="${CLOCK_SYNC_AFTER:-15s}"
UPLINK="${UPLINK:-dynamodb}"
RUN_FOR="${RUN_FOR:-}"
LAMBDA_PORT="${LAMBDA_PORT:-9000}"
RIE_PORT="${RIE_PORT:-9001}"
RIE_API_PORT="${RIE_API_PORT:-9002}"
RUN_DIR="${REPO_ROOT}/.run"
ENDPOINT="http://127.0.0.1:${DYNAMODB_PORT}"
# How long a child is given to stop on its own before it is killed.
readonly STOP_GRACE_SECONDS=20

say() { echo "run.sh: $*" >&2; }

# A failing command never ends the script silently: name it and its line.
on_error() {
	local status="$1" line="$2" cmd="$3"
	# A command substitution's failure is reported once, by the command using it.
	((BASH_SUBSHELL == 0)) || return 0
	say "line ${line}: '${cmd}' failed with exit status ${status}; the lines above say why"
}
trap 'on_error "$?" "${LINENO}" "${BASH_COMMAND}"' ERR

# seconds_of prints the seconds of a duration written as N, Ns, Nm or Nh.
seconds_of() {
	case "$1" in
	*[!0-9smh]* | '' | [smh]*) return 1 ;;
	*s) echo "${1%s}" ;;
	*m) echo $((${1%m} * 60)) ;;
	*h) echo $((${1%h} * 3600)) ;;
	*) echo "$1" ;;
	esac
}
run_for_seconds=""
if [[ -n "${RUN_FOR}" ]]; then
	run_for_seconds="$(seconds_of "${RUN_FOR}")" && [[ "${run_for_seconds}" =~ ^[0-9]+$ ]] && ((run_for_seconds > 0)) ||
		{ say "RUN_FOR=${RUN_FOR} is not a duration such as 60s, 5m or 1h"; exit 2; }
fi

command -v curl >/dev/null 2>&1 || { say "curl is missing: install it (apt-get install curl), then run 'make run' again"; exit 1; }
for bin in gatewayd gatewayctl devicesim; do
	[[ -x "bin/${bin}" ]] || { say "bin/${bin} is missing; start it with 'make run', which builds it"; exit 1; }
done
case "${UPLINK}" in
dynamodb) ;;
lambda)
	if [[ -z "${RIE_BIN:-}" ]]; then
		# The newest emulator `make run UPLINK=lambda` installed, if any.
		rie_bins=(.cache/bin/aws-lambda-rie-*/aws-lambda-rie)
		[[ -e "${rie_bins[0]}" ]] && RIE_BIN="${REPO_ROOT}/${rie_bins[-1]}"
	fi
	for f in bin/lambda/bootstrap bin/invokeproxy "${RIE_BIN:-.cache/bin/aws-lambda-rie-*/aws-lambda-rie}"; do
		[[ -x "${f}" ]] || { say "${f} is missing; start it with 'make run UPLINK=lambda', which builds it"; exit 1; }
	done
	;;
*) say "UPLINK=${UPLINK} is not one of dynamodb, lambda"; exit 2 ;;
esac

# The processes this script started, in start order: their names, pids and logs.
names=()
pids=()
logs=()
rie_pgid=""
dynamodb_started=""

# stop_child stops one child: SIGTERM, then SIGKILL after STOP_GRACE_SECONDS.
stop_child() {
	local name="$1" pid="$2"
	kill -TERM "${pid}" 2>/dev/null || return 0
	local deadline=$((SECONDS + STOP_GRACE_SECONDS))
	while kill -0 "${pid}" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			say "${name} (pid ${pid}) did not stop within ${STOP_GRACE_SECONDS}s; killing it"
			kill -KILL "${pid}" 2>/dev/null || true
			break
		fi
		sleep 0.1
	done
	wait "${pid}" 2>/dev/null || true
}

cleanup() {
	trap - ERR EXIT
	# A second Ctrl-C must not leave the emulator or DynamoDB Local behind.
	trap 'say "still stopping; the processes started are being stopped"' INT TERM
	[[ -n "${dynamodb_started}" ]] || return 0
	echo >&2
	say "stopping..."
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		stop_child "${names[i]}" "${pids[i]}"
	done
	# The emulator and the function process under it: the whole group.
	if [[ -n "${rie_pgid}" ]]; then
		kill -KILL -- "-${rie_pgid}" 2>/dev/null || true
		wait "${rie_pgid}" 2>/dev/null || true
	fi
	if [[ -n "${dynamodb_started}" ]]; then
		deploy/local/dynamodb-local.sh stop 2>/dev/null || true
	fi
	say "stopped. The gateway's buffer stays in ${RUN_DIR}/data; DynamoDB Local kept its tables in memory only."
}
trap 'cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A process that ended on its own: say which, how, and the end of its log.
report_exit() {
	local name="$1" pid="$2" log="$3" status=0
	wait "${pid}" 2>/dev/null || status=$?
	local how="with status ${status}"
	((status <= 128)) || how="killed by signal $((status - 128))"
	say "${name} (pid ${pid}) exited on its own, ${how}; the last lines of ${log}:"
	tail -n 15 "${log}" 2>/dev/null | sed 's/^/    /' >&2 || true
	say "the log above says why; run 'make run' again once that is fixed"
}

# start_child NAME LOG CMD...: CMD in the background, its stderr and stdout in
# LOG; with TEE=1, on this terminal too.
start_child() {
	local name="$1" log="$2"
	shift 2
	if [[ "${TEE:-}" == 1 ]]; then
		"$@" > >(tee "${log}" >&2) 2>&1 </dev/null &
	else
		"$@" >"${log}" 2>&1 </dev/null &
	fi
	names+=("${name}")
	pids+=("$!")
	logs+=("${log}")
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ports=("${DYNAMODB_PORT}" "${MQTT_PORT}" "${HTTP_PORT}")
[[ "${UPLINK}" != lambda ]] || ports+=("${LAMBDA_PORT}" "${RIE_PORT}" "${RIE_API_PORT}")
for p in "${ports[@]}"; do
	if port_busy "$p"; then
		say "port $p on 127.0.0.1 is already in use (is another 'make run' running?); stop what uses it, or move ours with DYNAMODB_PORT, MQTT_PORT, HTTP_PORT$([[ "${UPLINK}" != lambda ]] || echo ", LAMBDA_PORT, RIE_PORT, RIE_API_PORT")"
		exit 1
	fi
done

mkdir -p "${RUN_DIR}"
dynamodb_started=1
deploy/local/dynamodb-local.sh start "${DYNAMODB_PORT}"
dynamodb_pid="$(cat "${RUN_DIR}/dynamodb-local.pid")"

# Development credentials: DynamoDB Local accepts any.
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-local}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-local}"
export AWS_REGION="${AWS_REGION:-us-east-1}"
if [[ -z "${GATEWAY_API_KEY_PEPPER:-}" ]]; then
	[[ -s "${RUN_DIR}/pepper" ]] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"${RUN_DIR}/pepper"
	GATEWAY_API_KEY_PEPPER="$(cat "${RUN_DIR}/pepper")"
fi
export GATEWAY_API_KEY_PEPPER
if [[ -z "${GATEWAY_ADMIN_TOKEN:-}" ]]; then
	[[ -s "${RUN_DIR}/admin-token" ]] || head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"${RUN_DIR}/admin-token"
	GATEWAY_ADMIN_TOKEN="$(cat "${RUN_DIR}/admin-token")"
fi
export GATEWAY_ADMIN_TOKEN

bin/gatewayctl tables create --dynamodb-endpoint "${ENDPOINT}"
API_KEY="$(bin/gatewayctl keys create --dynamodb-endpoint "${ENDPOINT}" --description "make run: simulated devices")"

uplink_flags=()
if [[ "${UPLINK}" == lambda ]]; then
	# The function reads its tables, pepper and endpoint from its
	# environment, which the emulator passes on.
	DYNAMODB_ENDPOINT="${ENDPOINT}" TABLE_PREFIX="" API_KEY_PEPPER="${GATEWAY_API_KEY_PEPPER}" \
		setsid "${RIE_BIN}" --runtime-interface-emulator-address "127.0.0.1:${RIE_PORT}" \
		--runtime-api-address "127.0.0.1:${RIE_API_PORT}" "${REPO_ROOT}/bin/lambda/bootstrap" \
		>"${RUN_DIR}/function.log" 2>&1 </dev/null &
	rie_pgid=$!
	start_child invokeproxy "${RUN_DIR}/invokeproxy.log" \
		bin/invokeproxy --listen "127.0.0.1:${LAMBDA_PORT}" --upstream "http://127.0.0.1:${RIE_PORT}"
	uplink_flags=(--uplink-target lambda --lambda-function function --lambda-endpoint "http://127.0.0.1:${LAMBDA_PORT}")
fi

TEE=1 start_child gatewayd "${RUN_DIR}/gatewayd.log" \
	bin/gatewayd --data-dir "${RUN_DIR}/data" --dynamodb-endpoint "${ENDPOINT}" \
	--mqtt-addr "127.0.0.1:${MQTT_PORT}" --http-addr "127.0.0.1:${HTTP_PORT}" "${uplink_flags[@]}"

# watch_once checks that every process started is still running; the first
# that is not is reported and ends the run.
watch_once() {
	local i
	for ((i = 0; i < ${#pids[@]}; i++)); do
		if ! kill -0 "${pids[i]}" 2>/dev/null; then
			report_exit "${names[i]}" "${pids[i]}" "${logs[i]}"
			exit 1
		fi
	done
	if ! kill -0 "${dynamodb_pid}" 2>/dev/null; then
		say "DynamoDB Local (pid ${dynamodb_pid}) exited on its own; the last lines of ${RUN_DIR}/dynamodb-local.log:"
		tail -n 15 "${RUN_DIR}/dynamodb-local.log" 2>/dev/null | sed 's/^/    /' >&2 || true
		exit 1
	fi
	if [[ -n "${rie_pgid}" ]] && ! kill -0 "${rie_pgid}" 2>/dev/null; then
		report_exit "the Lambda emulator" "${rie_pgid}" "${RUN_DIR}/function.log"
		rie_pgid=""
		exit 1
	fi
}

ready=""
for _ in $(seq 1 300); do
	if curl -fsS "http://127.0.0.1:${HTTP_PORT}/readyz" >/dev/null 2>&1; then
		ready=1
		break
	fi
	watch_once
	sleep 0.1
done
[[ -n "${ready}" ]] || { say "gatewayd did not become ready within 30s; see ${RUN_DIR}/gatewayd.log"; exit 1; }

start_child devicesim "${RUN_DIR}/devicesim.log" \
	bin/devicesim --mqtt-url "tcp://127.0.0.1:${MQTT_PORT}" --api-key "${API_KEY}" \
	--devices "${DEVICES}" --interval "${INTERVAL}" --reboot-every "${REBOOT_EVERY}" \
	--clock-sync-after "${CLOCK_SYNC_AFTER}" --key-store "${RUN_DIR}/device-keys.json"

cat <<EOF

greenhouse-gateway is running.
  MQTT broker     tcp://127.0.0.1:${MQTT_PORT}   (username = hardware_id, password = API key)
  HTTP API        http://127.0.0.1:${HTTP_PORT}/v1/readings
  metrics         http://127.0.0.1:${HTTP_PORT}/metrics
  status page     http://127.0.0.1:${HTTP_PORT}/status  (admin token in ${RUN_DIR}/admin-token)
  health          http://127.0.0.1:${HTTP_PORT}/healthz  /readyz
  DynamoDB Local  ${ENDPOINT}  (tables devices, device_readings, processed_batches, api_keys)
  uplink          ${UPLINK}$([[ "${UPLINK}" != lambda ]] || echo "  (invokes the readings function at http://127.0.0.1:${LAMBDA_PORT}, the Runtime Interface Emulator; its log ${RUN_DIR}/function.log)")
  logs            ${RUN_DIR}/gatewayd.log  ${RUN_DIR}/devicesim.log
  API key         ${API_KEY}  (fleet key: devices enroll with it)
  device keys     ${RUN_DIR}/device-keys.json  (what the simulated devices were issued)

${DEVICES} simulated devices publish a batch every ${INTERVAL}, reboot about every ${REBOOT_EVERY}
and start each boot without NTP time for ${CLOCK_SYNC_AFTER} (the gateway repairs those timestamps).
See the readings arrive in DynamoDB:
  bin/gatewayctl readings latest --dynamodb-endpoint ${ENDPOINT}
See the devices as the gateway knows them (boots, gaps, clock anchors):
  curl -s -H "Authorization: Bearer ${GATEWAY_ADMIN_TOKEN}" http://127.0.0.1:${HTTP_PORT}/v1/devices

$(if [[ -n "${run_for_seconds}" ]]; then echo "It stops by itself after ${RUN_FOR}; Ctrl-C stops it sooner."; else echo "Ctrl-C stops everything."; fi)
EOF

# Until Ctrl-C, RUN_FOR, or a process that exits on its own.
started=${SECONDS}
while :; do
	watch_once
	if [[ -n "${run_for_seconds}" ]] && ((SECONDS - started >= run_for_seconds)); then
		say "RUN_FOR=${RUN_FOR} has passed"
		exit 0
	fi
	sleep 1
done

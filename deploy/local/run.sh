#!/usr/bin/env bash
# run.sh is `make run`: a complete local gateway on this machine.
#
# It starts AWS DynamoDB Local (in memory), creates the four tables and a
# development API key, starts gatewayd with its embedded MQTT broker and
# HTTP API, starts a few simulated devices, and prints where to look. The
# devices enroll with that fleet key and keep the device keys they are issued
# in .run/device-keys.json, next to the gateway's buffer in .run/data, so both
# sides still agree after a restart.
# Ctrl-C stops everything. Ports can be changed through the environment:
# DYNAMODB_PORT (8000), MQTT_PORT (1883), HTTP_PORT (8080), DEVICES (3),
# INTERVAL (5s), REBOOT_EVERY (2m: devices reboot about that often),
# CLOCK_SYNC_AFTER (15s: after each boot, devices have no NTP time that long).
#
# UPLINK=lambda (`make run UPLINK=lambda`) forwards through the Lambda path
# instead: gatewayd's uplink invokes the readings function (bin/lambda/bootstrap,
# `make lambda`) under the AWS Lambda Runtime Interface Emulator, behind
# bin/invokeproxy (the emulator crashes on two invokes at once), and the
# function writes DynamoDB Local. Ports: LAMBDA_PORT (9000, the proxy),
# RIE_PORT (9001), RIE_API_PORT (9002).
set -euo pipefail

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
LAMBDA_PORT="${LAMBDA_PORT:-9000}"
RIE_PORT="${RIE_PORT:-9001}"
RIE_API_PORT="${RIE_API_PORT:-9002}"
RIE_BIN="${RIE_BIN:-$(ls -d "${REPO_ROOT}"/.cache/bin/aws-lambda-rie-*/aws-lambda-rie 2>/dev/null | tail -1)}"
RUN_DIR="${REPO_ROOT}/.run"
ENDPOINT="http://127.0.0.1:${DYNAMODB_PORT}"

mkdir -p "${RUN_DIR}"
for bin in gatewayd gatewayctl devicesim; do
	[[ -x "bin/${bin}" ]] || { echo "run.sh: bin/${bin} is missing; use 'make run'" >&2; exit 1; }
done
case "${UPLINK}" in
dynamodb) ;;
lambda)
	for f in bin/lambda/bootstrap bin/invokeproxy "${RIE_BIN:-.cache/bin/aws-lambda-rie-*/aws-lambda-rie}"; do
		[[ -x "${f}" ]] || { echo "run.sh: ${f} is missing; use 'make run UPLINK=lambda'" >&2; exit 1; }
	done
	;;
*) echo "run.sh: UPLINK=${UPLINK} is not one of dynamodb, lambda" >&2; exit 1 ;;
esac

pids=()
rie_pgid=""
cleanup() {
	trap - INT TERM EXIT
	echo
	echo "stopping..."
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -TERM "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	# The emulator and the function process under it: the whole group.
	if [[ -n "${rie_pgid}" ]]; then
		kill -KILL -- "-${rie_pgid}" 2>/dev/null || true
		{ wait "${rie_pgid}"; } 2>/dev/null || true
	fi
	deploy/local/dynamodb-local.sh stop || true
	echo "stopped. The gateway's buffer stays in ${RUN_DIR}/data; DynamoDB Local kept its tables in memory only."
}
trap cleanup INT TERM EXIT

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ports=("${DYNAMODB_PORT}" "${MQTT_PORT}" "${HTTP_PORT}")
[[ "${UPLINK}" != lambda ]] || ports+=("${LAMBDA_PORT}" "${RIE_PORT}" "${RIE_API_PORT}")
for p in "${ports[@]}"; do
	if port_busy "$p"; then
		echo "run.sh: port $p is already in use; stop what uses it or set DYNAMODB_PORT / MQTT_PORT / HTTP_PORT (LAMBDA_PORT / RIE_PORT / RIE_API_PORT)" >&2
		exit 1
	fi
done

deploy/local/dynamodb-local.sh start "${DYNAMODB_PORT}"

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
API_KEY="$(bin/gatewayctl keys create --dynamodb-endpoint "${ENDPOINT}" --description "make run: simulated devices" 2>/dev/null)"

uplink_flags=()
if [[ "${UPLINK}" == lambda ]]; then
	# The function reads its tables, pepper and endpoint from its
	# environment, which the emulator passes on.
	DYNAMODB_ENDPOINT="${ENDPOINT}" TABLE_PREFIX="" API_KEY_PEPPER="${GATEWAY_API_KEY_PEPPER}" TRANSACTION_MAX_ITEMS=10 \
		setsid "${RIE_BIN}" --runtime-interface-emulator-address "127.0.0.1:${RIE_PORT}" \
		--runtime-api-address "127.0.0.1:${RIE_API_PORT}" "${REPO_ROOT}/bin/lambda/bootstrap" \
		>"${RUN_DIR}/function.log" 2>&1 &
	rie_pgid=$!
	bin/invokeproxy --listen "127.0.0.1:${LAMBDA_PORT}" --upstream "http://127.0.0.1:${RIE_PORT}" \
		2>"${RUN_DIR}/invokeproxy.log" &
	pids+=($!)
	uplink_flags=(--uplink-target lambda --lambda-function function --lambda-endpoint "http://127.0.0.1:${LAMBDA_PORT}")
fi

bin/gatewayd --data-dir "${RUN_DIR}/data" --dynamodb-endpoint "${ENDPOINT}" \
	--mqtt-addr "127.0.0.1:${MQTT_PORT}" --http-addr "127.0.0.1:${HTTP_PORT}" "${uplink_flags[@]}" \
	2> >(tee "${RUN_DIR}/gatewayd.log" >&2) &
pids+=($!)
gatewayd_pid=$!

for _ in $(seq 1 100); do
	if curl -fsS "http://127.0.0.1:${HTTP_PORT}/readyz" >/dev/null 2>&1; then break; fi
	kill -0 "${gatewayd_pid}" 2>/dev/null || { echo "run.sh: gatewayd exited; see ${RUN_DIR}/gatewayd.log" >&2; exit 1; }
	sleep 0.1
done

bin/devicesim --mqtt-url "tcp://127.0.0.1:${MQTT_PORT}" --api-key "${API_KEY}" \
	--devices "${DEVICES}" --interval "${INTERVAL}" --reboot-every "${REBOOT_EVERY}" \
	--clock-sync-after "${CLOCK_SYNC_AFTER}" --key-store "${RUN_DIR}/device-keys.json" \
	2>"${RUN_DIR}/devicesim.log" &
pids+=($!)

cat <<EOF

greenhouse-gateway is running.
  MQTT broker     tcp://127.0.0.1:${MQTT_PORT}   (username = hardware_id, password = API key)
  HTTP API        http://127.0.0.1:${HTTP_PORT}/v1/readings
  metrics         http://127.0.0.1:${HTTP_PORT}/metrics
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

Ctrl-C stops everything.
EOF

# Wait until Ctrl-C, or until the gateway exits on its own.
wait "${gatewayd_pid}"

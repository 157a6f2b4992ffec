#!/usr/bin/env bash
# smoke.sh is `make smoke`: `make run`, bounded and checked from outside.
#
# It starts `make run` (UPLINK=dynamodb or lambda; DEVICES, the ports and the
# other settings of deploy/local/run.sh pass through) in a process group of its
# own, as a terminal runs it, and waits until every simulated device has
# readings in DynamoDB Local, read with Debian's awscli (/usr/bin/aws, installed
# with apt as root when missing), a client this project did not write. Then it
# sends SIGINT to that process group, as Ctrl-C does, and checks that every
# process the run started has exited and that its ports are free. It prints how
# long each step took, from the start of `make run` (builds and downloads
# included) to each device's first reading.
#
# It fails, with make run's log, if readings do not arrive within
# SMOKE_TIMEOUT (default 600s, builds and downloads included), if the run
# stops by itself, or if anything is left running.
set -Eeuo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${REPO_ROOT}"

UPLINK="${UPLINK:-dynamodb}"
DEVICES="${DEVICES:-3}"
DYNAMODB_PORT="${DYNAMODB_PORT:-8000}"
MQTT_PORT="${MQTT_PORT:-1883}"
HTTP_PORT="${HTTP_PORT:-8080}"
LAMBDA_PORT="${LAMBDA_PORT:-9000}"
RIE_PORT="${RIE_PORT:-9001}"
RIE_API_PORT="${RIE_API_PORT:-9002}"
SMOKE_TIMEOUT="${SMOKE_TIMEOUT:-600}"
readonly STOP_TIMEOUT_SECONDS=60
readonly AWS=/usr/bin/aws

say() { echo "smoke: $*" >&2; }
trap 'rc=$?; ((BASH_SUBSHELL == 0)) && say "line ${LINENO}: '"'"'${BASH_COMMAND}'"'"' failed with exit status ${rc}"' ERR

[[ "${SMOKE_TIMEOUT}" =~ ^[0-9]+$ ]] || { say "SMOKE_TIMEOUT=${SMOKE_TIMEOUT} is not a number of seconds"; exit 2; }
case "${UPLINK}" in dynamodb | lambda) ;; *) say "UPLINK=${UPLINK} is not one of dynamodb, lambda"; exit 2 ;; esac

if [[ ! -x "${AWS}" ]]; then
	deploy/local/test-deps.sh awscli
	[[ -x "${AWS}" ]] || { say "${AWS} is missing: install Debian's awscli (apt-get install awscli)"; exit 1; }
fi

mkdir -p .cache/smoke
log="${REPO_ROOT}/.cache/smoke/make-run-${UPLINK}.log"
# Every process the run starts inherits this tag in its environment, whatever
# session or process group it moves to: it is how the leftovers are found.
tag="GREENHOUSE_SMOKE_RUN=$$-${RANDOM}${RANDOM}"

# tagged prints the pids of the live processes carrying the tag.
tagged() {
	local f pid
	for f in /proc/[0-9]*/environ; do
		pid="${f#/proc/}"
		pid="${pid%/environ}"
		[[ "${pid}" != "$$" ]] || continue
		if grep -qzxF "${tag}" "${f}" 2>/dev/null; then
			echo "${pid}"
		fi
	done
}

port_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

show_log() {
	say "the last lines of make run's output (${log}):"
	tail -n "${1:-40}" "${log}" | sed 's/^/    /' >&2 || true
}

pgid=""
stopped=""
# stop_run sends SIGINT to the run's process group and waits for make to end.
stop_run() {
	[[ -n "${pgid}" && -z "${stopped}" ]] || return 0
	stopped=1
	kill -INT -- "-${pgid}" 2>/dev/null || true
	local deadline=$((SECONDS + STOP_TIMEOUT_SECONDS))
	while kill -0 "${pgid}" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			say "make run did not stop within ${STOP_TIMEOUT_SECONDS}s of SIGINT; killing its process group"
			kill -KILL -- "-${pgid}" 2>/dev/null || true
			return 1
		fi
		sleep 0.2
	done
}
on_exit() {
	local rc=$?
	trap - ERR EXIT
	trap 'say "still stopping make run..."' INT TERM
	if [[ -z "${stopped}" ]]; then
		stop_run || true
		# Whatever the run started and left: never outlive the smoke.
		local left
		left="$(tagged)"
		[[ -z "${left}" ]] || kill -KILL ${left} 2>/dev/null || true
	fi
	exit "${rc}"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=${SECONDS}
say "make run UPLINK=${UPLINK} (DEVICES=${DEVICES}), its output in ${log}"
# setsid: its own session and process group, whose leader is make, as a
# terminal's foreground job. --default-signal: a background job of a script
# starts with SIGINT ignored, a terminal's job does not. RUN_FOR bounds the run
# should this script be killed.
env --default-signal=INT "${tag}" setsid make --no-print-directory run UPLINK="${UPLINK}" RUN_FOR="$((SMOKE_TIMEOUT + 120))s" \
	DEVICES="${DEVICES}" DYNAMODB_PORT="${DYNAMODB_PORT}" MQTT_PORT="${MQTT_PORT}" HTTP_PORT="${HTTP_PORT}" \
	LAMBDA_PORT="${LAMBDA_PORT}" RIE_PORT="${RIE_PORT}" RIE_API_PORT="${RIE_API_PORT}" \
	>"${log}" 2>&1 </dev/null &
pgid=$!
# setsid(2) runs in the child: give it a moment on a loaded machine.
own_group() { [[ "$(cut -d' ' -f5 "/proc/${pgid}/stat" 2>/dev/null)" == "${pgid}" ]]; }
for _ in $(seq 1 50); do own_group && break; sleep 0.1; done
own_group || { say "make run did not get a process group of its own"; exit 1; }

export AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_DEFAULT_REGION=us-east-1 AWS_PAGER=""
endpoint="http://127.0.0.1:${DYNAMODB_PORT}"
declare -A first=()
t_running=""
while ((${#first[@]} < DEVICES)); do
	if ! kill -0 "${pgid}" 2>/dev/null; then
		stopped=1
		say "make run ended before every device had readings in DynamoDB Local"
		show_log 60
		exit 1
	fi
	if ((SECONDS - t0 >= SMOKE_TIMEOUT)); then
		say "after ${SMOKE_TIMEOUT}s, only ${#first[@]} of ${DEVICES} devices have readings in DynamoDB Local"
		show_log 60
		exit 1
	fi
	if [[ -z "${t_running}" ]] && grep -q '^greenhouse-gateway is running' "${log}"; then
		t_running=$((SECONDS - t0))
		say "running after ${t_running}s"
	fi
	if [[ -n "${t_running}" ]]; then
		# Every hardware_id with a reading; an error (tables not made yet) is an empty answer.
		for hw in $("${AWS}" dynamodb scan --endpoint-url "${endpoint}" --table-name device_readings \
			--projection-expression hardware_id --query 'Items[].hardware_id.S' --output text 2>/dev/null | tr '\t' '\n' | sort -u); do
			[[ "${hw}" == None || -n "${first[${hw}]:-}" ]] && continue
			first[${hw}]=$((SECONDS - t0))
			say "first reading of ${hw} in DynamoDB Local after ${first[${hw}]}s"
		done
	fi
	sleep 1
done
t_all=$((SECONDS - t0))

"${AWS}" dynamodb scan --endpoint-url "${endpoint}" --table-name processed_batches --select COUNT --output text \
	--query 'Count' >"${REPO_ROOT}/.cache/smoke/markers" 2>/dev/null || true
say "every device has readings after ${t_all}s; $(cat .cache/smoke/markers 2>/dev/null || echo '?') batches recorded in processed_batches; stopping with SIGINT, as Ctrl-C does"

t_stop=${SECONDS}
stop_run || { show_log; exit 1; }
say "make run ended $((SECONDS - t_stop))s after SIGINT"

failed=""
grep -q '^run.sh: stopped\.' "${log}" || { say "run.sh did not say it stopped"; failed=1; }
left="$(tagged)"
if [[ -n "${left}" ]]; then
	say "left running after make run ended:"
	# shellcheck disable=SC2086 # one pid a word
	ps -o pid=,args= -p "$(echo ${left} | tr ' ' ',')" | sed 's/^/    /' >&2 || true
	kill -KILL ${left} 2>/dev/null || true
	failed=1
fi
ports=("${DYNAMODB_PORT}" "${MQTT_PORT}" "${HTTP_PORT}")
[[ "${UPLINK}" != lambda ]] || ports+=("${LAMBDA_PORT}" "${RIE_PORT}" "${RIE_API_PORT}")
for p in "${ports[@]}"; do
	if port_answers "${p}"; then
		say "port ${p} still answers after make run ended"
		failed=1
	fi
done
if [[ -n "${failed}" ]]; then
	show_log
	exit 1
fi
say "ok: UPLINK=${UPLINK}: running after ${t_running}s, readings of all ${DEVICES} devices after ${t_all}s, stopped cleanly, nothing left running, ports free"

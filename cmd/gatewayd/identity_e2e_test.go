package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/mosquittotest"
	"greenhouse-gateway/internal/cloud"
)

// curlJSON sends body (empty: none) with Debian's curl, authenticated with
// key as a bearer token, and returns the status and the JSON answer.
func curlJSON(t *testing.T, method, url, key, body string) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	args := []string{"-s", "-X", method, "-H", "Authorization: Bearer " + key, "-w", "\n%{http_code}", url}
	if body != "" {
		args = append(args, "-H", "Content-Type: application/json", "--data-binary", body)
	}
	out, err := exec.CommandContext(ctx, "curl", args...).Output()
	require.NoError(t, err, "curl %s %s", method, url)
	text := strings.TrimSpace(string(out))
	cut := strings.LastIndexByte(text, '\n')
	require.Positive(t, cut, "curl output %q", text)
	code, err := strconv.Atoi(text[cut+1:])
	require.NoError(t, err)
	var answer map[string]any
	require.NoError(t, json.Unmarshal([]byte(text[:cut]), &answer), text)
	return code, answer
}

func registrationJSON(hw string) string {
	return `{"hardware_id":"` + hw + `","boot_id":"` + uuid.NewString() + `","firmware_version":"1.0.16",` +
		`"friendly_name":"bench-` + strings.ReplaceAll(hw[12:], ":", "") + `","capabilities":{"sensors":["bme280"],"features":{}}}`
}

// firstReason returns the reason of an answer's first result.
func firstReason(answer map[string]any) any {
	results, _ := answer["results"].([]any)
	if len(results) == 0 {
		return nil
	}
	return results[0].(map[string]any)["reason"]
}

// TestAttackImpersonationWithAnotherDevicesKey: device A's own key, held
// by an attacker, against device B, with mosquitto_pub/_sub and curl
// against a real gatewayd and DynamoDB Local: it cannot connect as B, so
// it can neither publish for B nor take B's session over, and over HTTP it
// can neither post readings for B nor register as B.
func TestAttackImpersonationWithAnotherDevicesKey(t *testing.T) {
	local, view, _, prefix := setup(t)
	keys := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper)
	hwA, hwB := "02:00:00:00:1D:0A", "02:00:00:00:1D:0B"
	keyA, _, err := keys.CreateBound(t.Context(), "device A", hwA)
	require.NoError(t, err)
	keyB, _, err := keys.CreateBound(t.Context(), "device B", hwB)
	require.NoError(t, err)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix)
	url := "tcp://" + d.mqttAddr

	// B is connected, as itself, listening for its acks.
	b := connect(t, d.mqttAddr, hwB, keyB)
	acksB, err := mosquittotest.Sub(t, url, contract.AckTopic(hwB), 1, hwB, keyB, "-i", hwB+"-acks")
	require.NoError(t, err)
	defer acksB.Close()

	boot := uuid.NewString()
	for _, clientID := range []string{hwB, hwB + "-x"} {
		err := mosquittotest.Pub(t, url, contract.ReadingsTopic(hwB), 1, batch(hwB, boot, 0, 2), hwB, keyA, "-i", clientID)
		require.ErrorContains(t, err, "not authori", "A's key connecting as B with client ID %s", clientID)
	}
	require.True(t, b.client.IsConnectionOpen(), "B keeps its session")
	require.Equal(t, contract.StatusAccepted, b.send(t, batch(hwB, boot, 1, 1)).Status, "B still works")
	require.Equal(t, contract.StatusAccepted, nextAck(t, acksB).Status)

	code, answer := curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", keyA, string(batch(hwB, boot, 2, 2)))
	require.Equal(t, 403, code)
	require.Equal(t, "forbidden", firstReason(answer))
	code, answer = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", keyA, registrationJSON(hwB))
	require.Equal(t, 403, code)
	require.Equal(t, "forbidden", answer["reason"])
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", keyA, string(batch(hwA, boot, 0, 1)))
	require.Equal(t, 200, code, "A's key works for A")

	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" }, 60*time.Second, 100*time.Millisecond)
	require.Len(t, view.readings(t, hwB), 1, "only B's own batch reached the cloud")
	require.Contains(t, d.logs.String(), "device refused for its identity")
	require.NotContains(t, d.logs.String(), keyA)
}

// enrollOverMQTT registers hw with the fleet key through mosquitto_pub and
// returns the register ack mosquitto_sub received.
func enrollOverMQTT(t *testing.T, url, hw, fleetKey string) contract.Ack {
	t.Helper()
	acks, err := mosquittotest.Sub(t, url, contract.AckTopic(hw), 1, hw, fleetKey, "-i", hw+"-acks")
	require.NoError(t, err)
	defer acks.Close()
	require.NoError(t, mosquittotest.Pub(t, url, contract.RegisterTopic(hw), 1, []byte(registrationJSON(hw)), hw, fleetKey, "-i", hw))
	return nextAck(t, acks)
}

// TestEnrollmentEndToEnd enrolls one device over MQTT (mosquitto_pub and
// _sub) and one over HTTP (curl) with the fleet key, uses each device key,
// and finds both keys, bound, in api_keys; the fleet key is refused for
// them afterwards and still works for a device that never enrolled.
func TestEnrollmentEndToEnd(t *testing.T) {
	local, view, fleetKey, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix)
	url := "tcp://" + d.mqttAddr
	hwM, hwH, hwOld := "02:00:00:00:1E:01", "02:00:00:00:1E:02", "02:00:00:00:1E:03"

	ack := enrollOverMQTT(t, url, hwM, fleetKey)
	require.Equal(t, contract.StatusRegistered, ack.Status)
	require.Regexp(t, `^[0-9a-f]{64}$`, ack.DeviceKey)
	again := enrollOverMQTT(t, url, hwM, fleetKey)
	require.Equal(t, contract.StatusRegistered, again.Status)
	require.Empty(t, again.DeviceKey, "the second registration gives no other key")
	mqttKey := ack.DeviceKey
	acks, err := mosquittotest.Sub(t, url, contract.AckTopic(hwM), 1, hwM, mqttKey, "-i", hwM+"-acks")
	require.NoError(t, err)
	defer acks.Close()
	require.NoError(t, mosquittotest.Pub(t, url, contract.ReadingsTopic(hwM), 1, batch(hwM, uuid.NewString(), 0, 2), hwM, mqttKey, "-i", hwM))
	require.Equal(t, contract.StatusAccepted, nextAck(t, acks).Status)
	err = mosquittotest.Pub(t, url, contract.ReadingsTopic(hwM), 1, batch(hwM, uuid.NewString(), 1, 2), hwM, fleetKey, "-i", hwM+"-2")
	require.ErrorContains(t, err, "not authori", "the fleet key no longer acts for an enrolled device")

	code, answer := curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hwH))
	require.Equal(t, 201, code)
	httpKey, _ := answer["device_key"].(string)
	require.Regexp(t, `^[0-9a-f]{64}$`, httpKey)
	code, answer = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hwH))
	require.Equal(t, 200, code)
	require.NotContains(t, answer, "device_key")
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", httpKey, string(batch(hwH, uuid.NewString(), 0, 3)))
	require.Equal(t, 200, code)
	code, answer = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", fleetKey, string(batch(hwH, uuid.NewString(), 1, 3)))
	require.Equal(t, 403, code)
	require.Equal(t, "device_key_required", firstReason(answer))
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", fleetKey, string(batch(hwOld, uuid.NewString(), 0, 1)))
	require.Equal(t, 200, code, "a device that never enrolled keeps the fleet key")

	keys := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper)
	for hw, raw := range map[string]string{hwM: mqttKey, hwH: httpKey} {
		require.Eventually(t, func() bool {
			info, found, err := keys.Lookup(t.Context(), raw)
			require.NoError(t, err)
			return found && info.Active && info.HardwareID == hw
		}, 60*time.Second, 100*time.Millisecond, "%s's key reaches api_keys, bound", hw)
	}
	require.NotContains(t, d.logs.String(), mqttKey)
	require.NotContains(t, d.logs.String(), httpKey)
}

// TestEnrollmentDuringOutage enrolls a device over HTTP while DynamoDB
// Local is stopped (SIGSTOP), uses its key, kills gatewayd with SIGKILL
// and starts it again, still offline: the key keeps working, and reaches
// api_keys once the table is back.
func TestEnrollmentDuringOutage(t *testing.T) {
	local := dynamotest.Start(t)
	view := cloudView{client: local.Client(t), tables: local.NewTables(t)}
	keys := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper)
	fleetKey, _, err := keys.Create(t.Context(), "fleet")
	require.NoError(t, err)
	prefix := strings.TrimSuffix(view.tables.Devices, "devices")
	dir := t.TempDir()
	d := startDaemon(t, dir, local.Endpoint, prefix)
	hw, other := "02:00:00:00:1E:11", "02:00:00:00:1E:12"
	// The fleet key is verified (and cached) while the table is up.
	code, _ := curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", fleetKey, string(batch(other, uuid.NewString(), 0, 1)))
	require.Equal(t, 200, code)

	local.Pause(t)
	code, answer := curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hw))
	require.Equal(t, 201, code, "enrollment works offline")
	key, _ := answer["device_key"].(string)
	require.Regexp(t, `^[0-9a-f]{64}$`, key)
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", key, string(batch(hw, uuid.NewString(), 0, 2)))
	require.Equal(t, 200, code)

	require.Error(t, d.stop(t, syscall.SIGKILL))
	d = startDaemon(t, dir, local.Endpoint, prefix)
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", key, string(batch(hw, uuid.NewString(), 1, 2)))
	require.Equal(t, 200, code, "the key survives a kill -9, offline")
	require.Equal(t, "1", d.metric(t, "gateway_auth_device_keys_cloud_pending"))
	lctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	_, found, err := keys.Lookup(lctx, key)
	cancel()
	require.Error(t, err, "the table is still stopped")
	require.False(t, found)

	local.Resume(t)
	require.Eventually(t, func() bool {
		info, found, err := keys.Lookup(t.Context(), key)
		require.NoError(t, err)
		return found && info.Active && info.HardwareID == hw
	}, 60*time.Second, 200*time.Millisecond, "the key reaches api_keys after the outage")
	require.Eventually(t, func() bool { return d.metric(t, "gateway_auth_device_keys_cloud_pending") == "0" },
		30*time.Second, 100*time.Millisecond)
	require.Equal(t, "1", d.metric(t, `gateway_uplink_device_key_writes_total{kind="issued"}`))
}

// TestDeviceKeysRequiredRefusesFleetData runs gatewayd with
// auth.device_keys required: readings with the fleet key are refused over
// MQTT (the ack says device_key_required) and HTTP (403); the fleet key
// enrolls, and the device key carries data.
func TestDeviceKeysRequiredRefusesFleetData(t *testing.T) {
	local, _, fleetKey, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, "GATEWAY_AUTH_DEVICE_KEYS=required")
	url := "tcp://" + d.mqttAddr
	hw := "02:00:00:00:1E:21"
	acks, err := mosquittotest.Sub(t, url, contract.AckTopic(hw), 1, hw, fleetKey, "-i", hw+"-acks")
	require.NoError(t, err)
	defer acks.Close()
	require.NoError(t, mosquittotest.Pub(t, url, contract.ReadingsTopic(hw), 1, batch(hw, uuid.NewString(), 0, 1), hw, fleetKey, "-i", hw))
	ack := nextAck(t, acks)
	require.Equal(t, contract.StatusRejected, ack.Status)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *ack.Reason)
	code, answer := curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", fleetKey, string(batch(hw, uuid.NewString(), 1, 1)))
	require.Equal(t, 403, code)
	require.Equal(t, "device_key_required", firstReason(answer))

	code, answer = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hw))
	require.Equal(t, 201, code)
	key := answer["device_key"].(string)
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", key, string(batch(hw, uuid.NewString(), 2, 1)))
	require.Equal(t, 200, code)
	code, answer = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hw))
	require.Equal(t, 403, code, "a fleet key enrolls a device once")
	require.Equal(t, "device_key_required", answer["reason"])
	require.Equal(t, "1", d.metric(t, `gateway_ingest_batches_total{result="device_key_required",transport="http"}`))
	require.Equal(t, "1", d.metric(t, `gateway_ingest_batches_total{result="device_key_required",transport="mqtt"}`))
}

// TestDeviceKeyRevocationAndReset revokes an enrolled device key in
// api_keys (gatewayctl keys revoke) and checks it is refused within
// auth.refresh_interval; then an operator resets the device (the operator
// API), which lets it enroll again and marks the old key inactive in
// api_keys through the uplink.
func TestDeviceKeyRevocationAndReset(t *testing.T) {
	local, view, fleetKey, prefix := setup(t)
	const token = "reset-token"
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, "GATEWAY_AUTH_REFRESH_INTERVAL=1s", "GATEWAY_ADMIN_TOKEN="+token)
	hw := "02:00:00:00:1E:31"
	code, answer := curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hw))
	require.Equal(t, 201, code)
	key, keyID := answer["device_key"].(string), answer["device_key_id"].(string)
	keys := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper)
	require.Eventually(t, func() bool {
		_, found, err := keys.Lookup(t.Context(), key)
		return err == nil && found
	}, 60*time.Second, 100*time.Millisecond)
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", key, string(batch(hw, uuid.NewString(), 0, 1)))
	require.Equal(t, 200, code)

	ctl := gatewayctlBinary(t)
	env := []string{"GATEWAY_API_KEY_PEPPER=" + e2ePepper, "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local",
		"AWS_REGION=us-east-1"}
	r := runCtl(t, ctl, env, "keys", "revoke", "--dynamodb-endpoint", local.Endpoint, "--table-prefix", prefix, keyID)
	require.Equal(t, 0, r.code)
	start := time.Now()
	require.Eventually(t, func() bool {
		code, _ := curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", key, string(batch(hw, uuid.NewString(), 1, 1)))
		return code == 401
	}, 30*time.Second, 100*time.Millisecond, "a revoked device key is refused")
	t.Logf("revoked device key refused after %s (auth.refresh_interval 1s)", time.Since(start).Round(time.Millisecond))
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hw))
	require.Equal(t, 403, code, "a revoked key does not free the device: only an operator's reset does")

	code, answer = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/devices/"+hw+"/reset-key", token, "")
	require.Equal(t, 200, code)
	require.Equal(t, keyID, answer["revoked_key_id"])
	code, answer = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/register", fleetKey, registrationJSON(hw))
	require.Equal(t, 200, code)
	newKey, _ := answer["device_key"].(string)
	require.Regexp(t, `^[0-9a-f]{64}$`, newKey, "enrolled again after the reset")
	code, _ = curlJSON(t, "POST", "http://"+d.httpAddr+"/v1/readings", newKey, string(batch(hw, uuid.NewString(), 2, 1)))
	require.Equal(t, 200, code)
	require.Eventually(t, func() bool {
		return d.metric(t, `gateway_uplink_device_key_writes_total{kind="revoked"}`) == "1"
	}, 60*time.Second, 100*time.Millisecond)
	info, found, err := keys.Lookup(t.Context(), key)
	require.NoError(t, err)
	require.True(t, found)
	require.False(t, info.Active)
	require.Equal(t, hw, info.HardwareID)
}

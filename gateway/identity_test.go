package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/uplink"
)

var rawKeyPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// postRegister posts a registration and returns the status and the ack.
func postRegister(t *testing.T, h *harness, key string, payload []byte) (int, contract.Ack) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.httpURL+"/v1/register", bytes.NewReader(payload))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var ack contract.Ack
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ack))
	return resp.StatusCode, ack
}

func withDeviceKeys(policy string) func(*gatewayOptions) {
	return func(o *gatewayOptions) { o.auth.DeviceKeys = policy }
}

// requireEnrolled checks an enrolling register ack and returns its key.
func requireEnrolled(t *testing.T, ack contract.Ack) string {
	t.Helper()
	require.Equal(t, contract.StatusRegistered, ack.Status)
	require.Regexp(t, rawKeyPattern, ack.DeviceKey)
	_, err := uuid.Parse(ack.DeviceKeyID)
	require.NoError(t, err)
	return ack.DeviceKey
}

func TestDeviceKeyActsForItsOwnDeviceOnly(t *testing.T) {
	for _, policy := range []string{gateway.DeviceKeysOff, gateway.DeviceKeysPreferred, gateway.DeviceKeysRequired} {
		t.Run(policy, func(t *testing.T) {
			h := startGateway(t, nil, withDeviceKeys(policy))
			victim := "AA:00:00:00:00:0C"

			// MQTT: the bound key cannot connect as another device...
			_, err := connectDevice(t, h, victim, boundKey)
			require.ErrorContains(t, err, "not Authorized")
			// ...but connects as its own.
			own, err := connectDevice(t, h, hwBound, boundKey)
			require.NoError(t, err)
			require.Equal(t, contract.StatusAccepted, publishAndAck(t, own, batchJSON(hwBound, newBoot(), 0, 2)).Status)

			// HTTP: neither readings nor a registration for another device.
			resp, out := postJSON(t, h.httpURL+"/v1/readings", boundKey, batchJSON(victim, newBoot(), 0, 2))
			require.Equal(t, http.StatusForbidden, resp.StatusCode)
			require.Equal(t, contract.ReasonForbidden, *out.Results[0].Reason)
			require.Contains(t, *out.Results[0].Message, "bound to "+hwBound)
			code, ack := postRegister(t, h, boundKey, registration(victim, newBoot()))
			require.Equal(t, http.StatusForbidden, code)
			require.Equal(t, contract.ReasonForbidden, *ack.Reason)
			require.Empty(t, ack.DeviceKey)
			// A request mixing both stores its own batch only.
			mixed := []byte(`{"batches":[` + string(batchJSON(hwBound, newBoot(), 1, 1)) + `,` +
				string(batchJSON(victim, newBoot(), 1, 1)) + `]}`)
			resp, out = postJSON(t, h.httpURL+"/v1/readings", boundKey, mixed)
			require.Equal(t, http.StatusMultiStatus, resp.StatusCode)
			require.Equal(t, contract.StatusAccepted, out.Results[0].Status)
			require.Equal(t, contract.ReasonForbidden, *out.Results[1].Reason)

			_, known := h.devices.Device(victim)
			require.False(t, known, "nothing of the victim was recorded")
			requireAuditByTransport(t, auditOf(t, h, victim, audit.ReasonForbidden), 3)
			require.GreaterOrEqual(t, gatherValue(t, h.reg, "gateway_mqtt_connections_refused_total", "reason", "forbidden"), 1.0)
			// The first series of reason forbidden is transport http (series sort by label values).
			require.GreaterOrEqual(t, gatherValue(t, h.reg, "gateway_auth_identity_refusals_total", "reason", "forbidden"), 3.0)
		})
	}
}

// requireAuditByTransport checks that recs hold http records over HTTP and
// at least one over MQTT (paho tries a refused CONNECT twice: MQTT 3.1.1,
// then 3.1).
func requireAuditByTransport(t *testing.T, recs []audit.Record, http int) {
	t.Helper()
	n := map[string]int{}
	for _, r := range recs {
		n[r.Transport]++
	}
	require.Equal(t, http, n["http"], "%v", recs)
	require.GreaterOrEqual(t, n["mqtt"], 1, "%v", recs)
}

// publishAndAck publishes a batch at QoS 1 and returns its ack.
func publishAndAck(t *testing.T, d *device, payload []byte) contract.Ack {
	t.Helper()
	tok := d.publish(payload)
	require.True(t, tok.WaitTimeout(20*time.Second))
	require.NoError(t, tok.Error())
	return d.nextAck(t)
}

func TestEnrollmentOverMQTT(t *testing.T) {
	h := startGateway(t, nil)
	hw, other := "AA:00:00:00:00:01", "AA:00:00:00:00:02"
	fleet, err := connectDevice(t, h, hw, goodKey)
	require.NoError(t, err)
	key := requireEnrolled(t, fleet.register(t, registration(hw, newBoot())))
	again := fleet.register(t, registration(hw, newBoot()))
	require.Equal(t, contract.StatusRegistered, again.Status)
	require.Empty(t, again.DeviceKey, "a key is issued once")
	// Until the device uses its key, the fleet key still acts for it
	// (firmware that ignores the key keeps working).
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, fleet, batchJSON(hw, newBoot(), 0, 1)).Status)
	fleet.client.Disconnect(100)

	own, err := connectDevice(t, h, hw, key)
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, own, batchJSON(hw, newBoot(), 1, 1)).Status)
	// From now on the fleet key is refused for it, on both transports,
	// and the impostor cannot take the device's session over.
	_, err = connectDevice(t, h, hw, goodKey)
	require.ErrorContains(t, err, "not Authorized")
	require.True(t, own.client.IsConnectionOpen(), "the device keeps its session")
	resp, out := postJSON(t, h.httpURL+"/v1/readings", goodKey, batchJSON(hw, newBoot(), 2, 1))
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *out.Results[0].Reason)
	code, ack := postRegister(t, h, goodKey, registration(hw, newBoot()))
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *ack.Reason)
	// Other devices keep using the fleet key.
	d2, err := connectDevice(t, h, other, goodKey)
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, d2, batchJSON(other, newBoot(), 0, 1)).Status)

	var view struct {
		DeviceKey *gateway.DeviceKeyState `json:"device_key"`
	}
	require.Equal(t, http.StatusOK, adminGet(t, h, "/v1/devices/"+hw, &view))
	require.NotNil(t, view.DeviceKey)
	require.True(t, view.DeviceKey.Used)
	require.True(t, view.DeviceKey.CloudPending, "no uplink runs here")
	requireAuditByTransport(t, auditOf(t, h, hw, audit.ReasonDeviceKeyRequired), 2)
	require.Equal(t, 1.0, gatherValue(t, h.reg, "gateway_auth_enrollments_total", "", ""))
	requireNoKeyInAudit(t, h, key)
}

// requireNoKeyInAudit checks that key reached no audit record.
func requireNoKeyInAudit(t *testing.T, h *harness, key string) {
	t.Helper()
	code, out := getAudit(t, h, adminToken, "")
	require.Equal(t, http.StatusOK, code)
	raw, err := json.Marshal(out)
	require.NoError(t, err)
	require.NotContains(t, string(raw), key)
	requireNoKeysOnDisk(t, h)
}

func TestEnrollmentOverHTTP(t *testing.T) {
	h := startGateway(t, nil)
	hw := "AA:00:00:00:00:03"
	code, ack := postRegister(t, h, goodKey, registration(hw, newBoot()))
	require.Equal(t, http.StatusCreated, code)
	key := requireEnrolled(t, ack)
	code, ack = postRegister(t, h, goodKey, registration(hw, newBoot()))
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, ack.DeviceKey)
	resp, _ := postJSON(t, h.httpURL+"/v1/readings", key, batchJSON(hw, newBoot(), 0, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = postJSON(t, h.httpURL+"/v1/readings", goodKey, batchJSON(hw, newBoot(), 1, 1))
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	code, ack = postRegister(t, h, key, registration(hw, newBoot()))
	require.Equal(t, http.StatusOK, code, "a device registers again with its own key")
	require.Empty(t, ack.DeviceKey)
}

func TestDeviceKeysRequired(t *testing.T) {
	h := startGateway(t, nil, withDeviceKeys(gateway.DeviceKeysRequired))
	hw := "AA:00:00:00:00:04"
	fleet, err := connectDevice(t, h, hw, goodKey)
	require.NoError(t, err, "a fleet key connects to enroll")
	ack := publishAndAck(t, fleet, batchJSON(hw, newBoot(), 0, 1))
	require.Equal(t, contract.StatusRejected, ack.Status)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *ack.Reason)
	resp, out := postJSON(t, h.httpURL+"/v1/readings", goodKey, batchJSON(hw, newBoot(), 0, 1))
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *out.Results[0].Reason)

	key := requireEnrolled(t, fleet.register(t, registration(hw, newBoot())))
	again := fleet.register(t, registration(hw, newBoot()))
	require.Equal(t, contract.StatusRejected, again.Status, "a fleet key enrolls once")
	require.Equal(t, contract.ReasonDeviceKeyRequired, *again.Reason)
	fleet.client.Disconnect(100)
	_, err = connectDevice(t, h, hw, goodKey)
	require.ErrorContains(t, err, "not Authorized", "the device holds its key: a fleet key no longer connects as it")

	own, err := connectDevice(t, h, hw, key)
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, own, batchJSON(hw, newBoot(), 1, 1)).Status)
	code, _ := postRegister(t, h, key, registration(hw, newBoot()))
	require.Equal(t, http.StatusOK, code)
}

func TestDeviceKeysOff(t *testing.T) {
	h := startGateway(t, nil, withDeviceKeys(gateway.DeviceKeysOff))
	hw := "AA:00:00:00:00:05"
	code, ack := postRegister(t, h, goodKey, registration(hw, newBoot()))
	require.Equal(t, http.StatusCreated, code)
	require.Empty(t, ack.DeviceKey, "no enrollment")
	resp, _ := postJSON(t, h.httpURL+"/v1/readings", goodKey, batchJSON(hw, newBoot(), 0, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, has := h.deviceKeys.State(hw)
	require.False(t, has)
}

func TestResetKeyLetsTheDeviceEnrollAgain(t *testing.T) {
	h := startGateway(t, nil)
	hw := "AA:00:00:00:00:06"
	_, ack := postRegister(t, h, goodKey, registration(hw, newBoot()))
	key := requireEnrolled(t, ack)
	resp, _ := postJSON(t, h.httpURL+"/v1/readings", key, batchJSON(hw, newBoot(), 0, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode)

	var reset struct {
		HardwareID    string   `json:"hardware_id"`
		Status        string   `json:"status"`
		RevokedKeyID  *string  `json:"revoked_key_id"`
		RevokedKeyIDs []string `json:"revoked_key_ids"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, h, http.MethodPost, "/v1/devices/"+hw+"/reset-key", adminToken, &reset))
	require.Equal(t, "reset", reset.Status)
	require.Equal(t, ack.DeviceKeyID, *reset.RevokedKeyID)
	pending := h.deviceKeys.PendingKeyWrites(0)
	require.Len(t, pending, 1)
	require.True(t, pending[0].Revoked, "the revocation is work for the uplink")

	// The old key is refused at once; the fleet key enrolls the device again.
	resp, _ = postJSON(t, h.httpURL+"/v1/readings", key, batchJSON(hw, newBoot(), 1, 1))
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	_, err := connectDevice(t, h, hw, key)
	require.ErrorContains(t, err, "not Authorized")
	_, ack = postRegister(t, h, goodKey, registration(hw, newBoot()))
	newKey := requireEnrolled(t, ack)
	require.NotEqual(t, key, newKey)

	// A second reset of a device without a key, and a bad hardware_id.
	require.Equal(t, http.StatusOK, adminDo(t, h, http.MethodPost, "/v1/devices/AA:00:00:00:00:99/reset-key", adminToken, &reset))
	require.Nil(t, reset.RevokedKeyID)
	require.Empty(t, reset.RevokedKeyIDs)
	var bad map[string]string
	require.Equal(t, http.StatusBadRequest, adminDo(t, h, http.MethodPost, "/v1/devices/aa:00/reset-key", adminToken, &bad))
	require.Contains(t, bad["message"], "hardware_id")
	// Without the admin token, nothing.
	req, err := http.NewRequest(http.MethodPost, h.httpURL+"/v1/devices/"+hw+"/reset-key", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+goodKey)
	r, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	r.Body.Close()
	require.Equal(t, http.StatusUnauthorized, r.StatusCode)
}

func TestSessionTakeoversAreRecordedAndFlagged(t *testing.T) {
	h := startGateway(t, nil, withDeviceKeys(gateway.DeviceKeysOff), func(o *gatewayOptions) {
		o.devices.TakeoverFlagCount = 2
	})
	hw := "AA:00:00:00:00:07"
	first, err := connectDevice(t, h, hw, goodKey)
	require.NoError(t, err)
	for i := range 3 {
		_, err := connectDevice(t, h, hw, goodKey)
		require.NoError(t, err, "takeover %d", i)
	}
	require.Eventually(t, func() bool { return !first.client.IsConnectionOpen() }, 10*time.Second, 10*time.Millisecond)
	d, ok := h.devices.Device(hw)
	require.True(t, ok)
	require.EqualValues(t, 3, d.Takeovers)
	require.True(t, d.TakeoverFlagged, "3 takeovers within the hour, over 2")
	recs := auditOf(t, h, hw, audit.ReasonSessionTakeover)
	require.Len(t, recs, 3)
	require.Contains(t, recs[0].Message, "fleet key")
	require.Equal(t, 3.0, gatherValue(t, h.reg, "gateway_mqtt_session_takeovers_total", "key", "fleet"))
	require.Equal(t, 1.0, gatherValue(t, h.reg, "gateway_devices_takeover_flagged", "", ""))
	var view struct {
		Takeovers       int  `json:"takeovers"`
		TakeoverFlagged bool `json:"takeover_flagged"`
	}
	require.Equal(t, http.StatusOK, adminGet(t, h, "/v1/devices/"+hw, &view))
	require.Equal(t, 3, view.Takeovers)
	require.True(t, view.TakeoverFlagged)
}

// keyState opens the device keys kept in dir's buffer.
func keyState(t *testing.T, dir, policy string) (*gateway.DeviceKeys, func()) {
	t.Helper()
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	k, err := gateway.NewDeviceKeys(policy, gateway.Peppers{Current: pepper}, buf, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	return k, func() { require.NoError(t, buf.Close()) }
}

func TestDeviceKeysSurviveRestarts(t *testing.T) {
	dir := t.TempDir()
	hw := "AA:00:00:00:00:08"
	k, closeBuf := keyState(t, dir, gateway.DeviceKeysPreferred)
	raw, keyID, err := k.Enroll(hw)
	require.NoError(t, err)
	require.Regexp(t, rawKeyPattern, raw)
	closeBuf()

	k, closeBuf = keyState(t, dir, gateway.DeviceKeysPreferred)
	raw2, _, err := k.Enroll(hw)
	require.NoError(t, err)
	require.Empty(t, raw2, "issued once, also after a restart")
	pending := k.PendingKeyWrites(0)
	require.Len(t, pending, 1)
	require.Equal(t, keyID, pending[0].Key.KeyID)
	require.Equal(t, hw, pending[0].Key.HardwareID)
	require.False(t, pending[0].Revoked)
	require.NotContains(t, pending[0].Key.Hash, raw, "only the hash is kept")
	k.KeyWritten(pending[0])
	require.Empty(t, k.PendingKeyWrites(0))
	_, err = k.Reset(hw)
	require.NoError(t, err)
	closeBuf()

	k, closeBuf = keyState(t, dir, gateway.DeviceKeysPreferred)
	defer closeBuf()
	pending = k.PendingKeyWrites(0)
	require.Equal(t, []uplink.KeyWrite{{Key: pending[0].Key, Revoked: true}}, pending)
	_, has := k.State(hw)
	require.False(t, has, "the reset survives the restart")
	raw3, _, err := k.Enroll(hw)
	require.NoError(t, err)
	require.NotEmpty(t, raw3)
}

// An enrolled key works while api_keys cannot be reached, before and after
// the uplink wrote it; a revocation in api_keys ends it at the next
// refresh.
func TestEnrolledKeyOfflineAndRevoked(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	keys := newFakeKeys()
	auth, err := gateway.NewAuthenticator(gateway.AuthConfig{RefreshInterval: time.Nanosecond}, gateway.Peppers{Current: pepper},
		keys, buf, nil, nil)
	require.NoError(t, err)
	dk, err := gateway.NewDeviceKeys(gateway.DeviceKeysPreferred, gateway.Peppers{Current: pepper}, buf, nil, nil)
	require.NoError(t, err)
	auth.UseDeviceKeys(dk)
	hw := "AA:00:00:00:00:09"
	raw, keyID, err := dk.Enroll(hw)
	require.NoError(t, err)
	keys.set(func(f *fakeKeys) { f.down = true })
	p, err := auth.Identify(t.Context(), raw)
	require.NoError(t, err, "issued here, not in api_keys yet")
	require.Equal(t, gateway.Principal{KeyID: keyID, HardwareID: hw}, p)

	w := dk.PendingKeyWrites(0)[0]
	keys.set(func(f *fakeKeys) { f.keys[keyID] = w.Key })
	dk.KeyWritten(w)
	p, err = auth.Identify(t.Context(), raw)
	require.NoError(t, err, "written, and the table is down")
	require.Equal(t, hw, p.HardwareID)
	keys.set(func(f *fakeKeys) { f.down = false })
	_, err = auth.Identify(t.Context(), raw)
	require.NoError(t, err)

	// api_keys lost the item (a table recreated): the key still works,
	// and is to be written again.
	keys.set(func(f *fakeKeys) { delete(f.keys, keyID) })
	gateway.SetDeviceKeysClock(dk, func() time.Time { return time.Now().Add(2 * time.Minute) }) // past the index's grace
	_, err = auth.Identify(t.Context(), raw)
	require.NoError(t, err)
	require.Len(t, dk.PendingKeyWrites(0), 1, "written again")
	w = dk.PendingKeyWrites(0)[0]
	keys.set(func(f *fakeKeys) { f.keys[keyID] = w.Key })
	dk.KeyWritten(w)

	keys.set(func(f *fakeKeys) {
		k := f.keys[keyID]
		k.Active = false
		f.keys[keyID] = k
	})
	_, err = auth.Identify(t.Context(), raw)
	require.ErrorIs(t, err, gateway.ErrUnauthorized, "revoked in api_keys")
	require.False(t, strings.Contains(keyID, raw))
}

func TestStatusPageShowsTakeovers(t *testing.T) {
	h := startGateway(t, nil, withDeviceKeys(gateway.DeviceKeysOff), func(o *gatewayOptions) {
		o.devices.TakeoverFlagCount = 1
	})
	hw, calm := "AA:00:00:00:00:0D", "AA:00:00:00:00:0E"
	for range 3 {
		_, err := connectDevice(t, h, hw, goodKey)
		require.NoError(t, err)
	}
	for range 2 {
		_, err := connectDevice(t, h, calm, goodKey) // one takeover: counted, not flagged
		require.NoError(t, err)
	}
	var status struct {
		Devices gateway.FleetStatus `json:"devices"`
	}
	require.Equal(t, http.StatusOK, adminGet(t, h, "/v1/status", &status))
	require.Equal(t, 1, status.Devices.TakeoversFlagged)
	require.Len(t, status.Devices.Attention, 1)
	require.Equal(t, hw, status.Devices.Attention[0].HardwareID)
	require.Contains(t, status.Devices.Attention[0].Reasons[0], "taken over more than 1 times")
	takeovers := map[string]uint64{}
	for _, d := range status.Devices.Recent {
		takeovers[d.HardwareID] = d.Takeovers
	}
	require.Equal(t, map[string]uint64{hw: 2, calm: 1}, takeovers)

	req, err := http.NewRequest(http.MethodGet, h.httpURL+"/", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(page), "<b>1</b>sessions taken over")
	require.Contains(t, string(page), `<span class="badge bad">taken over 2×</span>`)
	require.Contains(t, string(page), `<span class="muted">1 takeovers</span>`)
}

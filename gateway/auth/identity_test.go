package auth_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
)

var rawKeyPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// postRegister posts a registration and returns the status and the ack.
func postRegister(t *testing.T, h *gatewaytest.Gateway, key string, payload []byte) (int, contract.Ack) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.HTTPURL+"/v1/register", bytes.NewReader(payload))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var ack contract.Ack
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ack))
	return resp.StatusCode, ack
}

func withDeviceKeys(policy string) func(*gatewaytest.Options) {
	return func(o *gatewaytest.Options) { o.Auth.DeviceKeys = policy }
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
	for _, policy := range []string{auth.DeviceKeysOff, auth.DeviceKeysPreferred, auth.DeviceKeysRequired} {
		t.Run(policy, func(t *testing.T) {
			h := gatewaytest.Start(t, nil, withDeviceKeys(policy))
			victim := "AA:00:00:00:00:0C"

			// MQTT: the bound key cannot connect as another device...
			_, err := gatewaytest.ConnectDevice(t, h, victim, gatewaytest.BoundKey)
			require.ErrorContains(t, err, "not Authorized")
			// ...but connects as its own.
			own, err := gatewaytest.ConnectDevice(t, h, gatewaytest.HWBound, gatewaytest.BoundKey)
			require.NoError(t, err)
			require.Equal(t, contract.StatusAccepted, publishAndAck(t, own, gatewaytest.BatchJSON(gatewaytest.HWBound, gatewaytest.NewBoot(), 0, 2)).Status)

			// HTTP: neither readings nor a registration for another device.
			resp, out := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.BoundKey, gatewaytest.BatchJSON(victim, gatewaytest.NewBoot(), 0, 2))
			require.Equal(t, http.StatusForbidden, resp.StatusCode)
			require.Equal(t, contract.ReasonForbidden, *out.Results[0].Reason)
			require.Contains(t, *out.Results[0].Message, "bound to "+gatewaytest.HWBound)
			code, ack := postRegister(t, h, gatewaytest.BoundKey, gatewaytest.Registration(victim, gatewaytest.NewBoot()))
			require.Equal(t, http.StatusForbidden, code)
			require.Equal(t, contract.ReasonForbidden, *ack.Reason)
			require.Empty(t, ack.DeviceKey)
			// A request mixing both stores its own batch only.
			mixed := []byte(`{"batches":[` + string(gatewaytest.BatchJSON(gatewaytest.HWBound, gatewaytest.NewBoot(), 1, 1)) + `,` +
				string(gatewaytest.BatchJSON(victim, gatewaytest.NewBoot(), 1, 1)) + `]}`)
			resp, out = gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.BoundKey, mixed)
			require.Equal(t, http.StatusMultiStatus, resp.StatusCode)
			require.Equal(t, contract.StatusAccepted, out.Results[0].Status)
			require.Equal(t, contract.ReasonForbidden, *out.Results[1].Reason)

			_, known := h.Devices.Device(victim)
			require.False(t, known, "nothing of the victim was recorded")
			requireAuditByTransport(t, gatewaytest.AuditOf(t, h, victim, audit.ReasonForbidden), 3)
			require.GreaterOrEqual(t, gatewaytest.GatherValue(t, h.Reg, "gateway_mqtt_connections_refused_total", "reason", "forbidden"), 1.0)
			// The first series of reason forbidden is transport http (series sort by label values).
			require.GreaterOrEqual(t, gatewaytest.GatherValue(t, h.Reg, "gateway_auth_identity_refusals_total", "reason", "forbidden"), 3.0)
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
func publishAndAck(t *testing.T, d *gatewaytest.Device, payload []byte) contract.Ack {
	t.Helper()
	tok := d.Publish(payload)
	require.True(t, tok.WaitTimeout(20*time.Second))
	require.NoError(t, tok.Error())
	return d.NextAck(t)
}

func TestEnrollmentOverMQTT(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw, other := "AA:00:00:00:00:01", "AA:00:00:00:00:02"
	fleet, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err)
	key := requireEnrolled(t, fleet.Register(t, gatewaytest.Registration(hw, gatewaytest.NewBoot())))
	again := fleet.Register(t, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, contract.StatusRegistered, again.Status)
	require.Empty(t, again.DeviceKey, "a key is issued once")
	// Until the device uses its key, the fleet key still acts for it
	// (firmware that ignores the key keeps working).
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, fleet, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1)).Status)
	fleet.Client.Disconnect(100)

	own, err := gatewaytest.ConnectDevice(t, h, hw, key)
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, own, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 1, 1)).Status)
	// From now on the fleet key is refused for it, on both transports,
	// and the impostor cannot take the device's session over.
	_, err = gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.ErrorContains(t, err, "not Authorized")
	require.True(t, own.Client.IsConnectionOpen(), "the device keeps its session")
	resp, out := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 2, 1))
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *out.Results[0].Reason)
	code, ack := postRegister(t, h, gatewaytest.GoodKey, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *ack.Reason)
	// Other devices keep using the fleet key.
	d2, err := gatewaytest.ConnectDevice(t, h, other, gatewaytest.GoodKey)
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, d2, gatewaytest.BatchJSON(other, gatewaytest.NewBoot(), 0, 1)).Status)

	var view struct {
		DeviceKey *registry.KeyState `json:"device_key"`
	}
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw, &view))
	require.NotNil(t, view.DeviceKey)
	require.True(t, view.DeviceKey.Used)
	require.True(t, view.DeviceKey.CloudPending, "no uplink runs here")
	requireAuditByTransport(t, gatewaytest.AuditOf(t, h, hw, audit.ReasonDeviceKeyRequired), 2)
	require.Equal(t, 1.0, gatewaytest.GatherValue(t, h.Reg, "gateway_auth_enrollments_total", "", ""))
	requireNoKeyInAudit(t, h, key)
}

// requireNoKeyInAudit checks that key reached no audit record.
func requireNoKeyInAudit(t *testing.T, h *gatewaytest.Gateway, key string) {
	t.Helper()
	code, out := gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, "")
	require.Equal(t, http.StatusOK, code)
	raw, err := json.Marshal(out)
	require.NoError(t, err)
	require.NotContains(t, string(raw), key)
	gatewaytest.RequireNoKeysOnDisk(t, h)
}

func TestEnrollmentOverHTTP(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:00:00:00:00:03"
	code, ack := postRegister(t, h, gatewaytest.GoodKey, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, http.StatusCreated, code)
	key := requireEnrolled(t, ack)
	code, ack = postRegister(t, h, gatewaytest.GoodKey, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, ack.DeviceKey)
	resp, _ := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", key, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 1, 1))
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	code, ack = postRegister(t, h, key, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, http.StatusOK, code, "a device registers again with its own key")
	require.Empty(t, ack.DeviceKey)
}

func TestDeviceKeysRequired(t *testing.T) {
	h := gatewaytest.Start(t, nil, withDeviceKeys(auth.DeviceKeysRequired))
	hw := "AA:00:00:00:00:04"
	fleet, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err, "a fleet key connects to enroll")
	ack := publishAndAck(t, fleet, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1))
	require.Equal(t, contract.StatusRejected, ack.Status)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *ack.Reason)
	resp, out := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1))
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, contract.ReasonDeviceKeyRequired, *out.Results[0].Reason)

	key := requireEnrolled(t, fleet.Register(t, gatewaytest.Registration(hw, gatewaytest.NewBoot())))
	again := fleet.Register(t, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, contract.StatusRejected, again.Status, "a fleet key enrolls once")
	require.Equal(t, contract.ReasonDeviceKeyRequired, *again.Reason)
	fleet.Client.Disconnect(100)
	_, err = gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.ErrorContains(t, err, "not Authorized", "the device holds its key: a fleet key no longer connects as it")

	own, err := gatewaytest.ConnectDevice(t, h, hw, key)
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, publishAndAck(t, own, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 1, 1)).Status)
	code, _ := postRegister(t, h, key, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, http.StatusOK, code)
}

func TestDeviceKeysOff(t *testing.T) {
	h := gatewaytest.Start(t, nil, withDeviceKeys(auth.DeviceKeysOff))
	hw := "AA:00:00:00:00:05"
	code, ack := postRegister(t, h, gatewaytest.GoodKey, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, http.StatusCreated, code)
	require.Empty(t, ack.DeviceKey, "no enrollment")
	resp, _ := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, has := h.DeviceKeys.State(hw)
	require.False(t, has)
}

func TestResetKeyLetsTheDeviceEnrollAgain(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:00:00:00:00:06"
	_, ack := postRegister(t, h, gatewaytest.GoodKey, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	key := requireEnrolled(t, ack)
	resp, _ := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", key, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode)

	var reset struct {
		HardwareID    string   `json:"hardware_id"`
		Status        string   `json:"status"`
		RevokedKeyID  *string  `json:"revoked_key_id"`
		RevokedKeyIDs []string `json:"revoked_key_ids"`
	}
	require.Equal(t, http.StatusOK, gatewaytest.AdminDo(t, h, http.MethodPost, "/v1/devices/"+hw+"/reset-key", gatewaytest.AdminToken, &reset))
	require.Equal(t, "reset", reset.Status)
	require.Equal(t, ack.DeviceKeyID, *reset.RevokedKeyID)
	pending := h.DeviceKeys.PendingKeyWrites(0)
	require.Len(t, pending, 1)
	require.True(t, pending[0].Revoked, "the revocation is work for the uplink")

	// The old key is refused at once; the fleet key enrolls the device again.
	resp, _ = gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", key, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 1, 1))
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	_, err := gatewaytest.ConnectDevice(t, h, hw, key)
	require.ErrorContains(t, err, "not Authorized")
	_, ack = postRegister(t, h, gatewaytest.GoodKey, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	newKey := requireEnrolled(t, ack)
	require.NotEqual(t, key, newKey)

	// A second reset of a device without a key, and a bad hardware_id.
	require.Equal(t, http.StatusOK, gatewaytest.AdminDo(t, h, http.MethodPost, "/v1/devices/AA:00:00:00:00:99/reset-key", gatewaytest.AdminToken, &reset))
	require.Nil(t, reset.RevokedKeyID)
	require.Empty(t, reset.RevokedKeyIDs)
	var bad map[string]string
	require.Equal(t, http.StatusBadRequest, gatewaytest.AdminDo(t, h, http.MethodPost, "/v1/devices/aa:00/reset-key", gatewaytest.AdminToken, &bad))
	require.Contains(t, bad["message"], "hardware_id")
	// Without the admin token, nothing.
	req, err := http.NewRequest(http.MethodPost, h.HTTPURL+"/v1/devices/"+hw+"/reset-key", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.GoodKey)
	r, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	r.Body.Close()
	require.Equal(t, http.StatusUnauthorized, r.StatusCode)
}

func TestSessionTakeoversAreRecordedAndFlagged(t *testing.T) {
	h := gatewaytest.Start(t, nil, withDeviceKeys(auth.DeviceKeysOff), func(o *gatewaytest.Options) {
		o.Devices.TakeoverFlagCount = 2
	})
	hw := "AA:00:00:00:00:07"
	first, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err)
	for i := range 3 {
		_, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
		require.NoError(t, err, "takeover %d", i)
	}
	require.Eventually(t, func() bool { return !first.Client.IsConnectionOpen() }, 10*time.Second, 10*time.Millisecond)
	d, ok := h.Devices.Device(hw)
	require.True(t, ok)
	require.EqualValues(t, 3, d.Takeovers)
	require.True(t, d.TakeoverFlagged, "3 takeovers within the hour, over 2")
	recs := gatewaytest.AuditOf(t, h, hw, audit.ReasonSessionTakeover)
	require.Len(t, recs, 3)
	require.Contains(t, recs[0].Message, "fleet key")
	require.Equal(t, 3.0, gatewaytest.GatherValue(t, h.Reg, "gateway_mqtt_session_takeovers_total", "key", "fleet"))
	require.Equal(t, 1.0, gatewaytest.GatherValue(t, h.Reg, "gateway_devices_takeover_flagged", "", ""))
	var view struct {
		Takeovers       int  `json:"takeovers"`
		TakeoverFlagged bool `json:"takeover_flagged"`
	}
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw, &view))
	require.Equal(t, 3, view.Takeovers)
	require.True(t, view.TakeoverFlagged)
}

// keyState opens the device keys kept in dir's buffer.
func keyState(t *testing.T, dir, policy string) (*auth.DeviceKeys, func()) {
	t.Helper()
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	k, err := auth.NewDeviceKeys(policy, auth.Peppers{Current: gatewaytest.Pepper}, buf, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	require.NoError(t, k.Load())
	return k, func() { require.NoError(t, buf.Close()) }
}

func TestDeviceKeysSurviveRestarts(t *testing.T) {
	dir := t.TempDir()
	hw := "AA:00:00:00:00:08"
	k, closeBuf := keyState(t, dir, auth.DeviceKeysPreferred)
	raw, keyID, err := k.Enroll(hw)
	require.NoError(t, err)
	require.Regexp(t, rawKeyPattern, raw)
	closeBuf()

	k, closeBuf = keyState(t, dir, auth.DeviceKeysPreferred)
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

	k, closeBuf = keyState(t, dir, auth.DeviceKeysPreferred)
	defer closeBuf()
	pending = k.PendingKeyWrites(0)
	require.Equal(t, []cloud.KeyWrite{{Key: pending[0].Key, Revoked: true}}, pending)
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
	keys := gatewaytest.NewFakeKeys()
	dk, err := auth.NewDeviceKeys(auth.DeviceKeysPreferred, auth.Peppers{Current: gatewaytest.Pepper}, buf, nil, nil)
	require.NoError(t, err)
	require.NoError(t, dk.Load())
	authn, err := auth.NewAuthenticator(auth.AuthConfig{RefreshInterval: time.Nanosecond}, auth.Peppers{Current: gatewaytest.Pepper},
		keys, buf, dk, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	hw := "AA:00:00:00:00:09"
	raw, keyID, err := dk.Enroll(hw)
	require.NoError(t, err)
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Down = true })
	p, err := authn.Identify(t.Context(), raw)
	require.NoError(t, err, "issued here, not in api_keys yet")
	require.Equal(t, auth.Principal{KeyID: keyID, HardwareID: hw}, p)

	w := dk.PendingKeyWrites(0)[0]
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Keys[keyID] = w.Key })
	dk.KeyWritten(w)
	p, err = authn.Identify(t.Context(), raw)
	require.NoError(t, err, "written, and the table is down")
	require.Equal(t, hw, p.HardwareID)
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Down = false })
	_, err = authn.Identify(t.Context(), raw)
	require.NoError(t, err)

	// api_keys lost the item (a table recreated): the key still works,
	// and is to be written again.
	keys.Set(func(f *gatewaytest.FakeKeys) { delete(f.Keys, keyID) })
	auth.SetDeviceKeysClock(dk, func() time.Time { return time.Now().Add(2 * time.Minute) }) // past the index's grace
	_, err = authn.Identify(t.Context(), raw)
	require.NoError(t, err)
	require.Len(t, dk.PendingKeyWrites(0), 1, "written again")
	w = dk.PendingKeyWrites(0)[0]
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Keys[keyID] = w.Key })
	dk.KeyWritten(w)

	keys.Set(func(f *gatewaytest.FakeKeys) {
		k := f.Keys[keyID]
		k.Active = false
		f.Keys[keyID] = k
	})
	_, err = authn.Identify(t.Context(), raw)
	require.ErrorIs(t, err, auth.ErrUnauthorized, "revoked in api_keys")
	require.False(t, strings.Contains(keyID, raw))
}

func TestStatusPageShowsTakeovers(t *testing.T) {
	h := gatewaytest.Start(t, nil, withDeviceKeys(auth.DeviceKeysOff), func(o *gatewaytest.Options) {
		o.Devices.TakeoverFlagCount = 1
	})
	hw, calm := "AA:00:00:00:00:0D", "AA:00:00:00:00:0E"
	for range 3 {
		_, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
		require.NoError(t, err)
	}
	for range 2 {
		_, err := gatewaytest.ConnectDevice(t, h, calm, gatewaytest.GoodKey) // one takeover: counted, not flagged
		require.NoError(t, err)
	}
	var status struct {
		Devices operator.FleetStatus `json:"devices"`
	}
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/status", &status))
	require.Equal(t, 1, status.Devices.TakeoversFlagged)
	require.Len(t, status.Devices.Attention, 1)
	require.Equal(t, hw, status.Devices.Attention[0].HardwareID)
	require.Contains(t, status.Devices.Attention[0].Reasons[0], "taken over more than 1 times")
	takeovers := map[string]uint64{}
	for _, d := range status.Devices.Recent {
		takeovers[d.HardwareID] = d.Takeovers
	}
	require.Equal(t, map[string]uint64{hw: 2, calm: 1}, takeovers)

	req, err := http.NewRequest(http.MethodGet, h.HTTPURL+"/", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(page), "<b>1</b>sessions taken over")
	require.Contains(t, string(page), `<span class="badge bad">taken over 2×</span>`)
	require.Contains(t, string(page), `<span class="muted">1 takeovers</span>`)
}

// TestEveryTakeoverLeavesTheNewSessionWhole takes the sessions of a few
// devices over again and again, as devices on a flaky link do when they
// reconnect before the gateway has seen their old connections drop. Each
// new connection must be counted as a takeover, stay subscribed to its ack
// topic and get its acks: the old connection's end, racing the takeover,
// must not delete the new one from the broker's clients or unsubscribe it.
func TestEveryTakeoverLeavesTheNewSessionWhole(t *testing.T) {
	const devices, connections = 6, 60
	h := gatewaytest.Start(t, nil, withDeviceKeys(auth.DeviceKeysOff))
	hws := make([]string, devices)
	for dev := range hws {
		hws[dev] = fmt.Sprintf("AA:00:00:00:01:%02X", dev)
	}
	var wg sync.WaitGroup
	for _, hw := range hws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := takeOverAgainAndAgain(h, hw, connections); err != nil {
				t.Errorf("%s: %v", hw, err)
			}
		}()
	}
	wg.Wait()
	for _, hw := range hws {
		d, ok := h.Devices.Device(hw)
		require.True(t, ok)
		require.EqualValues(t, connections-1, d.Takeovers, "%s: every connection after the first took the session over", hw)
	}
}

// takeOverAgainAndAgain connects hw n times under one client ID, leaving
// each connection open: each subscribes to the ack topic, publishes a batch
// and must get its PUBACK and its ack.
func takeOverAgainAndAgain(h *gatewaytest.Gateway, hw string, n int) error {
	boot := gatewaytest.NewBoot()
	subscribe := gatewaytest.MQTTPacket(0x82, append(append([]byte{0, 1}, gatewaytest.MQTTString(contract.AckTopic(hw))...), 1))
	for i := range n {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.MQTTAddr, "tcp://"))
		if err != nil {
			return err
		}
		defer c.Close() // each stays open until its successor takes it over
		if _, err := c.Write(gatewaytest.ConnectPacket(4, hw, hw, gatewaytest.GoodKey)); err != nil {
			return err
		}
		if first, body, err := gatewaytest.ReadPacket(c, 10*time.Second); err != nil || first != 0x20 || len(body) != 2 || body[1] != 0 {
			return fmt.Errorf("connection %d: CONNACK %#x %v, %v", i, first, body, err)
		}
		if _, err := c.Write(subscribe); err != nil {
			return err
		}
		if first, _, err := gatewaytest.ReadPacket(c, 10*time.Second); err != nil || first != 0x90 {
			return fmt.Errorf("connection %d: SUBACK %#x, %v", i, first, err)
		}
		batch := gatewaytest.BatchJSON(hw, boot, i, 1)
		var sent struct {
			BatchID string `json:"batch_id"`
		}
		if err := json.Unmarshal(batch, &sent); err != nil {
			return err
		}
		if _, err := c.Write(gatewaytest.MQTTPacket(0x32, append(append(gatewaytest.MQTTString(contract.ReadingsTopic(hw)), 0, 1), batch...))); err != nil {
			return err
		}
		var pubacked, acked bool
		for !pubacked || !acked {
			first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
			if err != nil {
				return fmt.Errorf("connection %d: PUBACK %v, ack %v: %w", i, pubacked, acked, err)
			}
			switch first >> 4 {
			case 4:
				pubacked = true
			case 3:
				if !bytes.Contains(body, []byte(sent.BatchID)) {
					return fmt.Errorf("connection %d: an ack of another batch: %s", i, body)
				}
				acked = true
			}
		}
	}
	return nil
}

package broker_test

import (
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
)

const hwA = "AA:BB:CC:DD:EE:01"

func TestMQTTAcceptDuplicateConflict(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	boot := gatewaytest.NewBoot()
	payload := gatewaytest.BatchJSON(hwA, boot, 0, 3)

	tok := d.Publish(payload)
	require.True(t, tok.WaitTimeout(20*time.Second))
	require.NoError(t, tok.Error())
	a := d.NextAck(t)
	require.Equal(t, contract.StatusAccepted, a.Status)
	require.Equal(t, contract.AckTypeReadings, a.Type)
	require.Nil(t, a.Reason)
	var id string
	{
		b, err := contract.DecodeBatch(payload, hwA, contract.DefaultLimits(), time.Now())
		require.NoError(t, err)
		id = b.BatchID
	}
	require.Equal(t, id, a.BatchID)
	state, err := h.Buf.Lookup(id)
	require.NoError(t, err)
	require.Equal(t, "pending", state, "accepted means stored")

	// The same batch again, with keys in another order and other spacing:
	// still the same payload.
	require.True(t, d.Publish(gatewaytest.Reorder(t, payload)).WaitTimeout(20*time.Second))
	a = d.NextAck(t)
	require.Equal(t, contract.StatusDuplicate, a.Status)
	require.Equal(t, id, a.BatchID)

	// The same batch_id with other readings is a conflict.
	other := strings.Replace(string(payload), "45.2", "45.3", 1)
	require.True(t, d.Publish([]byte(other)).WaitTimeout(20*time.Second))
	a = d.NextAck(t)
	require.Equal(t, contract.StatusRejected, a.Status)
	require.Equal(t, contract.ReasonConflict, *a.Reason)
	require.Contains(t, *a.Message, "different payload")
	require.EqualValues(t, 1, h.Buf.Stats().PendingBatches, "nothing stored twice")
}

func TestMQTTInvalidPayloadsAreRejectedWithReason(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	boot := gatewaytest.NewBoot()
	valid := string(gatewaytest.BatchJSON(hwA, boot, 0, 2))
	tests := []struct {
		name    string
		payload string
		reason  contract.Reason
		msg     string
	}{
		{"not json", `{"batch_id":`, contract.ReasonValidation, "JSON"},
		{"lower case hardware_id", strings.ReplaceAll(valid, hwA, strings.ToLower(hwA)), contract.ReasonValidation, "upper case"},
		{"other device's batch", strings.ReplaceAll(valid, hwA, "AA:BB:CC:DD:EE:02"), contract.ReasonValidation, "hardware_id"},
		{"boot_id not v4", strings.ReplaceAll(valid, boot, "7c9e6679-7425-30de-944b-e07fc1f90ae7"), contract.ReasonValidation, "boot_id"},
		{"unknown field", strings.Replace(valid, `"boot_id"`, `"color":"red","boot_id"`, 1), contract.ReasonValidation, "color"},
		{"string sensor value", strings.Replace(valid, "45.2", `"high"`, 1), contract.ReasonValidation, "sensors.humidity_pct"},
		{"clock not synced", `{"batch_id":"` + hwA + `_x","hardware_id":"` + hwA + `","boot_id":"` + boot +
			`","firmware_version":"1","readings":[{"timestamp_ms":5000,"sensors":{},"sensor_status":{}}]}`,
			contract.ReasonClockNotSynced, "timestamp_ms"},
		{"from the future", `{"batch_id":"` + hwA + `_y","hardware_id":"` + hwA + `","boot_id":"` + boot +
			`","firmware_version":"1","readings":[{"timestamp_ms":4000000000000,"sensors":{},"sensor_status":{}}]}`,
			contract.ReasonValidation, "timestamp_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := d.Publish([]byte(tt.payload))
			require.True(t, tok.WaitTimeout(20*time.Second))
			require.NoError(t, tok.Error(), "an invalid batch is answered, not left unacknowledged")
			a := d.NextAck(t)
			require.Equal(t, contract.StatusRejected, a.Status)
			require.Equal(t, tt.reason, *a.Reason)
			require.Contains(t, *a.Message, tt.msg)
		})
	}
	require.Zero(t, h.Buf.Stats().PendingBatches)
}

// TestMQTTFailedCommitWithholdsPUBACK publishes a batch whose commit fails
// and then a second message on the same connection. mochi handles one
// client's packets in order, so once the second is answered the first
// would have had its PUBACK: it must not have one.
func TestMQTTFailedCommitWithholdsPUBACK(t *testing.T) {
	h := gatewaytest.Start(t, gatewaytest.FailingStore{})
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	failed := d.Publish(gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 2))
	a := d.NextAck(t)
	require.Equal(t, contract.StatusRejected, a.Status)
	require.Equal(t, contract.ReasonBufferFull, *a.Reason, "the ack topic tells firmware to keep the batch")

	// An invalid batch needs no commit, so it is acknowledged.
	answered := d.Publish([]byte(`{}`))
	require.True(t, answered.WaitTimeout(20*time.Second))
	require.Equal(t, contract.StatusRejected, d.NextAck(t).Status)
	select {
	case <-failed.Done():
		t.Fatal("a batch that was not stored got a PUBACK")
	default:
	}
}

func TestMQTTAuthentication(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	tests := []struct {
		name     string
		hw, key  string
		clientID string
	}{
		{"unknown key", hwA, gatewaytest.OtherKey, hwA},
		{"empty key", hwA, "", hwA},
		{"username not a hardware_id", "device-1", gatewaytest.GoodKey, "device-1"},
		{"client id of another device", hwA, gatewaytest.GoodKey, "AA:BB:CC:DD:EE:02"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := paho.NewClientOptions().AddBroker(h.MQTTAddr).SetClientID(tt.clientID).
				SetUsername(tt.hw).SetPassword(tt.key).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second)
			c := paho.NewClient(opts)
			tok := c.Connect()
			require.True(t, tok.WaitTimeout(20*time.Second))
			require.ErrorContains(t, tok.Error(), "not Authorized")
		})
	}

	// A revoked key is refused once the cache refreshes; a second
	// connection suffix is allowed.
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	require.True(t, d.Client.IsConnected())
	opts := paho.NewClientOptions().AddBroker(h.MQTTAddr).SetClientID(hwA + "-acks").
		SetUsername(hwA).SetPassword(gatewaytest.GoodKey).SetAutoReconnect(false)
	c := paho.NewClient(opts)
	require.True(t, c.Connect().WaitTimeout(20*time.Second))
	require.True(t, c.IsConnected())
	c.Disconnect(10)
}

func TestMQTTAuthWorksOfflineFromCache(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	d.Client.Disconnect(10)

	// The api_keys table becomes unreachable: the cached key still works,
	// an unknown key gets "server unavailable", not "not authorized".
	h.Keys.Set(func(f *gatewaytest.FakeKeys) { f.Down = true })
	_, err = gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	_, err = gatewaytest.ConnectDevice(t, h, "AA:BB:CC:DD:EE:03", gatewaytest.OtherKey)
	require.ErrorContains(t, err, "server Unavailable")
}

func TestMQTTDeviceMayNotPublishForAnother(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	// MQTT 3.1.1 has no negative PUBACK: the broker disconnects the client.
	tok := d.Client.Publish(contract.ReadingsTopic("AA:BB:CC:DD:EE:02"), 1, false, gatewaytest.BatchJSON("AA:BB:CC:DD:EE:02", gatewaytest.NewBoot(), 0, 1))
	tok.WaitTimeout(5 * time.Second)
	require.Eventually(t, func() bool { return !d.Client.IsConnectionOpen() }, 20*time.Second, 50*time.Millisecond)
	require.Zero(t, h.Buf.Stats().PendingBatches)

	// Subscribing to another device's acks is refused too.
	d2, err := gatewaytest.ConnectDevice(t, h, "AA:BB:CC:DD:EE:04", gatewaytest.GoodKey)
	require.NoError(t, err)
	sub := d2.Client.Subscribe(contract.AckTopic(hwA), 1, nil)
	require.True(t, sub.WaitTimeout(20*time.Second))
	st := sub.(*paho.SubscribeToken)
	require.Equal(t, byte(0x80), st.Result()[contract.AckTopic(hwA)], "SUBACK failure code")
}

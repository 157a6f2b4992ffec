package broker_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/harness/mosquittotest"
)

// TestMosquittoClientsAgainstTheEmbeddedBroker uses Debian's mosquitto_pub
// and mosquitto_sub, clients independent of ours, against the embedded
// broker: a device's batch is stored and acknowledged on its ack topic;
// publishing as another device is refused and stores nothing.
func TestMosquittoClientsAgainstTheEmbeddedBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs mosquitto-clients")
	}
	h := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:DD:EE:40"
	acks, err := mosquittotest.Sub(t, h.MQTTAddr, contract.AckTopic(hw), 1, hw, gatewaytest.GoodKey, "-i", hw+"-acks")
	require.NoError(t, err)
	defer acks.Close()

	payload := gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 2)
	require.NoError(t, mosquittotest.Pub(t, h.MQTTAddr, contract.ReadingsTopic(hw), 1, payload, hw, gatewaytest.GoodKey, "-i", hw))
	m, err := acks.Next(20 * time.Second)
	require.NoError(t, err)
	var a contract.Ack
	require.NoError(t, json.Unmarshal(m.Payload, &a))
	require.Equal(t, contract.StatusAccepted, a.Status)
	require.EqualValues(t, 1, h.Buf.Stats().PendingBatches)

	// A wrong key is refused at CONNECT.
	err = mosquittotest.Pub(t, h.MQTTAddr, contract.ReadingsTopic(hw), 1, payload, hw, gatewaytest.OtherKey, "-i", hw)
	require.Error(t, err)
	require.Contains(t, strings.ToLower(err.Error()), "not authori")

	// Publishing on another device's topic: the broker drops the client
	// before any PUBACK, and nothing is stored.
	other := "AA:BB:CC:DD:EE:41"
	err = mosquittotest.Pub(t, h.MQTTAddr, contract.ReadingsTopic(other), 1, gatewaytest.BatchJSON(other, gatewaytest.NewBoot(), 0, 1), hw, gatewaytest.GoodKey, "-i", hw)
	require.Error(t, err)
	require.EqualValues(t, 1, h.Buf.Stats().PendingBatches)

	// And taking over another device's client ID is refused.
	err = mosquittotest.Pub(t, h.MQTTAddr, contract.ReadingsTopic(hw), 1, payload, hw, gatewaytest.GoodKey, "-i", other)
	require.Error(t, err)
}

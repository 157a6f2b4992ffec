package contract

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTopic(t *testing.T) {
	tests := []struct {
		name, topic, hw, kind string
		ok                    bool
	}{
		{"readings", "devices/AA:BB:CC:DD:EE:FF/readings", testHW, KindReadings, true},
		{"register", "devices/AA:BB:CC:DD:EE:FF/register", testHW, KindRegister, true},
		{"ack", "devices/AA:BB:CC:DD:EE:FF/ack", testHW, KindAck, true},
		{"lower-case hardware_id", "devices/aa:bb:cc:dd:ee:ff/readings", "", "", false},
		{"unknown kind", "devices/AA:BB:CC:DD:EE:FF/status", "", "", false},
		{"extra level", "devices/AA:BB:CC:DD:EE:FF/readings/x", "", "", false},
		{"trailing slash", "devices/AA:BB:CC:DD:EE:FF/readings/", "", "", false},
		{"no kind", "devices/AA:BB:CC:DD:EE:FF", "", "", false},
		{"wildcard", "devices/+/readings", "", "", false},
		{"multi-level wildcard", "devices/#", "", "", false},
		{"leading slash", "/devices/AA:BB:CC:DD:EE:FF/readings", "", "", false},
		{"other prefix", "device/AA:BB:CC:DD:EE:FF/readings", "", "", false},
		{"empty", "", "", "", false},
		{"kind case", "devices/AA:BB:CC:DD:EE:FF/Readings", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hw, kind, ok := ParseTopic(tt.topic)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.hw, hw)
			require.Equal(t, tt.kind, kind)
		})
	}
}

func TestTopicBuilders(t *testing.T) {
	require.Equal(t, "devices/AA:BB:CC:DD:EE:FF/readings", ReadingsTopic(testHW))
	require.Equal(t, "devices/AA:BB:CC:DD:EE:FF/register", RegisterTopic(testHW))
	require.Equal(t, "devices/AA:BB:CC:DD:EE:FF/ack", AckTopic(testHW))
	for _, topic := range []string{ReadingsTopic(testHW), RegisterTopic(testHW), AckTopic(testHW)} {
		hw, _, ok := ParseTopic(topic)
		require.True(t, ok)
		require.Equal(t, testHW, hw)
	}
}

func TestClientIDAllowed(t *testing.T) {
	tests := []struct {
		name, clientID string
		ok             bool
	}{
		{"hardware_id", testHW, true},
		{"with suffix", testHW + "-acks", true},
		{"dash only", testHW + "-", false},
		{"other separator", testHW + "_acks", false},
		{"other device", "11:22:33:44:55:66", false},
		{"prefix only", "AA:BB:CC", false},
		{"lower case", "aa:bb:cc:dd:ee:ff", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.ok, ClientIDAllowed(tt.clientID, testHW))
		})
	}
}

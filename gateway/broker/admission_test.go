package broker_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/cloud"
)

// gaugeValue returns an unlabelled gauge of reg.
func gaugeValue(t testing.TB, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

const unauthenticatedGauge = "gateway_mqtt_unauthenticated_connections"

// rawConnect sends a CONNECT on c and returns the CONNACK's reason code.
func rawConnect(t *testing.T, c net.Conn, version byte, clientID, hw, key string) byte {
	t.Helper()
	_, err := c.Write(gatewaytest.ConnectPacket(version, clientID, hw, key))
	require.NoError(t, err)
	first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, byte(0x20), first, "CONNACK")
	return body[1]
}

// TestMQTTAdmissionShedsSilentSockets fills the caps on unauthenticated
// connections with sockets that send nothing, from several addresses, and
// checks that the oldest are shed (per address, then overall), that a
// device connecting meanwhile is served, that authenticating releases a
// connection's place and that closed connections leave nothing behind.
func TestMQTTAdmissionShedsSilentSockets(t *testing.T) {
	h := startHostile(t, hostileOptions{maxPending: 40, connectTimeout: 20 * time.Second,
		mqtt: broker.MQTTConfig{MaxUnauthenticatedPerAddress: 10}})
	addr := strings.TrimPrefix(h.MQTTAddr, "tcp://")

	one := openConnsFrom(t, "127.0.0.2", addr, 25, nil)
	require.Equal(t, 15, gatewaytest.ClosedWithin(t, one[:15], time.Now().Add(10*time.Second), 10*time.Second),
		"the 15 oldest of the address are shed")
	require.Equal(t, 15.0, refusedCount(t, h, "shed_address_cap"))
	require.Equal(t, 10.0, gaugeValue(t, h.Reg, unauthenticatedGauge))

	var many []net.Conn
	for i := 3; i <= 6; i++ {
		many = append(many, openConnsFrom(t, fmt.Sprintf("127.0.0.%d", i), addr, 10, nil)...)
	}
	// 50 for a total cap of 40: the 10 oldest of all go, 127.0.0.2's.
	require.Equal(t, 10, gatewaytest.ClosedWithin(t, one[15:], time.Now().Add(10*time.Second), 10*time.Second))
	require.Equal(t, 10.0, refusedCount(t, h, "shed_total_cap"))
	require.Equal(t, 40.0, gaugeValue(t, h.Reg, unauthenticatedGauge))

	// A device connecting now is admitted in place of the oldest silent
	// socket, and leaves the admission once authenticated.
	c := dialMQTT(t, h)
	require.Equal(t, byte(0), rawConnect(t, c, 4, hostileHW, hostileHW, gatewaytest.GoodKey))
	require.Equal(t, 11.0, refusedCount(t, h, "shed_total_cap"))
	require.Equal(t, 39.0, gaugeValue(t, h.Reg, unauthenticatedGauge), "the device no longer counts")
	requireServes(t, h)
	require.Zero(t, refusedCount(t, h, "connect_timeout"))

	for _, c := range many {
		require.NoError(t, c.Close())
	}
	require.Eventually(t, func() bool { return gaugeValue(t, h.Reg, unauthenticatedGauge) == 0 }, 10*time.Second,
		10*time.Millisecond, "closed connections leave the admission")
}

// TestMQTTAdmissionShedsConnectionsCheckingTheirKeyLast checks that a
// connection whose CONNECT was received (its key being looked up) is shed
// only after every connection that sent nothing.
func TestMQTTAdmissionShedsConnectionsCheckingTheirKeyLast(t *testing.T) {
	h := startHostile(t, hostileOptions{maxPending: 5, connectTimeout: 20 * time.Second})
	addr := strings.TrimPrefix(h.MQTTAddr, "tcp://")
	slow := make(chan struct{})
	h.Keys.Mu.Lock()
	h.Keys.Wait = slow
	h.Keys.Mu.Unlock()
	c := dialMQTT(t, h)
	_, err := c.Write(gatewaytest.ConnectPacket(4, hostileHW, hostileHW, gatewaytest.OtherKey))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		h.Keys.Mu.Lock()
		defer h.Keys.Mu.Unlock()
		return h.Keys.Waiting == 1
	}, 10*time.Second, time.Millisecond, "the key is being looked up")
	silent := openConns(t, addr, 8, nil)
	require.Equal(t, 4, gatewaytest.ClosedWithin(t, silent[:4], time.Now().Add(10*time.Second), 10*time.Second))
	close(slow)
	first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
	require.NoError(t, err, "the connection checking its key was kept")
	require.Equal(t, byte(0x20), first)
	require.Equal(t, byte(5), body[1], "not authorized: an unknown key")
}

// addKey stores another active API key in the harness's api_keys.
func addKey(h *gatewaytest.Gateway, keyID, raw string) {
	h.Keys.Mu.Lock()
	defer h.Keys.Mu.Unlock()
	h.Keys.Keys[keyID] = cloud.KeyInfo{KeyID: keyID, Hash: cloud.HashKey(gatewaytest.Pepper, raw), Active: true}
}

// TestMQTTFairSlots checks the limits on connected client IDs per
// hardware_id and per API key: refusals answer CONNACK "quota exceeded"
// (MQTT 5) or "server unavailable" (3.1.1) and are counted by reason, a
// takeover of a connected client ID is neither refused nor counted twice,
// and a closed connection gives its slot back.
func TestMQTTFairSlots(t *testing.T) {
	h := startHostile(t, hostileOptions{mqtt: broker.MQTTConfig{MaxClients: 20, MaxSessionsPerDevice: 3,
		MaxClientsPerKeyPercent: 50}})
	session := func(version byte, clientID, hw, key string) (net.Conn, byte) {
		c := dialMQTT(t, h)
		return c, rawConnect(t, c, version, clientID, hw, key)
	}
	hw := hostileHW
	held := map[string]net.Conn{}
	for _, id := range []string{hw, hw + "-1", hw + "-2"} {
		c, code := session(4, id, hw, gatewaytest.GoodKey)
		require.Equal(t, byte(0), code, id)
		held[id] = c
	}
	t.Run("per device", func(t *testing.T) {
		c, code := session(4, hw+"-3", hw, gatewaytest.GoodKey)
		require.Equal(t, byte(3), code, "MQTT 3.1.1: server unavailable")
		requireClosed(t, c, 5*time.Second)
		c, code = session(5, hw+"-4", hw, gatewaytest.GoodKey)
		require.Equal(t, byte(0x97), code, "MQTT 5: quota exceeded")
		requireClosed(t, c, 5*time.Second)
		require.Equal(t, 2.0, refusedCount(t, h, "device_sessions"))

		// A takeover of a connected client ID keeps its slot.
		c, code = session(4, hw+"-1", hw, gatewaytest.GoodKey)
		require.Equal(t, byte(0), code, "takeover")
		requireClosed(t, held[hw+"-1"], 5*time.Second)
		held[hw+"-1"] = c
		c, code = session(5, hw+"-3", hw, gatewaytest.GoodKey)
		require.Equal(t, byte(0x97), code, "still three client IDs")
		requireClosed(t, c, 5*time.Second)

		require.NoError(t, held[hw+"-2"].Close())
		require.Eventually(t, func() bool {
			c, code := session(4, hw+"-3", hw, gatewaytest.GoodKey)
			if code != 0 {
				return false
			}
			held[hw+"-3"] = c
			return true
		}, 10*time.Second, 20*time.Millisecond, "a closed connection gives its slot back")
		require.GreaterOrEqual(t, refusedCount(t, h, "device_sessions"), 3.0)
	})
	t.Run("per key", func(t *testing.T) {
		// 50% of 20: the key holds 10 client IDs, 3 of them above.
		for i := range 7 {
			other := fmt.Sprintf("AA:BB:CC:DD:E0:%02X", i)
			_, code := session(4, other, other, gatewaytest.GoodKey)
			require.Equal(t, byte(0), code, other)
		}
		c, code := session(5, "AA:BB:CC:DD:E0:FF", "AA:BB:CC:DD:E0:FF", gatewaytest.GoodKey)
		require.Equal(t, byte(0x97), code)
		requireClosed(t, c, 5*time.Second)
		require.Equal(t, 1.0, refusedCount(t, h, "key_share"))
		addKey(h, "k2", "second-fleet-key")
		_, code = session(4, "AA:BB:CC:DD:E0:FF", "AA:BB:CC:DD:E0:FF", "second-fleet-key")
		require.Equal(t, byte(0), code, "another key has its own share")
		_, code = session(4, hw, hw, gatewaytest.GoodKey)
		require.Equal(t, byte(0), code, "a takeover within the key's full share")
	})
}

func TestMQTTConfigValidatesAdmissionSettings(t *testing.T) {
	for _, tt := range []struct {
		cfg     broker.MQTTConfig
		setting string // "" when valid
	}{
		{broker.MQTTConfig{}, ""},
		{broker.MQTTConfig{ConnectTimeout: time.Second, MaxUnauthenticated: 1, MaxUnauthenticatedPerAddress: 1,
			MaxSessionsPerDevice: 1, MaxClientsPerKeyPercent: 100}, ""},
		{broker.MQTTConfig{ConnectTimeout: -time.Second}, "mqtt.connect_timeout: must not be negative"},
		{broker.MQTTConfig{MaxUnauthenticated: -1}, "mqtt.max_unauthenticated: must not be negative"},
		{broker.MQTTConfig{MaxUnauthenticatedPerAddress: -1}, "mqtt.max_unauthenticated_per_address: must not be negative"},
		{broker.MQTTConfig{MaxSessionsPerDevice: -1}, "mqtt.max_sessions_per_device: must not be negative"},
		{broker.MQTTConfig{MaxClientsPerKeyPercent: -1}, "mqtt.max_clients_per_key_percent: must not be negative"},
		{broker.MQTTConfig{MaxClientsPerKeyPercent: 101}, "mqtt.max_clients_per_key_percent: must be at most 100"},
	} {
		err := tt.cfg.Validate()
		if tt.setting == "" {
			require.NoError(t, err)
			continue
		}
		require.EqualError(t, err, tt.setting)
	}
}

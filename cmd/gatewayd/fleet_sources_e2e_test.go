package main

import (
	"bufio"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// TestFleetFromManyAddressesAllConnect has a fleet behind one access point
// connect all at once, 4 devices to each of many loopback source
// addresses, with a key the gateway has not seen yet (checked against the
// cloud at the first CONNECT), each retrying as the contract's firmware
// does on a refusal or a lost connection; every device must get its
// CONNACK 0 at its first try and still be connected once the whole fleet
// is.
func TestFleetFromManyAddressesAllConnect(t *testing.T) {
	const perAddress = 4
	n := attackSize(200, 1000)
	raiseFDLimit(t, uint64(n)+1000)
	d, key := attackDaemon(t)
	srcs := sources(n / perAddress)

	var mu sync.Mutex
	conns := make([]*deviceConn, n)
	failures := map[string]int{} // first failures by kind
	retried := 0
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			hw := fmt.Sprintf("02:00:00:F1:%02X:%02X", i>>8, i&0xff)
			backoff := time.Second
			for try := 0; try < 6; try++ {
				m, code, err := connectFrom(srcs[i%len(srcs)], d.mqttAddr, hw, key, time.Now().Add(30*time.Second))
				if err == nil && code == 0 {
					mu.Lock()
					conns[i] = m
					mu.Unlock()
					return
				}
				mu.Lock()
				if try == 0 {
					retried++
				}
				switch {
				case err != nil:
					failures[err.Error()]++
				default:
					failures[fmt.Sprintf("CONNACK %#x", code)]++
				}
				mu.Unlock()
				if m != nil {
					_ = m.c.Close()
				}
				time.Sleep(backoff)
				backoff *= 2
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, m := range conns {
			if m != nil {
				_ = m.c.Close()
			}
		}
	})
	connected := 0
	for _, m := range conns {
		if m != nil {
			connected++
		}
	}
	t.Logf("%d devices from %d addresses: %d connected, %d needed a retry; failed tries: %v",
		n, len(srcs), connected, retried, failures)
	require.Equal(t, n, connected, "devices with a CONNACK 0 (failed tries: %v)", failures)
	// One lookup of the shared key answers every CONNECT waiting for it:
	// none is throttled (CONNACK 3) under auth.max_lookups_per_second.
	for kind, n := range failures {
		require.False(t, strings.HasPrefix(kind, "CONNACK"), "%d tries refused with %s (failed tries: %v)", n, kind, failures)
	}
	require.Equal(t, float64(n), metricFloat(t, d, "gateway_mqtt_clients_connected"), "connections the gateway holds")
}

// connectFrom is rawConnect from the loopback source address src.
func connectFrom(src, addr, hw, key string, deadline time.Time) (*deviceConn, byte, error) {
	c, err := dialFrom(src, addr, time.Until(deadline))
	if err != nil {
		return nil, 0, err
	}
	m := &deviceConn{c: c, r: bufio.NewReader(c)}
	err = m.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 600,
			ClientIdentifier: hw, UsernameFlag: true, Username: []byte(hw), PasswordFlag: true, Password: []byte(key)}})
	if err != nil {
		return m, 0, err
	}
	typ, body, err := m.next(deadline)
	switch {
	case err != nil:
		return m, 0, fmt.Errorf("waiting for CONNACK: %w", err)
	case typ != packets.Connack || len(body) < 2:
		return m, 0, fmt.Errorf("packet type %d instead of CONNACK", typ)
	}
	return m, body[1], nil
}

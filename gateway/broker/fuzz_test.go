package broker_test

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/harness/gatewaytest"
)

// FuzzMQTTTopicACL checks the broker's access rule against the contract's
// topic parser: a device (a client whose username is a valid hardware_id)
// may publish exactly to its own register and readings topics and
// subscribe exactly to its own ack topic, and whatever it may publish to,
// the ingest path can route.
func FuzzMQTTTopicACL(f *testing.F) {
	_, vectors := gatewaytest.FuzzVectors(f, "readings")
	for _, v := range vectors {
		if v.Sender == "" {
			continue
		}
		for _, topic := range []string{contract.ReadingsTopic(v.Sender), contract.RegisterTopic(v.Sender), contract.AckTopic(v.Sender),
			contract.ReadingsTopic(hwA), "devices/+/readings", "devices/#", "#", contract.ReadingsTopic(v.Sender) + "/", "/" + contract.AckTopic(v.Sender),
			contract.ReadingsTopic(strings.ToLower(v.Sender)), "devices/" + v.Sender + "/ack\x00", "$SYS/broker"} {
			f.Add(v.Sender, topic, true)
			f.Add(v.Sender, topic, false)
		}
	}
	f.Add("", "devices//readings", true)
	f.Fuzz(func(t *testing.T, username, topic string, write bool) {
		allowed := broker.MQTTACLCheck(username, topic, write)
		if contract.ValidHardwareID(username) != nil {
			return // refused at CONNECT (bad_identity): never reaches the ACL
		}
		hw, kind, ok := contract.ParseTopic(topic)
		want := ok && hw == username && (kind == contract.KindAck) != write
		require.Equal(t, want, allowed, "user %q, topic %q, write %v", username, topic, write)
	})
}

// FuzzMQTTSession writes arbitrary bytes after an authenticated CONNECT
// (MQTT 3.1.1 or 5) to a live broker: whatever they are, the broker must
// not crash (a panic in any connection ends the process, and the fuzz
// worker with it) and must keep accepting devices. Each input is one
// connection through the broker's connection guard and mochi, over a
// net.Pipe: a TCP connection per input would exhaust the loopback's
// ephemeral ports (TIME_WAIT) within a minute.
func FuzzMQTTSession(f *testing.F) {
	payloads, vectors := gatewaytest.FuzzVectors(f, "readings")
	for _, version := range []byte{4, 5} {
		props := []byte{}
		if version == 5 {
			props = []byte{0}
		}
		f.Add(version, []byte{0xC0, 0})                                                                                                                          // PINGREQ
		f.Add(version, append([]byte{0xE0}, gatewaytest.MQTTVarint(len(props))...))                                                                              // DISCONNECT
		f.Add(version, gatewaytest.MQTTPacket(0x82, append(append(append([]byte{0, 1}, props...), gatewaytest.MQTTString(contract.AckTopic(hostileHW))...), 1))) // SUBSCRIBE
		f.Add(version, gatewaytest.MQTTPacket(0xA2, append(append([]byte{0, 2}, props...), gatewaytest.MQTTString(contract.AckTopic(hostileHW))...)))            // UNSUBSCRIBE
		for i, p := range payloads {
			if vectors[i].Sender != "" && vectors[i].Sender != hostileHW {
				p = bytes.ReplaceAll(p, []byte(vectors[i].Sender), []byte(hostileHW))
			}
			body := append(append(append(gatewaytest.MQTTString(contract.ReadingsTopic(hostileHW)), 0, 1), props...), p...)
			f.Add(version, gatewaytest.MQTTPacket(0x32, body)) // PUBLISH QoS 1
		}
	}
	// Commits in memory: what is fuzzed is the broker, not the disk.
	_, mqttBroker := startHostileBroker(f, hostileOptions{store: gatewaytest.NewMemStore()})
	f.Fuzz(func(t *testing.T, version byte, data []byte) {
		if version != 5 {
			version = 4
		}
		c, s := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			_ = broker.ServeMQTTConn(mqttBroker, s)
		}()
		defer func() {
			_ = c.Close()
			select {
			case <-served:
			case <-time.After(10 * time.Second):
				t.Fatal("the mqttBroker still serves a closed connection")
			}
		}()
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		_, err := c.Write(gatewaytest.ConnectPacket(version, hostileHW, hostileHW, gatewaytest.GoodKey))
		require.NoError(t, err)
		first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
		require.NoError(t, err, "the mqttBroker accepts a device")
		require.Equal(t, byte(0x20), first)
		require.Equal(t, byte(0), body[1], "CONNACK success")
		drained := make(chan struct{})
		go func() { // the broker's answers: a pipe has no buffer
			defer close(drained)
			_, _ = io.Copy(io.Discard, c)
		}()
		_, _ = c.Write(data) // ends early if the broker closes
		_ = c.Close()
		<-drained
	})
}

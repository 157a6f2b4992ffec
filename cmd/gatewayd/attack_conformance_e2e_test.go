package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/mosquittotest"
)

// mosquittoPubQoS2 publishes payload on hw's readings topic at QoS 2 with
// Debian's mosquitto_pub (-d: it prints the packets it sends and receives)
// and returns its output, or fails t when it does not exit 0.
func mosquittoPubQoS2(t *testing.T, addr, version, hw, key string, payload []byte) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mosquitto_pub", "-h", host, "-p", port, "-V", version, "-u", hw, "-P", key,
		"-i", hw, "-t", contract.ReadingsTopic(hw), "-q", "2", "-d", "-s")
	cmd.Stdin = bytes.NewReader(payload)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "mosquitto_pub -V %s -q 2 exits 0:\n%s", version, out)
	return string(out)
}

// nextAck reads the next message of an ack subscription.
func nextAck(t *testing.T, acks *mosquittotest.Subscription) contract.Ack {
	t.Helper()
	m, err := acks.Next(30 * time.Second)
	require.NoError(t, err)
	var a contract.Ack
	require.NoError(t, json.Unmarshal(m.Payload, &a))
	return a
}

// TestMQTTConformanceMosquittoQoS2 publishes a batch with Debian's
// mosquitto_pub at QoS 2, in MQTT 3.1.1 and 5, to a real gatewayd: the
// client completes the QoS 2 flow (PUBREC, PUBREL, PUBCOMP) and exits 0
// without a protocol error, the ack topic (mosquitto_sub) says accepted,
// and the same batch sent again at QoS 2 is answered duplicate.
func TestMQTTConformanceMosquittoQoS2(t *testing.T) {
	local, _, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix)
	for i, version := range []string{"mqttv311", "mqttv5"} {
		t.Run(version, func(t *testing.T) {
			hw := fmt.Sprintf("02:00:00:00:C2:%02X", i)
			acks, err := mosquittotest.Sub(t, "tcp://"+d.mqttAddr, contract.AckTopic(hw), 1, hw, key,
				"-i", hw+"-acks", "-V", version)
			require.NoError(t, err)
			defer acks.Close()
			payload := batch(hw, uuid.NewString(), 0, 3)
			for _, want := range []contract.Status{contract.StatusAccepted, contract.StatusDuplicate} {
				start := time.Now()
				out := mosquittoPubQoS2(t, d.mqttAddr, version, hw, key, payload)
				for _, step := range []string{"received PUBREC", "sending PUBREL", "received PUBCOMP"} {
					require.Contains(t, out, step, "QoS 2 flow")
				}
				require.NotContains(t, strings.ToLower(out), "protocol error")
				require.Equal(t, want, nextAck(t, acks).Status)
				t.Logf("mosquitto_pub -V %s -q 2: %s, ack seen after %s", version, want, time.Since(start).Round(time.Millisecond))
			}
		})
	}
	require.Eventually(t, func() bool { return d.metric(t, `gateway_uplink_batches_total{result="delivered"}`) == "2" },
		60*time.Second, 100*time.Millisecond, "each batch stored and forwarded once")
}

// rawMQTT is a raw client connection for packets no well-behaved client
// sends.
type rawMQTT struct {
	t *testing.T
	c net.Conn
}

func dialRaw(t *testing.T, src, addr string) *rawMQTT {
	t.Helper()
	c, err := dialFrom(src, addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &rawMQTT{t: t, c: c}
}

// send writes a packet: its first header byte, then body framed with its
// remaining length.
func (r *rawMQTT) send(first byte, body []byte) {
	r.t.Helper()
	_, err := r.c.Write(mqttFrame(first, body))
	require.NoError(r.t, err)
}

// next reads one packet and returns its first header byte and body.
func (r *rawMQTT) next() (byte, []byte) {
	r.t.Helper()
	require.NoError(r.t, r.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	first, body, err := readMQTTPacket(r.c)
	require.NoError(r.t, err)
	return first, body
}

// requireClosed requires that the gateway closes the connection.
func (r *rawMQTT) requireClosed() {
	r.t.Helper()
	require.NoError(r.t, r.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.Copy(io.Discard, r.c)
	require.NoError(r.t, err, "closed by the gateway (EOF), not by the deadline")
}

// v5ConnectBody is an MQTT 5 CONNECT body with the properties props (their
// bytes, without the length).
func v5ConnectBody(hw, key string, props []byte) []byte {
	body := append(append(mqttString("MQTT"), 5, 0xC2, 0, 60), byte(len(props)))
	body = append(append(body, props...), mqttString(hw)...)
	return append(append(body, mqttString(hw)...), mqttString(key)...)
}

// TestAttackMQTTProtocolErrors sends, from another loopback address, the
// MQTT 5 protocol errors a broken client library makes, with a valid key:
// a CONNECT with Receive Maximum 0 (CONNACK 0x82), a CONNECT with an
// Authentication Method (CONNACK 0x8C), an AUTH packet after a plain
// CONNECT (DISCONNECT 0x82). Each connection is closed and counted, and a
// device on another address still gets its batch accepted.
func TestAttackMQTTProtocolErrors(t *testing.T) {
	local, _, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix)
	hw := "02:00:00:00:C3:01"
	rounds := attackSize(3, 300)
	for range rounds {
		r := dialRaw(t, "127.0.0.2", d.mqttAddr)
		r.send(0x10, v5ConnectBody(hw, key, []byte{0x21, 0, 0})) // Receive Maximum 0
		first, body := r.next()
		require.Equal(t, []byte{0x20, 0x82}, []byte{first, body[1]}, "CONNACK protocol error")
		r.requireClosed()

		r = dialRaw(t, "127.0.0.2", d.mqttAddr)
		r.send(0x10, v5ConnectBody(hw, key, append([]byte{0x15}, mqttString("SCRAM-SHA-256")...)))
		first, body = r.next()
		require.Equal(t, []byte{0x20, 0x8C}, []byte{first, body[1]}, "CONNACK bad authentication method")
		r.requireClosed()

		r = dialRaw(t, "127.0.0.2", d.mqttAddr)
		r.send(0x10, v5ConnectBody(hw, key, nil))
		first, body = r.next()
		require.Equal(t, []byte{0x20, 0}, []byte{first, body[1]}, "CONNACK success")
		r.send(0xF0, []byte{0x18, 0}) // AUTH, continue authentication
		first, body = r.next()
		require.Equal(t, []byte{0xE0, 0x82}, []byte{first, body[0]}, "DISCONNECT protocol error")
		r.requireClosed()
	}
	require.Eventually(t, func() bool {
		return d.metric(t, `gateway_mqtt_connections_refused_total{reason="protocol_error"}`) == fmt.Sprint(2*rounds)
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, fmt.Sprint(rounds), d.metric(t, `gateway_mqtt_connections_refused_total{reason="bad_auth_method"}`))

	device := "02:00:00:00:C3:02"
	start := time.Now()
	a := connect(t, d.mqttAddr, device, key).send(t, batch(device, uuid.NewString(), 0, 2))
	require.Equal(t, contract.StatusAccepted, a.Status)
	t.Logf("after %d rounds of protocol errors a device's batch was accepted in %s", rounds, time.Since(start))
}

package broker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
)

// vectorsDir holds the test vectors shared with firmware authors.
const vectorsDir = "../../firmware-contract/testdata"

// vector is one entry of the vectors' index (vectors.json); the fuzz
// targets seed their corpus with the payloads.
type vector struct {
	File   string `json:"file"`
	Sender string `json:"sender"`
	NowMS  int64  `json:"now_ms"`
}

// fuzzVectors returns the payloads of firmware-contract/testdata/<dir>
// with their vectors.
func fuzzVectors(f *testing.F, dir string) (payloads [][]byte, vectors []vector) {
	f.Helper()
	raw, err := os.ReadFile(filepath.Join(vectorsDir, "vectors.json"))
	require.NoError(f, err)
	var all []vector
	require.NoError(f, json.Unmarshal(raw, &all))
	for _, v := range all {
		if !strings.HasPrefix(v.File, dir+"/") {
			continue
		}
		p, err := os.ReadFile(filepath.Join(vectorsDir, v.File))
		require.NoError(f, err)
		payloads = append(payloads, p)
		vectors = append(vectors, v)
	}
	require.NotEmpty(f, payloads)
	return payloads, vectors
}

// memStore is a Committer in memory that can be told to fail or to be
// full, to reach the 503 and 507 answers.
type memStore struct {
	mu      sync.Mutex
	batches map[string][32]byte
	mode    atomic.Int32 // 0 works, 1 fails, 2 full
}

func (m *memStore) Commit(_ context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	switch m.mode.Load() {
	case 1:
		return nil, errors.New("injected: input/output error")
	case 2:
		out := make([]buffer.Outcome, len(entries))
		for i := range out {
			out[i] = buffer.Full
		}
		return out, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]buffer.Outcome, len(entries))
	for i, e := range entries {
		switch h, ok := m.batches[e.BatchID]; {
		case !ok:
			m.batches[e.BatchID] = e.Hash
			out[i] = buffer.Stored
		case h == e.Hash:
			out[i] = buffer.Duplicate
		default:
			out[i] = buffer.Conflict
		}
	}
	return out, nil
}

func (m *memStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(m.Commit).Submit(ctx, entries)
}

// FuzzMQTTTopicACL checks the broker's access rule against the contract's
// topic parser: a device (a client whose username is a valid hardware_id)
// may publish exactly to its own register and readings topics and
// subscribe exactly to its own ack topic, and whatever it may publish to,
// the ingest path can route.
func FuzzMQTTTopicACL(f *testing.F) {
	_, vectors := fuzzVectors(f, "readings")
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
	payloads, vectors := fuzzVectors(f, "readings")
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
	_, mqttBroker := startHostileBroker(f, hostileOptions{store: &memStore{batches: map[string][32]byte{}}})
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

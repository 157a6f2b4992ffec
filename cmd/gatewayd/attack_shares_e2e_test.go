package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	contract "greenhouse-gateway/firmware-contract"
)

// floodTally is what the runaway device saw over all its connections.
type floodTally struct {
	mu       sync.Mutex
	acked    map[string]bool // batch_ids accepted
	accepted map[string]int  // by transport: "http", "mqtt"
	refused  map[string]int  // buffer_full, by transport
	requests map[int]int     // HTTP answers by status code
	bad      []string        // any other answer, or none
}

func (f *floodTally) result(transport string, r contract.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Status == contract.StatusAccepted:
		f.acked[r.BatchID] = true
		f.accepted[transport]++
	case r.Status == contract.StatusRejected && r.Reason != nil && *r.Reason == contract.ReasonBufferFull:
		f.refused[transport]++
	default:
		raw, _ := json.Marshal(r)
		f.badf("%s: %s", transport, raw)
	}
}

func (f *floodTally) badf(format string, args ...any) {
	if len(f.bad) < 20 {
		f.bad = append(f.bad, fmt.Sprintf(format, args...))
	}
}

func (f *floodTally) fail(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.badf(format, args...)
}

// floodBatches makes one connection's batches: unique batch_ids, a new
// boot every 1,000 batches so that timestamps stay in the past and each
// boot's seq rises in the order sent.
type floodBatches struct {
	hw, boot string
	i        int
}

func (b *floodBatches) next() []byte {
	if b.i%1000 == 0 {
		b.boot = uuid.NewString()
	}
	p := noisyBatch(b.hw, b.boot, b.i%1000)
	b.i++
	return p
}

// floodHTTP posts 10 batches a request over one connection of its own
// until stop, each request after the answer to the one before.
func floodHTTP(d *daemon, key, hw string, tally *floodTally, stop <-chan struct{}) {
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	gen := floodBatches{hw: hw}
	for range 1_000_000 {
		select {
		case <-stop:
			return
		default:
		}
		batches := make([][]byte, 10)
		for i := range batches {
			batches[i] = gen.next()
		}
		code, retryAfter, results, err := tryPostWith(client, d, key, batches)
		if err != nil {
			tally.fail("http: %v (status %d)", err, code)
			return
		}
		tally.mu.Lock()
		tally.requests[code]++
		tally.mu.Unlock()
		switch code {
		case http.StatusOK, http.StatusMultiStatus:
		case http.StatusTooManyRequests:
			if retryAfter == "" {
				tally.fail("http: 429 without Retry-After")
			}
		default:
			tally.fail("http: status %d", code)
		}
		if len(results) != len(batches) {
			tally.fail("http: %d results for %d batches", len(results), len(batches))
		}
		for _, r := range results {
			tally.result("http", r)
		}
	}
}

// ackRouter hands each ack to the publisher waiting for its batch_id:
// every session of a device subscribed to its ack topic gets every ack.
type ackRouter struct {
	mu      sync.Mutex
	waiting map[string]chan contract.Ack
}

func (r *ackRouter) expect(batchID string) chan contract.Ack {
	ch := make(chan contract.Ack, 1)
	r.mu.Lock()
	r.waiting[batchID] = ch
	r.mu.Unlock()
	return ch
}

func (r *ackRouter) deliver(a contract.Ack) {
	r.mu.Lock()
	ch := r.waiting[a.BatchID]
	delete(r.waiting, a.BatchID)
	r.mu.Unlock()
	if ch != nil {
		ch <- a
	}
}

// floodSession is one MQTT session of the runaway device over a raw
// socket: CONNECT as clientID, SUBSCRIBE to the ack topic at QoS 1 (each
// ack is PUBACKed), then PUBLISH at QoS 1 until stop, each batch after its
// ack (a refused batch gets no PUBACK, only its ack).
func floodSession(addr, clientID, hw, key string, router *ackRouter, tally *floodTally, stop <-chan struct{}) {
	m, code, err := rawConnect(addr, 4, clientID, hw, key, time.Now().Add(30*time.Second))
	if err != nil || code != 0 {
		tally.fail("mqtt %s: connect: %v (CONNACK %#x)", clientID, err, code)
		return
	}
	suback := make(chan struct{})
	done := make(chan struct{})
	defer func() { <-done }()
	defer m.c.Close() // ends the reader
	go func() {
		defer close(done)
		for {
			first, body, err := readMQTTPacket(m.r)
			if err != nil {
				return
			}
			switch first >> 4 {
			case packets.Suback:
				close(suback)
			case packets.Publish:
				pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: (first >> 1) & 3,
					Remaining: len(body)}, ProtocolVersion: 4}
				if err := pk.PublishDecode(body); err != nil {
					tally.fail("mqtt %s: ack packet: %v", clientID, err)
					return
				}
				if pk.FixedHeader.Qos > 0 {
					_ = m.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID})
				}
				var a contract.Ack
				if err := json.Unmarshal(pk.Payload, &a); err != nil {
					tally.fail("mqtt %s: ack %q: %v", clientID, pk.Payload, err)
					continue
				}
				router.deliver(a)
			}
		}
	}()
	if err := m.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: contract.AckTopic(hw), Qos: 1}}}); err != nil {
		tally.fail("mqtt %s: subscribe: %v", clientID, err)
		return
	}
	select {
	case <-suback:
	case <-time.After(30 * time.Second):
		tally.fail("mqtt %s: no SUBACK", clientID)
		return
	}
	gen := floodBatches{hw: hw}
	for n := range 1_000_000 {
		select {
		case <-stop:
			return
		default:
		}
		payload := gen.next()
		var head struct {
			BatchID string `json:"batch_id"`
		}
		_ = json.Unmarshal(payload, &head)
		ack := router.expect(head.BatchID)
		if err := m.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
			PacketID: uint16(2 + n%65000), TopicName: contract.ReadingsTopic(hw), Payload: payload}); err != nil {
			tally.fail("mqtt %s: publish: %v", clientID, err)
			return
		}
		select {
		case a := <-ack:
			tally.result("mqtt", contract.Result{BatchID: a.BatchID, Status: a.Status, Reason: a.Reason, Message: a.Message})
		case <-time.After(30 * time.Second):
			tally.fail("mqtt %s: no ack for %s within 30 s", clientID, head.BatchID)
			return
		}
	}
}

// TestAttackRunawayDeviceOverSevenConnections: with the uplink down
// (DynamoDB Local paused) and buffer.max_pending_bytes 1 MiB (8 MiB under
// make attack), one device with a valid key sends unique valid batches as
// fast as it can over 3 HTTP connections and 4 MQTT sessions at once (client
// IDs HW, HW-1, HW-2, HW-3) for 2 s (10 s), while a second device with its
// own key sends over HTTP and MQTT. Every answer the runaway gets is
// accepted, or buffer_full (HTTP 429 with Retry-After, or 207 with
// buffer_full results): never validation_error, never silence; the second
// device is accepted throughout; gatewayctl buffer inspect then shows the
// runaway holding its every acknowledged batch, within its fair share
// (1/2 of the budget with 2 devices seen) and filled up to it; once
// DynamoDB answers, every acknowledged batch is delivered once.
func TestAttackRunawayDeviceOverSevenConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gatewayd")
	}
	budget := int64(attackSize(1<<20, 8<<20))
	flood := attackSizeDuration(2*time.Second, 10*time.Second)
	local, view, prefix, runawayKey, otherKey := runawayCloud(t)
	dataDir := t.TempDir()
	env := []string{fmt.Sprintf("GATEWAY_BUFFER_MAX_PENDING_BYTES=%d", budget), "GATEWAY_AUTH_DEVICE_KEYS=off"}
	start := startDaemon
	if attackFull() {
		start = startPlainDaemon
	}
	d := start(t, dataDir, local.Endpoint, prefix, env...)
	runaway, other := "02:00:00:00:BC:01", "02:00:00:00:BC:02"
	oboot := uuid.NewString()
	otherAcked := map[string]bool{}

	// Both keys are verified and cached, and both devices seen, while
	// DynamoDB answers.
	otherMQTT := connect(t, d.mqttAddr, other, otherKey)
	ack := otherMQTT.send(t, batch(other, oboot, 0, 2))
	require.Equal(t, contract.StatusAccepted, ack.Status)
	otherAcked[ack.BatchID] = true
	tally := &floodTally{acked: map[string]bool{}, accepted: map[string]int{}, refused: map[string]int{}, requests: map[int]int{}}
	code, _, res := postBatches(t, d, runawayKey, [][]byte{batch(runaway, uuid.NewString(), 0, 2)})
	require.Equal(t, http.StatusOK, code)
	tally.result("http", res[0])
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond)
	local.Pause(t)

	stop := make(chan struct{})
	router := &ackRouter{waiting: map[string]chan contract.Ack{}}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { floodHTTP(d, runawayKey, runaway, tally, stop) })
	}
	for i := range 4 {
		id := runaway
		if i > 0 {
			id = fmt.Sprintf("%s-%d", runaway, i)
		}
		wg.Go(func() { floodSession(d.mqttAddr, id, runaway, runawayKey, router, tally, stop) })
	}
	began := time.Now()
	otherSent := 0
	for i := 1; time.Since(began) < flood && i < 10_000; i += 2 {
		if i%50 == 1 { // a new boot, so that batch's timestamps stay in the past
			oboot = uuid.NewString()
		}
		a := otherMQTT.send(t, batch(other, oboot, i%50, 2))
		require.Equal(t, contract.StatusAccepted, a.Status, "the other device over MQTT: %+v", a)
		otherAcked[a.BatchID] = true
		code, _, res := postBatches(t, d, otherKey, [][]byte{batch(other, oboot, i%50+1, 2)})
		require.Equal(t, http.StatusOK, code, "the other device over HTTP: %+v", res)
		otherAcked[res[0].BatchID] = true
		otherSent += 2
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	took := time.Since(began)

	tally.mu.Lock()
	defer tally.mu.Unlock()
	require.Empty(t, tally.bad, "answers the runaway must never get")
	refusedBy := map[string]string{}
	for _, r := range []string{"device_share", "key_share", "device_rate", "budget", "free_space"} {
		refusedBy[r] = d.metric(t, `gateway_buffer_refused_batches_total{reason="`+r+`"}`)
	}
	t.Logf("%s of flood: runaway accepted %d (http %d, mqtt %d), refused buffer_full http %d, mqtt %d; "+
		"HTTP answers %v; refused by reason %v; other device accepted %d of %d",
		took.Round(time.Millisecond), len(tally.acked), tally.accepted["http"], tally.accepted["mqtt"],
		tally.refused["http"], tally.refused["mqtt"], tally.requests, refusedBy, len(otherAcked)-1, otherSent)
	require.Positive(t, tally.requests[http.StatusTooManyRequests], "the runaway was told to wait over HTTP")
	require.Positive(t, tally.refused["mqtt"], "the runaway was told to wait over MQTT")
	require.Positive(t, tally.accepted["mqtt"])
	require.NotEqual(t, "0", refusedBy["device_share"])
	require.Equal(t, "0", refusedBy["budget"], "the runaway never filled the whole budget")
	require.Equal(t, "0", refusedBy["free_space"])

	// What the runaway holds, read from the stopped buffer.
	require.NoError(t, d.stop(t, syscall.SIGTERM))
	r := runCtl(t, gatewayctlBinary(t), nil, "buffer", "inspect", "--json", "--data-dir", dataDir)
	require.Zero(t, r.code, r.stderr)
	var in buffer.Inspection
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &in))
	held := map[string]buffer.DeviceCount{}
	for _, dc := range in.Devices {
		held[dc.HardwareID] = dc
	}
	// The fair share of 2 devices seen: max(buffer.device_share 1/8, 1/2).
	share := budget / 2
	// What the budget counts per batch beyond its payload record (its
	// marker's record and the records' overhead), at most; and the
	// largest batch sent.
	const perBatch, largest = 512, 16 << 10
	rw := held[runaway]
	require.Equal(t, int64(len(tally.acked))-1, rw.Batches, "the runaway's acknowledged batches are all held")
	require.LessOrEqual(t, rw.Bytes, share, "the runaway holds at most its share")
	require.Greater(t, rw.Bytes, share-largest-rw.Batches*perBatch, "the runaway was accepted up to its share")
	require.Equal(t, int64(len(otherAcked)-1), held[other].Batches)
	t.Logf("runaway holds %d batches, %d bytes of its share of %d (budget %d); other device %d batches, %d bytes",
		rw.Batches, rw.Bytes, share, budget, held[other].Batches, held[other].Bytes)

	local.Resume(t)
	d = start(t, dataDir, local.Endpoint, prefix, env...)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		5*time.Minute, 200*time.Millisecond)
	markers := view.markers(t)
	for id := range tally.acked {
		require.Equal(t, 1, markers[id], "batch %s delivered", id)
	}
	for id := range otherAcked {
		require.Equal(t, 1, markers[id], "batch %s delivered", id)
	}
	require.Len(t, markers, len(tally.acked)+len(otherAcked), "nothing refused reached the cloud")
	// Once: the held batches were each written once, none found in the
	// cloud already.
	requireDeliveredOnce(t, d, rw.Batches+held[other].Batches)
	require.NoError(t, d.stop(t, syscall.SIGTERM))
}

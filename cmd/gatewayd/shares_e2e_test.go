package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
)

// publishForAck publishes at QoS 1 and waits for the ack alone: a batch
// refused as buffer_full gets no PUBACK.
func (d *mqttDevice) publishForAck(t *testing.T, payload []byte) contract.Ack {
	t.Helper()
	d.client.Publish(contract.ReadingsTopic(d.hw), 1, false, payload)
	select {
	case a := <-d.acks:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no ack")
		return contract.Ack{}
	}
}

// TestARunawayDeviceLeavesTheOthersServed runs gatewayd with a small
// buffer.max_pending_bytes and DynamoDB Local paused (the uplink down):
// one device with a valid key sends unique valid batches over several
// HTTP and MQTT connections until it is told to wait; a second device
// with its own key is still accepted over HTTP and MQTT, the runaway is
// answered 429 (HTTP) and buffer_full (MQTT), never validation_error; once
// DynamoDB answers, every acknowledged batch is delivered once.
func TestARunawayDeviceLeavesTheOthersServed(t *testing.T) {
	local, view, prefix, runawayKey, otherKey := runawayCloud(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix,
		"GATEWAY_BUFFER_MAX_PENDING_BYTES=262144", "GATEWAY_AUTH_DEVICE_KEYS=off")
	runaway, other := "02:00:00:00:BB:01", "02:00:00:00:BB:02"
	rboot, oboot := uuid.NewString(), uuid.NewString()
	acked := map[string]bool{}
	note := func(results []contract.Result) {
		for _, r := range results {
			if r.Status == contract.StatusAccepted {
				acked[r.BatchID] = true
			}
			if r.Reason != nil {
				require.Equal(t, contract.ReasonBufferFull, *r.Reason, "a refusal for the share is never %s", *r.Reason)
			}
		}
	}
	// Both keys are verified and cached, and both devices seen, while
	// DynamoDB answers.
	mqttRunaway := connect(t, d.mqttAddr, runaway, runawayKey)
	otherMQTT := connect(t, d.mqttAddr, other, otherKey)
	ack := otherMQTT.send(t, batch(other, oboot, 0, 2))
	require.Equal(t, contract.StatusAccepted, ack.Status)
	acked[ack.BatchID] = true
	code, _, res := postBatches(t, d, runawayKey, [][]byte{batch(runaway, rboot, 0, 2)})
	require.Equal(t, http.StatusOK, code)
	note(res)
	local.Pause(t)

	next := 1
	limited := false
	for range 400 {
		var batches [][]byte
		for range 10 {
			batches = append(batches, noisyBatch(runaway, rboot, next))
			next++
		}
		code, retryAfter, res := postBatches(t, d, runawayKey, batches)
		note(res)
		if code == http.StatusTooManyRequests {
			require.NotEmpty(t, retryAfter, "429 carries Retry-After")
			limited = true
			break
		}
		require.Contains(t, []int{http.StatusOK, http.StatusMultiStatus}, code)
	}
	require.True(t, limited, "the runaway was never told to wait; logs:\n%s", d.logs.String())
	a := mqttRunaway.publishForAck(t, noisyBatch(runaway, rboot, next))
	next++
	require.Equal(t, contract.StatusRejected, a.Status)
	require.Equal(t, contract.ReasonBufferFull, *a.Reason, "over MQTT: keep it, resend later")

	// The other device is still accepted, over MQTT and HTTP.
	for i := 1; i <= 5; i++ {
		ack := otherMQTT.send(t, batch(other, oboot, i, 2))
		require.Equal(t, contract.StatusAccepted, ack.Status)
		acked[ack.BatchID] = true
	}
	code, _, res = postBatches(t, d, otherKey, [][]byte{batch(other, oboot, 6, 2), batch(other, oboot, 7, 2)})
	require.Equal(t, http.StatusOK, code, "the other device over HTTP")
	note(res)
	require.NotEqual(t, "0", d.metric(t, `gateway_buffer_refused_batches_total{reason="device_share"}`))
	require.Equal(t, "0", d.metric(t, `gateway_buffer_refused_batches_total{reason="budget"}`))

	local.Resume(t)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		120*time.Second, 200*time.Millisecond)
	markers := view.markers(t)
	for id := range acked {
		require.Equal(t, 1, markers[id], "batch %s delivered once", id)
	}
	require.Len(t, markers, len(acked), "nothing refused reached the cloud")
}

// runawayCloud starts DynamoDB Local with tables of their own and an API
// key each for a runaway device and another one.
func runawayCloud(t *testing.T) (local *dynamotest.Local, view cloudView, prefix, runawayKey, otherKey string) {
	t.Helper()
	local = dynamotest.Start(t)
	view = cloudView{client: local.Client(t), tables: local.NewTables(t)}
	keys := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper)
	runawayKey, _, err := keys.Create(context.Background(), "runaway")
	require.NoError(t, err)
	otherKey, _, err = keys.Create(context.Background(), "other")
	require.NoError(t, err)
	return local, view, strings.TrimSuffix(view.tables.Devices, "devices"), runawayKey, otherKey
}

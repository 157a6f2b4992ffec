package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/lambdatest"
)

// These tests run the Lambda path with real parts: gatewayd (a process)
// with uplink.target lambda → the serialising proxy → the Runtime
// Interface Emulator running the readings function → DynamoDB Local.

// readingsFunction is the readings function under the emulator.
type readingsFunction struct {
	url string // the Invoke API, one invoke at a time
	em  *lambdatest.Emulator
}

// startFunction runs the readings function under the Runtime Interface
// Emulator against the tables of prefix at endpoint, configured with the
// three documented variables alone (it probes DynamoDB Local's
// transaction limit itself).
func startFunction(t *testing.T, endpoint, prefix string) *readingsFunction {
	t.Helper()
	em := lambdatest.Start(t, lambdatest.BuildFunction(t), map[string]string{
		"API_KEY_PEPPER": e2ePepper, "TABLE_PREFIX": prefix, "DYNAMODB_ENDPOINT": endpoint,
		"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("emulator and function output:\n%s", em.Output())
		}
	})
	return &readingsFunction{url: em.Endpoint, em: em}
}

// kill kills the emulator and the function with SIGKILL.
func (f *readingsFunction) kill(t *testing.T) {
	t.Helper()
	f.em.Kill()
}

// start starts the emulator again on its ports.
func (f *readingsFunction) start(t *testing.T) {
	t.Helper()
	require.NoError(t, f.em.Restart())
}

// lambdaEnv is gatewayd's environment for the lambda target at url.
func lambdaEnv(url string, extra ...string) []string {
	return append([]string{"GATEWAY_UPLINK_TARGET=lambda", "GATEWAY_UPLINK_LAMBDA_FUNCTION=function",
		"GATEWAY_UPLINK_LAMBDA_ENDPOINT=" + url, "GATEWAY_UPLINK_LAMBDA_TIMEOUT=20s"}, extra...)
}

// ackedLoad is what devices had acknowledged: batch_id → readings.
type ackedLoad struct {
	mu    sync.Mutex
	acked map[string]int
}

func (l *ackedLoad) add(id string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked[id] = n
}

// checkExactlyOnce checks that every acknowledged batch's readings and
// marker are in the tables once, and nothing else.
func checkExactlyOnce(t *testing.T, view cloudView, hws []string, l *ackedLoad) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	want := 0
	for _, n := range l.acked {
		want += n
	}
	got := 0
	for _, hw := range hws {
		for k, n := range view.readings(t, hw) {
			require.Equal(t, 1, n, "reading %s stored once", k)
			got++
		}
	}
	require.Equal(t, want, got, "every acknowledged reading is in the table")
	markers := view.markers(t)
	require.Len(t, markers, len(l.acked))
	for id := range l.acked {
		require.Equal(t, 1, markers[id], "marker of %s", id)
	}
}

// fleetLoad publishes perDevice batches from each of devices MQTT devices
// and one HTTP device, and returns their hardware ids.
func fleetLoad(t *testing.T, d *daemon, key string, l *ackedLoad, devices, perDevice int, tag byte) []string {
	t.Helper()
	var hws []string
	var wg sync.WaitGroup
	for i := range devices {
		hw := fmt.Sprintf("02:00:00:%02X:01:%02X", tag, i)
		hws = append(hws, hw)
		dev := connect(t, d.mqttAddr, hw, key)
		boot := uuid.NewString()
		wg.Go(func() {
			for k := range perDevice {
				p := batch(hw, boot, k, 1+k%4)
				a := dev.send(t, p)
				require.Equal(t, contract.StatusAccepted, a.Status)
				l.add(a.BatchID, 1+k%4)
			}
		})
	}
	hw := fmt.Sprintf("02:00:00:%02X:02:00", tag)
	hws = append(hws, hw)
	boot := uuid.NewString()
	for k := 0; k < perDevice; k += 5 {
		var payloads [][]byte
		for j := k; j < min(k+5, perDevice); j++ {
			payloads = append(payloads, batch(hw, boot, j, 2))
		}
		code, _, results := postBatches(t, d, key, payloads)
		require.Equal(t, http.StatusOK, code)
		for _, r := range results {
			require.Equal(t, contract.StatusAccepted, r.Status)
			l.add(r.BatchID, 2)
		}
	}
	wg.Wait()
	return hws
}

func TestLambdaUplinkEndToEnd(t *testing.T) {
	local, view, key, prefix := setup(t)
	fn := startFunction(t, local.Endpoint, prefix)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, lambdaEnv(fn.url)...)
	l := &ackedLoad{acked: map[string]int{}}
	hws := fleetLoad(t, d, key, l, 6, 10, 0xA1)

	// A registration: the device record goes through the function too.
	hw := "02:00:00:A1:03:00"
	dev := connect(t, d.mqttAddr, hw, key)
	tok := dev.client.Publish(contract.RegisterTopic(hw), 1, false, []byte(`{"hardware_id":"`+hw+`","boot_id":"`+uuid.NewString()+
		`","firmware_version":"1.0.16","friendly_name":"lambda-1","capabilities":{"sensors":["bme280"],"features":{}}}`))
	require.True(t, tok.WaitTimeout(30*time.Second))

	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	checkExactlyOnce(t, view, hws, l)
	require.Eventually(t, func() bool {
		out, err := view.client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(view.tables.Devices),
			Key: map[string]types.AttributeValue{"hardware_id": &types.AttributeValueMemberS{Value: hw}}})
		require.NoError(t, err)
		return out.Item != nil && out.Item["friendly_name"].(*types.AttributeValueMemberS).Value == "lambda-1"
	}, 60*time.Second, 100*time.Millisecond, "the device record reached the devices table through the function")
	require.Positive(t, metricFloat(t, d, `gateway_uplink_lambda_invocations_total{outcome="ok"}`))
	for _, op := range []string{"TransactWriteItems", "BatchWriteItem", "PutItem", "UpdateItem"} {
		require.Contains(t, []string{"", "0"}, d.metric(t, `gateway_uplink_request_duration_seconds_count{operation="`+op+`"}`),
			"the gateway wrote no table itself (%s)", op)
	}
}

// A gateway in lambda mode forwards batches of 10 readings, which take 11
// actions in one transaction, one more than DynamoDB Local takes: none is
// dead-lettered, every one is in the tables once.
func TestLambdaUplinkDeliversBatchesAboveDynamoDBLocalsTransactionLimit(t *testing.T) {
	local, view, key, prefix := setup(t)
	fn := startFunction(t, local.Endpoint, prefix)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, lambdaEnv(fn.url)...)
	l := &ackedLoad{acked: map[string]int{}}
	hw := "02:00:00:A4:01:00"
	dev := connect(t, d.mqttAddr, hw, key)
	boot := uuid.NewString()
	for k := range 20 {
		a := dev.send(t, batch(hw, boot, k, 10))
		require.Equal(t, contract.StatusAccepted, a.Status)
		l.add(a.BatchID, 10)
	}
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	require.Equal(t, 0.0, metricFloat(t, d, `gateway_uplink_batches_total{result="dead_lettered"}`), "logs:\n%s", d.logs.String())
	checkExactlyOnce(t, view, []string{hw}, l)
}

// killAtMidDrain waits until d delivered some batches and more are
// pending, then kills it with SIGKILL.
func killAtMidDrain(t *testing.T, d *daemon) {
	t.Helper()
	require.Eventually(t, func() bool {
		return metricFloat(t, d, `gateway_uplink_batches_total{result="delivered"}`) >= 10
	}, 60*time.Second, 10*time.Millisecond, "logs:\n%s", d.logs.String())
	require.NotEqual(t, "0", d.metric(t, "gateway_buffer_pending_batches"), "killed during the drain, not after it")
	require.NoError(t, d.cmd.Process.Kill())
	<-d.exited
	d.exited <- nil
}

// TestLambdaUplinkKillDashNineDuringDrain builds a backlog while the
// function is unreachable, kills gatewayd with SIGKILL in the middle of
// its drain through the function, and checks that a restarted gatewayd
// delivers every acknowledged batch exactly once.
func TestLambdaUplinkKillDashNineDuringDrain(t *testing.T) {
	local, view, key, prefix := setup(t)
	fn := startFunction(t, local.Endpoint, prefix)
	dataDir := t.TempDir()
	d := startDaemon(t, dataDir, local.Endpoint, prefix, lambdaEnv("http://"+freeAddr(t))...)
	l := &ackedLoad{acked: map[string]int{}}
	hws := fleetLoad(t, d, key, l, 8, 25, 0xA2)
	require.Empty(t, view.markers(t), "nothing reached the cloud yet")
	require.NoError(t, d.cmd.Process.Kill())
	<-d.exited
	d.exited <- nil

	// Small invocations, one at a time: a drain long enough to kill.
	d = startDaemon(t, dataDir, local.Endpoint, prefix, lambdaEnv(fn.url, "GATEWAY_UPLINK_LAMBDA_MAX_ITEMS=2",
		"GATEWAY_UPLINK_LAMBDA_CONCURRENCY=1", "GATEWAY_UPLINK_LAMBDA_MAX_CONCURRENCY=1")...)
	killAtMidDrain(t, d)

	d = startDaemon(t, dataDir, local.Endpoint, prefix, lambdaEnv(fn.url)...)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	checkExactlyOnce(t, view, hws, l)
}

// TestLambdaUplinkEmulatorKilledMidBatch kills the Runtime Interface
// Emulator (and the function under it) while gatewayd drains a backlog
// through it, starts it again, and checks that every acknowledged batch
// is in the tables exactly once.
func TestLambdaUplinkEmulatorKilledMidBatch(t *testing.T) {
	local, view, key, prefix := setup(t)
	fn := startFunction(t, local.Endpoint, prefix)
	fn.kill(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, lambdaEnv(fn.url, "GATEWAY_UPLINK_LAMBDA_MAX_ITEMS=2")...)
	l := &ackedLoad{acked: map[string]int{}}
	hws := fleetLoad(t, d, key, l, 8, 25, 0xA3)
	require.Empty(t, view.markers(t), "nothing reached the cloud yet")

	fn.start(t)
	require.Eventually(t, func() bool {
		return metricFloat(t, d, `gateway_uplink_batches_total{result="delivered"}`) >= 10
	}, 60*time.Second, 10*time.Millisecond, "logs:\n%s", d.logs.String())
	errorsBefore := metricFloat(t, d, `gateway_uplink_lambda_invocations_total{outcome="error"}`)
	fn.kill(t)
	require.NotEqual(t, "0", d.metric(t, "gateway_buffer_pending_batches"), "killed during the drain, not after it")
	require.Eventually(t, func() bool {
		return metricFloat(t, d, `gateway_uplink_lambda_invocations_total{outcome="error"}`) > errorsBefore
	}, 60*time.Second, 50*time.Millisecond, "the uplink saw the emulator go")
	fn.start(t)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	checkExactlyOnce(t, view, hws, l)
}

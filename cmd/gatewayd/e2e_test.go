package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/mosquittotest"
	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/harness/syncbuf"
	"greenhouse-gateway/internal/cloud"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

const e2ePepper = "e2e-pepper"

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// gatewaydBinary builds gatewayd once per test run.
func gatewaydBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gatewayd-e2e")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "gatewayd")
		out, err := exec.Command("go", "build", "-race", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := proc.FreeAddr()
	require.NoError(t, err)
	return addr
}

// daemon is one gatewayd process.
type daemon struct {
	cmd      *exec.Cmd
	mqttAddr string
	httpAddr string
	logs     *syncbuf.Buffer
	exited   chan error
}

// startDaemon runs gatewayd on fresh loopback ports and waits for /readyz.
func startDaemon(t *testing.T, dataDir, endpoint, prefix string, extraEnv ...string) *daemon {
	t.Helper()
	return startDaemonBinary(t, gatewaydBinary(t), dataDir, endpoint, prefix, extraEnv...)
}

// startDaemonBinary is startDaemon with the gatewayd binary bin.
func startDaemonBinary(t *testing.T, bin, dataDir, endpoint, prefix string, extraEnv ...string) *daemon {
	t.Helper()
	d := &daemon{mqttAddr: freeAddr(t), httpAddr: freeAddr(t), logs: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	d.cmd = exec.Command(bin, "--data-dir", dataDir, "--dynamodb-endpoint", endpoint,
		"--table-prefix", prefix, "--mqtt-addr", d.mqttAddr, "--http-addr", d.httpAddr, "--log-level", "debug")
	d.cmd.Env = append(os.Environ(), "GATEWAY_API_KEY_PEPPER="+e2ePepper, "AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local", "AWS_REGION=us-east-1",
		// Fast retries so that tests see recovery quickly.
		"GATEWAY_UPLINK_MAX_BACKOFF=500ms", "GATEWAY_UPLINK_REQUEST_TIMEOUT=3s", "GATEWAY_UPLINK_POLL_INTERVAL=200ms",
		"GATEWAY_UPLINK_MAX_DELAY=200ms")
	d.cmd.Env = append(d.cmd.Env, extraEnv...)
	d.cmd.Stdout = d.logs
	d.cmd.Stderr = d.logs
	require.NoError(t, d.cmd.Start())
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.exited
		if t.Failed() {
			t.Logf("gatewayd logs:\n%s", d.logs.String())
		}
		d.exited <- nil
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + d.httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond, "gatewayd did not become ready; logs:\n%s", d.logs.String())
	return d
}

// stop sends sig and waits for the process to exit.
func (d *daemon) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(sig))
	select {
	case err := <-d.exited:
		d.exited <- err
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("gatewayd did not exit after %v; logs:\n%s", sig, d.logs.String())
		return nil
	}
}

func (d *daemon) metric(t *testing.T, series string) string {
	t.Helper()
	resp, err := http.Get("http://" + d.httpAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v
		}
	}
	return ""
}

// mqttDevice connects as hw with key and collects acks.
type mqttDevice struct {
	hw     string
	client paho.Client
	acks   chan contract.Ack
}

func connect(t *testing.T, addr, hw, key string) *mqttDevice {
	t.Helper()
	d := &mqttDevice{hw: hw, acks: make(chan contract.Ack, 1000)}
	d.client = paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(hw).
		SetUsername(hw).SetPassword(key).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second))
	tok := d.client.Connect()
	require.True(t, tok.WaitTimeout(30*time.Second))
	require.NoError(t, tok.Error())
	sub := d.client.Subscribe(contract.AckTopic(hw), 1, func(_ paho.Client, m paho.Message) {
		var a contract.Ack
		if json.Unmarshal(m.Payload(), &a) == nil {
			d.acks <- a
		}
	})
	require.True(t, sub.WaitTimeout(30*time.Second))
	require.NoError(t, sub.Error())
	t.Cleanup(func() { d.client.Disconnect(50) })
	return d
}

// send publishes at QoS 1 and waits for both the PUBACK and the ack.
func (d *mqttDevice) send(t *testing.T, payload []byte) contract.Ack {
	t.Helper()
	tok := d.client.Publish(contract.ReadingsTopic(d.hw), 1, false, payload)
	require.True(t, tok.WaitTimeout(30*time.Second), "no PUBACK")
	require.NoError(t, tok.Error())
	select {
	case a := <-d.acks:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no ack")
		return contract.Ack{}
	}
}

func batch(hw, boot string, i, n int) []byte {
	end := time.Now().Add(-time.Hour).UnixMilli() + int64(i)*60_000
	var readings []string
	for k := range n {
		readings = append(readings, fmt.Sprintf(`{"timestamp_ms":%d,"sensors":{"bme280_temp_c":%.1f,"humidity_pct":45.2},"sensor_status":{"bme280":"ok"}}`,
			end-int64(n-k)*1000, 20+float64(k)/10))
	}
	return []byte(fmt.Sprintf(`{"batch_id":"%s_%s_%d_%d","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16","seq":%d,"readings":[%s]}`,
		hw, boot, end-60_000, end, hw, boot, i, strings.Join(readings, ",")))
}

type cloudView struct {
	client *dynamodb.Client
	tables cloud.Tables
}

func (c cloudView) readings(t *testing.T, hw string) map[string]int {
	t.Helper()
	out, err := c.tryReadings(hw)
	require.NoError(t, err)
	return out
}

// tryReadings counts hw's readings by ts_batch. It reads the keys only, in
// pages of 1,000: DynamoDB Local (256 MiB heap) answers 500 to a Query
// returning whole items of a 100,000-reading partition.
func (c cloudView) tryReadings(hw string) (map[string]int, error) {
	out := map[string]int{}
	p := dynamodb.NewQueryPaginator(c.client, &dynamodb.QueryInput{
		TableName:                 aws.String(c.tables.Readings),
		KeyConditionExpression:    aws.String("hardware_id = :hw"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: hw}},
		ProjectionExpression:      aws.String("ts_batch"),
		Limit:                     aws.Int32(1000),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			out[it["ts_batch"].(*types.AttributeValueMemberS).Value]++
		}
	}
	return out, nil
}

func (c cloudView) markers(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	p := dynamodb.NewScanPaginator(c.client, &dynamodb.ScanInput{TableName: aws.String(c.tables.ProcessedBatches)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		require.NoError(t, err)
		for _, it := range page.Items {
			out[it["batch_id"].(*types.AttributeValueMemberS).Value]++
		}
	}
	return out
}

func setup(t *testing.T) (*dynamotest.Local, cloudView, string, string) {
	t.Helper()
	local := dynamotest.Shared(t)
	view := cloudView{client: local.Client(t), tables: local.NewTables(t)}
	key, _, err := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper).Create(context.Background(), "e2e")
	require.NoError(t, err)
	prefix := strings.TrimSuffix(view.tables.Devices, "devices")
	return local, view, key, prefix
}

func TestEndToEndMQTTToDynamoDB(t *testing.T) {
	local, view, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix)
	hw := "02:00:00:00:AA:01"
	dev := connect(t, d.mqttAddr, hw, key)
	boot := uuid.NewString()
	payload := batch(hw, boot, 0, 3)
	a := dev.send(t, payload)
	require.Equal(t, contract.StatusAccepted, a.Status)

	// Delivered: in batch mode the marker follows the readings, and the
	// buffer marks the batch delivered after both.
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" }, 60*time.Second, 100*time.Millisecond)
	require.Len(t, view.readings(t, hw), 3)
	require.Equal(t, map[string]int{a.BatchID: 1}, view.markers(t))

	// A replay is a duplicate and causes no second write.
	require.Equal(t, contract.StatusDuplicate, dev.send(t, payload).Status)
	require.Equal(t, "1", d.metric(t, `gateway_uplink_batches_total{result="delivered"}`))
	require.Equal(t, "0", d.metric(t, `gateway_uplink_batches_total{result="already_delivered"}`))
	require.Equal(t, "0", d.metric(t, "gateway_buffer_pending_batches"))
	// Same batch_id, other content: conflict.
	c := dev.send(t, []byte(strings.Replace(string(payload), "45.2", "45.9", 1)))
	require.Equal(t, contract.ReasonConflict, *c.Reason)

	require.NoError(t, d.stop(t, syscall.SIGTERM), "graceful stop exits 0")
	require.Contains(t, d.logs.String(), "gatewayd stopped")
}

// TestKillDashNineLosesNothingAcknowledged acknowledges batches while the
// cloud is unreachable, kills gatewayd with SIGKILL before it could forward
// anything, and checks that a restarted gatewayd delivers every
// acknowledged batch exactly once.
func TestKillDashNineLosesNothingAcknowledged(t *testing.T) {
	local, view, key, prefix := setup(t)
	dataDir := t.TempDir()
	hw := "02:00:00:00:AA:02"

	// First run: the device's key is verified and cached on disk.
	d := startDaemon(t, dataDir, local.Endpoint, prefix)
	connect(t, d.mqttAddr, hw, key).client.Disconnect(50)
	require.NoError(t, d.stop(t, syscall.SIGTERM))

	// Second run: DynamoDB unreachable (nothing listens there).
	dead := "http://" + freeAddr(t)
	d = startDaemon(t, dataDir, dead, prefix)
	dev := connect(t, d.mqttAddr, hw, key)
	boot := uuid.NewString()
	acked := map[string]int{} // batch_id → readings
	var payloads [][]byte
	for i := range 25 {
		n := 1 + i%12 // some above DynamoDB Local's 10-action transactions
		payloads = append(payloads, batch(hw, boot, i, n))
		a := dev.send(t, payloads[i])
		require.Equal(t, contract.StatusAccepted, a.Status)
		acked[a.BatchID] = n
	}
	require.Equal(t, "25", d.metric(t, "gateway_buffer_pending_batches"))
	require.NoError(t, d.cmd.Process.Kill()) // kill -9
	<-d.exited
	d.exited <- nil
	require.Empty(t, view.markers(t), "nothing reached the cloud before the kill")

	// Third run: the cloud is back.
	d = startDaemon(t, dataDir, local.Endpoint, prefix)
	want := 0
	for _, n := range acked {
		want += n
	}
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		90*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	readings := view.readings(t, hw)
	require.Len(t, readings, want)
	for k, n := range readings {
		require.Equal(t, 1, n, "reading %s stored once", k)
	}
	markers := view.markers(t)
	require.Len(t, markers, len(acked))
	for id := range acked {
		require.Equal(t, 1, markers[id], "marker of %s", id)
	}
	// The restarted gateway still knows the batches: a resend is a duplicate.
	dev = connect(t, d.mqttAddr, hw, key)
	require.Equal(t, contract.StatusDuplicate, dev.send(t, payloads[3]).Status)
}

func TestHTTPIngestEndToEnd(t *testing.T) {
	local, view, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix)
	hw := "02:00:00:00:AA:03"
	boot := uuid.NewString()
	body := `{"batches":[` + string(batch(hw, boot, 0, 2)) + `,` + string(batch(hw, boot, 1, 2)) + `]}`
	req, err := http.NewRequest(http.MethodPost, "http://"+d.httpAddr+"/v1/readings", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	require.Eventually(t, func() bool { return len(view.readings(t, hw)) == 4 }, 60*time.Second, 100*time.Millisecond)
}

// TestDynamoDBOutageAcknowledgesThenDeliversOnce hangs DynamoDB Local
// (SIGSTOP) while a device publishes: every batch is still acknowledged
// from the buffer, the uplink reports down, and once DynamoDB is back each
// batch is delivered exactly once.
func TestDynamoDBOutageAcknowledgesThenDeliversOnce(t *testing.T) {
	local := dynamotest.Start(t)
	view := cloudView{client: local.Client(t), tables: local.NewTables(t)}
	key, _, err := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper).Create(context.Background(), "outage")
	require.NoError(t, err)
	prefix := strings.TrimSuffix(view.tables.Devices, "devices")
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix)
	hw := "02:00:00:00:AA:04"
	dev := connect(t, d.mqttAddr, hw, key)
	boot := uuid.NewString()
	require.Equal(t, contract.StatusAccepted, dev.send(t, batch(hw, boot, 0, 2)).Status)
	require.Eventually(t, func() bool { return len(view.readings(t, hw)) == 2 }, 60*time.Second, 100*time.Millisecond)

	local.Pause(t)
	want := 2
	for i := 1; i <= 15; i++ {
		require.Equal(t, contract.StatusAccepted, dev.send(t, batch(hw, boot, i, i)).Status)
		want += i
	}
	require.Eventually(t, func() bool { return d.metric(t, "gateway_uplink_up") == "0" }, 60*time.Second, 100*time.Millisecond)
	local.Resume(t)

	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		90*time.Second, 100*time.Millisecond)
	require.Equal(t, "1", d.metric(t, "gateway_uplink_up"))
	readings := view.readings(t, hw)
	require.Len(t, readings, want)
	for k, n := range readings {
		require.Equal(t, 1, n, "reading %s stored once", k)
	}
	require.Len(t, view.markers(t), 16)
}

// TestRegistrationReachesDevicesTableAndRevocationTakesEffect registers a
// device through the daemon, checks its record in the devices table, then
// revokes its key in api_keys and checks that the next CONNECT is refused
// once the refresh interval has passed.
func TestRegistrationReachesDevicesTableAndRevocationTakesEffect(t *testing.T) {
	local, view, key, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, "GATEWAY_AUTH_REFRESH_INTERVAL=1s")
	hw := "02:00:00:00:AA:05"
	dev := connect(t, d.mqttAddr, hw, key)
	boot := uuid.NewString()
	tok := dev.client.Publish(contract.RegisterTopic(hw), 1, false, []byte(`{"hardware_id":"`+hw+`","boot_id":"`+boot+
		`","firmware_version":"1.0.16","friendly_name":"bench-3","capabilities":{"sensors":["bme280"],"features":{"tft_display":false}}}`))
	require.True(t, tok.WaitTimeout(30*time.Second))
	var ack contract.Ack
	select {
	case ack = <-dev.acks:
	case <-time.After(30 * time.Second):
		t.Fatal("no register ack")
	}
	require.Equal(t, contract.StatusRegistered, ack.Status)

	var item map[string]types.AttributeValue
	require.Eventually(t, func() bool {
		out, err := view.client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(view.tables.Devices),
			Key: map[string]types.AttributeValue{"hardware_id": &types.AttributeValueMemberS{Value: hw}}})
		require.NoError(t, err)
		item = out.Item
		return item != nil
	}, 60*time.Second, 100*time.Millisecond)
	require.Equal(t, ack.ConfirmationID, item["confirmation_id"].(*types.AttributeValueMemberS).Value)
	require.Equal(t, boot, item["last_boot_id"].(*types.AttributeValueMemberS).Value)
	require.Equal(t, "bench-3", item["friendly_name"].(*types.AttributeValueMemberS).Value)
	dev.client.Disconnect(50)

	keys := cloud.NewKeys(view.client, view.tables.APIKeys, e2ePepper)
	info, found, err := keys.Lookup(context.Background(), key)
	require.NoError(t, err)
	require.True(t, found)
	require.NoError(t, keys.Revoke(context.Background(), info.KeyID))
	require.Eventually(t, func() bool {
		c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + d.mqttAddr).SetClientID(hw).
			SetUsername(hw).SetPassword(key).SetAutoReconnect(false))
		tok := c.Connect()
		tok.WaitTimeout(10 * time.Second)
		if tok.Error() == nil {
			c.Disconnect(10)
			return false
		}
		return strings.Contains(tok.Error().Error(), "not Authorized")
	}, 30*time.Second, 200*time.Millisecond, "the revoked key is refused at CONNECT")
}

// TestExternalBrokerModeSurvivesKillDashNine runs gatewayd against Debian's
// mosquitto in external mode: devices publish with mosquitto_pub at QoS 1,
// gatewayd is killed with SIGKILL, more batches are published while it is
// down, and a restarted gatewayd (same client ID, persistent session)
// delivers every batch to DynamoDB exactly once.
func TestExternalBrokerModeSurvivesKillDashNine(t *testing.T) {
	local, view, _, prefix := setup(t)
	broker := mosquittotest.Start(t)
	dataDir := t.TempDir()
	env := []string{"GATEWAY_MQTT_MODE=external", "GATEWAY_MQTT_EXTERNAL_URL=" + broker.URL(),
		"GATEWAY_MQTT_EXTERNAL_CLIENT_ID=gw-e2e"}
	d := startDaemon(t, dataDir, local.Endpoint, prefix, env...)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_mqtt_external_connected") == "1" }, 30*time.Second, 50*time.Millisecond)

	hw := "02:00:00:00:AA:06"
	boot := uuid.NewString()
	acks, err := mosquittotest.Sub(t, broker.URL(), contract.AckTopic(hw), 1, "", "")
	require.NoError(t, err)
	defer acks.Close()
	want := 0
	send := func(i int) {
		n := 1 + i%4
		want += n
		require.NoError(t, mosquittotest.Pub(t, broker.URL(), contract.ReadingsTopic(hw), 1, batch(hw, boot, i, n), "", ""))
	}
	for i := range 5 {
		send(i)
	}
	for range 5 {
		m, err := acks.Next(30 * time.Second)
		require.NoError(t, err)
		var a contract.Ack
		require.NoError(t, json.Unmarshal(m.Payload, &a))
		require.Equal(t, contract.StatusAccepted, a.Status)
	}
	require.NoError(t, d.cmd.Process.Kill())
	<-d.exited
	d.exited <- nil

	// The gateway is down; the broker holds these for its session.
	for i := 5; i < 15; i++ {
		send(i)
	}
	d = startDaemon(t, dataDir, local.Endpoint, prefix, env...)
	require.Eventually(t, func() bool {
		return len(view.readings(t, hw)) == want && d.metric(t, "gateway_buffer_pending_batches") == "0"
	}, 90*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	for k, n := range view.readings(t, hw) {
		require.Equal(t, 1, n, "reading %s stored once", k)
	}
	require.Len(t, view.markers(t), 15)
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

// envPowerCutCycles sets how many power cuts TestPowerCutLosesNothingAcknowledged
// makes (default 10).
const envPowerCutCycles = "GATEWAY_POWERCUT_CYCLES"

// envPowerCutStrict, when set, runs the power-cut tests with faultfs.Strict:
// only a directory fsync makes a name durable, only a file's own fsync its
// size.
const envPowerCutStrict = "GATEWAY_POWERCUT_STRICT"

func powerCutCycles(t *testing.T) int {
	t.Helper()
	v := os.Getenv(envPowerCutCycles)
	if v == "" {
		return 10
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, envPowerCutCycles)
	require.Positive(t, n, envPowerCutCycles)
	return n
}

// TestPowerCutLosesNothingAcknowledged runs gatewayd with its data
// directory on faultfs while MQTT and HTTP devices publish, and repeatedly
// kills it with SIGKILL at a random moment, cuts the power (everything not
// fsynced is lost: file data, and names no fsync committed; every other
// cut is torn: half of the pages overwritten since their file's last
// fsync, chosen at random, keep their new content) and
// starts it again on what survived. At the end every acknowledged batch must be in
// DynamoDB Local exactly once, and nothing stored twice.
func TestPowerCutLosesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	cycles := powerCutCycles(t)
	ffs := mountPowerCutDisk(t)
	local, view, key, prefix := setup(t)
	dataDir := powerCutDataDir(t, ffs)

	d := startDaemon(t, dataDir, local.Endpoint, prefix)
	load := &powerCutLoad{key: key, ledger: map[string]int{}}
	load.cur.Store(d)
	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	var devices []string
	var wg sync.WaitGroup
	for i := range 5 {
		hw := fmt.Sprintf("02:00:00:00:CC:%02X", i)
		devices = append(devices, hw)
		run := load.mqttDevice
		if i >= 3 {
			run = load.httpDevice
		}
		wg.Go(func() { run(ctx, hw) })
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	for c := range cycles {
		time.Sleep(time.Duration(200+rng.IntN(1000)) * time.Millisecond)
		require.NoError(t, d.cmd.Process.Kill()) // kill -9 under load
		<-d.exited
		d.exited <- nil
		if c%2 == 0 {
			require.NoError(t, ffs.PowerCut(), "cut %d", c+1)
		} else { // some pages written since the last fsync reached the disk
			require.NoError(t, ffs.PowerCutTorn(0.5, rng.Uint64()), "cut %d", c+1)
		}
		d = startDaemon(t, dataDir, local.Endpoint, prefix)
		load.cur.Store(d)
	}
	time.Sleep(time.Second)
	stopLoad()
	wg.Wait()

	waitDrained(t, d)
	acked, sent := load.figures()
	lost, duplicated := 0, 0
	markers := view.markers(t)
	stored := map[string]int{} // batch_id → readings in the cloud
	for _, hw := range devices {
		for tsBatch, n := range view.readings(t, hw) {
			_, id, _ := strings.Cut(tsBatch, "#")
			stored[id]++
			if n != 1 {
				duplicated++
				t.Errorf("reading %s stored %d times", tsBatch, n)
			}
		}
	}
	for id, n := range markers {
		if n != 1 {
			duplicated++
			t.Errorf("marker %s stored %d times", id, n)
		}
	}
	for id, n := range acked {
		if markers[id] != 1 || stored[id] != n {
			lost++
			t.Errorf("acknowledged batch %s (%d readings): %d markers, %d readings in the cloud", id, n, markers[id], stored[id])
		}
	}
	st := ffs.Stats()
	t.Logf("power cuts: %d, half of them torn (undone: %d files rolled back, %d bytes, %d unsynced pages kept, %d files dropped, %d names restored); "+
		"batches sent %d, acknowledged %d, in the cloud %d; acknowledged lost %d, stored twice %d",
		st.Cuts, st.FilesRolled, st.BytesUndone, st.PagesKept, st.FilesDropped, st.NamesRestored, sent, len(acked), len(markers), lost, duplicated)
	require.GreaterOrEqual(t, ffs.Cuts(), cycles)
	require.NotEmpty(t, acked)
}

// powerCutLoad is the devices of the power-cut test and what they were
// acknowledged.
type powerCutLoad struct {
	key string
	cur atomic.Pointer[daemon]

	mu     sync.Mutex
	ledger map[string]int // acknowledged batch_id → readings
	sent   int
}

func (l *powerCutLoad) acked(id string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ledger[id] = n
}

func (l *powerCutLoad) attempt() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent++
}

func (l *powerCutLoad) figures() (map[string]int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.ledger))
	for k, v := range l.ledger {
		out[k] = v
	}
	return out, l.sent
}

// powerCutBatches makes a device's batches, of 1 to 5 readings each; the
// batch number restarts with a new boot every 50 batches so that reading
// times stay in the past.
type powerCutBatches struct {
	hw, boot string
	i        int
}

func (b *powerCutBatches) next() ([]byte, int) {
	if b.i%50 == 0 {
		b.boot = uuid.NewString()
	}
	n := 1 + b.i%5
	payload := batch(b.hw, b.boot, b.i%50, n)
	b.i++
	return payload, n
}

// deliver sends batch i of a device until one attempt is acknowledged
// (then it records it) or, once ctx is done, until a minute has passed.
func (l *powerCutLoad) deliver(ctx context.Context, payload []byte, n int, send func([]byte) (string, bool)) {
	l.attempt()
	var giveUp <-chan time.Time
	for {
		if id, ok := send(payload); ok {
			l.acked(id, n)
			return
		}
		if giveUp == nil && ctx.Err() != nil {
			giveUp = time.After(time.Minute)
		}
		select {
		case <-giveUp:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mqttDevice publishes batches at QoS 1; a batch counts as acknowledged
// when both its PUBACK and an accepted or duplicate ack arrived.
func (l *powerCutLoad) mqttDevice(ctx context.Context, hw string) {
	var c *powerCutClient
	defer func() { c.close() }()
	for batches := (&powerCutBatches{hw: hw}); ctx.Err() == nil; {
		payload, n := batches.next()
		l.deliver(ctx, payload, n, func(payload []byte) (string, bool) {
			if c == nil {
				var err error
				if c, err = dialPowerCut(l.cur.Load().mqttAddr, hw, l.key); err != nil {
					return "", false
				}
			}
			id, ok, broken := c.publish(hw, payload)
			if broken {
				c.close()
				c = nil
			}
			return id, ok
		})
	}
}

// httpDevice posts one batch per request; a 200 whose result is accepted
// or duplicate acknowledges it.
func (l *powerCutLoad) httpDevice(ctx context.Context, hw string) {
	client := &http.Client{Timeout: 5 * time.Second}
	for batches := (&powerCutBatches{hw: hw}); ctx.Err() == nil; {
		payload, n := batches.next()
		l.deliver(ctx, payload, n, func(payload []byte) (string, bool) {
			body := `{"batches":[` + string(payload) + `]}`
			req, err := http.NewRequest(http.MethodPost, "http://"+l.cur.Load().httpAddr+"/v1/readings", strings.NewReader(body))
			if err != nil {
				return "", false
			}
			req.Header.Set("Authorization", "Bearer "+l.key)
			resp, err := client.Do(req)
			if err != nil {
				return "", false
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var out contract.ReadingsResponse
			if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Results) != 1 {
				return "", false
			}
			r := out.Results[0]
			return r.BatchID, r.Status == contract.StatusAccepted || r.Status == contract.StatusDuplicate
		})
	}
}

// powerCutClient is one MQTT connection of a device.
type powerCutClient struct {
	client paho.Client
	acks   chan contract.Ack
}

func dialPowerCut(addr, hw, key string) (*powerCutClient, error) {
	c := &powerCutClient{acks: make(chan contract.Ack, 100)}
	c.client = paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(hw).
		SetUsername(hw).SetPassword(key).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second))
	if tok := c.client.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connect: %v", tok.Error())
	}
	sub := c.client.Subscribe(contract.AckTopic(hw), 1, func(_ paho.Client, m paho.Message) {
		var a contract.Ack
		if json.Unmarshal(m.Payload(), &a) == nil {
			select {
			case c.acks <- a:
			default:
			}
		}
	})
	if !sub.WaitTimeout(10*time.Second) || sub.Error() != nil {
		c.client.Disconnect(0)
		return nil, fmt.Errorf("subscribe: %v", sub.Error())
	}
	return c, nil
}

func (c *powerCutClient) close() {
	if c != nil {
		c.client.Disconnect(0)
	}
}

// publish sends payload and waits for its PUBACK and ack; broken reports
// that the connection should be dropped.
func (c *powerCutClient) publish(hw string, payload []byte) (id string, ok, broken bool) {
	var b struct {
		BatchID string `json:"batch_id"`
	}
	_ = json.Unmarshal(payload, &b)
	tok := c.client.Publish(contract.ReadingsTopic(hw), 1, false, payload)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		return "", false, true
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case a := <-c.acks:
			if a.BatchID != b.BatchID {
				continue // an ack of an earlier attempt
			}
			return a.BatchID, a.Status == contract.StatusAccepted || a.Status == contract.StatusDuplicate, false
		case <-deadline:
			return "", false, true
		}
	}
}

// waitDrained waits until d's buffer holds no pending batch. Many cuts a
// second apart leave a backlog that the race-built gatewayd drains at its
// own pace on a loaded machine, so it fails only when the backlog stops
// shrinking for a minute (or after 15 minutes in all).
func waitDrained(t *testing.T, d *daemon) {
	t.Helper()
	pending := func() int {
		n, err := strconv.Atoi(d.metric(t, "gateway_buffer_pending_batches"))
		require.NoError(t, err)
		return n
	}
	last, progressAt, deadline := pending(), time.Now(), time.Now().Add(15*time.Minute)
	for last > 0 {
		require.True(t, time.Since(progressAt) < time.Minute && time.Now().Before(deadline),
			"%d batches still pending, no progress for %s; logs:\n%s", last, time.Since(progressAt).Round(time.Second), d.logs.String())
		time.Sleep(200 * time.Millisecond)
		if n := pending(); n < last {
			last, progressAt = n, time.Now()
		}
	}
}

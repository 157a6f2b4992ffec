package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/registry"
)

// seqBatch is a synced batch with a seq, window i of its boot.
func seqBatch(hw, boot string, seq, window int) []byte {
	end := time.Now().Add(-time.Hour).UnixMilli() + int64(window)*60_000
	return []byte(fmt.Sprintf(`{"batch_id":"%s_%s_%d_%d","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16","seq":%d,
	 "readings":[{"timestamp_ms":%d,"sensors":{"t":1},"sensor_status":{}}]}`, hw, boot, end-60_000, end, hw, boot, seq, end))
}

func TestRegistrationOverMQTTAndHTTPKeepsItsConfirmationID(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:DD:EE:20"
	d, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err)
	ack := d.Register(t, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, contract.StatusRegistered, ack.Status)
	require.Equal(t, contract.AckTypeRegister, ack.Type)
	require.NoError(t, contract.ValidUUIDv4(ack.ConfirmationID))

	again := d.Register(t, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.Equal(t, ack.ConfirmationID, again.ConfirmationID, "stable across re-registrations")

	// Over HTTP: 201 at the first registration, 200 after.
	hw2 := "AA:BB:CC:DD:EE:21"
	for i, want := range []int{http.StatusCreated, http.StatusOK} {
		req, err := http.NewRequest(http.MethodPost, h.HTTPURL+"/v1/register", strings.NewReader(string(gatewaytest.Registration(hw2, gatewaytest.NewBoot()))))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+gatewaytest.GoodKey)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var a contract.Ack
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, "registration %d", i)
		require.Equal(t, contract.StatusRegistered, a.Status)
	}

	// Invalid registration: rejected with the field named.
	bad := d.Register(t, []byte(strings.Replace(string(gatewaytest.Registration(hw, gatewaytest.NewBoot())), `"1.0.16"`, `""`, 1)))
	require.Equal(t, contract.StatusRejected, bad.Status)
	require.Contains(t, *bad.Message, "firmware_version")

	var dev registry.Device
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw, &dev))
	require.True(t, dev.Registered)
	require.Equal(t, ack.ConfirmationID, dev.ConfirmationID)
	require.Equal(t, "greenhouse-sensor-01", dev.FriendlyName)
	require.EqualValues(t, 2, dev.Boots)
	require.EqualValues(t, 1, dev.Reboots)
}

func TestConfirmationIDSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	reg, err := registry.New(registry.Config{}, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Load())
	in, err := ingest.New(ingest.Config{}, ingest.Deps{Store: buf, Devices: reg})
	require.NoError(t, err)
	hw := "AA:BB:CC:DD:EE:22"
	ack, first, err := in.Register(context.Background(), ingest.Sender{HardwareID: hw}, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.NoError(t, err)
	require.True(t, first)
	require.NoError(t, buf.Close())

	buf, err = buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	reg, err = registry.New(registry.Config{}, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Load())
	in, err = ingest.New(ingest.Config{}, ingest.Deps{Store: buf, Devices: reg})
	require.NoError(t, err)
	again, first, err := in.Register(context.Background(), ingest.Sender{HardwareID: hw}, gatewaytest.Registration(hw, gatewaytest.NewBoot()))
	require.NoError(t, err)
	require.False(t, first)
	require.Equal(t, ack.ConfirmationID, again.ConfirmationID)
}

func TestRebootsGapsAndReplays(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:DD:EE:23"
	d, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err)
	boot1, boot2 := gatewaytest.NewBoot(), gatewaytest.NewBoot()
	send := func(p []byte) contract.Ack {
		require.True(t, d.Publish(p).WaitTimeout(20*time.Second))
		return d.NextAck(t)
	}
	for _, p := range [][]byte{
		seqBatch(hw, boot1, 0, 0), seqBatch(hw, boot1, 1, 1),
		seqBatch(hw, boot1, 4, 2), // 2 and 3 lost
		seqBatch(hw, boot1, 1, 3), // seq 1 again, other window: a replay
		seqBatch(hw, boot2, 0, 4), // reboot
		seqBatch(hw, boot2, 1, 5),
	} {
		require.Equal(t, contract.StatusAccepted, send(p).Status)
	}
	var dev registry.Device
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw, &dev))
	require.EqualValues(t, 2, dev.Gaps)
	require.EqualValues(t, 1, dev.Replays)
	require.EqualValues(t, 2, dev.Boots)
	require.EqualValues(t, 1, dev.Reboots)
	require.Equal(t, boot2, dev.BootID)
	require.EqualValues(t, 1, *dev.Seq)
	require.False(t, dev.RebootLoop)

	var list struct {
		Count   int               `json:"count"`
		Devices []registry.Device `json:"devices"`
	}
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices", &list))
	require.Equal(t, 1, list.Count)
	require.Equal(t, hw, list.Devices[0].HardwareID)
}

func TestRebootLoopIsFlagged(t *testing.T) {
	h := gatewaytest.Start(t, nil, func(o *gatewaytest.Options) { o.Devices.RebootLoopBoots = 3 })
	hw := "AA:BB:CC:DD:EE:24"
	d, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err)
	for range 4 {
		require.Equal(t, contract.StatusRegistered, d.Register(t, gatewaytest.Registration(hw, gatewaytest.NewBoot())).Status)
	}
	var dev registry.Device
	gatewaytest.AdminGet(t, h, "/v1/devices/"+hw, &dev)
	require.True(t, dev.RebootLoop)
	require.Len(t, dev.RecentBoots, 4)
}

// unsyncedBatch is a batch from a device without NTP time: timestamps
// count from 1970 and carry uptimes.
func unsyncedBatch(hw, boot string, sentUptime int64) []byte {
	return []byte(fmt.Sprintf(`{"batch_id":"%s_%s_1000_3000","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16",
	 "sent_uptime_ms":%d,"readings":[{"timestamp_ms":1000,"uptime_ms":1000,"sensors":{"t":1},"sensor_status":{}},
	 {"timestamp_ms":3000,"uptime_ms":3000,"sensors":{"t":2},"sensor_status":{}}]}`, hw, boot, hw, boot, sentUptime))
}

// toggleStore fails commits while failing is set.
type toggleStore struct {
	buf     *buffer.Buffer
	failing bool
}

func (s *toggleStore) Submit(ctx context.Context, e []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	if s.failing {
		return gatewaytest.FailingStore{}.Submit(ctx, e)
	}
	return s.buf.Submit(ctx, e)
}

func TestClockRepairIsIdenticalOnResend(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	reg, err := registry.New(registry.Config{}, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Load())
	store := &toggleStore{buf: buf, failing: true}
	in, err := ingest.New(ingest.Config{}, ingest.Deps{Store: store, Devices: reg})
	require.NoError(t, err)
	hw, boot := "AA:BB:CC:DD:EE:25", gatewaytest.NewBoot()

	// First try: the commit fails, so the device keeps the batch.
	start := time.Now().UnixMilli()
	res, err := in.Readings(context.Background(), ingest.Sender{HardwareID: hw}, [][]byte{unsyncedBatch(hw, boot, 5000)})
	require.Error(t, err)
	require.Equal(t, contract.ReasonBufferFull, *res[0].Reason)

	// It resends later: sent_uptime_ms moved on, the repair does not.
	store.failing = false
	time.Sleep(20 * time.Millisecond)
	res, err = in.Readings(context.Background(), ingest.Sender{HardwareID: hw}, [][]byte{unsyncedBatch(hw, boot, 9000)})
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, res[0].Status)
	pend, err := buf.Pending(0, 10)
	require.NoError(t, err)
	require.Len(t, pend, 1)
	var stored contract.Batch
	require.NoError(t, json.Unmarshal(pend[0].Payload, &stored))
	anchor := stored.Readings[0].TimestampMS - 1000
	require.GreaterOrEqual(t, anchor, start-5000, "anchor = first receive time - first sent_uptime_ms")
	require.LessOrEqual(t, anchor, time.Now().UnixMilli()-5000)
	require.Equal(t, anchor+3000, stored.Readings[1].TimestampMS)
	for _, r := range stored.Readings {
		require.Equal(t, contract.TimeSourceGateway, r.TimeSource)
	}

	// And a third send of the same batch is a duplicate, not a conflict.
	res, err = in.Readings(context.Background(), ingest.Sender{HardwareID: hw}, [][]byte{unsyncedBatch(hw, boot, 15000)})
	require.NoError(t, err)
	require.Equal(t, contract.StatusDuplicate, res[0].Status)
	dev, ok := reg.Device(hw)
	require.True(t, ok)
	require.EqualValues(t, 1, dev.RepairedBatches)
	require.Equal(t, []registry.Anchor{{BootID: boot, AnchorMS: anchor}}, dev.Anchors)

	// Without uptimes the batch cannot be repaired.
	noUptime := strings.NewReplacer(`,"uptime_ms":1000`, "", `,"uptime_ms":3000`, "").Replace(string(unsyncedBatch(hw, gatewaytest.NewBoot(), 1)))
	res, _ = in.Readings(context.Background(), ingest.Sender{HardwareID: hw}, [][]byte{[]byte(noUptime)})
	require.Equal(t, contract.ReasonClockNotSynced, *res[0].Reason)
}

func TestOrderingModes(t *testing.T) {
	for _, mode := range []string{"accept_older", "reject_older"} {
		t.Run(mode, func(t *testing.T) {
			buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
			require.NoError(t, err)
			defer buf.Close()
			reg, err := registry.New(registry.Config{}, buf, nil, nil, nil)
			require.NoError(t, err)
			require.NoError(t, reg.Load())
			in, err := ingest.New(ingest.Config{Ordering: mode, OrderingGrace: time.Minute}, ingest.Deps{Store: buf, Devices: reg})
			require.NoError(t, err)
			hw, boot := "AA:BB:CC:DD:EE:26", uuid.NewString()
			newer := seqBatch(hw, boot, 5, 10)
			older := seqBatch(hw, boot, 1, 0) // ten minutes earlier
			res, err := in.Readings(context.Background(), ingest.Sender{}, [][]byte{newer, older})
			require.NoError(t, err)
			require.Equal(t, contract.StatusAccepted, res[0].Status)
			dev, _ := reg.Device(hw)
			if mode == "accept_older" {
				require.Equal(t, contract.StatusAccepted, res[1].Status)
				require.EqualValues(t, 1, dev.OlderWindows)
				return
			}
			// Both batches were checked before the commit: send the older one
			// again, now that the newer one is on record.
			res, err = in.Readings(context.Background(), ingest.Sender{}, [][]byte{seqBatch(hw, boot, 2, 1)})
			require.NoError(t, err)
			require.Equal(t, contract.ReasonTimestampConflict, *res[0].Reason)
			require.Contains(t, *res[0].Message, "before the newest reading")
		})
	}
}

func TestUnknownDevicesRejectedWhenRequired(t *testing.T) {
	h := gatewaytest.Start(t, nil, func(o *gatewaytest.Options) { o.Devices.UnknownDevices = "reject" })
	hw := "AA:BB:CC:DD:EE:27"
	d, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err)
	boot := gatewaytest.NewBoot()
	require.True(t, d.Publish(seqBatch(hw, boot, 0, 0)).WaitTimeout(20*time.Second))
	a := d.NextAck(t)
	require.Equal(t, contract.ReasonUnknownDevice, *a.Reason)
	require.Equal(t, contract.StatusRegistered, d.Register(t, gatewaytest.Registration(hw, boot)).Status)
	require.True(t, d.Publish(seqBatch(hw, boot, 0, 0)).WaitTimeout(20*time.Second))
	require.Equal(t, contract.StatusAccepted, d.NextAck(t).Status)
}

// wrongClock is a gateway clock that booted without NTP.
type wrongClock struct{}

func (wrongClock) Now() time.Time  { return time.Date(1970, 1, 1, 0, 5, 0, 0, time.UTC) }
func (wrongClock) Plausible() bool { return false }

func TestGatewayClockNotSynced(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	reg, err := registry.New(registry.Config{}, buf, wrongClock{}, nil, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Load())
	in, err := ingest.New(ingest.Config{}, ingest.Deps{Store: buf, Devices: reg, Clock: wrongClock{}})
	require.NoError(t, err)
	hw := "AA:BB:CC:DD:EE:28"
	// A synced device's batch is not "from the future" for a gateway that
	// does not know the time.
	res, err := in.Readings(context.Background(), ingest.Sender{}, [][]byte{seqBatch(hw, gatewaytest.NewBoot(), 0, 0)})
	require.NoError(t, err)
	require.Equal(t, contract.StatusAccepted, res[0].Status)
	// But an unsynced device cannot be repaired from a wrong clock.
	res, err = in.Readings(context.Background(), ingest.Sender{HardwareID: hw}, [][]byte{unsyncedBatch(hw, gatewaytest.NewBoot(), 5000)})
	require.NoError(t, err)
	require.Equal(t, contract.ReasonClockNotSynced, *res[0].Reason)
	require.Contains(t, *res[0].Message, "gateway's own clock")
}

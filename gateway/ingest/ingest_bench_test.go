package ingest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/registry"
)

// benchPayloads returns n distinct batches of one device in the shape the
// MQTT benchmark and devicesim send: readings of 4 sensor values and 2
// statuses, uptimes, seq and sent_uptime_ms, from two days ago on.
func benchPayloads(hw string, n, readings int) [][]byte {
	const boot = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	bootMS := time.Now().Add(-72 * time.Hour).UnixMilli()
	next := time.Now().Add(-48 * time.Hour).UnixMilli()
	out := make([][]byte, n)
	var sb strings.Builder
	for i := range out {
		sb.Reset()
		start := next
		end := start + int64(readings-1)*1000
		next = end + 1000
		fmt.Fprintf(&sb, `{"batch_id":"%s_%s_%d_%d","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16","seq":%d,"sent_uptime_ms":%d,"readings":[`,
			hw, boot, start, end, hw, boot, i, end-bootMS)
		for k := range readings {
			ts := start + int64(k)*1000
			if k > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"timestamp_ms":%d,"uptime_ms":%d,"sensors":{"bme280_temp_c":%.2f,"humidity_pct":%.1f,`+
				`"pressure_hpa":%.2f,"soil_moisture_pct":%.1f},"sensor_status":{"bme280":"ok","soil_moisture":"ok"}}`,
				ts, ts-bootMS, 20+float64(k%7)/3, 55.3+float64(k%5), 1013.25-float64(k%3)/4, 48.5+float64(k%4))
		}
		sb.WriteString("]}")
		out[i] = []byte(sb.String())
	}
	return out
}

// memStore answers every commit Stored without I/O: what remains is the
// ingest path's own cost.
type memStore struct{ n atomic.Int64 }

func (m *memStore) Commit(_ context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	m.n.Add(int64(len(entries)))
	out := make([]buffer.Outcome, len(entries))
	for i := range out {
		out[i] = buffer.Stored
	}
	return out, nil
}

func (m *memStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return CommitFunc(m.Commit).Submit(ctx, entries)
}

func benchIngest(b *testing.B, store Committer) (*Ingest, *buffer.Buffer) {
	b.Helper()
	buf, err := buffer.Open(b.TempDir(), buffer.Options{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = buf.Close() })
	if store == nil {
		store = buf
	}
	reg := prometheus.NewRegistry()
	devices, err := registry.New(registry.Config{}, buf, nil, nil, reg)
	if err != nil {
		b.Fatal(err)
	}
	if err := devices.Load(); err != nil {
		b.Fatal(err)
	}
	in, err := New(Config{}, Deps{Store: store, Devices: devices, Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	return in, buf
}

// handleMQTT is what the broker's publish hook does with a readings
// message, short of writing to the socket: ingest, then the ack payload.
func handleMQTT(in *Ingest, hw string, payload []byte) error {
	ack, ok := in.MQTTMessage(context.Background(), Sender{HardwareID: hw}, contract.KindReadings, payload)
	switch {
	case ack == nil || !ok:
		return fmt.Errorf("not stored: %+v", ack)
	case ack.Status != contract.StatusAccepted && ack.Message != nil:
		return fmt.Errorf("%s %s: %s", ack.BatchID, ack.Status, *ack.Message)
	case ack.Status != contract.StatusAccepted:
		return fmt.Errorf("%s %s", ack.BatchID, ack.Status)
	}
	if p := contract.EncodeAck(*ack); len(p) == 0 {
		return fmt.Errorf("empty ack for %s", ack.BatchID)
	}
	return nil
}

// BenchmarkIngestMQTTMessage is the CPU cost of one 10-reading batch on the
// MQTT ingest path (decode, validate, identity hash, canonical form,
// registry, metrics, ack payload), with a commit that does no I/O.
func BenchmarkIngestMQTTMessage(b *testing.B) {
	const hw = "AA:BB:CC:DD:EE:01"
	store := &memStore{}
	in, _ := benchIngest(b, store)
	payloads := benchPayloads(hw, 1024, 10)
	if err := handleMQTT(in, hw, payloads[0]); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payloads[0])))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := handleMQTT(in, hw, payloads[i%len(payloads)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkIngestMQTTDurable runs the same path over the real buffer
// (Badger, synced group commits) from 64 devices at once, one batch in
// flight each: ns/op is the wall time per batch of the whole group.
func BenchmarkIngestMQTTDurable(b *testing.B) {
	const devices = 64
	in, _ := benchIngest(b, nil)
	hws := make([]string, devices)
	all := make([][][]byte, devices)
	for d := range all {
		hws[d] = fmt.Sprintf("AA:BB:CC:DD:%02X:%02X", d>>8, d&0xff)
		n := b.N / devices
		if d < b.N%devices {
			n++
		}
		all[d] = benchPayloads(hws[d], n, 10)
	}
	b.SetBytes(int64(len(all[0][0])))
	b.ReportAllocs()
	b.ResetTimer()
	errs := make(chan error, devices)
	var wg sync.WaitGroup
	for d := range devices {
		wg.Go(func() {
			for _, p := range all[d] {
				if err := handleMQTT(in, hws[d], p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

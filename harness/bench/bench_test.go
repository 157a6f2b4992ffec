//go:build linux

package bench

import (
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	contract "greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/byterelay"
	"greenhouse-gateway/harness/fleetgen"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

func TestNumberSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want int
	}{
		{"one digit", "7", 2},
		{"two digits", "42", 2},
		{"three digits", "123", 3},
		{"trailing zeros trimmed", "1000", 2},
		{"leading zeros trimmed", "0.0025", 2},
		{"decimal", "23.45", 3},
		{"epoch millis", "1700000000123", 8},
		{"negative", "-12.5", 3},
		{"exponent ignored", "1.5E+10", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, numberSize(tc.in))
		})
	}
}

func TestItemSize(t *testing.T) {
	item := map[string]types.AttributeValue{
		"id": &types.AttributeValueMemberS{Value: "abc"},   // 2 + 3
		"n":  &types.AttributeValueMemberN{Value: "123"},   // 1 + 3
		"ok": &types.AttributeValueMemberBOOL{Value: true}, // 2 + 1
		"map": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{ // 3 + 3
			"k": &types.AttributeValueMemberS{Value: "vv"}, // 1 + 2 + 1
		}},
	}
	require.Equal(t, 5+4+3+(3+3+4), itemSize(item))
	require.Equal(t, 1.0, writeUnits(0))
	require.Equal(t, 1.0, writeUnits(1024))
	require.Equal(t, 2.0, writeUnits(1025))
}

// TestBatchItems checks that the rebuilt items have the uplink's shape and
// price at one write unit each.
func TestBatchItems(t *testing.T) {
	d := fleetgen.NewDevice(fleetgen.HardwareID(9, 1), time.Now().Add(-time.Hour), 1)
	id, payload, err := d.Next(10)
	require.NoError(t, err)
	ib, err := batchItems(buffer.Pending{BatchID: id, Payload: payload, ReceivedAt: time.Now()}, time.Now())
	require.NoError(t, err)
	require.Len(t, ib.readings, 10)
	require.Equal(t, id, ib.marker["batch_id"].(*types.AttributeValueMemberS).Value)
	for _, k := range []string{"hardware_id", "ts_batch", "timestamp_ms", "batch_id", "boot_id", "firmware_version",
		"sensors", "sensor_status", "expiration_time", tablewrite.AttrQualityScore} {
		require.Contains(t, ib.readings[0], k)
	}
	p := priceItems([]*itemBatch{ib})
	require.Equal(t, 1.0, p.ReadingWCU)
	require.Equal(t, 1.0, p.MarkerWCU)
	require.Greater(t, p.ReadingBytes, 200.0)
}

func TestQuantile(t *testing.T) {
	var l latencies
	for i := 1; i <= 100; i++ {
		l.add(time.Duration(i) * time.Millisecond)
	}
	s := l.summary()
	require.Equal(t, 100, s.Count)
	require.Equal(t, 50.0, s.P50)
	require.Equal(t, 99.0, s.P99)
	require.Equal(t, 100.0, s.Max)
	require.Equal(t, 2.0, median([]float64{3, 1, 2, 4}))
}

func TestSamplesSum(t *testing.T) {
	s := samples{
		`gateway_uplink_request_duration_seconds_count{operation="PutItem"}`:        3,
		`gateway_uplink_request_duration_seconds_count{operation="BatchWriteItem"}`: 2,
		`gateway_buffer_pending_batches`:                                            7,
	}
	require.Equal(t, 5.0, s.sum("gateway_uplink_request_duration_seconds_count"))
	require.Equal(t, 3.0, s.sum("gateway_uplink_request_duration_seconds_count", `operation="PutItem"`))
	require.Equal(t, 7.0, s.sum("gateway_buffer_pending_batches"))
	require.Equal(t, 0.0, s.sum("gateway_buffer_pending"))
}

func TestQuantileBound(t *testing.T) {
	h := func(transport string, counts ...float64) samples {
		s := samples{}
		for i, le := range []string{"0.001", "0.002", "0.004", "+Inf"} {
			s[`gateway_ingest_duration_seconds_bucket{transport="`+transport+`",le="`+le+`"}`] = counts[i]
		}
		return s
	}
	merge := func(a, b samples) samples {
		for k, v := range b {
			a[k] = v
		}
		return a
	}
	before := merge(h("mqtt", 10, 10, 10, 10), h("http", 0, 0, 0, 0))
	// In the window: 100 MQTT messages, 90 within 1 ms, 9 more within 2 ms,
	// the last within 4 ms; HTTP requests all slow.
	after := merge(h("mqtt", 100, 109, 110, 110), h("http", 0, 0, 0, 5))
	const m = "gateway_ingest_duration_seconds"
	require.Equal(t, 0.001, quantileBound(before, after, m, 0.5, `transport="mqtt"`))
	require.Equal(t, 0.002, quantileBound(before, after, m, 0.99, `transport="mqtt"`))
	require.Equal(t, 0.004, quantileBound(before, after, m, 1, `transport="mqtt"`))
	require.True(t, math.IsInf(quantileBound(before, after, m, 0.99, `transport="http"`), 1))
	require.Zero(t, quantileBound(before, before, m, 0.99, `transport="mqtt"`), "no observations in the window")
	require.Zero(t, quantileBound(before, after, "gateway_missing_seconds", 0.99))
}

func TestProcReaders(t *testing.T) {
	m, err := procMemory(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, m.RSS)
	require.GreaterOrEqual(t, m.HWM, m.RSS)
	_, err = procCPU(os.Getpid())
	require.NoError(t, err)
}

func TestCount(t *testing.T) {
	require.Equal(t, "1,000,000", count(1_000_000))
	require.Equal(t, "999", count(999))
}

func TestGatewayEnvNames(t *testing.T) {
	tests := []struct {
		name string
		kv   string
		ok   bool
	}{
		{"setting", "GATEWAY_BUFFER_MEMTABLE_SIZE=16777216", true},
		{"runtime debug", "GODEBUG=adaptivestackstart=0", true},
		{"memory limit", "GOMEMLIMIT=100MiB", true},
		{"gc", "GOGC=50", true},
		{"processors", "GOMAXPROCS=4", true},
		{"other", "HOME=/tmp", false},
		{"no value", "GATEWAY_LOG_LEVEL", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.GatewayEnv = []string{tt.kv}
			err := cfg.Validate()
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, "want GATEWAY_NAME=VALUE")
			}
		})
	}
}

func TestParsePprofTop(t *testing.T) {
	out := `File: gatewayd
Type: inuse_space
Showing nodes accounting for 21080.26kB, 100% of 21080.26kB total
      flat  flat%   sum%        cum   cum%
   10656kB 50.55% 50.55%    10656kB 50.55%  github.com/dgraph-io/badger/v4/skl.newArena (inline)
 2567.5kB 12.18% 62.73%  2567.5kB 12.18%  bufio.NewReaderSize (inline)
    1.50MB  7.12% 69.85%     1.50MB  7.12%  github.com/mochi-mqtt/server/v2.newClient
  512.25kB  2.43% 72.28%  1024.08kB  4.86%  github.com/mochi-mqtt/server/v2.newParticle (inline)
       0     0%   72.28%  3588.60kB 17.02%  github.com/mochi-mqtt/server/v2.(*Server).EstablishConnection
  100B  0.01% 72.29%  100B  0.01%  main.main
`
	owners, top := parsePprofTop(out)
	require.Equal(t, map[string]int64{
		"badger memtables": 10656 << 10,
		"bufio":            2567.5 * 1024,
		"mochi":            1.5*(1<<20) + 512.25*1024,
		"other":            100,
	}, owners)
	require.Len(t, top, 5)
	require.Equal(t, "github.com/dgraph-io/badger/v4/skl.newArena (inline) 10.4 MB", top[0])
}

func TestMappingsRSS(t *testing.T) {
	m, err := mappingsRSS(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, m["anonymous"], "the Go heap")
	for path, kind := range map[string]string{
		"": "anonymous", "[stack]": "anonymous", "/data/000001.sst": "badger .sst", "/data/000001.vlog": "badger .vlog",
		"/data/00001.mem": "badger .mem", "/tmp/w/gatewayd": "gatewayd binary", "/usr/lib/libc.so.6": "other files",
	} {
		require.Equal(t, kind, mappingKind(path), path)
	}
}

func TestBestPlainIsTheFastestRun(t *testing.T) {
	runs := []plainRun{
		{Goroutines: 4, Readings: 10_000, Seconds: 1.25},  // 8,000/s
		{Goroutines: 8, Readings: 10_000, Seconds: 1.0},   // 10,000/s
		{Goroutines: 16, Readings: 10_000, Seconds: 1.0},  // 10,000/s: a tie keeps fewer goroutines
		{Goroutines: 32, Readings: 10_000, Seconds: 1.11}, // 9,009/s
	}
	require.Equal(t, 8, bestPlain(runs).Goroutines)
	require.Equal(t, 16, bestPlain(runs[2:]).Goroutines)
	require.Zero(t, bestPlain(nil).Goroutines)
	require.Zero(t, plainRun{Readings: 5}.rate(), "no time measured: no rate")
}

func TestPlainRequestsPackTwentyFiveReadings(t *testing.T) {
	var items []*itemBatch
	for i := range 6 { // 6 batches of 10 readings: 60 readings, 3 requests
		b := &contract.Batch{BatchID: fmt.Sprintf("b-%d", i), HardwareID: "AA", BootID: "boot", FirmwareVersion: "1.0.0"}
		for k := range 10 {
			b.Readings = append(b.Readings, contract.Reading{TimestampMS: int64(1_760_000_000_000 + k),
				Sensors: map[string]float64{"t": float64(k)}, SensorStatus: map[string]string{"t": "ok"}})
		}
		built := tablewrite.Build(tablewrite.Batch{Batch: b}, time.Hour, time.Unix(1_760_000_000, 0))
		items = append(items, &itemBatch{readings: built.ReadingItems(), built: built})
	}
	tables := cloud.TableNames("t_")
	for _, encoded := range []bool{false, true} {
		reqs := plainRequests(items, tables, false, encoded)
		require.Len(t, reqs, 3)
		for i, n := range []int{25, 25, 10} {
			require.Len(t, reqs[i], 1, "readings only")
			require.Len(t, reqs[i][tables.Readings], n)
		}
		// The 26th reading is batch 2's sixth.
		item := reqs[1][tables.Readings][0].PutRequest.Item
		if encoded {
			require.Len(t, item, 1, "given encoded")
			require.Equal(t, cloud.EncodedItem(items[2].built.Encode()[5]), item)
		} else {
			require.Equal(t, items[2].readings[5], item)
		}
	}
}

func TestPlainWriterAsksForCapacityWhenGatewaydDoes(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want bool
	}{
		{nil, false},
		{[]string{"GATEWAY_UPLINK_CONSUMED_CAPACITY=true"}, true},
		{[]string{"GATEWAY_UPLINK_CONSUMED_CAPACITY=1", "GOGC=200"}, true},
		{[]string{"GATEWAY_UPLINK_CONSUMED_CAPACITY=true", "GATEWAY_UPLINK_CONSUMED_CAPACITY=false"}, false},
	} {
		r := &runner{cfg: Config{GatewayEnv: tc.env}}
		require.Equal(t, tc.want, r.consumedCapacity(), tc.env)
	}
}

func TestCeilingGoroutinesAreValidated(t *testing.T) {
	cfg := DefaultConfig()
	require.NoError(t, cfg.Validate())
	require.Equal(t, "4,8,16,32", joinCounts(cfg.CeilingGoroutines))
	for _, bad := range [][]int{nil, {0}, {4, 300}} {
		cfg.CeilingGoroutines = bad
		require.Error(t, cfg.Validate(), bad)
	}
}

func TestMedianDrainIsTheMiddleRatio(t *testing.T) {
	drain := func(gw, before, after float64) bracketedDrain {
		return bracketedDrain{Gateway: gatewayDrain{Readings: gw, Seconds: 1},
			Before: plainRun{Readings: int(before), Seconds: 1}, After: plainRun{Readings: int(after), Seconds: 1}}
	}
	runs := []bracketedDrain{
		drain(4_000, 5_000, 4_800), // 0.80
		drain(4_500, 4_700, 5_000), // 0.90: against the faster plain run
		drain(4_200, 5_000, 5_000), // 0.84
	}
	require.InDelta(t, 0.9, runs[1].ratio(), 1e-9)
	require.Equal(t, 2, medianDrain(runs))
	require.Equal(t, 0, medianDrain(runs[:2]), "an even count: the lower middle one")
	require.Equal(t, 0, medianDrain(runs[1:2]))
	require.Zero(t, bracketedDrain{Gateway: gatewayDrain{Readings: 5}}.ratio(), "no time measured: no ratio")
}

func TestDrainModesAndRepeatsAreValidated(t *testing.T) {
	cfg := DefaultConfig()
	require.Equal(t, []string{"transaction", "batch"}, cfg.DrainModes)
	for _, modes := range [][]string{{"batch"}, {"transaction"}, {"transaction", "batch"}} {
		cfg.DrainModes = modes
		require.NoError(t, cfg.Validate(), modes)
	}
	for _, bad := range [][]string{nil, {"batch", "stream"}, {""}} {
		cfg.DrainModes = bad
		require.Error(t, cfg.Validate(), bad)
	}
	cfg = DefaultConfig()
	for _, bad := range []int{0, 10} {
		cfg.DrainRepeats = bad
		require.Error(t, cfg.Validate(), bad)
	}
}

func TestSameItemRequestsPackReadingsAndMarkers(t *testing.T) {
	dir := t.TempDir()
	_, err := fillBacklog(t.Context(), dir, 9, 3, 7, 10)
	require.NoError(t, err)
	pend, err := readBacklog(dir)
	require.NoError(t, err)
	items, err := allItems(pend)
	require.NoError(t, err)
	tables := cloud.TableNames("t_")
	reqs := plainRequests(items, tables, true, false)
	// 7 batches of 10 readings and a marker: 77 items, 25 a request.
	require.Len(t, reqs, 4)
	var readings, markers int
	for i, rq := range reqs {
		n := len(rq[tables.Readings]) + len(rq[tables.ProcessedBatches])
		if i < 3 {
			require.Equal(t, 25, n)
		} else {
			require.Equal(t, 2, n)
		}
		readings += len(rq[tables.Readings])
		markers += len(rq[tables.ProcessedBatches])
	}
	require.Equal(t, 70, readings)
	require.Equal(t, 7, markers)
	// Each batch's marker follows its readings.
	require.Len(t, reqs[0][tables.ProcessedBatches], 2)
	require.Equal(t, items[0].marker, reqs[0][tables.ProcessedBatches][0].PutRequest.Item)
}

func TestTLSEstimate(t *testing.T) {
	run := bytesRun{Readings: 1000, Total: byterelay.Counts{Up: 40_000, Down: 4000, Requests: 2, Connections: 1}}
	up, down := run.tlsEstimate()
	// Up: 20 KB a request, two records each; a handshake; two tokens.
	require.InDelta(t, float64(40_000+4*tlsRecordBytes+tlsHandshakeUp+2*sessionTokenBytes)/1000, up, 1e-9)
	require.InDelta(t, float64(4000+2*tlsRecordBytes+tlsHandshakeDown)/1000, down, 1e-9)
	require.Equal(t, int64(1), records(100, 0))
	require.Equal(t, int64(3), records(100, 3))
	up, down = bytesRun{}.tlsEstimate()
	require.Zero(t, up)
	require.Zero(t, down)
}

func TestBytesTargets(t *testing.T) {
	require.Equal(t, "<= 1x baseline", bytesTarget(bytesDirect, "live").text)
	require.Nil(t, bytesTarget(bytesDirect, "draining"))
	require.True(t, bytesTarget(bytesLambda, "live").pass(Figure{Value: 60}))
	require.False(t, bytesTarget(bytesLambda, "live").pass(Figure{Value: 61}))
	require.True(t, bytesTarget(bytesLambda, "draining").pass(Figure{Value: 30}))
	require.False(t, bytesTarget(bytesLambda, "draining").pass(Figure{Value: 31}))
}

func TestBytesSettingsAreValidated(t *testing.T) {
	c := DefaultConfig()
	require.Contains(t, c.Scenarios, ScenarioBytes, "make bench runs it")
	require.NoError(t, c.Validate())
	c.BytesLive = time.Second
	require.Error(t, c.Validate())
	c = DefaultConfig()
	c.BytesDevices = 0
	require.Error(t, c.Validate())
	c = DefaultConfig()
	c.BytesBacklog = 5
	require.Error(t, c.Validate())
}

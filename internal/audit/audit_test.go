package audit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeNow is a settable clock.
type fakeNow struct{ ns atomic.Int64 }

func newNow(t time.Time) *fakeNow {
	n := &fakeNow{}
	n.ns.Store(t.UnixNano())
	return n
}

func (n *fakeNow) Now() time.Time { return time.Unix(0, n.ns.Load()).UTC() }

var day0 = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// running is an open log with its Run goroutine.
type running struct {
	log *audit.Log
	reg *prometheus.Registry
	dir string
}

// start opens the log in dir and runs it until the test ends (or stop).
func start(t *testing.T, dir string, cfg audit.Config, now func() time.Time) (*running, func()) {
	t.Helper()
	reg := prometheus.NewRegistry()
	l, err := audit.Open(dir, cfg, now, nil, reg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
			require.NoError(t, l.Close(), "Close after Run is a no-op")
		})
	}
	t.Cleanup(stop)
	return &running{log: l, reg: reg, dir: dir}, stop
}

// unlimited lifts cfg's rate so that every record is written on its own.
func unlimited(cfg audit.Config) audit.Config {
	cfg.MaxRecordsPerSecond, cfg.BurstRecords = 1_000_000, 1_000_000
	return cfg
}

func rec(i int, at time.Time, reason string) audit.Record {
	return audit.Record{Time: at, Transport: contract.TransportMQTT, Kind: "readings",
		HardwareID: fmt.Sprintf("AA:BB:CC:DD:EE:%02X", i%4), BatchID: fmt.Sprintf("b%05d", i), Reason: reason,
		Message: "batch " + strings.Repeat("x", 100), RemoteAddr: "127.0.0.1:5000"}
}

func query(t *testing.T, l *audit.Log, f audit.Filter) audit.Result {
	t.Helper()
	if f.Limit == 0 {
		f.Limit = 100000
	}
	res, err := l.Query(context.Background(), f)
	require.NoError(t, err)
	return res
}

func batchIDs(recs []audit.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.BatchID
	}
	return out
}

func segments(t *testing.T, dir string) ([]string, int64) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	var total int64
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".ndjson") {
			info, err := e.Info()
			require.NoError(t, err)
			names = append(names, e.Name())
			total += info.Size()
		}
	}
	return names, total
}

func TestQueryFiltersNewestFirst(t *testing.T) {
	r, _ := start(t, t.TempDir(), audit.Config{}, newNow(day0).Now)
	reasons := []string{audit.ReasonValidation, audit.ReasonDuplicate, audit.ReasonConflict}
	for i := range 30 {
		x := rec(i, day0.Add(time.Duration(i)*time.Second), reasons[i%3])
		if i%5 == 0 {
			x.Transport = contract.TransportHTTP
		}
		r.log.Record(x)
	}
	all := query(t, r.log, audit.Filter{})
	require.Len(t, all.Records, 30)
	require.Equal(t, "b00029", all.Records[0].BatchID, "newest first")
	require.Equal(t, "b00000", all.Records[29].BatchID)

	tests := []struct {
		name string
		f    audit.Filter
		want []string
		more bool
	}{
		{"limit", audit.Filter{Limit: 2}, []string{"b00029", "b00028"}, true},
		{"limit exactly reached", audit.Filter{Limit: 30, Since: day0}, nil, false},
		{"hardware_id", audit.Filter{HardwareID: "AA:BB:CC:DD:EE:01", Limit: 3}, []string{"b00029", "b00025", "b00021"}, true},
		{"reason", audit.Filter{Reason: audit.ReasonConflict, Since: day0.Add(20 * time.Second), Limit: 10},
			[]string{"b00029", "b00026", "b00023", "b00020"}, false},
		{"transport", audit.Filter{Transport: contract.TransportHTTP, Limit: 10},
			[]string{"b00025", "b00020", "b00015", "b00010", "b00005", "b00000"}, false},
		{"since inclusive, until exclusive", audit.Filter{Since: day0.Add(3 * time.Second), Until: day0.Add(6 * time.Second), Limit: 10},
			[]string{"b00005", "b00004", "b00003"}, false},
		{"nothing matches", audit.Filter{HardwareID: "11:22:33:44:55:66", Limit: 10}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := query(t, r.log, tt.f)
			if tt.want != nil || tt.f.HardwareID != "" {
				require.Equal(t, tt.want, nilIfEmpty(batchIDs(res.Records)))
			} else {
				require.Len(t, res.Records, tt.f.Limit)
			}
			require.Equal(t, tt.more, res.More)
			require.Zero(t, res.Skipped)
		})
	}
	_, err := r.log.Query(context.Background(), audit.Filter{})
	require.ErrorContains(t, err, "limit must be positive")
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func TestSegmentsRotateBySizeAndDay(t *testing.T) {
	dir := t.TempDir()
	r, _ := start(t, dir, audit.Config{SegmentBytes: 4096, MaxBytes: 1 << 20}, newNow(day0).Now)
	for i := range 60 { // about 300 bytes each: several 4 KiB segments
		r.log.Record(rec(i, day0.Add(time.Duration(i)*time.Second), audit.ReasonValidation))
	}
	next := day0.Add(24 * time.Hour)
	r.log.Record(rec(60, next, audit.ReasonValidation))
	res := query(t, r.log, audit.Filter{})
	require.Len(t, res.Records, 61)
	for i, x := range res.Records {
		require.Equal(t, fmt.Sprintf("b%05d", 60-i), x.BatchID, "newest first across segments")
	}
	names, total := segments(t, dir)
	require.Greater(t, len(names), 4)
	for _, n := range names[:len(names)-1] {
		require.True(t, strings.HasPrefix(n, "20261120-"), n)
		info, err := os.Stat(filepath.Join(dir, n))
		require.NoError(t, err)
		require.LessOrEqual(t, info.Size(), int64(4096))
	}
	require.True(t, strings.HasPrefix(names[len(names)-1], "20261121-"), "a new UTC day starts a segment")
	require.Equal(t, float64(total), gauge(t, r.reg, "gateway_audit_disk_bytes"))
	require.Equal(t, 61.0, counter(t, r.reg, "gateway_audit_records_total", audit.ReasonValidation))

	// A query bounded by time skips segments of other days.
	res = query(t, r.log, audit.Filter{Since: next})
	require.Equal(t, []string{"b00060"}, batchIDs(res.Records))
}

func TestMaxBytesDeletesOldestSegments(t *testing.T) {
	dir := t.TempDir()
	cfg := unlimited(audit.Config{SegmentBytes: 4096, MaxBytes: 16384})
	r, _ := start(t, dir, cfg, newNow(day0).Now)
	for i := range 500 {
		r.log.Record(rec(i, day0.Add(time.Duration(i)*time.Millisecond), audit.ReasonDuplicate))
	}
	res := query(t, r.log, audit.Filter{})
	_, total := segments(t, dir)
	require.LessOrEqual(t, total, cfg.MaxBytes)
	require.Greater(t, total, cfg.MaxBytes-2*cfg.SegmentBytes, "only whole old segments went")
	require.Equal(t, "b00499", res.Records[0].BatchID, "the newest records are kept")
	n := len(res.Records)
	require.Less(t, n, 500)
	require.Equal(t, fmt.Sprintf("b%05d", 500-n), res.Records[n-1].BatchID, "what is left is contiguous")
	require.Equal(t, float64(total), gauge(t, r.reg, "gateway_audit_disk_bytes"))
	require.Equal(t, 500.0, counter(t, r.reg, "gateway_audit_records_total", audit.ReasonDuplicate))
	names, _ := segments(t, dir)
	first, err := strconv.ParseUint(strings.TrimSuffix(names[0][9:], ".ndjson"), 10, 64)
	require.NoError(t, err)
	require.Equal(t, float64(first), counter(t, r.reg, "gateway_audit_deleted_segments_total", "max_bytes"),
		"every segment before the oldest left was deleted for the cap, and counted")
	require.Zero(t, counter(t, r.reg, "gateway_audit_deleted_segments_total", "retention"))
}

func TestRetentionDeletesWholeExpiredSegments(t *testing.T) {
	dir := t.TempDir()
	now := newNow(day0)
	r, stop := start(t, dir, audit.Config{}, now.Now)
	for _, d := range []int{-10, -8, -7, -1, 0} {
		r.log.Record(rec(d+100, day0.Add(time.Duration(d)*24*time.Hour), audit.ReasonConflict))
	}
	require.Len(t, query(t, r.log, audit.Filter{}).Records, 5)
	stop()

	// At the next start, segments whose day ended more than 7 days ago go:
	// day0-8 ended 7 days before day0 00:00, so before day0 10:00 minus 7d.
	r, _ = start(t, dir, audit.Config{}, now.Now)
	res := query(t, r.log, audit.Filter{})
	require.Equal(t, []string{"b00100", "b00099", "b00093"}, batchIDs(res.Records))
	names, _ := segments(t, dir)
	require.Len(t, names, 3)
}

func TestReopenAfterTornLine(t *testing.T) {
	dir := t.TempDir()
	r, stop := start(t, dir, audit.Config{}, newNow(day0).Now)
	for i := range 3 {
		r.log.Record(rec(i, day0.Add(time.Duration(i)*time.Second), audit.ReasonValidation))
	}
	require.Len(t, query(t, r.log, audit.Filter{}).Records, 3)
	stop()

	// A crash mid-write leaves half a line; a power cut, zeros.
	names, _ := segments(t, dir)
	require.Len(t, names, 1)
	f, err := os.OpenFile(filepath.Join(dir, names[0]), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"time":"2026-11-20T10:00:05Z","transport":"mq` + "\n" + "\x00\x00\x00\x00")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a segment"), 0o600))

	r, _ = start(t, dir, audit.Config{}, newNow(day0).Now)
	r.log.Record(rec(3, day0.Add(10*time.Second), audit.ReasonValidation))
	res := query(t, r.log, audit.Filter{})
	require.Equal(t, []string{"b00003", "b00002", "b00001", "b00000"}, batchIDs(res.Records))
	require.Equal(t, 2, res.Skipped, "the torn line and the zeros")
	names, _ = segments(t, dir)
	require.Len(t, names, 2, "a restart starts a new segment; the torn one is never appended to")
}

func TestFullQueueDropsAndCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, err := audit.Open(t.TempDir(), audit.Config{QueueRecords: 4}, newNow(day0).Now, nil, reg)
	require.NoError(t, err)
	// No writer yet: the queue fills and the rest is dropped, without
	// blocking.
	for i := range 10 {
		l.Record(rec(i, day0.Add(time.Duration(i)*time.Second), audit.ReasonBufferFull))
	}
	require.Equal(t, 6.0, counter(t, reg, "gateway_audit_dropped_records_total", "queue_full"))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	res := query(t, l, audit.Filter{})
	require.Equal(t, []string{"b00003", "b00002", "b00001", "b00000"}, batchIDs(res.Records))
	cancel()
	require.NoError(t, <-done)

	// After the log closed, records are dropped, not queued forever.
	for i := range 10 {
		l.Record(rec(i, day0, audit.ReasonBufferFull))
	}
	require.Equal(t, 12.0, counter(t, reg, "gateway_audit_dropped_records_total", "queue_full"))
	var nilLog *audit.Log
	nilLog.Record(rec(0, day0, audit.ReasonBufferFull)) // a nil log records nothing
}

func TestRecordsAreBoundedAndTimed(t *testing.T) {
	now := newNow(day0)
	r, _ := start(t, t.TempDir(), audit.Config{}, now.Now)
	long := strings.Repeat("é", 5000)
	r.log.Record(audit.Record{Transport: contract.TransportHTTP, Reason: "something_new", HardwareID: long, Message: long})
	res := query(t, r.log, audit.Filter{})
	require.Len(t, res.Records, 1)
	x := res.Records[0]
	require.Equal(t, day0, x.Time, "a record without a time gets the log's")
	require.LessOrEqual(t, len(x.HardwareID), 131)
	require.LessOrEqual(t, len(x.Message), 515)
	require.True(t, strings.HasSuffix(x.Message, "é..."), "cut at a character boundary")
	require.Equal(t, 1.0, counter(t, r.reg, "gateway_audit_records_total", "other"), "unknown reasons keep the label set bounded")
}

func TestConcurrentRecordAndQuery(t *testing.T) {
	r, _ := start(t, t.TempDir(), unlimited(audit.Config{SegmentBytes: 4096, MaxBytes: 1 << 20, QueueRecords: 100000}), newNow(day0).Now)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				r.log.Record(rec(g*1000+i, day0.Add(time.Duration(i)*time.Millisecond), audit.ReasonValidation))
			}
		}()
	}
	for range 5 {
		_ = query(t, r.log, audit.Filter{Limit: 10})
	}
	wg.Wait()
	require.Len(t, query(t, r.log, audit.Filter{}).Records, 800)
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  audit.Config
		want string
	}{
		{"defaults", audit.Config{}, ""},
		{"short retention", audit.Config{Retention: time.Minute}, "audit.retention: must be at least 1h"},
		{"negative max_bytes", audit.Config{MaxBytes: -1}, "audit.max_bytes: must not be negative"},
		{"tiny max_bytes", audit.Config{MaxBytes: 100}, "audit.max_bytes: must be at least"},
		{"tiny segment", audit.Config{SegmentBytes: 10}, "audit.segment_bytes: must be at least"},
		{"segment over half", audit.Config{MaxBytes: 1 << 20, SegmentBytes: 1 << 20}, "audit.segment_bytes: 1048576 is over half"},
		{"small max_bytes takes a smaller segment", audit.Config{MaxBytes: 1 << 20}, ""},
		{"negative queue", audit.Config{QueueRecords: -1}, "audit.queue_records"},
		{"negative rate", audit.Config{MaxRecordsPerSecond: -1}, "audit.max_records_per_second: must be between 1 and"},
		{"huge burst", audit.Config{BurstRecords: 1 << 30}, "audit.burst_records: must be between 1 and"},
		{"short interval", audit.Config{AggregateInterval: time.Millisecond}, "audit.aggregate_interval: must be between 1s and 1h"},
		{"long interval", audit.Config{AggregateInterval: 2 * time.Hour}, "audit.aggregate_interval: must be between 1s and 1h"},
		{"too many keys", audit.Config{MaxAggregateKeys: 1 << 20}, "audit.max_aggregate_keys: must be between 1 and"},
		{"negative floor", audit.Config{MinFreeBytes: -1}, "free-space floor must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return 0
}

// gauge reads a metric without labels: a gauge or a counter.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			if m := mf.GetMetric()[0]; m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestQueryNewestPastNonMatches checks queries whose newest lines do not
// match, or are not whole records, while the records asked for are older
// ones of the same segment: another device whose hardware_id starts with
// the one asked for, records after Until, a torn line.
func TestQueryNewestPastNonMatches(t *testing.T) {
	r, stop := start(t, t.TempDir(), audit.Config{}, newNow(day0).Now)
	at := func(i int) time.Time { return day0.Add(time.Duration(i) * time.Second) }
	for i := range 3 {
		x := rec(i, at(i), audit.ReasonValidation)
		x.HardwareID = "AA:BB"
		r.log.Record(x)
	}
	for i := 3; i < 10; i++ {
		x := rec(i, at(i), audit.ReasonValidation)
		x.HardwareID = "AA:BB:CC"
		r.log.Record(x)
	}
	tests := []struct {
		name string
		f    audit.Filter
		want []string
		more bool
	}{
		{"newest", audit.Filter{Limit: 2}, []string{"b00009", "b00008"}, true},
		{"hardware_id prefix of newer ones", audit.Filter{HardwareID: "AA:BB", Limit: 2}, []string{"b00002", "b00001"}, true},
		{"hardware_id, all", audit.Filter{HardwareID: "AA:BB", Limit: 5}, []string{"b00002", "b00001", "b00000"}, false},
		{"until before the newest", audit.Filter{Until: at(4), Limit: 3}, []string{"b00003", "b00002", "b00001"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := query(t, r.log, tt.f)
			require.Equal(t, tt.want, batchIDs(res.Records))
			require.Equal(t, tt.more, res.More)
			require.Zero(t, res.Skipped)
		})
	}

	// A torn line after the records: skipped, and the newest records found.
	stop()
	names, _ := segments(t, r.dir)
	require.Len(t, names, 1)
	f, err := os.OpenFile(filepath.Join(r.dir, names[0]), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"time":"2026-11-20T10:00:11Z","transport":"mq` + "\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	r, _ = start(t, r.dir, audit.Config{}, newNow(day0).Now)
	res := query(t, r.log, audit.Filter{Limit: 2})
	require.Equal(t, []string{"b00009", "b00008"}, batchIDs(res.Records))
	require.True(t, res.More)
	require.Equal(t, 1, res.Skipped)
}

func TestLastHour(t *testing.T) {
	now := newNow(day0)
	r, _ := start(t, t.TempDir(), audit.Config{}, now.Now)
	add := func(i int, at time.Duration, reason string) { r.log.Record(rec(i, day0.Add(at), reason)) }
	add(0, 10*time.Minute, audit.ReasonConflict) // over an hour before the count
	add(1, 70*time.Minute, audit.ReasonValidation)
	add(2, 90*time.Minute, audit.ReasonValidation)
	add(3, 119*time.Minute, audit.ReasonDuplicate)
	add(4, 119*time.Minute+30*time.Second, "something_new")
	query(t, r.log, audit.Filter{Limit: 1}) // the records are written

	c := r.log.LastHour()
	require.True(t, day0.Equal(c.Since), "opened at day0, an hour ago is earlier")
	require.Equal(t, map[string]int{}, c.ByReason, "at day0 none of them is in the last hour")

	now.ns.Store(day0.Add(2 * time.Hour).UnixNano())
	c = r.log.LastHour()
	require.True(t, day0.Add(time.Hour).Equal(c.Since))
	require.Equal(t, map[string]int{audit.ReasonValidation: 2, audit.ReasonDuplicate: 1, "other": 1}, c.ByReason)
	require.Equal(t, 4, c.Total)

	now.ns.Store(day0.Add(3 * time.Hour).UnixNano())
	c = r.log.LastHour()
	require.Empty(t, c.ByReason, "all of them over an hour old")
	require.Zero(t, c.Total)
}

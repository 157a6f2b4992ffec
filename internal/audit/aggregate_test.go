package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
)

// secretKey stands for an API key a flood might carry in any field.
const secretKey = "gw_live_0123456789abcdefSECRET"

// floodRecord is an unauthenticated attempt from remote, carrying
// secretKey where a careless caller might put it.
func floodRecord(at time.Time, remote, reason, hw string) audit.Record {
	return audit.Record{Time: at, Transport: contract.TransportHTTP, Kind: "request", Reason: reason, HardwareID: hw,
		BatchID: secretKey, Topic: secretKey, Field: secretKey, Message: "POST /v1/readings: " + secretKey,
		RemoteAddr: remote}
}

type aggKey struct{ reason, source, hw string }

func TestFloodIsAggregatedWithExactCounts(t *testing.T) {
	dir := t.TempDir()
	now := newNow(day0)
	cfg := audit.Config{MaxRecordsPerSecond: 10, BurstRecords: 5, AggregateInterval: time.Hour}
	r, _ := start(t, dir, cfg, now.Now)

	// The burst: written one by one, nothing secret in them.
	for i := range 5 {
		r.log.Record(rec(i, now.Now(), audit.ReasonValidation))
	}
	// The flood, at one instant: every attempt is counted in an aggregate.
	remotes := []struct{ addr, source string }{
		{"127.0.0.2:40000", "127.0.0.2"},
		{"127.0.0.3:40001", "127.0.0.3"},
		{"[::ffff:127.0.0.4]:5", "127.0.0.4"},
		{"[2001:db8:1:2::5]:1234", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::6]:99", "2001:db8:1:2::/64"}, // the same /64
		{"not an address", "unknown"},
	}
	want := map[aggKey]int64{}
	first, last := map[aggKey]time.Time{}, map[aggKey]time.Time{}
	const flood = 3000
	for i := range flood {
		at := day0.Add(-time.Duration(i%7) * time.Millisecond) // out of order, and no later than the burst
		rm := remotes[i%len(remotes)]
		reason, hw := audit.ReasonUnauthorized, ""
		if i%3 == 0 {
			reason, hw = audit.ReasonBadIdentity, secretKey // not a hardware_id: left out
		}
		if i%5 == 0 {
			hw = "AA:BB:CC:DD:EE:01"
		}
		k := aggKey{reason, rm.source, hw}
		if hw == secretKey {
			k.hw = ""
		}
		want[k]++
		if f, ok := first[k]; !ok || at.Before(f) {
			first[k] = at
		}
		if at.After(last[k]) {
			last[k] = at
		}
		r.log.Record(floodRecord(at, rm.addr, reason, hw))
	}
	// A second later the bucket is full again (burst_records): 5 more on
	// their own, the other 20 in aggregates.
	now.ns.Add(int64(time.Second))
	for i := range 25 {
		r.log.Record(rec(100+i, now.Now(), audit.ReasonDuplicate))
	}
	audit.WriteAggregates(r.log)

	res := query(t, r.log, audit.Filter{})
	got := map[aggKey]int64{}
	var single, total int64
	var dupAgg, aggregates int64
	for _, rc := range res.Records {
		total += rc.Attempts()
		if !rc.Aggregated {
			single++
			require.Zero(t, rc.Count)
			continue
		}
		aggregates++
		require.Equal(t, now.Now(), rc.Time, "an aggregate is timed when written")
		require.Empty(t, rc.RemoteAddr+rc.BatchID+rc.Field+rc.Topic)
		require.Contains(t, rc.Message, fmt.Sprintf("%d attempts from %s", rc.Count, rc.Source))
		if rc.Reason == audit.ReasonDuplicate {
			dupAgg += rc.Count
			continue
		}
		k := aggKey{rc.Reason, rc.Source, rc.HardwareID}
		require.Zero(t, got[k], "one aggregate per key and interval")
		got[k] = rc.Count
		require.Equal(t, first[k], rc.First, "first of %v", k)
		require.Equal(t, last[k], rc.Last, "last of %v", k)
	}
	require.Equal(t, want, got, "exact counts per reason, source and hardware_id")
	require.EqualValues(t, 5+5, single, "the burst, then a full bucket again")
	require.EqualValues(t, 20, dupAgg)
	require.EqualValues(t, 5+flood+25, total)

	require.EqualValues(t, flood, counter(t, r.reg, "gateway_audit_records_total", audit.ReasonUnauthorized)+
		counter(t, r.reg, "gateway_audit_records_total", audit.ReasonBadIdentity))
	require.EqualValues(t, flood+20, gauge(t, r.reg, "gateway_audit_aggregated_records_total"))
	require.EqualValues(t, aggregates, gauge(t, r.reg, "gateway_audit_aggregates_total"))
	require.EqualValues(t, len(want)+4, aggregates, "one per key; the duplicates came from four devices")
	require.EqualValues(t, 5+flood+25, r.log.LastHour().Total, "the status page's count holds every attempt")

	// No aggregate (nor anything else written) holds the key.
	names, _ := segments(t, dir)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		require.NotContains(t, string(b), secretKey)
	}
	// The filters work on aggregates.
	res = query(t, r.log, audit.Filter{HardwareID: "AA:BB:CC:DD:EE:01", Reason: audit.ReasonUnauthorized})
	require.NotEmpty(t, res.Records)
	for _, rc := range res.Records {
		require.True(t, rc.Aggregated)
	}
}

func TestAggregatesAreWrittenEveryIntervalAndOnClose(t *testing.T) {
	dir := t.TempDir()
	cfg := audit.Config{MaxRecordsPerSecond: 1, BurstRecords: 1, AggregateInterval: time.Second}
	r, stop := start(t, dir, cfg, newNow(day0).Now)
	for range 50 {
		r.log.Record(floodRecord(day0, "127.0.0.9:1", audit.ReasonUnauthorized, ""))
	}
	require.Eventually(t, func() bool {
		return len(query(t, r.log, audit.Filter{}).Records) == 2
	}, 10*time.Second, 50*time.Millisecond, "Run writes the aggregate within an interval")
	for range 7 {
		r.log.Record(floodRecord(day0, "127.0.0.9:1", audit.ReasonUnauthorized, ""))
	}
	stop()
	r, _ = start(t, dir, cfg, newNow(day0).Now)
	var counts []int64
	for _, rc := range query(t, r.log, audit.Filter{}).Records {
		counts = append(counts, rc.Attempts())
	}
	require.Equal(t, []int64{7, 49, 1}, counts, "what was counted at shutdown is written, newest first")
}

func TestAggregateKeysAreBounded(t *testing.T) {
	dir := t.TempDir()
	now := newNow(day0)
	cfg := audit.Config{MaxRecordsPerSecond: 1, BurstRecords: 1, MaxAggregateKeys: 16, AggregateInterval: time.Hour}
	r, _ := start(t, dir, cfg, now.Now)
	r.log.Record(rec(0, day0, audit.ReasonValidation))
	const n = 100_000
	for i := range n {
		remote := fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255)
		if i%2 == 0 {
			remote = fmt.Sprintf("[2001:db8:%x:%x::1]:1", i>>16, i&0xffff)
		}
		rc := floodRecord(day0, remote, audit.ReasonUnauthorized, fmt.Sprintf("AA:BB:CC:%02X:%02X:%02X", i>>16&255, i>>8&255, i&255))
		rc.Kind = fmt.Sprintf("kind%d", i%100) // more reason/transport/kind sets than the overflow holds
		r.log.Record(rc)
		if i%10_000 == 0 {
			require.LessOrEqual(t, audit.PendingAggregateKeys(r.log), 16+64+1)
		}
	}
	require.LessOrEqual(t, audit.PendingAggregateKeys(r.log), 16+64+1, "memory: at most max_aggregate_keys + 64 + 1 keys")
	audit.WriteAggregates(r.log)
	res := query(t, r.log, audit.Filter{})
	var total int64
	named := 0
	for _, rc := range res.Records {
		if !rc.Aggregated {
			continue
		}
		total += rc.Count
		if rc.Source != audit.SourceOther {
			named++
		}
	}
	require.EqualValues(t, n, total, "nothing is lost in the folding")
	require.Equal(t, 16, named, "the first max_aggregate_keys keys are named")
	require.LessOrEqual(t, len(res.Records), 1+16+64+1)
}

// lockedBuffer is a log sink for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestNothingWrittenUnderTheFreeSpaceFloor(t *testing.T) {
	dir := t.TempDir()
	const watermark = 100 << 20
	cfg := audit.Config{MaxRecordsPerSecond: 1, BurstRecords: 3, AggregateInterval: time.Hour}.KeepFree(watermark)
	require.EqualValues(t, watermark+audit.FreeMargin, cfg.MinFreeBytes)
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	l, err := audit.Open(dir, cfg, newNow(day0).Now, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	require.NoError(t, err)
	defer l.Close()
	var free sync.Mutex
	freeBytes := uint64(cfg.MinFreeBytes) - 1
	setFree := func(n uint64) { free.Lock(); freeBytes = n; free.Unlock() }
	audit.SetFreeSpace(l, func() (uint64, bool) { free.Lock(); defer free.Unlock(); return freeBytes, true })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	// Under the floor: the burst and an aggregate of 40 are dropped.
	for range 43 {
		l.Record(floodRecord(day0, "127.0.0.2:1", audit.ReasonUnauthorized, ""))
	}
	audit.WriteAggregates(l)
	require.Empty(t, query(t, l, audit.Filter{}).Records)
	_, size := segments(t, dir)
	require.Zero(t, size, "not a byte written")
	require.EqualValues(t, 43, counter(t, reg, "gateway_audit_dropped_records_total", "free_space"))
	require.Zero(t, counter(t, reg, "gateway_audit_records_total", audit.ReasonUnauthorized))

	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "audit records dropped") }, 5*time.Second,
		10*time.Millisecond, "Run logs the first drops within a second")

	// Room for one record but not two: the write buffer counts.
	one := len(recordLine(t, rec(1, day0.Add(time.Second), audit.ReasonConflict)))
	setFree(uint64(cfg.MinFreeBytes) + uint64(one) + 10)
	now := day0.Add(time.Hour) // the bucket is full again
	l2 := []audit.Record{rec(1, now, audit.ReasonConflict), rec(2, now, audit.ReasonConflict)}
	for _, rc := range l2 {
		l.Record(rc)
	}
	res := query(t, l, audit.Filter{})
	require.Equal(t, []string{"b00001"}, batchIDs(res.Records))
	require.EqualValues(t, 44, counter(t, reg, "gateway_audit_dropped_records_total", "free_space"))

	// Space returns: writing resumes.
	setFree(1 << 40)
	l.Record(rec(3, now, audit.ReasonConflict))
	require.Equal(t, []string{"b00003", "b00001"}, batchIDs(query(t, l, audit.Filter{}).Records))
}

// recordLine is rc as the writer encodes it.
func recordLine(t *testing.T, rc audit.Record) []byte {
	t.Helper()
	b, err := json.Marshal(rc)
	require.NoError(t, err)
	return append(b, '\n')
}

func TestDroppedAttemptsAreSummarisedOnceAMinute(t *testing.T) {
	var logs lockedBuffer
	cfg := audit.Config{MaxRecordsPerSecond: 1, BurstRecords: 1}.KeepFree(1 << 20)
	l, err := audit.Open(t.TempDir(), cfg, newNow(day0).Now, slog.New(slog.NewTextHandler(&logs, nil)), nil)
	require.NoError(t, err)
	defer l.Close()
	audit.SetFreeSpace(l, func() (uint64, bool) { return 1 << 20, true }) // under the floor
	for range 6 {
		l.Record(floodRecord(day0, "127.0.0.2:1", audit.ReasonUnauthorized, ""))
	}
	audit.WriteAggregates(l) // Run is not running: only the aggregate of 5 is written, and dropped
	audit.SummarizeLost(l)
	for range 4 {
		l.Record(floodRecord(day0, "127.0.0.2:1", audit.ReasonUnauthorized, ""))
	}
	audit.WriteAggregates(l)
	audit.SummarizeLost(l) // within the minute: no second line
	require.Equal(t, 1, strings.Count(logs.String(), "audit records dropped in the last minute"), logs.String())
	require.Contains(t, logs.String(), "free_space=5 ")
	require.Contains(t, logs.String(), fmt.Sprintf("min_free_bytes=%d", cfg.MinFreeBytes))
}

func TestClockSetBackDoesNotStopRecords(t *testing.T) {
	now := newNow(day0)
	cfg := audit.Config{MaxRecordsPerSecond: 10, BurstRecords: 2, AggregateInterval: time.Hour}
	r, _ := start(t, t.TempDir(), cfg, now.Now)
	for range 2 {
		r.log.Record(rec(0, day0, audit.ReasonConflict)) // the burst
	}
	back := day0.Add(-time.Hour)
	r.log.Record(rec(1, back, audit.ReasonConflict))                           // aggregated: nothing refilled yet
	r.log.Record(rec(2, back.Add(200*time.Millisecond), audit.ReasonConflict)) // tokens since the step back
	res := query(t, r.log, audit.Filter{})
	require.Equal(t, []string{"b00002", "b00000", "b00000"}, batchIDs(res.Records))
}

func TestAggregateOfLongFieldsKeepsOneCount(t *testing.T) {
	cfg := audit.Config{MaxRecordsPerSecond: 1, BurstRecords: 1, AggregateInterval: time.Hour}
	r, _ := start(t, t.TempDir(), cfg, newNow(day0).Now)
	for range 11 {
		rc := floodRecord(day0, "127.0.0.2:1", audit.ReasonUnauthorized, "")
		rc.Kind, rc.Transport = strings.Repeat("k", 40), strings.Repeat("t", 40) // truncated in the record
		r.log.Record(rc)
	}
	audit.WriteAggregates(r.log)
	res := query(t, r.log, audit.Filter{})
	require.Len(t, res.Records, 2)
	// Both carry the same time: either may come first.
	agg, single := res.Records[0], res.Records[1]
	if !agg.Aggregated {
		agg, single = single, agg
	}
	require.True(t, agg.Aggregated)
	require.False(t, single.Aggregated)
	require.EqualValues(t, 10, agg.Count)
	require.Equal(t, single.Kind, agg.Kind, "truncated alike")
}

// Package audit keeps the gateway's audit trail: one record for every
// attempt it refused or did not store (validation errors, duplicates,
// conflicts, bad keys, topic denials, oversize messages), so an operator can
// see what a device tried and why it was turned away. Stored batches are
// not recorded: they are the data itself.
//
// # On-disk layout
//
// Records are lines of JSON (NDJSON) in segment files in one directory
// (<data_dir>/audit):
//
//	<YYYYMMDD>-<seq, 10 digits>.ndjson
//
// The date is the UTC day of every record in the segment; seq grows by one
// with each new segment and orders them. A segment is closed when the day
// of the next record differs or it would grow past Config.SegmentBytes, and
// at every start: a segment is only ever appended to by the process that
// created it. Other files in the directory are ignored.
//
// # Durability
//
// Records are not on the acknowledgement path. Record hands a record to a
// bounded queue and never blocks: when the queue is full the record is
// dropped and counted (gateway_audit_dropped_records_total). Run writes
// the queue through a buffer that is flushed to the file about once a
// second and synced only when the log closes, so a power cut may lose the
// last second or so of records, and may leave a segment ending in a torn
// line. Readers skip lines that are not a whole record and go on.
//
// # Floods
//
// Records are written one by one up to Config.MaxRecordsPerSecond, with a
// burst of Config.BurstRecords (a token bucket on the records' times).
// Beyond it, Record counts the attempt instead, per reason, transport,
// kind, source (the IPv4 address, or the IPv6 /64) and hardware_id (when
// it is a valid hardware_id), and once every Config.AggregateInterval the
// writer writes one aggregate record per key: the record's reason,
// transport, kind and hardware_id, with "aggregated": true, "count",
// "first" and "last" (the attempts' times), "source", and a message
// saying how many attempts it stands for. An aggregate names no batch,
// field, topic or remote port and carries nothing else a sender supplied,
// so it can hold no key. At most Config.MaxAggregateKeys keys are counted
// in one interval; the attempts of further keys are counted per reason,
// transport and kind with source "other" (at most 64 such keys, then one
// catch-all). Counts are exact: an attempt is in a record, in an
// aggregate, or counted as dropped.
//
// # Bounds
//
// Segments are deleted whole: when the UTC day they cover ended more than
// Config.Retention ago, and oldest first whenever the next line would take
// the total over Config.MaxBytes (counted in
// gateway_audit_deleted_segments_total). Nothing is written while the file
// system's free space, less what the write buffer holds, is under
// Config.MinFreeBytes (the gateway sets it above buffer.min_free_bytes with
// KeepFree): those records are dropped, counted with cause free_space, and
// summarised in one log line at most once a minute. Memory is bounded by
// Config.QueueRecords records and Config.MaxAggregateKeys+65 keys of
// bounded size (each field is truncated).
package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"greenhouse-gateway/firmware-contract"
)

// Record is one refused attempt.
type Record struct {
	// Time is when the gateway refused the attempt (UTC). Zero means now.
	Time time.Time `json:"time"`
	// Transport is "mqtt" or "http".
	Transport string `json:"transport"`
	// Kind is what was attempted: readings, register, connect, publish,
	// subscribe or request (an HTTP request refused as a whole).
	Kind string `json:"kind,omitempty"`
	// HardwareID is the hardware_id the sender claimed, when known.
	HardwareID string `json:"hardware_id,omitempty"`
	// BatchID is the batch's batch_id, when known.
	BatchID string `json:"batch_id,omitempty"`
	// Reason is one of the Reason constants.
	Reason string `json:"reason"`
	// Field is the JSON path of the offending value of a validation error.
	Field string `json:"field,omitempty"`
	// Topic is the MQTT topic of an ACL denial.
	Topic string `json:"topic,omitempty"`
	// Message says what was wrong, briefly.
	Message string `json:"message,omitempty"`
	// RemoteAddr is the sender's address (host:port).
	RemoteAddr string `json:"remote_addr,omitempty"`

	// The fields of an aggregate: Count attempts with the same Reason,
	// Transport, Kind, Source and HardwareID (when it is a valid
	// hardware_id), made between First and Last, recorded together because
	// they came faster than Config.MaxRecordsPerSecond. Time is when the
	// aggregate was written, at the end of its interval; it names no batch,
	// field, topic or remote port, and its Message says how many attempts
	// it stands for. Other records have none of these fields (a Count of 0
	// means one attempt).
	Aggregated bool      `json:"aggregated,omitempty"`
	Count      int64     `json:"count,omitempty"`
	First      time.Time `json:"first,omitzero"`
	Last       time.Time `json:"last,omitzero"`
	// Source is the senders' IPv4 address, their IPv6 /64 prefix,
	// "unknown", or SourceOther for the attempts of the keys beyond
	// Config.MaxAggregateKeys.
	Source string `json:"source,omitempty"`
}

// Attempts is how many refused attempts r stands for: Count for an
// aggregate, else 1.
func (r *Record) Attempts() int64 {
	if r.Aggregated {
		return r.Count
	}
	return 1
}

// Reasons. The first six are the contract's rejection reasons.
const (
	ReasonValidation        = string(contract.ReasonValidation)
	ReasonClockNotSynced    = string(contract.ReasonClockNotSynced)
	ReasonConflict          = string(contract.ReasonConflict)
	ReasonTimestampConflict = string(contract.ReasonTimestampConflict)
	ReasonUnknownDevice     = string(contract.ReasonUnknownDevice)
	ReasonBufferFull        = string(contract.ReasonBufferFull)
	// ReasonDuplicate: a batch already stored was sent again.
	ReasonDuplicate = "duplicate"
	// ReasonUnauthorized: a missing, unknown or revoked API key.
	ReasonUnauthorized = "unauthorized"
	// ReasonAuthUnavailable: the key could not be verified now.
	ReasonAuthUnavailable = "auth_unavailable"
	// ReasonBadIdentity: an MQTT user name that is not a hardware_id.
	ReasonBadIdentity = "bad_identity"
	// ReasonClientIDRefused: an MQTT client ID that is not the user's own
	// hardware_id (taking over another device's session).
	ReasonClientIDRefused = "client_id_refused"
	// ReasonACLDenied: a publish, subscription or will on a topic the
	// device may not use.
	ReasonACLDenied = "acl_denied"
	// ReasonOversize: an HTTP body or MQTT packet over its limit.
	ReasonOversize = "oversize"
	// ReasonBadRequest: an HTTP request body that holds no batches.
	ReasonBadRequest = "bad_request"
	// ReasonQuotaExceeded: an MQTT connection over the device's or the
	// key's share of the broker's client slots, or with every slot taken.
	ReasonQuotaExceeded = "quota_exceeded"
	// ReasonForbidden: a device key used for another device's hardware_id.
	ReasonForbidden = string(contract.ReasonForbidden)
	// ReasonDeviceKeyRequired: a fleet key used for a device that holds
	// its own device key, or for data while auth.device_keys is required.
	ReasonDeviceKeyRequired = string(contract.ReasonDeviceKeyRequired)
	// ReasonSessionTakeover: an MQTT connection took over the connected
	// session of the same client ID (recorded, not refused).
	ReasonSessionTakeover = "session_takeover"
)

// Reasons lists every reason, the label values of
// gateway_audit_records_total (records with another reason count as
// "other").
var Reasons = []string{ReasonValidation, ReasonClockNotSynced, ReasonConflict, ReasonTimestampConflict,
	ReasonUnknownDevice, ReasonBufferFull, ReasonDuplicate, ReasonUnauthorized, ReasonAuthUnavailable,
	ReasonBadIdentity, ReasonClientIDRefused, ReasonACLDenied, ReasonOversize, ReasonBadRequest, ReasonQuotaExceeded,
	ReasonForbidden, ReasonDeviceKeyRequired, ReasonSessionTakeover}

// flushInterval is how often buffered records reach the file.
const flushInterval = time.Second

// syncTimeout bounds how long a query waits for the records queued before
// it to be written.
const syncTimeout = 2 * time.Second

// maxLineBytes is the longest line a reader accepts; records are far
// shorter (fields are truncated).
const maxLineBytes = 64 << 10

// Log is the audit trail. Record may be called from any goroutine, and on
// a nil *Log (it does nothing).
type Log struct {
	cfg    Config
	dir    string
	now    func() time.Time
	logger *slog.Logger
	queue  chan item
	done   chan struct{} // closed when Run returns
	// pending counts records queued and not yet written.
	pending atomic.Int64

	mu       sync.Mutex
	segments []segment // in seq order; the last one is open when w != nil
	file     *os.File
	w        *bufio.Writer
	total    int64
	nextSeq  uint64
	closed   bool
	failing  bool // a write failed; logged once until one succeeds

	// minutes counts the attempts recorded per minute (of their record's
	// time) and reason over the last hour, indexed by minute % 60; opened
	// is when counting began.
	minutes [60]minuteCount
	opened  time.Time

	agg  *aggregator
	free func() (uint64, bool) // free bytes of dir's file system
	// lost counts the attempts dropped since the last summary, by cause.
	lost lostCounts

	written    *prometheus.CounterVec
	dropped    *prometheus.CounterVec
	aggregates prometheus.Counter
	aggregated prometheus.Counter
	deleted    *prometheus.CounterVec
	bytes      prometheus.Gauge
	segGauge   prometheus.Gauge
}

// minuteCount is one minute's records by reason.
type minuteCount struct {
	minute   int64 // Unix minutes
	byReason map[string]int
}

type segment struct {
	name string
	seq  uint64
	day  time.Time // UTC midnight
	size int64
}

// item is a record, or a request to report once everything queued before
// it is written.
type item struct {
	rec  Record
	sync chan struct{}
}

// Open opens the audit trail in dir, creating the directory if needed, and
// deletes the segments past retention or over the size cap: New, then the
// trail's Open.
func Open(dir string, cfg Config, now func() time.Time, logger *slog.Logger, reg prometheus.Registerer) (*Log, error) {
	l, err := New(dir, cfg, now, logger, reg)
	if err != nil {
		return nil, err
	}
	if err := l.Open(); err != nil {
		return nil, err
	}
	return l, nil
}

// New returns the audit trail in dir; it reads and creates nothing (its
// Open does, and deletes the segments past retention or over the size
// cap). now tells the time for retention and for records without one (nil:
// the system clock); logger and reg may be nil.
func New(dir string, cfg Config, now func() time.Time, logger *slog.Logger, reg prometheus.Registerer) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	f := promauto.With(reg)
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "gateway", Subsystem: "audit", Name: name, Help: help}
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts(opts(name, help)), []string{label})
	}
	l := &Log{
		cfg: cfg, dir: dir, now: now, logger: logger.With("component", "audit"), opened: now().UTC(),
		queue: make(chan item, cfg.QueueRecords), done: make(chan struct{}),
		agg: newAggregator(cfg), free: statfsFree(dir),
		written: counterVec("records_total",
			"Refused attempts written to the audit trail, one by one or in aggregates, by reason.", "reason"),
		dropped: counterVec("dropped_records_total",
			"Refused attempts not written to the audit trail, by cause (queue_full: the writer fell behind; "+
				"free_space: the file system's free space is under the trail's floor; write_error: the disk refused them).", "cause"),
		aggregates: f.NewCounter(prometheus.CounterOpts(opts("aggregates_total",
			"Aggregate records written (attempts over audit.max_records_per_second, counted per key and interval)."))),
		aggregated: f.NewCounter(prometheus.CounterOpts(opts("aggregated_records_total",
			"Refused attempts written as part of an aggregate (included in gateway_audit_records_total)."))),
		deleted: counterVec("deleted_segments_total",
			"Audit segments deleted, by cause (retention: past audit.retention; max_bytes: the oldest, over audit.max_bytes).", "cause"),
		bytes: f.NewGauge(prometheus.GaugeOpts(opts("disk_bytes",
			"Size of the audit trail's segments on disk."))),
		segGauge: f.NewGauge(prometheus.GaugeOpts(opts("segments",
			"Audit trail segment files on disk."))),
	}
	for _, r := range append(slices.Clone(Reasons), "other") {
		l.written.WithLabelValues(r)
	}
	for _, c := range []string{causeQueueFull, causeFreeSpace, causeWriteError} {
		l.dropped.WithLabelValues(c)
	}
	l.deleted.WithLabelValues(deletedRetention)
	l.deleted.WithLabelValues(deletedMaxBytes)
	return l, nil
}

// Open creates the trail's directory when it is missing, takes stock of
// the segments already in it and deletes those past retention or over the
// size cap. Call it once, before the trail is used.
func (l *Log) Open() error {
	if err := os.MkdirAll(l.dir, 0o750); err != nil {
		return fmt.Errorf("opening audit trail %s: %w", l.dir, err)
	}
	if err := l.loadSegments(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.maintainLocked()
	return nil
}

// loadSegments lists the segments already in the directory, oldest first,
// with their total size and the next segment number. l is not shared yet.
func (l *Log) loadSegments() error {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("opening audit trail %s: %w", l.dir, err)
	}
	for _, e := range entries {
		s, ok := parseSegmentName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // deleted meanwhile
		}
		s.size = info.Size()
		l.segments = append(l.segments, s)
		l.total += s.size
		l.nextSeq = max(l.nextSeq, s.seq+1)
	}
	slices.SortFunc(l.segments, func(a, b segment) int { return cmpUint(a.seq, b.seq) })
	return nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func segmentName(day time.Time, seq uint64) string {
	return fmt.Sprintf("%s-%010d.ndjson", day.Format("20060102"), seq)
}

func parseSegmentName(name string) (segment, bool) {
	base, ok := strings.CutSuffix(name, ".ndjson")
	if !ok || len(base) != 19 || base[8] != '-' {
		return segment{}, false
	}
	day, err := time.Parse("20060102", base[:8])
	if err != nil {
		return segment{}, false
	}
	seq, err := strconv.ParseUint(base[9:], 10, 64)
	if err != nil {
		return segment{}, false
	}
	return segment{name: name, seq: seq, day: day}, true
}

// Record queues a record for writing, or counts it in its aggregate when
// records come faster than Config.MaxRecordsPerSecond. It never blocks:
// when the queue is full the record is dropped and counted.
func (l *Log) Record(rec Record) {
	if l == nil {
		return
	}
	if rec.Time.IsZero() {
		rec.Time = l.now()
	}
	rec.Aggregated, rec.Count, rec.First, rec.Last, rec.Source = false, 0, time.Time{}, time.Time{}, ""
	if !l.agg.admit(&rec) {
		return
	}
	rec = bounded(rec)
	l.pending.Add(1)
	select {
	case l.queue <- item{rec: rec}:
	default:
		l.pending.Add(-1)
		l.drop(causeQueueFull, 1)
	}
}

// Field size bounds, in bytes.
const (
	maxIDBytes      = 128
	maxMessageBytes = 512
)

// bounded copies rec's strings, truncated, so that a queued record holds
// no reference into a large payload and its size is bounded.
func bounded(rec Record) Record {
	rec.Transport = truncate(rec.Transport, 16)
	rec.Kind = truncate(rec.Kind, 16)
	rec.Reason = truncate(rec.Reason, 32)
	rec.HardwareID = truncate(rec.HardwareID, maxIDBytes)
	rec.BatchID = truncate(rec.BatchID, maxIDBytes)
	rec.Field = truncate(rec.Field, maxIDBytes)
	rec.Topic = truncate(rec.Topic, maxIDBytes)
	rec.Message = truncate(rec.Message, maxMessageBytes)
	rec.RemoteAddr = truncate(rec.RemoteAddr, 64)
	return rec
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return strings.Clone(s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.Clone(s[:cut]) + "..."
}

// Run writes queued records until ctx is done, flushing them to the file
// about once a second and applying retention; then it writes what is
// still queued and closes the log.
func (l *Log) Run(ctx context.Context) error {
	defer close(l.done)
	ticker := time.NewTicker(flushInterval)
	defer ticker.Stop()
	aggTicker := time.NewTicker(l.cfg.AggregateInterval)
	defer aggTicker.Stop()
	for {
		select {
		case it := <-l.queue:
			l.handle(it)
		case <-ticker.C:
			l.mu.Lock()
			l.flushLocked()
			l.maintainLocked()
			l.mu.Unlock()
			l.summarizeLost()
		case <-aggTicker.C:
			// The records queued before the aggregates go first, so that
			// the segment stays in time order.
			for range len(l.queue) {
				l.handle(<-l.queue)
			}
			l.mu.Lock()
			l.writeAggregatesLocked()
			l.mu.Unlock()
		case <-ctx.Done():
			for {
				select {
				case it := <-l.queue:
					l.handle(it)
				default:
					return l.Close()
				}
			}
		}
	}
}

func (l *Log) handle(it item) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if it.sync != nil {
		l.flushLocked()
		close(it.sync)
		return
	}
	l.writeLocked(it.rec)
	l.pending.Add(-1)
}

// Close flushes, syncs and closes the open segment. It is idempotent;
// records queued after it are dropped.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.writeAggregatesLocked()
	l.closed = true
	if l.w == nil {
		return nil
	}
	err := l.w.Flush()
	if serr := l.file.Sync(); err == nil {
		err = serr
	}
	if cerr := l.file.Close(); err == nil {
		err = cerr
	}
	l.file, l.w = nil, nil
	if err != nil {
		return fmt.Errorf("closing audit trail %s: %w", l.dir, err)
	}
	return nil
}

func (l *Log) writeLocked(rec Record) {
	n := rec.Attempts()
	if l.closed {
		l.drop(causeWriteError, n)
		return
	}
	if rec.Time.IsZero() {
		rec.Time = l.now()
	}
	rec.Time = rec.Time.UTC()
	line, err := json.Marshal(rec)
	if err != nil { // unreachable: a Record always encodes
		l.dropped.WithLabelValues("write_error").Inc()
		return
	}
	line = append(line, '\n')
	if !l.roomLocked(len(line)) {
		l.drop(causeFreeSpace, n)
		return
	}
	day := midnight(rec.Time)
	if l.w != nil {
		cur := l.segments[len(l.segments)-1]
		if !cur.day.Equal(day) || cur.size+int64(len(line)) > l.cfg.SegmentBytes {
			l.closeSegmentLocked()
		}
	}
	if l.w == nil {
		if err := l.openSegmentLocked(day); err != nil {
			l.failed(err)
			l.drop(causeWriteError, n)
			return
		}
	}
	l.makeRoomLocked(int64(len(line)))
	wrote, err := l.w.Write(line)
	l.segments[len(l.segments)-1].size += int64(wrote)
	l.total += int64(wrote)
	if err != nil {
		l.failed(err)
		l.drop(causeWriteError, n)
		l.closeSegmentLocked()
		l.updateGauges()
		return
	}
	l.written.WithLabelValues(reasonLabel(rec.Reason)).Add(float64(n))
	if rec.Aggregated {
		l.aggregates.Inc()
		l.aggregated.Add(float64(n))
	}
	l.countLocked(rec.Time, reasonLabel(rec.Reason), n)
	l.updateGauges()
}

// writeAggregatesLocked writes the aggregates of the interval that ends
// now, each timed as it is written.
func (l *Log) writeAggregatesLocked() {
	for _, rec := range l.agg.take() {
		l.writeLocked(rec)
	}
}

func (l *Log) countLocked(t time.Time, reason string, n int64) {
	m := t.Unix() / 60
	b := &l.minutes[(m%60+60)%60]
	if b.minute != m || b.byReason == nil {
		b.minute, b.byReason = m, map[string]int{}
	}
	b.byReason[reason] += int(n)
}

// ReasonCounts counts records by reason over a stretch of time.
type ReasonCounts struct {
	// Since is where the count starts: an hour ago, or when the log was
	// opened if that is later (the counts are not kept across restarts).
	Since time.Time `json:"since"`
	// ByReason maps a reason (or "other") to its records; reasons without
	// records are left out.
	ByReason map[string]int `json:"by_reason"`
	// Total is the sum of ByReason.
	Total int `json:"total"`
}

// LastHour counts the records written since this log was opened whose
// time falls in the last hour (to the minute), by reason. It costs no
// disk read.
func (l *Log) LastHour() ReasonCounts {
	now := l.now().UTC()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := ReasonCounts{Since: now.Add(-time.Hour), ByReason: map[string]int{}}
	if l.opened.After(c.Since) {
		c.Since = l.opened
	}
	cur := now.Unix() / 60
	for _, b := range l.minutes {
		if b.byReason == nil || b.minute <= cur-60 || b.minute > cur {
			continue
		}
		for r, n := range b.byReason {
			c.ByReason[r] += n
			c.Total += n
		}
	}
	return c
}

func reasonLabel(r string) string {
	if slices.Contains(Reasons, r) {
		return r
	}
	return "other"
}

func midnight(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

func (l *Log) openSegmentLocked(day time.Time) error {
	s := segment{name: segmentName(day, l.nextSeq), seq: l.nextSeq, day: day}
	f, err := os.OpenFile(filepath.Join(l.dir, s.name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("creating audit segment: %w", err)
	}
	l.nextSeq++
	l.segments = append(l.segments, s)
	l.file = f
	if l.w == nil {
		l.w = bufio.NewWriterSize(f, 64<<10)
	}
	l.w.Reset(f)
	return nil
}

// closeSegmentLocked flushes and closes the open segment and takes its
// size from the file (a failed write may have left less).
func (l *Log) closeSegmentLocked() {
	if l.w == nil {
		return
	}
	if err := l.w.Flush(); err != nil {
		l.failed(err)
	}
	if err := l.file.Close(); err != nil {
		l.failed(err)
	}
	cur := &l.segments[len(l.segments)-1]
	if info, err := os.Stat(filepath.Join(l.dir, cur.name)); err == nil {
		l.total += info.Size() - cur.size
		cur.size = info.Size()
	}
	l.file, l.w = nil, nil
}

func (l *Log) flushLocked() {
	if l.w == nil {
		return
	}
	if err := l.w.Flush(); err != nil {
		l.failed(err)
		l.closeSegmentLocked()
		l.updateGauges()
		return
	}
	l.recovered()
}

// makeRoomLocked deletes the oldest closed segments until n more bytes fit
// under MaxBytes.
func (l *Log) makeRoomLocked(n int64) {
	for l.total+n > l.cfg.MaxBytes && len(l.segments) > 0 {
		if l.w != nil && len(l.segments) == 1 {
			return // only the open segment is left; it is under SegmentBytes
		}
		l.removeLocked(0, deletedMaxBytes)
	}
}

// maintainLocked deletes the segments past retention, and the oldest ones
// while the total is over MaxBytes (after a lower setting).
func (l *Log) maintainLocked() {
	cutoff := l.now().Add(-l.cfg.Retention)
	for i := 0; i < len(l.segments); {
		if l.segments[i].day.Add(24 * time.Hour).After(cutoff) {
			i++
			continue
		}
		if l.w != nil && i == len(l.segments)-1 {
			l.closeSegmentLocked()
		}
		l.removeLocked(i, deletedRetention)
	}
	l.makeRoomLocked(0)
	l.updateGauges()
}

func (l *Log) removeLocked(i int, cause string) {
	s := l.segments[i]
	if err := os.Remove(filepath.Join(l.dir, s.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		l.logger.Warn("deleting an audit segment", "file", s.name, "err", err)
	}
	l.deleted.WithLabelValues(cause).Inc()
	l.total -= s.size
	l.segments = slices.Delete(l.segments, i, i+1)
}

func (l *Log) updateGauges() {
	l.bytes.Set(float64(l.total))
	l.segGauge.Set(float64(len(l.segments)))
}

// failed logs the first of a run of write failures.
func (l *Log) failed(err error) {
	if !l.failing {
		l.logger.Error("writing the audit trail; records are lost until it works again", "dir", l.dir, "err", err)
		l.failing = true
	}
}

func (l *Log) recovered() {
	if l.failing {
		l.logger.Info("writing the audit trail again", "dir", l.dir)
		l.failing = false
	}
}

// Filter selects records. Zero fields select everything.
type Filter struct {
	HardwareID string
	Reason     string
	Transport  string
	// Since is inclusive, Until exclusive.
	Since, Until time.Time
	// Limit caps the records returned; it must be positive.
	Limit int
}

func (f Filter) match(r *Record) bool {
	return (f.HardwareID == "" || r.HardwareID == f.HardwareID) &&
		(f.Reason == "" || r.Reason == f.Reason) &&
		(f.Transport == "" || r.Transport == f.Transport) &&
		(f.Since.IsZero() || !r.Time.Before(f.Since)) &&
		(f.Until.IsZero() || r.Time.Before(f.Until))
}

// needles are byte strings every matching line contains: the filter's
// fields as the writer encodes them.
func (f Filter) needles() [][]byte {
	var out [][]byte
	for _, kv := range [][2]string{{"hardware_id", f.HardwareID}, {"reason", f.Reason}, {"transport", f.Transport}} {
		if kv[1] == "" {
			continue
		}
		v, _ := json.Marshal(kv[1])
		out = append(out, append([]byte(`"`+kv[0]+`":`), v...))
	}
	return out
}

// Result is the answer to a query.
type Result struct {
	// Records are the matching records, newest first.
	Records []Record
	// More is true when more records match than Limit.
	More bool
	// Skipped counts lines that are not a whole record (torn by a crash)
	// among those read: lines that cannot match the filter's device,
	// reason or transport, and lines older than the records returned, are
	// not looked at.
	Skipped int
}

// Query returns the records that match f, newest first. Records queued
// before the call are written first (waiting at most 2 seconds).
func (l *Log) Query(ctx context.Context, f Filter) (Result, error) {
	if f.Limit <= 0 {
		return Result{}, errors.New("audit: query limit must be positive")
	}
	l.sync(ctx)
	l.mu.Lock()
	if !l.closed {
		l.flushLocked()
	}
	snap := slices.Clone(l.segments)
	l.mu.Unlock()

	var res Result
	need := f.Limit + 1
	for i := len(snap) - 1; i >= 0 && len(res.Records) < need; i-- {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		s := snap[i]
		if (!f.Since.IsZero() && !s.day.Add(24*time.Hour).After(f.Since)) || (!f.Until.IsZero() && !s.day.Before(f.Until)) {
			continue
		}
		recs, skipped, err := l.readSegment(s, f, need-len(res.Records))
		if err != nil {
			return Result{}, err
		}
		res.Skipped += skipped
		res.Records = append(res.Records, recs...)
	}
	if len(res.Records) > f.Limit {
		res.Records, res.More = res.Records[:f.Limit], true
	}
	return res, nil
}

// sync waits until the records queued so far are written, at most
// syncTimeout (Run may not have started, or be behind).
func (l *Log) sync(ctx context.Context) {
	if l.pending.Load() <= 0 {
		return // nothing queued; what the writer took is written under mu
	}
	t := time.NewTimer(syncTimeout)
	defer t.Stop()
	ch := make(chan struct{})
	select {
	case l.queue <- item{sync: ch}:
	case <-l.done:
		return
	case <-ctx.Done():
		return
	case <-t.C:
		return
	}
	select {
	case <-ch:
	case <-l.done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// readSegment returns the last keep records of s that match f, newest
// first, and the number of lines that could not be read.
//
// It first scans the segment without decoding, keeping the raw bytes of the
// last keep lines that may match, and decodes only those: a query for the
// newest records of a full segment decodes a few lines, not thousands.
// When some of them turn out not to match (or not to be whole records)
// while earlier candidates were passed over, it reads the segment again,
// decoding every candidate.
func (l *Log) readSegment(s segment, f Filter, keep int) ([]Record, int, error) {
	out, skipped, complete, err := l.readSegmentLazily(s, f, keep)
	if err != nil || complete {
		return out, skipped, err
	}
	return l.readSegmentDecoding(s, f, keep)
}

// openSegment opens s for reading; nil without an error when it was
// deleted since the snapshot.
func (l *Log) openSegment(s segment) (*os.File, error) {
	file, err := os.Open(filepath.Join(l.dir, s.name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading audit segment %s: %w", s.name, err)
	}
	return file, nil
}

// readSegmentLazily is readSegment's first pass. complete is false when
// the decoded lines yielded fewer than keep records while candidates
// before them were passed over: the answer may then miss records.
func (l *Log) readSegmentLazily(s segment, f Filter, keep int) (out []Record, skipped int, complete bool, err error) {
	file, err := l.openSegment(s)
	if file == nil || err != nil {
		return nil, 0, true, err
	}
	defer file.Close()
	// ring holds the last keep candidate lines; next is where the next one
	// goes, n how many it holds, passed how many fell out of it.
	ring := make([][]byte, min(keep, 1024))
	next, n, passed := 0, 0, 0
	skipped = l.scanCandidates(file, s, f, func(line []byte) {
		if n == keep {
			passed++
		} else if n == len(ring) {
			ring = append(ring, nil) // grows only for keep over 1024
			n++
		} else {
			n++
		}
		ring[next] = append(ring[next][:0], line...)
		next = (next + 1) % keep
	})
	for i := 1; i <= n; i++ { // newest first
		r, ok := decodeRecord(ring[((next-i)%keep+keep)%keep])
		if !ok {
			skipped++
			continue
		}
		if f.match(&r) {
			out = append(out, r)
		}
	}
	return out, skipped, len(out) == keep || passed == 0, nil
}

// readSegmentDecoding is readSegment decoding every line that may match.
func (l *Log) readSegmentDecoding(s segment, f Filter, keep int) ([]Record, int, error) {
	file, err := l.openSegment(s)
	if file == nil || err != nil {
		return nil, 0, err
	}
	defer file.Close()
	var out []Record
	skipped := 0
	unreadable := l.scanCandidates(file, s, f, func(line []byte) {
		r, ok := decodeRecord(line)
		if !ok {
			skipped++
			return
		}
		if !f.match(&r) {
			return
		}
		out = append(out, r)
		if len(out) > keep {
			out = out[1:]
		}
	})
	slices.Reverse(out)
	return out, skipped + unreadable, nil
}

// scanCandidates calls fn with each non-empty line of segment s, read from
// file, that holds all of f's needles (one that does not cannot match:
// spare the decoding). It returns 1 when a line was unreadable (over
// maxLineBytes: the rest of the segment is skipped), else 0.
func (l *Log) scanCandidates(file io.Reader, s segment, f Filter, fn func(line []byte)) int {
	sc := bufio.NewScanner(io.LimitReader(file, s.size))
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)
	needles := f.needles()
scan:
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		for _, nd := range needles {
			if !bytes.Contains(line, nd) {
				continue scan
			}
		}
		fn(line)
	}
	if err := sc.Err(); err != nil {
		l.logger.Warn("audit segment has an unreadable line; its rest is skipped", "file", s.name, "err", err)
		return 1
	}
	return 0
}

// decodeRecord decodes a segment line; false when it is not a record.
func decodeRecord(line []byte) (Record, bool) {
	var r Record
	if err := json.Unmarshal(line, &r); err != nil || r.Time.IsZero() || r.Reason == "" {
		return r, false
	}
	return r, true
}

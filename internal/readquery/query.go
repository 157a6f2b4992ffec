// Package readquery is the reading queries and summaries that the
// gateway's operator API (package operator, over the readings its buffer
// holds) and the cloud's read API (package function, over device_readings)
// both answer, with the same parameters, rules and JSON: the parameters and
// the 400 messages naming them (ParseReadingsQuery, ParseSummaryQuery), a
// readings page with its opaque cursor and quality scores (Pager), and the
// calendar summaries of hour, day or month buckets in an IANA time zone
// (Summarizer). It does no I/O: each API feeds it the readings of its
// window.
package readquery

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	// The zone database is embedded so that summaries work on hosts
	// without one (a minimal Raspberry Pi image, a Lambda runtime).
	_ "time/tzdata"
)

// Limits of the reading queries.
const (
	// DefaultQueryWindow is the window when from or to is missing.
	DefaultQueryWindow = 24 * time.Hour
	// DefaultReadingsLimit and MaxReadingsLimit bound the readings of one
	// answer (one per sensor value).
	DefaultReadingsLimit = 1000
	MaxReadingsLimit     = 10000
)

// ParamError is a bad query parameter: a 400 whose message names the
// parameter and the rule.
type ParamError struct{ msg string }

func (e *ParamError) Error() string { return e.msg }

func badParam(format string, args ...any) error {
	return &ParamError{msg: fmt.Sprintf(format, args...)}
}

// parseTime reads an RFC 3339 time or epoch milliseconds.
func parseTime(name, s string) (time.Time, error) {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms < -(1<<53) || ms > 1<<53 {
			return time.Time{}, badParam("%s: %s milliseconds is out of range", name, s)
		}
		return time.UnixMilli(ms).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, badParam("%s: %q must be an RFC 3339 time (2024-05-01T12:00:00Z) or epoch milliseconds", name, s)
	}
	return t, nil
}

// parseWindow reads from (inclusive) and to (exclusive); a missing to is
// now, a missing from is DefaultQueryWindow before to.
func parseWindow(q url.Values, now time.Time) (from, to time.Time, err error) {
	to = now
	if s := q.Get("to"); s != "" {
		if to, err = parseTime("to", s); err != nil {
			return from, to, err
		}
	}
	from = to.Add(-DefaultQueryWindow)
	if s := q.Get("from"); s != "" {
		if from, err = parseTime("from", s); err != nil {
			return from, to, err
		}
	}
	if !to.After(from) {
		return from, to, badParam("to: must be after from (%s)", from.UTC().Format(time.RFC3339Nano))
	}
	return from, to, nil
}

// WindowMS is the whole milliseconds covering [from, to): from's
// millisecond and the first one at or after to.
func WindowMS(from, to time.Time) (fromMS, toMS int64) {
	toMS = to.UnixMilli()
	if time.UnixMilli(toMS).Before(to) {
		toMS++
	}
	return from.UnixMilli(), toMS
}

// ReadingsQuery is GET /v1/devices/{hardware_id}/readings's parameters.
type ReadingsQuery struct {
	// From (inclusive) and To (exclusive) bound the readings' timestamps.
	From, To time.Time
	// Limit is the most rows (sensor values) of a page.
	Limit int
	// after is the last row of the previous page (the cursor); nil: the
	// window's start.
	after *readingKey
}

// ParseReadingsQuery reads from, to, limit and cursor. now is the default
// to.
func ParseReadingsQuery(q url.Values, now time.Time) (ReadingsQuery, error) {
	var rq ReadingsQuery
	var err error
	if rq.From, rq.To, err = parseWindow(q, now); err != nil {
		return rq, err
	}
	rq.Limit = DefaultReadingsLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxReadingsLimit {
			return rq, badParam("limit: %q must be a whole number from 1 to %d", s, MaxReadingsLimit)
		}
		rq.Limit = n
	}
	if s := q.Get("cursor"); s != "" {
		k, err := parseCursor(s)
		if err != nil {
			return rq, err
		}
		rq.after = &k
	}
	return rq, nil
}

// Resume returns where the page starts when it follows a cursor: the
// timestamp and batch_id of the reading holding the previous page's last
// row (that reading's other rows may follow it). ok is false on a first
// page.
func (q ReadingsQuery) Resume() (timestampMS int64, batchID string, ok bool) {
	if q.after == nil {
		return 0, "", false
	}
	return q.after.ms, q.after.batch, true
}

// readingKey orders readings: time, batch, sensor.
type readingKey struct {
	ms     int64
	batch  string
	sensor string
}

func (a readingKey) compare(b readingKey) int {
	switch {
	case a.ms != b.ms:
		if a.ms < b.ms {
			return -1
		}
		return 1
	case a.batch != b.batch:
		return strings.Compare(a.batch, b.batch)
	}
	return strings.Compare(a.sensor, b.sensor)
}

func (a readingKey) cursor() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(a.ms, 10) + "/" + a.batch + "/" + a.sensor))
}

func parseCursor(s string) (readingKey, error) {
	bad := badParam("cursor: %q is not a cursor this endpoint returned", s)
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return readingKey{}, bad
	}
	ms, rest, ok := strings.Cut(string(raw), "/")
	i := strings.LastIndexByte(rest, '/')
	if !ok || i < 0 {
		return readingKey{}, bad
	}
	k := readingKey{batch: rest[:i], sensor: rest[i+1:]}
	if k.ms, err = strconv.ParseInt(ms, 10, 64); err != nil {
		return readingKey{}, bad
	}
	return k, nil
}

// SummaryQuery is GET /v1/devices/{hardware_id}/summary's parameters,
// checked: its window holds at most MaxSummaryBuckets buckets.
type SummaryQuery struct {
	From, To     time.Time
	Granularity  string
	Location     *time.Location
	IncludeEmpty bool
	w            *summaryWindow
}

// ParseSummaryQuery reads from, to, granularity (required: hour, day or
// month), tz (an IANA name; default UTC) and include_empty (default
// true). now is the default to.
func ParseSummaryQuery(q url.Values, now time.Time) (SummaryQuery, error) {
	var sq SummaryQuery
	var err error
	if sq.From, sq.To, err = parseWindow(q, now); err != nil {
		return sq, err
	}
	if sq.Granularity = q.Get("granularity"); sq.Granularity == "" {
		return sq, badParam("granularity: required, one of hour, day, month")
	}
	if sq.Location, err = loadZone(q.Get("tz")); err != nil {
		return sq, err
	}
	sq.IncludeEmpty = true
	if s := q.Get("include_empty"); s != "" {
		if sq.IncludeEmpty, err = strconv.ParseBool(s); err != nil {
			return sq, badParam("include_empty: %q must be true or false", s)
		}
	}
	if sq.w, err = newSummaryWindow(sq.From, sq.To, sq.Granularity, sq.Location); err != nil {
		return sq, &ParamError{msg: err.Error()}
	}
	return sq, nil
}

// Summarizer aggregates the readings of one summary.
type Summarizer struct {
	s            *summarizer
	includeEmpty bool
}

// Summarizer returns an empty summary of q's window.
func (q SummaryQuery) Summarizer() *Summarizer {
	return &Summarizer{s: newSummarizer(q.w), includeEmpty: q.IncludeEmpty}
}

// Add counts the sensor values of one reading taken at t; it reports
// whether t falls in the window (a reading outside it is not counted).
func (s *Summarizer) Add(t time.Time, sensors map[string]float64) bool { return s.s.add(t, sensors) }

// Result is the summary of the readings added, for device hw.
func (s *Summarizer) Result(hw string) Summary { return s.s.result(hw, s.includeEmpty) }

// loadZone loads an IANA time zone; empty is UTC. The binary embeds the
// zone database (time/tzdata), so hosts without one work.
func loadZone(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if name == "Local" {
		return nil, badParam("tz: %q is not an IANA time zone name (like Europe/Berlin)", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, badParam("tz: unknown time zone %q (an IANA name like Europe/Berlin)", name)
	}
	return loc, nil
}

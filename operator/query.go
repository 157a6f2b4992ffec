package operator

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	// The zone database is embedded so that summaries work on hosts
	// without one (a minimal Raspberry Pi image).
	_ "time/tzdata"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/httpapi"
)

// History is what the operator's reading queries read: a device's batches
// held locally, pending or delivered and kept (*buffer.Buffer).
type History interface {
	DeviceBatches(hardwareID string, fromMS, toMS int64, fn func(buffer.DeviceBatch) error) error
}

// Limits of the reading queries.
const (
	// DefaultQueryWindow is the window when from or to is missing.
	DefaultQueryWindow = 24 * time.Hour
	// DefaultReadingsLimit and MaxReadingsLimit bound the readings of one
	// answer (one per sensor value).
	DefaultReadingsLimit = 1000
	MaxReadingsLimit     = 10000
)

// queryError is a 400 naming the parameter and the rule.
type queryError struct{ msg string }

func (e *queryError) Error() string { return e.msg }

func badParam(format string, args ...any) error {
	return &queryError{msg: fmt.Sprintf(format, args...)}
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

// windowMS is the whole milliseconds covering [from, to).
func windowMS(from, to time.Time) (int64, int64) {
	toMS := to.UnixMilli()
	if time.UnixMilli(toMS).Before(to) {
		toMS++
	}
	return from.UnixMilli(), toMS
}

// device answers 400 or 404 unless the path names a known device.
func (h *API) queryDevice(w http.ResponseWriter, r *http.Request) (string, bool) {
	hw := r.PathValue("hardware_id")
	if err := contract.ValidHardwareID(hw); err != nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": err.Error()})
		return "", false
	}
	if _, ok := h.deps.Devices.Device(hw); !ok {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "no device " + hw})
		return "", false
	}
	if h.deps.History == nil {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "this gateway keeps no readings"})
		return "", false
	}
	return hw, true
}

func (h *API) queryFailed(w http.ResponseWriter, err error) {
	var qe *queryError
	if errors.As(err, &qe) {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": qe.msg})
		return
	}
	h.logger.Error("reading local history", "err", err)
	httpapi.WriteJSON(w, http.StatusInternalServerError, map[string]string{"status": "error", "message": "reading the buffer failed"})
}

// eachReading calls fn with every reading of hw in [from, to), with the
// batch it belongs to.
func (h *API) eachReading(hw string, from, to time.Time, fn func(buffer.DeviceBatch, *contract.Reading, time.Time)) error {
	fromMS, toMS := windowMS(from, to)
	return h.deps.History.DeviceBatches(hw, fromMS, toMS, func(d buffer.DeviceBatch) error {
		var b contract.Batch
		if err := json.Unmarshal(d.Payload, &b); err != nil {
			return fmt.Errorf("decoding batch %s: %w", d.BatchID, err)
		}
		for i := range b.Readings {
			t := time.UnixMilli(b.Readings[i].TimestampMS)
			if t.Before(from) || !t.Before(to) {
				continue
			}
			fn(d, &b.Readings[i], t)
		}
		return nil
	})
}

// LocalReading is one sensor value held locally.
type LocalReading struct {
	Timestamp   time.Time `json:"timestamp"`
	TimestampMS int64     `json:"timestamp_ms"`
	Sensor      string    `json:"sensor"`
	Value       float64   `json:"value"`
	// Unit is derived from the sensor name's suffix (_c, _pct, _hpa, ...);
	// empty when the suffix names no known unit.
	Unit    string `json:"unit"`
	BatchID string `json:"batch_id"`
	// State is "delivered" (forwarded to the cloud, kept for
	// buffer.history_retention) or "pending".
	State     string `json:"state"`
	Delivered bool   `json:"delivered"`
	// TimeSource is "device", or "gateway" when the gateway repaired the
	// timestamp from the device's uptime.
	TimeSource string `json:"time_source"`
	// QualityScore is the quality score in [0, 1] of the reading this value
	// belongs to (the same on every row of that reading), computed over the
	// query's sequence of readings (see quality.go).
	QualityScore float64 `json:"quality_score"`
}

// ReadingsPage is the answer of GET /v1/devices/{hardware_id}/readings.
type ReadingsPage struct {
	HardwareID string         `json:"hardware_id"`
	From       time.Time      `json:"from"`
	To         time.Time      `json:"to"`
	Count      int            `json:"count"`
	Readings   []LocalReading `json:"readings"`
	// Truncated is set when more readings follow; ask again with
	// cursor=NextCursor (and the same from and to).
	Truncated  bool   `json:"truncated"`
	NextCursor string `json:"next_cursor,omitempty"`
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

// units maps sensor name suffixes to units.
var units = []struct{ suffix, unit string }{
	{"_c", "°C"}, {"_f", "°F"}, {"_pct", "%"}, {"_hpa", "hPa"}, {"_kpa", "kPa"},
	{"_pa", "Pa"}, {"_lux", "lx"}, {"_ppm", "ppm"}, {"_ppb", "ppb"}, {"_mv", "mV"}, {"_v", "V"},
	{"_ma", "mA"}, {"_w", "W"}, {"_ph", "pH"}, {"_us_cm", "µS/cm"}, {"_mm", "mm"}, {"_db", "dB"},
	{"_ms", "ms"}, {"_s", "s"},
}

func unitOf(sensor string) string {
	for _, u := range units {
		if strings.HasSuffix(sensor, u.suffix) {
			return u.unit
		}
	}
	return ""
}

func (h *API) deviceReadings(w http.ResponseWriter, r *http.Request) {
	hw, ok := h.queryDevice(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	from, to, err := parseWindow(q, time.Now())
	if err != nil {
		h.queryFailed(w, err)
		return
	}
	limit := DefaultReadingsLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxReadingsLimit {
			h.queryFailed(w, badParam("limit: %q must be a whole number from 1 to %d", s, MaxReadingsLimit))
			return
		}
		limit = n
	}
	var after *readingKey
	if s := q.Get("cursor"); s != "" {
		k, err := parseCursor(s)
		if err != nil {
			h.queryFailed(w, err)
			return
		}
		after = &k
	}
	rows, err := h.readingRows(hw, from, to, after, limit)
	if err != nil {
		h.queryFailed(w, err)
		return
	}
	page := ReadingsPage{HardwareID: hw, From: from.UTC(), To: to.UTC(), Readings: make([]LocalReading, 0, len(rows))}
	if len(rows) > limit {
		rows = rows[:limit]
		page.Truncated = true
		page.NextCursor = rows[limit-1].key.cursor()
	}
	for _, r := range rows {
		r.r.QualityScore = r.sr.score
		page.Readings = append(page.Readings, r.r)
	}
	page.Count = len(page.Readings)
	httpapi.WriteJSON(w, http.StatusOK, page)
}

// readingRow is one row of a readings answer.
type readingRow struct {
	key readingKey
	r   LocalReading
	sr  *scoredReading
}

// readingRows returns the limit+1 first rows of hw's window after the cursor
// (all when fewer), in order, with the scores of the first limit rows'
// readings set.
func (h *API) readingRows(hw string, from, to time.Time, after *readingKey, limit int) ([]readingRow, error) {
	var rows []readingRow
	// Keep the limit+1 oldest rows: sort and cut whenever rows grow past
	// a few pages, so memory stays bounded by the limit.
	trim := func() {
		slices.SortFunc(rows, func(a, b readingRow) int { return a.key.compare(b.key) })
		if len(rows) > limit+1 {
			rows = rows[:limit+1]
		}
	}
	scorer := newPageScorer(after)
	err := h.eachReading(hw, from, to, func(d buffer.DeviceBatch, rd *contract.Reading, t time.Time) {
		sr := scorer.observe(d.BatchID, rd)
		if sr == nil {
			return
		}
		state, source := "pending", "device"
		if d.Delivered {
			state = "delivered"
		}
		if rd.TimeSource != "" {
			source = rd.TimeSource
		}
		for name, v := range rd.Sensors {
			k := readingKey{ms: rd.TimestampMS, batch: d.BatchID, sensor: name}
			if after != nil && k.compare(*after) <= 0 {
				continue
			}
			rows = append(rows, readingRow{key: k, sr: sr, r: LocalReading{Timestamp: t.UTC(), TimestampMS: rd.TimestampMS,
				Sensor: name, Value: v, Unit: unitOf(name), BatchID: d.BatchID, State: state,
				Delivered: d.Delivered, TimeSource: source}})
		}
		if len(rows) > 4*limit+1 {
			trim()
		}
	})
	if err != nil {
		return nil, err
	}
	trim()
	var page []*scoredReading
	for i := 0; i < len(rows) && i < limit; i++ {
		if len(page) == 0 || page[len(page)-1] != rows[i].sr {
			page = append(page, rows[i].sr)
		}
	}
	scorer.score(page)
	return rows, nil
}

func (h *API) deviceSummary(w http.ResponseWriter, r *http.Request) {
	hw, ok := h.queryDevice(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	from, to, err := parseWindow(q, time.Now())
	if err != nil {
		h.queryFailed(w, err)
		return
	}
	granularity := q.Get("granularity")
	if granularity == "" {
		h.queryFailed(w, badParam("granularity: required, one of hour, day, month"))
		return
	}
	loc, err := loadZone(q.Get("tz"))
	if err != nil {
		h.queryFailed(w, err)
		return
	}
	includeEmpty := true
	if s := q.Get("include_empty"); s != "" {
		if includeEmpty, err = strconv.ParseBool(s); err != nil {
			h.queryFailed(w, badParam("include_empty: %q must be true or false", s))
			return
		}
	}
	win, err := newSummaryWindow(from, to, granularity, loc)
	if err != nil {
		h.queryFailed(w, &queryError{msg: err.Error()})
		return
	}
	s := newSummarizer(win)
	err = h.eachReading(hw, from, to, func(_ buffer.DeviceBatch, rd *contract.Reading, t time.Time) {
		s.add(t, rd.Sensors)
	})
	if err != nil {
		h.queryFailed(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.result(hw, includeEmpty))
}

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

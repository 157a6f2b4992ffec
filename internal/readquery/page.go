package readquery

import (
	"slices"
	"strings"
	"time"

	"greenhouse-gateway/firmware-contract"
)

// Reading states.
const (
	// StateDelivered is a reading in the cloud: forwarded by a gateway (and
	// kept there for buffer.history_retention), or read from the cloud.
	StateDelivered = "delivered"
	// StatePending is a reading a gateway holds, not forwarded yet.
	StatePending = "pending"
)

// LocalReading is one sensor value: a row of a readings page.
type LocalReading struct {
	Timestamp   time.Time `json:"timestamp"`
	TimestampMS int64     `json:"timestamp_ms"`
	Sensor      string    `json:"sensor"`
	Value       float64   `json:"value"`
	// Unit is derived from the sensor name's suffix (_c, _pct, _hpa, ...);
	// empty when the suffix names no known unit.
	Unit    string `json:"unit"`
	BatchID string `json:"batch_id"`
	// State is StateDelivered or StatePending.
	State     string `json:"state"`
	Delivered bool   `json:"delivered"`
	// TimeSource is "device", or "gateway" when the gateway repaired the
	// timestamp from the device's uptime.
	TimeSource string `json:"time_source"`
	// QualityScore is the quality score in [0, 1] of the reading this value
	// belongs to (the same on every row of that reading): the one stored
	// with it, or one computed over the query's sequence of readings (see
	// quality.go).
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

// readingRow is one row of a readings answer.
type readingRow struct {
	key    readingKey
	r      LocalReading
	sr     *scoredReading
	stored *float64
}

// Pager builds one readings page from the readings of the query's window,
// given in any order; memory stays bounded by the page's limit.
type Pager struct {
	q      ReadingsQuery
	rows   []readingRow
	scorer *pageScorer
}

// Pager returns an empty page of q.
func (q ReadingsQuery) Pager() *Pager {
	return &Pager{q: q, scorer: newPageScorer(q.after)}
}

// Add gives the pager one reading of the window, of batch batchID, in
// state StateDelivered or StatePending; stored is its stored quality score,
// or nil to score it over the query's sequence. A caller that gives the
// readings in query order (time, then batch_id) may stop once Add reports
// the page full: the readings after it have no row on the page.
func (p *Pager) Add(batchID string, rd *contract.Reading, state string, stored *float64) (full bool) {
	sr := p.scorer.observe(batchID, rd)
	if sr == nil {
		return false
	}
	source := "device"
	if rd.TimeSource != "" {
		source = rd.TimeSource
	}
	t := time.UnixMilli(rd.TimestampMS).UTC()
	for name, v := range rd.Sensors {
		k := readingKey{ms: rd.TimestampMS, batch: batchID, sensor: name}
		if p.q.after != nil && k.compare(*p.q.after) <= 0 {
			continue
		}
		p.rows = append(p.rows, readingRow{key: k, sr: sr, stored: stored, r: LocalReading{Timestamp: t,
			TimestampMS: rd.TimestampMS, Sensor: name, Value: v, Unit: unitOf(name), BatchID: batchID,
			State: state, Delivered: state == StateDelivered, TimeSource: source}})
	}
	// Keep the limit+1 oldest rows: sort and cut whenever rows grow past
	// a few pages.
	if len(p.rows) > 4*p.q.Limit+1 {
		p.trim()
	}
	return len(p.rows) > p.q.Limit
}

func (p *Pager) trim() {
	slices.SortFunc(p.rows, func(a, b readingRow) int { return a.key.compare(b.key) })
	if len(p.rows) > p.q.Limit+1 {
		p.rows = p.rows[:p.q.Limit+1]
	}
}

// Page returns the page of hw: the first Limit rows after the cursor, in
// order, with the cursor of the next page when more follow.
func (p *Pager) Page(hw string) ReadingsPage {
	p.trim()
	limit := p.q.Limit
	var scored []*scoredReading
	for i := 0; i < len(p.rows) && i < limit; i++ {
		if len(scored) == 0 || scored[len(scored)-1] != p.rows[i].sr {
			scored = append(scored, p.rows[i].sr)
		}
	}
	p.scorer.score(scored)
	page := ReadingsPage{HardwareID: hw, From: p.q.From.UTC(), To: p.q.To.UTC(), Readings: make([]LocalReading, 0, min(len(p.rows), limit))}
	rows := p.rows
	if len(rows) > limit {
		rows = rows[:limit]
		page.Truncated = true
		page.NextCursor = rows[limit-1].key.cursor()
	}
	for _, r := range rows {
		r.r.QualityScore = r.sr.score
		if r.stored != nil {
			r.r.QualityScore = *r.stored
		}
		page.Readings = append(page.Readings, r.r)
	}
	page.Count = len(page.Readings)
	return page
}

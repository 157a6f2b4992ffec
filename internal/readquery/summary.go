package readquery

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Summary granularities.
const (
	GranularityHour  = "hour"
	GranularityDay   = "day"
	GranularityMonth = "month"
)

// MaxSummaryBuckets bounds the buckets of one summary.
const MaxSummaryBuckets = 1000

// summaryWindow is a summary's window [from, to) cut into calendar buckets
// of a time zone.
type summaryWindow struct {
	from, to    time.Time
	granularity string
	loc         *time.Location
	// bounds are the bucket boundaries: bucket i is [bounds[i],
	// bounds[i+1]). The first bucket starts at from's bucket in loc, the
	// last ends at or after to.
	bounds []time.Time
}

// newSummaryWindow cuts [from, to) into the buckets of granularity in loc:
// local hours, local days (23 or 25 hours on DST days) or local months.
func newSummaryWindow(from, to time.Time, granularity string, loc *time.Location) (*summaryWindow, error) {
	if !to.After(from) {
		return nil, fmt.Errorf("to: must be after from (%s)", from.UTC().Format(time.RFC3339Nano))
	}
	var floor func(time.Time) time.Time
	var next func(time.Time) time.Time
	switch granularity {
	case GranularityHour:
		floor = func(t time.Time) time.Time { return floorHour(t, loc) }
		next = func(t time.Time) time.Time { return floorHour(t.Add(time.Hour), loc) }
	case GranularityDay:
		floor = func(t time.Time) time.Time {
			l := t.In(loc)
			return time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc)
		}
		next = func(t time.Time) time.Time {
			// The next local midnight: add a day to the calendar date of
			// the bucket's middle, so a day of 23 or 25 hours ends right.
			l := t.Add(12 * time.Hour).In(loc)
			return time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, loc)
		}
	case GranularityMonth:
		floor = func(t time.Time) time.Time {
			l := t.In(loc)
			return time.Date(l.Year(), l.Month(), 1, 0, 0, 0, 0, loc)
		}
		next = func(t time.Time) time.Time {
			l := t.Add(12 * time.Hour).In(loc)
			return time.Date(l.Year(), l.Month()+1, 1, 0, 0, 0, 0, loc)
		}
	default:
		return nil, fmt.Errorf("granularity: %q is not one of hour, day, month", granularity)
	}
	w := &summaryWindow{from: from, to: to, granularity: granularity, loc: loc}
	b := floor(from)
	w.bounds = append(w.bounds, b)
	for b.Before(to) {
		if len(w.bounds) > MaxSummaryBuckets {
			return nil, fmt.Errorf("to: the window from %s to %s holds more than %d %s buckets; shorten it or use a coarser granularity",
				from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), MaxSummaryBuckets, granularity)
		}
		n := next(b)
		if !n.After(b) {
			return nil, fmt.Errorf("tz: %s has no %s boundary after %s", loc, granularity, b.Format(time.RFC3339))
		}
		b = n
		w.bounds = append(w.bounds, b)
	}
	return w, nil
}

// floorHour is the start of t's local hour in loc, under the offset in
// effect at t: in the hour repeated when clocks go back, each of the two
// hours is its own bucket.
func floorHour(t time.Time, loc *time.Location) time.Time {
	_, off := t.In(loc).Zone()
	local := t.Unix() + int64(off)
	local -= ((local % 3600) + 3600) % 3600
	return time.Unix(local-int64(off), 0).In(loc)
}

// buckets is the number of buckets.
func (w *summaryWindow) buckets() int { return len(w.bounds) - 1 }

// bucket returns the bucket of t, or -1 outside [from, to).
func (w *summaryWindow) bucket(t time.Time) int {
	if t.Before(w.from) || !t.Before(w.to) {
		return -1
	}
	return sort.Search(len(w.bounds), func(i int) bool { return w.bounds[i].After(t) }) - 1
}

// SensorStats are the readings of one sensor in a bucket or a window.
type SensorStats struct {
	Count int64   `json:"count"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
	sum   float64
}

func (s *SensorStats) add(v float64) {
	if s.Count == 0 || v < s.Min {
		s.Min = v
	}
	if s.Count == 0 || v > s.Max {
		s.Max = v
	}
	s.Count++
	s.sum += v
	s.Mean = s.sum / float64(s.Count)
}

// SummaryBucket is one calendar bucket of a summary.
type SummaryBucket struct {
	// Start and End are the bucket's bounds in the summary's time zone
	// (the first and last bucket may reach beyond from and to; only
	// readings inside [from, to) count).
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Hours is the bucket's length: 23 or 25 for a day when clocks change.
	Hours   float64                 `json:"hours"`
	Count   int64                   `json:"count"`
	Sensors map[string]*SensorStats `json:"sensors"`
}

// BucketAverages are a sensor's readings per bucket.
type BucketAverages struct {
	Count float64 `json:"count"`
}

// Summary is the answer of GET /v1/devices/{hardware_id}/summary.
type Summary struct {
	HardwareID   string    `json:"hardware_id"`
	From         time.Time `json:"from"`
	To           time.Time `json:"to"`
	Granularity  string    `json:"granularity"`
	TZ           string    `json:"tz"`
	IncludeEmpty bool      `json:"include_empty"`
	// BucketsTotal counts every bucket of the window, BucketsActive those
	// holding a reading; Denominator is the one averages divide by:
	// BucketsTotal with include_empty, else BucketsActive.
	BucketsTotal  int `json:"buckets_total"`
	BucketsActive int `json:"buckets_active"`
	Denominator   int `json:"denominator"`
	// Totals are per sensor over the whole window.
	Totals map[string]*SensorStats `json:"totals"`
	// AveragesPerBucket are per sensor: total count / Denominator.
	AveragesPerBucket map[string]BucketAverages `json:"averages_per_bucket"`
	// Buckets are oldest first: every bucket with include_empty, else only
	// the active ones.
	Buckets []SummaryBucket `json:"buckets"`
}

// summarize aggregates readings into the window's buckets.
type summarizer struct {
	w       *summaryWindow
	buckets []SummaryBucket
	totals  map[string]*SensorStats
}

func newSummarizer(w *summaryWindow) *summarizer {
	s := &summarizer{w: w, buckets: make([]SummaryBucket, w.buckets()), totals: map[string]*SensorStats{}}
	for i := range s.buckets {
		s.buckets[i] = SummaryBucket{Start: w.bounds[i], End: w.bounds[i+1],
			Hours: w.bounds[i+1].Sub(w.bounds[i]).Hours(), Sensors: map[string]*SensorStats{}}
	}
	return s
}

// add counts one reading's sensor values taken at t; it reports whether t
// falls in the window.
func (s *summarizer) add(t time.Time, sensors map[string]float64) bool {
	i := s.w.bucket(t)
	if i < 0 {
		return false
	}
	b := &s.buckets[i]
	b.Count++
	for name, v := range sensors {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		st := b.Sensors[name]
		if st == nil {
			st = &SensorStats{}
			b.Sensors[name] = st
		}
		st.add(v)
		tot := s.totals[name]
		if tot == nil {
			tot = &SensorStats{}
			s.totals[name] = tot
		}
		tot.add(v)
	}
	return true
}

func (s *summarizer) result(hw string, includeEmpty bool) Summary {
	out := Summary{HardwareID: hw, From: s.w.from.UTC(), To: s.w.to.UTC(), Granularity: s.w.granularity,
		TZ: s.w.loc.String(), IncludeEmpty: includeEmpty, BucketsTotal: len(s.buckets),
		Totals: s.totals, AveragesPerBucket: map[string]BucketAverages{}, Buckets: []SummaryBucket{}}
	for _, b := range s.buckets {
		if b.Count > 0 {
			out.BucketsActive++
		}
		if b.Count > 0 || includeEmpty {
			out.Buckets = append(out.Buckets, b)
		}
	}
	out.Denominator = out.BucketsActive
	if includeEmpty {
		out.Denominator = out.BucketsTotal
	}
	if out.Denominator > 0 {
		for name, t := range s.totals {
			out.AveragesPerBucket[name] = BucketAverages{Count: float64(t.Count) / float64(out.Denominator)}
		}
	}
	return out
}

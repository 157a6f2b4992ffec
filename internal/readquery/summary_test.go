package readquery

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := loadZone(name)
	require.NoError(t, err)
	return loc
}

func at(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return v
}

func TestSummaryBucketsFollowTheLocalCalendar(t *testing.T) {
	tests := []struct {
		name, tz, granularity, from, to string
		// starts are the buckets' starts in local time with offset; hours
		// their lengths.
		starts []string
		hours  []float64
	}{
		{"Berlin spring-forward day has 23 hours", "Europe/Berlin", GranularityDay,
			"2024-03-30T00:00:00+01:00", "2024-04-02T00:00:00+02:00",
			[]string{"2024-03-30T00:00:00+01:00", "2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00"},
			[]float64{24, 23, 24}},
		{"Berlin fall-back day has 25 hours", "Europe/Berlin", GranularityDay,
			"2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+01:00",
			[]string{"2024-10-27T00:00:00+02:00"}, []float64{25}},
		{"New York spring-forward day has 23 hours", "America/New_York", GranularityDay,
			"2024-03-10T00:00:00-05:00", "2024-03-11T00:00:00-04:00",
			[]string{"2024-03-10T00:00:00-05:00"}, []float64{23}},
		{"New York fall-back day has 25 hours", "America/New_York", GranularityDay,
			"2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00",
			[]string{"2024-11-03T00:00:00-04:00"}, []float64{25}},
		{"Berlin spring-forward hours skip 02:00", "Europe/Berlin", GranularityHour,
			"2024-03-31T01:00:00+01:00", "2024-03-31T04:00:00+02:00",
			[]string{"2024-03-31T01:00:00+01:00", "2024-03-31T03:00:00+02:00"}, []float64{1, 1}},
		{"New York fall-back repeats 01:00", "America/New_York", GranularityHour,
			"2024-11-03T00:00:00-04:00", "2024-11-03T03:00:00-05:00",
			[]string{"2024-11-03T00:00:00-04:00", "2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00",
				"2024-11-03T02:00:00-05:00"}, []float64{1, 1, 1, 1}},
		{"months in Berlin, one with a DST change", "Europe/Berlin", GranularityMonth,
			"2024-01-15T00:00:00+01:00", "2024-04-01T00:00:00+02:00",
			[]string{"2024-01-01T00:00:00+01:00", "2024-02-01T00:00:00+01:00", "2024-03-01T00:00:00+01:00"},
			[]float64{744, 696, 743}},
		{"a window inside one bucket", "UTC", GranularityDay,
			"2024-05-01T10:00:00Z", "2024-05-01T11:00:00Z", []string{"2024-05-01T00:00:00Z"}, []float64{24}},
		{"half-hour zone hours", "Asia/Kolkata", GranularityHour,
			"2024-05-01T10:00:00Z", "2024-05-01T11:00:00Z",
			[]string{"2024-05-01T15:00:00+05:30", "2024-05-01T16:00:00+05:30"}, []float64{1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := newSummaryWindow(at(t, tt.from), at(t, tt.to), tt.granularity, zone(t, tt.tz))
			require.NoError(t, err)
			s := newSummarizer(w).result("AA:BB:CC:DD:EE:FF", true)
			var starts []string
			var hours []float64
			for _, b := range s.Buckets {
				starts = append(starts, b.Start.Format(time.RFC3339))
				hours = append(hours, b.Hours)
			}
			require.Equal(t, tt.starts, starts)
			require.Equal(t, tt.hours, hours)
		})
	}
}

func TestSummaryAssignsReadingsAndAverages(t *testing.T) {
	ny := "America/New_York"
	tests := []struct {
		name, tz, granularity, from, to  string
		includeEmpty                     bool
		readings                         map[string]float64 // RFC 3339 time -> value of temp_c
		wantCounts                       []int64            // per bucket listed
		wantTotal                        SensorStats
		wantBuckets, wantActive, wantDen int
		wantPerBucket                    float64
	}{
		{"both 01:30s of a fall-back night land in their own hour", ny, GranularityHour,
			"2024-11-03T00:00:00-04:00", "2024-11-03T03:00:00-05:00", true,
			map[string]float64{"2024-11-03T01:30:00-04:00": 10, "2024-11-03T01:30:00-05:00": 20, "2024-11-03T01:45:00-05:00": 30},
			[]int64{0, 1, 2, 0}, SensorStats{Count: 3, Min: 10, Max: 30, Mean: 20}, 4, 2, 4, 0.75},
		{"without empty buckets the denominator is the active ones", ny, GranularityHour,
			"2024-11-03T00:00:00-04:00", "2024-11-03T03:00:00-05:00", false,
			map[string]float64{"2024-11-03T01:30:00-04:00": 10, "2024-11-03T01:30:00-05:00": 20, "2024-11-03T01:45:00-05:00": 30},
			[]int64{1, 2}, SensorStats{Count: 3, Min: 10, Max: 30, Mean: 20}, 4, 2, 2, 1.5},
		{"late evening of the spring-forward day stays on that day", "Europe/Berlin", GranularityDay,
			"2024-03-30T00:00:00+01:00", "2024-04-01T00:00:00+02:00", true,
			map[string]float64{"2024-03-31T23:30:00+02:00": -2.5, "2024-03-30T23:59:59+01:00": 4},
			[]int64{1, 1}, SensorStats{Count: 2, Min: -2.5, Max: 4, Mean: 0.75}, 2, 2, 2, 1},
		{"readings outside [from, to) do not count", "UTC", GranularityDay,
			"2024-05-01T06:00:00Z", "2024-05-02T06:00:00Z", true,
			map[string]float64{"2024-05-01T05:59:59Z": 1, "2024-05-01T06:00:00Z": 2, "2024-05-02T06:00:00Z": 3},
			[]int64{1, 0}, SensorStats{Count: 1, Min: 2, Max: 2, Mean: 2}, 2, 1, 2, 0.5},
		{"months", "Europe/Berlin", GranularityMonth,
			"2024-01-01T00:00:00+01:00", "2024-04-01T00:00:00+02:00", false,
			map[string]float64{"2024-01-31T23:30:00+01:00": 1, "2024-03-31T23:30:00+02:00": 3, "2024-03-01T00:00:00+01:00": 5},
			[]int64{1, 2}, SensorStats{Count: 3, Min: 1, Max: 5, Mean: 3}, 3, 2, 2, 1.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := newSummaryWindow(at(t, tt.from), at(t, tt.to), tt.granularity, zone(t, tt.tz))
			require.NoError(t, err)
			s := newSummarizer(w)
			for ts, v := range tt.readings {
				s.add(at(t, ts), map[string]float64{"temp_c": v})
			}
			got := s.result("AA:BB:CC:DD:EE:FF", tt.includeEmpty)
			var counts []int64
			for _, b := range got.Buckets {
				counts = append(counts, b.Count)
			}
			require.Equal(t, tt.wantCounts, counts)
			require.Equal(t, tt.wantBuckets, got.BucketsTotal)
			require.Equal(t, tt.wantActive, got.BucketsActive)
			require.Equal(t, tt.wantDen, got.Denominator)
			tot := got.Totals["temp_c"]
			require.NotNil(t, tot)
			require.Equal(t, tt.wantTotal.Count, tot.Count)
			require.Equal(t, tt.wantTotal.Min, tot.Min)
			require.Equal(t, tt.wantTotal.Max, tot.Max)
			require.InDelta(t, tt.wantTotal.Mean, tot.Mean, 1e-9)
			require.InDelta(t, tt.wantPerBucket, got.AveragesPerBucket["temp_c"].Count, 1e-9)
		})
	}
}

func TestSummaryRefusesBadInput(t *testing.T) {
	utc := time.UTC
	from := at(t, "2024-05-01T00:00:00Z")
	tests := []struct {
		name        string
		to          time.Time
		granularity string
		want        string
	}{
		{"to before from", from.Add(-time.Hour), GranularityDay, "to: must be after from"},
		{"empty window", from, GranularityDay, "to: must be after from"},
		{"too many buckets", from.Add((MaxSummaryBuckets + 1) * time.Hour), GranularityHour, "more than 1000 hour buckets"},
		{"bad granularity", from.Add(time.Hour), "week", `granularity: "week" is not one of hour, day, month`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newSummaryWindow(from, tt.to, tt.granularity, utc)
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := newSummaryWindow(from, from.Add(MaxSummaryBuckets*time.Hour), GranularityHour, utc)
	require.NoError(t, err, "exactly the maximum is fine")

	for _, name := range []string{"Mars/Olympus_Mons", "Local", "../etc/passwd"} {
		_, err := loadZone(name)
		require.ErrorContains(t, err, "tz: ")
	}
}

func TestParseTimeAcceptsRFC3339AndEpochMilliseconds(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{"2024-05-01T12:00:00Z", "2024-05-01T12:00:00Z", ""},
		{"2024-05-01T14:00:00.250+02:00", "2024-05-01T12:00:00.25Z", ""},
		{"1714564800000", "2024-05-01T12:00:00Z", ""},
		{"1714564800250", "2024-05-01T12:00:00.25Z", ""},
		{"yesterday", "", `from: "yesterday" must be an RFC 3339 time`},
		{"2024-05-01", "", "must be an RFC 3339 time"},
		{"99999999999999999", "", "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseTime("from", tt.in)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got.UTC().Format(time.RFC3339Nano))
		})
	}
}

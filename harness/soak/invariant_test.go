package soak

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/devicesim"
	"greenhouse-gateway/internal/tablewrite"
)

// cloudOf builds what DynamoDB would hold for batches delivered as sent.
func cloudOf(lines ...devicesim.ReportLine) cloudState {
	st := cloudState{markers: map[string]string{}, readings: map[string][]cloudReading{}}
	for _, l := range lines {
		st.markers[l.BatchID] = l.HardwareID
		for i := range l.Readings {
			ts := l.FirstTimestampMS + int64(i)*100
			st.readings[l.BatchID] = append(st.readings[l.BatchID], cloudReading{hardwareID: l.HardwareID,
				batchID: l.BatchID, timestampMS: ts, tsBatch: tablewrite.TSBatch(ts, l.BatchID)})
			st.items++
		}
	}
	return st
}

func line(hw, id string, first int64, n int, status string) devicesim.ReportLine {
	return devicesim.ReportLine{BatchID: id, HardwareID: hw, Status: status, Readings: n,
		FirstTimestampMS: first, LastTimestampMS: first + int64(n-1)*100}
}

func TestCheckInvariant(t *testing.T) {
	a := line("02:00:00:00:00:01", "A", 1_000_000, 3, "accepted")
	b := line("02:00:00:00:00:01", "B", 2_000_000, 12, "duplicate")
	c := line("02:00:00:00:00:02", "C", 1_000_000, 5, "accepted")
	rejected := line("02:00:00:00:00:02", "R", 3_000_000, 2, "rejected")
	rejected.Reason = "conflict"

	tests := []struct {
		name    string
		lines   []devicesim.ReportLine
		cloud   func() cloudState
		want    Figures
		problem string // a substring of some problem
	}{
		{"every batch once", []devicesim.ReportLine{a, b, c}, func() cloudState { return cloudOf(a, b, c) },
			Figures{Acknowledged: 3, Delivered: 3, Readings: 20}, ""},
		{"marker missing", []devicesim.ReportLine{a, b, c}, func() cloudState {
			st := cloudOf(a, b, c)
			delete(st.markers, "B")
			return st
		}, Figures{Acknowledged: 3, Delivered: 2, Lost: 1, Readings: 20}, "lost: batch B"},
		{"batch missing", []devicesim.ReportLine{a, b, c}, func() cloudState { return cloudOf(a, c) },
			Figures{Acknowledged: 3, Delivered: 2, Lost: 1, Readings: 8}, "no processed_batches marker"},
		{"a reading missing", []devicesim.ReportLine{a, b, c}, func() cloudState {
			st := cloudOf(a, b, c)
			st.readings["B"] = st.readings["B"][1:]
			return st
		}, Figures{Acknowledged: 3, Delivered: 2, Lost: 1, Readings: 19}, "11 of its 12 readings"},
		{"a reading stored twice in its batch", []devicesim.ReportLine{a, b, c}, func() cloudState {
			st := cloudOf(a, b, c)
			r := st.readings["A"][0]
			r.timestampMS += 7 // repaired differently on a resend
			r.tsBatch = tablewrite.TSBatch(r.timestampMS, "A")
			st.readings["A"] = append(st.readings["A"], r)
			return st
		}, Figures{Acknowledged: 3, Delivered: 2, Duplicated: 1, Readings: 21}, "duplicated: batch A has 4 readings"},
		{"a reading stored under another batch", []devicesim.ReportLine{a, b, c}, func() cloudState {
			st := cloudOf(a, b, c)
			r := st.readings["A"][1]
			st.readings["B"][0] = cloudReading{hardwareID: r.hardwareID, batchID: "B", timestampMS: r.timestampMS,
				tsBatch: tablewrite.TSBatch(r.timestampMS, "B")}
			return st
		}, Figures{Acknowledged: 3, Delivered: 2, Lost: 1, Duplicated: 1, Readings: 20}, "stored under batch A and batch B"},
		{"readings other than sent", []devicesim.ReportLine{a, b, c}, func() cloudState {
			st := cloudOf(a, b, c)
			st.readings["C"][4].timestampMS = 9_999_999
			st.readings["C"][4].tsBatch = tablewrite.TSBatch(9_999_999, "C")
			return st
		}, Figures{Acknowledged: 3, Delivered: 2, Lost: 1, Readings: 20}, "not what its device sent"},
		{"a marker of a batch never acknowledged", []devicesim.ReportLine{a, b}, func() cloudState {
			st := cloudOf(a, b)
			st.markers["X"] = "02:00:00:00:00:01"
			return st
		}, Figures{Acknowledged: 2, Delivered: 2, Stray: 1, Readings: 15}, "stray: batch X"},
		{"readings of a rejected batch", []devicesim.ReportLine{a, rejected}, func() cloudState { return cloudOf(a, rejected) },
			Figures{Acknowledged: 1, Delivered: 1, Stray: 1, Rejected: 1, Readings: 3}, "answered rejected conflict"},
		{"acknowledged twice", []devicesim.ReportLine{a, a, c}, func() cloudState { return cloudOf(a, c) },
			Figures{Acknowledged: 2, Delivered: 1, Duplicated: 1, Readings: 8}, "acknowledged twice"},
		{"marker of another device", []devicesim.ReportLine{a}, func() cloudState {
			st := cloudOf(a)
			st.markers["A"] = "02:00:00:00:00:09"
			return st
		}, Figures{Acknowledged: 1, Delivered: 1, Readings: 3}, "marker of batch A names 02:00:00:00:00:09"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f Figures
			checkInvariant(&f, tt.lines, tt.cloud())
			problems := f.Problems
			f.Problems = nil
			require.Equal(t, tt.want, f)
			if tt.problem == "" {
				require.Empty(t, problems)
				require.True(t, f.OK())
				return
			}
			require.Contains(t, strings.Join(problems, "\n"), tt.problem)
			f.Problems = problems
			require.False(t, f.OK())
		})
	}
}

func TestReportTable(t *testing.T) {
	rep := Report{Seed: 7, Dir: "/tmp/x", Scenarios: []Figures{
		{Scenario: "kill9", Cycles: 100, Acknowledged: 10, Delivered: 10},
		{Scenario: "proxy", Cycles: 5, Acknowledged: 4, Delivered: 3, Lost: 1, Problems: []string{"lost: batch Z"}},
	}}
	require.False(t, rep.OK())
	require.Equal(t, 1, rep.Total().Lost)
	require.Equal(t, 105, rep.Total().Cycles)
	var b strings.Builder
	rep.WriteTable(&b)
	out := b.String()
	require.Regexp(t, `kill9\s+100\s+10\s+10\s+0\s+0\s+0.*ok`, out)
	require.Regexp(t, `total\s+105\s+14\s+13\s+1.*FAIL`, out)
	require.Contains(t, out, "lost: batch Z")
	require.Contains(t, out, "seed 7")
	require.False(t, Report{}.OK(), "no scenario ran")
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, Config{}.withDefaults().Validate())
	require.Error(t, Config{Scenarios: []string{"flood"}}.withDefaults().Validate())
	require.Error(t, Config{WriteMode: "fast"}.withDefaults().Validate())
	c := Config{}.withDefaults()
	require.Equal(t, Scenarios(), c.Scenarios)
	require.NotZero(t, c.Seed)
	require.Equal(t, 100, c.KillCycles)
	require.Equal(t, 50, c.PowerCutCycles)
}

package function_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/function"
	"greenhouse-gateway/function/event"
)

// hintOf is a history hint of n readings a second apart, ending a minute
// before end, with temperature temp; reversed puts them newest first.
func hintOf(hw string, end time.Time, n int, temp float64, reversed bool) (event.HistoryHint, []contract.Reading) {
	h := event.HistoryHint{HardwareID: hw}
	var rs []contract.Reading
	for i := range n {
		ts := end.Add(-time.Minute).UnixMilli() - int64(n-i)*1000
		sensors := map[string]float64{"bme280_temp_c": temp, "humidity_pct": 45.2}
		h.Readings = append(h.Readings, event.HistoryReading{TimestampMS: ts, Sensors: sensors})
		rs = append(rs, contract.Reading{TimestampMS: ts, Sensors: sensors})
	}
	if reversed {
		for i, j := 0, len(h.Readings)-1; i < j; i, j = i+1, j-1 {
			h.Readings[i], h.Readings[j] = h.Readings[j], h.Readings[i]
		}
	}
	return h, rs
}

// Under accept_older a hint of HistoryLen readings stands for the
// device's newest readings: the batch is scored against it, not against
// the (empty) table. A hint of fewer readings, or out of time order, is
// not used: the function reads the table, as without one. Every batch's
// readings and marker are written either way.
func TestHistoryHintScoresAgainstTheHintOrReadsWithoutOne(t *testing.T) {
	r := newRig(t, nil)
	hwUsed, hwShort, hwUnordered := "AA:BB:CC:00:34:01", "AA:BB:CC:00:34:02", "AA:BB:CC:00:34:03"
	batches := map[string]*contract.Batch{
		"c-1": batch(hwUsed, base(), 0, 10, 35),
		"c-2": batch(hwShort, base(), 0, 10, 35),
		"c-3": batch(hwUnordered, base(), 0, 10, 35),
	}
	ev := nativeEvent(t, batches, []string{"c-1", "c-2", "c-3"})
	used, usedReadings := hintOf(hwUsed, base(), quality.HistoryLen, 21, false)
	short, _ := hintOf(hwShort, base(), quality.HistoryLen-1, 21, false)
	unordered, _ := hintOf(hwUnordered, base(), quality.HistoryLen, 21, true)
	ev.History = []event.HistoryHint{used, short, unordered}

	var out function.BatchResponse
	r.invoke(t, ev, &out)
	res := byID(out.Results)

	withHint := quality.ScoreSequence(append(usedReadings, batches["c-1"].Readings...))[quality.HistoryLen:]
	withoutHint := quality.ScoreSequence(batches["c-2"].Readings)
	require.NotEqual(t, withoutHint, withHint, "the hint must change the scores for this test to tell them apart")
	for id, want := range map[string][]float64{"c-1": withHint, "c-2": withoutHint, "c-3": withoutHint} {
		require.Equal(t, function.StatusDelivered, res[id].Status, "%s: %+v", id, res[id])
		require.Equal(t, want, res[id].Quality, id)
		require.NotNil(t, r.marker(t, batches[id].BatchID), id)
		require.Len(t, r.items(t, batches[id].HardwareID), 10, id)
	}
	require.Contains(t, r.em.Output(), `"history_hinted":1,"history_queried":2`)
}

// Under reject_older the function does not trust a hint: a stale one
// (the device's newest stored reading is later than any of the hint's)
// does not let an older batch through.
func TestRejectOlderIgnoresAStaleHistoryHint(t *testing.T) {
	r := newRig(t, map[string]string{"ORDERING": "reject_older", "ORDERING_GRACE": "1s"})
	hw := "AA:BB:CC:00:34:11"
	newer := batch(hw, base(), 30, 5, 21)
	var out function.BatchResponse
	r.invoke(t, nativeEvent(t, map[string]*contract.Batch{"c-1": newer}, []string{"c-1"}), &out)
	require.Equal(t, function.StatusDelivered, out.Results[0].Status, "%+v", out.Results[0])

	older := batch(hw, base(), 0, 5, 21)
	ev := nativeEvent(t, map[string]*contract.Batch{"c-2": older}, []string{"c-2"})
	stale, _ := hintOf(hw, base(), quality.HistoryLen, 21, false) // all before older's readings
	ev.History = []event.HistoryHint{stale}
	r.invoke(t, ev, &out)
	require.Equal(t, function.StatusRejected, out.Results[0].Status, "%+v", out.Results[0])
	require.Equal(t, string(contract.ReasonTimestampConflict), out.Results[0].Reason)
	require.Nil(t, r.marker(t, older.BatchID))
	require.Len(t, r.items(t, hw), 5)
}

package function

import (
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/function/event"
)

// A device named by two hints has none, whichever of them is usable and
// in whichever order they come.
func TestADeviceNamedTwiceHasNoHint(t *testing.T) {
	usable := event.HistoryHint{HardwareID: "AA"}
	for i := range quality.HistoryLen {
		usable.Readings = append(usable.Readings, event.HistoryReading{TimestampMS: int64(1000 * (i + 1)),
			Sensors: map[string]float64{"t": 20}})
	}
	short := event.HistoryHint{HardwareID: "AA", Readings: usable.Readings[:3]}
	other := usable
	other.HardwareID = "BB"
	require.Contains(t, hints([]event.HistoryHint{usable, other}), "AA")
	for _, hs := range [][]event.HistoryHint{{usable, short, other}, {short, usable, other}, {usable, other, usable}} {
		got := hints(hs)
		require.NotContains(t, got, "AA")
		require.Contains(t, got, "BB")
	}
}

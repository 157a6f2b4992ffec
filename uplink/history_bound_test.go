package uplink

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function/event"
)

// The delivered history holds about historyBytes of hints: devices with
// many sensors fill it before historyDevices, a device beyond it gets no
// hint, and a forgotten device frees its share. hintSize follows the
// hint's JSON from above.
func TestDeliveredHistoryIsBoundedInBytes(t *testing.T) {
	var h deliveredHistory
	readings := func(n int) []contract.Reading {
		var rs []contract.Reading
		for i := range event.HistoryLen {
			sensors := map[string]float64{}
			for s := range n {
				sensors[fmt.Sprintf("sensor_%02d_with_a_long_name_of_64_characters_%020d", s, s)] = 1234.5678901234
			}
			rs = append(rs, contract.Reading{TimestampMS: int64(1000 * (i + 1)), Sensors: sensors})
		}
		return rs
	}
	big := readings(64)
	hw := func(i int) string { return fmt.Sprintf("02:00:00:00:%02X:%02X", i/256, i%256) }
	held := 0
	for i := range historyDevices {
		h.delivered(hw(i), "b-"+hw(i), big)
		if _, ok := h.hint(hw(i)); ok {
			held++
		}
	}
	require.Less(t, held, historyDevices, "the bytes bound comes first")
	require.GreaterOrEqual(t, h.total, historyBytes)
	require.Less(t, h.total, historyBytes+2*h.devices[hw(0)].size, "at most one device past the bound")
	_, ok := h.hint(hw(held))
	require.False(t, ok, "a device beyond the bound has no hint")

	hint, ok := h.hint(hw(0))
	require.True(t, ok)
	raw, err := json.Marshal(hint)
	require.NoError(t, err)
	require.GreaterOrEqual(t, h.hintSize(hw(0)), len(raw), "hintSize is the hint's encoding or more")

	h.forget(hw(0))
	require.Zero(t, h.hintSize(hw(0)))
	h.delivered(hw(held), "b-new", big)
	_, ok = h.hint(hw(held))
	require.True(t, ok, "a forgotten device's share is free again")
}

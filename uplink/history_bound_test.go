package uplink

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

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

// TestDeliveredHistoryKeepsNoPayloadAlive delivers a batch whose strings
// are substrings of a large payload, as the decoder gives them: once the
// caller drops the payload, the history must not hold it.
func TestDeliveredHistoryKeepsNoPayloadAlive(t *testing.T) {
	var h deliveredHistory
	payload := `{"hardware_id":"02:00:00:00:00:01","batch_id":"b-1","sensor":"bme280_temp_c"}` + strings.Repeat(" ", 64<<10)
	hw, batchID, sensor := payload[16:33], payload[47:50], payload[62:75]
	require.Equal(t, []string{"02:00:00:00:00:01", "b-1", "bme280_temp_c"}, []string{hw, batchID, sensor})
	freed := make(chan struct{})
	runtime.AddCleanup(unsafe.StringData(payload), func(struct{}) { close(freed) }, struct{}{})
	var readings []contract.Reading
	for i := range event.HistoryLen {
		readings = append(readings, contract.Reading{TimestampMS: int64(1000 * (i + 1)), Sensors: map[string]float64{sensor: 21}})
	}
	h.delivered(hw, batchID, readings)
	hint, ok := h.hint("02:00:00:00:00:01")
	require.True(t, ok)
	require.Equal(t, 21.0, hint.Readings[0].Sensors["bme280_temp_c"])
	deadline := time.After(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-freed:
			_, ok := h.hint("02:00:00:00:00:01") // the history is alive all along
			require.True(t, ok)
			return
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatal("the payload is still held by the delivered history")
		}
	}
}

package operator_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/operator"
)

// qualitySeries is 20 readings a second apart: a steady temperature, a
// humidity sensor that stops changing (stuck from the ninth reading on), an
// 85 °C DS18B20-style glitch at 14 and a failed soil sensor at 17.
func qualitySeries(base int64) []contract.Reading {
	rs := make([]contract.Reading, 20)
	for i := range rs {
		rs[i] = contract.Reading{TimestampMS: base + int64(i)*1000,
			Sensors:      map[string]float64{"bme280_temp_c": 22 + 0.1*float64(i%3), "humidity_pct": 61.3},
			SensorStatus: map[string]string{"bme280": "ok"}}
	}
	rs[14].Sensors["bme280_temp_c"] = 85
	rs[17].SensorStatus["soil_moisture"] = "error"
	return rs
}

// postReadings posts rs as batches of n readings each.
func postReadings(t *testing.T, h *gatewaytest.Gateway, hw, boot string, rs []contract.Reading, n int) {
	t.Helper()
	for i := 0; i < len(rs); i += n {
		part := rs[i:min(i+n, len(rs))]
		b, err := json.Marshal(contract.Batch{
			BatchID:    fmt.Sprintf("%s_%s_%d_%d", hw, boot, part[0].TimestampMS, part[len(part)-1].TimestampMS),
			HardwareID: hw, BootID: boot, FirmwareVersion: "1.0.16", Readings: part})
		require.NoError(t, err)
		postBatch(t, h, b)
	}
}

// readingScores queries the window page by page (limit per page) and returns
// the score of each reading, by timestamp, checking that every row of a
// reading carries the same score.
func readingScores(t *testing.T, h *gatewaytest.Gateway, hw string, from, to int64, limit int) map[int64]float64 {
	t.Helper()
	scores := map[int64]float64{}
	cursor := ""
	for range 100 {
		q := url.Values{"from": {fmt.Sprint(from)}, "to": {fmt.Sprint(to)}, "limit": {fmt.Sprint(limit)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var p operator.ReadingsPage
		require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw+"/readings?"+q.Encode(), &p))
		for _, r := range p.Readings {
			if s, ok := scores[r.TimestampMS]; ok {
				require.Equal(t, s, r.QualityScore, "rows of the reading at %d", r.TimestampMS)
			}
			scores[r.TimestampMS] = r.QualityScore
		}
		if !p.Truncated {
			return scores
		}
		cursor = p.NextCursor
	}
	t.Fatal("more than 100 pages")
	return nil
}

func TestDeviceReadingsShowQualityScores(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:DD:EE:03"
	base := time.Now().Add(-time.Hour).Truncate(time.Second).UnixMilli()
	rs := qualitySeries(base)
	postReadings(t, h, hw, gatewaytest.NewBoot(), rs, 5)
	deliverAll(t, h.Buf, hw) // delivered readings are scored like pending ones
	last := contract.Reading{TimestampMS: base + 20000, SensorStatus: map[string]string{},
		Sensors: map[string]float64{"bme280_temp_c": 22, "humidity_pct": 61.3}}
	postReadings(t, h, hw, gatewaytest.NewBoot(), []contract.Reading{last}, 1) // another boot, same sequence
	rs = append(rs, last)

	want := map[int64]float64{}
	for i, q := range quality.ScoreSequence(rs) {
		want[rs[i].TimestampMS] = q
	}
	// The rules at work, spelled out: stuck humidity halves one of two values,
	// the glitch zeroes the temperature, the failed sensor adds a 0 entry.
	require.Equal(t, 1.0, want[base])
	require.Equal(t, 1.0, want[base+7000])
	require.Equal(t, 0.75, want[base+8000])
	require.Equal(t, 0.25, want[base+14000])
	require.Equal(t, 0.5, want[base+17000])
	require.Equal(t, 0.75, want[base+20000])

	for _, limit := range []int{1000, 1, 3, 7} {
		require.Equal(t, want, readingScores(t, h, hw, base, base+21000, limit), "pages of %d rows give the scores of one sequence", limit)
	}

	// The sequence is the query's window: a window starting at the ninth
	// reading has no history for it.
	later := readingScores(t, h, hw, base+8000, base+21000, 1000)
	require.Equal(t, 1.0, later[base+8000])
	require.Equal(t, want[base+17000], later[base+17000], "nine readings later the history is the same again")
}

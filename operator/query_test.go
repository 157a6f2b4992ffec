package operator_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/operator"
)

// timedBatch is a batch with one reading (temp_c and humidity_pct) at each
// timestamp.
func timedBatch(hw, boot string, timestamps ...int64) []byte {
	var readings []map[string]any
	for i, ts := range timestamps {
		readings = append(readings, map[string]any{"timestamp_ms": ts,
			"sensors":       map[string]float64{"bme280_temp_c": 20 + float64(i), "humidity_pct": 50},
			"sensor_status": map[string]string{"bme280": "ok"}})
	}
	b, _ := json.Marshal(map[string]any{
		"batch_id":    fmt.Sprintf("%s_%s_%d_%d", hw, boot, timestamps[0], timestamps[len(timestamps)-1]),
		"hardware_id": hw, "boot_id": boot, "firmware_version": "1.0.16", "readings": readings,
	})
	return b
}

func postBatch(t *testing.T, h *gatewaytest.Gateway, payload []byte) {
	t.Helper()
	resp, out := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, payload)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", out)
}

// deliverAll marks every pending batch delivered, as the uplink does.
func deliverAll(t *testing.T, buf *buffer.Buffer, hw string) {
	t.Helper()
	pend, err := buf.Pending(0, 1000)
	require.NoError(t, err)
	var mine []buffer.Pending
	for _, p := range pend {
		if p.HardwareID == hw {
			mine = append(mine, p)
		}
	}
	require.NoError(t, buf.MarkDelivered(mine))
}

type errorAnswer struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func TestDeviceReadingsListsPendingAndDeliveredOldestFirst(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw, other := "AA:BB:CC:DD:EE:01", "AA:BB:CC:DD:EE:02"
	base := time.Now().Add(-2 * time.Hour).Truncate(time.Second).UnixMilli()
	boot := gatewaytest.NewBoot()
	postBatch(t, h, timedBatch(hw, boot, base, base+1000))
	postBatch(t, h, timedBatch(other, gatewaytest.NewBoot(), base+500))
	deliverAll(t, h.Buf, hw)
	postBatch(t, h, timedBatch(hw, boot, base+2000, base+3000))

	q := url.Values{"from": {fmt.Sprint(base)}, "to": {time.UnixMilli(base + 3000).UTC().Format(time.RFC3339Nano)}}
	var page operator.ReadingsPage
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw+"/readings?"+q.Encode(), &page))
	require.False(t, page.Truncated)
	type row struct {
		ms     int64
		sensor string
		state  string
	}
	var got []row
	for _, r := range page.Readings {
		got = append(got, row{r.TimestampMS, r.Sensor, r.State})
		require.Equal(t, r.State == "delivered", r.Delivered)
		require.Equal(t, "device", r.TimeSource)
		require.Equal(t, r.TimestampMS, r.Timestamp.UnixMilli())
		require.Contains(t, r.BatchID, hw+"_"+boot)
	}
	require.Equal(t, []row{
		{base, "bme280_temp_c", "delivered"}, {base, "humidity_pct", "delivered"},
		{base + 1000, "bme280_temp_c", "delivered"}, {base + 1000, "humidity_pct", "delivered"},
		{base + 2000, "bme280_temp_c", "pending"}, {base + 2000, "humidity_pct", "pending"},
	}, got, "to is exclusive; the other device's readings are not listed")
	require.Equal(t, 6, page.Count)
	require.Equal(t, "°C", page.Readings[0].Unit)
	require.Equal(t, "%", page.Readings[1].Unit)
	require.Equal(t, 21.0, page.Readings[2].Value)

	// Pages of 3 with the cursor cover the same readings once each.
	var paged []row
	cursor := ""
	for range 10 {
		pq := url.Values{"from": q["from"], "to": q["to"], "limit": {"3"}}
		if cursor != "" {
			pq.Set("cursor", cursor)
		}
		var p operator.ReadingsPage
		require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw+"/readings?"+pq.Encode(), &p))
		for _, r := range p.Readings {
			paged = append(paged, row{r.TimestampMS, r.Sensor, r.State})
		}
		if !p.Truncated {
			break
		}
		require.Len(t, p.Readings, 3)
		cursor = p.NextCursor
	}
	require.Equal(t, got, paged)

	// The default window is the last 24 hours.
	var recent operator.ReadingsPage
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw+"/readings", &recent))
	require.Equal(t, 8, recent.Count)
}

func TestDeviceQueriesRefuseBadRequests(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:DD:EE:01"
	postBatch(t, h, timedBatch(hw, gatewaytest.NewBoot(), time.Now().Add(-time.Hour).UnixMilli()))
	tests := []struct {
		path string
		code int
		want string
	}{
		{"/v1/devices/AA:BB:CC:DD:EE:99/readings", http.StatusNotFound, "no device AA:BB:CC:DD:EE:99"},
		{"/v1/devices/AA:BB:CC:DD:EE:99/summary?granularity=day", http.StatusNotFound, "no device"},
		{"/v1/devices/aa:bb/readings", http.StatusBadRequest, "hardware_id"},
		{"/v1/devices/" + hw + "/readings?from=yesterday", http.StatusBadRequest, `from: "yesterday" must be an RFC 3339 time`},
		{"/v1/devices/" + hw + "/readings?from=2000&to=1000", http.StatusBadRequest, "to: must be after from"},
		{"/v1/devices/" + hw + "/readings?limit=0", http.StatusBadRequest, "limit: \"0\" must be a whole number from 1 to 10000"},
		{"/v1/devices/" + hw + "/readings?limit=10001", http.StatusBadRequest, "limit:"},
		{"/v1/devices/" + hw + "/readings?cursor=zz!", http.StatusBadRequest, "cursor:"},
		{"/v1/devices/" + hw + "/summary", http.StatusBadRequest, "granularity: required"},
		{"/v1/devices/" + hw + "/summary?granularity=week", http.StatusBadRequest, `granularity: "week" is not one of hour, day, month`},
		{"/v1/devices/" + hw + "/summary?granularity=day&tz=Mars/Base", http.StatusBadRequest, `tz: unknown time zone "Mars/Base"`},
		{"/v1/devices/" + hw + "/summary?granularity=day&include_empty=maybe", http.StatusBadRequest, "include_empty:"},
		{"/v1/devices/" + hw + "/summary?granularity=hour&from=2024-01-01T00:00:00Z&to=2024-03-01T00:00:00Z",
			http.StatusBadRequest, "to: the window from 2024-01-01T00:00:00Z to 2024-03-01T00:00:00Z holds more than 1000 hour buckets"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			var e errorAnswer
			require.Equal(t, tt.code, gatewaytest.AdminGet(t, h, tt.path, &e))
			require.Equal(t, "error", e.Status)
			require.Contains(t, e.Message, tt.want)
		})
	}
	req, err := http.NewRequest(http.MethodGet, h.HTTPURL+"/v1/devices/"+hw+"/readings", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.GoodKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a device key is not the admin token")
}

func TestDeviceSummaryInATimeZone(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:DD:EE:01"
	// Three readings on one Berlin day, one on the next, none on the third.
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	day := time.Now().In(berlin).AddDate(0, 0, -3)
	start := time.Date(day.Year(), day.Month(), day.Day(), 0, 0, 0, 0, berlin)
	ms := func(d time.Duration) int64 { return start.Add(d).UnixMilli() }
	boot := gatewaytest.NewBoot()
	postBatch(t, h, timedBatch(hw, boot, ms(time.Hour), ms(2*time.Hour), ms(22*time.Hour)))
	deliverAll(t, h.Buf, hw)
	end := time.Date(day.Year(), day.Month(), day.Day()+3, 0, 0, 0, 0, berlin)
	postBatch(t, h, timedBatch(hw, boot, time.Date(day.Year(), day.Month(), day.Day()+1, 12, 0, 0, 0, berlin).UnixMilli()))

	for _, includeEmpty := range []bool{true, false} {
		t.Run(fmt.Sprint("include_empty=", includeEmpty), func(t *testing.T) {
			q := url.Values{"from": {start.Format(time.RFC3339)}, "to": {end.Format(time.RFC3339)},
				"granularity": {"day"}, "tz": {"Europe/Berlin"}, "include_empty": {fmt.Sprint(includeEmpty)}}
			var s operator.Summary
			require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, h, "/v1/devices/"+hw+"/summary?"+q.Encode(), &s))
			require.Equal(t, "Europe/Berlin", s.TZ)
			require.Equal(t, 3, s.BucketsTotal)
			require.Equal(t, 2, s.BucketsActive)
			temp := s.Totals["bme280_temp_c"]
			require.NotNil(t, temp)
			require.EqualValues(t, 4, temp.Count)
			require.Equal(t, 20.0, temp.Min)
			require.Equal(t, 22.0, temp.Max)
			require.InDelta(t, 20.75, temp.Mean, 1e-9)
			if includeEmpty {
				require.Equal(t, 3, s.Denominator)
				require.Len(t, s.Buckets, 3)
				require.Zero(t, s.Buckets[2].Count)
				require.InDelta(t, 4.0/3, s.AveragesPerBucket["bme280_temp_c"].Count, 1e-9)
			} else {
				require.Equal(t, 2, s.Denominator)
				require.Len(t, s.Buckets, 2)
				require.InDelta(t, 2.0, s.AveragesPerBucket["bme280_temp_c"].Count, 1e-9)
			}
			require.EqualValues(t, 3, s.Buckets[0].Count)
			require.Equal(t, start.Unix(), s.Buckets[0].Start.Unix())
			require.EqualValues(t, 1, s.Buckets[1].Count)
			require.InDelta(t, 21.0, s.Buckets[0].Sensors["bme280_temp_c"].Mean, 1e-9)
		})
	}
}

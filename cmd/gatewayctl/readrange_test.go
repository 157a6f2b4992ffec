package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/readquery"
	"greenhouse-gateway/internal/tablewrite"
)

// TestReadingsRangeAndSummaryReadTheCloud writes batches to
// device_readings with the table writer and posts the same ones to a
// gateway: gatewayctl's summary is the gateway's JSON, and its pages hold
// every reading once.
func TestReadingsRangeAndSummaryReadTheCloud(t *testing.T) {
	g := build(t)
	local := dynamotest.Shared(t)
	tables := local.NewTables(t)
	writer := tablewrite.New(local.Client(t), tables, tablewrite.Options{})
	gw := gatewaytest.Start(t, nil)

	hw, boot := "AA:BB:CC:00:17:01", "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	start := time.Now().Add(-50 * time.Hour).Truncate(time.Minute)
	for i := range 30 {
		b := &contract.Batch{HardwareID: hw, BootID: boot, FirmwareVersion: "1.0.16"}
		for j := range 5 {
			n := i*5 + j
			b.Readings = append(b.Readings, contract.Reading{TimestampMS: start.Add(time.Duration(n) * 19 * time.Minute).UnixMilli(),
				Sensors:      map[string]float64{"bme280_temp_c": 15 + float64(n%11), "soil_moisture_pct": float64(30 + n%5)},
				SensorStatus: map[string]string{"bme280": "ok"}})
		}
		b.BatchID = fmt.Sprintf("%s_%s_%d_%d", hw, boot, b.Readings[0].TimestampMS, b.Readings[4].TimestampMS)
		res := writer.Write(t.Context(), tablewrite.Build(tablewrite.Batch{Batch: b, ReceivedAt: time.Now(), Hash: b.IdentityHash()},
			90*24*time.Hour, time.Now()), 10)
		require.Equal(t, tablewrite.Delivered, res.Outcome, "%v", res.Err)
		payload, err := json.Marshal(b)
		require.NoError(t, err)
		resp, out := gatewaytest.PostJSON(t, gw.HTTPURL+"/v1/readings", gatewaytest.GoodKey, payload)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", out)
	}
	flags := []string{"--dynamodb-endpoint", local.Endpoint, "--table-prefix", strings.TrimSuffix(tables.Devices, "devices"),
		"--hardware-id", hw, "--from", start.Add(-time.Hour).Format(time.RFC3339), "--to", time.Now().Format(time.RFC3339)}

	q := url.Values{"from": {start.Add(-time.Hour).Format(time.RFC3339)}, "to": {time.Now().Format(time.RFC3339)},
		"granularity": {"day"}, "tz": {"Pacific/Auckland"}, "include_empty": {"false"}}
	var atGateway, fromCtl any
	require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, gw, "/v1/devices/"+hw+"/summary?"+q.Encode(), &atGateway))
	r := g.run(t, nil, append([]string{"readings", "summary", "--json", "--granularity", "day", "--tz", "Pacific/Auckland",
		"--include-empty", "false"}, flags...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &fromCtl))
	// The windows' "to" differ by the moments the two were asked at.
	atGateway.(map[string]any)["to"], fromCtl.(map[string]any)["to"] = nil, nil
	require.Equal(t, atGateway, fromCtl)

	r = g.run(t, nil, append([]string{"readings", "summary", "--granularity", "day", "--tz", "Pacific/Auckland"}, flags...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `total\s+soil_moisture_pct\s+150\s`, r.stdout)
	require.Contains(t, r.stderr, "150 readings read in")

	// One page, then the rest with --all: every value once.
	r = g.run(t, nil, append([]string{"readings", "range", "--json", "--limit", "40"}, flags...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var page readquery.ReadingsPage
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	require.Equal(t, 40, page.Count)
	require.Contains(t, r.stderr, "--cursor "+page.NextCursor)
	r = g.run(t, nil, append([]string{"readings", "range", "--json", "--limit", "40", "--all"}, flags...)...)
	require.Equal(t, 0, r.code, r.stderr)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var p readquery.ReadingsPage
		require.NoError(t, json.Unmarshal([]byte(line), &p))
		for _, row := range p.Readings {
			k := fmt.Sprint(row.TimestampMS, row.BatchID, row.Sensor)
			require.False(t, seen[k], "twice: %s", k)
			seen[k] = true
		}
	}
	require.Len(t, seen, 300, "150 readings of two sensors")
	r = g.run(t, nil, append([]string{"readings", "range", "--limit", "3"}, flags...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "TIMESTAMP")
	require.Contains(t, r.stdout, "°C")

	for _, tt := range []struct{ args, want string }{
		{"readings summary --hardware-id " + hw, "--granularity: required, one of hour, day, month"},
		{"readings summary --granularity day --tz Mars/Base --hardware-id " + hw, "--tz: unknown time zone"},
		{"readings range --limit 0 --hardware-id " + hw, `--limit: "0" must be a whole number from 1 to 10000`},
		{"readings range --from yesterday --hardware-id " + hw, `--from: "yesterday" must be an RFC 3339 time`},
		{"readings range", "--hardware-id is required"},
	} {
		r := g.run(t, nil, strings.Fields(tt.args)...)
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, tt.want)
	}
}

package operator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/registry"
)

// BenchmarkStatusPage renders the status page of a fleet of 10,000
// devices, a tenth of them silent, with a full segment of audit records
// (4 MiB, its default size), over HTTP.
func BenchmarkStatusPage(b *testing.B) {
	buf, err := buffer.Open(b.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, buf.Close()) })
	records := map[string][]byte{}
	for i := range 10000 {
		hw := fmt.Sprintf("02:00:00:00:%02X:%02X", i/256, i%256)
		seen := statusT0.Add(2 * time.Hour)
		if i%10 == 0 {
			seen = statusT0
		}
		raw, err := json.Marshal(registry.Device{HardwareID: hw, Registered: true, FriendlyName: "bench " + hw,
			FirstSeenAt: statusT0, LastSeenAt: seen})
		require.NoError(b, err)
		records["dev/"+hw] = raw
		if len(records) == 1000 { // one transaction holds only so many
			require.NoError(b, buf.SaveStates(records))
			clear(records)
		}
	}
	clk := &statusClock{now: statusT0.Add(2*time.Hour + 5*time.Minute)}
	devices, err := registry.New(registry.Config{}, buf, clk, nil, prometheus.NewRegistry())
	require.NoError(b, err)
	require.NoError(b, devices.Load())
	trail := statusAudit(b, clk, nil)
	for round := range 8 { // the queue holds 2048 records: let the writer catch up
		for i := range 2000 {
			hw := fmt.Sprintf("02:00:00:00:%02X:%02X", i/256, i%256)
			trail.Record(audit.Record{Time: statusT0.Add(time.Duration(round*2000+i) * 100 * time.Millisecond),
				Transport: contract.TransportHTTP, Kind: "readings", HardwareID: hw, BatchID: hw + "_" + fmt.Sprint(i),
				Reason: audit.ReasonValidation, Field: "readings[0].values.bme280_temp_c",
				Message: "must be a finite number between -1e9 and 1e9", RemoteAddr: "192.0.2.10:40000"})
		}
		_, err := trail.Query(context.Background(), audit.Filter{Limit: 1})
		require.NoError(b, err)
	}
	base := startStatusServer(b, gatewaytest.AdminToken, devices, trail, statusSources(clk, nil))
	for _, path := range []string{"/", "/v1/status"} {
		b.Run(path, func(b *testing.B) {
			size := 0
			for b.Loop() {
				req, err := http.NewRequest(http.MethodGet, base+path, nil)
				require.NoError(b, err)
				req.SetBasicAuth("operator", gatewaytest.AdminToken)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(b, err)
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(b, err)
				require.Equal(b, http.StatusOK, resp.StatusCode)
				size = len(body)
			}
			b.ReportMetric(float64(size), "bytes/page")
		})
	}
}

package function_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function"
	"greenhouse-gateway/function/event"
	"greenhouse-gateway/harness/emftest"
)

// emitted checks every EMF document of the function's output against the
// specification's structure and function.Metrics (namespace, name, unit,
// dimension set) and returns them.
func emitted(t *testing.T, output string) []emftest.Doc {
	t.Helper()
	docs, err := emftest.Parse(output)
	require.NoError(t, err)
	require.NotEmpty(t, docs, "output:\n%s", output)
	require.NoError(t, emftest.Conform(docs, function.MetricNamespace, function.MetricOf))
	for _, d := range docs {
		if s := d.Dimension(function.DimStatus); s != "" {
			require.Contains(t, function.BatchStatuses, s)
		}
	}
	return docs
}

// invocationLines returns the function's per-invocation log lines.
func invocationLines(t *testing.T, output string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(output, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(strings.TrimSpace(line)), &m) == nil && m["msg"] == "invocation" {
			out = append(out, m)
		}
	}
	return out
}

func TestInvocationsAreLoggedAndMeasuredUnderTheEmulator(t *testing.T) {
	r := newRig(t, nil)
	hw := "AA:BB:CC:00:16:01"
	good := batch(hw, base(), 0, 3, 21)
	bad := strings.Replace(jsonOf(t, batch(hw, base(), 5, 2, 21)), `"humidity_pct"`, `"Humidity"`, 1)
	ev := function.BatchEvent{V: 1, Kind: function.KindGatewayBatches, GatewayID: "gw-obs-1",
		Items:  []function.BatchItem{{ID: "1", Batch: json.RawMessage(jsonOf(t, good))}, {ID: "2", Batch: json.RawMessage(bad)}},
		Report: &event.UplinkReport{PendingBatches: 7, OldestPendingAgeSeconds: 42.5, DeliveredBatches: 3, LastErrorClass: "unreachable"}}
	var resp function.BatchResponse
	r.invoke(t, ev, &resp)
	require.Equal(t, function.StatusDelivered, byID(resp.Results)["1"].Status)
	require.Equal(t, function.StatusRejected, byID(resp.Results)["2"].Status)

	// The same event from a gateway that does not report: answered the same
	// way, no gateway metrics.
	ev.GatewayID, ev.Report = "gw-obs-old", nil
	r.invoke(t, ev, &resp)
	require.Equal(t, function.StatusDuplicate, byID(resp.Results)["1"].Status)

	// An idle report: an empty event.
	r.invoke(t, function.BatchEvent{V: 1, Kind: function.KindGatewayBatches, GatewayID: "gw-obs-1",
		Report: &event.UplinkReport{PendingBatches: 0}}, &resp)
	require.Empty(t, resp.Results)

	// A device's request with an Idempotency-Key.
	code, readings := r.readings(t, map[string]string{"Idempotency-Key": "idem-obs-1"}, jsonOf(t, batch(hw, base(), 10, 4, 21)))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, contract.StatusAccepted, readings.Results[0].Status)

	out := r.em.Output()
	docs := emitted(t, out)

	gw := emftest.Select(docs, map[string]string{function.DimGatewayID: "gw-obs-1"})
	require.Len(t, gw, 2, "one gateway document per report")
	require.Equal(t, 7.0, gw[0].MustValue(t, "GatewayPendingBatches"))
	require.Equal(t, 42.5, gw[0].MustValue(t, "GatewayOldestPendingAge"))
	require.Equal(t, 3.0, gw[0].MustValue(t, "GatewayDeliveredBatches"))
	require.Equal(t, 1.0, gw[0].MustValue(t, "GatewayUplinkErrors"))
	require.Equal(t, 1.0, gw[0].MustValue(t, "GatewayReports"))
	require.Equal(t, "unreachable", gw[0].Root["LastErrorClass"])
	require.Equal(t, 0.0, gw[1].MustValue(t, "GatewayPendingBatches"))
	require.Equal(t, 0.0, gw[1].MustValue(t, "GatewayUplinkErrors"))
	require.Empty(t, emftest.Select(docs, map[string]string{function.DimGatewayID: "gw-obs-old"}), "no report, no gateway metrics")

	byStatus := func(s string) (batches, readings float64) {
		for _, d := range emftest.Select(docs, map[string]string{function.DimStatus: s}) {
			batches += d.MustValue(t, "Batches")
			readings += d.MustValue(t, "Readings")
		}
		return batches, readings
	}
	b, n := byStatus(function.StatusDelivered)
	require.Equal(t, []float64{2, 7}, []float64{b, n}, "delivered: the gateway's batch (3 readings) and the device's (4)")
	b, n = byStatus(function.StatusRejected)
	require.Equal(t, []float64{2, 4}, []float64{b, n}, "rejected: the invalid batch, twice")
	b, _ = byStatus(function.StatusDuplicate)
	require.Equal(t, 1.0, b)

	var inv []emftest.Doc
	for _, d := range docs {
		if _, ok := d.Value("Duration"); ok {
			inv = append(inv, d)
		}
	}
	require.Len(t, inv, 4, "one invocation document per invocation")
	require.Equal(t, []float64{2, 2, 0, 1}, []float64{inv[0].MustValue(t, "BatchesPerInvocation"), inv[1].MustValue(t, "BatchesPerInvocation"),
		inv[2].MustValue(t, "BatchesPerInvocation"), inv[3].MustValue(t, "BatchesPerInvocation")})
	require.Equal(t, 1.0, inv[0].MustValue(t, "DeadLetters"))
	require.Equal(t, 0.0, inv[0].MustValue(t, "Conflicts"))
	require.Positive(t, inv[0].MustValue(t, "Duration"))

	lines := invocationLines(t, out)
	require.Len(t, lines, 4, "one log line per invocation:\n%s", out)
	for _, l := range lines {
		require.NotEmpty(t, l["request_id"], "Lambda's request id: %v", l)
		require.Contains(t, l, "duration_ms")
	}
	require.Equal(t, "gw-obs-1", lines[0]["gateway_id"])
	require.Equal(t, map[string]any{"delivered": 1.0, "rejected": 1.0}, lines[0]["batches"])
	require.Equal(t, hw, lines[0]["hardware_id"])
	require.Equal(t, 7.0, lines[0]["report"].(map[string]any)["pending_batches"])
	require.Equal(t, "http", lines[3]["event"])
	require.Equal(t, "POST /v1/readings", lines[3]["route"])
	require.Equal(t, "idem-obs-1", lines[3]["correlation_id"])
	require.Equal(t, 200.0, lines[3]["status_code"])
	require.Equal(t, "req-1", lines[3]["api_request_id"])

	// request_id in the body is the correlation id without the header.
	code, _ = r.readings(t, nil, `{"request_id":"body-req-1","batches":[`+jsonOf(t, batch(hw, base(), 20, 1, 21))+`]}`)
	require.Equal(t, http.StatusOK, code)
	lines = invocationLines(t, r.em.Output())
	require.Equal(t, "body-req-1", lines[len(lines)-1]["correlation_id"])

	// Members the function does not know (a newer gateway's) are ignored,
	// in the event and in its report.
	r.invoke(t, json.RawMessage(`{"v":1,"kind":"gateway_batches","gateway_id":"gw-obs-new","items":[],"next":{"x":1},
		"report":{"pending_batches":2,"oldest_pending_age_s":1.5,"delivered_batches":0,"next":true}}`), &resp)
	require.Empty(t, resp.Results)
	gw = emftest.Select(emitted(t, r.em.Output()), map[string]string{function.DimGatewayID: "gw-obs-new"})
	require.Len(t, gw, 1)
	require.Equal(t, 2.0, gw[0].MustValue(t, "GatewayPendingBatches"))
}

func TestLogLevelSilencesTheInvocationLineNotTheMetrics(t *testing.T) {
	r := newRig(t, map[string]string{"LOG_LEVEL": "warn"})
	var resp function.BatchResponse
	r.invoke(t, function.BatchEvent{V: 1, Kind: function.KindGatewayBatches, GatewayID: "gw-quiet",
		Report: &event.UplinkReport{PendingBatches: 5}}, &resp)
	out := r.em.Output()
	require.Empty(t, invocationLines(t, out))
	gw := emftest.Select(emitted(t, out), map[string]string{function.DimGatewayID: "gw-quiet"})
	require.Len(t, gw, 1)
	require.Equal(t, 5.0, gw[0].MustValue(t, "GatewayPendingBatches"))
}

func TestLogLevelFromEnv(t *testing.T) {
	for s, want := range map[string]slog.Level{"": slog.LevelInfo, "debug": slog.LevelDebug, "info": slog.LevelInfo,
		"WARN": slog.LevelWarn, "error": slog.LevelError} {
		l, err := function.LogLevelFromEnv(func(string) string { return s })
		require.NoError(t, err, s)
		require.Equal(t, want, l, s)
	}
	for _, s := range []string{"verbose", "info+2", "0"} {
		_, err := function.LogLevelFromEnv(func(string) string { return s })
		require.ErrorContains(t, err, "LOG_LEVEL", s)
	}
}

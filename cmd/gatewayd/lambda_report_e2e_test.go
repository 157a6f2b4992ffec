package main

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/function"
	"greenhouse-gateway/function/event"
	"greenhouse-gateway/harness/emftest"
)

// gatewayDocs returns the function's EMF documents about gateway id, in
// the order it printed them, checked against the metrics the function
// declares.
func gatewayDocs(t *testing.T, fn *readingsFunction, id string) []emftest.Doc {
	t.Helper()
	docs, err := emftest.Parse(fn.em.Output())
	require.NoError(t, err)
	require.NoError(t, emftest.Conform(docs, function.MetricNamespace, function.MetricOf))
	return emftest.Select(docs, map[string]string{function.DimGatewayID: id})
}

// TestLambdaUplinkReportsItsBacklogToTheFunction builds a backlog while the
// function is down and checks, in the EMF metrics the function prints,
// that the gateway's first report to reach it says the whole backlog and
// why it waited, that the reports count every batch delivered once, and
// that an idle gateway keeps reporting (its empty events) once the
// backlog is gone.
func TestLambdaUplinkReportsItsBacklogToTheFunction(t *testing.T) {
	local, view, key, prefix := setup(t)
	fn := startFunction(t, local.Endpoint, prefix)
	fn.kill(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, lambdaEnv(fn.url, "GATEWAY_UPLINK_LAMBDA_REPORT_INTERVAL=1s")...)
	l := &ackedLoad{acked: map[string]int{}}
	hws := fleetLoad(t, d, key, l, 2, 5, 0xA5)
	backlog := len(l.acked)
	require.Equal(t, 15, backlog)
	require.Equal(t, "15", d.metric(t, "gateway_buffer_pending_batches"))
	require.Eventually(t, func() bool {
		return metricFloat(t, d, `gateway_uplink_lambda_invocations_total{outcome="error"}`) > 0
	}, 60*time.Second, 50*time.Millisecond, "the uplink tried the function")

	fn.start(t)
	require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
		60*time.Second, 100*time.Millisecond, "logs:\n%s", d.logs.String())
	checkExactlyOnce(t, view, hws, l)

	gatewayID, err := os.Hostname()
	require.NoError(t, err)
	var docs []emftest.Doc
	require.Eventually(t, func() bool {
		docs = gatewayDocs(t, fn, gatewayID)
		delivered := 0.0
		for _, doc := range docs {
			n, _ := doc.Value("GatewayDeliveredBatches")
			delivered += n
		}
		// The deliveries of the last batch invocation travel in the next
		// event: an idle report.
		pending, ok := 0.0, false
		if len(docs) > 0 {
			pending, ok = docs[len(docs)-1].Value("GatewayPendingBatches")
		}
		return delivered == float64(backlog) && ok && pending == 0
	}, 60*time.Second, 100*time.Millisecond, "function output:\n%s", fn.em.Output())

	first := docs[0]
	require.Equal(t, float64(backlog), first.MustValue(t, "GatewayPendingBatches"), "the first report holds the whole backlog")
	require.Positive(t, first.MustValue(t, "GatewayOldestPendingAge"))
	require.Equal(t, 0.0, first.MustValue(t, "GatewayDeliveredBatches"))
	require.Equal(t, 1.0, first.MustValue(t, "GatewayUplinkErrors"), "the failures while the function was down")
	require.Contains(t, event.ErrorClasses, first.Root["LastErrorClass"])
	require.NotEmpty(t, first.Dimension(function.DimFunctionName))
	for _, doc := range docs {
		require.Equal(t, 1.0, doc.MustValue(t, "GatewayReports"))
	}

	// Idle, the gateway keeps reporting: empty events, about one per
	// report interval.
	n := len(docs)
	require.Eventually(t, func() bool { return len(gatewayDocs(t, fn, gatewayID)) >= n+2 },
		60*time.Second, 100*time.Millisecond, "idle reports")
	last := gatewayDocs(t, fn, gatewayID)
	for _, doc := range last[n:] {
		require.Equal(t, 0.0, doc.MustValue(t, "GatewayPendingBatches"))
		require.Equal(t, 0.0, doc.MustValue(t, "GatewayOldestPendingAge"))
		require.Equal(t, 0.0, doc.MustValue(t, "GatewayDeliveredBatches"))
		require.Equal(t, 0.0, doc.MustValue(t, "GatewayUplinkErrors"))
	}
}

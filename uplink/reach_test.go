package uplink_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/faultproxy"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/uplink"
)

// leaseCountingStore counts the uplink's reads of pending batches.
type leaseCountingStore struct {
	*buffer.Buffer
	reads atomic.Int64
}

func (s *leaseCountingStore) Pending(after uint64, limit int) ([]buffer.Pending, error) {
	s.reads.Add(1)
	return s.Buffer.Pending(after, limit)
}

// requestErrors sums gateway_uplink_request_errors_total for one operation.
func requestErrors(reg *prometheus.Registry, op string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "gateway_uplink_request_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" && l.GetValue() == op {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// TestUnreachableCloudIsProbedNotLeased resets every connection to
// DynamoDB: after the first failed round, each retry is one DescribeTable,
// and the buffer is not read again (no batch is leased, decoded and built
// for nothing). Once DynamoDB answers, every batch goes up once.
func TestUnreachableCloudIsProbedNotLeased(t *testing.T) {
	local := dynamotest.Shared(t)
	proxy := faultproxy.Start(t, local.Endpoint, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, proxy.Set(faultproxy.Fault{Mode: faultproxy.Reset}))

	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	client, err := cloud.NewClient(cctx, cloud.Config{Endpoint: proxy.URL(), Region: "us-east-1"}, cloud.WithRetryMaxAttempts(1))
	require.NoError(t, err)
	e := &env{local: local, client: local.Client(t), tables: local.NewTables(t), reg: prometheus.NewRegistry(), buf: openBuffer(t)}
	st := &leaseCountingStore{Buffer: e.buf}
	e.up, err = uplink.New(uplink.Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}, uplink.Deps{Store: st, DynamoDB: client, Tables: e.tables, Registerer: e.reg})
	require.NoError(t, err)

	var batches []*contract.Batch
	for d := range 3 {
		for w := range 10 {
			batches = append(batches, testBatch(t, fmt.Sprintf("AA:BB:CC:00:21:%02d", d), w, 3))
		}
	}
	store(t, e.buf, batches...)

	done := make(chan error, 1)
	go func() { done <- e.up.Run(ctx) }()
	retries := func() float64 { return metricValue(e.reg, "gateway_uplink_retried_rounds_total", "") }
	require.Eventually(t, func() bool { return retries() >= 2 }, 30*time.Second, 5*time.Millisecond)
	reads := st.reads.Load()
	require.Positive(t, reads, "the first round leased")
	probes := requestErrors(e.reg, "DescribeTable")
	require.Eventually(t, func() bool { return retries() >= 10 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, reads, st.reads.Load(), "no round leased while DynamoDB could not be reached")
	require.GreaterOrEqual(t, requestErrors(e.reg, "DescribeTable")-probes, 7.0, "each retry was a probe")
	require.False(t, e.up.Status().Up)
	require.Contains(t, e.up.Status().LastError, "cloud unreachable")
	require.EqualValues(t, len(batches), e.buf.Stats().PendingBatches)

	require.NoError(t, proxy.Set(faultproxy.Fault{}))
	require.Eventually(t, func() bool { return e.buf.Stats().PendingBatches == 0 }, 60*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return e.up.Status().Up }, 10*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Greater(t, st.reads.Load(), reads)
	for d := range 3 {
		require.Len(t, e.readings(t, fmt.Sprintf("AA:BB:CC:00:21:%02d", d)), 30, "each reading once")
	}
	for _, b := range batches {
		require.NotEmpty(t, e.marker(t, b.BatchID))
	}
	require.Equal(t, len(batches), e.count("delivered"))
}

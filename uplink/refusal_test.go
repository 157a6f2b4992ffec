package uplink_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/uplink"
)

// refusedRequests reads gateway_uplink_refused_requests_total for one
// operation and cause.
func refusedRequests(t *testing.T, reg *prometheus.Registry, op, cause string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "gateway_uplink_refused_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["operation"] == op && labels["cause"] == cause {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// An operator's uplink.transaction_max_items above DynamoDB Local's 10:
// the endpoint's refusal of the transaction is no refusal of the batch,
// which is delivered (the split way), not dead-lettered, and the refusal
// is counted.
func TestTransactionLimitRefusalIsNoDeadLetter(t *testing.T) {
	e := newEnv(t, dynamotest.Shared(t), uplink.Config{WriteMode: "transaction", TransactionMaxItems: 100})
	hw := "AA:BB:CC:00:00:31"
	b := testBatch(t, hw, 0, 20) // 21 actions: more than DynamoDB Local takes
	store(t, e.buf, b)
	e.run(t)
	require.Equal(t, 0, e.count("dead_lettered"))
	require.Equal(t, 1, e.count("delivered"))
	require.Len(t, e.readings(t, hw), 20)
	require.NotEmpty(t, e.marker(t, b.BatchID))
	require.Equal(t, 1.0, refusedRequests(t, e.reg, "TransactWriteItems", "transaction_limit"))
}

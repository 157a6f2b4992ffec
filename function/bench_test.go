package function_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function"
	"greenhouse-gateway/internal/tablewrite"
)

// BenchmarkNativeEventAgainstDirectWrites writes events of 100 device
// batches (10 readings each) through the function under the emulator, and
// the same number of batches directly with tablewrite from this process,
// the baseline of the same run, and reports batches per second of both:
//
//	go test -run '^$' -bench NativeEvent -benchtime 5x ./function/
func BenchmarkNativeEventAgainstDirectWrites(b *testing.B) {
	r := newRig(b, nil)
	const perEvent, readings = 100, 10
	ctx := context.Background()
	w := tablewrite.New(r.db, r.tables, tablewrite.Options{})
	var viaFunction, direct time.Duration
	for i := range b.N {
		batches, order := map[string]*contract.Batch{}, []string{}
		var items []*tablewrite.Items
		for d := range perEvent {
			id := fmt.Sprintf("c-%d", d)
			batches[id] = batch(fmt.Sprintf("AA:BB:CC:%02X:%02X:01", i%256, d), base(), 0, readings, 21)
			order = append(order, id)
			other := batch(fmt.Sprintf("AA:BB:CC:%02X:%02X:02", i%256, d), base(), 0, readings, 21)
			items = append(items, tablewrite.Build(tablewrite.Batch{Batch: other, ReceivedAt: time.Now(), Hash: other.IdentityHash()},
				90*24*time.Hour, time.Now()))
		}
		payload, err := json.Marshal(nativeEvent(b, batches, order))
		require.NoError(b, err)
		start := time.Now()
		out, err := r.em.Invoke(ctx, payload)
		viaFunction += time.Since(start)
		require.NoError(b, err)
		var resp function.BatchResponse
		require.NoError(b, json.Unmarshal(out, &resp))
		for _, res := range resp.Results {
			require.Equal(b, function.StatusDelivered, res.Status, "%+v", res)
		}
		start = time.Now()
		for _, res := range w.WriteBulk(ctx, items, 16) {
			require.Equal(b, tablewrite.Delivered, res.Outcome)
		}
		direct += time.Since(start)
	}
	n := float64(b.N * perEvent)
	b.ReportMetric(n/viaFunction.Seconds(), "function-batches/s")
	b.ReportMetric(n/direct.Seconds(), "direct-batches/s")
	b.ReportMetric(direct.Seconds()/viaFunction.Seconds(), "ratio")
}

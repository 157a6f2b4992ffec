//go:build linux

package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/fleetgen"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

// TestSDKLoopWritesLikeTheUplink checks that the baseline sends, in each
// write mode, the requests the uplink sends for the same batches, and
// writes every item once.
func TestSDKLoopWritesLikeTheUplink(t *testing.T) {
	local := dynamotest.Shared(t)
	client := local.Client(t)
	for _, tc := range []struct {
		name     string
		mode     string
		readings int
		want     map[string]int64
	}{
		// 4 batches of 10 readings: 40 readings packed 25 to a request.
		{"batch", "batch", 10, map[string]int64{"BatchWriteItem": 2, "PutItem": 4}},
		// Above the 10-action limit: each batch's readings, then its marker.
		{"transaction, split", "transaction", 10, map[string]int64{"BatchWriteItem": 4, "PutItem": 4}},
		// Within it: one transaction a batch.
		{"transaction", "transaction", 5, map[string]int64{"BatchWriteItem": 0, "PutItem": 0, "TransactWriteItems": 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tables := local.NewTables(t)
			d := fleetgen.NewDevice(fleetgen.HardwareID(9, 2), time.Now().Add(-time.Hour), 1)
			var batches []*itemBatch
			for range 4 {
				id, payload, err := d.Next(tc.readings)
				require.NoError(t, err)
				ib, err := batchItems(buffer.Pending{BatchID: id, Payload: payload, ReceivedAt: time.Now()}, time.Now())
				require.NoError(t, err)
				batches = append(batches, ib)
			}
			res, err := sdkLoop(context.Background(), client, tables, batches, 1, tc.mode, 10)
			require.NoError(t, err)
			require.Equal(t, tc.want, res.Requests)
			require.Equal(t, 4*tc.readings, res.Readings)
			ctx := context.Background()
			n, err := countItems(ctx, client, tables.Readings)
			require.NoError(t, err)
			require.Equal(t, int64(4*tc.readings), n)
			n, err = countItems(ctx, client, tables.ProcessedBatches)
			require.NoError(t, err)
			require.Equal(t, int64(4), n)
		})
	}
}

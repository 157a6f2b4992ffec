package uplink_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/uplink"
)

// lookupCountingDB counts how often each marker is looked up.
type lookupCountingDB struct {
	*recordingDB
	looked map[string]int // guarded by recordingDB.mu
}

func (l *lookupCountingDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	l.mu.Lock()
	for _, ka := range in.RequestItems {
		for _, k := range ka.Keys {
			l.looked[k["batch_id"].(*types.AttributeValueMemberS).Value]++
		}
	}
	l.mu.Unlock()
	return l.recordingDB.BatchGetItem(ctx, in, o...)
}

func TestFreshBatchesOfADeviceAreCheckedOnceAfterAStart(t *testing.T) {
	buf := openBuffer(t)
	var backlog []*contract.Batch
	for w := range 60 {
		backlog = append(backlog, seqBatch(t, "EE:00:00:00:06:01", w, 1))
	}
	store(t, buf, backlog...)
	// Device 02 has three batches queued before the start, behind the
	// backlog: each round takes the oldest of them as a fresh batch.
	var fresh []*contract.Batch
	for w := range 3 {
		fresh = append(fresh, seqBatch(t, "EE:00:00:00:06:02", w, 1))
	}
	store(t, buf, fresh...)
	// The run before the start wrote the first of them and crashed.
	db := &recordingDB{written: []string{fresh[0].BatchID}}
	counting := &lookupCountingDB{recordingDB: db, looked: map[string]int{}}
	reg := prometheus.NewRegistry()
	up, err := uplink.New(uplink.Config{WriteMode: "transaction", TransactionMaxItems: 10, LeaseBatches: 16, FreshReserve: 1}, uplink.Deps{Store: buf, DynamoDB: counting, Tables: cloud.TableNames(""), Registerer: reg})
	require.NoError(t, err)
	runUntilEmpty(t, up, buf)

	order := perDevice(db.order())
	counting.mu.Lock()
	defer counting.mu.Unlock()
	require.Equal(t, 1, counting.looked[fresh[0].BatchID], "the device's oldest batch of before the start is checked")
	require.Zero(t, counting.looked[fresh[1].BatchID], "its later batches cannot have been written before the start")
	require.Zero(t, counting.looked[fresh[2].BatchID])
	require.Zero(t, db.attempts[fresh[0].BatchID], "the batch found in the cloud is not written again")
	require.Equal(t, 1, db.attempts[fresh[1].BatchID])
	require.Equal(t, 1, db.attempts[fresh[2].BatchID])
	require.Equal(t, 1.0, metricValue(reg, "gateway_uplink_batches_total", "already_delivered"))
	require.Equal(t, 62.0, metricValue(reg, "gateway_uplink_batches_total", "delivered"))
	// Order per device holds.
	require.Equal(t, []string{fresh[0].BatchID, fresh[1].BatchID, fresh[2].BatchID}, order["EE:00:00:00:06:02"])
}

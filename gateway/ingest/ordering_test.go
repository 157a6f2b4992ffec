package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/registry"
)

// spanBatch is a batch of two readings temp apart at the start and the end
// of the ten minutes that start window ten minutes after an hour ago.
func spanBatch(hw, boot string, window int, temp float64) []byte {
	start := time.Now().Add(-time.Hour).Truncate(time.Minute).UnixMilli() + int64(window)*600_000
	end := start + 600_000
	return []byte(fmt.Sprintf(`{"batch_id":"%s_%s_%d_%d","hardware_id":"%s","boot_id":"%s","firmware_version":"1.0.16",
	 "readings":[{"timestamp_ms":%d,"sensors":{"t":%g},"sensor_status":{}},{"timestamp_ms":%d,"sensors":{"t":%g},"sensor_status":{}}]}`,
		hw, boot, start, end, hw, boot, start, temp, end, temp))
}

// Under reject_older a resend of a stored batch is a duplicate (and
// another payload under its batch_id a conflict), never a
// timestamp_conflict: the device's newest reading includes the batch
// itself, or later ones. A new batch too old is still refused.
func TestRejectOlderAnswersAResendDuplicate(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	reg, err := registry.New(registry.Config{}, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, reg.Load())
	in, err := ingest.New(ingest.Config{Ordering: "reject_older", OrderingGrace: time.Minute}, ingest.Deps{Store: buf, Devices: reg})
	require.NoError(t, err)
	hw, boot := "AA:BB:CC:DD:EE:31", uuid.NewString()
	send := func(payload []byte) contract.Result {
		t.Helper()
		res, err := in.Readings(context.Background(), ingest.Sender{}, [][]byte{payload})
		require.NoError(t, err)
		return res[0]
	}
	first := spanBatch(hw, boot, 1, 20)
	require.Equal(t, contract.StatusAccepted, send(first).Status)
	require.Equal(t, contract.StatusDuplicate, send(first).Status, "the batch's own end is its device's newest reading")
	require.Equal(t, contract.StatusAccepted, send(spanBatch(hw, boot, 2, 20)).Status)
	require.Equal(t, contract.StatusDuplicate, send(first).Status, "after a later batch")

	other := send(spanBatch(hw, boot, 1, 30))
	require.Equal(t, contract.StatusRejected, other.Status)
	require.Equal(t, contract.ReasonConflict, *other.Reason, *other.Message)

	older := send(spanBatch(hw, boot, 0, 20))
	require.Equal(t, contract.StatusRejected, older.Status)
	require.Equal(t, contract.ReasonTimestampConflict, *older.Reason)
	require.Contains(t, *older.Message, "before the newest reading")
}

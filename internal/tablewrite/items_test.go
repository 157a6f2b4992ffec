package tablewrite_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/tablewrite"
)

func TestTSBatchPadsTheTimestampToThirteenDigits(t *testing.T) {
	for _, ms := range []int64{0, 7, 999_999_999_999, 1_760_000_000_123, 9_999_999_999_999, 10_000_000_000_000, -5} {
		require.Equal(t, fmt.Sprintf("%013d#%s", ms, "b-1"), tablewrite.TSBatch(ms, "b-1"), ms)
	}
}

func TestBuildReadingItems(t *testing.T) {
	b := &contract.Batch{BatchID: "b-1", HardwareID: "02:00:00:00:00:01", BootID: "boot", FirmwareVersion: "1.2.3",
		Readings: []contract.Reading{
			{TimestampMS: 1_760_000_000_000, Sensors: map[string]float64{"air_temp_c": 21.5}, SensorStatus: map[string]string{"air": "ok"}},
			{TimestampMS: 1_760_000_060_000, Sensors: map[string]float64{"air_temp_c": 21.25}, TimeSource: "gateway"},
		}}
	items := tablewrite.Build(tablewrite.Batch{Batch: b, ReceivedAt: time.Unix(1_760_000_100, 0), Quality: []float64{1, 0.5}},
		24*time.Hour, time.Unix(1_760_000_200, 0))
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	require.Equal(t, []map[string]types.AttributeValue{
		{
			"hardware_id": s("02:00:00:00:00:01"), "ts_batch": s("1760000000000#b-1"), "timestamp_ms": n("1760000000000"),
			"batch_id": s("b-1"), "boot_id": s("boot"), "firmware_version": s("1.2.3"),
			"sensors":         &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"air_temp_c": n("21.5")}},
			"sensor_status":   &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"air": s("ok")}},
			"expiration_time": n("1760086400"), "quality_score": n("1"),
		},
		{
			"hardware_id": s("02:00:00:00:00:01"), "ts_batch": s("1760000060000#b-1"), "timestamp_ms": n("1760000060000"),
			"batch_id": s("b-1"), "boot_id": s("boot"), "firmware_version": s("1.2.3"),
			"sensors":         &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"air_temp_c": n("21.25")}},
			"sensor_status":   &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}},
			"expiration_time": n("1760086460"), "time_source": s("gateway"), "quality_score": n("0.5"),
		},
	}, items.ReadingItems())
}

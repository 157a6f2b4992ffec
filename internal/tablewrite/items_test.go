package tablewrite_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
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

// avJSON is v as DynamoDB's JSON spells an attribute value, decoded:
// what encoding/json makes of that JSON.
func avJSON(t *testing.T, v types.AttributeValue) any {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return map[string]any{"S": v.Value}
	case *types.AttributeValueMemberN:
		return map[string]any{"N": v.Value}
	case *types.AttributeValueMemberM:
		return map[string]any{"M": itemJSON(t, v.Value)}
	}
	t.Fatalf("attribute value %T", v)
	return nil
}

func itemJSON(t *testing.T, item map[string]types.AttributeValue) map[string]any {
	out := make(map[string]any, len(item))
	for k, v := range item {
		out[k] = avJSON(t, v)
	}
	return out
}

// TestEncodedReadingsAreTheItems checks, over batches with escapes,
// non-ASCII text, extreme numbers, quality scores or none and repaired
// clocks, that each reading Encode makes is its attribute map, as
// DynamoDB's JSON.
func TestEncodedReadingsAreTheItems(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	texts := []string{"ok", "error", `quo"te\back`, "<tag>&amp;", "ünïcødé ✓", "tab\there", "\x01ctl", ""}
	numbers := []float64{0, -0.5, 21.25, 1e-300, 5e-324, 1.7976931348623157e308, -1e21, 123456789012345678, 0.1, 3}
	for round := range 300 {
		b := &contract.Batch{
			BatchID:         fmt.Sprintf("AA:BB:CC:DD:EE:%02X_boot_%d", round%256, round) + texts[r.IntN(len(texts))],
			HardwareID:      fmt.Sprintf("AA:BB:CC:DD:EE:%02X", round%256),
			BootID:          texts[r.IntN(len(texts))],
			FirmwareVersion: texts[r.IntN(len(texts))],
		}
		var quality []float64
		for i := range 1 + r.IntN(40) {
			rd := contract.Reading{
				TimestampMS:  []int64{0, 7, 946_684_800_000, 1_760_000_000_123 + int64(i), 4_102_444_799_999, 10_000_000_000_000, -5}[r.IntN(7)],
				Sensors:      map[string]float64{},
				SensorStatus: map[string]string{},
			}
			for k := range r.IntN(6) {
				rd.Sensors[fmt.Sprintf("sensor_%d", k)] = numbers[r.IntN(len(numbers))] * (1 + r.Float64())
				rd.SensorStatus[fmt.Sprintf("sensor_%d%s", k, texts[r.IntN(len(texts))])] = texts[r.IntN(len(texts))]
			}
			if r.IntN(3) == 0 {
				rd.TimeSource = contract.TimeSourceGateway
			}
			b.Readings = append(b.Readings, rd)
			quality = append(quality, r.Float64())
		}
		if r.IntN(2) == 0 {
			quality = nil
		}
		batch := tablewrite.Batch{Batch: b, ReceivedAt: time.Unix(1_760_000_100, 0), Quality: quality}
		retention := time.Duration(r.IntN(400)) * 24 * time.Hour
		encoded := tablewrite.Build(batch, retention, time.Unix(1_760_000_200, 0)).Encode()
		maps := tablewrite.Build(batch, retention, time.Unix(1_760_000_200, 0)).ReadingItems()
		require.Len(t, encoded, len(maps), "round %d", round)
		for i, raw := range encoded {
			var got map[string]any
			require.NoError(t, json.Unmarshal(raw, &got), "round %d reading %d: %s", round, i, raw)
			require.Equal(t, itemJSON(t, maps[i]), got, "round %d reading %d", round, i)
		}
	}
}

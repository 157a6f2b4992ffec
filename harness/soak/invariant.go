package soak

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/harness/devicesim"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// maxProblems caps the problems listed per scenario; the counts stay exact.
const maxProblems = 25

// cloudReading is one device_readings item.
type cloudReading struct {
	hardwareID  string
	batchID     string
	timestampMS int64
	tsBatch     string
}

// cloudState is what DynamoDB holds after a scenario.
type cloudState struct {
	markers  map[string]string         // batch_id → hardware_id of processed_batches
	readings map[string][]cloudReading // batch_id → its device_readings items
	items    int                       // device_readings items in all
}

// readCloud scans processed_batches and device_readings with consistent
// reads, directly (not through the fault proxy).
func readCloud(ctx context.Context, client *dynamodb.Client, tables cloud.Tables) (cloudState, error) {
	st := cloudState{markers: map[string]string{}, readings: map[string][]cloudReading{}}
	err := scan(ctx, client, tables.ProcessedBatches, func(it map[string]types.AttributeValue) error {
		id, hw := str(it, "batch_id"), str(it, "hardware_id")
		if id == "" {
			return fmt.Errorf("a processed_batches item without batch_id: %v", it)
		}
		st.markers[id] = hw
		return nil
	})
	if err != nil {
		return st, err
	}
	err = scan(ctx, client, tables.Readings, func(it map[string]types.AttributeValue) error {
		r := cloudReading{hardwareID: str(it, "hardware_id"), batchID: str(it, "batch_id"), tsBatch: str(it, "ts_batch")}
		ms, err := strconv.ParseInt(num(it, "timestamp_ms"), 10, 64)
		if err != nil {
			return fmt.Errorf("device_readings item %s/%s: timestamp_ms: %w", r.hardwareID, r.tsBatch, err)
		}
		r.timestampMS = ms
		st.readings[r.batchID] = append(st.readings[r.batchID], r)
		st.items++
		return nil
	})
	return st, err
}

// scanPage is how many items a Scan page holds: DynamoDB Local (a 256 MiB
// heap) answers 500 to the first 1 MB page of an hour's 700,000 readings.
const scanPage = 1000

// scan reads a whole table in pages of scanPage items, retrying a failed
// page a few times.
func scan(ctx context.Context, client *dynamodb.Client, table string, each func(map[string]types.AttributeValue) error) error {
	var start map[string]types.AttributeValue
	for pages := 0; ; pages++ {
		var out *dynamodb.ScanOutput
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			out, err = client.Scan(pctx, &dynamodb.ScanInput{TableName: aws.String(table),
				ConsistentRead: aws.Bool(true), ExclusiveStartKey: start, Limit: aws.Int32(scanPage)})
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Second)
		}
		if err != nil {
			return fmt.Errorf("scanning %s (page %d): %w", table, pages, err)
		}
		for _, it := range out.Items {
			if err := each(it); err != nil {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		start = out.LastEvaluatedKey
	}
}

func str(it map[string]types.AttributeValue, name string) string {
	if v, ok := it[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func num(it map[string]types.AttributeValue, name string) string {
	if v, ok := it[name].(*types.AttributeValueMemberN); ok {
		return v.Value
	}
	return ""
}

// checkInvariant compares what the devices were told with what DynamoDB
// holds and fills f's figures and problems.
//
// A batch is acknowledged when its device got "accepted" or "duplicate"
// for it. The invariant is that every acknowledged batch is in DynamoDB
// exactly once, and nothing else is:
//
//   - lost: an acknowledged batch without its processed_batches marker, or
//     with fewer readings than the device sent, or with readings other than
//     the ones it sent (first and last timestamps differ);
//   - duplicated: an acknowledged batch with more readings than the device
//     sent (the same reading stored under two keys, e.g. a timestamp
//     repaired differently on a resend), a reading whose device and
//     timestamp are also stored under another batch_id (the same reading
//     forwarded as part of two batches), or a batch_id acknowledged twice;
//   - stray: a marker or reading of a batch no device was told was stored
//     (never acknowledged, or answered "rejected").
//
// DynamoDB's keys make an exact duplicate item impossible (a replay is an
// identical overwrite), which is why duplicates are looked for as extra
// items under other keys. Every acknowledged batch that is neither lost nor
// duplicated counts as delivered.
func checkInvariant(f *Figures, lines []devicesim.ReportLine, st cloudState) {
	problem := func(format string, args ...any) {
		if len(f.Problems) < maxProblems {
			f.Problems = append(f.Problems, fmt.Sprintf(format, args...))
		} else if len(f.Problems) == maxProblems {
			f.Problems = append(f.Problems, "... more problems not listed")
		}
	}
	acked := map[string]devicesim.ReportLine{}
	rejected := map[string]devicesim.ReportLine{}
	dupBatches := map[string]bool{}
	for _, l := range lines {
		switch l.Status {
		case "accepted", "duplicate":
			if _, seen := acked[l.BatchID]; seen {
				dupBatches[l.BatchID] = true
				problem("duplicated: batch %s acknowledged twice to its device", l.BatchID)
			}
			acked[l.BatchID] = l
		default:
			rejected[l.BatchID] = l
		}
	}
	f.Acknowledged = len(acked)
	f.Rejected = len(rejected)
	for _, l := range rejected {
		problem("rejected: batch %s answered %s %s (%s); a simulated device sends only valid batches",
			l.BatchID, l.Status, l.Reason, l.Message)
	}

	// The same device and timestamp under two batch_ids.
	type devTS struct {
		hw string
		ts int64
	}
	owner := map[devTS]string{}
	ids := make([]string, 0, len(st.readings))
	for id := range st.readings {
		ids = append(ids, id)
	}
	slices.Sort(ids) // deterministic reports
	for _, id := range ids {
		for _, r := range st.readings[id] {
			k := devTS{r.hardwareID, r.timestampMS}
			if other, ok := owner[k]; ok && other != id {
				dupBatches[id] = true
				problem("duplicated: reading %s@%d stored under batch %s and batch %s", r.hardwareID, r.timestampMS, other, id)
				continue
			}
			owner[k] = id
		}
	}

	lost := map[string]bool{}
	for id, l := range acked {
		f.Readings += len(st.readings[id])
		hw, marked := st.markers[id]
		rs := st.readings[id]
		switch {
		case !marked:
			lost[id] = true
			problem("lost: batch %s (%d readings, %s) acknowledged %q but has no processed_batches marker (%d readings in the cloud)",
				id, l.Readings, l.HardwareID, l.Status, len(rs))
			continue
		case hw != l.HardwareID:
			problem("marker of batch %s names %s, the device is %s", id, hw, l.HardwareID)
		}
		if len(rs) < l.Readings {
			lost[id] = true
			problem("lost: batch %s acknowledged %q has %d of its %d readings in the cloud", id, l.Status, len(rs), l.Readings)
			continue
		}
		if len(rs) > l.Readings {
			dupBatches[id] = true
			problem("duplicated: batch %s has %d readings in the cloud, its device sent %d", id, len(rs), l.Readings)
			continue
		}
		first, last := rs[0].timestampMS, rs[0].timestampMS
		distinct := map[int64]bool{}
		bad := ""
		for _, r := range rs {
			first, last = min(first, r.timestampMS), max(last, r.timestampMS)
			distinct[r.timestampMS] = true
			switch {
			case r.hardwareID != l.HardwareID:
				bad = fmt.Sprintf("a reading is stored under hardware_id %s", r.hardwareID)
			case r.tsBatch != tablewrite.TSBatch(r.timestampMS, id):
				bad = fmt.Sprintf("sort key %s does not match timestamp %d", r.tsBatch, r.timestampMS)
			}
		}
		if bad == "" && (first != l.FirstTimestampMS || last != l.LastTimestampMS || len(distinct) != len(rs)) {
			bad = fmt.Sprintf("timestamps %d..%d (%d distinct), the device sent %d..%d (%d)",
				first, last, len(distinct), l.FirstTimestampMS, l.LastTimestampMS, l.Readings)
		}
		if bad != "" {
			lost[id] = true
			problem("lost: batch %s is not what its device sent: %s", id, bad)
		}
	}
	for id := range dupBatches {
		if _, ok := acked[id]; !ok {
			delete(dupBatches, id) // counted as stray below
		}
	}

	stray := map[string]bool{}
	for id := range st.markers {
		if _, ok := acked[id]; !ok {
			stray[id] = true
		}
	}
	for id := range st.readings {
		if _, ok := acked[id]; !ok {
			stray[id] = true
		}
	}
	for _, id := range slices.Sorted(maps.Keys(stray)) {
		_, marked := st.markers[id]
		why := "never acknowledged to its device"
		if l, ok := rejected[id]; ok {
			why = "answered " + l.Status + " " + l.Reason
		}
		problem("stray: batch %s is in the cloud (marker %v, %d readings) but was %s", id, marked, len(st.readings[id]), why)
	}

	f.Lost = len(lost)
	f.Duplicated = len(dupBatches)
	f.Stray = len(stray)
	for id := range acked {
		if !lost[id] && !dupBatches[id] {
			f.Delivered++
		}
	}
}

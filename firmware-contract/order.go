package contract

import (
	"fmt"
	"time"
)

// CheckOrder applies the reject_older ordering rule: a batch whose earliest
// reading is more than grace before lastMS, the newest reading already
// accepted from its device, is a timestamp_conflict. lastMS 0 means none
// yet. The gateway (ingest.ordering) and the readings function (ORDERING)
// both apply it.
func (b *Batch) CheckOrder(lastMS int64, grace time.Duration) error {
	if lastMS == 0 || len(b.Readings) == 0 {
		return nil
	}
	first := b.Readings[0].TimestampMS
	for _, r := range b.Readings {
		first = min(first, r.TimestampMS)
	}
	if first < lastMS-grace.Milliseconds() {
		return NewError(ReasonTimestampConflict, "readings",
			fmt.Sprintf("starts at %d, more than %s before the newest reading already accepted (%d)",
				first, grace, lastMS))
	}
	return nil
}

// MinBatchBytes is less than the length of the shortest valid batch (183
// bytes).
const MinBatchBytes = 128

// CheckBatchCount refuses a POST /v1/readings body of bodyLimit bytes at
// most that splits into n batches, more than such a body can hold valid
// ones: answering each one costs far more than its bytes (a 1 MiB body of
// "{}" batches would take a 32 MB answer and about 200 MiB of heap).
func CheckBatchCount(n int, bodyLimit int64) error {
	if limit := max(1, bodyLimit/MinBatchBytes); int64(n) > limit {
		return NewError(ReasonValidation, "batches", fmt.Sprintf(
			"%d batches in one request; a %d-byte body holds at most %d valid ones", n, bodyLimit, limit))
	}
	return nil
}

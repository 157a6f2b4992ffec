package uplink

import (
	"encoding/json"
	"fmt"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/tablewrite"
)

// cloudBatch is one buffered batch turned into the items the contract
// writes (tablewrite.Items).
type cloudBatch struct {
	pending buffer.Pending
	items   *tablewrite.Items
}

// buildBatch decodes a buffered payload into its table items. now sets the
// marker's expiration time.
func buildBatch(p buffer.Pending, readingsRetention time.Duration, now time.Time) (*cloudBatch, error) {
	var b contract.Batch
	if err := json.Unmarshal(p.Payload, &b); err != nil {
		return nil, fmt.Errorf("decoding buffered batch %s: %w", p.BatchID, err)
	}
	if b.BatchID != p.BatchID {
		return nil, fmt.Errorf("buffered batch %s holds batch_id %q", p.BatchID, b.BatchID)
	}
	cb := &cloudBatch{pending: p}
	for i, r := range b.Readings {
		// The buffer's history keeps the batch under its reading times
		// when it is marked delivered.
		if i == 0 || r.TimestampMS < cb.pending.FirstMS {
			cb.pending.FirstMS = r.TimestampMS
		}
		if i == 0 || r.TimestampMS > cb.pending.LastMS {
			cb.pending.LastMS = r.TimestampMS
		}
	}
	cb.pending.SpanKnown = len(b.Readings) > 0
	received := p.ReceivedAt
	if received.Before(clock.DefaultFloor) {
		// Stamped by a clock that was not set yet: the forwarding time is
		// the best receive time there is.
		received = now
	}
	cb.items = tablewrite.Build(tablewrite.Batch{Batch: &b, ReceivedAt: received, Hash: b.IdentityHash()},
		readingsRetention, now)
	return cb, nil
}

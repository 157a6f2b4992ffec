package uplink

import (
	"fmt"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/tablewrite"
)

// cloudBatch is one buffered batch turned into the items the contract
// writes (tablewrite.Items).
type cloudBatch struct {
	pending buffer.Pending
	items   *tablewrite.Items
	// readings is the number of readings items, kept once items is let go.
	readings int
}

// buildBatch decodes a buffered payload into its table items. now sets the
// marker's expiration time.
func buildBatch(p buffer.Pending, readingsRetention time.Duration, now time.Time) (*cloudBatch, error) {
	b, p, err := decodeBuffered(p)
	if err != nil {
		return nil, err
	}
	received := p.ReceivedAt
	if received.Before(clock.DefaultFloor) {
		// Stamped by a clock that was not set yet: the forwarding time is
		// the best receive time there is.
		received = now
	}
	// Each reading's quality score against the readings before it in the
	// same batch: a function of the batch alone, so that a batch written
	// again after a failure gets the same items.
	items := tablewrite.Build(tablewrite.Batch{Batch: b, ReceivedAt: received, Hash: b.IdentityHash(),
		Quality: quality.ScoreSequence(b.Readings)}, readingsRetention, now)
	return &cloudBatch{pending: p, items: items, readings: items.Readings()}, nil
}

// BatchItems returns the table items the uplink writes for a buffered
// batch (readings expiring readingsRetention after their timestamps, the
// marker MarkerTTL after now): what a baseline writer must write to do the
// same job.
func BatchItems(p buffer.Pending, readingsRetention time.Duration, now time.Time) (*tablewrite.Items, error) {
	cb, err := buildBatch(p, readingsRetention, now)
	if err != nil {
		return nil, err
	}
	return cb.items, nil
}

// decodeBuffered decodes a buffered payload (the gateway validated and
// encoded it, so a failure is damage on disk) and returns it with p
// carrying its reading span: the buffer's history keeps the batch under
// its reading times when it is marked delivered.
func decodeBuffered(p buffer.Pending) (*contract.Batch, buffer.Pending, error) {
	b, err := contract.DecodeStored(p.Payload)
	if err != nil {
		return nil, p, fmt.Errorf("decoding buffered batch %s: %w", p.BatchID, err)
	}
	if b.BatchID != p.BatchID {
		return nil, p, fmt.Errorf("buffered batch %s holds batch_id %q", p.BatchID, b.BatchID)
	}
	for i, r := range b.Readings {
		if i == 0 || r.TimestampMS < p.FirstMS {
			p.FirstMS = r.TimestampMS
		}
		if i == 0 || r.TimestampMS > p.LastMS {
			p.LastMS = r.TimestampMS
		}
	}
	p.SpanKnown = len(b.Readings) > 0
	return b, p, nil
}

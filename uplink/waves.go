package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/tablewrite"
)

// bulkAhead is how many undecided batches a bulk round lets the writer
// hold before it builds the next group of BatchGetMax: two marker
// lookups' worth and three batches for each request the limit lets be in
// flight (a request holds 25 items, two or three batches of ten
// readings), so that the writer does not wait for building.
func bulkAhead(limit int) int {
	return 2*tablewrite.BatchGetMax + 3*limit
}

// forwardBulk forwards a round in "batch" write mode with a tablewrite
// bulk write, fed 100 batches at a time as they are built: their markers
// looked up in one BatchGetItem, then the readings of all the round's
// batches packed 25 to a BatchWriteItem, each batch's marker joining the
// requests once its readings are written. Building stays about
// bulkAhead batches ahead of the writes, and the items of batches handed
// to the writer are let go here, so the items a round holds stay bounded
// however large its lease (its batches' payloads are held to its end).
// The batches are given round-robin across devices (every
// device's oldest first), so that the devices' markers do not wait for
// one another; a device whose batch fails stops for this round, so its
// later batches never overtake it.
func (u *Uplink) forwardBulk(ctx context.Context, order []string, byDevice map[string][]buffer.Pending) error {
	var (
		batches  []*cloudBatch
		firstErr error
		added    int
	)
	// Batches go to the writer 100 at a time (one marker lookup), so that
	// it writes the first while the next are built.
	bulk := u.newWriter().StartBulk(ctx, u.cfg.MaxConcurrency)
	add := func(all bool) {
		for len(batches)-added >= tablewrite.BatchGetMax || (all && added < len(batches)) {
			end := min(added+tablewrite.BatchGetMax, len(batches))
			items := make([]*tablewrite.Items, 0, end-added)
			for _, cb := range batches[added:end] {
				items = append(items, cb.items)
				cb.items = nil // the writer's now
			}
			bulk.Add(items...)
			added = end
		}
	}
	building := true
	for depth := 0; building; depth++ {
		more := false
		for _, hw := range order {
			if depth >= len(byDevice[hw]) {
				continue
			}
			if len(batches) == added { // a new group of BatchGetMax starts
				if err := bulk.WaitBelow(ctx, bulkAhead(u.limiter.current())); err != nil {
					// Stopping: what is not built stays pending.
					firstErr, building = cmp.Or(firstErr, err), false
					break
				}
			}
			more = true
			p := byDevice[hw][depth]
			cb, err := buildBatch(p, u.cfg.ReadingsRetention, u.clock.Now())
			if err == nil {
				batches = append(batches, cb)
				add(false)
				continue
			}
			// Damaged on disk: keep it aside and go on with the device.
			if dlErr := u.deadLetter(p, err.Error()); dlErr != nil {
				firstErr = cmp.Or(firstErr, dlErr)
				byDevice[hw] = byDevice[hw][:depth] // the device stops here
				continue
			}
			u.metrics.batches.WithLabelValues("dead_lettered").Inc()
		}
		if !more {
			break
		}
	}
	add(true)
	results := bulk.Wait()
	if len(batches) == 0 {
		return firstErr
	}
	u.metrics.waveBatches.Observe(float64(len(batches)))
	var delivered []buffer.Pending
	// pending holds the devices with a batch left pending although the
	// cloud decided it (it could not be dead-lettered): their later
	// batches are not recorded before it, and are found in the cloud
	// next round.
	pending := map[string]bool{}
	for i, cb := range batches {
		if pending[cb.pending.HardwareID] {
			continue
		}
		var perm *permanentError
		switch err := u.outcome(results[i], cb); {
		case err == nil:
			delivered = append(delivered, cb.pending)
		case errors.As(err, &perm):
			if dlErr := u.deadLetter(cb.pending, perm.Error()); dlErr != nil {
				firstErr = cmp.Or(firstErr, dlErr)
				pending[cb.pending.HardwareID] = true
				continue
			}
			u.metrics.batches.WithLabelValues("dead_lettered").Inc()
			u.logger.Error("cloud refused a batch permanently; moved to the dead-letter area",
				"batch_id", cb.pending.BatchID, "hardware_id", cb.pending.HardwareID, "err", perm.err)
		case errors.Is(err, tablewrite.ErrHeldBack):
			// Waiting for an earlier batch of its device, whose own
			// result is the round's error if it has one (a refused
			// batch, dead-lettered, is none): tried again next round.
		default:
			firstErr = cmp.Or(firstErr, err)
		}
	}
	if err := u.markDelivered(delivered); err != nil {
		firstErr = cmp.Or(firstErr, fmt.Errorf("recording delivery: %w", err))
	}
	return firstErr
}

package uplink

import (
	"cmp"
	"context"

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

// bulkSink writes a round in "batch" write mode with a tablewrite bulk
// write (tablewrite.Writer.StartBulk).
type bulkSink struct{ tableSink }

// forward forwards a round with a tablewrite bulk write, fed 100 batches
// at a time as they are built: their markers looked up in one
// BatchGetItem, then the readings of all the round's batches packed 25 to
// a BatchWriteItem, each batch's marker joining the requests once its
// readings are written. Building stays about bulkAhead batches ahead of
// the writes, and the items of batches handed to the writer are let go
// here, so the items a round holds stay bounded however large its lease
// (its batches' payloads are held to its end). The batches are given
// round-robin across devices (every device's oldest first), so that the
// devices' markers do not wait for one another; a device whose batch
// fails stops for this round, so its later batches never overtake it.
func (s bulkSink) forward(ctx context.Context, l lease) error {
	u := s.u
	order, byDevice := l.devices(l.batches)
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
			// Damaged on disk: kept aside, and the device goes on.
			if st := u.settle([]result{damagedBatch(p, err)}); st.err != nil {
				firstErr = cmp.Or(firstErr, st.err)
				byDevice[hw] = byDevice[hw][:depth] // the device stops here
			}
		}
		if !more {
			break
		}
	}
	add(true)
	written := bulk.Wait()
	if len(batches) == 0 {
		return firstErr
	}
	u.metrics.waveBatches.Observe(float64(len(batches)))
	results := make([]result, len(batches))
	for i, cb := range batches {
		results[i] = u.resultOf(written[i], cb)
	}
	st := u.settle(results)
	return cmp.Or(firstErr, st.err, u.record(st.delivered))
}

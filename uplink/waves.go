package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/tablewrite"
)

// forwardWaves forwards in "batch" write mode. Each wave takes the oldest
// remaining batch of every device: the readings of all of them are packed
// 25 to a BatchWriteItem (many small batches share a request), then every
// batch whose readings were all written gets its conditional marker. A
// device whose batch fails stops for this round, so its later batches
// never overtake it.
func (u *Uplink) forwardWaves(ctx context.Context, order []string, byDevice map[string][]buffer.Pending) error {
	next := make(map[string]int, len(order))
	stopped := map[string]bool{}
	var firstErr error
	var (
		marks   sync.WaitGroup
		markMu  sync.Mutex
		markErr error
	)
	for ctx.Err() == nil {
		var wave []*cloudBatch
		for _, hw := range order {
			for !stopped[hw] && next[hw] < len(byDevice[hw]) {
				p := byDevice[hw][next[hw]]
				cb, err := buildBatch(p, u.cfg.ReadingsRetention, u.clock.Now())
				if err == nil {
					wave = append(wave, cb)
					break
				}
				// Damaged on disk: keep it aside and go on with the device.
				if dlErr := u.deadLetter(p, err.Error()); dlErr != nil {
					stopped[hw] = true
					firstErr = cmp.Or(firstErr, dlErr)
					break
				}
				u.metrics.batches.WithLabelValues("dead_lettered").Inc()
				next[hw]++
			}
		}
		if len(wave) == 0 {
			break
		}
		u.metrics.waveBatches.Observe(float64(len(wave)))
		items := make([]*tablewrite.Items, len(wave))
		for i, cb := range wave {
			items[i] = cb.items
		}
		results := u.newWriter().WriteWave(ctx, items, u.cfg.MaxConcurrency)
		var delivered []buffer.Pending
		for i, cb := range wave {
			hw := cb.pending.HardwareID
			var perm *permanentError
			switch err := u.outcome(results[i], cb); {
			case err == nil:
				delivered = append(delivered, cb.pending)
				next[hw]++
			case errors.As(err, &perm):
				if dlErr := u.deadLetter(cb.pending, perm.Error()); dlErr != nil {
					stopped[hw] = true
					firstErr = cmp.Or(firstErr, dlErr)
					continue
				}
				u.metrics.batches.WithLabelValues("dead_lettered").Inc()
				u.logger.Error("cloud refused a batch permanently; moved to the dead-letter area",
					"batch_id", cb.pending.BatchID, "hardware_id", hw, "err", perm.err)
				next[hw]++
			default:
				if ambiguous(err) {
					u.markUncertain(cb.pending.BatchID)
				}
				stopped[hw] = true
				firstErr = cmp.Or(firstErr, err)
			}
		}
		// Recorded per wave, so that a crash re-sends little; the next
		// wave goes up meanwhile (its batches follow markers already in
		// the cloud).
		marks.Go(func() {
			if err := u.markDelivered(delivered); err != nil {
				markMu.Lock()
				markErr = cmp.Or(markErr, fmt.Errorf("recording delivery: %w", err))
				markMu.Unlock()
			}
		})
	}
	marks.Wait()
	return cmp.Or(firstErr, markErr)
}

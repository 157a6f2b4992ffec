package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/buffer"
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
		errs := u.writeWave(ctx, wave)
		var delivered []buffer.Pending
		for i, cb := range wave {
			hw := cb.pending.HardwareID
			var perm *permanentError
			switch err := errs[i]; {
			case err == nil:
				delivered = append(delivered, cb.pending)
				u.metrics.readings.Add(float64(len(cb.readings)))
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

// waveChunk is one BatchWriteItem request of a wave.
type waveChunk struct {
	reqs   []types.WriteRequest
	owners []int // wave indexes, ascending
}

// chunkWave packs the readings of a wave's batches, in order, into
// requests of at most batchWriteMax items, and returns them with how many
// requests carry each batch's readings.
func chunkWave(wave []*cloudBatch) ([]*waveChunk, []int) {
	var chunks []*waveChunk
	remaining := make([]int, len(wave))
	cur := &waveChunk{}
	for i, cb := range wave {
		for _, r := range cb.readings {
			if len(cur.reqs) == batchWriteMax {
				chunks = append(chunks, cur)
				cur = &waveChunk{}
			}
			cur.reqs = append(cur.reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: r}})
			if len(cur.owners) == 0 || cur.owners[len(cur.owners)-1] != i {
				cur.owners = append(cur.owners, i)
				remaining[i]++
			}
		}
	}
	if len(cur.reqs) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks, remaining
}

// writeWave writes one wave and returns each batch's error. A batch's
// marker goes up as soon as the last request carrying its readings is
// answered, while other requests of the wave are still in flight.
func (u *Uplink) writeWave(ctx context.Context, wave []*cloudBatch) []error {
	errs := make([]error, len(wave))
	chunks, remaining := chunkWave(wave)
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		isolate = make([]bool, len(wave))
	)
	// finish writes batch i's marker (or, when one of its requests was
	// refused, the batch alone) once all its readings requests are answered.
	finish := func(i int) {
		switch {
		case errs[i] != nil:
		case isolate[i]:
			// One of the request's batches is refused: find which by
			// sending each alone.
			errs[i] = u.forwardSplit(ctx, wave[i])
		default:
			errs[i] = u.putMarker(ctx, wave[i])
		}
	}
	// A batch without readings has no request to wait for.
	for i := range wave {
		if remaining[i] == 0 {
			wg.Go(func() { finish(i) })
		}
	}
	sem := make(chan struct{}, u.cfg.MaxConcurrency)
	for _, c := range chunks {
		sem <- struct{}{}
		wg.Go(func() {
			err := u.batchWrite(ctx, "a wave of batches", c.reqs)
			<-sem
			var ready []int
			mu.Lock()
			var perm *permanentError
			for _, i := range c.owners {
				switch {
				case err == nil:
				case errors.As(err, &perm):
					isolate[i] = true
				case errs[i] == nil:
					errs[i] = err
				}
				if remaining[i]--; remaining[i] == 0 {
					ready = append(ready, i)
				}
			}
			mu.Unlock()
			for _, i := range ready {
				wg.Go(func() { finish(i) })
			}
		})
	}
	wg.Wait()
	return errs
}

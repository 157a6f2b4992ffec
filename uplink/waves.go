package uplink

import (
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
					firstErr = cmp(firstErr, dlErr)
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
					firstErr = cmp(firstErr, dlErr)
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
				firstErr = cmp(firstErr, err)
			}
		}
		// Recorded per wave, so that a crash re-sends at most one wave.
		if err := u.markDelivered(delivered); err != nil {
			return cmp(firstErr, fmt.Errorf("recording delivery: %w", err))
		}
	}
	return firstErr
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// writeWave writes one wave and returns each batch's error.
func (u *Uplink) writeWave(ctx context.Context, wave []*cloudBatch) []error {
	errs := make([]error, len(wave))
	type chunk struct {
		reqs   []types.WriteRequest
		owners map[int]bool
	}
	var chunks []*chunk
	cur := &chunk{owners: map[int]bool{}}
	for i, cb := range wave {
		for _, r := range cb.readings {
			if len(cur.reqs) == batchWriteMax {
				chunks = append(chunks, cur)
				cur = &chunk{owners: map[int]bool{}}
			}
			cur.reqs = append(cur.reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: r}})
			cur.owners[i] = true
		}
	}
	if len(cur.reqs) > 0 {
		chunks = append(chunks, cur)
	}

	var mu sync.Mutex
	isolate := map[int]bool{}
	u.parallel(len(chunks), func(k int) {
		c := chunks[k]
		err := u.batchWrite(ctx, "a wave of batches", c.reqs)
		if err == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		var perm *permanentError
		for i := range c.owners {
			if errors.As(err, &perm) {
				// One of the request's batches is refused: find which by
				// sending each alone.
				isolate[i] = true
			} else if errs[i] == nil {
				errs[i] = err
			}
		}
	})
	u.parallel(len(wave), func(i int) {
		switch {
		case errs[i] != nil:
		case isolate[i]:
			errs[i] = u.forwardSplit(ctx, wave[i])
		default:
			errs[i] = u.putMarker(ctx, wave[i])
		}
	})
	return errs
}

// parallel runs f(0..n-1) on up to MaxConcurrency goroutines; the AIMD
// limiter bounds their requests in flight.
func (u *Uplink) parallel(n int, f func(int)) {
	sem := make(chan struct{}, u.cfg.MaxConcurrency)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

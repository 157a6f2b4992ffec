package tablewrite

import (
	"context"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/internal/cloud"
)

// waveChunk is one BatchWriteItem request of a wave.
type waveChunk struct {
	reqs   []types.WriteRequest
	owners []int // wave indexes, ascending
}

// chunkWave packs the readings of a wave's batches, in order, into
// requests of at most BatchWriteMax items, and returns them with how many
// requests carry each batch's readings. With encoded, the items are given
// encoded (cloud.EncodedItem), as the bulk writer gives them.
func chunkWave(wave []*Items, encoded bool) ([]*waveChunk, []int) {
	var chunks []*waveChunk
	remaining := make([]int, len(wave))
	cur := &waveChunk{}
	for i, it := range wave {
		var items []map[string]types.AttributeValue
		if encoded {
			for _, raw := range it.Encode() {
				items = append(items, cloud.EncodedItem(raw))
			}
		} else {
			items = it.readingMaps()
		}
		for _, r := range items {
			if len(cur.reqs) == BatchWriteMax {
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

// WriteWave writes many batches without transactions (which cost twice
// the write capacity): their readings packed 25 to a BatchWriteItem, with
// up to concurrency requests in flight (markers included: a wave's
// markers would otherwise open a connection each), and each batch's
// marker as soon as the last request carrying its readings is answered. A request DynamoDB
// refuses, for its content or its shape, has its batches sent again one
// by one, to find which is refused. The readings go before the conditional marker: the
// caller looks the markers up first (MarkerHashes) and sends each
// batch_id once, or another payload under a batch_id already delivered
// would write over its readings before the marker says Conflict. It
// returns each batch's result, in wave order.
func (w *Writer) WriteWave(ctx context.Context, wave []*Items, concurrency int) []Result {
	results := make([]Result, len(wave))
	failed := make([]bool, len(wave))
	chunks, remaining := chunkWave(wave, w.encodes)
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		isolate = make([]bool, len(wave))
	)
	// finish writes batch i's marker (or, when one of its requests was
	// refused, the batch alone) once all its readings requests are answered.
	sem := make(chan struct{}, max(concurrency, 1))
	finish := func(i int) {
		sem <- struct{}{}
		defer func() { <-sem }()
		switch {
		case failed[i]:
		case isolate[i]:
			// Its other requests may have written some of its readings.
			results[i] = w.writeSplit(ctx, wave[i], true)
		default:
			results[i] = w.putMarker(ctx, wave[i])
		}
	}
	// A batch without readings has no request to wait for.
	for i := range wave {
		if remaining[i] == 0 {
			wg.Go(func() { finish(i) })
		}
	}
	for _, c := range chunks {
		sem <- struct{}{}
		wg.Go(func() {
			err := w.batchWrite(ctx, c.reqs)
			<-sem
			var res Result
			if err != nil {
				res = w.classify("BatchWriteItem", "a wave of batches", err)
			}
			var ready []int
			mu.Lock()
			for _, i := range c.owners {
				switch {
				case err == nil:
				case res.isolates():
					isolate[i] = true
				case !failed[i]:
					failed[i], results[i] = true, res
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
	return results
}

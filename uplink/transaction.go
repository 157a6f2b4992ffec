package uplink

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/tablewrite"
)

// tableSink is what both sinks of the dynamodb target do besides writing:
// the clock check before a round, and the small request of reach.
type tableSink struct{ u *Uplink }

// prepare fails while the gateway's clock is not plausible, after one
// DescribeTable: any answer from DynamoDB teaches the clock its offset.
func (t tableSink) prepare(ctx context.Context) error {
	if t.u.clock.Plausible() {
		return nil
	}
	_ = t.reach(ctx)
	if !t.u.clock.Plausible() {
		return errClockImplausible
	}
	return nil
}

// reach sends a DescribeTable of processed_batches.
func (t tableSink) reach(ctx context.Context) error {
	return t.u.call(ctx, "DescribeTable", func(ctx context.Context) error {
		_, err := t.u.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(t.u.tables.ProcessedBatches)})
		return err
	})
}

// transactionSink writes each batch on its own, in "transaction" write
// mode: its readings and its conditional marker in one
// TransactWriteItems when they fit the endpoint's limit, readings first
// and the conditional marker last otherwise (tablewrite.Writer.Write).
type transactionSink struct {
	tableSink
	probe Prober

	mu      sync.Mutex
	txLimit int // 0 until known
}

// forward checks the lease's uncertain batches (checkUncertain), then
// forwards each device's batches in order (forwardDevice), devices
// concurrently, and returns the first error. The AIMD limiter, not the
// number of workers, bounds the requests in flight.
func (t *transactionSink) forward(ctx context.Context, l lease) error {
	u := t.u
	batches, err := u.checkUncertain(ctx, l.batches, l.oldest)
	if err != nil {
		return err
	}
	order, byDevice := l.devices(batches)
	if len(order) == 0 {
		return nil
	}
	limit, err := t.limit(ctx)
	if err != nil {
		return err
	}
	work := make(chan []buffer.Pending)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		marks    sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for range min(u.cfg.MaxConcurrency, len(order)) {
		wg.Go(func() {
			for batches := range work {
				s := u.settle(t.forwardDevice(ctx, batches, limit))
				fail(s.err)
				// Recorded per device as soon as it is done, so that a
				// crash mid-round re-sends as little as possible; the
				// worker goes on with the next device meanwhile.
				marks.Go(func() { fail(u.record(s.delivered)) })
			}
		})
	}
	for _, hw := range order {
		work <- byDevice[hw]
	}
	close(work)
	wg.Wait()
	marks.Wait()
	return firstErr
}

// forwardDevice sends one device's batches in order and returns their
// results, stopping at the first batch that must be retried so that later
// batches never overtake it.
func (t *transactionSink) forwardDevice(ctx context.Context, batches []buffer.Pending, limit int) []result {
	var results []result
	for _, p := range batches {
		r := t.write(ctx, p, limit)
		results = append(results, r)
		if r.verdict == retry {
			break
		}
	}
	return results
}

// write sends one batch and returns its result.
func (t *transactionSink) write(ctx context.Context, p buffer.Pending, limit int) result {
	cb, err := buildBatch(p, t.u.cfg.ReadingsRetention, t.u.clock.Now())
	if err != nil {
		r := damagedBatch(p, err)
		r.log, r.attrs = "cloud refused a batch permanently; moved to the dead-letter area", []any{"err", err}
		return r
	}
	r := t.u.resultOf(t.u.newWriter().Write(ctx, cb.items, limit), cb)
	// Its marker is looked up before it is written again (checkUncertain).
	r.uncertain = r.verdict == retry && ambiguous(r.err)
	return r
}

// limit returns the endpoint's per-transaction item limit: configured, or
// probed before the first delivery and again after the endpoint refused a
// transaction for its size (forgetLimit).
func (t *transactionSink) limit(ctx context.Context) (int, error) {
	t.mu.Lock()
	limit := t.txLimit
	t.mu.Unlock()
	if limit > 0 {
		return limit, nil
	}
	pctx, cancel := context.WithTimeout(ctx, t.u.cfg.RequestTimeout)
	defer cancel()
	limit, err := t.probe(pctx)
	if err != nil {
		return 0, fmt.Errorf("probing the transaction item limit: %w", err)
	}
	t.mu.Lock()
	t.txLimit = limit
	t.mu.Unlock()
	t.u.metrics.txLimit.Set(float64(limit))
	t.u.logger.Info("transaction item limit probed", "items", limit)
	return limit, nil
}

// forgetLimit makes the next round probe the limit again.
func (t *transactionSink) forgetLimit() {
	if t.u.cfg.TransactionMaxItems != 0 {
		return // configured by the operator
	}
	t.mu.Lock()
	t.txLimit = 0
	t.mu.Unlock()
}

// resultOf turns a batch's tablewrite result into its result for settle.
func (u *Uplink) resultOf(r tablewrite.Result, cb *cloudBatch) result {
	switch r.Outcome {
	case tablewrite.Delivered:
		return result{p: cb.pending, verdict: delivered, readings: cb.readings}
	case tablewrite.Duplicate:
		return result{p: cb.pending, verdict: duplicate, readings: cb.readings}
	case tablewrite.Conflict, tablewrite.Rejected:
		return refusedBatch(cb.pending, r.Err, "err", r.Err)
	}
	if errors.Is(r.Err, tablewrite.ErrHeldBack) {
		// Waiting for an earlier batch of its device, whose own result
		// is the round's error if it has one (a refused batch,
		// dead-lettered, is none): tried again next round.
		return result{p: cb.pending, verdict: heldBack, err: r.Err}
	}
	return result{p: cb.pending, verdict: retry, err: r.Err}
}

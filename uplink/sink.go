package uplink

import (
	"cmp"
	"context"
	"fmt"

	"greenhouse-gateway/buffer"
)

// sink is one way of writing batches to the cloud: the transaction writer
// (transactionSink), the bulk writer (bulkSink) or the readings function
// (lambdaTarget). Run's rounds lease the batches, order them per device
// and back off after failures; a sink writes a round's batches and hands
// every batch's result to the one settle step (Uplink.settle).
type sink interface {
	// prepare readies a round before its lease.
	prepare(ctx context.Context) error
	// forward writes the leased batches, each device's in order, settles
	// their results and returns the round's first error.
	forward(ctx context.Context, l lease) error
	// reach sends the cloud one small request and fails only when no
	// answer came (Uplink.reach).
	reach(ctx context.Context) error
}

// verdict is what a batch's result makes of it.
type verdict int

const (
	// delivered: written now; recorded as delivered.
	delivered verdict = iota
	// duplicate: in the cloud already; recorded as delivered.
	duplicate
	// refused: the cloud refuses it for good (another payload under its
	// batch_id, its own content, damage on disk, a poison batch); moved
	// to the dead-letter area.
	refused
	// retry: it stays pending and its device stops for the round.
	retry
	// heldBack: it stays pending behind an earlier batch of its device,
	// whose result tells why; the device stops for the round.
	heldBack
)

// result is one batch's result, as a sink hands it to settle.
type result struct {
	// p is the batch; when it is in the cloud, with its reading times,
	// for the buffer's history.
	p       buffer.Pending
	verdict verdict
	// readings is the batch's number of readings, counted when it is in
	// the cloud.
	readings int
	// err is why a batch is retried, or a refused batch's dead-letter
	// reason.
	err error
	// log is the error line logged for a refused batch ("": none), with
	// attrs after its batch_id and hardware_id.
	log   string
	attrs []any
	// uncertain: a retried batch's write may have been applied
	// (markUncertain).
	uncertain bool
}

// refusedBatch is the result of a batch the cloud refuses permanently.
func refusedBatch(p buffer.Pending, reason error, attrs ...any) result {
	return result{p: p, verdict: refused, err: reason,
		log: "cloud refused a batch permanently; moved to the dead-letter area", attrs: attrs}
}

// damagedBatch is the result of a batch that does not decode: damage on
// disk, since the buffer only holds payloads the gateway validated and
// encoded itself. It is kept for an operator in the dead-letter area.
func damagedBatch(p buffer.Pending, err error) result {
	return result{p: p, verdict: refused, err: err}
}

// settled is what settle made of a group of results.
type settled struct {
	// delivered are the batches to record as delivered (record).
	delivered []buffer.Pending
	// stopped are the devices that stop for the round: a batch stays
	// pending, so that their later batches never overtake it.
	stopped map[string]bool
	// err is the first error: a retried batch's, or a dead-letter area
	// that could not take a batch.
	err error
}

// settle does the bookkeeping of results, in order: it counts the batches
// in the cloud and collects them for record, moves refused batches to the
// dead-letter area, and stops the device of a batch that stays pending.
// A device stopped by an earlier result has its later results ignored:
// they stay pending (found in the cloud next round when they are there).
func (u *Uplink) settle(results []result) settled {
	s := settled{stopped: map[string]bool{}}
	for _, r := range results {
		hw := r.p.HardwareID
		if s.stopped[hw] {
			continue
		}
		switch r.verdict {
		case delivered, duplicate:
			u.metrics.batches.WithLabelValues(map[verdict]string{delivered: "delivered", duplicate: "already_delivered"}[r.verdict]).Inc()
			u.metrics.readings.Add(float64(r.readings))
			s.delivered = append(s.delivered, r.p)
		case refused:
			if err := u.deadLetter(r.p, r.err.Error()); err != nil {
				s.err = cmp.Or(s.err, fmt.Errorf("dead-lettering %s: %w", r.p.BatchID, err))
				s.stopped[hw] = true
				continue
			}
			u.metrics.batches.WithLabelValues("dead_lettered").Inc()
			if r.log != "" {
				u.logger.Error(r.log, append([]any{"batch_id", r.p.BatchID, "hardware_id", hw}, r.attrs...)...)
			}
		case retry:
			if r.uncertain {
				u.markUncertain(r.p.BatchID)
			}
			s.err = cmp.Or(s.err, r.err)
			s.stopped[hw] = true
		case heldBack:
			s.stopped[hw] = true
		}
	}
	return s
}

// record records settled batches as delivered, in the buffer and in the
// drain figures.
func (u *Uplink) record(delivered []buffer.Pending) error {
	if err := u.markDelivered(delivered); err != nil {
		return fmt.Errorf("recording delivery: %w", err)
	}
	return nil
}

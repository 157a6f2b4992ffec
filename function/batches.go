package function

import (
	"context"
	"fmt"
	"sync"
	"time"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
	"greenhouse-gateway/internal/tablewrite"
)

// job is one device batch on its way to the tables. A job is settled once
// it has an outcome; err explains every outcome but Delivered and
// Duplicate, and is a *contract.Error when the contract has a reason for it.
type job struct {
	batch   *contract.Batch
	hash    [32]byte
	settled bool
	outcome tablewrite.Outcome
	err     error
	quality []float64
	// first is the earlier job of the same request with this batch_id,
	// if any: only that one is written, and this one follows its outcome.
	first *job
}

// settle gives the job its outcome, once.
func (j *job) settle(o tablewrite.Outcome, err error) {
	if !j.settled {
		j.settled, j.outcome, j.err = true, o, err
	}
}

// newJob returns a job for a decoded batch, or a job rejected with err
// when the batch did not decode.
func newJob(b *contract.Batch, err error) *job {
	if err != nil {
		j := &job{batch: b}
		j.settle(tablewrite.Rejected, err)
		return j
	}
	return &job{batch: b, hash: b.IdentityHash()}
}

// store writes the unsettled jobs and settles every one: batches already
// in the cloud answer duplicate or conflict without a write; the others
// get the ordering rule and their quality scores against their device's
// newest readings (read, or taken from hints: history.go), then are
// written (write), each device's batches in order, a device stopping at
// its first batch to retry.
func (f *Function) store(ctx context.Context, jobs []*job, hints map[string][]contract.Reading) {
	followers := repeats(jobs)
	defer func() {
		for _, j := range followers {
			j.follow()
		}
	}()
	start := time.Now()
	f.checkMarkers(ctx, jobs)
	observed(ctx).phase("markers", start)
	order, byDevice := groupJobs(jobs)
	start = time.Now()
	f.prepareDevices(ctx, order, byDevice, hints)
	observed(ctx).phase("history", start)
	start = time.Now()
	defer func() { observed(ctx).phase("writes", start) }()
	f.write(ctx, toWrite(jobs), f.now())
}

// toWrite returns the unsettled jobs, in request order, and settles as
// held back (not_attempted) every batch of a device after one of its
// batches that failed or was throttled before the writes (its marker
// lookup, its history or readings read), so that none overtakes it; the
// writer holds back in the same way after a write that fails.
func toWrite(jobs []*job) []*job {
	stopped := map[string]*job{}
	var todo []*job
	for _, j := range jobs {
		if j.first != nil || j.batch == nil {
			continue
		}
		hw := j.batch.HardwareID
		if s, ok := stopped[hw]; ok {
			if !j.settled {
				j.settle(tablewrite.Failed, fmt.Errorf("%w: batch %s of this device must be retried first",
					tablewrite.ErrHeldBack, s.batch.BatchID))
			}
			continue
		}
		if j.settled {
			if j.outcome == tablewrite.Failed || j.outcome == tablewrite.Throttled {
				stopped[hw] = j
			}
			continue
		}
		todo = append(todo, j)
	}
	return todo
}

// repeats links each unsettled job that repeats the batch_id of an earlier
// one of the request to that one and returns them: one payload per
// batch_id reaches the tables (a second would write over the first's
// readings before its marker said conflict), and a marker lookup may not
// name a batch_id twice.
func repeats(jobs []*job) []*job {
	var out []*job
	firsts := map[string]*job{}
	for _, j := range jobs {
		if j.settled {
			continue
		}
		if first, ok := firsts[j.batch.BatchID]; ok {
			j.first = first
			out = append(out, j)
			continue
		}
		firsts[j.batch.BatchID] = j
	}
	return out
}

// follow settles a repeated batch_id by the outcome of its first job: the
// same payload shares it (duplicate once that one is in the cloud);
// another payload is a conflict once the first is in the cloud, and
// otherwise waits for it (not attempted, sent again alone).
func (j *job) follow() {
	first := j.first
	inCloud := first.outcome == tablewrite.Delivered || first.outcome == tablewrite.Duplicate
	switch {
	case j.hash == first.hash && inCloud:
		j.settle(tablewrite.Duplicate, nil)
	case j.hash == first.hash:
		j.settle(first.outcome, first.err)
	case inCloud:
		j.settle(tablewrite.Conflict, errConflict)
	default:
		j.settle(tablewrite.Failed, fmt.Errorf("%w: batch_id %s is earlier in this request with another payload, which must be settled first",
			tablewrite.ErrHeldBack, j.batch.BatchID))
	}
}

// groupJobs returns the unsettled jobs by device, in request order, and
// the devices in the order of their first batch.
func groupJobs(jobs []*job) ([]string, map[string][]*job) {
	var order []string
	byDevice := map[string][]*job{}
	for _, j := range jobs {
		if j.settled || j.first != nil {
			continue
		}
		hw := j.batch.HardwareID
		if _, ok := byDevice[hw]; !ok {
			order = append(order, hw)
		}
		byDevice[hw] = append(byDevice[hw], j)
	}
	return order, byDevice
}

// checkMarkers settles the jobs whose marker exists: duplicate when the
// stored payload hash is the batch's (or there is none), conflict otherwise.
func (f *Function) checkMarkers(ctx context.Context, jobs []*job) {
	var pending []*job
	for _, j := range jobs {
		if !j.settled && j.first == nil {
			pending = append(pending, j)
		}
	}
	for start := 0; start < len(pending); start += tablewrite.BatchGetMax {
		part := pending[start:min(start+tablewrite.BatchGetMax, len(pending))]
		ids := make([]string, len(part))
		for i, j := range part {
			ids[i] = j.batch.BatchID
		}
		stored, err := f.writer.MarkerHashes(ctx, ids)
		for _, j := range part {
			h, found := stored[j.batch.BatchID]
			switch {
			case err != nil:
				j.settle(cloudFailure(err), fmt.Errorf("looking up the batch's marker: %w", err))
			case found && !tablewrite.SamePayload(h, j.hash):
				j.settle(tablewrite.Conflict, errConflict)
			case found:
				j.settle(tablewrite.Duplicate, nil)
			}
		}
	}
}

// errConflict is the contract's conflict.
var errConflict = contract.NewError(contract.ReasonConflict, "batch_id", "was already received with a different payload")

// cloudFailure is the outcome of a failed DynamoDB request.
func cloudFailure(err error) tablewrite.Outcome {
	if tablewrite.Throttling(err) {
		return tablewrite.Throttled
	}
	return tablewrite.Failed
}

// prepareDevices prepares the devices' batches (prepareDevice), up to
// WriteConcurrency devices at once.
func (f *Function) prepareDevices(ctx context.Context, order []string, byDevice map[string][]*job, hints map[string][]contract.Reading) {
	sem := make(chan struct{}, max(f.cfg.WriteConcurrency, 1))
	var wg sync.WaitGroup
	for _, hw := range order {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f.prepareDevice(ctx, hw, byDevice[hw], hints[hw])
		})
	}
	wg.Wait()
}

// prepareDevice reads a device's newest readings (or takes its hint:
// usableHint), applies the ordering rule to its batches in order and
// scores their readings.
func (f *Function) prepareDevice(ctx context.Context, hw string, jobs []*job, hint []contract.Reading) {
	hist, err := f.newestReadings(ctx, hw, hint)
	if err != nil {
		for _, j := range jobs {
			j.settle(cloudFailure(err), fmt.Errorf("reading the device's newest readings: %w", err))
		}
		return
	}
	last := int64(0)
	for _, r := range hist {
		last = max(last, r.TimestampMS)
	}
	for _, j := range jobs {
		if f.cfg.Ordering == "reject_older" {
			if err := j.batch.CheckOrder(last, f.cfg.OrderingGrace); err != nil {
				// A retry of a batch whose readings were written but not
				// its marker is checked against its own readings: it
				// passed the rule when they were written.
				stored, lerr := f.hasReadings(ctx, j.batch)
				switch {
				case lerr != nil:
					j.settle(cloudFailure(lerr), fmt.Errorf("looking up the batch's readings for the ordering rule: %w", lerr))
					continue
				case !stored:
					j.settle(tablewrite.Rejected, err)
					continue
				}
			}
		} else if older(j.batch, last) {
			f.logger.Info("batch older than the device's newest reading accepted", "batch_id", j.batch.BatchID,
				"hardware_id", hw, "newest_ms", last, "older_batches", 1)
		}
		j.quality = quality.ScoreSequence(append(hist, j.batch.Readings...))[len(hist):]
		hist = append(hist, j.batch.Readings...)
		for _, r := range j.batch.Readings {
			last = max(last, r.TimestampMS)
		}
	}
}

// older reports whether b starts before lastMS.
func older(b *contract.Batch, lastMS int64) bool {
	for _, r := range b.Readings {
		if r.TimestampMS < lastMS {
			return true
		}
	}
	return false
}

// write writes jobs, whose markers checkMarkers found absent, and settles
// them: one batch alone in a transaction when it fits; more with the bulk
// writer (tablewrite.Writer.StartLookedUp), their readings packed 25 to a
// BatchWriteItem across devices and each marker in the next requests once
// its readings are written, a device's markers in order and its batches
// after one that failed or was refused held back (not_attempted). The
// items are built BatchGetMax batches at a time, about as fast as they are
// written, so a large event is not held encoded all at once.
func (f *Function) write(ctx context.Context, jobs []*job, received time.Time) {
	build := func(j *job) *tablewrite.Items {
		return tablewrite.Build(tablewrite.Batch{Batch: j.batch, ReceivedAt: received, Hash: j.hash,
			Quality: j.quality}, f.cfg.ReadingsRetention, f.now())
	}
	var results []tablewrite.Result
	switch len(jobs) {
	case 0:
		return
	case 1:
		results = []tablewrite.Result{f.writer.Write(ctx, build(jobs[0]), f.transactionLimit(ctx))}
	default:
		conc := max(f.cfg.WriteConcurrency, 1)
		bulk := f.writer.StartLookedUp(ctx, conc)
		for start := 0; start < len(jobs); start += tablewrite.BatchGetMax {
			// A done ctx fails the writes themselves.
			_ = bulk.WaitBelow(ctx, tablewrite.BatchGetMax+3*conc)
			items := make([]*tablewrite.Items, 0, tablewrite.BatchGetMax)
			for _, j := range jobs[start:min(start+tablewrite.BatchGetMax, len(jobs))] {
				items = append(items, build(j))
			}
			bulk.Add(items...)
		}
		results = bulk.Wait()
	}
	for i, j := range jobs {
		err := results[i].Err
		if results[i].Outcome == tablewrite.Conflict {
			err = errConflict
		}
		j.settle(results[i].Outcome, err)
	}
}

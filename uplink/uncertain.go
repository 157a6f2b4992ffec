package uplink

import (
	"context"
	"encoding/json"
	"maps"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/tablewrite"
)

// batchGetMax is BatchGetItem's key limit.
const batchGetMax = tablewrite.BatchGetMax

// An uncertain batch may be in the cloud already: it was leased by the
// round a crash interrupted, or its write failed with an ambiguous error (a
// timeout, a lost answer, a 5xx). Before it is written again its
// processed_batches marker is looked up; a batch whose marker exists with
// its payload hash (or none) is recorded as delivered without a write.
// The interrupted round's lease was the oldest batches, which the first
// lease after a start takes again, and devices' oldest batches, which
// later rounds take as fresh batches: so the whole first lease is
// checked, and a fresh batch queued before the start while it is still
// its device's oldest batch of before the start, that is until a lease
// held one of the device's batches. (A later batch
// cannot have been written: the interrupted round took at most the
// device's oldest pending batch out of queue order.)

// markUncertain remembers that batchID's write may have been applied.
func (u *Uplink) markUncertain(batchID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.uncertain[batchID] = true
}

// checkUncertain looks up the markers of the lease's uncertain batches,
// records those found as delivered, and returns the batches still to
// forward, in lease order. leased[freshFrom:] are the fresh batches.
func (u *Uplink) checkUncertain(ctx context.Context, leased []buffer.Pending, freshFrom int) ([]buffer.Pending, error) {
	u.mu.Lock()
	all := !u.startChecked
	var check []buffer.Pending
	for i, p := range leased {
		if all || u.uncertain[p.BatchID] || (i >= freshFrom && p.Seq <= u.startSeq && !u.settled[p.HardwareID]) {
			check = append(check, p)
		}
	}
	u.mu.Unlock()
	if len(check) == 0 {
		u.noteLeased(leased)
		return leased, nil
	}
	found := map[string]string{}
	for start := 0; start < len(check); start += batchGetMax {
		part := check[start:min(start+batchGetMax, len(check))]
		if err := u.lookupMarkers(ctx, part, found); err != nil {
			return nil, err
		}
	}
	var rest, delivered []buffer.Pending
	for _, p := range leased {
		if h, ok := found[p.BatchID]; ok && samePayload(p, h) {
			delivered = append(delivered, p)
		} else {
			// Not in the cloud, or another payload under its batch_id:
			// forwarded, its write finds the conflict.
			rest = append(rest, p)
		}
	}
	inCloud := make([]result, len(delivered))
	for i, p := range delivered {
		inCloud[i] = result{p: p, verdict: duplicate, readings: readingCount(p.Payload)}
	}
	if err := u.record(u.settle(inCloud).delivered); err != nil {
		return nil, err
	}
	u.mu.Lock()
	u.startChecked = true
	for _, p := range check {
		delete(u.uncertain, p.BatchID)
	}
	u.mu.Unlock()
	u.noteLeased(leased)
	if len(delivered) > 0 {
		u.logger.Info("batches found in the cloud already; recorded as delivered without writing", "batches", len(delivered))
	}
	return rest, nil
}

// noteLeased records that the lease held a batch of each of its devices: their
// oldest batch of before the start has been checked or taken in queue
// order. Once the oldest batch leased was queued after the start, no
// device has such a batch left.
func (u *Uplink) noteLeased(leased []buffer.Pending) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(leased) == 0 || leased[0].Seq > u.startSeq {
		clear(u.settled)
		return
	}
	for _, p := range leased {
		u.settled[p.HardwareID] = true
	}
}

// lookupMarkers reads up to 100 markers and adds the batch_ids found to
// found, with their payload hashes ("" for a marker without one).
func (u *Uplink) lookupMarkers(ctx context.Context, batches []buffer.Pending, found map[string]string) error {
	ids := make([]string, 0, len(batches))
	for _, p := range batches {
		ids = append(ids, p.BatchID)
	}
	stored, err := u.newWriter().MarkerHashes(ctx, ids)
	maps.Copy(found, stored)
	return err
}

// samePayload reports whether a marker with payload hash h (hex; "" for a
// marker written without one) stands for p's payload.
func samePayload(p buffer.Pending, h string) bool {
	if h == "" {
		return true
	}
	b, _, err := decodeBuffered(p)
	if err != nil {
		return false // damaged on disk: forwarding it dead-letters it
	}
	return tablewrite.SamePayload(h, b.IdentityHash())
}

// readingCount is the number of readings in a buffered payload (0 when it
// does not decode).
func readingCount(payload []byte) int {
	var b struct {
		Readings []json.RawMessage `json:"readings"`
	}
	if json.Unmarshal(payload, &b) != nil {
		return 0
	}
	return len(b.Readings)
}

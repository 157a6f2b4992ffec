package uplink

import (
	"fmt"
	"slices"
	"sync"

	"greenhouse-gateway/buffer"
)

// refScanChunk is how many queue entries one PendingRefs call reads.
const refScanChunk = 4096

// backlogIndex knows, for every device, the sequence numbers of its
// pending batches up to horizon (the newest queue entry it has read), in
// order. A device's first entry is its oldest pending batch: a round may
// forward that batch out of queue order without breaking the device's
// order. The index lives in memory and is rebuilt after a restart.
type backlogIndex struct {
	src     Store
	mu      sync.Mutex
	horizon uint64
	devices map[string][]uint64
}

// extend reads the queue entries that arrived since the last call, at
// most maxChunks reads of refScanChunk.
func (x *backlogIndex) extend(maxChunks int) error {
	for range maxChunks {
		x.mu.Lock()
		after := x.horizon
		x.mu.Unlock()
		refs, err := x.src.PendingRefs(after, refScanChunk)
		if err != nil {
			return fmt.Errorf("reading the queue's index: %w", err)
		}
		x.mu.Lock()
		for _, r := range refs {
			x.devices[r.HardwareID] = append(x.devices[r.HardwareID], r.Seq)
			x.horizon = max(x.horizon, r.Seq)
		}
		x.mu.Unlock()
		if len(refs) < refScanChunk {
			return nil
		}
	}
	return nil
}

// newest returns the highest sequence number read so far.
func (x *backlogIndex) newest() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.horizon
}

// prune forgets entries below oldest, the oldest queued sequence number:
// they left the queue without the uplink (the drop_oldest policy).
func (x *backlogIndex) prune(oldest uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for hw, seqs := range x.devices {
		i := 0
		for i < len(seqs) && seqs[i] < oldest {
			i++
		}
		if i == len(seqs) {
			delete(x.devices, hw)
		} else if i > 0 {
			x.devices[hw] = seqs[i:]
		}
	}
}

// clear forgets every entry up to the horizon: the queue is empty.
func (x *backlogIndex) clear() {
	x.mu.Lock()
	defer x.mu.Unlock()
	clear(x.devices)
}

// remove forgets batches that left the queue.
func (x *backlogIndex) remove(done []buffer.Pending) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range done {
		seqs := x.devices[p.HardwareID]
		if i := slices.Index(seqs, p.Seq); i >= 0 {
			seqs = slices.Delete(seqs, i, i+1)
		}
		if len(seqs) == 0 {
			delete(x.devices, p.HardwareID)
		} else {
			x.devices[p.HardwareID] = seqs
		}
	}
}

// heads returns the oldest pending batch of up to n devices not in skip
// whose oldest pending batch comes after after, the devices with the
// newest such batch (the least backlog) first.
func (x *backlogIndex) heads(n int, after uint64, skip map[string][]buffer.Pending) []uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []uint64
	for hw, seqs := range x.devices {
		if _, ok := skip[hw]; ok || seqs[0] <= after {
			continue
		}
		out = append(out, seqs[0])
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out[:min(n, len(out))]
}

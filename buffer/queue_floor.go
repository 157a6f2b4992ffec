package buffer

import "sync/atomic"

// queueFloor is a sequence number below which no queue entry exists or can
// appear: reads of the oldest pending batches seek to it instead of the
// start of the queue, where Badger would step over the deletion markers of
// every batch delivered since its last compaction.
//
// A read that starts at the floor and finds its first entry at seq k raises
// the floor to k. That is safe because queue entries are written under wmu
// with sequence numbers taken in increasing order, each group committed
// before the next: when k is visible, every smaller number that will ever
// be stored is visible too, and new numbers are above k.
type queueFloor struct{ seq atomic.Uint64 }

// from returns where a read of the entries after after starts, and whether
// that is the floor (so that the read may raise it).
func (f *queueFloor) from(after uint64) (uint64, bool) {
	floor := f.seq.Load()
	if after+1 <= floor {
		return floor, true
	}
	return after + 1, false
}

// raise records that no entry below seq exists.
func (f *queueFloor) raise(seq uint64) {
	for {
		cur := f.seq.Load()
		if seq <= cur || f.seq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

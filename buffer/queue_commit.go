package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// committer is the only goroutine that creates markers, queue entries and
// state records. It takes every request waiting, commits them in one
// synced transaction (group commit) and then answers all of them.
func (b *Buffer) committer() {
	defer close(b.stopped)
	for {
		select {
		case req := <-b.reqs:
			b.commitGroup(b.gather(req))
		case <-b.closing:
			// Close holds no request back: everything queued before it is
			// committed and answered.
			for {
				select {
				case req := <-b.reqs:
					b.commitGroup(b.gather(req))
				default:
					return
				}
			}
		}
	}
}

// gather returns first plus every request already waiting, up to the group
// caps. When the observed rate of concurrent requests (those that arrive
// while another one waits or is being written) says more are about to
// come (groupWait, buffer.group_max_wait), it then waits that long for
// them, or until the group is full, before the group is written.
func (b *Buffer) gather(first *commitReq) []*commitReq {
	group := []*commitReq{first}
	n := len(first.entries)
	n, group = b.drain(group, n)
	// The first request found the committer idle; those behind it arrived
	// while another commit was waiting or being written. Only they count:
	// a lone device committing as fast as it can never waits for itself.
	rate := b.arrivals.Add(batchRequests(group[1:]), time.Now())
	wait := groupWait(rate, b.opts.GroupMaxWait, b.opts.GroupWaitRate)
	if wait <= 0 || n >= b.opts.MaxGroupBatches {
		b.metrics.commitWait.Observe(0)
		return group
	}
	start := time.Now()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	taken := len(group)
collect:
	for n < b.opts.MaxGroupBatches {
		select {
		case req := <-b.reqs:
			group = append(group, req)
			n += len(req.entries)
		case <-timer.C:
			break collect
		case <-b.closing:
			break collect
		}
	}
	b.arrivals.Add(batchRequests(group[taken:]), time.Now())
	b.metrics.commitWait.Observe(time.Since(start).Seconds())
	return group
}

// batchRequests counts the requests of group that are not state saves:
// the arrival rate and the commit metrics are those of batches, and a
// state save (SaveStates) rides along with them.
func batchRequests(group []*commitReq) int {
	n := 0
	for _, req := range group {
		if req.states == nil {
			n++
		}
	}
	return n
}

// drain appends the requests already queued to group, up to the group cap,
// and returns the batches in it.
func (b *Buffer) drain(group []*commitReq, n int) (int, []*commitReq) {
	for n < b.opts.MaxGroupBatches {
		select {
		case req := <-b.reqs:
			group = append(group, req)
			n += len(req.entries)
		default:
			return n, group
		}
	}
	return n, group
}

// commitGroup writes group (writeGroup) and answers every request of it.
// A group made only of state saves is left out of the commit metrics and
// its failure is not logged here: the callers of SaveStates get the error.
func (b *Buffer) commitGroup(group []*commitReq) {
	start := time.Now()
	batches := batchRequests(group) > 0
	res, err := b.writeGroup(group)
	if err != nil {
		if batches {
			b.metrics.commitFailures.Inc()
			b.logger.Error("group commit failed; its batches are not acknowledged", "err", err,
				"requests", len(group))
		}
		for _, req := range group {
			req.done <- err
		}
		return
	}
	// Count before answering: whoever waits sees the metrics updated.
	b.report(res)
	n := 0
	for _, req := range group {
		n += len(req.entries)
		for _, o := range req.out {
			b.metrics.outcomes.WithLabelValues(o.String()).Inc()
		}
	}
	if batches {
		b.metrics.groupBatches.Observe(float64(n))
		b.metrics.commitSeconds.Observe(time.Since(start).Seconds())
	}
	for _, req := range group {
		req.done <- nil
	}
	if res.stored > 0 {
		select {
		case b.notify <- struct{}{}:
		default:
		}
	}
}

// groupResult is what one group commit did.
type groupResult struct {
	stored  int
	refused int64
	// refusedBy is refusedBudget or refusedFreeSpace when batches were
	// refused, with the figures for the log.
	refusedBy        string
	free, used, need int64
	ev               evicted
	// limited counts the batches refused for a share or rate, by reason
	// (limitShares); limitedDevice is each refused device's last reason.
	limited       map[string]int64
	limitedDevice map[string]string
	// states is what the group's state records change (writeStates).
	states stateWrites
}

// report counts and logs refusals and evictions.
func (b *Buffer) report(res groupResult) {
	b.reportLimits(res)
	if res.refused > 0 {
		b.metrics.refused.WithLabelValues(res.refusedBy).Add(float64(res.refused))
		if ok, suppressed := b.fullLog.allow(res.refused); ok {
			if res.refusedBy == refusedFreeSpace {
				b.logger.Warn("buffer full: free disk space below buffer.min_free_bytes; new batches are refused",
					"free_bytes", res.free, "min_free_bytes", b.opts.MinFreeBytes, "refused", res.refused,
					"refused_before", suppressed)
			} else {
				b.logger.Warn("buffer full: disk budget buffer.max_pending_bytes reached; new batches are refused",
					"used_bytes", res.used, "needed_bytes", res.need, "max_pending_bytes", b.opts.MaxPendingBytes,
					"full_policy", b.opts.FullPolicy, "refused", res.refused, "refused_before", suppressed)
			}
		}
	}
	if res.ev.history > 0 {
		b.metrics.evicted.WithLabelValues(reasonHistoryEvicted).Add(float64(res.ev.history))
	}
	if res.ev.markers > 0 {
		b.metrics.evicted.WithLabelValues(reasonMarkerEvicted).Add(float64(res.ev.markers))
		if ok, suppressed := b.evictLog.allow(res.ev.markers); ok {
			b.logger.Info("delivered markers evicted to make room: a resend of those batches is no longer "+
				"recognised as a duplicate (the cloud's marker still absorbs it)", "evicted", res.ev.markers,
				"evicted_before", suppressed, "max_pending_bytes", b.opts.MaxPendingBytes)
		}
	}
	if res.ev.dropped > 0 {
		b.metrics.evicted.WithLabelValues(reasonDroppedOldest).Add(float64(res.ev.dropped))
		// Every drop is logged: it loses acknowledged data.
		b.logger.Warn("oldest undelivered batches dropped to make room (buffer.full_policy drop_oldest)",
			"dropped", res.ev.dropped, "bytes", res.ev.payloadBytes,
			"first_batch_id", res.ev.first.BatchID, "first_hardware_id", res.ev.first.HardwareID,
			"first_received_at", res.ev.first.ReceivedAt, "last_batch_id", res.ev.last.BatchID,
			"last_received_at", res.ev.last.ReceivedAt)
	}
}

// candidate is a new batch of a group, not yet admitted.
type candidate struct {
	req  *commitReq
	i    int
	val  []byte
	cost int64
}

// follower is an entry that repeats the batch_id of a candidate earlier
// in the same group.
type follower struct {
	req  *commitReq
	i    int
	cand int  // the candidate's index
	same bool // the same hash as the candidate
}

// admission is how many of a group's candidates are stored (the first n,
// in order) and what they cost.
type admission struct {
	n    int
	cost int64
}

// writeGroup decides every entry's outcome, makes room within the budget,
// writes the new batches and the state records and commits them, all
// under wmu. When it returns without error the group is on disk: its
// transactions are committed (synced) and the directory fsynced if it
// changed (commitDurably), so commitGroup answers the requests only after
// that (doc.go, Durability). State records are not subject to the budget
// or the watermark: they count, but are always written.
func (b *Buffer) writeGroup(group []*commitReq) (res groupResult, err error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	w := newTxnWriter(b.db, &b.syncs, b.failure)
	seq := b.nextSeq
	defer func() {
		// Sequence numbers are never reused, even after a failure: part of
		// a split group may be on disk.
		b.nextSeq = seq
		if err != nil && w.written {
			b.recount()
		}
	}()
	cands, followers, err := dedupGroup(w, group)
	if err != nil {
		w.discard()
		return res, err
	}
	cands, followers = b.limitShares(cands, followers, &res)
	adm, err := b.admit(w, cands, &res)
	if err != nil {
		w.discard()
		return res, err
	}
	if seq, err = storeCandidates(w, cands, adm.n, seq, &res); err != nil {
		return res, err
	}
	resolveFollowers(followers, adm.n, &res)
	if res.states, err = writeStates(w, group); err != nil {
		return res, err
	}
	if res.wroteNothing() {
		w.discard()
		return res, nil
	}
	if err := b.commitDurably(w, seq, res); err != nil {
		return res, err
	}
	b.account(cands[:adm.n], adm.cost, res)
	return res, nil
}

// dedupGroup answers the entries whose batch_id is already stored
// (Duplicate, or Conflict when the hash differs) and returns the others:
// the new batches in order, encoded (candidates), and the entries that
// repeat a candidate's batch_id, whose outcome follows that candidate's
// (resolveFollowers). Only one copy of a batch_id is ever written.
func dedupGroup(w *txnWriter, group []*commitReq) ([]candidate, []follower, error) {
	type seen struct {
		hash [32]byte
		cand int
	}
	inGroup := make(map[string]seen)
	var cands []candidate
	var followers []follower
	for _, req := range group {
		for i, e := range req.entries {
			if s, ok := inGroup[e.BatchID]; ok {
				followers = append(followers, follower{req: req, i: i, cand: s.cand, same: s.hash == e.Hash})
				continue
			}
			m, found, err := w.marker(e.BatchID)
			if err != nil {
				return nil, nil, err
			}
			if found {
				req.out[i] = sameOrConflict(m.hash, e.Hash)
				continue
			}
			val := encodePending(Pending{BatchID: e.BatchID, HardwareID: e.HardwareID,
				ReceivedAt: e.ReceivedAt, Payload: e.Payload})
			inGroup[e.BatchID] = seen{hash: e.Hash, cand: len(cands)}
			cands = append(cands, candidate{req: req, i: i, val: val, cost: pendingCost(len(e.BatchID), len(val))})
		}
	}
	return cands, followers, nil
}

// admit decides how many candidates are stored, in order, and makes room
// for them through w. Below the free-space watermark
// (buffer.min_free_bytes) it refuses them all and evicts nothing: deleting
// records frees disk space only after compaction, too late to help (doc.go,
// Capacity). Otherwise it admits what fits in the budget counting
// evictable records as free (fitBudget), evicts what the admitted batches
// need (makeRoom) and refuses again what eviction could not free
// (refuseShortfall).
func (b *Buffer) admit(w *txnWriter, cands []candidate, res *groupResult) (admission, error) {
	if len(cands) == 0 {
		return admission{}, nil
	}
	if free, ok := b.free.bytes(); ok && free < uint64(b.opts.MinFreeBytes) {
		res.refusedBy, res.free = refusedFreeSpace, int64(free)
		b.reclaim.refused.Store(time.Now().UnixNano())
		return admission{}, nil
	}
	used := b.usage.total()
	adm := b.fitBudget(cands, used, res)
	need := used + adm.cost - b.opts.MaxPendingBytes
	if need <= 0 {
		return adm, nil
	}
	need, err := b.makeRoom(w, need, &res.ev)
	if err != nil {
		return adm, err
	}
	refuseShortfall(cands, &adm, need, used, res)
	return adm, nil
}

// fitBudget admits candidates in order while they fit in the room
// buffer.max_pending_bytes leaves when every evictable record counts as
// free: history and delivered markers, and with drop_oldest the
// undelivered batches too. The first candidate that does not fit ends the
// admission: it and every one after it are refused.
func (b *Buffer) fitBudget(cands []candidate, used int64, res *groupResult) admission {
	room := b.opts.MaxPendingBytes - used + b.usage.history.Load() + b.usage.delivered.Load()
	if b.opts.FullPolicy == PolicyDropOldest {
		room += b.usage.pending.Load()
	}
	var adm admission
	for _, c := range cands {
		if adm.cost+c.cost > room {
			res.refusedBy, res.used, res.need = refusedBudget, used, c.cost
			break
		}
		adm.cost += c.cost
		adm.n++
	}
	return adm
}

// makeRoom evicts through w until need bytes are free, losing the least
// first: history (copies of delivered batches), then delivered markers
// (a resend of those batches is no longer recognised here; the cloud's
// marker still absorbs it), then, with drop_oldest only, the oldest
// undelivered batches. It returns the bytes still missing.
func (b *Buffer) makeRoom(w *txnWriter, need int64, ev *evicted) (int64, error) {
	if err := b.evictHistory(w, need, ev); err != nil {
		return need, err
	}
	if need -= ev.historyBytes; need > 0 {
		if err := b.evictMarkers(w, need, ev); err != nil {
			return need, err
		}
		need -= ev.markerBytes
	}
	if need > 0 && b.opts.FullPolicy == PolicyDropOldest {
		if err := b.dropOldest(w, need, ev); err != nil {
			return need, err
		}
		need -= ev.droppedBytes
	}
	return need, nil
}

// refuseShortfall refuses admitted candidates, the last first, until the
// need bytes eviction could not free are covered. The eviction scans free
// what usage counted, so this happens only when usage drifted from what
// is on disk.
func refuseShortfall(cands []candidate, adm *admission, need, used int64, res *groupResult) {
	for need > 0 && adm.n > 0 {
		adm.n--
		adm.cost -= cands[adm.n].cost
		need -= cands[adm.n].cost
		res.refusedBy, res.used, res.need = refusedBudget, used, cands[adm.n].cost
	}
}

// storeCandidates writes a pending marker and a queue entry for each of the
// first admitted candidates, numbered from seq on, and answers Full for
// the others. It returns the next sequence number, also after a failed
// write: an earlier transaction of a split group may be on disk with
// the numbers before it.
func storeCandidates(w *txnWriter, cands []candidate, admitted int, seq uint64, res *groupResult) (uint64, error) {
	for k, c := range cands {
		if k >= admitted {
			c.req.out[c.i] = Full
			res.refused++
			continue
		}
		e := c.req.entries[c.i]
		mk := marker{state: statePending, hash: e.Hash, seq: seq, receivedAt: e.ReceivedAt}
		if err := w.set(markerKey(e.BatchID), mk.encode()); err != nil {
			return seq, err
		}
		if err := w.set(queueKey(seq), c.val); err != nil {
			return seq, err
		}
		c.req.out[c.i] = Stored
		seq++
		res.stored++
	}
	return seq, nil
}

// resolveFollowers answers the entries that repeat a candidate's batch_id:
// Full when the candidate was refused, otherwise what a resend right after
// the candidate was stored gets (Duplicate, or Conflict when the hash
// differs).
func resolveFollowers(followers []follower, admitted int, res *groupResult) {
	for _, f := range followers {
		switch {
		case f.cand >= admitted:
			f.req.out[f.i] = Full
			res.refused++
		case f.same:
			f.req.out[f.i] = Duplicate
		default:
			f.req.out[f.i] = Conflict
		}
	}
}

// wroteNothing reports whether the group stored, evicted and saved
// nothing, so that there is no transaction to commit.
func (r groupResult) wroteNothing() bool {
	return r.stored == 0 && r.ev.markers == 0 && r.ev.markerBytes == 0 && r.ev.dropped == 0 && r.ev.history == 0 &&
		r.states.records == 0
}

// commitDurably records the next sequence number and commits the group's
// last transaction, synced, then fsyncs the data directory if its entries
// changed (a new write-ahead log or value log file): the group may be
// acknowledged only after it returns nil. Badger only logs a failed msync
// of the value log, so a commit during which its logger saw one fails too
// (vlogSyncFailed). A failure after the commit marks w written: the group
// may be on disk, and writeGroup recounts.
func (b *Buffer) commitDurably(w *txnWriter, seq uint64, res groupResult) error {
	what := fmt.Sprintf("%d batches", res.stored)
	if res.states.records > 0 {
		what += fmt.Sprintf(" and %d state records", res.states.records)
	}
	var seqVal [8]byte
	binary.BigEndian.PutUint64(seqVal[:], seq)
	if err := w.set(seqKey, seqVal[:]); err != nil {
		return err
	}
	b.vlogSyncFailed.Store(false)
	if b.opts.beforeCommit != nil {
		if err := b.opts.beforeCommit(); err != nil {
			w.discard()
			return err
		}
	}
	if err := w.commit(); err != nil {
		return fmt.Errorf("committing %s: %w", what, err)
	}
	if b.vlogSyncFailed.Swap(false) {
		w.written = true
		return fmt.Errorf("committing %s: badger could not sync its value log", what)
	}
	synced, err := b.dirSync.sync()
	if err != nil {
		w.written = true
		b.failure.fail(fmt.Errorf("syncing the directory: %w", err))
		return fmt.Errorf("committing %s: %w", what, err)
	}
	if synced {
		b.syncs.Add(1)
	}
	return nil
}

// account adds the admitted batches to the counters and takes off what
// eviction freed, once the group is on disk.
func (b *Buffer) account(admitted []candidate, admittedCost int64, res groupResult) {
	var payload int64
	for _, c := range admitted {
		payload += int64(len(c.val))
		e := c.req.entries[c.i]
		b.shares.add(e.HardwareID, e.Key, c.cost)
	}
	for hw, cost := range res.ev.droppedBy {
		b.shares.remove(hw, cost)
	}
	b.pendingBatches.Add(int64(res.stored) - res.ev.dropped)
	b.pendingBytes.Add(payload - res.ev.payloadBytes)
	b.usage.pending.Add(admittedCost - res.ev.droppedBytes)
	b.usage.delivered.Add(-res.ev.markerBytes)
	b.usage.deliveredMarkers.Add(-res.ev.markers)
	b.usage.history.Add(-res.ev.historyBytes)
	b.usage.historyBatches.Add(-res.ev.history)
	b.usage.state.Add(res.states.bytes)
	b.usage.stateRecords.Add(res.states.added)
}

func sameOrConflict(stored, got [32]byte) Outcome {
	if stored == got {
		return Duplicate
	}
	return Conflict
}

// txnWriter writes through one Badger transaction, committing and starting
// a new one when the transaction grows too big. Every commit is synced.
type txnWriter struct {
	db  *badger.DB
	txn *badger.Txn
	// syncs, when set, counts the synced transactions committed.
	syncs *atomic.Int64
	// written is set when some transaction already committed: a later
	// failure then leaves part of the group on disk, which is safe (its
	// members are not acknowledged, and a resend is a duplicate).
	written bool
	// failure stops every commit once one failed (failure.go).
	failure *failure
}

func newTxnWriter(db *badger.DB, syncs *atomic.Int64, fail *failure) *txnWriter {
	return &txnWriter{db: db, txn: db.NewTransaction(true), syncs: syncs, failure: fail}
}

// queued reports whether the queue entry seq exists, and its value length.
func (w *txnWriter) queued(seq uint64) (int, bool, error) {
	item, err := w.txn.Get(queueKey(seq))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading queue entry %d: %w", seq, err)
	}
	return int(item.ValueSize()), true, nil
}

// queuedValue returns the queue entry seq, if it exists.
func (w *txnWriter) queuedValue(seq uint64) ([]byte, bool, error) {
	item, err := w.txn.Get(queueKey(seq))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading queue entry %d: %w", seq, err)
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, false, fmt.Errorf("reading queue entry %d: %w", seq, err)
	}
	return v, true, nil
}

// recordSize returns what the budget counts for the record k, 0 when
// there is none.
func (w *txnWriter) recordSize(k []byte) (int64, error) {
	item, err := w.txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return recordSize(len(k), int(item.ValueSize())), nil
}

func (w *txnWriter) marker(batchID string) (marker, bool, error) {
	return markerIn(w.txn, batchID)
}

func (w *txnWriter) set(k, v []byte) error {
	return w.apply(func(txn *badger.Txn) error { return txn.Set(k, v) })
}

func (w *txnWriter) delete(k []byte) error {
	return w.apply(func(txn *badger.Txn) error { return txn.Delete(k) })
}

func (w *txnWriter) apply(op func(*badger.Txn) error) error {
	err := op(w.txn)
	if errors.Is(err, badger.ErrTxnTooBig) {
		if err = w.commitTxn(); err != nil {
			return fmt.Errorf("committing a full transaction: %w", err)
		}
		w.count()
		w.written = true
		w.txn = w.db.NewTransaction(true)
		err = op(w.txn)
	}
	if err != nil {
		w.txn.Discard()
	}
	return err
}

func (w *txnWriter) commit() error {
	if err := w.commitTxn(); err != nil {
		return err
	}
	w.count()
	return nil
}

// commitTxn commits the transaction, unless the data directory failed
// before; a failed commit is the data directory's failure.
func (w *txnWriter) commitTxn() error {
	if err := w.failure.failed(); err != nil {
		w.txn.Discard()
		return err
	}
	err := w.failure.injected()
	if err != nil {
		w.txn.Discard()
	} else {
		err = w.txn.Commit()
	}
	if err != nil {
		w.failure.fail(err)
		return err
	}
	return nil
}

func (w *txnWriter) count() {
	if w.syncs != nil {
		w.syncs.Add(1)
	}
}

func (w *txnWriter) discard() { w.txn.Discard() }

// commitReq is one request to the committer: batches to store (Submit)
// or state records to save (SaveStates), answered on done once the group
// it joined is on disk.
type commitReq struct {
	entries []Entry
	out     []Outcome
	states  map[string][]byte
	done    chan error
}

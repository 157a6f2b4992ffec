package buffer

import (
	"time"
)

// Share refusal reasons, the reason label of
// gateway_buffer_refused_batches_total beside budget and free_space.
const (
	refusedDeviceShare = "device_share"
	refusedKeyShare    = "key_share"
	refusedDeviceRate  = "device_rate"
)

// Share defaults (Options).
const (
	defaultDeviceShare      = 0.125
	defaultKeyShare         = 0.5
	defaultDeviceBatchRate  = 20
	defaultDeviceBatchBurst = 10000
	// seenFor is how long a device that stored a batch counts among the
	// devices seen, for its fair share, after its last batch.
	seenFor = 10 * time.Minute
)

// shares is what each device and key holds of the queue, in bytes as the
// budget counts them (pendingCost), and each device's rate of new
// batches. Pending bytes are counted per hardware_id from the queue
// entries' headers at open and kept as batches are stored, delivered,
// dead-lettered or dropped; a key's count is the sum of the devices it
// last stored a batch for, so after a restart a device's queued batches
// count toward its key again from the key's next batch for it. Every map
// holds only devices with batches queued (rates: devices seen in the last
// minute or so). Guarded by Buffer.wmu.
type shares struct {
	device map[string]int64  // pending cost per hardware_id
	owner  map[string]string // hardware_id -> the key that last stored a batch for it
	key    map[string]int64  // pending cost per key, over the devices it owns
	rates  map[string]*batchBucket
	// seen is when each device last stored a batch, kept for seenFor.
	seen   map[string]time.Time
	pruned time.Time
}

func newShares(devices map[string]int64) shares {
	if devices == nil {
		devices = map[string]int64{}
	}
	return shares{device: devices, owner: map[string]string{}, key: map[string]int64{},
		rates: map[string]*batchBucket{}, seen: map[string]time.Time{}}
}

// add counts a stored batch of cost bytes for hw, sent with key ("" when
// the batch came with no key, as from an external broker).
func (s *shares) add(hw, key string, cost int64) {
	if key != "" && s.owner[hw] != key {
		if old, ok := s.owner[hw]; ok {
			s.takeKey(old, s.device[hw])
		}
		s.owner[hw] = key
		s.key[key] += s.device[hw]
	}
	s.device[hw] += cost
	if k, ok := s.owner[hw]; ok {
		s.key[k] += cost
	}
}

// remove takes a batch of cost bytes of hw off the counts: delivered,
// dead-lettered or dropped.
func (s *shares) remove(hw string, cost int64) {
	left := s.device[hw] - cost
	if left <= 0 {
		delete(s.device, hw)
	} else {
		s.device[hw] = left
	}
	if k, ok := s.owner[hw]; ok {
		s.takeKey(k, cost)
		if left <= 0 {
			delete(s.owner, hw)
		}
	}
}

func (s *shares) takeKey(key string, cost int64) {
	if left := s.key[key] - cost; left <= 0 {
		delete(s.key, key)
	} else {
		s.key[key] = left
	}
}

// shareCapacity is what the shares are fractions of: the budget, or less
// when the disk has less room left above the free-space watermark than
// the budget (what the buffer holds plus that room). full reports a disk
// below the watermark, where every new batch is refused anyway.
func (b *Buffer) shareCapacity() (c int64, full bool) {
	c = b.opts.MaxPendingBytes
	if free, ok := b.free.bytes(); ok {
		room := int64(free) - b.opts.MinFreeBytes
		c = min(c, b.usage.total()+max(0, room))
		full = room < 0
	}
	return c, full
}

// fairShares returns the fractions of the capacity a device and a key may
// hold now: DeviceShare, or more with fewer devices seen (a fair share of
// 1/N among the N devices with batches queued or seen in the last
// seenFor), and KeyShare, or 1/K among the K keys with devices queued.
func (s *shares) fairShares(o Options, now time.Time) (device, key float64) {
	for hw, t := range s.seen {
		if now.Sub(t) >= seenFor {
			delete(s.seen, hw)
		}
	}
	n := len(s.device)
	for hw := range s.seen {
		if _, ok := s.device[hw]; !ok {
			n++
		}
	}
	return max(o.DeviceShare, 1/float64(max(n, 1))), max(o.KeyShare, 1/float64(max(len(s.key), 1)))
}

// limitShares answers the candidates of a device or key past its share,
// and of a device past its rate of new batches, with Limited, and the
// followers of those candidates too; it returns the other candidates and
// followers (their indices renumbered) for admission. Once one of a
// device's candidates is refused, so are its later ones in the group, so
// that the device's batches are stored in the order it sent them.
//
// A device may hold DeviceShare of the capacity, or its fair share of the
// devices seen when that is more, and a key KeyShare, or 1/K of the keys
// in use when that is more (fairShares); a device or key that holds
// nothing yet is always let in with one batch, however large. The rate is a token bucket per device: DeviceBatchBurst
// new batches at once, refilled at DeviceBatchRate a second.
func (b *Buffer) limitShares(cands []candidate, followers []follower, res *groupResult) ([]candidate, []follower) {
	if len(cands) == 0 || b.opts.DeviceShare >= 1 && b.opts.KeyShare >= 1 && b.opts.DeviceBatchRate < 0 {
		return cands, followers
	}
	s := &b.shares
	now := b.opts.now()
	capacity, full := b.shareCapacity()
	if full {
		return cands, followers // admit refuses them all for free space
	}
	for _, c := range cands {
		s.seen[c.req.entries[c.i].HardwareID] = now
	}
	devShare, keyShare := s.fairShares(b.opts, now)
	devLimit, keyLimit := int64(devShare*float64(capacity)), int64(keyShare*float64(capacity))
	var groupDev, groupKey map[string]int64
	refusedDev := map[string]bool{}
	newIndex := make([]int, len(cands))
	kept := cands[:0:0]
	for i, c := range cands {
		e := c.req.entries[c.i]
		reason := ""
		switch {
		case refusedDev[e.HardwareID]:
			reason = res.lastLimit(e.HardwareID)
		case devShare < 1 && overShare(s.device[e.HardwareID]+groupDev[e.HardwareID], c.cost, devLimit):
			reason = refusedDeviceShare
		case e.Key != "" && keyShare < 1 && overShare(s.key[e.Key]+groupKey[e.Key], c.cost, keyLimit):
			reason = refusedKeyShare
		case b.opts.DeviceBatchRate >= 0 && !b.takeBatch(e.HardwareID, now):
			reason = refusedDeviceRate
		}
		if reason != "" {
			refusedDev[e.HardwareID] = true
			res.limit(e.HardwareID, reason)
			c.req.out[c.i] = Limited
			newIndex[i] = -1
			continue
		}
		if groupDev == nil {
			groupDev, groupKey = map[string]int64{}, map[string]int64{}
		}
		groupDev[e.HardwareID] += c.cost
		if e.Key != "" {
			groupKey[e.Key] += c.cost
		}
		newIndex[i] = len(kept)
		kept = append(kept, c)
	}
	if len(kept) == len(cands) {
		return cands, followers
	}
	keptFollowers := followers[:0:0]
	for _, f := range followers {
		if newIndex[f.cand] < 0 {
			f.req.out[f.i] = Limited
			res.limit(f.req.entries[f.i].HardwareID, res.lastLimit(f.req.entries[f.i].HardwareID))
			continue
		}
		f.cand = newIndex[f.cand]
		keptFollowers = append(keptFollowers, f)
	}
	return kept, keptFollowers
}

// overShare reports whether a device or key holding held bytes goes past
// limit with one more batch of cost bytes; one that holds nothing never
// does.
func overShare(held, cost, limit int64) bool {
	return held > 0 && held+cost > limit
}

// takeBatch spends one of hw's new-batch tokens at now and reports whether
// it had one. Buckets that have refilled are forgotten once a minute, so
// the map holds only the devices that sent recently.
func (b *Buffer) takeBatch(hw string, now time.Time) bool {
	s := &b.shares
	if now.Sub(s.pruned) >= time.Minute {
		for k, bk := range s.rates {
			if bk.full(now, b.opts.DeviceBatchRate, float64(b.opts.DeviceBatchBurst)) {
				delete(s.rates, k)
			}
		}
		s.pruned = now
	}
	bk := s.rates[hw]
	if bk == nil {
		bk = &batchBucket{tokens: float64(b.opts.DeviceBatchBurst), last: now}
		s.rates[hw] = bk
	}
	return bk.take(now, b.opts.DeviceBatchRate, float64(b.opts.DeviceBatchBurst))
}

// batchBucket is one device's token bucket of new batches.
type batchBucket struct {
	tokens float64
	last   time.Time
}

func (k *batchBucket) refill(now time.Time, rate, burst float64) {
	if now.After(k.last) {
		k.tokens = min(burst, k.tokens+now.Sub(k.last).Seconds()*rate)
		k.last = now
	}
}

func (k *batchBucket) take(now time.Time, rate, burst float64) bool {
	k.refill(now, rate, burst)
	if k.tokens < 1 {
		return false
	}
	k.tokens--
	return true
}

func (k *batchBucket) full(now time.Time, rate, burst float64) bool {
	k.refill(now, rate, burst)
	return k.tokens >= burst
}

// limit records that a batch of hw was refused for reason.
func (r *groupResult) limit(hw, reason string) {
	if r.limited == nil {
		r.limited, r.limitedDevice = map[string]int64{}, map[string]string{}
	}
	r.limited[reason]++
	r.limitedDevice[hw] = reason
}

// lastLimit is why hw's last refused batch of the group was refused.
func (r *groupResult) lastLimit(hw string) string { return r.limitedDevice[hw] }

// reportLimits counts the group's share and rate refusals and logs them,
// at most once a minute.
func (b *Buffer) reportLimits(res groupResult) {
	var n int64
	for reason, k := range res.limited {
		b.metrics.refused.WithLabelValues(reason).Add(float64(k))
		n += k
	}
	if n == 0 {
		return
	}
	if ok, suppressed := b.shareLog.allow(n); ok {
		devices := make([]string, 0, min(len(res.limitedDevice), 8))
		for hw := range res.limitedDevice {
			if len(devices) == cap(devices) {
				break
			}
			devices = append(devices, hw)
		}
		b.logger.Warn("batches refused: a device or key is past its share of the buffer or its rate of new batches "+
			"(buffer.device_share, buffer.key_share, buffer.device_batch_rate); other devices are still accepted",
			"refused", n, "hardware_ids", devices, "refused_before", suppressed,
			"device_share", b.opts.DeviceShare, "key_share", b.opts.KeyShare,
			"device_batch_rate", b.opts.DeviceBatchRate)
	}
}

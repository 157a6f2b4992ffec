package audit

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"greenhouse-gateway/firmware-contract"
)

// SourceOther is the source of an aggregate that folds the attempts of
// the keys beyond Config.MaxAggregateKeys in one interval.
const SourceOther = "other"

// maxOverflowKeys bounds the "other" aggregates of one interval (one per
// reason, transport and kind, which the gateway's code chooses); beyond
// it everything folds into a single one.
const maxOverflowKeys = 64

// clockStep is how far back a record's time may be from the latest seen
// before the bucket takes it for the clock being set back (records of
// concurrent callers arrive slightly out of order).
const clockStep = time.Second

// aggKey is what an aggregate counts attempts by.
type aggKey struct {
	reason, transport, kind, source, hardwareID string
}

// aggCount is one key's attempts in the current interval.
type aggCount struct {
	n           int64
	first, last time.Time
}

// aggregator lets records through one by one up to a rate (a token
// bucket of Config.MaxRecordsPerSecond and Config.BurstRecords) and counts
// the rest per key until the writer takes them as aggregates. Its memory
// is bounded by Config.MaxAggregateKeys + maxOverflowKeys + 1 keys of
// bounded size.
type aggregator struct {
	rate, burst float64
	maxKeys     int

	mu       sync.Mutex
	tokens   float64
	refilled time.Time
	counts   map[aggKey]*aggCount
}

func newAggregator(cfg Config) *aggregator {
	return &aggregator{rate: float64(cfg.MaxRecordsPerSecond), burst: float64(cfg.BurstRecords),
		maxKeys: cfg.MaxAggregateKeys, tokens: float64(cfg.BurstRecords), counts: map[aggKey]*aggCount{}}
}

// admit reports whether rec (its Time set) may be written on its own;
// when not, it is counted in its aggregate.
func (a *aggregator) admit(rec *Record) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refilled.IsZero() {
		a.refilled = rec.Time
	}
	switch elapsed := rec.Time.Sub(a.refilled); {
	case elapsed > 0:
		a.tokens = min(a.burst, a.tokens+elapsed.Seconds()*a.rate)
		a.refilled = rec.Time
	case elapsed < -clockStep:
		a.refilled = rec.Time // the clock was set back: refill from here
	}
	if a.tokens >= 1 {
		a.tokens--
		return true
	}
	c := a.countFor(rec)
	c.n++
	if c.first.IsZero() || rec.Time.Before(c.first) {
		c.first = rec.Time
	}
	if rec.Time.After(c.last) {
		c.last = rec.Time
	}
	return false
}

// countFor returns rec's count, adding its key (or its overflow key) when
// there is room.
func (a *aggregator) countFor(rec *Record) *aggCount {
	k := aggKey{reason: reasonLabel(rec.Reason), transport: bound(rec.Transport, 16), kind: bound(rec.Kind, 16),
		source: sourceOf(rec.RemoteAddr)}
	if contract.ValidHardwareID(rec.HardwareID) == nil {
		k.hardwareID = rec.HardwareID
	}
	if c := a.counts[k]; c != nil {
		return c
	}
	if len(a.counts) >= a.maxKeys {
		k.source, k.hardwareID = SourceOther, ""
		if c := a.counts[k]; c != nil {
			return c
		}
		if len(a.counts) >= a.maxKeys+maxOverflowKeys {
			k = aggKey{reason: "other", transport: "other", kind: "other", source: SourceOther}
			if c := a.counts[k]; c != nil {
				return c
			}
		}
	}
	// Copies: a key holds no reference into a payload.
	k = aggKey{reason: k.reason, transport: strings.Clone(k.transport), kind: strings.Clone(k.kind), source: k.source,
		hardwareID: strings.Clone(k.hardwareID)}
	c := &aggCount{}
	a.counts[k] = c
	return c
}

// bound is s truncated to n bytes as Record's fields are, without a
// copy when it is short enough.
func bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return truncate(s, n)
}

// take returns the interval's aggregates (without a Time), largest
// first, and starts the next interval.
func (a *aggregator) take() []Record {
	a.mu.Lock()
	counts := a.counts
	a.counts = map[aggKey]*aggCount{}
	a.mu.Unlock()
	out := make([]Record, 0, len(counts))
	for k, c := range counts {
		out = append(out, Record{Transport: k.transport, Kind: k.kind, HardwareID: k.hardwareID,
			Reason: k.reason, Source: k.source, Aggregated: true, Count: c.n, First: c.first.UTC(), Last: c.last.UTC(),
			Message: fmt.Sprintf("%d attempts from %s, recorded together (over audit.max_records_per_second)", c.n, k.source)})
	}
	slices.SortFunc(out, func(x, y Record) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Source, y.Source), cmp.Compare(x.Reason, y.Reason),
			cmp.Compare(x.HardwareID, y.HardwareID), cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Transport, y.Transport))
	})
	return out
}

// pendingKeys is how many keys the current interval holds.
func (a *aggregator) pendingKeys() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.counts)
}

// sourceOf is the source an aggregate names for a remote address: the
// IPv4 address, or the IPv6 /64 prefix (one subscriber's network), or
// "unknown".
func sourceOf(remote string) string {
	var addr netip.Addr
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		addr = ap.Addr()
	} else if a, err := netip.ParseAddr(remote); err == nil {
		addr = a
	} else {
		return "unknown"
	}
	addr = addr.Unmap()
	if addr.Is4() {
		return addr.String()
	}
	p, err := addr.WithZone("").Prefix(64)
	if err != nil {
		return "unknown"
	}
	return p.String()
}

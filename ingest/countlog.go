package ingest

import (
	"sync"
	"time"
)

// countLog gathers counts by reason and hands them out for one log line at
// most once per interval, so that a flood is reported without a line per
// event.
type countLog struct {
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	last   time.Time
	counts map[string]int
}

func newCountLog(every time.Duration) *countLog {
	return &countLog{every: every, now: time.Now, counts: map[string]int{}}
}

// add counts one event of reason and returns what take returns.
func (l *countLog) add(reason string) map[string]int {
	l.count(reason)
	return l.take()
}

// count counts one event of reason.
func (l *countLog) count(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts[reason]++
}

// take returns every count gathered since the last line when a line is due
// now, else nil.
func (l *countLog) take() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		return nil
	}
	out := l.counts
	l.counts, l.last = map[string]int{}, now
	return out
}

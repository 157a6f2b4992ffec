package logpace

import (
	"sync"
	"time"
)

// Interval is the least time between two log lines about one flood of
// refusals (connection admission, identity refusals): a line at once, then
// one a minute at most with the count of the others.
const Interval = time.Minute

// Log gathers counts by reason and hands them out for one log line at
// most once per interval, so that a flood is reported without a line per
// event.
type Log struct {
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	last   time.Time
	counts map[string]int
}

// New returns a Log handing out its counts once per every at most.
func New(every time.Duration) *Log {
	return &Log{every: every, now: time.Now, counts: map[string]int{}}
}

// Add counts one event of reason and returns what Take returns.
func (l *Log) Add(reason string) map[string]int {
	l.Count(reason)
	return l.Take()
}

// Count counts one event of reason.
func (l *Log) Count(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts[reason]++
}

// Take returns every count gathered since the last line when a line is due
// now, else nil.
func (l *Log) Take() map[string]int {
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

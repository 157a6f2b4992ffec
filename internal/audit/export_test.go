package audit

// SetFreeSpace replaces how l reads its file system's free bytes.
func SetFreeSpace(l *Log, free func() (uint64, bool)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.free = free
}

// PendingAggregateKeys is how many keys the current interval counts.
func PendingAggregateKeys(l *Log) int { return l.agg.pendingKeys() }

// WriteAggregates writes the current interval's aggregates now.
func WriteAggregates(l *Log) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeAggregatesLocked()
}

// SummarizeLost logs the dropped attempts now, as Run does once a minute.
func SummarizeLost(l *Log) { l.summarizeLost() }

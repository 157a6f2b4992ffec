// Package syncbuf is an io.Writer that collects a child process's or a
// logger's output for several goroutines: tests and the test-service
// helpers read it back when something fails.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer keeps what is written to it, or only the last Max bytes when Max
// is positive. It is safe for concurrent use; the zero value keeps
// everything.
type Buffer struct {
	Max int

	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p, dropping the oldest bytes beyond Max. It never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if extra := b.buf.Len() - b.Max; b.Max > 0 && extra > 0 {
		b.buf.Next(extra)
	}
	return len(p), nil
}

// String returns what is kept.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

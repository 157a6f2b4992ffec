package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
)

var (
	markerPrefix = []byte("b/")
	queuePrefix  = []byte("q/")
	expiryPrefix = []byte("e/")
	deadPrefix   = []byte("x/")
	statePrefix  = []byte("s/")
	seqKey       = []byte("m/seq")
)

func markerKey(batchID string) []byte { return append(append([]byte{}, markerPrefix...), batchID...) }
func deadKey(batchID string) []byte   { return append(append([]byte{}, deadPrefix...), batchID...) }
func stateKey(name string) []byte     { return append(append([]byte{}, statePrefix...), name...) }

func queueKey(seq uint64) []byte {
	k := make([]byte, len(queuePrefix)+8)
	copy(k, queuePrefix)
	binary.BigEndian.PutUint64(k[len(queuePrefix):], seq)
	return k
}

func parseQueueKey(k []byte) (uint64, bool) {
	if len(k) != len(queuePrefix)+8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k[len(queuePrefix):]), true
}

func expiryKey(deliveredAt time.Time, batchID string) []byte {
	k := make([]byte, len(expiryPrefix)+8, len(expiryPrefix)+8+len(batchID))
	copy(k, expiryPrefix)
	binary.BigEndian.PutUint64(k[len(expiryPrefix):], uint64(max(deliveredAt.UnixMilli(), 0)))
	return append(k, batchID...)
}

type markerState byte

const (
	statePending   markerState = 1
	stateDelivered markerState = 2
	stateDead      markerState = 3
)

func (s markerState) String() string {
	switch s {
	case statePending:
		return "pending"
	case stateDelivered:
		return "delivered"
	case stateDead:
		return "dead"
	}
	return fmt.Sprintf("state(%d)", byte(s))
}

// marker is the per-batch_id record: 1 byte state, 32 bytes payload hash,
// 8 bytes queue sequence, 8 bytes receive time and 8 bytes delivery (or
// dead-letter) time, both in Unix milliseconds.
type marker struct {
	state      markerState
	hash       [32]byte
	seq        uint64
	receivedAt time.Time
	doneAt     time.Time
}

const markerSize = 1 + 32 + 8 + 8 + 8

func (m marker) encode() []byte {
	v := make([]byte, markerSize)
	v[0] = byte(m.state)
	copy(v[1:33], m.hash[:])
	binary.BigEndian.PutUint64(v[33:41], m.seq)
	binary.BigEndian.PutUint64(v[41:49], uint64(m.receivedAt.UnixMilli()))
	var done int64
	if !m.doneAt.IsZero() {
		done = m.doneAt.UnixMilli()
	}
	binary.BigEndian.PutUint64(v[49:57], uint64(done))
	return v
}

func decodeMarker(v []byte) (marker, error) {
	if len(v) != markerSize {
		return marker{}, fmt.Errorf("marker has %d bytes, want %d", len(v), markerSize)
	}
	m := marker{state: markerState(v[0]), seq: binary.BigEndian.Uint64(v[33:41]),
		receivedAt: time.UnixMilli(int64(binary.BigEndian.Uint64(v[41:49])))}
	copy(m.hash[:], v[1:33])
	if done := int64(binary.BigEndian.Uint64(v[49:57])); done != 0 {
		m.doneAt = time.UnixMilli(done)
	}
	if m.state < statePending || m.state > stateDead {
		return marker{}, fmt.Errorf("marker has unknown state %d", v[0])
	}
	return m, nil
}

// encodePending encodes a queue entry: 2 bytes length and the batch_id,
// 2 bytes length and the hardware_id, 8 bytes receive time in Unix
// milliseconds, then the payload.
func encodePending(p Pending) []byte {
	v := make([]byte, 0, 2+len(p.BatchID)+2+len(p.HardwareID)+8+len(p.Payload))
	v = binary.BigEndian.AppendUint16(v, uint16(len(p.BatchID)))
	v = append(v, p.BatchID...)
	v = binary.BigEndian.AppendUint16(v, uint16(len(p.HardwareID)))
	v = append(v, p.HardwareID...)
	v = binary.BigEndian.AppendUint64(v, uint64(p.ReceivedAt.UnixMilli()))
	return append(v, p.Payload...)
}

var errShortEntry = errors.New("truncated queue entry")

func decodePending(seq uint64, v []byte) (Pending, error) {
	p := Pending{Seq: seq}
	str := func() (string, bool) {
		if len(v) < 2 {
			return "", false
		}
		n := int(binary.BigEndian.Uint16(v))
		if len(v) < 2+n {
			return "", false
		}
		s := string(v[2 : 2+n])
		v = v[2+n:]
		return s, true
	}
	var ok bool
	if p.BatchID, ok = str(); !ok {
		return p, errShortEntry
	}
	if p.HardwareID, ok = str(); !ok {
		return p, errShortEntry
	}
	if len(v) < 8 {
		return p, errShortEntry
	}
	p.ReceivedAt = time.UnixMilli(int64(binary.BigEndian.Uint64(v)))
	p.Payload = append([]byte(nil), v[8:]...)
	return p, nil
}

// recount recomputes the pending counters from disk.
func (b *Buffer) recount() {
	var n, bytes int64
	err := b.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: queuePrefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
			bytes += it.Item().ValueSize()
		}
		return nil
	})
	if err != nil {
		b.logger.Error("recounting pending batches", "err", err)
		return
	}
	b.pendingBatches.Store(n)
	b.pendingBytes.Store(bytes)
}

// freeSpace reads the data directory's free bytes at most once a second.
type freeSpace struct {
	dir  string
	mu   sync.Mutex
	at   time.Time
	free uint64
	ok   bool
}

func (f *freeSpace) bytes() (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.at) < time.Second {
		return f.free, f.ok
	}
	f.at = time.Now()
	var st syscall.Statfs_t
	if err := syscall.Statfs(f.dir, &st); err != nil {
		f.ok = false
		return 0, false
	}
	f.free, f.ok = uint64(st.Bavail)*uint64(st.Bsize), true
	return f.free, f.ok
}

// badgerLogger sends Badger's log lines to slog; its info chatter goes to
// debug and its debug lines are dropped.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) { b.l.Error(strings.TrimSpace(fmt.Sprintf(f, a...))) }
func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn(strings.TrimSpace(fmt.Sprintf(f, a...)))
}
func (b badgerLogger) Infof(f string, a ...any) { b.l.Debug(strings.TrimSpace(fmt.Sprintf(f, a...))) }
func (b badgerLogger) Debugf(string, ...any)    {}

package buffer

import (
	"encoding/binary"
	"errors"
	"fmt"
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
	p, err := decodePendingHeader(seq, v)
	if err != nil {
		return p, err
	}
	p.Payload = append([]byte(nil), v[pendingHeaderLen(p):]...)
	return p, nil
}

func pendingHeaderLen(p Pending) int { return 2 + len(p.BatchID) + 2 + len(p.HardwareID) + 8 }

// decodePendingHeader decodes a queue entry without its payload.
func decodePendingHeader(seq uint64, v []byte) (Pending, error) {
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
	return p, nil
}

func markerIn(txn *badger.Txn, batchID string) (marker, bool, error) {
	item, err := txn.Get(markerKey(batchID))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return marker{}, false, nil
	}
	if err != nil {
		return marker{}, false, fmt.Errorf("reading marker of %s: %w", batchID, err)
	}
	var m marker
	err = item.Value(func(v []byte) error {
		m, err = decodeMarker(v)
		return err
	})
	if err != nil {
		return marker{}, false, fmt.Errorf("reading marker of %s: %w", batchID, err)
	}
	return m, true, nil
}

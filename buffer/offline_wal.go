package buffer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// walScan is what replaying a write-ahead log finds.
type walScan struct {
	// validEnd is where Badger truncates the log: the end of the last
	// complete transaction.
	validEnd int
	// txns counts the complete transactions; minVersion and maxVersion are
	// their commit timestamps.
	txns                   int
	minVersion, maxVersion uint64
	// tornBytes is how many bytes a torn tail holds (dropped, normal).
	tornBytes int
	// problem says why the log is damaged, or "".
	problem string
}

// walEntry is one entry of a write-ahead log (memtable.go encodeEntry:
// header, key with version, value, CRC-32C of all three).
type walEntry struct {
	meta  byte
	key   []byte
	value []byte
	size  int
}

// Why reading an entry stopped.
const (
	walOK = iota
	walBad
	walEOF
	walMalformed // Badger fails the open (binary.ReadUvarint overflow)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func readWALEntry(data []byte, off int) (walEntry, int) {
	var e walEntry
	if off+2 > len(data) {
		return e, walEOF
	}
	e.meta = data[off]
	p := off + 2
	var lens [3]uint64
	for i := range lens {
		v, n := binary.Uvarint(data[p:])
		if n == 0 {
			return e, walEOF
		}
		if n < 0 {
			return e, walMalformed
		}
		lens[i] = v
		p += n
	}
	klen, vlen := lens[0], lens[1]
	if klen > walMaxKeyLen {
		return e, walBad
	}
	if vlen > uint64(len(data)) || p+int(klen)+int(vlen)+4 > len(data) {
		return e, walEOF
	}
	end := p + int(klen) + int(vlen)
	if crc32.Checksum(data[off:end], castagnoli) != binary.BigEndian.Uint32(data[end:]) {
		return e, walBad
	}
	e.key, e.value = data[p:p+int(klen)], data[p+int(klen):end]
	e.size = end + 4 - off
	if klen == 0 {
		return e, walBad // Badger stops at an empty key (Entry.isZero)
	}
	return e, walOK
}

// entryVersion is the commit timestamp an entry belongs to.
func entryVersion(e walEntry) uint64 {
	if e.meta&walBitFinTxn != 0 {
		v, _ := strconv.ParseUint(string(e.value), 10, 64)
		return v
	}
	return parseTs(e.key)
}

// scanWAL replays a .mem file as Badger does (memtable.go logFile.iterate)
// and classifies what lies after the point where the replay stops.
//
// Badger writes a transaction's entries into the mmapped file and msyncs
// it before the commit returns; the next transaction starts only after
// that. A crash can therefore leave, after the last complete transaction,
// only part of one transaction — a prefix of it (process killed mid-copy),
// or for a power cut during its msync any subset of its sectors, the rest
// as last synced: zero, since the log is preallocated — and zeros beyond. That tail is dropped and is normal: its
// commit had not returned, so no batch in it was acknowledged. Anything
// else is damage, because acknowledged commits would be dropped with it:
//   - a checksummed entry of a different transaction after the stop point,
//   - a complete transaction after unreadable bytes that hold no sector
//     left unwritten (bytes that were written and then damaged, not never
//     written; see hasUnwrittenSector),
//   - non-zero bytes further than one transaction from the stop point,
//   - a file that ends inside its data (cut short).
func scanWAL(path string) (walScan, error) {
	s := walScan{minVersion: math.MaxUint64}
	data, err := readWAL(path)
	if err != nil || len(data) == 0 {
		return s, err
	}
	if len(data) < walHeaderSize {
		s.problem = fmt.Sprintf("has %d bytes, less than its header: it was cut short", len(data))
		return s, nil
	}
	off, open, stop := s.replay(data)
	if stop == walMalformed {
		s.problem = fmt.Sprintf("has a malformed entry at offset %d", off)
		return s, nil
	}
	s.checkTail(data, off, open, stop)
	return s, nil
}

// readWAL reads a whole .mem file. An empty file is a new log whose size
// was never synced (the file system made its name durable, not its
// length): nothing in it was acknowledged, since every commit syncs the
// log, and Open removes it.
func readWAL(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading write-ahead log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading write-ahead log: %w", err)
	}
	// Read, not mapped: a write-ahead log is sparse past its last entry,
	// and on a full tmpfs a mapped read of a hole is a SIGBUS.
	data := make([]byte, int(fi.Size()))
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("reading write-ahead log %s: %w", filepath.Base(path), err)
	}
	return data, nil
}

// replay reads complete transactions from the header on, as Badger's
// replay does, up to the first entry that fails: it records them in s and
// returns where it stopped, the commit timestamp of the transaction it
// was reading there (0: none), and why it stopped.
func (s *walScan) replay(data []byte) (off int, open uint64, stop int) {
	off = walHeaderSize
	s.validEnd = off
	for {
		e, st := readWALEntry(data, off)
		if st != walOK {
			return off, open, st
		}
		switch {
		case e.meta&walBitTxn != 0:
			ts := parseTs(e.key)
			if open == 0 {
				open = ts
			}
			if ts != open {
				return off, open, walBad
			}
		case e.meta&walBitFinTxn != 0:
			if entryVersion(e) != open {
				return off, open, walBad
			}
			s.txns++
			s.minVersion, s.maxVersion = min(s.minVersion, open), max(s.maxVersion, open)
			open = 0
			s.validEnd = off + e.size
		default:
			if open != 0 {
				return off, open, walBad
			}
			ts := parseTs(e.key)
			s.minVersion, s.maxVersion = min(s.minVersion, ts), max(s.maxVersion, ts)
			s.validEnd = off + e.size
		}
		off += e.size
	}
}

// checkTail classifies what lies after the point off where the replay
// stopped (stop, inside transaction open), and sets s.tornBytes for a torn
// tail or s.problem for damage (see scanWAL).
func (s *walScan) checkTail(data []byte, off int, open uint64, stop int) {
	size := len(data)
	lastNonZero := max(bytes.LastIndexFunc(data, func(r rune) bool { return r != 0 }), 0)
	// Badger's own truncation after a replay leaves the file ending exactly
	// at a transaction; a file ending inside data was cut. (A torn entry in
	// a live log does not run past the end: the log is preallocated to
	// twice the memtable and zero beyond what was written.)
	if stop == walEOF || off >= size || lastNonZero == size-1 {
		if s.validEnd != size {
			s.problem = fmt.Sprintf("ends at offset %d inside a transaction that starts at offset %d: it was cut short",
				size, s.validEnd)
		}
		return
	}
	if lastNonZero < s.validEnd {
		return // clean: zeros after the last transaction
	}
	s.tornBytes = lastNonZero + 1 - s.validEnd
	// One transaction is at most 15% of a memtable (Badger's maxBatchSize)
	// plus entry headers; a live log is two memtables long.
	window := size*3/20 + 2*sectorSize
	if s.tornBytes > window {
		s.problem = fmt.Sprintf("has %d bytes of unreadable data after offset %d, more than one transaction: "+
			"committed transactions would be dropped", s.tornBytes, s.validEnd)
		return
	}
	later := entriesAfter(data, off, lastNonZero, open)
	switch {
	case len(later.versions) > 1:
		s.problem = fmt.Sprintf("is damaged at offset %d: Badger's replay stops there, but checksummed entries "+
			"of later transactions follow; they would be dropped", off)
	case later.first >= 0 && later.fin && open == 0 && !hasUnwrittenSector(data, off, later.first):
		s.problem = fmt.Sprintf("is damaged at offset %d: a complete transaction follows unreadable bytes "+
			"that were written, not left unwritten by a crash; it would be dropped", off)
	}
}

// tailEntries is what entriesAfter finds after the replay's stop point.
type tailEntries struct {
	// versions holds the commit timestamps of the checksummed entries
	// found, and of the transaction open at the stop point.
	versions map[uint64]bool
	// first is the offset of the first checksummed entry found (-1: none).
	first int
	// fin is set when a transaction's closing entry was found.
	fin bool
}

// entriesAfter looks for checksummed entries from offset from to offset
// to (inclusive), stepping byte by byte over what does not read as one;
// open is the transaction the replay stopped in (0: none).
func entriesAfter(data []byte, from, to int, open uint64) tailEntries {
	t := tailEntries{versions: map[uint64]bool{}, first: -1}
	if open != 0 {
		t.versions[open] = true
	}
	for p := from; p <= to; {
		e, st := readWALEntry(data, p)
		if st != walOK {
			p++
			continue
		}
		if t.first < 0 {
			t.first = p
		}
		t.versions[entryVersion(e)] = true
		t.fin = t.fin || e.meta&walBitFinTxn != 0
		p += e.size
	}
	return t
}

// hasUnwrittenSector reports whether data[from:to], the unreadable bytes
// between the last complete transaction and a later checksummed one, holds
// what a sector left unwritten by a power cut looks like: zeros from from
// to the next sector boundary (the part of the transaction that shared a
// sector with the synced one before it, reverted to what was synced), or a
// whole aligned sector of zeros. A disk persists any subset of the sectors
// written since the last sync; bytes that were written and later damaged
// are not zero.
func hasUnwrittenSector(data []byte, from, to int) bool {
	zero := func(a, b int) bool {
		return bytes.IndexFunc(data[a:b], func(r rune) bool { return r != 0 }) < 0
	}
	first := (from/tornSectorSize + 1) * tornSectorSize
	if from%tornSectorSize != 0 && first <= to && zero(from, first) {
		return true
	}
	for p := (from + tornSectorSize - 1) / tornSectorSize * tornSectorSize; p+tornSectorSize <= to; p += tornSectorSize {
		if zero(p, p+tornSectorSize) {
			return true
		}
	}
	return false
}

package buffer

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// salvageBatches is how many batches the salvage tests' buffers hold, of
// which the first salvageDelivered are delivered.
const (
	salvageBatches   = 2000
	salvageDelivered = 100
)

// salvageSource builds a buffer of salvageBatches batches of 1,000
// incompressible bytes (several tables, and with crashed a write-ahead log
// of the last ones), the first salvageDelivered delivered (their queue
// entries deleted), and returns its directory (a copy of the live files
// with crashed, the closed directory without) and the pending batch_ids in
// queue order.
func salvageSource(t *testing.T, crashed bool) (string, []string) {
	t.Helper()
	b := open(t, t.TempDir(), smallOptions)
	var ids []string
	for g := 0; g < salvageBatches; g += 50 {
		var entries []Entry
		for i := g; i < g+50; i++ {
			e := entry(fmt.Sprintf("batch-%05d", i), "")
			e.Payload = incompressible(i)[:1000]
			entries = append(entries, e)
			ids = append(ids, e.BatchID)
		}
		commit(t, b, entries...)
	}
	pend, err := b.Pending(0, salvageDelivered)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pend))
	waitForTables(t, b.dir, 2)
	if crashed {
		return copyDir(t, b.dir), ids[salvageDelivered:]
	}
	dir := b.dir
	require.NoError(t, b.Close())
	return dir, ids[salvageDelivered:]
}

// dirDigest is every file's name and SHA-256.
func dirDigest(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = sha256.Sum256(raw)
	}
	return out
}

// readAll reads dir's tables and logs as Salvage does, for the tests to
// know where each record was.
func readAll(t *testing.T, dir string) *salvageReader {
	t.Helper()
	r := &salvageReader{keys: map[string]salvaged{}, report: &SalvageReport{}}
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	for _, p := range tables {
		r.readTable(p, defaultCompressed)
	}
	mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	for _, p := range mems {
		require.NoError(t, r.readLog(p))
	}
	return r
}

// queuedFrom returns the pending batch_ids whose queue entry was read only
// from places for which in is true.
func queuedFrom(t *testing.T, r *salvageReader, pending []string, in func(from string) bool) map[string]bool {
	t.Helper()
	want := map[string]bool{}
	for _, id := range pending {
		want[id] = true
	}
	out := map[string]bool{}
	for k, v := range r.keys {
		if !strings.HasPrefix(k, string(queuePrefix)) || v.deleted || slices.ContainsFunc(v.from, func(f string) bool { return !in(f) }) {
			continue
		}
		p, err := decodePendingHeader(0, v.value)
		require.NoError(t, err)
		if want[p.BatchID] {
			out[p.BatchID] = true
		}
	}
	return out
}

// salvageAndCheck salvages dir, checks that dir is unchanged and that the
// new buffer opens holding exactly want (in order), and returns the report.
func salvageAndCheck(t *testing.T, dir string, want []string) SalvageReport {
	t.Helper()
	rep := salvageAndCheckSubset(t, dir, want, func(SalvageReport) map[string]bool { return nil })
	t.Logf("recovered %d pending batches; skipped %+v; lost by marker %d", rep.PendingBatches, rep.Skipped, rep.LostCount)
	return rep
}

func without(ids []string, lost map[string]bool) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return lost[id] })
}

func TestSalvageHealthyBufferRecoversEveryPendingBatch(t *testing.T) {
	dir, pending := salvageSource(t, true)
	rep := salvageAndCheck(t, dir, pending)
	require.Empty(t, rep.Skipped)
	require.Zero(t, rep.LostCount)
}

func TestSalvageDamagedTableCostsOnlyItsBlock(t *testing.T) {
	dir, pending := salvageSource(t, false)
	healthy := readAll(t, dir)
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	slices.SortFunc(tables, func(a, b string) int { return int(size(t, b) - size(t, a)) })
	victim := tables[0]
	junk := make([]byte, 64)
	for i := range junk {
		junk[i] = byte(i*37 + 1)
	}
	writeAt(t, victim, size(t, victim)/2, junk)
	requireDamaged(t, copyDir(t, dir), filepath.Base(victim))

	rep := salvageAndCheckSubset(t, dir, pending, func(rep SalvageReport) map[string]bool {
		require.Len(t, rep.Skipped, 1, "one block skipped")
		s := rep.Skipped[0]
		require.Equal(t, filepath.Base(victim), s.File)
		require.GreaterOrEqual(t, s.Block, 0)
		block := fmt.Sprintf("%s block %d", s.File, s.Block)
		lost := queuedFrom(t, healthy, pending, func(from string) bool { return from == block })
		require.NotEmpty(t, lost, "the damaged block held pending batches")
		require.Less(t, len(lost), 20, "a 16 KiB block holds at most 16 batches of 1,000 bytes")
		t.Logf("64 bytes changed in %s: block %d skipped, %d of %d pending batches lost", s.File, s.Block, len(lost), len(pending))
		return lost
	})
	require.LessOrEqual(t, rep.LostCount, 20)
}

// salvageAndCheckSubset is salvageAndCheck for damage whose cost the
// report tells: lost computes the batches lost from the report.
func salvageAndCheckSubset(t *testing.T, dir string, pending []string, lost func(SalvageReport) map[string]bool) SalvageReport {
	t.Helper()
	return salvageAndCheckChange(t, dir, pending, func(rep SalvageReport) (map[string]bool, []string) { return lost(rep), nil })
}

// salvageAndCheckChange is salvageAndCheckSubset for damage that also
// loses deletions: change returns the batches lost and the delivered
// batches that come back (their queue entry's deletion and their
// delivered marker both lost).
func salvageAndCheckChange(t *testing.T, dir string, pending []string,
	change func(SalvageReport) (map[string]bool, []string)) SalvageReport {
	t.Helper()
	before := dirDigest(t, dir)
	out := filepath.Join(t.TempDir(), "salvaged")
	rep, err := Salvage(context.Background(), dir, out, nil)
	require.NoError(t, err)
	require.Equal(t, before, dirDigest(t, dir), "the damaged directory is not changed")
	gone, back := change(rep)
	want := append(without(pending, gone), back...)
	slices.Sort(want) // batch-00000 ... in queue order
	b, err := Open(out, Options{}, nil, nil)
	require.NoError(t, err, "the salvaged buffer opens")
	defer func() { require.NoError(t, b.Close()) }()
	pend, err := b.Pending(0, len(want)+10)
	require.NoError(t, err)
	var got []string
	for _, p := range pend {
		got = append(got, p.BatchID)
	}
	requireIDs(t, want, got)
	require.Equal(t, len(want), rep.PendingBatches)
	for _, id := range rep.LostBatches {
		require.True(t, gone[id], "a batch reported lost was lost: %s", id)
	}
	return rep
}

func TestSalvageTableCutToHalfCostsTheTable(t *testing.T) {
	dir, pending := salvageSource(t, false)
	healthy := readAll(t, dir)
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	slices.SortFunc(tables, func(a, b string) int { return int(size(t, b) - size(t, a)) })
	victim := tables[0]
	require.NoError(t, os.Truncate(victim, size(t, victim)/2))
	name := filepath.Base(victim)
	salvageAndCheckSubset(t, dir, pending, func(rep SalvageReport) map[string]bool {
		require.Len(t, rep.Skipped, 1)
		require.Equal(t, SkippedPart{File: name, Block: -1, Reason: rep.Skipped[0].Reason}, rep.Skipped[0])
		lost := queuedFrom(t, healthy, pending, func(from string) bool { return strings.HasPrefix(from, name+" ") })
		require.NotEmpty(t, lost)
		t.Logf("%s cut to half: %d of %d pending batches lost", name, len(lost), len(pending))
		return lost
	})
}

// walEntryEnds maps "FILE offset N", an entry's place as salvage names
// it, to the offset where the entry ends.
func walEntryEnds(t *testing.T, mem string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(mem)
	require.NoError(t, err)
	out := map[string]int{}
	for off := walHeaderSize; ; {
		e, st := readWALEntry(data, off)
		if st != walOK {
			return out
		}
		out[fmt.Sprintf("%s offset %d", filepath.Base(mem), off)] = off + e.size
		off += e.size
	}
}

// walTxns returns the end offsets of the complete transactions of a log.
func walTxns(t *testing.T, mem string) []int {
	t.Helper()
	data, err := os.ReadFile(mem)
	require.NoError(t, err)
	var ends []int
	for off := walHeaderSize; ; {
		e, st := readWALEntry(data, off)
		if st != walOK {
			return ends
		}
		off += e.size
		if e.meta&walBitFinTxn != 0 {
			ends = append(ends, off)
		}
	}
}

func TestSalvageWriteAheadLogCutInsideATransaction(t *testing.T) {
	dir, pending := salvageSource(t, true)
	healthy := readAll(t, dir)
	mem := file(t, dir, ".mem")
	ends := walTxns(t, mem)
	require.Greater(t, len(ends), 4, "the log holds several commits")
	// Cut 100 bytes into the transaction after the middle one.
	cut := ends[len(ends)/2] + 100
	entries := walEntryEnds(t, mem)
	require.NoError(t, os.Truncate(mem, int64(cut)))
	name := filepath.Base(mem)
	// The delivery of the first batches is the log's last transaction:
	// the cut loses their queue entries' deletions and their delivered
	// markers, so they come back (the uplink's markers make forwarding
	// them again harmless).
	first := healthy.keys[string(queueKey(1))] // sequence numbers start at 1
	require.True(t, first.deleted)
	require.Equal(t, []string{name}, fromFiles(first.from))
	require.Greater(t, entries[first.from[0]], cut)
	var delivered []string
	for i := range salvageDelivered {
		delivered = append(delivered, fmt.Sprintf("batch-%05d", i))
	}
	salvageAndCheckChange(t, dir, pending, func(rep SalvageReport) (map[string]bool, []string) {
		lost := queuedFrom(t, healthy, pending, func(from string) bool {
			off, ok := entries[from]
			return ok && off > cut
		})
		require.NotEmpty(t, lost)
		require.NotEmpty(t, rep.Skipped)
		t.Logf("%s cut at %d, inside a transaction: %d of %d pending batches lost, %d delivered ones back",
			name, cut, len(lost), len(pending), len(delivered))
		return lost, delivered
	})
}

func TestSalvageWriteAheadLogDamagedInTheMiddleResynchronises(t *testing.T) {
	dir, pending := salvageSource(t, true)
	healthy := readAll(t, dir)
	mem := file(t, dir, ".mem")
	ends := walTxns(t, mem)
	require.Greater(t, len(ends), 4)
	i := len(ends) / 2
	start, end := ends[i-1], ends[i] // one transaction
	require.Greater(t, end-start, 200)
	damage := start + 100
	entries := walEntryEnds(t, mem)
	writeAt(t, mem, int64(damage), make([]byte, 64))
	name := filepath.Base(mem)
	salvageAndCheckSubset(t, dir, pending, func(rep SalvageReport) map[string]bool {
		lost := queuedFrom(t, healthy, pending, func(from string) bool {
			var off int
			_, err := fmt.Sscanf(from, name+" offset %d", &off)
			return err == nil && off <= damage && entries[from] > damage
		})
		// The zeroed bytes may fall on a queue entry (its batch is lost) or
		// on another record of the transaction (none is): either way every
		// other batch is read after the damage.
		t.Logf("64 bytes zeroed in one transaction of %s: %d of %d pending batches lost", name, len(lost), len(pending))
		return lost
	})
}

func TestSalvageWithoutTheManifest(t *testing.T) {
	dir, pending := salvageSource(t, true)
	require.NoError(t, os.Remove(filepath.Join(dir, manifestName)))
	requireDamaged(t, copyDir(t, dir), "not listed in the MANIFEST")
	rep := salvageAndCheck(t, dir, pending)
	require.Zero(t, rep.LostCount)
}

func TestSalvageRefusesAnOutputThatIsNotNew(t *testing.T) {
	dir, _ := salvageSource(t, false)
	_, err := Salvage(context.Background(), dir, dir, nil)
	require.ErrorContains(t, err, "new directory")
	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, "x"), nil, 0o600))
	_, err = Salvage(context.Background(), dir, other, nil)
	require.ErrorContains(t, err, "not empty")
}

// requireIDs compares lists of batch_ids, saying which differ.
func requireIDs(t *testing.T, want, got []string) {
	t.Helper()
	if slices.Equal(want, got) {
		return
	}
	missing := slices.DeleteFunc(slices.Clone(want), func(id string) bool { return slices.Contains(got, id) })
	extra := slices.DeleteFunc(slices.Clone(got), func(id string) bool { return slices.Contains(want, id) })
	t.Fatalf("want %d batches, got %d: missing %v, not expected %v", len(want), len(got), missing, extra)
}

// fromFiles is the files of places salvage names.
func fromFiles(from []string) []string {
	var out []string
	for _, f := range from {
		name, _, _ := strings.Cut(f, " ")
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// TestSalvageKeepsADevicesWholeBacklog: one device's backlog larger than
// the burst of its rate, and than its share, is salvaged whole.
func TestSalvageKeepsADevicesWholeBacklog(t *testing.T) {
	opts := Options{MemTableSize: 1 << 20, DeviceBatchRate: -1, DeviceShare: 1, KeyShare: 1}
	b := open(t, t.TempDir(), opts)
	n := DefaultOptions().DeviceBatchBurst + 500
	var ids []string
	for g := 0; g < n; g += 500 {
		var entries []Entry
		for i := g; i < g+500; i++ {
			entries = append(entries, entry(fmt.Sprintf("batch-%05d", i), fmt.Sprintf(`{"n":%d}`, i)))
			ids = append(ids, entries[len(entries)-1].BatchID)
		}
		commit(t, b, entries...)
	}
	dir := b.dir
	require.NoError(t, b.Close())
	salvageAndCheck(t, dir, ids)
}

// TestSalvageReadsBatchesInTheValueLog: with a 1 MiB memtable, batches
// over memtable/8 are kept in the value log, the tree holding pointers to
// them; salvage reads each through its pointer, from a closed buffer and
// from what a kill -9 leaves.
func TestSalvageReadsBatchesInTheValueLog(t *testing.T) {
	for _, crashed := range []bool{false, true} {
		b := open(t, t.TempDir(), smallOptions)
		var ids []string
		for g := range 6 {
			var entries []Entry
			for i := g * 5; i < g*5+5; i++ {
				e := entry(fmt.Sprintf("batch-%05d", i), "")
				e.Payload = slices.Concat(incompressible(i), incompressible(i+1e6))
				for len(e.Payload) < 200<<10 {
					e.Payload = append(e.Payload, incompressible(len(e.Payload)+i)...)
				}
				entries = append(entries, e)
				ids = append(ids, e.BatchID)
			}
			commit(t, b, entries...)
		}
		dir := b.dir
		if crashed {
			dir = copyDir(t, b.dir)
		} else {
			require.NoError(t, b.Close())
		}
		vlogs, _ := filepath.Glob(filepath.Join(dir, "*.vlog"))
		require.NotEmpty(t, vlogs)
		var inLog int64
		for _, v := range vlogs {
			inLog += size(t, v)
		}
		require.Greater(t, inLog, int64(len(ids))*(200<<10), "the batches are in the value log")
		rep := salvageAndCheck(t, dir, ids)
		require.Empty(t, rep.Skipped)
	}
}

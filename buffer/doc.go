// Package buffer is the gateway's durable store on the data directory: it
// owns the one Badger database there and what it keeps, the queue of
// reading batches between ingest and the uplink, the small state records
// of the device registry and the API and device keys, the history of
// delivered batches and the dead letters, and the readers of its files
// for a stopped gateway (inspection, salvage).
//
// Every reading batch a device sends is committed here, keyed by its
// batch_id, before the gateway acknowledges it (PUBACK, ack topic or HTTP
// 2xx). The uplink leases the oldest pending batches, forwards them to the
// cloud and marks them delivered; a delivered batch keeps a small marker for
// a retention window so that a device re-sending it is told "duplicate", and
// the marker is then collected. Undelivered batches leave the queue only by
// delivery, dead-lettering (a batch the cloud refuses for its content is
// kept aside with the reason), or, if the operator chose
// buffer.full_policy drop_oldest, to make room (see Capacity). An operator
// may put a dead letter back at the end of the queue (Reforward); Snapshot
// reads a stopped gateway's buffer without changing it.
//
// # Files
//
// The package's files are named after what they hold:
//
//   - buffer.go (Buffer, Open, Run, Close), options.go, memtable.go,
//     encoding.go (keys and markers), failure.go, metrics.go, ping.go,
//     cleanshutdown.go (the GATEWAY-CLEAN-SHUTDOWN record): the store as
//     a whole.
//   - queue*.go: the batch queue. queue.go (Commit, Submit, Pending,
//     MarkDelivered, Lookup, Collect), queue_commit.go (the committer:
//     group commit, the only writer of batches and state records),
//     queue_groupwait.go, queue_capacity.go (the budget and eviction),
//     queue_shares.go (device and key shares, the batch rate),
//     queue_scan.go (the counting scan at open), queue_refs.go,
//     queue_floor.go.
//   - space*.go: the disk's room. space.go (free space and the
//     watermark), space_ballast.go, space_reclaim.go.
//   - state.go: the state records (LoadState, SaveStates), saved through
//     the committer.
//   - history.go: delivered batches kept for local queries.
//   - deadletter.go: dead letters (DeadLetter, DeadLetters, Reforward).
//   - offline*.go: Badger's files read without Badger: offline_check.go
//     and offline_wal.go (the check of Badger v4.9.6's on-disk format that
//     Open runs first, DamagedError), offline_inspect.go (Snapshot, for
//     gatewayctl), offline_salvage.go (Salvage).
//
// # On-disk layout
//
// The buffer is one Badger database (github.com/dgraph-io/badger/v4) in the
// data directory. Keys are prefixed by one byte and a slash:
//
//	b/<batch_id>                  marker: state, payload hash, queue sequence,
//	                              received and delivered times (57 bytes)
//	q/<seq, 8 bytes big endian>   a pending batch: batch_id, hardware_id,
//	                              receive time and the canonical payload
//	e/<delivered ms, 8 bytes><batch_id>
//	                              collection index of delivered markers
//	h/<hardware_id>\x00<first reading ms, 8 bytes big endian><batch_id>
//	                              a delivered batch kept for local queries:
//	                              the q/ header, delivery time, first and
//	                              last reading time, then the payload
//	y/<delivered ms, 8 bytes><batch_id>
//	                              collection index of h/: the h/ value's
//	                              length (4 bytes) and the h/ key
//	x/<batch_id>                  a dead-lettered batch (as q/, with the
//	                              reason between receive time and payload)
//	m/seq                         the next queue sequence number
//	s/<name>                      small gateway state (the API key cache,
//	                              the device registry)
//
// Next to Badger's files, GATEWAY-CLEAN-SHUTDOWN exists only while the
// gateway is stopped after a clean shutdown (see Damage).
//
// The queue order (seq) is arrival order, so forwarding in seq order keeps
// each device's batches in the order they were acknowledged.
//
// # History
//
// MarkDelivered moves a delivered batch's payload from its q/ entry to an
// h/ record in the same transaction that rewrites its marker, so keeping
// it costs no write or sync of its own. buffer.history_retention (default
// 24h; a negative duration turns it off) bounds how long it stays: Run
// collects expired records through the y/ index along with the expired
// markers. The h/ key orders one device's records by first reading, so
// DeviceBatches finds the records overlapping a window with one seek (back
// by the longest span of a batch kept) instead of a scan; pending batches
// are found by scanning the queue, which has no per-device index (an index
// would cost every commit a record; BenchmarkDeviceBatchesPendingScan
// measures the scan). A payload whose reading times cannot be read is not
// kept.
//
// # Capacity
//
// buffer.max_pending_bytes is a budget for everything the buffer keeps:
// pending batches and their markers, delivered markers and their
// collection index entries, history records and their index entries, dead
// letters and their markers, and state records. Each record counts as its key and value plus 32 bytes, about
// what Badger adds per record (the 8-byte version, the entry header and
// checksum, block offsets, bloom filter bits); Usage and
// gateway_buffer_used_bytes{kind} report the sum. It is a logical size:
// the files take more (the write-ahead log of the memtables, obsolete
// versions until compaction), so leave the disk room beyond the budget;
// the free-space watermark guards the disk itself.
//
// When a new batch would exceed the budget, history records go first,
// oldest delivery first (gateway_buffer_evicted_batches_total
// {reason="history_evicted"}): they only serve operators' queries. Then
// delivered markers are evicted, oldest delivery first
// (gateway_buffer_evicted_batches_total {reason="marker_evicted"}): a device re-sending such a batch is no longer
// told "duplicate" and the batch is stored and forwarded again, which the
// cloud's conditional marker absorbs. If that is not enough, the policy
// decides:
//
//   - reject_new (the default): the batch is refused with Full (MQTT: no
//     PUBACK; HTTP: 507 with Retry-After); devices keep it in their flash.
//     Undelivered batches are never deleted.
//   - drop_oldest: the oldest undelivered batches are deleted until the new
//     one fits (gateway_buffer_evicted_batches_total
//     {reason="dropped_oldest"}, and a warning per group naming the first
//     and last dropped batch). Acknowledged data is lost: choose it only
//     for devices that cannot keep data themselves. A batch larger than the
//     budget minus dead letters and state is refused, never made room for.
//
// Dead letters and state records count but are never evicted. History
// records are counted by Usage.History and gateway_buffer_used_bytes
// {kind="history"}, and the clean-shutdown record checks their number. Refusals are
// counted by gateway_buffer_refused_batches_total{reason}.
//
// buffer.min_free_bytes is a watermark on the data directory's file
// system, read with statfs for every group commit: below it every new
// batch is refused with Full, under both policies. Nothing is evicted
// then, because deleting records frees disk space only after compaction,
// too late to help. The watermark must cover what Badger may still write
// once new batches are refused. Badger writes through mmap, and on a full
// disk a write to a page of a sparse mapped file is a SIGBUS that kills the
// process, not an error. The buffer builds Badger against a copy of
// ristretto (third_party/ristretto) whose z.OpenMmapFileUsing and
// MmapFile.Truncate allocate a file's blocks with fallocate before mapping
// them, so running out of space is an ENOSPC where the file is created or
// grown, never a fault later: a memtable's write-ahead log (.mem) at twice
// the memtable size (memtable.go openMemTable), a value log file at twice
// ValueLogFileSize (value.go createVlogFile; the buffer sets it to twice
// the memtable, since only values over ValueThreshold go there). Tables
// are written with write(2), not through a mapping (table.go CreateTable,
// third_party/README.md), so a full disk fails their write with ENOSPC and
// the file is removed. After the last admitted batch
// Badger may still flush the memtables (an L0 table written before its log
// is deleted, and a new log allocated), compact L0 into the base level and
// run one more compaction at the same time (new tables written before the
// inputs are deleted), and take the small writes of delivery and state.
// Open bounds that with Badger options (at most 8 L0 tables, the stall
// limit; tables of memtable/8 between 256 KiB and 2 MiB at every level; a
// base level of 5 tables; a compaction ends the table it writes once its
// range overlaps 10 tables of the level after next, checked at every key,
// so that compacting it later takes it and at most those ten (the fork's
// patch 0009: a table that ends the markers, "b/", and starts the queue,
// "q/", would otherwise span every queue table below it, and compacting
// it would rewrite the whole queue at once), and RequiredFreeBytes adds it
// up: 15 memtables,
// 24 tables and a value log file, 176 MiB with the default 8 MiB memtable,
// 25 MiB with a 1 MiB one. Validate refuses a smaller buffer.min_free_bytes;
// the default is 256 MiB. Other programs filling the disk are outside that
// bound: then Badger's writes fail with ENOSPC (see Failing disks).
//
// The write-ahead logs are read, not mapped, by the integrity check at
// open: on a full tmpfs, a mapped read of a file's hole needs a page too.
//
// # Shares
//
// Before the budget, each new batch is checked against its device's and
// its key's share (queue_shares.go): a device (hardware_id) may hold
// buffer.device_share (1/8) of the capacity, or 1/N of the N devices seen
// (batches queued, or one stored in the last 10 minutes) when that is
// more; the devices an API key last sent for may hold buffer.key_share
// (1/2), or 1/K of the K keys with batches queued. The capacity is the
// budget, or what the buffer holds plus the disk's room above the
// watermark when that is less. A device also stores at most
// buffer.device_batch_rate new batches a second after a burst of
// buffer.device_batch_burst (a token bucket; resends cost nothing).
// Past either the batch is Limited (ingest answers buffer_full, HTTP 429),
// with the device's later batches of the group, counted by reason in
// gateway_buffer_refused_batches_total. The per-device counts are rebuilt
// from the queue entries' headers by the scan at open (100,000 batches of
// 100 devices: open 64-66 ms, against 59-63 ms without them) and follow
// every store, delivery, dead letter, drop and re-forward; a key's count
// is that of the devices it last sent for, so after a restart it counts a
// device again from the key's next batch for it.
//
// # Durability
//
// Badger runs with SyncWrites on. Verified in badger v4.9.6:
//
//   - A transaction's Commit (txn.go Txn.Commit, commitAndSend) hands its
//     entries to Badger's single writer goroutine (db.go doWrites,
//     writeRequests) and waits for it.
//   - Values of ValueThreshold bytes or more (1 MiB with the default
//     memtable, memtable/8 below 8 MiB) are first written to the mmapped
//     value log (.vlog), which is then msynced (value.go valueLog.write,
//     its deferred curlf.Sync). Badger does so for every batch of requests
//     it writes, whether or not it wrote a value there, and it only logs a
//     failure of that msync instead of returning it; the buffer watches for
//     that log line (badgerLogger) and fails the commit.
//   - The entries (small values inline, large ones as pointers into the
//     value log) are then copied into the mmapped write-ahead log of the
//     current memtable (.mem) and the log is msynced with MS_SYNC (db.go
//     writeToLSM, memtable.go memTable.SyncWAL, ristretto z.Msync): one
//     msync per transaction, even when Badger writes several transactions
//     together. On Linux msync(MS_SYNC) is fdatasync of the mapped range.
//     Commit returns after that, so a returned commit is on disk.
//   - Badger does not fsync the directory when it creates a new .mem or
//     .vlog file (z.OpenMmapFileUsing syncs it only for files created
//     empty). The buffer does: before acknowledging a group it stats the
//     data directory and fsyncs it if its entries changed since the last
//     fsync (dirSyncer), so a commit in a freshly created log is never
//     acknowledged before the log's directory entry is durable.
//   - When a memtable is full, a background goroutine writes it to an L0
//     table (table.go CreateTable: write(2), then fsync), appends the change
//     to the MANIFEST and fsyncs it (manifest.go manifestFile.addChanges),
//     and only then deletes the .mem file (memtable.go openMemTable,
//     OnClose). That path does not fsync the directory for the new table;
//     compactions do (levels.go compactBuildTables), as does Open
//     (levels.go newLevelsController). On a journaling file system (ext4,
//     xfs) the MANIFEST fsync commits the table's creation with it.
//
// Ingest uses group commit: one goroutine (the committer) takes every
// commit request waiting at the time (up to buffer.max_group_batches),
// checks each batch_id against its marker, makes room within the budget,
// writes all new batches in one transaction, commits it (the syncs above:
// one msync of the write-ahead log, one of the value log), fsyncs the
// directory if it changed, and only then answers every request of the
// group (queue_commit.go: writeGroup returns after commitDurably, and
// commitGroup answers after writeGroup). Concurrent devices therefore
// share one sync rather than paying one each, and a device is never
// acknowledged before its batch is on disk. A
// group larger than one Badger transaction allows (15% of a memtable) is
// split into several transactions, each synced, before any member is
// answered. BenchmarkCommitConcurrency measures it against one synced
// transaction per commit.
//
// With buffer.group_max_wait set, the committer may also wait a little for
// more requests before writing a group: the wait is a sigmoid of the
// smoothed rate of concurrent requests (those that arrived while another
// was waiting or being written), 0 at rate 0, half the maximum at
// buffer.group_wait_rate, and ends early when the group is full. A lone
// device never waits for itself. It is off by default: commits arriving
// during a sync already queue for the next group, so waiting mostly adds
// latency (BenchmarkCommitGroupWait measures it; cmd/bench/MEASUREMENTS.md,
// "Group commit wait", has the figures).
//
// State records (SaveStates: the device registry, the API and device
// keys) are written by the committer too, in the transaction of the group
// they join, and SaveStates returns once that group is on disk: a state
// write shares the group's sync and takes no fsync path of its own.
//
// Every write (group commits, delivery, dead-lettering, collection, state)
// holds one mutex, so that the committer's duplicate decisions, the budget
// and the eviction scans see a state no other writer changes underneath;
// Badger's conflict detection is turned off.
//
// What a power cut can lose: nothing that was acknowledged, on a disk that
// honours flushes. A batch whose commit had not returned may or may not be
// on disk; it was not acknowledged, so the device still holds it and will
// resend it, and the marker turns a resend of a batch that did reach the
// disk into a "duplicate". Such a half-written last commit (a torn tail of
// the write-ahead log) is dropped at the next start. Marking a batch
// delivered, collecting markers and evicting are synced too; losing them
// only makes the uplink send a batch again (the cloud's conditional marker
// absorbs it) or keeps a marker longer.
//
// This is tested, not only argued: TestPowerCutLosesNothingAcknowledged
// runs gatewayd on harness/faultfs, which drops everything not fsynced at
// a simulated power cut (file data since the file's last fsync or msync;
// name changes and ftruncate/fallocate sizes no fsync committed, as a
// journaling file system commits them), under MQTT and HTTP load with
// SIGKILL at random moments: 10 cuts in make test, 50 in make soak, and
// every acknowledged batch reaches the cloud exactly once with none stored
// twice. Every other cut is torn: a random half of the pages written since
// their file's last sync survive, as a disk may have written any subset of
// them when the power went. In a write-ahead log such a cut can leave the
// end of the unacknowledged last transaction after its lost beginning; the
// open check tells that from damage by what a lost write leaves (the
// sectors as last synced: zeros in a preallocated log), see scanWAL. Under
// the stricter POSIX model (only a directory fsync commits names, only a
// file's own fsync its size), a cut right after a start can leave a new
// write-ahead log or value log file empty; Open removes such files
// (removeEmptyLogs), which held nothing acknowledged.
//
// What it cannot protect against: a disk that lies about flushes, losing
// the data directory itself, a non-journaling file system losing a new L0
// table's directory entry (then the next start refuses: the MANIFEST lists
// a missing table), and a damaged last transaction of a write-ahead log:
// Badger drops it, and damage to its final entry, or a sector of it that
// reads back as zeros, cannot be told from a torn write.
//
// # Failing disks
//
// A write to the data directory that fails (Badger's commit of a
// transaction, the directory's fsync, or a memtable flush that cannot
// write its table: EIO, EROFS, EACCES, EPERM, or ENOSPC where Badger could
// not allocate a new write-ahead log) leaves Badger unsafe to use: after a
// failed fsync what the page cache holds is not known to be on disk, and a
// flush that fails is retried by Badger for ever while the memtables fill
// and every later commit waits (the buffer sees it in what Badger logs,
// badgerLogger). A memtable rotation that cannot create its write-ahead
// log keeps the full memtable (third_party/badger: upstream left none, and
// the next read crashed the process). So the first failure is final for the open buffer
// (failure.go): that group's batches are not acknowledged, every later
// write is refused with ErrFailed without calling Badger, and Failed is
// closed. gatewayd then logs one line naming the directory and the error,
// fails /readyz, and exits non-zero; systemd (Restart=on-failure) starts
// it again, which replays what the disk holds. While the disk stays
// broken, each start fails at open with the error and systemd retries
// every RestartSec: nothing acknowledged is lost, and the gateway resumes
// by itself once the disk works.
//
// A disk that turns read-only (or files made immutable) while Badger holds
// pages of its write-ahead log mapped makes the kernel refuse the next
// write to such a page with a SIGBUS, not an error. The buffer builds
// Badger from a copy (third_party/badger) whose writer goroutine, flushes
// and compactions turn that fault into an error (debug.SetPanicOnFault),
// so it ends the same way: a failed commit, one log line, a clean exit.
//
// The data directory also holds a ballast (GATEWAY-BALLAST, space_ballast.go): a
// file of 12 memtables (96 MiB by default) made when free space allows it
// on top of buffer.min_free_bytes, and deleted when another program fills
// the disk, so that Badger can still open, take the uplink's deletions and
// compact them, which is what frees the disk.
//
// # Memory
//
// Badger keeps most of its memory on the Go heap (ristretto's z.Calloc is
// a plain Go allocation without the jemalloc build tag): every memtable's
// skiplist arena, about 1.3 times buffer.memtable_size, allocated whole
// when the memtable opens; the table builders of memtable flushes and
// compactions; the block cache (buffer.block_cache_size); and the index
// and bloom filter of every table (a few KiB per table, no index cache).
// A table builder keeps every block of its table twice, as written and
// compressed, in buffers that double as they fill (2, 4, 8, ... MiB);
// Badger pools up to eight of them for its compactions, which run several
// builders at once, and a memtable flush builds its table in one buffer
// sized for the memtable, pooled for the next one (third_party/README.md):
// under sustained ingest the builders are most of the heap. Hence the
// settings:
//
//   - 16 KiB blocks, not Badger's 4 KiB: a batch of ten readings (about
//     2.4 KB) would fill a 4 KiB block alone, and the builders would hold
//     every such block twice; larger blocks also compress better, so a
//     reading takes fewer bytes of disk.
//   - 8 MiB memtables, two of them (the one being written and one being
//     flushed; Badger's default is five). Smaller memtables shrink the
//     heap, but they are flushed and compacted more often, which on two
//     cores raises the ack latency under MQTT load, not the ingest rate.
//   - Batches stay in the LSM tree (ValueThreshold, 1 MiB with the default
//     memtable, is above any batch; with a smaller memtable, memtable/8,
//     the largest batches go to the value log, whose files the reclaim
//     under the watermark collects after its Flatten). The value log
//     would keep them out of the table builders, but its space only comes
//     back through value log GC, which waits for compactions to count
//     what is garbage, values are not compressed there (about five
//     times the disk), and every value read or written stays mapped in the
//     resident set.
//
// BenchmarkIngestFootprint measures the heap and the commit rate of these
// settings against the alternatives; cmd/bench/MEASUREMENTS.md ("Badger's
// table builders under load") records the figures.
//
// Mapped files (memtable logs, tables, the value log) count in the
// resident set as the kernel pages them in, and are given back under
// memory pressure.
//
// # 32-bit machines
//
// On a 32-bit machine (armhf) every mapping shares one address space of
// 3 GiB or less: the memtable logs (twice the memtable each), the tables
// (about the data held) and the value log files, which are twice the
// memtable (16 MiB, each mapped at 32 MiB, with the default). Badger
// itself works on 32-bit ARM once the vendored ristretto's allocator moves
// to its next buffer correctly there (third_party/README.md);
// TestOn32BitARM cross-compiles this package's tests with GOARCH=arm
// GOARM=7 and runs the core ones under qemu-arm, memtable flushes and
// compactions included.
// The default budget (1 GiB) fits there; a much larger
// buffer.max_pending_bytes would not.
//
// # Damage
//
// Badger is not strict about damage it finds at open (badger v4.9.6):
//
//   - A write-ahead log (.mem) is replayed up to the first entry that fails
//     its checksum or is incomplete, and truncated there, silently
//     (memtable.go logFile.iterate, memTable.UpdateSkipList), dropping
//     every later commit with it. The same happens to the last value log
//     file (value.go valueLog.open). A deleted .mem file is not noticed.
//   - The MANIFEST is replayed up to a torn last record, which is
//     truncated (manifest.go ReplayManifestFile). Tables it does not list
//     are deleted (levels.go revertToManifest): a truncated or deleted
//     MANIFEST makes Badger delete the tables and open empty. A record
//     failing its checksum, a bad header, or a listed table that is
//     missing fail the open.
//   - Tables are opened reading only their index, which is checksummed; a
//     damaged data block is not noticed at open, and reads of it end the
//     iteration early without an error. Some truncated tables make Badger
//     panic in a goroutine of its own (table.go initBiggestAndSmallest).
//   - A value in the value log that cannot be read (a deleted file, or a
//     checksum mismatch, checked only with VerifyValueChecksum, which the
//     buffer sets) is returned empty, without an error: Badger only logs it
//     (iterator.go Item.yieldItemValue). The buffer's decoding refuses an
//     empty queue entry.
//   - A damaged KEYREGISTRY fails the open ("Encryption key mismatch").
//
// So Open checks the directory before Badger touches it (checkDirectory):
// every .mem file is replayed the way Badger does and what follows the
// stop point is classified; every table the MANIFEST lists must exist and
// pass its checksums (opened in the calling goroutine, panics recovered);
// a table the MANIFEST does not list must hold only versions found in a
// listed table or a write-ahead log, as a crash leaves it (a table
// written before its MANIFEST record), or Badger would delete data. Then,
// with Badger open, every record is read and decoded (values verified).
// Finally, if the gateway was stopped cleanly, the counts recorded at
// Close (GATEWAY-CLEAN-SHUTDOWN) must match: after a clean close nothing
// may differ, so a difference is files lost while stopped.
//
// A torn tail is not damage: Badger writes a transaction into the log and
// msyncs it before the next one starts, so a crash leaves, after the last
// complete transaction, at most part of one transaction (a prefix of it
// when the process dies, any subset of its pages when the power fails
// during its msync) and zeros beyond. Damage is anything else: a
// checksummed entry of another transaction after the stop point, a
// complete transaction after bytes that were written rather than left
// unwritten (no zero page between), non-zero bytes further than one
// transaction from the stop point, or a log that ends inside its data (cut
// short).
//
// A damaged directory is refused with a *DamagedError (errors.Is
// ErrDamaged) saying what is wrong and what to do: move the directory
// aside to start empty (undelivered batches in it are lost), or restore it
// from a backup. Checks that come before badger.Open leave the directory
// as it was, so nothing Badger would have deleted is lost.
package buffer

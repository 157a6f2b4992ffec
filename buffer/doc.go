// Package buffer is the gateway's durable store-and-forward queue.
//
// Every reading batch a device sends is committed here, keyed by its
// batch_id, before the gateway acknowledges it (PUBACK, ack topic or HTTP
// 2xx). The uplink leases the oldest pending batches, forwards them to the
// cloud and marks them delivered; a delivered batch keeps a small marker for
// a retention window so that a device re-sending it is told "duplicate", and
// the marker is then collected. Undelivered batches are never deleted by the
// buffer: only delivery or an operator's dead-lettering removes them from the
// queue.
//
// # On-disk layout
//
// The buffer is one Badger database (github.com/dgraph-io/badger/v4) in the
// data directory. Keys are prefixed by one byte and a slash:
//
//	b/<batch_id>                  marker: state, payload hash, queue sequence,
//	                              received and delivered times (41 bytes)
//	q/<seq, 8 bytes big endian>   a pending batch: batch_id, hardware_id,
//	                              receive time and the canonical payload
//	e/<delivered ms, 8 bytes><batch_id>
//	                              collection index of delivered markers
//	x/<batch_id>                  a dead-lettered batch (same encoding as q/)
//	m/seq                         the next queue sequence number
//	s/<name>                      small gateway state (the API key cache)
//
// The queue order (seq) is arrival order, so forwarding in seq order keeps
// each device's batches in the order they were acknowledged.
//
// # Durability
//
// Badger runs with SyncWrites on: a transaction's Commit returns only after
// its write-ahead log is fsynced. Ingest uses group commit: one goroutine
// (the committer) takes every commit request waiting at the time, checks
// each batch_id against its marker, writes all new batches in one
// transaction and syncs once; every request of the group is answered only
// after that sync. Concurrent devices therefore share one fsync instead of
// paying one each, and a device is never acknowledged before its batch is on
// disk. A group larger than one Badger transaction allows is split into
// several transactions, each synced, before any member is answered.
//
// Because the committer is the only goroutine that creates markers, the
// duplicate check and the write are race-free without Badger's conflict
// detection, which is turned off. Delivery and collection update markers
// that already exist, which never changes a duplicate decision.
//
// What a power cut can lose: nothing that was acknowledged. A batch whose
// commit had not returned when power failed may or may not be on disk; it
// was not acknowledged, so the device still holds it and will resend it,
// and the marker turns a resend of a batch that did reach the disk into a
// "duplicate". Marking a batch delivered is synced too, but losing that
// write would only make the uplink send the batch again, which the cloud's
// conditional marker absorbs.
//
// What it cannot protect against: a disk that lies about fsync, or losing
// the data directory itself.
package buffer

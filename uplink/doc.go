// Package uplink forwards the buffer's pending batches to the cloud, and
// owns everything between the buffer and the cloud: the forwarding rounds,
// the sinks that write them (DynamoDB transactions, bulk writes, the
// readings function on Lambda), the one settle step for every batch's
// result, and the syncing of device records and keys (Sync).
//
// Each batch goes up as one idempotent unit, as the contract says: the
// conditional processed_batches marker and the device_readings items in one
// TransactWriteItems when the endpoint's per-transaction item limit allows,
// otherwise the readings first (deterministic keys make a replay an
// identical overwrite) and the marker last. A conditional failure on the
// marker means the batch is already in the cloud and counts as delivered.
//
// Batches are forwarded in arrival order per device; devices are served
// concurrently. Every failure that can heal (network, throttling, 5xx,
// credentials, clocks, missing tables) is retried forever with capped,
// jittered backoff; nothing is dropped. After a round that got no answer
// (network, timeout), each retry is one small request (reach) before the
// next round. Only a refusal that no retry can change (DynamoDB's
// ValidationException for the batch's own items) moves the batch to the
// buffer's dead-letter area.
//
// New takes a Config and Deps and does no I/O; Uplink.Run forwards the
// batches and Uplink.Sync's Run writes the device records and keys.
package uplink

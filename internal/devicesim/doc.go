// Package devicesim simulates greenhouse ESP32 sensor devices that speak the gateway's device
// contract, over MQTT or over HTTP, the way the real firmware does.
//
// Each simulated device boots with a fresh boot_id, registers, and then builds one readings batch
// per interval. Batches go into the device's own bounded offline buffer and stay there until the
// gateway confirms them with "accepted" or "duplicate": on the ack topic for MQTT, in the
// response body for HTTP; answers are matched to batches by batch_id, and answers for batches
// the device does not hold are ignored. A "rejected" answer with reason "buffer_full", a missing
// answer (no ack within the ack timeout), a lost connection or a retryable HTTP status (429, 503,
// 507, other 5xx, a refused key) keep the batch in the buffer and retry it later with a
// jittered, capped backoff that honours Retry-After. "unknown_device" keeps the batch too and
// registers again. Any other rejection drops the batch and logs the reason, as firmware would
// for a bug on its side. A full buffer drops its oldest batch and counts it.
//
// After registering, a device holds its readings back until the registration is answered or
// the ack timeout passes. Devices stop producing after Config.Batches batches or after
// Config.Duration, then drain their buffers for at most Config.DrainTimeout; a cancelled
// context stops them at once.
//
// A batch's content is fixed when it is built and every retry sends the same content, so the
// gateway answers "duplicate" rather than "conflict" for a batch it already holds. Only
// sent_uptime_ms, the device uptime at the attempt, changes from one attempt to the next, as the
// contract defines it (the gateway leaves it out of its duplicate check).
//
// The simulator is used by "make run" and by the gateway's integration tests; the optional report
// file (see [ReportLine]) tells a test exactly which batches received a final answer.
package devicesim

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
// A device registers at every boot and on every reconnect: on devices/{hardware_id}/register
// (answered on the ack topic with "registered" and the confirmation_id), or with
// POST /v1/register (201 the first time, 200 after, the register ack as body). It holds its
// readings back until the registration is answered or the ack timeout passes, so a gateway
// that never answers does not stop the readings. A registration that was not confirmed (not
// delivered, not answered, "buffer_full") is sent again with the same backoff as batches,
// without holding readings back, until it is; one rejected for another reason is logged with
// its reason and message and not sent again before the next boot or reconnect, and readings
// go anyway. The confirmation_id is kept and logged once.
// Devices stop producing after Config.Batches batches or after Config.Duration (both counted
// over all boots), then drain their buffers for at most Config.DrainTimeout; a cancelled
// context stops them at once.
//
// With Config.RebootEvery a device reboots after that much uptime, ±20%, drawn from the seed
// per device and per boot, at most Config.Reboots times. A reboot is an ESP32 reset: the
// connection is cut (over MQTT on plain TCP, without a DISCONNECT, so the broker sees the
// connection drop), everything in RAM is lost (answers not yet handled, the batches in flight,
// the backoff), a new boot_id is drawn, seq and the uptime restart at 0 and, with
// Config.ClockSyncAfter, the clock is back in 1970 until the delay passes. The offline buffer
// is flash and survives: its batches keep their boot_id, batch_id and seq, are sent first
// (oldest first) once the new boot's registration is answered (or the ack timeout passed),
// and their sent_uptime_ms keeps counting from their own boot, so that the gateway's per-boot
// clock anchor repairs them right.
//
// Devices start with the fleet key (Config.APIKey), or with their own device key when the key
// store (Config.KeyStorePath, else memory) holds one. A register answer that carries
// device_key and device_key_id enrolls the device: it checks their form, stores the key (the
// store is its NVS; a key that cannot be stored is not used), closes its connection and
// connects again with the device key as MQTT password or HTTP bearer token, registering again
// with it. The key is never logged, only its key_id. A batch or registration refused with
// "forbidden" (the key is bound to another hardware_id) or "device_key_required" (the gateway
// wants the device's own key), and a CONNACK "not authorized", are configuration problems:
// the device logs an error that says what fixes it, keeps its batches and waits RetryMax
// before it tries again; the registration too is sent again after RetryMax, so that a device
// whose key an operator reset (gatewayctl devices reset-key) enrolls by itself then.
//
// At MQTT QoS 0 there is no PUBACK: a batch leaves the buffer only when the ack topic answers
// for its batch_id, at any QoS.
//
// A batch's content is fixed when it is built and every retry sends the same content, so the
// gateway answers "duplicate" rather than "conflict" for a batch it already holds. Only
// sent_uptime_ms, the time since the batch's boot at the attempt, changes from one attempt to
// the next, as the contract defines it (the gateway leaves it out of its duplicate check).
//
// The simulator is used by "make run" and by the gateway's integration tests; the optional report
// file (see [ReportLine]) tells a test exactly which batches received a final answer, and
// [Sim.Stats] and the final summary log line count what each device did, reboots included.
package devicesim

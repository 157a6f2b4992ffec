// Package contract is the Go form of the device contract between the ESP32
// firmware and the gateway: the payloads devices send (registration and
// reading batches), the acknowledgements the gateway sends back, the MQTT
// topics, and the validation rules. The ingest path, the uplink and the device
// simulator all use it, so a payload means the same thing everywhere.
//
// The language-neutral form of the same contract, for firmware authors, lives
// in firmware-contract/ at the root of the repository: the README in prose,
// JSON Schemas, and test vectors that this package's tests run.
//
// # Decoding
//
// [DecodeBatch] and [DecodeRegistration] are strict. They reject what
// encoding/json would quietly accept: duplicate object keys, unknown fields,
// invalid UTF-8, unpaired UTF-16 surrogates, null where a value is expected,
// integers written with a fraction or exponent, and numbers outside the range
// DynamoDB can store. Every error is an [*Error] that names the JSON path of the
// offending value and the rule it breaks, for example
//
//	readings[2].sensors.temp_c: must be a finite number, not a string
//
// and carries the [Reason] the gateway puts in the ack.
//
// Decoding runs in three passes: a syntax check over the whole payload (so a
// truncated or malformed payload is always reported as invalid JSON with its
// byte offset), a schema walk that builds the [Batch] and checks types, and the
// value rules of [Batch.Validate]. The work is linear in the payload size.
//
// # Identity
//
// [Batch.Canonical] encodes a batch deterministically; [Batch.IdentityHash]
// hashes the batch's content without the per-attempt sent_uptime_ms field and
// is what duplicate and conflict detection compare.
package contract

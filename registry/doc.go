// Package registry is the device registry: what the gateway knows of each
// device (registration and confirmation ID, boots and reboot loops,
// sequence gaps and replays, clock anchors that repair device timestamps,
// session takeovers), kept in memory and saved in the buffer's state
// records. It is the source of the device upserts the uplink writes to the
// devices table (PendingUpserts, Upserted), through an interface the
// uplink defines. New reads the saved records from the buffer (already
// open) and starts nothing; Run saves the changed records every
// devices.flush_interval, and once more when its context is done.
//
// Imports: firmware-contract and internal/ (clock, cloud). It must not
// import ingest, operator or uplink; the buffer reaches it only through
// the small state-store interface it defines.
package registry

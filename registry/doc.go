// Package registry keeps the gateway's record of each device: its
// registration and confirmation ID, boots and reboot loops, sequence gaps
// and replays, the clock anchors that repair device timestamps, and
// session takeovers, held in memory and saved in the buffer's state
// records. It is the source of the device upserts the uplink writes to
// the devices table (PendingUpserts, Upserted), through an interface the
// uplink defines.
//
// New builds an empty registry and does no I/O; Load reads the saved
// records from the buffer (already open), once, before the gateway
// serves. Register and Anchor save the device's record before they
// return, through the buffer's group committer (SaveState), so a
// registration and a boot's clock anchor are on disk before the
// registration, or the batch that brought the anchor, is acknowledged;
// the other changes are saved by Run every devices.flush_interval, and
// once more when its context is done (Flush).
//
// Files: registry.go (Registry, Device and the rules applied to each
// registration and batch), store.go (the saved records: Load, Flush, Run,
// the state-store interface), config.go (Config, the devices.* settings),
// keystate.go (KeyState, what operators see of a device's keys).
//
// Imports: firmware-contract and internal/ (clock, cloud). It must not
// import ingest, operator or uplink; it reaches the buffer only through the
// small state-store interface it defines (deviceStore).
package registry

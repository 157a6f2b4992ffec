// Package soak proves the gateway's delivery guarantee under faults: every
// batch acknowledged to a device (accepted or duplicate) is in DynamoDB
// exactly once after the faults end.
//
// Each scenario starts its own DynamoDB Local (keeping its data on disk with
// -dbPath and -sharedDb, so that it survives being killed), creates the
// tables and an API key, starts a real gatewayd process on a data
// directory and ports that persist across its restarts, and drives
// simulated devices (two cmd/devicesim processes writing --report files:
// half the devices over MQTT with 5-reading batches and reboots, half over
// HTTP with 12-reading batches, so that both of the uplink's transaction
// paths are used; gatewayd's uplink.write_mode alternates between
// "transaction" and "batch" at every start). While the devices produce, it
// injects its faults in cycles:
//
//   - kill9: gatewayd killed with SIGKILL and restarted, Config.KillCycles
//     times;
//   - dynamodb: DynamoDB Local killed with SIGKILL and restarted, and
//     stopped with SIGSTOP and continued with SIGCONT (hung requests);
//   - proxy: gatewayd's uplink goes through harness/faultproxy, which
//     cycles through every fault it has (lost_response and truncate answers
//     lost after the write, reset, blackhole, latency, throttling, 5xx);
//   - sigterm: gatewayd stopped with SIGTERM and restarted; it must exit 0
//     within its shutdown deadline, half of the time while its uplink
//     hangs on a blackholed request;
//   - powercut: gatewayd's data directory on harness/faultfs (FUSE);
//     gatewayd killed with SIGKILL, everything not fsynced dropped (a power
//     cut), gatewayd restarted on what survived, Config.PowerCutCycles
//     times. Skipped, and said so in the report, where FUSE cannot be
//     mounted (no /dev/fuse, not root).
//
// Then the faults end, the devices get their last batches confirmed, the
// gateway's buffer drains (gateway_buffer_pending_batches 0), and the
// invariant is checked against DynamoDB Local, read directly with the AWS
// SDK, from the devices' reports (see checkInvariant for what counts as
// lost, duplicated and stray).
//
// All traffic stays on 127.0.0.1. Every loop is bounded in count and time;
// child processes are killed with the soak (Linux parent-death signal).
// The package runs on Unix only.
package soak

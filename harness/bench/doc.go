//go:build linux

// Package bench measures the gateway against baselines measured in the same
// run, so that its figures hold on a noisy machine: each figure is printed
// with its baseline and the ratio of the two, and checked against a target
// (PASS or MISS, never an assertion).
//
// It starts everything it measures as child processes on 127.0.0.1: its own
// DynamoDB Local (the JVM from <module root>/.cache/dynamodb-local, in
// memory), Debian's mosquitto (QoS 1, no persistence: the baseline broker)
// and gatewayd, built from the working tree. Its scenarios:
//
//   - mqtt: durable MQTT ingest in a closed loop, each device its own paho
//     connection with a few QoS 1 batches in flight, against gatewayd and
//     against mosquitto under the same load; the RSS of gatewayd with every
//     device connected and idle, and the CPU time per 10,000 readings.
//   - fixed: a fixed offered load (1,000 batches/s by default, open loop)
//     and the acknowledgement latency it gets from each.
//   - http: POST /v1/readings from 64 keep-alive clients, against a trivial
//     handler that reads and discards the body.
//   - sdcard: durable MQTT ingest with every fsync of the data directory
//     made 10 ms slower by a FUSE file system, against the same file
//     system without the delay.
//   - drain: a backlog written into a data directory with the buffer
//     package, forwarded by gatewayd to DynamoDB Local in each write mode,
//     against the plain writer of the same items (the readings and each
//     batch's processed_batches marker, BatchWriteItem, 25 a request, no
//     conditions) at its fastest goroutine count, run just before and just
//     after each drain, and the readings alone as a second line; requests,
//     write capacity units and
//     DynamoDB Local's CPU per reading. By default the batch-mode drain
//     runs three times (--drain-repeats), each on a backlog of its own
//     between plain runs of its own, and the median is reported: on two
//     shared cores one drain's ratio to its ceiling moves by up to 0.2
//     from run to run. --drain-modes picks the modes. Then the
//     batch-mode drain and the plain writer again through a proxy that
//     delays every request (--link-delay), as an uplink to AWS does.
//   - lambda: the drain through the readings function under AWS's Runtime
//     Interface Emulator, against gatewayd writing directly.
//   - uplink-bytes: what the uplink puts on its link per reading, counted
//     at the socket by a relay in front of each endpoint
//     (harness/byterelay): bytes up and down, headers included, requests
//     and connections per 1,000 readings; with uplink.target dynamodb,
//     then lambda (the readings function under the emulator), at a live
//     greenhouse rate (100 devices, a batch of 10 readings a minute each,
//     spread over the minute, for 3 minutes by default, --bytes-live) and
//     draining a backlog of 20,000 readings; against the plain same-items
//     writer (gatewayd's readings and markers, 25 to an unconditional
//     BatchWriteItem) through the same kind of relay; with an estimate of
//     what TLS and a session token would add, stated as one. About 8
//     minutes with the defaults.
//   - footprint: the time to /readyz with 1,000,000 readings pending (the
//     data directory is built once and cached under .cache/bench), and the
//     bytes on disk per buffered reading.
//   - idle: the largest fleet connected, each device having sent one batch,
//     and gatewayd's memory broken down while it idles (RSS by mapping,
//     the Go runtime's memory classes, the heap by owner), optionally
//     against another gatewayd binary measured the same way.
//
// During ingest scenarios gatewayd's DynamoDB endpoint is a closed port, so
// that the figures are those of ingest alone (the uplink only backs off);
// devices' API key is verified once beforehand and cached in the data
// directory, as in an outage. Forwarding is measured by the drain.
//
// Every load loop is bounded in count and in time. The package reads /proc
// and runs on Linux only.
package bench

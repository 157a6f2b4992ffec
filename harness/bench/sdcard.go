//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"greenhouse-gateway/harness/faultfs"
)

// sdFsyncDelay is how long each fsync takes on the slow card: a
// consumer SD card's flush under sustained writes.
const sdFsyncDelay = 10 * time.Millisecond

// sdRun is one durable MQTT ingest run of the SD-card scenario.
type sdRun struct {
	Disk    string      `json:"disk"`
	Load    loadResult  `json:"load"`
	Commits commitStats `json:"commits"`
}

// sdcard measures group commit where fsync is slow: the closed-loop MQTT
// ingest with gatewayd's data directory on the fault-injecting file system
// with every fsync delayed sdFsyncDelay, against the same file system
// without the delay (the baseline) and the plain disk (FUSE's own cost),
// for each fleet size.
func (r *runner) sdcard(ctx context.Context) error {
	if os.Geteuid() != 0 {
		r.res.note("sdcard: skipped: mounting the fault-injecting file system needs root")
		return nil
	}
	for i, n := range r.cfg.Devices {
		section := fmt.Sprintf("sdcard %d devices", n)
		runs := map[string]sdRun{}
		// The slow card and its baseline alternate which goes first.
		order := []time.Duration{sdFsyncDelay, 0}
		if i%2 == 1 {
			order = []time.Duration{0, sdFsyncDelay}
		}
		for _, delay := range order {
			run, err := r.sdRun(ctx, n, delay)
			if errors.Is(err, faultfs.ErrUnavailable) {
				r.res.note("sdcard: skipped: %v", err)
				return nil
			}
			if err != nil {
				return fmt.Errorf("%s, fsync delay %s: %w", section, delay, err)
			}
			runs[run.Disk] = run
		}
		plain, err := r.sdRun(ctx, n, -1)
		if err != nil {
			return fmt.Errorf("%s, plain disk: %w", section, err)
		}
		runs[plain.Disk] = plain
		r.res.Details[section] = runs
		slow, fast := runs[sdDiskName(sdFsyncDelay)], runs[sdDiskName(0)]
		base := sdDiskName(0)
		r.res.add(section, "durable MQTT batches/s, every fsync +10 ms", "batches/s",
			slow.Load.BatchesPerSec, fast.Load.BatchesPerSec, base, ratioAtLeast(0.7))
		r.res.add(section, "batches per group commit (one fsync)", "batches", slow.Commits.AvgGroupBatches,
			fast.Commits.AvgGroupBatches, base, nil)
		r.res.add(section, "ack p50, every fsync +10 ms", "ms", slow.Load.Ack.P50, fast.Load.Ack.P50, base, nil)
		r.res.add(section, "ack p99, every fsync +10 ms", "ms", slow.Load.Ack.P99, fast.Load.Ack.P99, base, nil)
		r.res.add(section, "durable MQTT batches/s on the fault-injecting file system, no delay", "batches/s",
			fast.Load.BatchesPerSec, plain.Load.BatchesPerSec, plain.Disk, nil)
		r.res.note("%s: group commits %.0f/s with every fsync +10 ms (average %.1f ms each), %.0f/s without the delay, "+
			"%.0f/s on the plain disk", section, slow.Commits.CommitsPerSec, slow.Commits.AvgCommitMS,
			fast.Commits.CommitsPerSec, plain.Commits.CommitsPerSec)
	}
	return nil
}

// sdDiskName names a run's disk: the fault-injecting file system with
// delay added to every fsync, or the plain disk for a negative delay.
func sdDiskName(delay time.Duration) string {
	switch {
	case delay < 0:
		return "plain disk"
	case delay == 0:
		return "same FUSE file system, no delay"
	}
	return fmt.Sprintf("FUSE file system, fsync +%s", delay)
}

// sdRun runs the closed-loop MQTT load with n devices against a gatewayd
// whose data directory is on faultfs with delay added to each fsync (on
// the plain disk when delay is negative).
func (r *runner) sdRun(ctx context.Context, n int, delay time.Duration) (sdRun, error) {
	run := sdRun{Disk: sdDiskName(delay)}
	name := fmt.Sprintf("sdcard-%d-%d", n, r.fleet+1)
	base := r.work
	if delay >= 0 {
		backing, mnt := filepath.Join(r.work, name+"-backing"), filepath.Join(r.work, name+"-mnt")
		for _, d := range []string{backing, mnt} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return run, err
			}
		}
		fs, err := faultfs.Start(faultfs.Options{Backing: backing, Mountpoint: mnt, FsyncDelay: delay})
		if err != nil {
			return run, err
		}
		defer func() { _ = fs.Unmount() }()
		base = mnt
	}
	r.log.Info("sdcard: gatewayd", "devices", n, "disk", run.Disk)
	g, err := r.startIngestGatewayIn(ctx, base, name)
	if err != nil {
		return run, err
	}
	defer func() { _ = g.stop() }()
	f, err := connectFleet(ctx, fleetSpec{addr: g.mqttAddr, fleet: r.nextFleet(), devices: n,
		readings: r.cfg.Readings, key: r.key, waitAck: true})
	if err != nil {
		return run, err
	}
	defer f.disconnect()
	if _, err := f.prime(ctx); err != nil {
		return run, err
	}
	met := &metricsMark{g: g, ctx: ctx}
	if run.Load, err = f.closedLoop(ctx, r.cfg.Inflight, r.cfg.Warmup, r.cfg.Duration, met.hooks()); err != nil {
		return run, err
	}
	if met.err != nil {
		return run, met.err
	}
	run.Commits = met.commits(run.Load.WindowSeconds, "mqtt")
	return run, nil
}

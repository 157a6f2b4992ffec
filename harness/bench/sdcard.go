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

// sdcardFsync is how long every fsync takes in the sdcard scenario: a
// slow SD card or eMMC.
const sdcardFsync = 10 * time.Millisecond

// sdcardDisk is the data directory's file system of one sdcard run.
type sdcardDisk string

const (
	diskSlow  sdcardDisk = "faultfs, fsync 10 ms"
	diskFast  sdcardDisk = "faultfs, no fsync delay"
	diskPlain sdcardDisk = "plain disk"
	// diskDirty delays only the fsyncs that have something to make
	// durable: on a real card an fsync of a clean file writes nothing.
	diskDirty sdcardDisk = "faultfs, fsync 10 ms when not clean"
)

// sdcardLoad is one gatewayd run of the sdcard scenario.
type sdcardLoad struct {
	Disk    sdcardDisk  `json:"disk"`
	Load    loadResult  `json:"load"`
	Commits commitStats `json:"commits"`
	// Fsyncs is how many fsyncs the FUSE file system served in the window
	// (0 on the plain disk).
	Fsyncs         float64 `json:"fsyncs"`
	FsyncsPerGroup float64 `json:"fsyncs_per_group_commit,omitempty"`
	// CleanFsyncs of them found nothing to make durable (the value log
	// of a group that wrote none, say); faultfs delays them too.
	CleanFsyncs float64 `json:"clean_fsyncs"`
}

// sdcardRun is the detail of one fleet size.
type sdcardRun struct {
	Devices int          `json:"devices"`
	Runs    []sdcardLoad `json:"runs"`
}

func (s sdcardRun) on(d sdcardDisk) sdcardLoad {
	for _, l := range s.Runs {
		if l.Disk == d {
			return l
		}
	}
	return sdcardLoad{}
}

// sdcardMount is faultfs mounted in the work directory.
type sdcardMount struct {
	fs   *faultfs.FS
	stop func() bool // stops the unmount on ctx cancellation
}

// mountSDCard mounts faultfs over a backing directory in the work
// directory. It returns faultfs.ErrUnavailable (wrapped) without root or
// without /dev/fuse. The file system is unmounted when ctx is done, as a
// last resort: call unmount (always) when done with it.
func (r *runner) mountSDCard(ctx context.Context) (*sdcardMount, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: not root", faultfs.ErrUnavailable)
	}
	backing, mnt := filepath.Join(r.work, "sdcard-backing"), filepath.Join(r.work, "sdcard-mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	ffs, err := faultfs.Start(faultfs.Options{Backing: backing, Mountpoint: mnt, UnmountWait: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	m := &sdcardMount{fs: ffs}
	m.stop = context.AfterFunc(ctx, func() { _ = ffs.Unmount() })
	return m, nil
}

// unmount unmounts the file system (every gatewayd on it must have exited).
func (m *sdcardMount) unmount() error {
	m.stop()
	return m.fs.Unmount()
}

// sdcard measures the durable MQTT ingest rate with every fsync of
// gatewayd's data directory taking 10 ms, against the same FUSE file system
// without the delay, and the plain disk, for each fleet size.
func (r *runner) sdcard(ctx context.Context) (err error) {
	m, err := r.mountSDCard(ctx)
	if errors.Is(err, faultfs.ErrUnavailable) {
		r.res.note("sdcard: skipped, it needs root and /dev/fuse for the fault-injecting file system (%v)", err)
		r.log.Warn("sdcard scenario skipped", "reason", err)
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.unmount()) }()
	for i, n := range r.cfg.Devices {
		// Interleaved: the slow disk first on every other fleet size.
		order := []sdcardDisk{diskSlow, diskFast, diskDirty, diskPlain}
		if i%2 == 1 {
			order = []sdcardDisk{diskFast, diskSlow, diskPlain, diskDirty}
		}
		run := sdcardRun{Devices: n}
		for _, disk := range order {
			l, err := r.sdcardLoad(ctx, m.fs, n, disk)
			if err != nil {
				return fmt.Errorf("%d devices, %s: %w", n, disk, err)
			}
			run.Runs = append(run.Runs, l)
		}
		r.sdcardFigures(run)
	}
	return nil
}

// sdcardLoad runs the closed-loop MQTT load of n devices on a gatewayd
// whose data directory is on disk.
func (r *runner) sdcardLoad(ctx context.Context, ffs *faultfs.FS, n int, disk sdcardDisk) (sdcardLoad, error) {
	l := sdcardLoad{Disk: disk}
	name := fmt.Sprintf("sdcard-%d-%s", n, map[sdcardDisk]string{diskSlow: "slow", diskFast: "fast", diskPlain: "plain", diskDirty: "dirty"}[disk])
	base := r.work
	if disk != diskPlain {
		base = ffs.Dir()
	}
	dir := filepath.Join(base, name)
	ffs.SetFsyncDelay(0) // copying the seed
	slow := disk == diskSlow || disk == diskDirty
	if slow {
		defer ffs.SetFsyncDelay(0)
		defer ffs.SetCleanFsyncFree(false)
	}
	defer os.RemoveAll(dir)
	r.log.Info("sdcard: gatewayd", "devices", n, "disk", disk, "duration", r.cfg.Duration)
	g, err := r.startIngestGatewayIn(ctx, base, name)
	if err != nil {
		return l, err
	}
	defer g.proc.Kill()
	if slow {
		ffs.SetFsyncDelay(sdcardFsync)
		ffs.SetCleanFsyncFree(disk == diskDirty)
	}
	f, err := connectFleet(ctx, fleetSpec{addr: g.mqttAddr, fleet: r.nextFleet(), devices: n,
		readings: r.cfg.Readings, key: r.key, waitAck: true})
	if err != nil {
		return l, err
	}
	if _, err := f.prime(ctx); err != nil {
		f.disconnect()
		return l, err
	}
	var fs0, fs1, clean0, clean1 int64
	syncs := loadHooks{start: func() { fs0, clean0 = ffs.Fsyncs(), ffs.CleanFsyncs() },
		end: func() { fs1, clean1 = ffs.Fsyncs(), ffs.CleanFsyncs() }}
	if l.Load, l.Commits, err = r.closedLoopGateway(ctx, g, f, syncs); err != nil {
		return l, err
	}
	if disk != diskPlain {
		l.Fsyncs, l.CleanFsyncs = float64(fs1-fs0), float64(clean1-clean0)
		if l.Commits.Commits > 0 {
			l.FsyncsPerGroup = l.Fsyncs / l.Commits.Commits
		}
	}
	return l, g.stop()
}

// sdcardFigures adds one fleet size's figures.
func (r *runner) sdcardFigures(run sdcardRun) {
	n := run.Devices
	section := fmt.Sprintf("sdcard %d devices", n)
	r.res.Details[section] = run
	slow, fast, plain, dirty := run.on(diskSlow), run.on(diskFast), run.on(diskPlain), run.on(diskDirty)
	const base = "same FUSE fs, no fsync delay"
	r.res.add(section, fmt.Sprintf("durable MQTT batches/s, %d devices, fsync 10 ms", n), "batches/s",
		slow.Load.BatchesPerSec, fast.Load.BatchesPerSec, base, ratioAtLeast(0.7))
	r.res.add(section, "batches per group commit, fsync 10 ms", "batches", slow.Commits.AvgGroupBatches,
		fast.Commits.AvgGroupBatches, base, nil)
	r.res.add(section, "fsyncs per group commit, fsync 10 ms", "fsyncs", slow.FsyncsPerGroup, fast.FsyncsPerGroup, base, nil)
	r.res.add(section, "PUBACK p50, fsync 10 ms", "ms", slow.Load.Puback.P50, fast.Load.Puback.P50, base, nil)
	r.res.add(section, "PUBACK p99, fsync 10 ms", "ms", slow.Load.Puback.P99, fast.Load.Puback.P99, base, nil)
	r.res.add(section, "durable MQTT batches/s, fsync 10 ms, clean fsyncs free", "batches/s",
		dirty.Load.BatchesPerSec, fast.Load.BatchesPerSec, base, nil)
	r.res.add(section, "durable MQTT batches/s on FUSE without delay (FUSE's own cost)", "batches/s",
		fast.Load.BatchesPerSec, plain.Load.BatchesPerSec, "plain disk, no FUSE", nil)
	for _, l := range run.Runs {
		r.checkLoad(fmt.Sprintf("%s, %s", section, l.Disk), l.Load)
		r.res.note("%s, %s: %.0f batches/s, gatewayd committed %.0f groups/s of %.1f batches, %.2f ms each, "+
			"%.1f fsyncs per group (%.0f of %.0f fsyncs clean: nothing to make durable), gatewayd CPU %.2f s per 10k readings%s", section, l.Disk, l.Load.BatchesPerSec,
			l.Commits.CommitsPerSec, l.Commits.AvgGroupBatches, l.Commits.AvgCommitMS, l.FsyncsPerGroup, l.CleanFsyncs, l.Fsyncs,
			perReading10k(l.Load.ServerCPU, l.Load.ReadingsPerSec*l.Load.WindowSeconds), l.Commits.inside())
	}
	r.res.note("%s: %d batches in flight per device at most (%d in all); with fsync 10 ms a group commit "+
		"of k fsyncs takes at least k*10 ms, so the rate is bounded by group size / commit time",
		section, r.cfg.Inflight, r.cfg.Inflight*n)
}

package soak

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"greenhouse-gateway/harness/faultfs"

	"greenhouse-gateway/harness/faultproxy"
)

// maxFaultCycles bounds every fault loop by count, besides its time.
const maxFaultCycles = 100_000

// kill9 kills gatewayd with SIGKILL under load Config.KillCycles times,
// spread evenly (with jitter) over the load time, and restarts it at once
// on the same data directory and ports. When restarts are slower than
// planned (a busy machine), the cycles left go on for at most half the
// load time more, while the devices still send what they hold.
func (s *scenario) kill9(ctx context.Context, until time.Time) {
	s.killCycles(ctx, until, s.cfg.KillCycles, func() bool { return true })
}

// powerCuts is kill9 with a power cut of the data directory's file system
// (faultfs) between the kill and the restart: gatewayd restarts on what
// was fsynced, the rest is lost; unless Config.PowerCutUntorn, every
// other cut is torn (half of the pages overwritten since their file's last fsync
// keep their new content).
func (s *scenario) powerCuts(ctx context.Context, until time.Time) {
	cut := 0
	s.killCycles(ctx, until, s.cfg.PowerCutCycles, func() bool {
		cut++
		var err error
		if !s.cfg.PowerCutUntorn && cut%2 == 0 { // torn: some unsynced pages reached the disk
			err = s.disk.PowerCutTorn(0.5, s.rng.Uint64())
		} else {
			err = s.disk.PowerCut()
		}
		if err != nil {
			s.problem("power cut: %v", err)
			return false
		}
		return true
	})
	st := s.disk.Stats()
	s.log.Info("power cuts undid", "cuts", st.Cuts, "files_rolled_back", st.FilesRolled, "bytes", st.BytesUndone,
		"pages_kept", st.PagesKept, "files_dropped", st.FilesDropped, "names_restored", st.NamesRestored)
}

// mountDisk mounts faultfs over the scenario's disk directory for the
// powercut scenario; without FUSE it marks the scenario skipped and
// returns nil.
func (s *scenario) mountDisk() (*faultfs.FS, error) {
	backing, mnt := filepath.Join(s.dir, "disk"), filepath.Join(s.dir, "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	disk, err := faultfs.Start(faultfs.Options{Backing: backing, Mountpoint: mnt})
	if errors.Is(err, faultfs.ErrUnavailable) {
		s.fig.Skipped = err.Error()
		s.log.Warn("scenario skipped", "reason", err)
		return nil, nil
	}
	return disk, err
}

// killCycles kills gatewayd with SIGKILL cycles times under load, runs
// between (false ends the cycles) and restarts it.
func (s *scenario) killCycles(ctx context.Context, until time.Time, cycles int, between func() bool) {
	hardStop := until.Add(s.load / 2)
	restart := 500 * time.Millisecond // running estimate of a restart's length
	for i := 0; i < cycles && ctx.Err() == nil; i++ {
		left := time.Until(until)
		if left <= 0 {
			left = time.Until(hardStop)
			if left <= 0 {
				s.log.Info("time over before every kill cycle ran", "cycles", s.fig.Cycles, "wanted", cycles)
				return
			}
		}
		mean := max(left/time.Duration(cycles-i)-restart, 300*time.Millisecond)
		sleep(ctx, min(s.between(mean/2, mean*3/2), left))
		if !s.ensureGateway(ctx) {
			return
		}
		s.scrape()
		if err := s.gw.kill9(); err != nil {
			s.problem("kill -9: %v", err)
			return
		}
		s.fig.Cycles++
		begin := time.Now()
		if !between() || !s.restartGateway(ctx) {
			return
		}
		restart = (3*restart + time.Since(begin)) / 4
	}
}

// dynamoFaults alternates two DynamoDB Local outages under load: the JVM
// killed with SIGKILL and restarted on its database after a pause
// (refused connections), and the JVM stopped with SIGSTOP and continued
// with SIGCONT (hung requests; some longer than the uplink's 3 s request
// timeout).
func (s *scenario) dynamoFaults(ctx context.Context, until time.Time) {
	for i := 0; i < maxFaultCycles && ctx.Err() == nil; i++ {
		sleep(ctx, min(s.between(1500*time.Millisecond, 4*time.Second), time.Until(until)))
		if !time.Now().Before(until) {
			return
		}
		if !s.ensureGateway(ctx) {
			return
		}
		s.fig.Cycles++
		if i%2 == 0 {
			if err := s.dynamo.kill(); err != nil {
				s.problem("kill -9 of DynamoDB Local: %v", err)
				return
			}
			sleep(ctx, s.between(500*time.Millisecond, 3*time.Second))
			if err := s.dynamo.start(ctx); err != nil {
				s.problem("DynamoDB Local does not restart: %v", err)
				return
			}
			continue
		}
		if err := s.dynamo.pause(); err != nil {
			s.problem("SIGSTOP of DynamoDB Local: %v", err)
			return
		}
		sleep(ctx, s.between(time.Second, 6*time.Second))
		if err := s.dynamo.resume(); err != nil {
			s.problem("SIGCONT of DynamoDB Local: %v", err)
			return
		}
	}
}

// proxyFaults puts gatewayd's uplink through every fault of the proxy in
// turn: each fault for a fifth of the requests for one phase (the uplink
// keeps forwarding between faults), then for every request for half a
// phase (an outage of that kind), and once per round all of them mixed for
// two phases. A short pass follows each phase.
func (s *scenario) proxyFaults(ctx context.Context, until time.Time) {
	faults := []faultproxy.Fault{
		{Mode: faultproxy.LostResponse},
		{Mode: faultproxy.Truncate},
		{Mode: faultproxy.Reset},
		{Mode: faultproxy.Blackhole},
		{Mode: faultproxy.Latency, Delay: 400 * time.Millisecond},
		{Mode: faultproxy.Throttle, Code: faultproxy.CodeProvisionedThroughputExceeded},
		{Mode: faultproxy.Throttle, Code: faultproxy.CodeThrottling},
		{Mode: faultproxy.Error5xx, Code: faultproxy.CodeInternalServerError},
		{Mode: faultproxy.Error5xx, Code: faultproxy.CodeServiceUnavailable},
	}
	mix := []faultproxy.Chance{
		{Fault: faultproxy.Fault{Mode: faultproxy.LostResponse}, P: 0.15},
		{Fault: faultproxy.Fault{Mode: faultproxy.Truncate}, P: 0.05},
		{Fault: faultproxy.Fault{Mode: faultproxy.Reset}, P: 0.05},
		{Fault: faultproxy.Fault{Mode: faultproxy.Throttle}, P: 0.1},
		{Fault: faultproxy.Fault{Mode: faultproxy.Error5xx}, P: 0.1},
		{Fault: faultproxy.Fault{Mode: faultproxy.Latency, Delay: 200 * time.Millisecond}, P: 0.1},
		{Fault: faultproxy.Fault{Mode: faultproxy.Blackhole}, P: 0.02},
	}
	// One round: per fault 1 + 1/2 phases and two passes of 1/4; then the
	// mix for 2 phases and a pass.
	round := float64(len(faults))*2 + 2.25
	phase := min(max(time.Duration(float64(s.load)/round), time.Second), 10*time.Second)
	steps := 2*len(faults) + 1
	half := time.Now().Add(time.Until(until) / 2)
	for i := 0; i < maxFaultCycles && ctx.Err() == nil && time.Now().Before(until); i++ {
		if !half.IsZero() && time.Now().After(half) {
			// Half-way: a graceful restart, which changes the uplink's write
			// mode when modes alternate.
			half = time.Time{}
			s.scrape()
			if took, err := s.gw.term(); err != nil {
				s.problem("SIGTERM half-way: %v", err)
			} else {
				s.fig.MaxStop = max(s.fig.MaxStop, took)
			}
			if !s.restartGateway(ctx) {
				return
			}
		}
		var err error
		length := phase
		switch k := i % steps; {
		case k == steps-1:
			err = s.proxy.Mix(mix...)
			length = 2 * phase
		case k%2 == 0:
			err = s.proxy.Mix(faultproxy.Chance{Fault: faults[k/2], P: 0.2})
		default:
			err = s.proxy.Set(faults[k/2])
			length = phase / 2
		}
		if err != nil {
			s.problem("fault proxy: %v", err)
			return
		}
		s.fig.Cycles++
		s.log.Debug("proxy fault", "plan", s.proxy.Plan())
		sleep(ctx, min(length, time.Until(until)))
		_ = s.proxy.Set(faultproxy.Fault{})
		sleep(ctx, min(phase/4, time.Until(until)))
		if !s.ensureGateway(ctx) {
			return
		}
	}
}

// sigterm stops gatewayd with SIGTERM under load and restarts it, checking
// each time that it exits with status 0 within its shutdown deadline.
// Every other stop happens while the fault proxy blackholes DynamoDB, so
// that the uplink is stuck in a request when the signal comes.
func (s *scenario) sigterm(ctx context.Context, until time.Time) {
	for i := 0; i < maxFaultCycles && ctx.Err() == nil; i++ {
		sleep(ctx, min(s.between(2*time.Second, 5*time.Second), time.Until(until)))
		if !time.Now().Before(until) {
			return
		}
		if !s.ensureGateway(ctx) {
			return
		}
		hung := i%2 == 1
		if hung {
			_ = s.proxy.Set(faultproxy.Fault{Mode: faultproxy.Blackhole})
			sleep(ctx, 500*time.Millisecond)
		}
		s.scrape()
		took, err := s.gw.term()
		s.fig.Cycles++
		if err != nil {
			s.problem("SIGTERM %d (uplink hung: %v): %v; log tail:\n%s", i+1, hung, err, tail(s.gw.logPath, 2048))
		} else {
			s.fig.MaxStop = max(s.fig.MaxStop, took)
		}
		if hung {
			_ = s.proxy.Set(faultproxy.Fault{})
		}
		if !s.restartGateway(ctx) {
			return
		}
	}
}

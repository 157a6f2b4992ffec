package devicesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// jitterStream and rebootStream separate the random streams of backoff jitter and of reboot
// times from the one of sensor values, so that values and reboot times stay the same for a
// seed whatever the network does.
const (
	jitterStream = 0x6a69_7474_6572 // "jitter"
	rebootStream = 0x7265_626f_6f74 // "reboot"
)

// Sim runs a fleet of simulated devices.
type Sim struct {
	cfg   Config
	log   *slog.Logger
	ids   []string
	dial  dialFunc
	close func() // releases what the transport holds (idle HTTP connections)
	now   func() time.Time

	mu    sync.Mutex
	stats []DeviceStats
}

// New validates cfg and prepares a simulator. It does no I/O and starts no goroutine.
func New(cfg Config, logger *slog.Logger) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ids, err := hardwareIDs(cfg.FirstMAC, cfg.Devices)
	if err != nil {
		return nil, fmt.Errorf("devicesim: %w", err)
	}
	logger = logger.With("component", "devicesim")
	s := &Sim{cfg: cfg, log: logger, ids: ids, close: func() {}, now: time.Now}
	if cfg.MQTTURL != "" {
		s.dial = mqttDialer(&s.cfg, logger)
	} else {
		var client *httpClient
		client, s.dial = httpDialer(&s.cfg, logger)
		s.close = client.closeIdle
	}
	return s, nil
}

// HardwareIDs returns the hardware ids of the simulated devices, in order.
func (s *Sim) HardwareIDs() []string { return append([]string(nil), s.ids...) }

// Run boots every device and runs them until ctx is done, or until each device stopped
// producing (Batches or Duration reached) and its buffer is confirmed or its drain timeout
// passed. It logs a final summary. It returns an error only when the simulation could not be
// set up, a device could not reboot (no randomness for its boot_id) or the report could not
// be written.
func (s *Sim) Run(ctx context.Context) error {
	var report *reportWriter
	if s.cfg.ReportPath != "" {
		r, err := createReport(s.cfg.ReportPath)
		if err != nil {
			return err
		}
		report = r
	}
	defer report.close()
	defer s.close()
	keys, err := openKeyStore(s.cfg.KeyStorePath)
	if err != nil {
		return err
	}

	seed := s.cfg.Seed
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	transport, target := "mqtt", s.cfg.MQTTURL
	if s.cfg.HTTPURL != "" {
		transport, target = "http", s.cfg.HTTPURL
	}
	s.log.Info("starting devices", "transport", transport, "url", target, "devices", len(s.ids),
		"first_hardware_id", s.ids[0], "interval", s.cfg.Interval, "readings", s.cfg.Readings,
		"batches", s.cfg.Batches, "duration", s.cfg.Duration, "qos", s.cfg.QoS,
		"reboot_every", s.cfg.RebootEvery, "reboots", s.cfg.Reboots, "clock_sync_after", s.cfg.ClockSyncAfter,
		"seed", seed, "key_store", keys.where(), "stored_device_keys", keys.len())

	devices := make([]*device, len(s.ids))
	boot := s.now()
	for i, hw := range s.ids {
		bootID, err := randomBootID()
		if err != nil {
			return fmt.Errorf("devicesim: boot id for %s: %w", hw, err)
		}
		values := rand.New(rand.NewPCG(seed, uint64(i)))
		jitter := rand.New(rand.NewPCG(seed^jitterStream, uint64(i)))
		reboots := rand.New(rand.NewPCG(seed^rebootStream, uint64(i)))
		gen := newGenerator(hw, bootID, fmt.Sprintf("sim-%02d", i+1), &s.cfg, boot, values)
		d, err := newDevice(&s.cfg, s.log, gen, s.dial, report, keys, jitter, reboots, s.now)
		if err != nil {
			return fmt.Errorf("devicesim: %w", err)
		}
		devices[i] = d
	}

	stats := make([]DeviceStats, len(devices))
	errs := make([]error, len(devices))
	var wg sync.WaitGroup
	for i, d := range devices {
		wg.Go(func() { stats[i], errs[i] = d.run(ctx) })
	}
	wg.Wait()

	s.mu.Lock()
	s.stats = stats
	s.mu.Unlock()
	s.logFinal(stats)

	return errors.Join(errors.Join(errs...), report.close())
}

// Stats returns the counters of every device after Run returned; nil before.
func (s *Sim) Stats() []DeviceStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]DeviceStats(nil), s.stats...)
}

func (s *Sim) logFinal(stats []DeviceStats) {
	var total DeviceStats
	total.Rejected, total.Retried = map[string]int{}, map[string]int{}
	enrolled := 0
	for _, st := range stats {
		s.log.Info("device final summary", "hardware_id", st.HardwareID, "boot_id", st.BootID,
			"reboots", st.Reboots, "registered", st.Registered, "registrations", st.Registrations,
			"confirmation_id", st.ConfirmationID, "built", st.Built, "sent", st.Sent, "resent", st.Resent,
			"accepted", st.Accepted, "duplicates", st.Duplicates,
			"rejected", formatCounts(st.Rejected), "retried", formatCounts(st.Retried),
			"overflow", st.Overflow, "pending", st.Pending, "key", st.Key, "device_key_id", st.DeviceKeyID)
		if st.Key == keyEnrolled {
			enrolled++
		}
		total.Reboots += st.Reboots
		total.Registrations += st.Registrations
		total.Built += st.Built
		total.Sent += st.Sent
		total.Resent += st.Resent
		total.Accepted += st.Accepted
		total.Duplicates += st.Duplicates
		total.Overflow += st.Overflow
		total.Pending += st.Pending
		for k, v := range st.Rejected {
			total.Rejected[k] += v
		}
		for k, v := range st.Retried {
			total.Retried[k] += v
		}
	}
	s.log.Info("final summary", "devices", len(stats), "reboots", total.Reboots,
		"registrations", total.Registrations, "built", total.Built, "sent", total.Sent,
		"resent", total.Resent, "accepted", total.Accepted, "duplicates", total.Duplicates,
		"rejected", total.rejectedTotal(), "rejected_by_reason", formatCounts(total.Rejected),
		"retried", formatCounts(total.Retried), "overflow", total.Overflow, "pending", total.Pending,
		"enrolled", enrolled)
}

package registry

import (
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/cloud"
)

// Device is what the gateway knows of one device. It is kept on disk and
// shown to operators at GET /v1/devices/{hardware_id}.
type Device struct {
	HardwareID string `json:"hardware_id"`
	// Registered is true once the device registered; ConfirmationID is
	// assigned then and never changes.
	Registered        bool                   `json:"registered"`
	ConfirmationID    string                 `json:"confirmation_id,omitempty"`
	FriendlyName      string                 `json:"friendly_name,omitempty"`
	FirmwareVersion   string                 `json:"firmware_version,omitempty"`
	Capabilities      *contract.Capabilities `json:"capabilities,omitempty"`
	FirstRegisteredAt time.Time              `json:"first_registered_at,omitzero"`
	FirstSeenAt       time.Time              `json:"first_seen_at"`
	LastSeenAt        time.Time              `json:"last_seen_at"`

	// BootID is the current boot; BootAt when it started (from the
	// device's uptime when it sends one, else first contact).
	BootID string    `json:"boot_id,omitempty"`
	BootAt time.Time `json:"boot_at,omitzero"`
	// Boots counts boots seen; Reboots those after the first one.
	Boots   uint64 `json:"boots"`
	Reboots uint64 `json:"reboots"`
	// RecentBoots holds boot times within the last hour.
	RecentBoots []time.Time `json:"recent_boots,omitempty"`
	RebootLoop  bool        `json:"reboot_loop"`

	// Seq is the highest batch seq of the current boot; Gaps counts
	// batches missing between seqs (lost, or not arrived yet), Replays
	// batches that came again with a seq already seen under a new batch_id.
	Seq     *uint64 `json:"seq,omitempty"`
	Gaps    uint64  `json:"gaps"`
	Replays uint64  `json:"replays"`

	// Clock state: Anchors are the boot times (epoch ms) used to repair
	// unsynced timestamps, per boot_id (the newest few).
	Anchors         []Anchor `json:"anchors,omitempty"`
	RepairedBatches uint64   `json:"repaired_batches"`
	NotSynced       uint64   `json:"not_synced_rejects"`
	// LastTimestampMS is the newest reading timestamp accepted;
	// OlderWindows counts accepted batches that started before it.
	LastTimestampMS int64  `json:"last_timestamp_ms,omitempty"`
	OlderWindows    uint64 `json:"older_windows"`

	// Takeovers counts MQTT connections that took over the device's
	// connected session; RecentTakeovers holds the latest within the last
	// hour, and TakeoverFlagged is set while there are more of them than
	// devices.takeover_flag_count (an impersonation attempt, or two
	// devices with one hardware_id).
	Takeovers       uint64      `json:"takeovers"`
	RecentTakeovers []time.Time `json:"recent_takeovers,omitempty"`
	TakeoverFlagged bool        `json:"takeover_flagged"`

	// Version counts changes to what the devices table holds;
	// CloudVersion is the version last written there.
	Version      uint64    `json:"version"`
	CloudVersion uint64    `json:"cloud_version"`
	CloudSeenAt  time.Time `json:"cloud_seen_at,omitzero"`
}

// Anchor is a boot's clock anchor: timestamp = AnchorMS + uptime_ms.
type Anchor struct {
	BootID   string `json:"boot_id"`
	AnchorMS int64  `json:"anchor_ms"`
}

const (
	deviceStatePrefix = "dev/"
	maxAnchors        = 4
	maxRecentBootIDs  = 8
)

// Registry tracks devices: registration, boots, sequence gaps and clock
// anchors. It is kept in memory and on disk (the buffer's state records),
// and it feeds device upserts to the uplink.
type Registry struct {
	cfg    Config
	state  deviceStore
	logger *slog.Logger
	clock  clock.Source

	mu      sync.Mutex
	devices map[string]*Device
	dirty   map[string]bool // to save locally
	// recentBootIDs remembers boots already counted, so that a late batch
	// of an earlier boot is not taken for a reboot.
	recentBootIDs map[string][]string

	m registryMetrics
}

type registryMetrics struct {
	reboots, gaps, replays, repaired, older, notSynced prometheus.Counter
}

// New returns an empty registry that keeps its records in state; it reads
// nothing: Load reads the saved records. clk nil means the system clock.
func New(cfg Config, state deviceStore, clk clock.Source, logger *slog.Logger, reg prometheus.Registerer) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if clk == nil {
		clk = clock.System{}
	}
	r := &Registry{cfg: cfg.withDefaults(), state: state, logger: logger.With("component", "devices"), clock: clk,
		devices: map[string]*Device{}, dirty: map[string]bool{}, recentBootIDs: map[string][]string{}}
	f := promauto.With(reg)
	counter := func(name, help string) prometheus.Counter {
		return f.NewCounter(prometheus.CounterOpts{Namespace: "gateway", Subsystem: "devices", Name: name, Help: help})
	}
	r.m = registryMetrics{
		reboots:   counter("reboots_total", "Device reboots seen (a new boot_id after the first)."),
		gaps:      counter("seq_gap_batches_total", "Batches missing between consecutive seqs of a boot."),
		replays:   counter("seq_replays_total", "Batches that came with a seq already seen in their boot under another batch_id."),
		repaired:  counter("clock_repaired_batches_total", "Batches whose timestamps the gateway repaired from the device uptime."),
		older:     counter("older_windows_total", "Accepted batches that started before the newest reading already accepted from the device."),
		notSynced: counter("clock_not_synced_total", "Batches rejected because the device clock was not synced and could not be repaired."),
	}
	gauge := func(name, help string, fn func(*Device) bool) {
		f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "gateway", Subsystem: "devices", Name: name, Help: help}, func() float64 {
			r.mu.Lock()
			defer r.mu.Unlock()
			n := 0
			for _, d := range r.devices {
				if fn(d) {
					n++
				}
			}
			return float64(n)
		})
	}
	gauge("known", "Devices the gateway has heard from.", func(*Device) bool { return true })
	gauge("registered", "Devices that registered.", func(d *Device) bool { return d.Registered })
	gauge("reboot_loops", "Devices booting more than devices.reboot_loop_boots times within an hour.",
		func(d *Device) bool { return d.RebootLoop })
	gauge("takeover_flagged", "Devices whose MQTT session was taken over more than devices.takeover_flag_count times "+
		"within an hour (an impersonation attempt, or two devices sharing a hardware_id).",
		func(d *Device) bool { return d.TakeoverFlagged })
	gauge("cloud_pending", "Devices whose record still has to be written to the devices table.",
		func(d *Device) bool { return d.Registered && d.Version > d.CloudVersion })
	return r, nil
}

// device returns the record of hw, creating it. Callers hold r.mu.
func (r *Registry) device(hw string, now time.Time) *Device {
	d, ok := r.devices[hw]
	if !ok {
		// Strings of a decoded batch are substrings of its whole payload:
		// the registry keeps copies, so that it does not keep payloads.
		hw = strings.Clone(hw)
		d = &Device{HardwareID: hw, FirstSeenAt: now, LastSeenAt: now}
		r.devices[hw] = d
		r.dirty[hw] = true
	}
	return d
}

// Registered reports whether hw registered.
func (r *Registry) Registered(hw string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.devices[hw]
	return ok && d.Registered
}

// Register records a registration and returns the device's confirmation_id
// and whether this was its first registration. The record is on disk when
// it returns without error.
func (r *Registry) Register(reg *contract.Registration) (confirmationID string, first bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	d := r.device(reg.HardwareID, now)
	first = !d.Registered
	if d.ConfirmationID == "" {
		d.ConfirmationID = uuid.NewString()
		d.FirstRegisteredAt = now
	}
	d.Registered = true
	d.FriendlyName = strings.Clone(reg.FriendlyName)
	d.FirmwareVersion = strings.Clone(reg.FirmwareVersion)
	caps := contract.Capabilities{Sensors: make([]string, 0, len(reg.Capabilities.Sensors)),
		Features: make(map[string]bool, len(reg.Capabilities.Features))}
	for _, name := range reg.Capabilities.Sensors {
		caps.Sensors = append(caps.Sensors, strings.Clone(name))
	}
	for name, has := range reg.Capabilities.Features {
		caps.Features[strings.Clone(name)] = has
	}
	d.Capabilities = &caps
	d.LastSeenAt = now
	r.boot(d, reg.BootID, now)
	d.Version++
	if err := r.save(d); err != nil {
		return "", false, fmt.Errorf("saving device %s: %w", d.HardwareID, err)
	}
	return d.ConfirmationID, first, nil
}

// boot notes boot_id; a boot_id not seen recently is a (re)boot. Callers
// hold r.mu.
func (r *Registry) boot(d *Device, bootID string, bootAt time.Time) bool {
	if bootID == d.BootID {
		return false
	}
	for _, id := range r.recentBootIDs[d.HardwareID] {
		if id == bootID {
			return false // a late batch of an earlier boot
		}
	}
	bootID = strings.Clone(bootID)
	ids := append(r.recentBootIDs[d.HardwareID], bootID)
	if len(ids) > maxRecentBootIDs {
		ids = ids[len(ids)-maxRecentBootIDs:]
	}
	r.recentBootIDs[d.HardwareID] = ids
	if d.BootID != "" {
		d.Reboots++
		r.m.reboots.Inc()
	}
	d.Boots++
	d.BootID = bootID
	d.BootAt = bootAt
	d.Seq = nil
	recent := d.RecentBoots[:0]
	for _, t := range d.RecentBoots {
		if bootAt.Sub(t) < time.Hour {
			recent = append(recent, t)
		}
	}
	d.RecentBoots = append(recent, bootAt)
	loop := len(d.RecentBoots) > r.cfg.RebootLoopBoots
	if loop && !d.RebootLoop {
		r.logger.Warn("device is in a reboot loop", "hardware_id", d.HardwareID,
			"boots_last_hour", len(d.RecentBoots))
	}
	d.RebootLoop = loop
	d.Version++
	return true
}

// Takeover records a takeover of hw's MQTT session and returns the
// takeovers within the last hour (counted up to
// devices.takeover_flag_count + 1) and whether that is more than the
// setting allows. The record is saved with the next flush.
func (r *Registry) Takeover(hw string) (recent int, flagged bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	d := r.device(hw, now)
	d.Takeovers++
	kept := d.RecentTakeovers[:0]
	for _, t := range d.RecentTakeovers {
		if now.Sub(t) < time.Hour {
			kept = append(kept, t)
		}
	}
	kept = append(kept, now)
	if over := len(kept) - (r.cfg.TakeoverFlagCount + 1); over > 0 {
		kept = kept[over:] // enough to tell whether the setting is exceeded
	}
	d.RecentTakeovers = kept
	d.TakeoverFlagged = len(kept) > r.cfg.TakeoverFlagCount
	r.dirty[hw] = true
	return len(kept), d.TakeoverFlagged
}

// Anchor returns the clock anchor of a boot, creating it from this batch
// (receive time - sent_uptime_ms) at the boot's first contact. A new
// anchor is on disk when Anchor returns, so a re-sent batch is repaired the
// same way after a restart too.
func (r *Registry) Anchor(hw, bootID string, receivedMS, sentUptimeMS int64) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.device(hw, r.clock.Now())
	for _, a := range d.Anchors {
		if a.BootID == bootID {
			return a.AnchorMS, nil
		}
	}
	a := Anchor{BootID: strings.Clone(bootID), AnchorMS: contract.ClockAnchor(receivedMS, sentUptimeMS)}
	d.Anchors = append(d.Anchors, a)
	if len(d.Anchors) > maxAnchors {
		d.Anchors = d.Anchors[len(d.Anchors)-maxAnchors:]
	}
	if err := r.save(d); err != nil {
		return 0, fmt.Errorf("saving the clock anchor of %s: %w", hw, err)
	}
	return a.AnchorMS, nil
}

// LastTimestamp returns the device's newest accepted reading timestamp, for
// the ordering rule.
func (r *Registry) LastTimestamp(hw string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.devices[hw]; ok {
		return d.LastTimestampMS
	}
	return 0
}

// NotSynced counts a batch rejected for an unsynced clock.
func (r *Registry) NotSynced(hw string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.device(hw, r.clock.Now()).NotSynced++
	r.dirty[hw] = true
	r.m.notSynced.Inc()
}

// Observe records a batch from hw: seen now, its boot, seq and timestamps.
// stored is false for a duplicate (only the last-seen time changes).
func (r *Registry) Observe(b *contract.Batch, repaired, stored bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	d := r.device(b.HardwareID, now)
	d.LastSeenAt = now
	r.dirty[d.HardwareID] = true
	if now.Sub(d.CloudSeenAt) >= r.cfg.SeenWriteInterval {
		d.Version++ // last_seen_at is due in the devices table
	}
	if !stored {
		return
	}
	bootAt := now
	if b.SentUptimeMS != nil {
		bootAt = time.UnixMilli(now.UnixMilli() - *b.SentUptimeMS)
	}
	if d.FirmwareVersion != b.FirmwareVersion {
		d.FirmwareVersion = strings.Clone(b.FirmwareVersion)
		d.Version++
	}
	// A boot seen in a batch is saved with the next flush: only
	// registrations and clock anchors must be on disk before an ack.
	r.boot(d, b.BootID, bootAt)
	if b.Seq != nil && b.BootID == d.BootID {
		seq := *b.Seq
		switch {
		case d.Seq == nil:
			// The first batch seen of this boot: seqs before it are missing.
			d.Gaps += seq
			r.m.gaps.Add(float64(seq))
		case seq > *d.Seq+1:
			d.Gaps += seq - *d.Seq - 1
			r.m.gaps.Add(float64(seq - *d.Seq - 1))
		case seq <= *d.Seq:
			d.Replays++
			r.m.replays.Inc()
		}
		if d.Seq == nil || seq > *d.Seq {
			d.Seq = &seq
		}
	}
	if repaired {
		d.RepairedBatches++
		r.m.repaired.Inc()
	}
	first, last := b.Readings[0].TimestampMS, b.Readings[0].TimestampMS
	for _, rd := range b.Readings {
		first, last = min(first, rd.TimestampMS), max(last, rd.TimestampMS)
	}
	if d.LastTimestampMS != 0 && first < d.LastTimestampMS {
		d.OlderWindows++
		r.m.older.Inc()
	}
	d.LastTimestampMS = max(d.LastTimestampMS, last)
}

// Devices returns a copy of every record, sorted by hardware_id.
func (r *Registry) Devices() []Device {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Device, 0, len(r.devices))
	for _, d := range r.devices {
		out = append(out, copyDevice(d))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].HardwareID < out[j].HardwareID })
	return out
}

// Device returns one record.
func (r *Registry) Device(hw string) (Device, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.devices[hw]
	if !ok {
		return Device{}, false
	}
	return copyDevice(d), true
}

func copyDevice(d *Device) Device {
	c := *d
	c.RecentBoots = append([]time.Time(nil), d.RecentBoots...)
	c.Anchors = append([]Anchor(nil), d.Anchors...)
	if d.Seq != nil {
		s := *d.Seq
		c.Seq = &s
	}
	return c
}

// PendingUpserts returns registered devices whose record must be written
// to the devices table (the uplink's DeviceSource).
func (r *Registry) PendingUpserts(limit int) []cloud.DeviceUpsert {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []cloud.DeviceUpsert
	for _, d := range r.devices {
		if !d.Registered || d.Version <= d.CloudVersion {
			continue
		}
		u := cloud.DeviceUpsert{
			HardwareID: d.HardwareID, ConfirmationID: d.ConfirmationID, FriendlyName: d.FriendlyName,
			FirmwareVersion: d.FirmwareVersion, LastBootID: d.BootID, FirstRegisteredAt: d.FirstRegisteredAt,
			LastSeenAt: d.LastSeenAt, Version: d.Version,
		}
		if d.Capabilities != nil {
			u.Capabilities = *d.Capabilities
		}
		out = append(out, u)
		if len(out) == limit {
			break
		}
	}
	return out
}

// Upserted records that version of hw's record is in the devices table.
func (r *Registry) Upserted(u cloud.DeviceUpsert) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.devices[u.HardwareID]
	if !ok {
		return
	}
	d.CloudVersion = max(d.CloudVersion, u.Version)
	d.CloudSeenAt = u.LastSeenAt
	r.dirty[d.HardwareID] = true
}

// View calls fn under the registry's lock with the number of devices and
// an iterator over their records, for a reader that walks the whole fleet
// (the operator's status page) without copying every record. fn must not
// keep the records, change them or call the registry.
func (r *Registry) View(fn func(n int, devices iter.Seq[*Device])) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(len(r.devices), maps.Values(r.devices))
}

// TakeoverFlagCount is the number of takeovers within an hour over which
// a device is flagged (devices.takeover_flag_count).
func (r *Registry) TakeoverFlagCount() int { return r.cfg.TakeoverFlagCount }

// Admits reports whether readings from hw are taken: false when hw never
// registered and devices.unknown_devices is "reject".
func (r *Registry) Admits(hw string) bool {
	return r.cfg.UnknownDevices != "reject" || r.Registered(hw)
}

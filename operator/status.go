package operator

import (
	"bytes"
	"container/heap"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"iter"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/delivery"
	"greenhouse-gateway/internal/httpapi"
	"greenhouse-gateway/registry"
)

// StatusSources feed the status page (GET /) and its JSON twin
// (GET /v1/status). A nil func leaves its section out. The devices come
// from Deps.Devices and the recent rejects from Deps.Audit.
type StatusSources struct {
	// Version is the gateway's build version.
	Version string
	// Uptime is how long the process has run (on the monotonic clock:
	// time.Since of its start); nil leaves the uptime out.
	Uptime func() time.Duration
	// Now is the gateway's (corrected) clock; nil means time.Now.
	Now func() time.Time
	// Uplink reports the uplink's state and backlog.
	Uplink func() delivery.Report
	// Buffer reports the disk budget in use and the free space.
	Buffer func() buffer.Space
	// Clock reports the gateway clock's correction.
	Clock func() ClockStatus
}

// ClockStatus is the gateway clock's state.
type ClockStatus struct {
	// OffsetSeconds is the correction applied to the system clock (positive:
	// the system clock is behind).
	OffsetSeconds float64 `json:"offset_seconds"`
	// Learned is true once a server time (DynamoDB's Date header) was seen.
	Learned bool `json:"learned"`
	// Plausible is false while the corrected time is before the release
	// date of the build (forwarding waits).
	Plausible bool `json:"plausible"`
}

// StatusData is what the status page shows and GET /v1/status returns.
type StatusData struct {
	Version string `json:"version"`
	// Now is when the data was taken (the gateway's corrected clock).
	Now           time.Time `json:"now"`
	StartedAt     time.Time `json:"started_at,omitzero"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	// Ready is what /readyz answers; ReadyMessage says why not.
	Ready        bool             `json:"ready"`
	ReadyMessage string           `json:"ready_message,omitempty"`
	Uplink       *delivery.Report `json:"uplink,omitempty"`
	Buffer       *BufferStatus    `json:"buffer,omitempty"`
	Clock        *ClockStatus     `json:"clock,omitempty"`
	Devices      FleetStatus      `json:"devices"`
	// Rejects is left out when the gateway keeps no audit trail.
	Rejects *RejectsStatus `json:"rejects,omitempty"`
}

// RejectsStatus lists the newest records of the audit trail: attempts the
// gateway refused or did not store.
type RejectsStatus struct {
	// Recent holds up to MaxStatusRejects records, newest first.
	Recent []audit.Record `json:"recent"`
	// More is true when older records exist (GET /v1/audit pages them).
	More bool `json:"more"`
	// Error says why the trail could not be read; Recent is then empty.
	Error string `json:"error,omitempty"`
	// LastHour counts the records of the last hour by reason (kept in
	// memory: since the start when that is later).
	LastHour audit.ReasonCounts `json:"last_hour"`
}

// MaxStatusRejects bounds RejectsStatus.Recent. Reading the trail costs
// a scan of its newest segment, so the page asks for no more than this.
const MaxStatusRejects = 20

// BufferStatus is the buffer's disk budget and free space.
type BufferStatus struct {
	UsedBytes   int64 `json:"used_bytes"`
	BudgetBytes int64 `json:"budget_bytes"`
	// UsedFraction is UsedBytes / BudgetBytes (0 to 1, or more).
	UsedFraction float64 `json:"used_fraction"`
	// FreeBytes is the data directory's free space; null when unknown.
	FreeBytes    *uint64 `json:"free_bytes"`
	MinFreeBytes int64   `json:"min_free_bytes"`
}

// FleetStatus counts the devices and lists those that need attention.
type FleetStatus struct {
	// Known is every device the gateway heard from; Registered those that
	// registered.
	Known      int `json:"known"`
	Registered int `json:"registered"`
	// SeenLastHour and SilentOverHour split Known by last contact.
	SeenLastHour   int `json:"seen_last_hour"`
	SilentOverHour int `json:"silent_over_hour"`
	RebootLoops    int `json:"reboot_loops"`
	// ClockProblems counts devices with batches rejected as
	// clock_not_synced or repaired from their uptime.
	ClockProblems int `json:"clock_problems"`
	// TakeoversFlagged counts devices whose MQTT session was taken over
	// more than devices.takeover_flag_count times within an hour.
	TakeoversFlagged int `json:"takeovers_flagged"`
	// NeedAttention counts devices in a reboot loop, silent for over an
	// hour, with clock problems or flagged takeovers; Attention lists the first
	// MaxAttentionDevices of them, worst first.
	NeedAttention int               `json:"need_attention"`
	Attention     []AttentionDevice `json:"attention"`
	// Recent lists the devices seen most recently, newest first, at most
	// MaxListedDevices of them; Known - len(Recent) more are left to
	// GET /v1/devices.
	Recent []DeviceSummary `json:"recent"`
}

// DeviceSummary is a device as the status page lists it: identity, last
// contact, boots and sequence health (the whole record is at
// GET /v1/devices/{hardware_id}).
type DeviceSummary struct {
	HardwareID      string    `json:"hardware_id"`
	FriendlyName    string    `json:"friendly_name,omitempty"`
	Registered      bool      `json:"registered"`
	FirmwareVersion string    `json:"firmware_version,omitempty"`
	LastSeenAt      time.Time `json:"last_seen_at"`
	// BootAt is when the current boot started; zero when no boot_id was
	// seen yet.
	BootAt     time.Time `json:"boot_at,omitzero"`
	Boots      uint64    `json:"boots"`
	Reboots    uint64    `json:"reboots"`
	RebootLoop bool      `json:"reboot_loop"`
	Gaps       uint64    `json:"gaps"`
	Replays    uint64    `json:"replays"`
	// Takeovers counts MQTT connections that took the device's session
	// over; TakeoverFlagged is set when there were too many within an hour.
	Takeovers       uint64 `json:"takeovers"`
	TakeoverFlagged bool   `json:"takeover_flagged"`
}

func summarize(d *registry.Device) DeviceSummary {
	return DeviceSummary{HardwareID: d.HardwareID, FriendlyName: d.FriendlyName, Registered: d.Registered,
		FirmwareVersion: d.FirmwareVersion, LastSeenAt: d.LastSeenAt, BootAt: d.BootAt, Boots: d.Boots,
		Reboots: d.Reboots, RebootLoop: d.RebootLoop, Gaps: d.Gaps, Replays: d.Replays, Takeovers: d.Takeovers,
		TakeoverFlagged: d.TakeoverFlagged}
}

// MaxListedDevices bounds FleetStatus.Recent.
const MaxListedDevices = 100

// seenBefore orders devices newest contact first, then by hardware_id.
func seenBefore(a, b *registry.Device) bool {
	if !a.LastSeenAt.Equal(b.LastSeenAt) {
		return a.LastSeenAt.After(b.LastSeenAt)
	}
	return a.HardwareID < b.HardwareID
}

// oldestFirst is a heap whose root is the device seen least recently: the
// one to drop when a more recent device comes along.
type oldestFirst []*registry.Device

func (h oldestFirst) Len() int           { return len(h) }
func (h oldestFirst) Less(i, j int) bool { return seenBefore(h[j], h[i]) }
func (h oldestFirst) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *oldestFirst) Push(x any)        { *h = append(*h, x.(*registry.Device)) }
func (h *oldestFirst) Pop() any {
	old := *h
	d := old[len(old)-1]
	*h = old[:len(old)-1]
	return d
}

// AttentionDevice is a device that needs an operator's look.
type AttentionDevice struct {
	HardwareID   string    `json:"hardware_id"`
	FriendlyName string    `json:"friendly_name,omitempty"`
	LastSeenAt   time.Time `json:"last_seen_at"`
	Reasons      []string  `json:"reasons"`
	severity     int
}

// MaxAttentionDevices bounds FleetStatus.Attention.
const MaxAttentionDevices = 50

// silentAfter is how long without contact makes a device silent.
const silentAfter = time.Hour

// Attention severities, worst first.
const (
	severityTakeover = iota
	severityRebootLoop
	severityNotSynced
	severitySilent
	severityRepaired
	severityNone
)

// Fleet counts r's devices at now, lists, worst first, up to limit of
// those that need attention, and lists the listed devices seen most
// recently. It walks the registry once; the listing costs O(n log listed).
func Fleet(r *registry.Registry, now time.Time, limit, listed int) FleetStatus {
	f := FleetStatus{Attention: []AttentionDevice{}}
	var all []AttentionDevice
	r.View(func(n int, devices iter.Seq[*registry.Device]) {
		f.Known = n
		recent := make(oldestFirst, 0, min(max(listed, 0), n))
		for d := range devices {
			switch {
			case len(recent) < listed:
				heap.Push(&recent, d)
			case listed > 0 && seenBefore(d, recent[0]):
				recent[0] = d
				heap.Fix(&recent, 0)
			}
			if a, ok := f.count(d, now, r.TakeoverFlagCount()); ok {
				all = append(all, a)
			}
		}
		f.Recent = make([]DeviceSummary, len(recent))
		for i, d := range recent {
			f.Recent[i] = summarize(d) // a copy, taken under the lock
		}
	})
	sort.Slice(f.Recent, func(i, j int) bool {
		a, b := &f.Recent[i], &f.Recent[j]
		if !a.LastSeenAt.Equal(b.LastSeenAt) {
			return a.LastSeenAt.After(b.LastSeenAt)
		}
		return a.HardwareID < b.HardwareID
	})
	f.NeedAttention = len(all)
	sort.Slice(all, func(i, j int) bool {
		if all[i].severity != all[j].severity {
			return all[i].severity < all[j].severity
		}
		if !all[i].LastSeenAt.Equal(all[j].LastSeenAt) {
			return all[i].LastSeenAt.Before(all[j].LastSeenAt)
		}
		return all[i].HardwareID < all[j].HardwareID
	})
	if len(all) > limit {
		all = all[:limit]
	}
	f.Attention = append(f.Attention, all...)
	return f
}

// count adds d to f's counters and returns d's attention entry; ok is
// false when d needs no attention. takeoverFlags is
// devices.takeover_flag_count.
func (f *FleetStatus) count(d *registry.Device, now time.Time, takeoverFlags int) (a AttentionDevice, ok bool) {
	if d.Registered {
		f.Registered++
	}
	a = AttentionDevice{HardwareID: d.HardwareID, FriendlyName: d.FriendlyName, LastSeenAt: d.LastSeenAt,
		severity: severityNone}
	note := func(sev int, reason string) {
		a.Reasons = append(a.Reasons, reason)
		a.severity = min(a.severity, sev)
	}
	if d.RebootLoop {
		f.RebootLoops++
		note(severityRebootLoop, fmt.Sprintf("reboot loop: %d boots in the last hour", len(d.RecentBoots)))
	}
	if n := len(d.RecentTakeovers); d.TakeoverFlagged && n > 0 && now.Sub(d.RecentTakeovers[n-1]) < time.Hour {
		f.TakeoversFlagged++
		note(severityTakeover, fmt.Sprintf("MQTT session taken over more than %d times within an hour: another "+
			"client may be using its identity (audit trail: reason session_takeover)", takeoverFlags))
	}
	if silent := now.Sub(d.LastSeenAt); silent > silentAfter {
		f.SilentOverHour++
		note(severitySilent, "silent for "+humanDuration(silent))
	} else {
		f.SeenLastHour++
	}
	if d.NotSynced > 0 || d.RepairedBatches > 0 {
		f.ClockProblems++
	}
	if d.NotSynced > 0 {
		note(severityNotSynced, fmt.Sprintf("clock not synced: %s rejected", plural(d.NotSynced, "batch", "batches")))
	}
	if d.RepairedBatches > 0 {
		note(severityRepaired, fmt.Sprintf("clock not synced: %s repaired from uptime", plural(d.RepairedBatches, "batch", "batches")))
	}
	return a, a.severity != severityNone
}

// status gathers the status data now; ctx bounds the reading of the audit
// trail.
func (h *API) status(ctx context.Context) StatusData {
	src := h.deps.Status
	now := time.Now()
	if src.Now != nil {
		now = src.Now()
	}
	s := StatusData{Version: src.Version, Now: now.UTC(), Ready: true}
	if src.Uptime != nil {
		// The start time shown is on the corrected clock, as every other
		// time here.
		up := max(0, src.Uptime())
		s.UptimeSeconds = up.Seconds()
		s.StartedAt = now.Add(-up).UTC()
	}
	if h.deps.Ready != nil {
		if err := h.deps.Ready(); err != nil {
			s.Ready, s.ReadyMessage = false, err.Error()
		}
	}
	if src.Uplink != nil {
		r := src.Uplink()
		s.Uplink = &r
	}
	if src.Buffer != nil {
		sp := src.Buffer()
		b := &BufferStatus{UsedBytes: sp.UsedBytes, BudgetBytes: sp.BudgetBytes, MinFreeBytes: sp.MinFreeBytes}
		if sp.BudgetBytes > 0 {
			b.UsedFraction = float64(sp.UsedBytes) / float64(sp.BudgetBytes)
		}
		if sp.FreeKnown {
			free := sp.FreeBytes
			b.FreeBytes = &free
		}
		s.Buffer = b
	}
	if src.Clock != nil {
		c := src.Clock()
		s.Clock = &c
	}
	if h.deps.Devices != nil {
		s.Devices = Fleet(h.deps.Devices, now, MaxAttentionDevices, MaxListedDevices)
	}
	if h.deps.Audit != nil {
		s.Rejects = h.rejects(ctx)
	}
	return s
}

// rejects reads the newest MaxStatusRejects records of the audit trail.
func (h *API) rejects(ctx context.Context) *RejectsStatus {
	res, err := h.deps.Audit.Query(ctx, audit.Filter{Limit: MaxStatusRejects})
	if err != nil {
		h.logger.Warn("reading the audit trail for the status page", "err", err)
		return &RejectsStatus{Recent: []audit.Record{}, Error: err.Error(), LastHour: h.deps.Audit.LastHour()}
	}
	// After the query, which waited for the records queued before it.
	out := &RejectsStatus{Recent: res.Records, More: res.More, LastHour: h.deps.Audit.LastHour()}
	if out.Recent == nil {
		out.Recent = []audit.Record{}
	}
	return out
}

// statusJSON serves GET /v1/status.
func (h *API) statusJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	httpapi.WriteJSON(w, http.StatusOK, h.status(r.Context()))
}

// statusPage serves GET /: the status page, or, without an admin token, a
// short page saying how to turn it on.
func (h *API) statusPage(w http.ResponseWriter, r *http.Request) {
	if h.deps.AdminToken == "" || h.deps.Devices == nil {
		writePage(w, http.StatusForbidden, disabledPage, nil)
		return
	}
	h.admin(func(w http.ResponseWriter, r *http.Request) {
		writePage(w, http.StatusOK, statusTemplate, h.status(r.Context()))
	})(w, r)
}

func writePage(w http.ResponseWriter, code int, t *template.Template, data any) {
	var out bytes.Buffer
	if err := t.Execute(&out, data); err != nil {
		http.Error(w, "rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// No scripts, no external assets: only the page's own inline style.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(code)
	_, _ = w.Write(out.Bytes())
}

//go:embed status.html
var statusHTML string

var (
	statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
		"bytes":    humanBytes,
		"ubytes":   func(n uint64) string { return humanBytes(int64(min(n, math.MaxInt64))) },
		"count":    countAny,
		"ago":      func(t, now time.Time) string { return humanAge(now.Sub(t)) },
		"utc":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"seconds":  func(s float64) string { return humanDuration(time.Duration(s * float64(time.Second))) },
		"percent":  func(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + "%" },
		"barwidth": func(f float64) string { return strconv.FormatFloat(min(max(f, 0), 1)*100, 'f', 1, 64) + "%" },
		"rate":     func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"offset":   humanOffset,
		"join":     strings.Join,
		"deref":    func(f *float64) float64 { return *f },
		"sub":      func(a, b int) int { return a - b },
	}).Parse(statusHTML))
	disabledPage = template.Must(template.New("disabled").Parse(disabledHTML))
)

const disabledHTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Greenhouse gateway: status page off</title>
<style>body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:40rem;padding:0 1rem;line-height:1.5;color:#1d2a22}code{background:#eef3ef;padding:.1rem .3rem;border-radius:3px}</style>
</head><body>
<h1>Status page off</h1>
<p>This gateway has no admin token, so its status page and operator API are turned off.</p>
<p>Set <code>GATEWAY_ADMIN_TOKEN</code>, or <code>admin_token_file</code> in the configuration, and restart the gateway.
Then open this page again and sign in with any user name and the token as password.</p>
</body></html>
`

// humanBytes writes n in IEC units: "512 B", "3.2 MiB".
func humanBytes(n int64) string {
	if n < 1024 && n > -1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v := float64(n)
	for _, unit := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= 1024
		if math.Abs(v) < 1024 || unit == "TiB" {
			return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit
		}
	}
	return "" // not reached
}

// humanCount writes n with thousands separators: "12,345".
func humanCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// humanDuration writes d with its two largest units: "45s", "4m 10s",
// "3h 12m", "2d 4h".
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return twoUnits(s/60, "m", s%60, "s")
	case s < 86400:
		return twoUnits(s/3600, "h", s%3600/60, "m")
	default:
		return twoUnits(s/86400, "d", s%86400/3600, "h")
	}
}

func twoUnits(a int64, ua string, b int64, ub string) string {
	if b == 0 {
		return fmt.Sprintf("%d%s", a, ua)
	}
	return fmt.Sprintf("%d%s %d%s", a, ua, b, ub)
}

// humanAge writes how long ago (or, for a negative d, how far ahead)
// something was: "4m ago", "just now".
func humanAge(d time.Duration) string {
	switch {
	case d > -time.Second && d < time.Second:
		return "just now"
	case d < 0:
		return "in " + humanDuration(d)
	default:
		return humanDuration(d) + " ago"
	}
}

// humanOffset writes a clock correction with its sign: "+3s", "-1h 2m".
func humanOffset(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d == 0:
		return "0s"
	case d < 0:
		return "-" + humanDuration(d)
	default:
		return "+" + humanDuration(d)
	}
}

// countAny is humanCount for the integer types the page shows.
func countAny(v any) string {
	switch n := v.(type) {
	case int:
		return humanCount(int64(n))
	case int64:
		return humanCount(n)
	case uint64:
		return humanCount(int64(min(n, math.MaxInt64)))
	default:
		return fmt.Sprint(v)
	}
}

func plural(n uint64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return humanCount(int64(min(n, math.MaxInt64))) + " " + many
}

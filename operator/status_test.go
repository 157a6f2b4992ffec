package operator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/delivery"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
)

// statusClock is a settable clock.
type statusClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *statusClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *statusClock) Plausible() bool { return true }

func (c *statusClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// statusT0 is when the status fixture's first device was seen.
var statusT0 = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

// markupHW is a device record on disk whose hardware_id holds markup: the
// registry loads records without validating them again.
const markupHW = `<img src=x onerror=alert(1)>`

// statusFleet registers, at a fixed clock, a fleet with one device of each
// kind, and returns the registry and the time the page is looked at
// (statusT0 + 2h5m):
//
//	AA:BB:CC:DD:EE:01  registered, silent since statusT0
//	AA:BB:CC:DD:EE:02  registered, 3 boots in a minute: reboot loop (limit 2)
//	AA:BB:CC:DD:EE:03  registered, 2 batches rejected as clock_not_synced
//	AA:BB:CC:DD:EE:04  registered, fine but for 2 seq gaps and 1 replay
//	AA:BB:CC:DD:EE:05  not registered, 1 batch repaired from its uptime
//	markupHW          loaded from disk, silent since statusT0 - 1h
func statusFleet(t *testing.T) (*registry.Registry, *statusClock, time.Time) {
	t.Helper()
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, buf.Close()) })
	raw, err := json.Marshal(registry.Device{HardwareID: markupHW, FriendlyName: "x",
		FirstSeenAt: statusT0.Add(-2 * time.Hour), LastSeenAt: statusT0.Add(-time.Hour)})
	require.NoError(t, err)
	require.NoError(t, buf.SaveState("dev/"+markupHW, raw))

	clk := &statusClock{now: statusT0}
	devices, err := registry.New(registry.Config{RebootLoopBoots: 2}, buf, clk, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	require.NoError(t, devices.Load())
	register := func(hw, name, boot string) {
		_, _, err := devices.Register(&contract.Registration{HardwareID: hw, BootID: boot, FirmwareVersion: "1.0.16",
			FriendlyName: name, Capabilities: contract.Capabilities{Sensors: []string{"bme280_temp_c"}, Features: map[string]bool{}}})
		require.NoError(t, err)
	}
	register("AA:BB:CC:DD:EE:01", "North bench", gatewaytest.NewBoot())
	clk.set(statusT0.Add(2 * time.Hour))
	for range 3 {
		register("AA:BB:CC:DD:EE:02", "<script>alert('loop')</script>", gatewaytest.NewBoot())
	}
	register("AA:BB:CC:DD:EE:03", "Seedlings", gatewaytest.NewBoot())
	devices.NotSynced("AA:BB:CC:DD:EE:03")
	devices.NotSynced("AA:BB:CC:DD:EE:03")
	boot04 := gatewaytest.NewBoot()
	register("AA:BB:CC:DD:EE:04", "South bench", boot04)
	for i, seq := range []uint64{0, 3, 1} { // 1 and 2 missing, then 1 again under a new batch_id
		devices.Observe(&contract.Batch{BatchID: fmt.Sprintf("AA:BB:CC:DD:EE:04_%d", i), HardwareID: "AA:BB:CC:DD:EE:04",
			BootID: boot04, Seq: &seq, FirmwareVersion: "1.0.16",
			Readings: []contract.Reading{{TimestampMS: statusT0.Add(2 * time.Hour).UnixMilli()}}}, false, true)
	}
	devices.Observe(&contract.Batch{BatchID: "AA:BB:CC:DD:EE:05_x", HardwareID: "AA:BB:CC:DD:EE:05", BootID: gatewaytest.NewBoot(),
		FirmwareVersion: "1.0.16", Readings: []contract.Reading{{TimestampMS: statusT0.UnixMilli()}}}, true, true)
	now := statusT0.Add(2*time.Hour + 5*time.Minute)
	clk.set(now)
	return devices, clk, now
}

// statusSources are the figures the fixture's page must show.
func statusSources(clk *statusClock, eta *float64) operator.StatusSources {
	errAt := statusT0.Add(2*time.Hour + 4*time.Minute)
	delivered := statusT0.Add(2*time.Hour + time.Minute)
	return operator.StatusSources{
		Version: "1.4.2-test",
		Uptime:  func() time.Duration { return 3*time.Hour + 12*time.Minute + 30*time.Second },
		Now:     clk.Now,
		Uplink: func() delivery.Report {
			return delivery.Report{State: "down", Since: statusT0.Add(2 * time.Hour), BacklogBatches: 1234,
				BacklogBytes: 3355443, OldestAgeSeconds: 754, DrainRateBatches: 4.5, ETASeconds: eta,
				LastError: `<b>dial tcp 127.0.0.1:8000</b>: connection refused`, LastErrorAt: &errAt, FailedRounds: 7,
				LastDeliveryAt: &delivered}
		},
		Buffer: func() buffer.Space {
			return buffer.Space{UsedBytes: 900000000, BudgetBytes: 1 << 30, FreeBytes: 12<<30 + 512<<20, FreeKnown: true,
				MinFreeBytes: 256 << 20}
		},
		Clock: func() operator.ClockStatus {
			return operator.ClockStatus{OffsetSeconds: 3, Learned: true, Plausible: true}
		},
	}
}

// markupAuditHW and markupAuditMessage are what a device sent that the
// audit trail keeps as is: markup the page must show as text.
const (
	markupAuditHW      = `<svg onload=alert(2)>`
	markupAuditMessage = `<script>alert("audit")</script> is not a number`
)

// statusRejects are the audit fixture's records, oldest first.
func statusRejects() []audit.Record {
	return []audit.Record{
		{Time: statusT0.Add(2*time.Hour + time.Minute), Transport: contract.TransportHTTP, Kind: "readings",
			HardwareID: "AA:BB:CC:DD:EE:03", BatchID: "AA:BB:CC:DD:EE:03_1", Reason: audit.ReasonClockNotSynced,
			Message: "device clock not synced and no uptime to repair it", RemoteAddr: "192.0.2.3:4000"},
		{Time: statusT0.Add(2*time.Hour + 2*time.Minute), Transport: contract.TransportMQTT, Kind: "publish",
			HardwareID: "AA:BB:CC:DD:EE:02", Reason: audit.ReasonACLDenied, Topic: "devices/AA:BB:CC:DD:EE:01/readings",
			Message: "publish to a topic other than the device's own readings and register topics; disconnected"},
		{Time: statusT0.Add(2*time.Hour + 3*time.Minute), Transport: contract.TransportHTTP, Kind: "readings",
			HardwareID: markupAuditHW, Reason: audit.ReasonValidation, Field: "readings[0].values.<b>t</b>",
			Message: markupAuditMessage},
	}
}

// statusAudit opens an audit trail, runs it until the test ends and
// records recs in it.
func statusAudit(t testing.TB, clk *statusClock, recs []audit.Record) *audit.Log {
	t.Helper()
	// Opened at statusT0, as if the gateway had run since: its counts of
	// the last hour then span the whole hour.
	opening := true
	trail, err := audit.Open(t.TempDir(), audit.Config{}, func() time.Time {
		if opening {
			return statusT0
		}
		return clk.Now()
	}, nil, nil)
	require.NoError(t, err)
	opening = false
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- trail.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	for _, r := range recs {
		trail.Record(r)
	}
	return trail
}

// startStatusServer serves the HTTP API with the status fixture on a
// loopback port and returns its base URL. trail may be nil: no audit
// trail.
func startStatusServer(t testing.TB, token string, devices *registry.Registry, trail *audit.Log, src operator.StatusSources) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	ready := func() error { return nil }
	ops := operator.New(operator.Deps{Devices: devices, AdminToken: token, Status: src, Audit: trail, Ready: ready}, nil)
	api, err := httpserve.NewHTTPServer(httpserve.HTTPConfig{Addr: "127.0.0.1:0"}, httpserve.HTTPDeps{
		Routes: ops.Routes, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: ready,
	}, nil)
	require.NoError(t, err)
	require.NoError(t, api.Listen())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return "http://" + api.Addr()
}

type authMode int

const (
	authNone authMode = iota
	authBasic
	authBearer
)

func get(t *testing.T, url string, mode authMode, user, token string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	switch mode {
	case authBasic:
		req.SetBasicAuth(user, token)
	case authBearer:
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

func TestStatusAuth(t *testing.T) {
	devices, clk, _ := statusFleet(t)
	on := startStatusServer(t, gatewaytest.AdminToken, devices, statusAudit(t, clk, statusRejects()), statusSources(clk, nil))
	off := startStatusServer(t, "", devices, nil, statusSources(clk, nil))
	const challenge = `Basic realm="greenhouse-gateway"`

	tests := []struct {
		name      string
		base      string
		path      string
		mode      authMode
		user      string
		token     string
		code      int
		challenge bool
		contains  string
	}{
		{"page without credentials", on, "/", authNone, "", "", 401, true, "missing or wrong admin token"},
		{"page, Basic with a wrong token", on, "/", authBasic, "operator", "wrong", 401, true, ""},
		{"page, Basic with an empty password", on, "/", authBasic, "admin-secret", "", 401, true, ""},
		{"page, Bearer with a wrong token", on, "/", authBearer, "", "wrong", 401, true, ""},
		{"page, Basic with the token", on, "/", authBasic, "operator", gatewaytest.AdminToken, 200, false, "<title>Greenhouse gateway"},
		{"page, Basic with any user name", on, "/", authBasic, "", gatewaytest.AdminToken, 200, false, "<title>Greenhouse gateway"},
		{"page, Bearer with the token", on, "/", authBearer, "", gatewaytest.AdminToken, 200, false, "<title>Greenhouse gateway"},
		{"JSON without credentials", on, "/v1/status", authNone, "", "", 401, true, ""},
		{"JSON, Basic with the token", on, "/v1/status", authBasic, "ops", gatewaytest.AdminToken, 200, false, `"backlog_batches":1234`},
		{"JSON, Bearer with the token", on, "/v1/status", authBearer, "", gatewaytest.AdminToken, 200, false, `"backlog_batches":1234`},
		{"devices, Basic with the token", on, "/v1/devices", authBasic, "ops", gatewaytest.AdminToken, 200, false, `"count":6`},
		{"devices without credentials", on, "/v1/devices", authNone, "", "", 401, true, ""},
		{"other paths are not the page", on, "/index.html", authBasic, "ops", gatewaytest.AdminToken, 404, false, ""},
		{"page without an admin token", off, "/", authNone, "", "", 403, false, "GATEWAY_ADMIN_TOKEN"},
		{"JSON without an admin token", off, "/v1/status", authBasic, "ops", gatewaytest.AdminToken, 403, false, "GATEWAY_ADMIN_TOKEN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := get(t, tt.base+tt.path, tt.mode, tt.user, tt.token)
			require.Equal(t, tt.code, resp.StatusCode, body)
			if tt.challenge {
				require.Equal(t, challenge, resp.Header.Get("WWW-Authenticate"))
			} else {
				require.Empty(t, resp.Header.Get("WWW-Authenticate"))
			}
			require.Contains(t, body, tt.contains)
			if tt.path == "/" && resp.StatusCode != 401 {
				require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
				require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
			}
		})
	}
}

func TestStatusPageContent(t *testing.T) {
	devices, clk, _ := statusFleet(t)
	trail := statusAudit(t, clk, statusRejects())
	eta := 274.0
	tests := []struct {
		name    string
		eta     *float64
		want    []string
		notWant []string
	}{
		{"no ETA", nil, []string{"unknown: no recent delivery to estimate from"}, []string{"4m 34s"}},
		{"with ETA", &eta, []string{"<dt>Time to drain</dt><dd>4m 34s</dd>"}, []string{"unknown: no recent delivery"}},
	}
	common := []string{
		`<meta http-equiv="refresh" content="10">`,
		"version 1.4.2-test · up 3h 12m (since 2026-11-20 10:52:30 UTC)",
		"as of 2026-11-20 14:05:00 UTC",
		`<span class="badge ok">ready</span>`,
		"<dt>Clock offset</dt><dd>&#43;3s",
		"(learned from DynamoDB)",
		`<span class="badge bad">down</span>`,
		"<dd>2026-11-20 14:00:00 UTC <span class=\"muted age\">(5m ago)</span></dd>",
		"<dd>1,234 batches, 3.2 MiB</dd>",
		"<dt>Oldest waiting</dt><dd>12m 34s</dd>",
		"<dd>4.5 batches/s</dd>",
		"<dt>Failed rounds</dt><dd>7</dd>",
		"<dt>Last delivery</dt><dd>2026-11-20 14:01:00 UTC",
		"(2026-11-20 14:04:00 UTC, 1m ago)",
		"&lt;b&gt;dial tcp 127.0.0.1:8000&lt;/b&gt;: connection refused",
		"<dd>858.3 MiB of 1.0 GiB (83.8%)</dd>",
		`<span class="badge warn">filling</span>`,
		`style="width:83.8%"`,
		"<dd>12.5 GiB <span",
		"below 256.0 MiB",
		"<b>4</b>registered", "<b>6</b>known", "<b>4</b>seen in the last hour",
		"<b>2</b>silent over 1h", "<b>1</b>reboot loops", "<b>2</b>clock problems",
		"5 need attention",
		"reboot loop: 3 boots in the last hour",
		"clock not synced: 2 batches rejected",
		"silent for 2h 5m",
		"clock not synced: 1 batch repaired from uptime",
		"&lt;script&gt;alert(&#39;loop&#39;)&lt;/script&gt;",
		"&lt;img src=x onerror=alert(1)&gt;",
		`<a href="/metrics">`, `<a href="/v1/devices">`, `<a href="/v1/uplink">`, `<a href="/v1/audit">`, `<a href="/v1/status">`,
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := startStatusServer(t, gatewaytest.AdminToken, devices, trail, statusSources(clk, tt.eta))
			resp, page := get(t, base+"/", authBasic, "operator", gatewaytest.AdminToken)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			for _, s := range append(common, tt.want...) {
				require.Contains(t, page, s)
			}
			for _, s := range tt.notWant {
				require.NotContains(t, page, s)
			}
			require.NotContains(t, page, "<script>", "markup from devices and errors is escaped")
			require.NotContains(t, page, "<img")
			require.NotContains(t, page, "<svg")
			require.NotContains(t, page, "<b>dial")
			require.NotContains(t, page, "<b>t")

			// Attention rows, worst first: the loop, the rejects, the
			// silent ones (longest first), the repaired; EE:04 is fine.
			attention := between(t, page, `<table id="attention">`, "</table>")
			requireRows(t, attention, "AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03", "&lt;img src=x", "AA:BB:CC:DD:EE:01", "AA:BB:CC:DD:EE:05")
			require.NotContains(t, attention, `<td class="hw">AA:BB:CC:DD:EE:04`)

			// Every device, newest contact first.
			list := between(t, page, `<section id="device-list"`, "</section>")
			requireRows(t, list, "AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03", "AA:BB:CC:DD:EE:04", "AA:BB:CC:DD:EE:05",
				"AA:BB:CC:DD:EE:01", "&lt;img src=x")
			for _, s := range []string{
				`<td class="hw">AA:BB:CC:DD:EE:02</td><td class="name">&lt;script&gt;alert(&#39;loop&#39;)&lt;/script&gt;</td>` +
					`<td class="when">2026-11-20 14:00:00 UTC <span class="muted age">(5m ago)</span></td>` +
					`<td class="nowrap">3 <span class="muted">(2 reboots)</span></td>` +
					`<td class="nowrap">5m ago<br><span class="badge bad">reboot loop</span></td>`,
				`<td class="hw">AA:BB:CC:DD:EE:04</td><td class="name">South bench</td>`,
				`<td class="num warned">2</td><td class="num warned">1</td><td><span class="badge ok">yes</span></td>`,
				`<td class="hw">AA:BB:CC:DD:EE:05</td><td class="name"></td>`,
				`<td class="nowrap">0 <span class="muted">(0 reboots)</span></td><td class="nowrap"><span class="muted">unknown</span></td>` +
					`<td class="num">0</td><td class="num">0</td><td><span class="badge warn">no</span></td>`,
				"(2h 5m ago)", "(3h 5m ago)",
			} {
				require.Contains(t, list, s)
			}
			require.NotContains(t, list, "more: see /v1/devices", "all 6 devices listed")

			// The audit trail's records, newest first.
			rejects := between(t, page, `<section id="rejects"`, "</section>")
			requireRows(t, rejects, "&lt;svg onload=alert(2)&gt;", "AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03")
			for _, s := range []string{
				`<span class="badge warn">newest 3</span>`,
				`<p id="reject-counts"><b>3</b> since 2026-11-20 13:05:00 UTC <span class="muted age">(1h ago)</span>: ` +
					`<span class="badge warn">acl_denied 1</span> <span class="badge warn">clock_not_synced 1</span> ` +
					`<span class="badge warn">validation_error 1</span></p>`,
				`<td class="when">2026-11-20 14:03:00 UTC <span class="muted age">(2m ago)</span></td><td>http <span class="muted">readings</span></td>`,
				`<td class="nowrap">validation_error</td><td class="path">readings[0].values.&lt;b&gt;t&lt;/b&gt;</td>`,
				`<td class="msg">&lt;script&gt;alert(&#34;audit&#34;)&lt;/script&gt; is not a number</td>`,
				`<td>mqtt <span class="muted">publish</span></td><td class="hw">AA:BB:CC:DD:EE:02</td><td class="nowrap">acl_denied</td>` +
					`<td class="path">devices/AA:BB:CC:DD:EE:01/readings</td>`,
				`(4m ago)</span></td><td>http <span class="muted">readings</span></td><td class="hw">AA:BB:CC:DD:EE:03</td><td class="nowrap">clock_not_synced</td>`,
			} {
				require.Contains(t, rejects, s)
			}
			require.NotContains(t, rejects, "Older records")
		})
	}
}

// between returns the part of page from the first from to the next to.
func between(t *testing.T, page, from, to string) string {
	t.Helper()
	i := strings.Index(page, from)
	require.GreaterOrEqual(t, i, 0, "%s in the page", from)
	j := strings.Index(page[i:], to)
	require.GreaterOrEqual(t, j, 0, "%s after %s", to, from)
	return page[i : i+j]
}

// requireRows asserts that part has a row for each hardware ID, in this
// order.
func requireRows(t *testing.T, part string, hws ...string) {
	t.Helper()
	last := -1
	for _, hw := range hws {
		i := strings.Index(part, `<td class="hw">`+hw)
		require.Greater(t, i, last, "row %s in order", hw)
		last = i
	}
	require.Equal(t, len(hws), strings.Count(part, "<tr><td"), "rows")
}

func TestStatusJSON(t *testing.T) {
	devices, clk, now := statusFleet(t)
	base := startStatusServer(t, gatewaytest.AdminToken, devices, statusAudit(t, clk, statusRejects()), statusSources(clk, nil))
	resp, body := get(t, base+"/v1/status", authBearer, "", gatewaytest.AdminToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `"eta_seconds":null`)

	var s operator.StatusData
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	require.Equal(t, "1.4.2-test", s.Version)
	require.True(t, now.Equal(s.Now))
	require.Equal(t, (3*time.Hour + 12*time.Minute + 30*time.Second).Seconds(), s.UptimeSeconds)
	require.True(t, now.Add(-(3*time.Hour + 12*time.Minute + 30*time.Second)).Equal(s.StartedAt))
	require.True(t, s.Ready)
	require.Equal(t, "down", s.Uplink.State)
	require.EqualValues(t, 1234, s.Uplink.BacklogBatches)
	require.Nil(t, s.Uplink.ETASeconds)
	require.Equal(t, 7, s.Uplink.FailedRounds)
	require.EqualValues(t, 900000000, s.Buffer.UsedBytes)
	require.InDelta(t, 0.838, s.Buffer.UsedFraction, 0.001)
	require.NotNil(t, s.Buffer.FreeBytes)
	require.EqualValues(t, uint64(12<<30+512<<20), *s.Buffer.FreeBytes)
	require.Equal(t, operator.ClockStatus{OffsetSeconds: 3, Learned: true, Plausible: true}, *s.Clock)

	f := s.Devices
	require.Equal(t, 6, f.Known)
	require.Equal(t, 4, f.Registered)
	require.Equal(t, 4, f.SeenLastHour)
	require.Equal(t, 2, f.SilentOverHour)
	require.Equal(t, 1, f.RebootLoops)
	require.Equal(t, 2, f.ClockProblems)
	require.Equal(t, 5, f.NeedAttention)
	var order []string
	for _, a := range f.Attention {
		order = append(order, a.HardwareID)
	}
	require.Equal(t, []string{"AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03", markupHW, "AA:BB:CC:DD:EE:01", "AA:BB:CC:DD:EE:05"}, order)
	require.Equal(t, []string{"silent for 2h 5m"}, f.Attention[3].Reasons)
	require.True(t, statusT0.Equal(f.Attention[3].LastSeenAt))

	order = nil
	for _, d := range f.Recent {
		order = append(order, d.HardwareID)
	}
	require.Equal(t, []string{"AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03", "AA:BB:CC:DD:EE:04", "AA:BB:CC:DD:EE:05",
		"AA:BB:CC:DD:EE:01", markupHW}, order)
	loop := f.Recent[0]
	require.Equal(t, "<script>alert('loop')</script>", loop.FriendlyName, "JSON keeps the name as sent")
	require.True(t, loop.Registered)
	require.True(t, loop.RebootLoop)
	require.EqualValues(t, 3, loop.Boots)
	require.EqualValues(t, 2, loop.Reboots)
	require.True(t, statusT0.Add(2*time.Hour).Equal(loop.BootAt))
	require.Equal(t, "1.0.16", loop.FirmwareVersion)
	seq := f.Recent[2]
	require.EqualValues(t, 2, seq.Gaps)
	require.EqualValues(t, 1, seq.Replays)
	require.False(t, seq.RebootLoop)
	require.False(t, f.Recent[3].Registered)
	require.True(t, statusT0.Add(-time.Hour).Equal(f.Recent[5].LastSeenAt))

	require.NotNil(t, s.Rejects)
	require.Empty(t, s.Rejects.Error)
	require.False(t, s.Rejects.More)
	want := statusRejects()
	slices.Reverse(want)
	require.Len(t, s.Rejects.Recent, len(want))
	for i := range want {
		got := s.Rejects.Recent[i]
		require.True(t, want[i].Time.Equal(got.Time), "record %d time", i)
		got.Time = want[i].Time
		require.Equal(t, want[i], got, "record %d, newest first", i)
	}
	require.True(t, now.Add(-time.Hour).Equal(s.Rejects.LastHour.Since))
	require.Equal(t, map[string]int{audit.ReasonACLDenied: 1, audit.ReasonClockNotSynced: 1, audit.ReasonValidation: 1},
		s.Rejects.LastHour.ByReason)
	require.Equal(t, 3, s.Rejects.LastHour.Total)
	// JSON escapes markup its own way; the raw text has no tag in it.
	require.NotContains(t, body, "<script>")
	require.NotContains(t, body, "<svg")
}

func TestStatusSectionsLeftOut(t *testing.T) {
	devices, clk, _ := statusFleet(t)
	base := startStatusServer(t, gatewaytest.AdminToken, devices, nil, operator.StatusSources{Version: "dev", Now: clk.Now})
	resp, page := get(t, base+"/", authBasic, "operator", gatewaytest.AdminToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, page, "version dev · as of 2026-11-20 14:05:00 UTC")
	for _, s := range []string{`id="uplink"`, `id="buffer"`, "Clock offset", "Uptime"} {
		require.NotContains(t, page, s)
	}
	require.Contains(t, page, `id="devices"`)

	resp, body := get(t, base+"/v1/status", authBasic, "operator", gatewaytest.AdminToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(body), &raw))
	for _, k := range []string{"uplink", "buffer", "clock", "started_at", "rejects"} {
		require.NotContains(t, raw, k)
	}
	require.NotContains(t, page, `id="rejects"`, "no audit trail, no rejects section")
	require.Contains(t, page, `id="device-list"`)
}

// TestStatusCaps checks that the page and /v1/status list at most
// MaxListedDevices devices, the newest, and MaxStatusRejects audit
// records, the newest, and say where the rest are.
func TestStatusCaps(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, buf.Close()) })
	extra := 7
	total := operator.MaxListedDevices + extra
	records := map[string][]byte{}
	for i := range total {
		// Device i was last seen i minutes before statusT0: 0 is the newest.
		hw := fmt.Sprintf("02:00:00:00:00:%02X", i)
		raw, err := json.Marshal(registry.Device{HardwareID: hw, Registered: true, FriendlyName: fmt.Sprintf("bench %d", i),
			FirstSeenAt: statusT0.Add(-24 * time.Hour), LastSeenAt: statusT0.Add(-time.Duration(i) * time.Minute)})
		require.NoError(t, err)
		records["dev/"+hw] = raw
	}
	require.NoError(t, buf.SaveStates(records))
	clk := &statusClock{now: statusT0}
	devices, err := registry.New(registry.Config{}, buf, clk, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	require.NoError(t, devices.Load())
	var recs []audit.Record
	for i := range operator.MaxStatusRejects + 5 {
		recs = append(recs, audit.Record{Time: statusT0.Add(time.Duration(i-60) * time.Second), Transport: contract.TransportHTTP,
			Kind: "readings", HardwareID: "02:00:00:00:00:01", Reason: audit.ReasonDuplicate, BatchID: fmt.Sprintf("b-%02d", i),
			Message: "batch already stored; not stored again"})
	}
	base := startStatusServer(t, gatewaytest.AdminToken, devices, statusAudit(t, clk, recs), operator.StatusSources{Version: "dev", Now: clk.Now})

	resp, page := get(t, base+"/", authBasic, "operator", gatewaytest.AdminToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	list := between(t, page, `<section id="device-list"`, "</section>")
	require.Equal(t, operator.MaxListedDevices, strings.Count(list, "<tr><td"))
	require.Contains(t, list, `<td class="hw">02:00:00:00:00:00</td><td class="name">bench 0</td>`)
	require.Contains(t, list, fmt.Sprintf(`<td class="hw">02:00:00:00:00:%02X</td>`, operator.MaxListedDevices-1))
	require.NotContains(t, list, fmt.Sprintf(`<td class="hw">02:00:00:00:00:%02X</td>`, operator.MaxListedDevices))
	require.Contains(t, list, fmt.Sprintf("%d more: see /v1/devices.", extra))
	rejects := between(t, page, `<section id="rejects"`, "</section>")
	require.Equal(t, operator.MaxStatusRejects, strings.Count(rejects, "<tr><td"))
	require.Contains(t, rejects, fmt.Sprintf(`<span class="badge warn">newest %d</span>`, operator.MaxStatusRejects))
	require.Contains(t, rejects, "Older records: see /v1/audit.")
	require.Contains(t, rejects, fmt.Sprintf(`<b>%d</b> since`, len(recs)), "the count is not capped")
	require.Contains(t, rejects, fmt.Sprintf(`<span class="badge warn">duplicate %d</span>`, len(recs)))

	resp, body := get(t, base+"/v1/status", authBasic, "operator", gatewaytest.AdminToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var s operator.StatusData
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	require.Equal(t, total, s.Devices.Known)
	require.Len(t, s.Devices.Recent, operator.MaxListedDevices)
	for i, d := range s.Devices.Recent {
		require.Equal(t, fmt.Sprintf("02:00:00:00:00:%02X", i), d.HardwareID, "newest first")
	}
	require.Len(t, s.Rejects.Recent, operator.MaxStatusRejects)
	require.True(t, s.Rejects.More)
	require.Equal(t, map[string]int{audit.ReasonDuplicate: len(recs)}, s.Rejects.LastHour.ByReason)
	for i, r := range s.Rejects.Recent {
		require.Equal(t, fmt.Sprintf("b-%02d", len(recs)-1-i), r.BatchID, "newest first")
	}
}

func TestFleetLimit(t *testing.T) {
	devices, _, now := statusFleet(t)
	tests := []struct {
		limit int
		want  []string
	}{
		{0, []string{}},
		{2, []string{"AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03"}},
		{operator.MaxAttentionDevices, []string{"AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03", markupHW, "AA:BB:CC:DD:EE:01", "AA:BB:CC:DD:EE:05"}},
	}
	for _, tt := range tests {
		f := operator.Fleet(devices, now, tt.limit, operator.MaxListedDevices)
		require.Equal(t, 5, f.NeedAttention, "limit %d", tt.limit)
		got := []string{}
		for _, a := range f.Attention {
			got = append(got, a.HardwareID)
		}
		require.Equal(t, tt.want, got, "limit %d", tt.limit)
	}
	for _, listed := range []int{0, 1, 5, 6, 7} {
		f := operator.Fleet(devices, now, 0, listed)
		got := []string{}
		for _, d := range f.Recent {
			got = append(got, d.HardwareID)
		}
		all := []string{"AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03", "AA:BB:CC:DD:EE:04", "AA:BB:CC:DD:EE:05",
			"AA:BB:CC:DD:EE:01", markupHW}
		require.Equal(t, all[:min(listed, len(all))], got, "listed %d", listed)
	}
}

func TestStatusPageStates(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, buf.Close()) })
	clk := &statusClock{now: statusT0}
	empty, err := registry.New(registry.Config{}, buf, clk, nil, prometheus.NewRegistry())
	require.NoError(t, err)

	tests := []struct {
		name    string
		src     operator.StatusSources
		ready   error
		want    []string
		notWant []string
	}{
		{
			name: "all well",
			src: operator.StatusSources{Version: "dev", Now: clk.Now,
				Uplink: func() delivery.Report { return delivery.Report{State: "up", Since: statusT0.Add(-time.Minute)} },
				Buffer: func() buffer.Space {
					return buffer.Space{UsedBytes: 1 << 20, BudgetBytes: 1 << 30, FreeBytes: 1 << 30, FreeKnown: true}
				},
				Clock: func() operator.ClockStatus { return operator.ClockStatus{Plausible: true} },
			},
			want: []string{"<title>Greenhouse gateway</title>", `<span class="badge ok">ready</span>`,
				`<span class="badge ok">up</span>`, "<dt>Since</dt><dd>2026-11-20 11:59:00 UTC <span class=\"muted age\">(1m ago)</span>", "<dt>Oldest waiting</dt><dd>none</dd>",
				"<dt>Time to drain</dt><dd>nothing to drain</dd>", `<span class="badge ok">room</span>`,
				"<dd>1.0 MiB of 1.0 GiB (0.1%)</dd>", "<dt>Clock offset</dt><dd>0s", "(not learned yet: system clock as is)",
				`<span class="badge ok">all well</span>`, "No device needs attention.", "<b>0</b>known",
				"No device has been heard from yet.", `<h2>Recent rejects <span class="badge ok">none</span></h2>`,
				"No refused attempts recorded.",
				`<p id="reject-counts">None since 2026-11-20 12:00:00 UTC <span class="muted age">(just now)</span>.</p>`},
			notWant: []string{"Last error", "Failed rounds", "Last delivery", "<table", "implausible"},
		},
		{
			name:  "stopping, buffer nearly full, clock implausible",
			ready: errors.New("shutting down"),
			src: operator.StatusSources{Version: "dev", Now: clk.Now,
				Buffer: func() buffer.Space { return buffer.Space{UsedBytes: 1000, BudgetBytes: 1024} },
				Clock:  func() operator.ClockStatus { return operator.ClockStatus{OffsetSeconds: -3720, Plausible: false} },
			},
			want: []string{"<title>Greenhouse gateway: not ready</title>", `<span class="badge bad">not ready</span>`,
				"<dt>Readiness</dt><dd>shutting down</dd>", `<span class="badge bad">nearly full</span>`,
				`<div class="bar full">`, "<dd>1000 B of 1.0 KiB (97.7%)</dd>", "<dd>unknown <span",
				"<dd>-1h 2m", `<span class="badge bad">implausible</span>`},
			notWant: []string{`id="uplink"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			ready := func() error { return tt.ready }
			ops := operator.New(operator.Deps{Devices: empty, AdminToken: gatewaytest.AdminToken, Status: tt.src,
				Audit: statusAudit(t, clk, nil), Ready: ready}, nil)
			api, err := httpserve.NewHTTPServer(httpserve.HTTPConfig{Addr: "127.0.0.1:0"}, httpserve.HTTPDeps{
				Routes: ops.Routes, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: ready,
			}, nil)
			require.NoError(t, err)
			require.NoError(t, api.Listen())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- api.Run(ctx) }()
			defer func() {
				cancel()
				require.NoError(t, <-done)
			}()
			resp, page := get(t, "http://"+api.Addr()+"/", authBasic, "operator", gatewaytest.AdminToken)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			for _, s := range tt.want {
				require.Contains(t, page, s)
			}
			for _, s := range tt.notWant {
				require.NotContains(t, page, s)
			}
		})
	}
}

//go:build unix

package operator_test

import (
	"image"
	"image/color"
	"image/png"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/chromiumtest"
	"greenhouse-gateway/harness/gatewaytest"
)

// browserURL serves the status fixture behind a loopback proxy that signs
// every request in with Basic auth, as a browser does once the operator
// typed the token, and returns the proxy's URL.
func browserURL(t *testing.T) string {
	t.Helper()
	devices, clk, _ := statusFleet(t)
	eta := 274.0
	base := startStatusServer(t, gatewaytest.AdminToken, devices, statusAudit(t, clk, statusRejects()), statusSources(clk, &eta))
	target, err := url.Parse(base)
	require.NoError(t, err)
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.SetBasicAuth("operator", gatewaytest.AdminToken)
	}}
	srv := httptest.NewServer(proxy) // 127.0.0.1
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs chromium")
	}
	page := browserURL(t)

	t.Run("DOM", func(t *testing.T) {
		dom := chromiumtest.DumpDOM(t, page)
		for _, s := range []string{
			"<title>Greenhouse gateway: uplink down</title>",
			"version 1.4.2-test · up 3h 12m",
			"<dd>1,234 batches, 3.2 MiB</dd>",
			"<dt>Time to drain</dt><dd>4m 34s</dd>",
			"<dt>Clock offset</dt><dd>+3s",
			"<dd>858.3 MiB of 1.0 GiB (83.8%)</dd>",
			"<b>4</b>registered", "<b>2</b>silent over 1h", "<b>1</b>reboot loops", "<b>2</b>clock problems",
			`<td class="hw">AA:BB:CC:DD:EE:02</td>`,
			"&lt;script&gt;alert('loop')&lt;/script&gt;",
			`<td class="hw">&lt;img src=x onerror=alert(1)&gt;</td><td class="name">x</td>`,
			"&lt;b&gt;dial tcp 127.0.0.1:8000&lt;/b&gt;",
			// The device list, newest contact first, with boots and seq health.
			`<section id="device-list" class="wide">`,
			`<td class="nowrap">3 <span class="muted">(2 reboots)</span></td><td class="nowrap">5m ago<br><span class="badge bad">reboot loop</span></td>`,
			`<td class="num warned">2</td><td class="num warned">1</td><td><span class="badge ok">yes</span></td>`,
			`<td class="hw">AA:BB:CC:DD:EE:05</td><td class="name"></td>`,
			// The recent rejects, newest first.
			`<section id="rejects" class="wide">`,
			`<span class="badge warn">newest 3</span>`,
			`<span class="badge warn">acl_denied 1</span>`,
			`<td class="hw">&lt;svg onload=alert(2)&gt;</td><td class="nowrap">validation_error</td>`,
			`<td class="msg">&lt;script&gt;alert("audit")&lt;/script&gt; is not a number</td>`,
			`<td class="path">devices/AA:BB:CC:DD:EE:01/readings</td>`,
			"clock_not_synced",
		} {
			require.Contains(t, dom, s)
		}
		list := between(t, dom, `<section id="device-list"`, "</section>")
		requireRows(t, list, "AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03", "AA:BB:CC:DD:EE:04", "AA:BB:CC:DD:EE:05",
			"AA:BB:CC:DD:EE:01", "&lt;img src=x")
		rejects := between(t, dom, `<section id="rejects"`, "</section>")
		requireRows(t, rejects, "&lt;svg onload=alert(2)&gt;", "AA:BB:CC:DD:EE:02", "AA:BB:CC:DD:EE:03")
		// Markup from devices and errors stayed text: no element made of it.
		require.NotContains(t, dom, "<script")
		require.NotContains(t, dom, "<img")
		require.NotContains(t, dom, "<svg")
		require.NotContains(t, dom, "<b>dial")
		require.NotContains(t, dom, "<b>t")
	})

	for _, tt := range []struct {
		name          string
		width, height int
	}{
		{"desktop", 1280, 900},
		{"phone", 412, 915},
		// Tall windows take in the device list and the rejects below.
		{"desktop-full", 1280, 2000},
		{"phone-full", 412, 3400},
	} {
		t.Run("screenshot "+tt.name, func(t *testing.T) {
			file := chromiumtest.Screenshot(t, page, tt.width, tt.height)
			if dir := os.Getenv("STATUS_SCREENSHOT_DIR"); dir != "" {
				raw, err := os.ReadFile(file)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(dir, "status-"+tt.name+".png"), raw, 0o644))
			}
			img := decodePNG(t, file)
			require.Equal(t, image.Rect(0, 0, tt.width, tt.height), img.Bounds())
			// The header bar is the page's green (#24523a): the style applied.
			requireNear(t, color.RGBA{0x24, 0x52, 0x3a, 0xff}, img.At(4, 4))
			// Text and boxes, not one flat colour: many distinct colours.
			colours := map[color.RGBA]bool{}
			for y := 0; y < tt.height; y += 2 {
				for x := 0; x < tt.width; x += 2 {
					colours[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)] = true
				}
			}
			require.Greater(t, len(colours), 50, "distinct colours")
		})
	}
}

func decodePNG(t *testing.T, file string) image.Image {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	return img
}

// requireNear asserts that got is want within a small rounding difference
// per channel.
func requireNear(t *testing.T, want color.RGBA, got color.Color) {
	t.Helper()
	g := color.RGBAModel.Convert(got).(color.RGBA)
	near := func(a, b uint8) bool { return int(a)-int(b) <= 3 && int(b)-int(a) <= 3 }
	require.True(t, near(want.R, g.R) && near(want.G, g.G) && near(want.B, g.B), "colour %v, want about %v", g, want)
}

//go:build unix

package chromiumtest

import (
	"fmt"
	"image/color"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDumpDOMAndScreenshot(t *testing.T) {
	if testing.Short() {
		t.Skip("runs chromium")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><html><head><title>probe</title></head>` +
			`<body style="margin:0;background:rgb(200,30,40)"><p id="x">rendered &amp; served</p></body></html>`))
	}))
	t.Cleanup(srv.Close)

	dom := DumpDOM(t, srv.URL)
	require.Contains(t, dom, `<p id="x">rendered &amp; served</p>`)

	file := Screenshot(t, srv.URL, 320, 240)
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Equal(t, 320, img.Bounds().Dx())
	require.Equal(t, 240, img.Bounds().Dy())
	got := color.RGBAModel.Convert(img.At(300, 230)).(color.RGBA)
	require.Equal(t, color.RGBA{200, 30, 40, 255}, got, "the page's background")
}

// recorder is a testing.TB that records Skipf and Fatalf instead of
// stopping the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestMissingChromiumSkipsOrFailsUnderCI(t *testing.T) {
	if _, err := exec.LookPath("chromium"); err != nil {
		t.Skip("chromium is not installed: this test hides an installed one")
	}
	// Without chromium and apt-get on PATH, installing is impossible.
	t.Setenv("PATH", t.TempDir())
	for _, tt := range []struct {
		name, ci string
		skip     bool
	}{
		{"outside CI", "", true},
		{"under CI", "true", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			r := &recorder{TB: t}
			require.Empty(t, binary(r))
			msg := r.failed
			if tt.skip {
				msg = r.skipped
				require.Empty(t, r.failed)
			} else {
				require.Empty(t, r.skipped)
			}
			require.Contains(t, msg, "chromium is not installed")
		})
	}
}

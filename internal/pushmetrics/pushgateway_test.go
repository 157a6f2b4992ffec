package pushmetrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"greenhouse-gateway/harness/debpkg"
)

// pushgatewayBinary is the Debian package prometheus-pushgateway's program.
const pushgatewayBinary = "prometheus-pushgateway"

// ensurePushgateway returns the Pushgateway's path, installing the Debian package with
// apt-get when it is missing (as root; otherwise the test fails and says what to install).
// Under -short the test is skipped.
func ensurePushgateway(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test needs the Debian package prometheus-pushgateway")
	}
	if path, err := exec.LookPath(pushgatewayBinary); err == nil {
		return path
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), debpkg.Timeout)
	defer cancel()
	present := func() bool { _, err := exec.LookPath(pushgatewayBinary); return err == nil }
	require.NoError(t, debpkg.Install(ctx, present, "prometheus-pushgateway"))
	path, err := exec.LookPath(pushgatewayBinary)
	require.NoError(t, err)
	t.Logf("installed prometheus-pushgateway in %s", time.Since(begin).Round(time.Second))
	return path
}

// startPushgateway runs a Pushgateway (in memory, no persistence file) on a free loopback
// port, waits until it is ready, and stops it at the test's cleanup. It returns its URL.
func startPushgateway(t *testing.T) string {
	t.Helper()
	bin := ensurePushgateway(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	var logs strings.Builder
	var logMu sync.Mutex
	cmd := exec.Command(bin, "--web.listen-address="+addr)
	w := writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	})
	cmd.Stdout, cmd.Stderr = w, w
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			logMu.Lock()
			t.Logf("pushgateway log:\n%s", logs.String())
			logMu.Unlock()
		}
	})
	url := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 15*time.Second, 20*time.Millisecond, "the pushgateway did not become ready on %s", addr)
	http.DefaultClient.CloseIdleConnections()
	return url
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// sample reads metric name with the given labels from the Pushgateway's /metrics; ok is false
// when it is not there.
func sample(t *testing.T, url, name string, labels map[string]string) (value float64, ok bool) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err)
	mf, found := families[name]
	if !found {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		return metricValue(m), true
	}
	return 0, false
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// TestPushesToARealPushgateway pushes a registry to Debian's prometheus-pushgateway and reads
// the values back from the Pushgateway's own /metrics: the first push at once, later values
// at the next interval, and the last value through the final push after the context ends.
func TestPushesToARealPushgateway(t *testing.T) {
	url := startPushgateway(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	reg := prometheus.NewRegistry()
	batches := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "gateway", Subsystem: "pushtest", Name: "batches_total",
		Help: "Batches counted by the push test."})
	up := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gateway", Subsystem: "pushtest", Name: "up", Help: "A gauge."})
	reg.MustRegister(batches, up)
	batches.Add(3)
	up.Set(1)

	p, err := New(Config{URL: url, Interval: time.Second, Instance: "gw-push-test"}, reg, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	group := map[string]string{"job": DefaultJob, "instance": "gw-push-test"}
	waitFor := func(name string, want float64) {
		t.Helper()
		require.Eventually(t, func() bool {
			v, ok := sample(t, url, name, group)
			return ok && v == want
		}, 10*time.Second, 20*time.Millisecond, "%s%v never became %v", name, group, want)
	}
	waitFor("gateway_pushtest_batches_total", 3)
	waitFor("gateway_pushtest_up", 1)
	pushed, ok := sample(t, url, "push_time_seconds", group)
	require.True(t, ok, "the Pushgateway records the push time the GatewayPushStale alert watches")
	require.InDelta(t, float64(time.Now().Unix()), pushed, 30)

	// The next interval carries new values.
	batches.Add(2)
	waitFor("gateway_pushtest_batches_total", 5)

	// The final push carries the last values without waiting for an interval.
	batches.Add(1)
	up.Set(0)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	v, ok := sample(t, url, "gateway_pushtest_batches_total", group)
	require.True(t, ok)
	require.Equal(t, 6.0, v, "the final push reached the Pushgateway before Run returned")
	v, _ = sample(t, url, "gateway_pushtest_up", group)
	require.Equal(t, 0.0, v)
}

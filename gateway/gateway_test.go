package gateway

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/internal/cloud"
)

// recorder notes what happened, in order.
type recorder struct {
	mu    sync.Mutex
	notes []string
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, s)
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.notes...)
}

// part is a long-running part that notes when it stopped; slow parts
// linger, so that a step that did not wait for them shows.
func (r *recorder) part(name string, linger time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		time.Sleep(linger)
		r.note(name)
		return nil
	}
}

// TestShutdownStepsRunInOrder checks the order runSteps stops the parts
// in: ready once every part runs; on the shutdown, stopping, then the
// ingest path, the device side, the uplink, the background parts, and the
// store last, each step once the one before it returned.
func TestShutdownStepsRunInOrder(t *testing.T) {
	var r recorder
	s := steps{
		stopIngest: func() error { time.Sleep(20 * time.Millisecond); r.note("ingest"); return nil },
		device:     []func(context.Context) error{r.part("device-slow", 40*time.Millisecond), r.part("device", 0)},
		uplink:     []func(context.Context) error{r.part("uplink", 20*time.Millisecond)},
		background: []func(context.Context) error{r.part("background-slow", 40*time.Millisecond), r.part("background", 0)},
		closeStore: func() error { r.note("store"); return nil },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runSteps(newStages(ctx), s, 10*time.Second, func(mqtt, http string) { r.note("ready " + mqtt + " " + http) },
			func() { r.note("stopping") }, slog.New(slog.DiscardHandler), func() string { return "m" }, func() string { return "h" })
	}()
	require.Eventually(t, func() bool { return len(r.all()) == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	got := r.all()
	require.Equal(t, []string{"ready m h", "stopping", "ingest"}, got[:3])
	require.ElementsMatch(t, []string{"device-slow", "device"}, got[3:5])
	require.Equal(t, "uplink", got[5])
	require.ElementsMatch(t, []string{"background-slow", "background"}, got[6:8])
	require.Equal(t, []string{"store"}, got[8:])
}

// TestShutdownClosesTheStoreAfterATimeout checks that a shutdown past its
// timeout returns an error and still closes the store.
func TestShutdownClosesTheStoreAfterATimeout(t *testing.T) {
	var r recorder
	stuck := make(chan struct{})
	defer close(stuck)
	s := steps{
		stopIngest: func() error { return nil },
		device:     []func(context.Context) error{func(ctx context.Context) error { <-ctx.Done(); <-stuck; return nil }},
		closeStore: func() error { r.note("store"); return nil },
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := runSteps(newStages(ctx), s, 50*time.Millisecond, nil, nil, slog.New(slog.DiscardHandler), nil, nil)
	require.ErrorContains(t, err, "shutdown did not finish within 50ms")
	require.Equal(t, []string{"store"}, r.all())
}

// fakeKeys is an api_keys table that knows no key.
type fakeKeys struct{}

func (fakeKeys) LookupHash(context.Context, string) (cloud.KeyInfo, bool, error) {
	return cloud.KeyInfo{}, false, nil
}
func (fakeKeys) TouchLastUsed(context.Context, string, time.Time) error { return nil }
func (fakeKeys) Rehash(context.Context, string, string, string) error   { return nil }

// TestGatewayStopsItsPartsInOrder runs a gateway built by New and checks,
// from a background part as it stops, that the ingest path stopped and
// both listeners closed while the buffer still works, and that the buffer
// is closed once Run returned.
func TestGatewayStopsItsPartsInOrder(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	var r recorder
	var g *Gateway
	var mqttAddr, httpAddr string
	ready := make(chan struct{})
	g, err = New(Config{
		MQTT: broker.MQTTConfig{Addr: "127.0.0.1:0"}, HTTP: httpserve.HTTPConfig{Addr: "127.0.0.1:0"},
		AuditDir: t.TempDir(), Peppers: auth.Peppers{Current: "pepper"},
	}, Deps{
		Buffer: buf, Keys: fakeKeys{}, NoUplink: true,
		Ready: func(mqttWhere, httpWhere string) { mqttAddr, httpAddr = mqttWhere, httpWhere; close(ready) },
		Stopping: func() {
			if !g.ingest.Stopping() {
				r.note("stopping before the ingest path")
			}
		},
		Background: []func(context.Context) error{func(ctx context.Context) error {
			<-ctx.Done()
			if g.ingest.Stopping() {
				r.note("ingest stopped")
			}
			for _, addr := range []string{mqttAddr, httpAddr} {
				if c, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
					r.note("closed " + strings.Split(addr, ":")[0])
				} else {
					_ = c.Close()
				}
			}
			if buf.Ping(context.Background()) == nil {
				r.note("buffer open")
			}
			return nil
		}},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	<-ready
	c, err := net.DialTimeout("tcp", mqttAddr, time.Second)
	require.NoError(t, err, "the broker serves once ready")
	_ = c.Close()
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, []string{"stopping before the ingest path", "ingest stopped", "closed 127.0.0.1", "closed 127.0.0.1",
		"buffer open"}, r.all())
	require.Error(t, buf.Ping(context.Background()), "the buffer is closed last")
	require.NoError(t, g.Close(), "nothing left to release")
}

// TestNewNeedsAnUplinkOrNoUplink checks that a gateway without the
// uplink's clients is refused unless it says it has no uplink.
func TestNewNeedsAnUplinkOrNoUplink(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	_, err = New(Config{Peppers: auth.Peppers{Current: "pepper"}}, Deps{Buffer: buf, Keys: fakeKeys{}})
	require.ErrorContains(t, err, "Deps.NoUplink")
}

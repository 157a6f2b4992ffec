package pushmetrics

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // "" means valid
	}{
		{"off", Config{}, ""},
		{"defaults", DefaultConfig(), ""},
		{"http", Config{URL: "http://127.0.0.1:9091", Interval: 15 * time.Second}, ""},
		{"https behind a path with credentials", Config{URL: "https://gw:secret@push.example/pushgateway/"}, ""},
		{"no scheme", Config{URL: "pushgateway:9091"}, "want an absolute http or https URL"},
		{"other scheme", Config{URL: "ftp://pushgateway:9091"}, "want an absolute http or https URL"},
		{"no host", Config{URL: "http:///metrics"}, "want an absolute http or https URL"},
		{"query", Config{URL: "http://pushgateway:9091/?job=x"}, "no query or fragment"},
		{"unparsable, password kept out", Config{URL: "http://gw:s3cret@[::1"}, "push.url: want an http or https URL"},
		{"unit-less interval", Config{URL: "http://pushgateway:9091", Interval: 30}, "push.interval: 30ns is too short"},
		{"negative interval", Config{Interval: -time.Second}, "push.interval"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "s3cret")
			_, err = New(tc.cfg, prometheus.NewRegistry(), nil)
			require.ErrorContains(t, err, tc.want, "New validates")
		})
	}
}

func TestNewAppliesDefaults(t *testing.T) {
	p, err := New(Config{URL: "http://127.0.0.1:9091/"}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	host, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, DefaultInterval, p.interval)
	require.Equal(t, 10*time.Second, p.timeout, "a push is bounded by min(interval, 10s)")
	require.Equal(t, DefaultJob, p.job)
	require.Equal(t, host, p.instance)

	_, err = New(Config{URL: "http://127.0.0.1:9091"}, nil, nil)
	require.Error(t, err, "a gatherer is required when pushing")
}

func TestRunIsANoOpWhenOff(t *testing.T) {
	p, err := New(Config{}, nil, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }() // not cancelled: it must return by itself
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return at once with pushing off")
	}
}

// doerFunc is an in-memory Pushgateway.
type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

func answer(code int) *http.Response {
	return &http.Response{StatusCode: code, Body: io.NopCloser(strings.NewReader(http.StatusText(code))), Header: http.Header{}}
}

// logRecords is a slog.Handler that keeps the records.
type logRecords struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// at returns the messages logged at level, with their attributes as text.
func (l *logRecords) at(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level != level {
			continue
		}
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.Key + "=" + a.Value.String())
			return true
		})
		out = append(out, b.String())
	}
	return out
}

// TestFailuresAreLoggedOncePerStateChange runs the push loop on synctest's fake clock against
// an in-memory Pushgateway that fails four pushes and then recovers: one warning when pushing
// starts failing, one info line when it recovers, the repeats only at debug level; a push
// every interval throughout, and a final one after the context ends.
func TestFailuresAreLoggedOncePerStateChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "pushtest_total", Help: "A test counter."}))
		logs := &logRecords{}
		p, err := New(Config{URL: "http://pushgateway.invalid:9091", Interval: 10 * time.Second, Instance: "gw-1"}, reg, slog.New(logs))
		require.NoError(t, err)
		var (
			mu       sync.Mutex
			pushes   []time.Time
			requests []string
		)
		start := time.Now()
		p.pusher.Client(doerFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			defer mu.Unlock()
			pushes = append(pushes, time.Now())
			requests = append(requests, r.Method+" "+r.URL.Path)
			switch n := len(pushes); {
			case n == 2:
				return nil, errors.New("dial tcp: connection refused")
			case n >= 3 && n <= 5:
				return answer(http.StatusBadGateway), nil
			}
			return answer(http.StatusOK), nil
		}))

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(75 * time.Second) // pushes at 0, 10, ..., 70 s
		synctest.Wait()
		cancel()
		require.NoError(t, <-done)

		mu.Lock()
		defer mu.Unlock()
		require.Len(t, pushes, 9, "8 on the ticker (0-70 s) and the final one")
		for _, r := range requests {
			require.Equal(t, "PUT /metrics/job/greenhouse_gateway/instance/gw-1", r)
		}
		for i, at := range pushes[:8] {
			require.Equal(t, time.Duration(i)*10*time.Second, at.Sub(start), "push %d", i)
		}
		require.Equal(t, 75*time.Second, pushes[8].Sub(start), "the final push follows the cancel at once")

		warns := logs.at(slog.LevelWarn)
		require.Len(t, warns, 1, "one warning for the whole outage: %v", warns)
		require.Contains(t, warns[0], "pushing metrics failed")
		require.Contains(t, warns[0], "connection refused")
		infos := logs.at(slog.LevelInfo)
		require.Len(t, infos, 2, "start and recovery: %v", infos)
		require.Contains(t, infos[1], "pushing metrics recovered")
		require.Contains(t, infos[1], "failed_pushes=4")
		require.Contains(t, infos[1], "down_for=40s")
		require.Len(t, logs.at(slog.LevelDebug), 3, "the repeats")
	})
}

// TestCredentialsAreBasicAuthAndNeverLogged checks that user:password in the URL leaves the
// URL and travels as an Authorization header, and that no log line or error shows it.
func TestCredentialsAreBasicAuthAndNeverLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecords{}
		p, err := New(Config{URL: "https://gw-7:s3cret@push.example/pgw/", Instance: "gw-7"}, prometheus.NewRegistry(), slog.New(logs))
		require.NoError(t, err)
		var seen *http.Request
		p.pusher.Client(doerFunc(func(r *http.Request) (*http.Response, error) {
			seen = r
			return answer(http.StatusUnauthorized), nil
		}))
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // one push at start and the final one
		require.NoError(t, p.Run(ctx))

		require.NotNil(t, seen)
		require.Nil(t, seen.URL.User)
		require.Equal(t, "https://push.example/pgw/metrics/job/greenhouse_gateway/instance/gw-7", seen.URL.String())
		require.Equal(t, "Basic "+base64.StdEncoding.EncodeToString([]byte("gw-7:s3cret")), seen.Header.Get("Authorization"))
		all := append(append(logs.at(slog.LevelInfo), logs.at(slog.LevelWarn)...), logs.at(slog.LevelDebug)...)
		require.NotEmpty(t, logs.at(slog.LevelWarn), "the 401 is logged")
		for _, line := range all {
			require.NotContains(t, line, "s3cret")
		}
	})
}

package buffer

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestGroupWait(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name     string
		rate     float64
		maxWait  time.Duration
		halfRate float64
		min, max time.Duration
	}{
		{"off", 10_000, 0, 2000, 0, 0},
		{"no half rate", 10_000, 2 * ms, 0, 0, 0},
		{"idle: a lone device is not delayed", 0, 2 * ms, 2000, 0, 0},
		{"negative rate", -5, 2 * ms, 2000, 0, 0},
		{"NaN rate", math.NaN(), 2 * ms, 2000, 0, 0},
		{"a few devices wait a few microseconds", 10, 2 * ms, 2000, 0, 2 * time.Microsecond},
		{"a tenth of the half rate", 200, 2 * ms, 2000, 15 * time.Microsecond, 20 * time.Microsecond},
		{"half rate waits half", 2000, 2 * ms, 2000, 980 * time.Microsecond, 1000 * time.Microsecond},
		{"twice the half rate", 4000, 2 * ms, 2000, 1960 * time.Microsecond, 2 * ms},
		{"far above saturates", 1e9, 2 * ms, 2000, 2 * ms, 2 * ms},
		{"infinite rate", math.Inf(1), 2 * ms, 2000, 2 * ms, 2 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := groupWait(tt.rate, tt.maxWait, tt.halfRate)
			require.GreaterOrEqual(t, got, tt.min)
			require.LessOrEqual(t, got, tt.max)
		})
	}
}

func TestGroupWaitGrowsWithTheRate(t *testing.T) {
	prev := time.Duration(0)
	for rate := 0.0; rate <= 10_000; rate += 50 {
		w := groupWait(rate, 4*time.Millisecond, 1000)
		require.GreaterOrEqual(t, w, prev, "rate %v", rate)
		require.LessOrEqual(t, w, 4*time.Millisecond)
		prev = w
	}
}

func TestArrivalRate(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		// arrivals: at offset, n requests.
		arrivals []arrival
		min, max float64
	}{
		{"first request", []arrival{{0, 1}}, 0, 0},
		{"steady 1000/s for a second", steady(1000, time.Second), 900, 1100},
		{"steady 10/s for a second", steady(10, time.Second), 5, 15},
		{"a lone request after a second of idle follows a burst", append(steady(5000, 500*time.Millisecond),
			arrival{1500 * time.Millisecond, 1}), 0, 100},
		{"a lone request after three seconds of idle", append(steady(5000, 500*time.Millisecond),
			arrival{3500 * time.Millisecond, 1}), 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a arrivalRate
			var got float64
			for _, ar := range tt.arrivals {
				got = a.observe(t0.Add(ar.at), ar.n)
			}
			require.GreaterOrEqual(t, got, tt.min)
			require.LessOrEqual(t, got, tt.max)
		})
	}
}

// arrival is n commit requests arriving at an offset.
type arrival struct {
	at time.Duration
	n  int
}

// steady is one request every 1/rate seconds for d.
func steady(rate float64, d time.Duration) []arrival {
	var out []arrival
	step := time.Duration(float64(time.Second) / rate)
	for at := time.Duration(0); at <= d; at += step {
		out = append(out, arrival{at, 1})
	}
	return out
}

// TestGroupWaitCommits runs concurrent committers with the wait on: every
// commit is stored and answered, and the wait histogram counts one
// observation per group.
func TestGroupWaitCommits(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := Open(t.TempDir(), Options{GroupMaxWait: 2 * time.Millisecond, GroupWaitRate: 100}, nil, reg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	const committers, each = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, committers)
	for c := range committers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				out, err := b.Commit(context.Background(), []Entry{entry(fmt.Sprintf("c%d-%d", c, i), "payload")})
				if err != nil {
					errs <- err
					return
				}
				if out[0] != Stored {
					errs <- fmt.Errorf("c%d-%d: %s", c, i, out[0])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(committers*each), b.Stats().PendingBatches)
	families, err := reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, f := range families {
		if h := f.GetMetric()[0].GetHistogram(); h != nil {
			counts[f.GetName()] = h.GetSampleCount()
		}
	}
	groups := counts["gateway_buffer_commit_group_batches"]
	require.Positive(t, groups)
	require.Equal(t, groups, counts["gateway_buffer_commit_wait_seconds"], "one wait observation per group")
	require.Equal(t, float64(committers*each), testutil.ToFloat64(b.metrics.outcomes.WithLabelValues("stored")))
}

func TestGroupWaitSettingsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"negative wait", Options{GroupMaxWait: -time.Millisecond}, "buffer.group_max_wait"},
		{"wait too long", Options{GroupMaxWait: time.Second}, "buffer.group_max_wait"},
		{"negative rate", Options{GroupWaitRate: -1}, "buffer.group_wait_rate"},
		{"NaN rate", Options{GroupWaitRate: math.NaN()}, "buffer.group_wait_rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorContains(t, tt.opts.Validate(), tt.want)
		})
	}
	require.NoError(t, Options{GroupMaxWait: 2 * time.Millisecond, GroupWaitRate: 500}.Validate())
}

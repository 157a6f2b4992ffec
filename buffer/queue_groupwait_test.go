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

// TestGroupWaitPinned pins groupWait and the committer's rate estimate to
// the figures they gave before they were built on internal/adaptive, to the
// nanosecond and to the last bit.
func TestGroupWaitPinned(t *testing.T) {
	const ms = time.Millisecond
	waits := []struct {
		rate     float64
		maxWait  time.Duration
		halfRate float64
		want     time.Duration
	}{
		{10, 2 * ms, 2000, 726},
		{200, 2 * ms, 2000, 17536},
		{1000, 2 * ms, 2000, 206141},
		{2000, 2 * ms, 2000, 981684},
		{2500, 2 * ms, 2000, 1452265},
		{4000, 2 * ms, 2000, 1963368},
		{123.456, 4 * ms, 1000, 45420},
		{777, 100 * ms, 500, 89987629},
	}
	for _, w := range waits {
		require.Equal(t, w.want, groupWait(w.rate, w.maxWait, w.halfRate), "rate %v", w.rate)
	}
	t0 := time.Unix(1_700_000_000, 0)
	rates := []struct {
		at   time.Duration
		n    int
		want float64
	}{
		{0, 3, 0},
		{10 * ms, 2, 0},
		{60 * ms, 5, 35.56202315557442},
		{61 * ms, 1, 35.56202315557442},
		{130 * ms, 7, 54.787628462172265},
		{400 * ms, 0, 18.605633486451026},
		{410 * ms, 4, 18.605633486451026},
		{1500 * ms, 1, 4.7180761414111245},
	}
	r := newArrivalRate()
	for _, x := range rates {
		require.Equal(t, x.want, r.Add(x.n, t0.Add(x.at)), "at %v", x.at)
	}
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

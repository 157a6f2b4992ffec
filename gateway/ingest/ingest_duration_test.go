package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
)

// slowStore stores every batch after a delay, as a slow disk would.
type slowStore struct{ delay time.Duration }

func (s slowStore) Commit(ctx context.Context, entries []buffer.Entry) ([]buffer.Outcome, error) {
	time.Sleep(s.delay)
	return storeAll{}.Commit(ctx, entries)
}

func (s slowStore) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	return ingest.CommitFunc(s.Commit).Submit(ctx, entries)
}

// TestIngestDurationIncludesTheCommit checks gateway_ingest_duration_seconds:
// one observation per message or request, by transport, and the time spent
// committing (the fsync) counted in it.
func TestIngestDurationIncludesTheCommit(t *testing.T) {
	reg := prometheus.NewRegistry()
	in, err := ingest.New(ingest.Config{}, ingest.Deps{Store: slowStore{delay: 40 * time.Millisecond}, Registerer: reg})
	require.NoError(t, err)
	hw := "AA:BB:CC:DD:EE:31"
	_, err = in.Readings(context.Background(), ingest.Sender{HardwareID: hw}, [][]byte{gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 2)})
	require.NoError(t, err)
	_, err = in.Readings(context.Background(), ingest.Sender{},
		[][]byte{gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 1, 2), gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 2, 2)})
	require.NoError(t, err)
	_, err = in.Readings(context.Background(), ingest.Sender{}, [][]byte{[]byte(`{"batch_id":`)})
	require.NoError(t, err, "a rejected batch is answered, not failed")

	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]*dto.Histogram{}
	for _, f := range families {
		if f.GetName() != "gateway_ingest_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetHistogram()
		}
	}
	require.Len(t, got, 2, "both transports are exported from the start")
	require.EqualValues(t, 1, got["mqtt"].GetSampleCount())
	require.GreaterOrEqual(t, got["mqtt"].GetSampleSum(), 0.040, "the commit's 40 ms are counted")
	require.EqualValues(t, 2, got["http"].GetSampleCount(), "one per request, whatever it holds")
	for _, b := range got["mqtt"].GetBucket() {
		if b.GetUpperBound() < 0.040 {
			require.Zero(t, b.GetCumulativeCount(), "bucket le=%g", b.GetUpperBound())
		}
	}
}

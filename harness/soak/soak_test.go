package soak_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/soak"
)

// TestSoakShort runs every fault scenario for 30 s of load each (at least
// 10 kill -9 cycles of gatewayd, and 10 power cuts where FUSE works) and
// checks that every batch acknowledged to a device is in DynamoDB exactly
// once. It uses bounded,
// generous waits and no timing assertions, so that it holds on a busy
// 2-core machine.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak starts DynamoDB Local and gatewayd processes")
	}
	const killCycles = 12
	cfg := soak.Config{
		Duration:       150 * time.Second, // 30 s of load per scenario
		KillCycles:     killCycles,
		PowerCutCycles: killCycles,
		Devices:        6,
		Interval:       250 * time.Millisecond,
		Seed:           20261122,
		WorkDir:        t.TempDir(),
		DrainTimeout:   4 * time.Minute,
		Scenarios:      soak.FaultScenarios(), // the steady scenario is make soak's hour
		Logger:         slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	rep, err := soak.Run(ctx, cfg)
	var table strings.Builder
	rep.WriteTable(&table)
	t.Logf("soak figures:\n%s", table.String())
	require.NoError(t, err)

	require.Len(t, rep.Scenarios, len(soak.FaultScenarios()))
	for _, f := range rep.Scenarios {
		if f.Skipped != "" {
			require.Equal(t, soak.ScenarioPowerCut, f.Scenario, "only the power cuts may be skipped")
			t.Logf("%s skipped: %s", f.Scenario, f.Skipped)
			continue
		}
		require.Positive(t, f.Cycles, "%s injected no fault", f.Scenario)
		require.Positive(t, f.Acknowledged, "%s acknowledged nothing", f.Scenario)
		require.Zero(t, f.Lost, "%s lost acknowledged batches", f.Scenario)
		require.Zero(t, f.Duplicated, "%s duplicated batches", f.Scenario)
		require.Zero(t, f.Stray, "%s has batches in the cloud no device was told about", f.Scenario)
		require.Empty(t, f.Problems, "%s", f.Scenario)
		require.Equal(t, f.Acknowledged, f.Delivered, f.Scenario)
		if f.Scenario == soak.ScenarioKill9 || f.Scenario == soak.ScenarioPowerCut {
			require.GreaterOrEqual(t, f.Cycles, 10, "%s cycles", f.Scenario)
		}
	}
	require.True(t, rep.OK())
}

package quality

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
)

func temp(v float64) contract.Reading {
	return contract.Reading{Sensors: map[string]float64{"t_c": v}}
}

func TestWindowKeepsDevicesApart(t *testing.T) {
	w := NewWindow(2)
	for range StuckRun {
		require.Equal(t, 1.0, w.Score("a", temp(22)))
		require.Equal(t, 1.0, w.Score("b", temp(40)))
	}
	require.Equal(t, stuckPenalty, w.Score("a", temp(22)), "a's own run")
	require.Equal(t, spikeFloor, w.Score("b", temp(22)), "22 is a spike for b")
	require.Equal(t, 2, w.Len())
}

func TestWindowForgetsTheLeastRecentlyUsedDevice(t *testing.T) {
	w := NewWindow(2)
	for range StuckRun {
		w.Score("a", temp(22))
		w.Score("b", temp(22))
	}
	w.Score("a", temp(22.1)) // a is now the most recently used
	w.Score("c", temp(22))   // forgets b
	require.Equal(t, 2, w.Len())
	require.Equal(t, spikeFloor, w.Score("a", temp(40)), "a kept its history")
	require.Equal(t, 1.0, w.Score("b", temp(22)), "b starts again without history (a stuck run otherwise)")
}

func TestWindowAtLeastOneDevice(t *testing.T) {
	w := NewWindow(0)
	w.Score("a", temp(1))
	w.Score("b", temp(1))
	require.Equal(t, 1, w.Len())
}

func TestWindowBoundsSensorsPerDevice(t *testing.T) {
	h := newHistory(HistoryLen)
	for i := range MaxSensorsPerDevice + 10 {
		h.add(contract.Reading{Sensors: map[string]float64{fmt.Sprintf("s%03d_c", i): 1, "always_c": 2}})
	}
	require.Len(t, h.values, MaxSensorsPerDevice)
	require.Contains(t, h.values, "always_c", "a sensor seen in every reading stays")
	require.NotContains(t, h.values, "s000_c", "the stalest went first")
	require.Len(t, h.values["always_c"], HistoryLen)
}

func TestWindowMatchesScoreSequence(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	devices := []string{"a", "b", "c"}
	seqs := map[string][]contract.Reading{}
	w := NewWindow(len(devices))
	got := map[string][]float64{}
	for range 300 {
		d := devices[rng.IntN(len(devices))]
		r := randomReading(rng)
		seqs[d] = append(seqs[d], r)
		got[d] = append(got[d], w.Score(d, r))
	}
	for _, d := range devices {
		require.Equal(t, ScoreSequence(seqs[d]), got[d], d)
	}
}

func TestWindowConcurrentUse(t *testing.T) {
	w := NewWindow(4)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				q := w.Score(fmt.Sprintf("d%d", (g+i)%6), temp(float64(i%7)))
				if q < 0 || q > 1 {
					t.Errorf("score %v", q)
				}
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, w.Len(), 4)
}

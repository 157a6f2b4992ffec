package buffer

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// deviceEntry is a batch of hw sent with key.
func deviceEntry(hw, key string, i int) Entry {
	e := entry(fmt.Sprintf("%s-%04d", hw, i), fmt.Sprintf("%s payload %04d %s", hw, i, strings.Repeat("x", 200)))
	e.HardwareID, e.Key = hw, key
	return e
}

// sharesOptions is a budget of about 80 batches in which each device may
// hold an eighth once eight devices are seen.
func sharesOptions() Options {
	return Options{MaxPendingBytes: 80 * cost(deviceEntry("RUNAWAY", "k1", 0)), DeviceBatchRate: -1}
}

func TestARunawayDeviceGetsItsShareAndTheOthersAreStored(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	b, err := Open(dir, sharesOptions(), nil, reg)
	require.NoError(t, err)
	others := []string{"D1", "D2", "D3", "D4", "D5", "D6", "D7"}
	for _, hw := range others {
		require.Equal(t, []Outcome{Stored}, commit(t, b, deviceEntry(hw, "k-"+hw, 0)))
	}
	stored, i := 0, 0
	for ; i < 80; i++ {
		out := commit(t, b, deviceEntry("RUNAWAY", "k1", i))[0]
		if out != Stored {
			require.Equal(t, Limited, out, "past its share a device is limited, not full")
			break
		}
		stored++
	}
	require.Equal(t, 10, stored, "an eighth of 80 batches")
	require.Equal(t, []Outcome{Limited, Limited}, commit(t, b, deviceEntry("RUNAWAY", "k1", i), deviceEntry("RUNAWAY", "k1", i+1)))
	for _, hw := range others {
		require.Equal(t, []Outcome{Stored}, commit(t, b, deviceEntry(hw, "k-"+hw, 1)), "every other device is still stored")
	}
	require.Equal(t, 3.0, testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedDeviceShare)))
	require.Equal(t, 0.0, testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedBudget)))
	require.Equal(t, 3.0, testutil.ToFloat64(b.metrics.outcomes.WithLabelValues("limited")))

	// The share is rebuilt from the queue at open.
	require.NoError(t, b.Close())
	b = open(t, dir, sharesOptions())
	require.Equal(t, b.usage.pending.Load(), sum(b.shares.device), "the devices' shares add up to the queue")
	require.Equal(t, 10*cost(deviceEntry("RUNAWAY", "k1", 0)), b.shares.device["RUNAWAY"])
	require.Equal(t, []Outcome{Limited}, commit(t, b, deviceEntry("RUNAWAY", "k1", i)), "still past its share after a restart")

	// Delivery and dead-lettering give the share back.
	pend, err := b.Pending(0, 1000)
	require.NoError(t, err)
	var mine []Pending
	for _, p := range pend {
		if p.HardwareID == "RUNAWAY" {
			mine = append(mine, p)
		}
	}
	require.Len(t, mine, 10)
	require.NoError(t, b.MarkDelivered(mine[:1]))
	require.Equal(t, []Outcome{Stored}, commit(t, b, deviceEntry("RUNAWAY", "k1", i)), "a delivery frees room for one")
	require.Equal(t, []Outcome{Limited}, commit(t, b, deviceEntry("RUNAWAY", "k1", i+1)))
	require.NoError(t, b.DeadLetter(mine[1], "ValidationException"))
	require.Equal(t, []Outcome{Stored}, commit(t, b, deviceEntry("RUNAWAY", "k1", i+1)), "so does a dead letter")
	pend, err = b.Pending(0, 1000)
	require.NoError(t, err)
	require.NoError(t, b.MarkDelivered(pend))
	require.Empty(t, b.shares.device, "nothing pending, nothing counted")
	require.Empty(t, b.shares.key)
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func TestALoneDeviceMayFillTheBuffer(t *testing.T) {
	b := open(t, t.TempDir(), sharesOptions())
	n := 0
	for i := range 100 {
		out := commit(t, b, deviceEntry("ALONE", "k1", i))[0]
		if out != Stored {
			require.Equal(t, Full, out, "its fair share of one device seen is the whole buffer")
			break
		}
		n++
	}
	require.GreaterOrEqual(t, n, 80, "the whole budget")
}

func TestAKeyHoldsAtMostItsShare(t *testing.T) {
	opts := sharesOptions()
	opts.DeviceShare, opts.KeyShare = 1, 0.25
	b := open(t, t.TempDir(), opts)
	require.Equal(t, []Outcome{Stored}, commit(t, b, deviceEntry("OTHER", "device-key", 0)))
	stored := 0
	for i := range 80 {
		if commit(t, b, deviceEntry(fmt.Sprintf("FLEET%02d", i), "fleet-key", 0))[0] == Stored {
			stored++
		}
	}
	// Two keys in use: a fair share of a half beats the key's quarter.
	require.Equal(t, 40, stored, "the fleet key's devices together hold half")
	require.Equal(t, 40.0, testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedKeyShare)))
	require.Equal(t, []Outcome{Stored}, commit(t, b, deviceEntry("OTHER", "device-key", 1)))
}

func TestADeviceFloodingFreshBatchesIsRateLimited(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	opts := clockOptions(Options{DeviceBatchRate: 1, DeviceBatchBurst: 5}, &now)
	b := open(t, t.TempDir(), opts)
	var flood []Entry
	for i := range 8 {
		flood = append(flood, deviceEntry("FLOOD", "k1", i))
	}
	out := commit(t, b, flood...)
	require.Equal(t, []Outcome{Stored, Stored, Stored, Stored, Stored, Limited, Limited, Limited}, out)
	require.Equal(t, []Outcome{Duplicate}, commit(t, b, flood[0]), "a resend costs no token")
	require.Equal(t, []Outcome{Stored}, commit(t, b, deviceEntry("CALM", "k2", 0)), "another device is not limited")
	now = now.Add(2 * time.Second)
	require.Equal(t, []Outcome{Stored, Stored, Limited}, commit(t, b, flood[5:]...), "the bucket refills at the rate")
	require.Equal(t, 4.0, testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedDeviceRate)))
}

// TestTheBufferKeepsNoPayloadAliveThroughItsKeys commits batches whose
// hardware_id and key are substrings of a large decoded payload, as the
// firmware contract's decoder gives them: once the caller drops the
// payload, the buffer's per-device and per-key maps must not hold it.
func TestTheBufferKeepsNoPayloadAliveThroughItsKeys(t *testing.T) {
	b := open(t, t.TempDir(), Options{})
	freed := make(chan int, 2)
	for i := range 2 {
		payload := fmt.Sprintf(`{"hardware_id":"D%d","key":"k%d",%s}`, i, i, strings.Repeat(" ", 64<<10))
		e := deviceEntry(payload[16:18], payload[27:29], i)
		require.Equal(t, fmt.Sprintf("D%d", i), e.HardwareID)
		require.Equal(t, fmt.Sprintf("k%d", i), e.Key)
		runtime.AddCleanup(unsafe.StringData(payload), func(i int) { freed <- i }, i)
		require.Equal(t, []Outcome{Stored}, commit(t, b, e))
	}
	deadline := time.After(10 * time.Second)
	for n := 0; n < 2; {
		runtime.GC()
		select {
		case <-freed:
			n++
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%d of 2 payloads still held after their batches were stored", 2-n)
		}
	}
}

package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAttackMadeUpKeys has a host without a key send CONNECTs with made-up
// keys as fast as it can, while devices with a valid key connect: they are
// accepted within 2 s on 10 of 10 tries, every made-up key is refused, and
// api_keys is asked about them no more often than auth.max_lookups_per_second
// allows (the rest are answered "server unavailable" and counted as
// throttled).
func TestAttackMadeUpKeys(t *testing.T) {
	const rate = 20 // auth.max_lookups_per_second's default
	n := attackSize(400, 5000)
	d, key := attackDaemon(t)
	ok, _ := deviceTries(t, d.mqttAddr, key, "02:00:00:BB:00", 1, 0) // the valid key is cached from here on
	require.Equal(t, 1, ok)
	before := metricFloat(t, d, `gateway_auth_verifications_total{result="unauthorized"}`)

	var next, refused, unavailable atomic.Int64
	var other sync.Map // CONNACK codes other than those two
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				select {
				case <-stop:
					return
				default:
				}
				hw := fmt.Sprintf("02:00:00:BA:%02X:%02X", i/256%256, i%256)
				m, code, err := rawConnect(d.mqttAddr, 4, hw, hw, fmt.Sprintf("made-up-key-%d", i), time.Now().Add(10*time.Second))
				if err != nil {
					other.Store(err.Error(), true)
					continue
				}
				m.c.Close()
				switch code {
				case 4, 5: // bad user name or password, not authorized
					refused.Add(1)
				case 3: // server unavailable: throttled
					unavailable.Add(1)
				default:
					other.Store(fmt.Sprintf("CONNACK %#x", code), true)
				}
			}
		}()
	}
	ok, took := deviceTries(t, d.mqttAddr, key, "02:00:00:BB:01", 10, attackSizeDuration(100*time.Millisecond, 500*time.Millisecond))
	time.AfterFunc(60*time.Second, func() { close(stop) })
	wg.Wait()
	elapsed := time.Since(start)

	lookedUp := metricFloat(t, d, `gateway_auth_verifications_total{result="unauthorized"}`) - before
	throttled := metricFloat(t, d, `gateway_auth_verifications_total{result="throttled"}`)
	t.Logf("%d made-up keys in %s: %d refused (looked up), %d answered unavailable (%.0f throttled); devices accepted "+
		"within %s on %d of 10 tries (%s)", n, elapsed.Round(10*time.Millisecond), refused.Load(), unavailable.Load(),
		throttled, deviceDeadline, ok, durations(took))
	other.Range(func(k, _ any) bool { t.Errorf("made-up key answered: %v", k); return true })
	require.Equal(t, 10, ok, "device tries accepted within %s", deviceDeadline)
	require.Equal(t, int64(n), refused.Load()+unavailable.Load(), "every made-up key is refused")
	require.Equal(t, float64(refused.Load()), lookedUp)
	require.Equal(t, float64(unavailable.Load()), throttled)
	require.LessOrEqual(t, lookedUp, 2*rate+rate*elapsed.Seconds()+1, "lookups within the rate and its burst")
	require.Positive(t, throttled)
}

package devicesim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

// The tests in this file drive one device over a fakeLink inside a synctest bubble: time only
// moves when every goroutine is blocked, so timeouts and backoffs are exact and instant.

// nextSends lets time pass and returns what the device sent meanwhile.
func (h *testHarness) nextSends(d time.Duration) []sentBatch {
	time.Sleep(d)
	synctest.Wait()
	return h.link.take()
}

// firstSend starts a connected device of cfg, answers its registration and returns what
// it sends in the first interval: one batch.
func firstSend(t *testing.T, cfg Config) (*testHarness, []sentBatch) {
	t.Helper()
	h := startDevice(t, t.Context(), cfg, true)
	synctest.Wait()
	h.registered()
	s := h.nextSends(cfg.Interval)
	require.Len(t, s, 1)
	return h, s
}

func TestDeviceDeliversBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 3
		h := startDevice(t, t.Context(), cfg, true)
		synctest.Wait()
		require.Equal(t, 1, h.link.registrations(), "registers as soon as connected")
		h.registered()

		for i := range 3 {
			sends := h.nextSends(cfg.Interval)
			require.Len(t, sends, 1)
			b := sends[0].batch
			require.Equal(t, uint64(i), *b.Seq)
			require.Equal(t, sends[0].id, b.BatchID)
			require.NotNil(t, b.SentUptimeMS)
			h.ack(sends[0].id, contract.StatusAccepted, nil)
		}
		st, lines := h.wait()
		require.True(t, st.Registered)
		require.Equal(t, 3, st.Built)
		require.Equal(t, 3, st.Sent)
		require.Equal(t, 3, st.Accepted)
		require.Zero(t, st.Pending)
		require.Len(t, lines, 3)
		for i, l := range lines {
			require.Equal(t, "accepted", l.Status)
			require.Equal(t, uint64(i), l.Seq)
			require.Equal(t, 5, l.Readings)
			require.Equal(t, 1, l.Attempts)
			require.Equal(t, "02:00:00:00:00:01", l.HardwareID)
		}
	})
}

func TestDeviceHoldsReadingsUntilRegistered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 1
		h := startDevice(t, t.Context(), cfg, true)
		require.Empty(t, h.nextSends(cfg.Interval), "no readings while the registration is unanswered")
		// No answer to the registration within the ack timeout: readings go anyway.
		sends := h.nextSends(cfg.AckTimeout - cfg.Interval)
		require.Len(t, sends, 1)
		h.ack(sends[0].id, contract.StatusAccepted, nil)
		st, _ := h.wait()
		require.False(t, st.Registered)
		require.Equal(t, 1, st.Accepted)
	})
}

func TestDeviceRetriesBufferFullAfterRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 1
		h, first := firstSend(t, cfg)

		h.send(event{kind: evAck, retryAfter: 5 * time.Second, ack: contract.Ack{
			Type: contract.AckTypeReadings, BatchID: first[0].id, Status: contract.StatusRejected,
			Reason: reasonPtr(contract.ReasonBufferFull)}})
		require.Empty(t, h.nextSends(5*time.Second-time.Millisecond), "Retry-After is honoured")
		again := h.nextSends(time.Millisecond)
		require.Len(t, again, 1)
		require.Equal(t, first[0].id, again[0].id, "the same batch is sent again")
		require.Equal(t, first[0].batch.Readings, again[0].batch.Readings)
		require.Greater(t, *again[0].batch.SentUptimeMS, *first[0].batch.SentUptimeMS)

		h.ack(again[0].id, contract.StatusDuplicate, nil)
		st, lines := h.wait()
		require.Equal(t, 1, st.Duplicates)
		require.Equal(t, 2, st.Sent)
		require.Equal(t, 1, st.Resent)
		require.Equal(t, map[string]int{"buffer_full": 1}, st.Retried)
		require.Empty(t, st.Rejected)
		require.Len(t, lines, 1)
		require.Equal(t, "duplicate", lines[0].Status)
		require.Equal(t, 2, lines[0].Attempts)
	})
}

func TestDeviceResendsAfterAckTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 1
		h, first := firstSend(t, cfg)
		require.Empty(t, h.nextSends(cfg.AckTimeout-time.Millisecond))
		// Timed out: the first retry waits between RetryMin/2 and RetryMin.
		again := h.nextSends(time.Millisecond + cfg.RetryMin)
		require.Len(t, again, 1)
		require.Equal(t, first[0].id, again[0].id)

		// The late answer to the first attempt confirms the batch; the second is then unknown.
		h.ack(first[0].id, contract.StatusAccepted, nil)
		h.ack(again[0].id, contract.StatusDuplicate, nil)
		st, lines := h.wait()
		require.Equal(t, 1, st.Accepted)
		require.Zero(t, st.Duplicates, "answers for batches no longer held are ignored")
		require.Equal(t, map[string]int{"timeout": 1}, st.Retried)
		require.Len(t, lines, 1)
	})
}

func TestDeviceDropsRejectedBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 2
		h, s0 := firstSend(t, cfg)

		h.ack("02:00:00:00:00:01_other_1_2", contract.StatusAccepted, nil) // not ours: ignored
		synctest.Wait()
		h.ack(s0[0].id, contract.StatusRejected, reasonPtr(contract.ReasonValidation))
		s1 := h.nextSends(cfg.Interval)
		require.Len(t, s1, 1, "a rejected batch is dropped, the next one goes")
		require.Equal(t, uint64(1), *s1[0].batch.Seq)
		h.ack(s1[0].id, contract.StatusRejected, reasonPtr(contract.ReasonConflict))

		st, lines := h.wait()
		require.Equal(t, map[string]int{"validation_error": 1, "conflict": 1}, st.Rejected)
		require.Zero(t, st.Accepted)
		require.Zero(t, st.Pending)
		require.Len(t, lines, 2)
		require.Equal(t, "rejected", lines[0].Status)
		require.Equal(t, "validation_error", lines[0].Reason)
		require.Equal(t, "conflict", lines[1].Reason)
	})
}

func TestDeviceReregistersOnUnknownDevice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 1
		h, s := firstSend(t, cfg)
		h.ack(s[0].id, contract.StatusRejected, reasonPtr(contract.ReasonUnknownDevice))
		synctest.Wait()
		require.Equal(t, 2, h.link.registrations(), "registers again")
		h.registered()
		again := h.nextSends(cfg.RetryMin)
		require.Len(t, again, 1)
		require.Equal(t, s[0].id, again[0].id, "the batch was kept")
		h.ack(again[0].id, contract.StatusAccepted, nil)
		st, _ := h.wait()
		require.Equal(t, map[string]int{"unknown_device": 1}, st.Retried)
		require.Equal(t, 1, st.Accepted)
	})
}

func TestDeviceSendsOldestFirstAfterOutage(t *testing.T) {
	for _, inflight := range []int{1, 3} {
		t.Run(map[int]string{1: "one in flight", 3: "three in flight"}[inflight], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig()
				cfg.Batches = 3
				cfg.MaxInflight = inflight
				h := startDevice(t, t.Context(), cfg, false)
				require.Empty(t, h.nextSends(3*cfg.Interval), "nothing is sent while offline")

				h.send(event{kind: evConnected})
				synctest.Wait()
				h.registered()
				synctest.Wait()
				var seqs []uint64
				for len(seqs) < 3 {
					sends := h.link.take()
					require.NotEmpty(t, sends)
					require.LessOrEqual(t, len(sends), inflight)
					for _, s := range sends {
						seqs = append(seqs, *s.batch.Seq)
						h.ack(s.id, contract.StatusAccepted, nil)
					}
					synctest.Wait()
				}
				require.Equal(t, []uint64{0, 1, 2}, seqs)
				st, _ := h.wait()
				require.Equal(t, 3, st.Accepted)
			})
		})
	}
}

func TestDeviceResendsAfterReconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 1
		h, s := firstSend(t, cfg)

		h.send(event{kind: evDisconnected})
		require.Empty(t, h.nextSends(30*time.Second), "nothing is sent while disconnected")
		h.send(event{kind: evConnected})
		synctest.Wait()
		require.Equal(t, 2, h.link.registrations(), "registers again on reconnect")
		h.registered()
		synctest.Wait()
		again := h.link.take()
		require.Len(t, again, 1)
		require.Equal(t, s[0].id, again[0].id)
		h.ack(again[0].id, contract.StatusDuplicate, nil)
		st, _ := h.wait()
		require.Equal(t, map[string]int{"disconnected": 1}, st.Retried)
		require.Equal(t, 1, st.Duplicates)
	})
}

func TestDeviceTransportErrorBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 1
		h, s := firstSend(t, cfg)
		for i, wait := range []time.Duration{cfg.RetryMin, 2 * cfg.RetryMin, 4 * cfg.RetryMin} {
			h.send(event{kind: evSendFailed, batchID: s[0].id, err: errNotConnected})
			synctest.Wait()
			require.Empty(t, h.nextSends(wait/2-time.Millisecond), "retry %d waits at least half its backoff", i+1)
			s = h.nextSends(wait/2 + time.Millisecond)
			require.Len(t, s, 1, "retry %d comes within its backoff", i+1)
		}
		h.ack(s[0].id, contract.StatusAccepted, nil)
		st, _ := h.wait()
		require.Equal(t, 4, st.Sent)
		require.Equal(t, map[string]int{"transport": 3}, st.Retried)
	})
}

func TestDeviceBufferBoundedAndDrainTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 5
		cfg.BufferSize = 3
		cfg.DrainTimeout = 10 * time.Second
		h := startDevice(t, t.Context(), cfg, false) // never connects
		start := time.Now()
		st, lines := h.wait()
		require.Equal(t, 5*cfg.Interval+cfg.DrainTimeout, time.Since(start), "stops after the drain timeout")
		require.Equal(t, 5, st.Built)
		require.Equal(t, 2, st.Overflow)
		require.Equal(t, 3, st.Pending)
		require.Zero(t, st.Sent)
		require.Empty(t, lines)
		var seqs []uint64
		for _, e := range h.dev.out.entries {
			seqs = append(seqs, e.seq)
		}
		require.Equal(t, []uint64{2, 3, 4}, seqs, "the oldest batches were dropped")
	})
}

func TestDeviceStopsAtDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Duration = 2500 * time.Millisecond
		cfg.DrainTimeout = 0
		h := startDevice(t, t.Context(), cfg, true)
		synctest.Wait()
		h.registered()
		start := time.Now()
		st, _ := h.wait()
		require.Equal(t, cfg.Duration, time.Since(start))
		require.Equal(t, 2, st.Built)
		require.Equal(t, 2, st.Pending, "no answer came: one batch in flight, one waiting")
	})
}

func TestDeviceStopsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		ctx, cancel := context.WithCancel(t.Context())
		h := startDevice(t, ctx, cfg, true)
		synctest.Wait()
		h.registered()
		require.Len(t, h.nextSends(cfg.Interval), 1)
		time.Sleep(cfg.Interval)
		cancel()
		st, _ := h.wait()
		require.Equal(t, 2, st.Built)
		require.Equal(t, 2, st.Pending, "stops at once, without draining")
		h.link.mu.Lock()
		defer h.link.mu.Unlock()
		require.True(t, h.link.closed)
	})
}

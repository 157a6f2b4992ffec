package devicesim

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/syncbuf"
)

// The tests in this file drive one device over a fakeLink inside a synctest bubble, like those
// of device_test.go, through reboots.

const testConfirmationID = "550e8400-e29b-41d4-a716-446655440000"

// autoAnswer lets d pass in steps of 100 ms, and answers like a gateway meanwhile: every new
// registration is confirmed and every new batch accepted. It returns the sends it answered.
func (h *testHarness) autoAnswer(d time.Duration) []sentBatch {
	h.t.Helper()
	var out []sentBatch
	const step = 100 * time.Millisecond
	for elapsed := time.Duration(0); elapsed < d; elapsed += step {
		time.Sleep(step)
		synctest.Wait()
		h.answerRegistrations()
		for _, s := range h.link.take() {
			h.ack(s.id, contract.StatusAccepted, nil)
			out = append(out, s)
		}
		synctest.Wait()
	}
	return out
}

// answerRegistrations confirms the registrations not answered yet.
func (h *testHarness) answerRegistrations() {
	_, _, regs := h.link.counts()
	for ; h.answeredRegs < regs; h.answeredRegs++ {
		h.registered()
	}
}

// bootOf returns the boot_id part of a simulator's batch_id.
func bootOf(t *testing.T, batchID string) string {
	t.Helper()
	parts := strings.Split(batchID, "_")
	require.Len(t, parts, 4, batchID)
	return parts[1]
}

func TestDeviceRebootsFreshBootSeqAndRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.RebootEvery = 10 * time.Second
		cfg.Reboots = 2
		cfg.Duration = 45 * time.Second // long enough for 3 reboots without the cap
		cfg.DrainTimeout = 0
		start := time.Now()
		h := startDevice(t, t.Context(), cfg, true)
		sends := h.autoAnswer(cfg.Duration)
		st, lines := h.wait()

		// Reboots at the drawn times, and no more than --reboots.
		delays := testRebootDelays(cfg, 2)
		require.Equal(t, 2, st.Reboots)
		dials, drops, regs := h.link.counts()
		require.Equal(t, 3, dials, "a new link per boot")
		require.Equal(t, 2, drops, "the old link is dropped, not closed")
		h.link.mu.Lock()
		require.Equal(t, []time.Duration{delays[0], delays[0] + delays[1]},
			[]time.Duration{h.link.dropTimes[0].Sub(start), h.link.dropTimes[1].Sub(start)})
		h.link.mu.Unlock()
		for _, d := range delays {
			require.InDelta(t, float64(cfg.RebootEvery), float64(d), float64(cfg.RebootEvery)/5, "±20%%")
		}

		// A registration per boot, each with a fresh boot_id.
		require.Equal(t, 3, regs)
		boots := h.link.registeredBoots()
		require.Len(t, boots, 3)
		require.Equal(t, "7c9e6679-7425-40de-944b-e07fc1f90ae7", boots[0])
		for _, b := range boots[1:] {
			require.NoError(t, contract.ValidUUIDv4(b))
		}
		require.NotEqual(t, boots[0], boots[1])
		require.NotEqual(t, boots[1], boots[2])
		require.Equal(t, boots[2], st.BootID)
		require.True(t, st.Registered)
		require.Equal(t, 3, st.Registrations)
		require.Equal(t, testConfirmationID, st.ConfirmationID)

		// seq restarts at 0 with every boot; batches go in boot order; the uptime restarts.
		bootIndex := map[string]int{boots[0]: 0, boots[1]: 1, boots[2]: 2}
		lastBoot, nextSeq := 0, uint64(0)
		perBoot := map[int]int{}
		for _, s := range sends {
			b := s.batch
			i, ok := bootIndex[b.BootID]
			require.True(t, ok, "batch of an unknown boot %s", b.BootID)
			require.Equal(t, b.BootID, bootOf(t, b.BatchID))
			require.GreaterOrEqual(t, i, lastBoot, "boots in order")
			if i > lastBoot {
				lastBoot, nextSeq = i, 0
				require.Equal(t, uint64(0), *b.Seq, "seq restarts at 0 after a reboot")
				require.LessOrEqual(t, *b.Readings[len(b.Readings)-1].UptimeMS, cfg.Interval.Milliseconds(),
					"uptime restarts at 0 after a reboot")
				require.LessOrEqual(t, *b.SentUptimeMS, (cfg.Interval + cfg.AckTimeout).Milliseconds())
			}
			require.Equal(t, nextSeq, *b.Seq)
			nextSeq++
			perBoot[i]++
		}
		require.Len(t, perBoot, 3, "every boot sent batches")
		require.Equal(t, st.Built, len(sends))
		require.Equal(t, st.Built, st.Accepted)
		// The sampling timer restarts with every boot, and Duration counts over all boots.
		last := cfg.Duration - delays[0] - delays[1]
		require.Equal(t, int(delays[0]/cfg.Interval)+int(delays[1]/cfg.Interval)+int(last/cfg.Interval), st.Built)

		require.Len(t, lines, len(sends))
		for _, l := range lines {
			require.Equal(t, bootOf(t, l.BatchID), l.BootID, "the report has each batch's own boot_id")
		}
	})
}

func TestDeviceRebootsUnlimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.RebootEvery = 2 * time.Second
		cfg.Duration = 30 * time.Second
		cfg.DrainTimeout = 0
		h := startDevice(t, t.Context(), cfg, true)
		h.autoAnswer(cfg.Duration)
		st, _ := h.wait()

		want, at := 0, time.Duration(0)
		for _, d := range testRebootDelays(cfg, 100) {
			if at += d; at >= cfg.Duration {
				break
			}
			want++
		}
		require.GreaterOrEqual(t, want, 12)
		require.Equal(t, want, st.Reboots, "reboots go on until the device stops")
		_, drops, regs := h.link.counts()
		require.Equal(t, want, drops)
		require.Equal(t, want+1, regs)
		require.Equal(t, want+1, st.Registrations)
	})
}

// TestDeviceRebootResendsBufferedBatchesFirst: a device that could not reach the gateway in
// its first boot keeps those batches across the reboot and sends them first, with their old
// boot_id, batch_id and seq, and a sent_uptime_ms that still counts from their own boot.
func TestDeviceRebootResendsBufferedBatchesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.RebootEvery = 10 * time.Second
		cfg.Reboots = 1
		cfg.Duration = 15 * time.Second
		cfg.ClockSyncAfter = time.Hour // 1970 timestamps: repairs need the right uptimes
		start := time.Now()
		h := startDevice(t, t.Context(), cfg, false) // the first boot never connects
		delay := testRebootDelays(cfg, 1)[0]
		synctest.Wait()         // the first dial is done
		h.link.setConnect(true) // the next boot connects

		time.Sleep(delay)
		synctest.Wait()
		require.Empty(t, h.link.take(), "nothing was sent in the first boot")
		_, drops, regs := h.link.counts()
		require.Equal(t, 1, drops)
		require.Equal(t, 1, regs, "the new boot registers as soon as it is connected")
		boots := h.link.registeredBoots()
		newBoot := boots[0]
		require.NotEqual(t, "7c9e6679-7425-40de-944b-e07fc1f90ae7", newBoot)
		h.registered()
		h.answeredRegs = 1
		synctest.Wait()

		kept := int(delay / cfg.Interval) // batches built in the first boot
		require.GreaterOrEqual(t, kept, 8)
		var old []sentBatch
		for len(old) < kept {
			s := h.link.take()
			require.Len(t, s, 1, "one in flight")
			old = append(old, s[0])
			h.ack(s[0].id, contract.StatusAccepted, nil)
			synctest.Wait()
		}
		for i, s := range old {
			b := s.batch
			require.Equal(t, "7c9e6679-7425-40de-944b-e07fc1f90ae7", b.BootID, "old batches keep their boot_id")
			require.Equal(t, b.BootID, bootOf(t, s.id))
			require.Equal(t, uint64(i), *b.Seq, "and their seq, oldest first")
			require.Equal(t, time.Since(start).Milliseconds(), *b.SentUptimeMS,
				"sent_uptime_ms counts from the batch's own boot")
			require.Less(t, b.Readings[0].TimestampMS, contract.MinTimestampMS)
			_, err := contract.DecodeBatch(mustJSON(t, b), "", contract.Limits{}, time.Now())
			require.NoError(t, err, "repairable")
		}

		// Then the new boot's own batches, from seq 0.
		sends := h.autoAnswer(2 * cfg.Interval)
		require.NotEmpty(t, sends)
		require.Equal(t, newBoot, sends[0].batch.BootID)
		require.Equal(t, uint64(0), *sends[0].batch.Seq)
		require.Less(t, *sends[0].batch.SentUptimeMS, (2 * cfg.Interval).Milliseconds(), "uptime of the new boot")

		h.autoAnswer(cfg.Duration)
		st, lines := h.wait()
		require.Equal(t, 1, st.Reboots)
		require.Zero(t, st.Pending)
		require.Equal(t, st.Built, st.Accepted)
		for _, l := range lines[:kept] {
			require.Equal(t, "7c9e6679-7425-40de-944b-e07fc1f90ae7", l.BootID)
		}
		for _, l := range lines[kept:] {
			require.Equal(t, newBoot, l.BootID)
		}
	})
}

// TestDeviceRebootResendsBatchesInFlight: answers awaited when the device reboots are lost
// with its RAM; the batches are in flash and go again, unchanged, after the registration.
func TestDeviceRebootResendsBatchesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.RebootEvery = 5 * time.Second
		cfg.Reboots = 1
		cfg.Batches = 3
		cfg.MaxInflight = 3
		cfg.AckTimeout = time.Minute
		h := startDevice(t, t.Context(), cfg, true)
		synctest.Wait()
		h.registered()
		h.answeredRegs = 1
		first := h.nextSends(3 * cfg.Interval)
		require.Len(t, first, 3)

		delay := testRebootDelays(cfg, 1)[0]
		time.Sleep(delay - 3*cfg.Interval)
		synctest.Wait()
		require.Empty(t, h.link.take(), "the new boot waits for its registration")
		_, drops, regs := h.link.counts()
		require.Equal(t, 1, drops)
		require.Equal(t, 2, regs)
		h.answerRegistrations()
		synctest.Wait()
		again := h.link.take()
		require.Len(t, again, 3)
		for i := range again {
			require.Equal(t, first[i].id, again[i].id, "the same batch_id")
			require.Equal(t, first[i].batch.Readings, again[i].batch.Readings, "the same content")
			require.Equal(t, first[i].batch.Seq, again[i].batch.Seq)
			require.Equal(t, first[i].batch.BootID, again[i].batch.BootID)
			h.ack(again[i].id, contract.StatusAccepted, nil)
		}
		st, lines := h.wait()
		require.Equal(t, 1, st.Reboots)
		require.Equal(t, 6, st.Sent)
		require.Equal(t, 3, st.Resent)
		require.Equal(t, 3, st.Accepted)
		require.Equal(t, map[string]int{"reboot": 3}, st.Retried)
		require.Len(t, lines, 3)
		for _, l := range lines {
			require.Equal(t, "7c9e6679-7425-40de-944b-e07fc1f90ae7", l.BootID)
			require.Equal(t, 2, l.Attempts)
		}
	})
}

func TestDeviceRebootClockUnsyncedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Readings = 2
		cfg.ClockSyncAfter = 3 * time.Second
		cfg.RebootEvery = 10 * time.Second
		cfg.Reboots = 1
		cfg.Duration = 20 * time.Second
		cfg.DrainTimeout = 0
		h := startDevice(t, t.Context(), cfg, true)
		sends := h.autoAnswer(cfg.Duration)
		st, _ := h.wait()
		require.Equal(t, 1, st.Reboots)

		type boot struct{ unsynced, synced int }
		perBoot := map[string]*boot{}
		var order []string
		for _, s := range sends {
			b := s.batch
			if perBoot[b.BootID] == nil {
				perBoot[b.BootID] = &boot{}
				order = append(order, b.BootID)
			}
			if b.Readings[len(b.Readings)-1].TimestampMS < contract.MinTimestampMS {
				require.Zero(t, perBoot[b.BootID].synced, "no 1970 time after the sync in the same boot")
				perBoot[b.BootID].unsynced++
				for _, r := range b.Readings {
					require.Equal(t, r.TimestampMS, *r.UptimeMS, "before NTP the clock counts from 1970 at boot")
				}
			} else {
				perBoot[b.BootID].synced++
			}
			_, err := contract.DecodeBatch(mustJSON(t, b), "", contract.Limits{}, time.Now())
			require.NoError(t, err)
		}
		require.Len(t, order, 2)
		for _, id := range order {
			require.Positive(t, perBoot[id].unsynced, "boot %s starts without NTP", id)
			require.Positive(t, perBoot[id].synced, "boot %s gets NTP after the delay", id)
		}
	})
}

// TestDeviceQoS0ReliesOnAcks: at QoS 0 a publish that goes out is no confirmation (there is
// no PUBACK, and the message may be lost): only an ack with the batch's batch_id frees the
// batch; a lost message is sent again after the ack timeout; acks are matched out of order.
func TestDeviceQoS0ReliesOnAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.MQTTURL, cfg.HTTPURL = "tcp://127.0.0.1:1883", ""
		cfg.QoS = 0
		cfg.Batches = 3
		cfg.MaxInflight = 3
		h := startDevice(t, t.Context(), cfg, true)
		synctest.Wait()
		h.registered()
		sends := h.nextSends(3 * cfg.Interval)
		require.Len(t, sends, 3, "published without waiting for anything")
		require.Equal(t, 3, h.dev.out.len(), "a publish confirms nothing at QoS 0")

		// The second message was lost on the way; the others are answered out of order,
		// along with an answer for a batch the device does not hold.
		h.ack(sends[2].id, contract.StatusAccepted, nil)
		h.ack("02:00:00:00:00:01_00000000-0000-4000-8000-000000000000_1_2", contract.StatusAccepted, nil)
		h.ack(sends[0].id, contract.StatusAccepted, nil)
		require.Empty(t, h.nextSends(cfg.AckTimeout-3*cfg.Interval), "waits for the ack")
		again := h.nextSends(2*cfg.Interval + cfg.RetryMin)
		require.Len(t, again, 1, "the unanswered batch goes again after the ack timeout")
		require.Equal(t, sends[1].id, again[0].id)
		h.ack(again[0].id, contract.StatusAccepted, nil)

		st, lines := h.wait()
		require.Equal(t, 3, st.Accepted)
		require.Equal(t, 4, st.Sent)
		require.Equal(t, map[string]int{"timeout": 1}, st.Retried)
		require.Len(t, lines, 3)
	})
}

func TestDeviceLogsConfirmationIDOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		logger := infoLogger(&logs)
		cfg := testConfig()
		cfg.RebootEvery = 5 * time.Second
		cfg.Reboots = 3
		cfg.Duration = 30 * time.Second
		cfg.DrainTimeout = 0
		h := startDeviceLog(t, t.Context(), cfg, true, logger)
		h.autoAnswer(cfg.Duration)
		st, _ := h.wait()
		require.Equal(t, 3, st.Reboots)
		require.Equal(t, 4, st.Registrations)
		require.Equal(t, testConfirmationID, st.ConfirmationID)
		out := logs.String()
		require.Equal(t, 1, strings.Count(out, "msg=registered"), out)
		require.Equal(t, 1, strings.Count(out, "confirmation_id="+testConfirmationID), out)
		require.Equal(t, 3, strings.Count(out, `msg="device rebooted"`), out)
	})
}

func TestDeviceRejectedRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		logger := infoLogger(&logs)
		cfg := testConfig()
		cfg.Batches = 1
		h := startDeviceLog(t, t.Context(), cfg, true, logger)
		synctest.Wait()
		reason, msg := contract.ReasonValidation, "friendly_name: must be printable"
		h.send(event{kind: evAck, ack: contract.Ack{Type: contract.AckTypeRegister, Status: contract.StatusRejected,
			Reason: &reason, Message: &msg}})
		sends := h.nextSends(cfg.Interval)
		require.Len(t, sends, 1, "readings are not held back after a rejection")
		h.ack(sends[0].id, contract.StatusAccepted, nil)
		st, _ := h.wait()
		require.False(t, st.Registered)
		require.Zero(t, st.Registrations)
		require.Empty(t, st.ConfirmationID)
		out := logs.String()
		require.Contains(t, out, `msg="registration rejected; sending readings anyway"`)
		require.Contains(t, out, "reason=validation_error")
		require.Contains(t, out, `message="friendly_name: must be printable"`)
		require.Equal(t, 1, h.link.registrations(), "a rejected registration is not sent again as is")
	})
}

// TestDeviceRetriesRegistration: a registration that was not confirmed is sent again after a
// backoff, without holding readings back, until the gateway confirms it.
func TestDeviceRetriesRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batches = 40
		cfg.AckTimeout = 3 * time.Second
		h := startDevice(t, t.Context(), cfg, true)
		synctest.Wait()
		require.Equal(t, 1, h.link.registrations())

		// Not answered within the ack timeout: readings go, the registration goes again
		// within RetryMin.
		sends := h.nextSends(cfg.AckTimeout)
		require.Len(t, sends, 1, "readings go after the ack timeout")
		h.ack(sends[0].id, contract.StatusAccepted, nil)
		time.Sleep(cfg.RetryMin)
		synctest.Wait()
		require.Equal(t, 2, h.link.registrations(), "registers again after the backoff")

		// Not delivered (a 503, a lost connection to the gateway): again, after a longer backoff,
		// while readings keep going.
		h.send(event{kind: evRegisterFailed, err: errNotConnected})
		s := h.nextSends(cfg.Interval)
		require.Len(t, s, 1, "readings are not held back by a retried registration")
		h.ack(s[0].id, contract.StatusAccepted, nil)
		time.Sleep(2*cfg.RetryMin - cfg.Interval)
		synctest.Wait()
		require.Equal(t, 3, h.link.registrations())

		// buffer_full with Retry-After: again after the Retry-After.
		reason, msg := contract.ReasonBufferFull, "the gateway could not save the registration; retry later"
		h.send(event{kind: evAck, retryAfter: 5 * time.Second, ack: contract.Ack{Type: contract.AckTypeRegister,
			Status: contract.StatusRejected, Reason: &reason, Message: &msg}})
		h.autoAckReadings(5*time.Second - time.Millisecond)
		require.Equal(t, 3, h.link.registrations(), "Retry-After is honoured")
		h.autoAckReadings(time.Millisecond)
		require.Equal(t, 4, h.link.registrations())

		h.registered()
		h.autoAckReadings(time.Minute)
		require.Equal(t, 4, h.link.registrations(), "confirmed: no more registrations")
		st, _ := h.wait()
		require.True(t, st.Registered)
		require.Equal(t, 1, st.Registrations)
		require.Equal(t, testConfirmationID, st.ConfirmationID)
		require.Equal(t, 40, st.Accepted)
	})
}

// autoAckReadings lets d pass and accepts every batch sent meanwhile, leaving registrations
// unanswered.
func (h *testHarness) autoAckReadings(d time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		step := min(100*time.Millisecond, time.Until(deadline))
		if step <= 0 {
			return
		}
		time.Sleep(step)
		synctest.Wait()
		for _, s := range h.link.take() {
			h.ack(s.id, contract.StatusAccepted, nil)
		}
		synctest.Wait()
	}
}

func TestDeviceConfirmationIDChangeIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		logger := infoLogger(&logs)
		cfg := testConfig()
		cfg.Batches = 1
		h := startDeviceLog(t, t.Context(), cfg, true, logger)
		synctest.Wait()
		h.registered()
		other := "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
		h.send(event{kind: evAck, ack: contract.Ack{Type: contract.AckTypeRegister, Status: contract.StatusRegistered,
			ConfirmationID: other}})
		s := h.nextSends(cfg.Interval)
		require.Len(t, s, 1)
		h.ack(s[0].id, contract.StatusAccepted, nil)
		st, _ := h.wait()
		require.Equal(t, other, st.ConfirmationID)
		require.Contains(t, logs.String(), "previous_confirmation_id="+testConfirmationID)
	})
}

func TestRebootDelayJitter(t *testing.T) {
	cfg := testConfig()
	cfg.RebootEvery = time.Minute
	lo, hi := time.Hour, time.Duration(0)
	for _, d := range testRebootDelays(cfg, 2000) {
		lo, hi = min(lo, d), max(hi, d)
	}
	require.GreaterOrEqual(t, lo, 48*time.Second)
	require.LessOrEqual(t, hi, 72*time.Second)
	require.Less(t, lo, 49*time.Second, "the whole ±20% is used")
	require.Greater(t, hi, 71*time.Second)
	require.Equal(t, testRebootDelays(cfg, 5), testRebootDelays(cfg, 5), "reproducible from the seed")
}

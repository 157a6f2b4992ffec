package devicesim

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/syncbuf"
)

// The tests in this file drive one device over a fakeLink inside a synctest bubble, like those
// of device_test.go, through enrollment: a register answer that carries a device key.

const (
	testHW          = "02:00:00:00:00:01"
	testDevKey      = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	testDevKeyID    = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	testFleetKeyCfg = "test-key" // testConfig's APIKey
)

// enrolled confirms the registration with a device key, as the gateway does once.
func (h *testHarness) enrolled(key, keyID string) {
	h.send(event{kind: evAck, ack: contract.Ack{Type: contract.AckTypeRegister, Status: contract.StatusRegistered,
		ConfirmationID: testConfirmationID, DeviceKey: key, DeviceKeyID: keyID}})
}

func infoLogger(buf *syncbuf.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func TestDeviceEnrollsAndReconnectsWithItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		cfg := testConfig()
		cfg.Batches = 3
		cfg.KeyStorePath = filepath.Join(t.TempDir(), "keys.json")
		h := startDeviceLog(t, t.Context(), cfg, true, infoLogger(&logs))
		synctest.Wait()
		require.Equal(t, 1, h.link.registrations())
		h.enrolled(testDevKey, testDevKeyID)
		synctest.Wait()

		// Stored first, then used: the link is closed and dialled again with the device key,
		// and the new connection registers again, now with the device key.
		raw, err := os.ReadFile(cfg.KeyStorePath)
		require.NoError(t, err)
		var stored map[string]string
		require.NoError(t, json.Unmarshal(raw, &stored))
		require.Equal(t, map[string]string{testHW: testDevKey}, stored)
		keys, closes := h.link.keysDialled()
		require.Equal(t, []string{testFleetKeyCfg, testDevKey}, keys)
		require.Equal(t, 1, closes, "the fleet-key connection was closed cleanly")
		require.Equal(t, 2, h.link.registrations(), "registers again on the new connection")
		require.Empty(t, h.link.take(), "readings wait for the new registration's answer")

		// A later answer without a key changes nothing.
		h.registered()
		for range 3 {
			sends := h.nextSends(cfg.Interval)
			require.Len(t, sends, 1)
			h.ack(sends[0].id, contract.StatusAccepted, nil)
		}
		st, _ := h.wait()
		require.Equal(t, 3, st.Accepted)
		require.Equal(t, keyEnrolled, st.Key)
		require.Equal(t, testDevKeyID, st.DeviceKeyID)
		keys, _ = h.link.keysDialled()
		require.Equal(t, []string{testFleetKeyCfg, testDevKey}, keys, "no further reconnect")
		require.Contains(t, logs.String(), "enrolled: the gateway issued the device its own key")
		require.Contains(t, logs.String(), "device_key_id="+testDevKeyID)
		require.NotContains(t, logs.String(), testDevKey, "the key is never logged")
	})
}

func TestDeviceUsesItsStoredKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Duration = 5 * time.Second
		cfg.RebootEvery = 3 * time.Second
		cfg.Reboots = 1
		cfg.KeyStorePath = writeTemp(t, `{"`+testHW+`":"`+testDevKey+`","02:00:00:00:00:02":"`+testDeviceKey(2)+`"}`)
		h := startDevice(t, t.Context(), cfg, true)
		h.autoAnswer(cfg.Duration + time.Second)
		st, _ := h.wait()
		require.Equal(t, 1, st.Reboots)
		keys, _ := h.link.keysDialled()
		require.Equal(t, []string{testDevKey, testDevKey}, keys, "the device key from the start, and after a reboot")
		require.Equal(t, keyStored, st.Key)
		require.Empty(t, st.DeviceKeyID)
	})
}

func TestDeviceKeepsTheFleetKeyWhenItCannotStoreTheDeviceKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		cfg := testConfig()
		cfg.Batches = 1
		cfg.KeyStorePath = filepath.Join(t.TempDir(), "missing-dir", "keys.json")
		h := startDeviceLog(t, t.Context(), cfg, true, infoLogger(&logs))
		synctest.Wait()
		h.enrolled(testDevKey, testDevKeyID)
		sends := h.nextSends(cfg.Interval)
		require.Len(t, sends, 1, "readings go on with the fleet key")
		h.ack(sends[0].id, contract.StatusAccepted, nil)
		st, _ := h.wait()
		keys, _ := h.link.keysDialled()
		require.Equal(t, []string{testFleetKeyCfg}, keys, "a key that is not stored is not used")
		require.Equal(t, keyFleet, st.Key)
		require.Contains(t, logs.String(), "level=ERROR msg=\"could not store the device key")
	})
}

func TestDeviceIgnoresAMalformedDeviceKey(t *testing.T) {
	for name, ack := range map[string][2]string{
		"short key":        {"abc", testDevKeyID},
		"upper-case key":   {strings.ToUpper(testDevKey), testDevKeyID},
		"no key id":        {testDevKey, ""},
		"key id not uuid4": {testDevKey, "not-a-uuid"},
		"key id alone":     {"", testDevKeyID},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs syncbuf.Buffer
				cfg := testConfig()
				cfg.Batches = 1
				h := startDeviceLog(t, t.Context(), cfg, true, infoLogger(&logs))
				synctest.Wait()
				h.enrolled(ack[0], ack[1])
				sends := h.nextSends(cfg.Interval)
				require.Len(t, sends, 1)
				h.ack(sends[0].id, contract.StatusAccepted, nil)
				st, _ := h.wait()
				require.True(t, st.Registered, "the registration itself is confirmed")
				keys, _ := h.link.keysDialled()
				require.Equal(t, []string{testFleetKeyCfg}, keys)
				require.Equal(t, keyFleet, st.Key)
				require.Contains(t, logs.String(), "ignoring a device key in the register answer")
			})
		})
	}
}

// TestDeviceBacksOffWhenItsKeyIsRefused: a batch refused for the device's key is kept and
// sent again only after RetryMax, with one error saying what to do; so is a registration.
func TestDeviceBacksOffWhenItsKeyIsRefused(t *testing.T) {
	for _, reason := range []contract.Reason{contract.ReasonDeviceKeyRequired, contract.ReasonForbidden} {
		t.Run(string(reason), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs syncbuf.Buffer
				cfg := testConfig()
				cfg.Batches = 1
				cfg.DrainTimeout = time.Minute
				h := startDeviceLog(t, t.Context(), cfg, true, infoLogger(&logs))
				synctest.Wait()
				h.registered()
				sends := h.nextSends(cfg.Interval)
				require.Len(t, sends, 1)
				id := sends[0].id
				for i := range 3 {
					h.ack(id, contract.StatusRejected, reasonPtr(reason))
					require.Empty(t, h.nextSends(cfg.RetryMax-time.Millisecond), "refusal %d: nothing before RetryMax", i+1)
					again := h.nextSends(time.Millisecond)
					require.Len(t, again, 1, "refusal %d: the batch is kept and sent again after RetryMax", i+1)
					require.Equal(t, id, again[0].id)
				}
				h.ack(id, contract.StatusAccepted, nil)
				st, lines := h.wait()
				require.Equal(t, 1, st.Accepted, "nothing was lost")
				require.Equal(t, 3, st.Retried[string(reason)])
				require.Empty(t, st.Rejected)
				require.Len(t, lines, 1)
				out := logs.String()
				require.Equal(t, 1, strings.Count(out, "level=ERROR msg=\"batch refused, keeping it"), "one error per series:\n%s", out)
				require.Contains(t, out, "reason="+string(reason))
				if reason == contract.ReasonDeviceKeyRequired {
					require.Contains(t, out, "gatewayctl devices reset-key", "a fleet-key device is told how it enrolls again")
				} else {
					require.Contains(t, out, "bound to another hardware_id")
				}
			})
		})
	}
}

func TestDeviceRegistersAgainAfterARefusedKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncbuf.Buffer
		cfg := testConfig()
		cfg.Batches = 1
		h := startDeviceLog(t, t.Context(), cfg, true, infoLogger(&logs))
		synctest.Wait()
		reason, msg := contract.ReasonDeviceKeyRequired, "hardware_id: holds a device key; use it"
		h.send(event{kind: evAck, ack: contract.Ack{Type: contract.AckTypeRegister, Status: contract.StatusRejected,
			Reason: &reason, Message: &msg}})
		synctest.Wait()
		require.Equal(t, 1, h.link.registrations())
		time.Sleep(cfg.RetryMax - time.Millisecond)
		synctest.Wait()
		require.Equal(t, 1, h.link.registrations(), "not before RetryMax")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		require.Equal(t, 2, h.link.registrations(), "sent again after RetryMax: an operator's reset-key lets it enroll")
		h.enrolled(testDevKey, testDevKeyID)
		synctest.Wait()
		h.registered()
		sends := h.nextSends(cfg.Interval)
		require.NotEmpty(t, sends)
		for _, s := range sends {
			h.ack(s.id, contract.StatusAccepted, nil)
		}
		st, _ := h.wait()
		require.Equal(t, keyEnrolled, st.Key)
		out := logs.String()
		require.Contains(t, out, "level=ERROR msg=\"registration refused: the gateway wants the device's own device key")
		require.Contains(t, out, "message=\"hardware_id: holds a device key; use it\"")
	})
}

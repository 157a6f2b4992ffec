package uplink

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"greenhouse-gateway/function/event"
	"greenhouse-gateway/internal/cloud"
)

// DeviceSource holds device records waiting to be written (the device
// registry, registry.Registry). They are durable there until Upserted is called.
type DeviceSource interface {
	PendingUpserts(limit int) []cloud.DeviceUpsert
	Upserted(cloud.DeviceUpsert)
}

// KeySource holds device keys waiting to be written (the gateway's device
// keys). They are durable there until KeyWritten is called.
type KeySource interface {
	PendingKeyWrites(limit int) []cloud.KeyWrite
	KeyWritten(cloud.KeyWrite)
}

// KeyWriter writes device keys to api_keys (cloud.Keys). Both writes are
// idempotent.
type KeyWriter interface {
	PutDeviceKey(ctx context.Context, info cloud.KeyInfo) error
	RevokeDeviceKey(ctx context.Context, info cloud.KeyInfo) error
}

// keyLogInterval is the least time between two log lines about device
// keys that could not be written.
const keyLogInterval = time.Minute

// Sync writes the device records and device keys the cloud lacks, through
// the uplink's target: with target dynamodb an UpdateItem per device
// record and the key writer's writes, with target lambda events of the
// readings function. Its requests share the uplink's limit of requests in
// flight. Each of the uplink's rounds syncs first, and a device record
// that is not written fails the round (so that a device's record is in the
// cloud before its readings, and a failing devices table shows as the
// uplink's failure); Run syncs every poll_interval besides, for the
// records and keys of an idle uplink, and after a failure with a backoff.
// A key that is not written is tried again at the next sync. Get it with
// Uplink.Sync and run it beside Uplink.Run.
type Sync struct {
	u         *Uplink
	devices   DeviceSource // nil: none
	keys      KeySource    // nil: none
	keyWriter KeyWriter
	// mu makes one pass at a time (a round's or Run's); it guards
	// keyLoggedAt, the last warning about keys.
	mu          sync.Mutex
	keyLoggedAt time.Time
	// failing is set while Run's passes fail (Run's own).
	failing bool
}

func newSync(u *Uplink, devices DeviceSource, keys KeySource, w KeyWriter) *Sync {
	return &Sync{u: u, devices: devices, keys: keys, keyWriter: w}
}

// Sync returns the uplink's device and key syncing, for its Run.
func (u *Uplink) Sync() *Sync { return u.sync }

// pass writes what is pending once; an unwritten device record is its
// error.
func (s *Sync) pass(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.once(ctx)
}

// Run writes device records and keys until ctx is done.
func (s *Sync) Run(ctx context.Context) error {
	if s.devices == nil && s.keys == nil {
		<-ctx.Done()
		return nil
	}
	cfg := s.u.cfg
	backoff := cfg.MinBackoff
	for {
		wait := cfg.PollInterval
		err := s.pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err != nil:
			if !s.failing {
				s.failing = true
				s.u.logger.Warn("device records could not be written; they stay pending and are retried", "err", err)
			}
			wait, backoff = jitter(backoff), min(backoff*2, cfg.MaxBackoff)
		case s.failing:
			s.failing, backoff = false, cfg.MinBackoff
			s.u.logger.Info("device records written again")
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		timer.Stop()
	}
}

// once writes the pending device records, then the pending keys. A
// device record that is not written is its error; a key that is not
// written is tried again next time, and only logged.
func (s *Sync) once(ctx context.Context) error {
	if s.u.lambda != nil {
		return s.viaFunction(ctx)
	}
	if !s.u.clock.Plausible() {
		// Nothing is written with a wrong clock; the uplink's round asks
		// the cloud for the time before its own pass.
		return nil
	}
	if err := s.upsertDevices(ctx); err != nil {
		return err
	}
	s.writeKeys(ctx)
	return nil
}

// upsertDevices writes the pending device records.
func (s *Sync) upsertDevices(ctx context.Context) error {
	if s.devices == nil {
		return nil
	}
	u := s.u
	for _, d := range s.devices.PendingUpserts(100) {
		err := u.call(ctx, "UpdateItem", func(ctx context.Context) error {
			_, err := u.db.UpdateItem(ctx, cloud.DeviceUpdate(u.tables, d))
			return err
		})
		if err != nil {
			return fmt.Errorf("UpdateItem for device %s: %w", d.HardwareID, err)
		}
		s.upserted(d)
	}
	return nil
}

// writeKeys writes the pending device keys, up to the first that fails.
func (s *Sync) writeKeys(ctx context.Context) {
	if s.keys == nil {
		return
	}
	for _, w := range s.keys.PendingKeyWrites(25) {
		write := s.keyWriter.PutDeviceKey
		if w.Revoked {
			write = s.keyWriter.RevokeDeviceKey
		}
		if err := s.u.call(ctx, "UpdateItem", func(ctx context.Context) error { return write(ctx, w.Key) }); err != nil {
			s.keyWarning(w, err)
			return
		}
		s.keyWritten(w)
	}
}

// viaFunction sends the pending device records and device keys through
// the readings function.
func (s *Sync) viaFunction(ctx context.Context) error {
	var ev event.BatchEvent
	var devices []cloud.DeviceUpsert
	if s.devices != nil {
		devices = s.devices.PendingUpserts(100)
	}
	var keys []cloud.KeyWrite
	if s.keys != nil {
		keys = s.keys.PendingKeyWrites(25)
	}
	if len(devices)+len(keys) == 0 {
		return nil
	}
	for i, d := range devices {
		ev.Devices = append(ev.Devices, event.DeviceItem{ID: "d-" + strconv.Itoa(i), Upsert: d})
	}
	for i, k := range keys {
		ev.Keys = append(ev.Keys, event.KeyItem{ID: "k-" + strconv.Itoa(i), Write: k})
	}
	t := s.u.lambda
	results, err := t.invoke(ctx, &ev)
	if err != nil {
		if len(devices) > 0 {
			return err
		}
		s.keyWarning(keys[0], err)
		return nil
	}
	// answer is the function's result for id, counted; nil when it was
	// written.
	answer := func(id string) error {
		r, ok := results[id]
		t.metrics.results.WithLabelValues(resultLabel(r, ok)).Inc()
		if !ok || r.Status != event.StatusDelivered {
			return resultError(id, r, ok)
		}
		return nil
	}
	var firstErr error
	for i, d := range devices {
		if err := answer("d-" + strconv.Itoa(i)); err != nil {
			t.reports.failed(err, false)
			firstErr = cmp.Or(firstErr, fmt.Errorf("device record %s: %w", d.HardwareID, err))
			continue
		}
		s.upserted(d)
	}
	for i, k := range keys {
		if err := answer("k-" + strconv.Itoa(i)); err != nil {
			s.keyWarning(k, err)
			continue
		}
		s.keyWritten(k)
	}
	return firstErr
}

// upserted records a device record written.
func (s *Sync) upserted(d cloud.DeviceUpsert) {
	s.devices.Upserted(d)
	s.u.metrics.deviceUpserts.Inc()
}

// keyWritten records a device key written.
func (s *Sync) keyWritten(w cloud.KeyWrite) {
	s.keys.KeyWritten(w)
	s.u.metrics.keyWrites.WithLabelValues(map[bool]string{false: "issued", true: "revoked"}[w.Revoked]).Inc()
}

// keyWarning logs that w could not be written, at most once per
// keyLogInterval.
func (s *Sync) keyWarning(w cloud.KeyWrite, err error) {
	if now := time.Now(); now.Sub(s.keyLoggedAt) >= keyLogInterval {
		s.keyLoggedAt = now
		s.u.logger.Warn("a device key could not be written to api_keys; trying again", "hardware_id",
			w.Key.HardwareID, "key_id", w.Key.KeyID, "revoke", w.Revoked, "err", err)
	}
}

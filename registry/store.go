package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"
)

// deviceStore keeps device records (the buffer's state records).
type deviceStore interface {
	LoadState(name string) ([]byte, error)
	SaveState(name string, value []byte) error
	LoadStates(prefix string) (map[string][]byte, error)
	SubmitStates(records map[string][]byte) (wait func() error, err error)
}

// Load reads the saved device records from the state store (the buffer,
// already open). It is called once, after New and before the registry
// serves; a saved record replaces the one in memory of the same device.
func (r *Registry) Load() error {
	recs, err := r.state.LoadStates(deviceStatePrefix)
	if err != nil {
		return err
	}
	devices := make(map[string]*Device, len(recs))
	recent := map[string][]string{}
	for name, raw := range recs {
		var d Device
		if err := json.Unmarshal(raw, &d); err != nil {
			return fmt.Errorf("device record %s is unreadable: %w", name, err)
		}
		devices[d.HardwareID] = &d
		for _, a := range d.Anchors {
			recent[d.HardwareID] = append(recent[d.HardwareID], a.BootID)
		}
		if d.BootID != "" {
			recent[d.HardwareID] = append(recent[d.HardwareID], d.BootID)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	maps.Copy(r.devices, devices)
	maps.Copy(r.recentBootIDs, recent)
	return nil
}

// save writes hw's record now. Callers hold r.mu.
func (r *Registry) save(d *Device) error {
	raw, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if err := r.state.SaveState(deviceStatePrefix+d.HardwareID, raw); err != nil {
		return err
	}
	delete(r.dirty, d.HardwareID)
	return nil
}

// Flush saves every changed record, in one synced write waited for
// outside the registry's lock, so that ingest (Observe) never waits for
// the disk here. The records are submitted under the lock, so that a save
// made after this snapshot (Register, Anchor) is written after it.
func (r *Registry) Flush() error {
	r.mu.Lock()
	records := make(map[string][]byte, len(r.dirty))
	for hw := range r.dirty {
		if d, ok := r.devices[hw]; ok {
			raw, err := json.Marshal(d)
			if err != nil {
				r.mu.Unlock()
				return err
			}
			records[deviceStatePrefix+hw] = raw
		}
	}
	clear(r.dirty)
	wait, err := r.state.SubmitStates(records)
	r.mu.Unlock()
	if err == nil {
		err = wait()
	}
	if err != nil {
		r.mu.Lock()
		for name := range records {
			r.dirty[name[len(deviceStatePrefix):]] = true // try again next time
		}
		r.mu.Unlock()
		return err
	}
	return nil
}

// Run saves changed records every FlushInterval, and once more when ctx
// is done.
func (r *Registry) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return r.Flush()
		case <-t.C:
			if err := r.Flush(); err != nil {
				r.logger.Warn("saving device records", "err", err)
			}
		}
	}
}

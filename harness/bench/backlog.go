//go:build linux

package bench

import (
	"context"
	"fmt"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/fleetgen"
)

// commitChunk is how many batches one buffer commit takes when a backlog is
// written directly.
const commitChunk = 500

// backlog describes batches written into a data directory.
type backlog struct {
	Devices  int `json:"devices"`
	Batches  int `json:"batches"`
	Readings int `json:"readings"`
	// CanonicalBytes is the size of the batches' canonical payloads, what
	// the buffer must keep at the least.
	CanonicalBytes int64   `json:"canonical_bytes"`
	FillSeconds    float64 `json:"fill_s"`
}

// fillBacklog writes batches of readings each into the buffer in dir, as the
// gateway's ingest path would (decoded, validated, canonical payload and
// identity hash), the devices taking turns in arrival order, as a fleet
// whose uplink is down would fill it.
func fillBacklog(ctx context.Context, dir string, fleetID byte, devices, batches, readings int) (backlog, error) {
	start := time.Now().Add(-48 * time.Hour)
	devs := make([]*fleetgen.Device, devices)
	for i := range devs {
		devs[i] = fleetgen.NewDevice(fleetgen.HardwareID(fleetID, i), start, uint64(i))
	}
	info, err := storeBatches(ctx, dir, batches, func(i int) (string, []byte, error) {
		d := devs[i%devices]
		_, payload, err := d.Next(readings)
		return d.HardwareID(), payload, err
	})
	info.Devices = devices
	return info, err
}

// deviceBatch is a batch as a device sent it.
type deviceBatch struct {
	hardwareID string
	payload    []byte
}

// storeBatches writes the batches next returns for 0 to batches-1 (each a
// device's hardware_id and the batch as the device sends it) into the
// buffer in dir, as fillBacklog does.
func storeBatches(ctx context.Context, dir string, batches int, next func(i int) (hardwareID string, payload []byte, err error)) (backlog, error) {
	begin := time.Now()
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	if err != nil {
		return backlog{}, err
	}
	info := backlog{Batches: batches}
	lim := contract.DefaultLimits()
	var entries []buffer.Entry
	flush := func() error {
		if len(entries) == 0 {
			return nil
		}
		out, err := buf.Commit(ctx, entries)
		if err != nil {
			return err
		}
		for i, o := range out {
			if o != buffer.Stored {
				return fmt.Errorf("backlog batch %s: %s, want stored", entries[i].BatchID, o)
			}
		}
		entries = entries[:0]
		return nil
	}
	for i := range batches {
		hw, payload, err := next(i)
		if err != nil {
			return backlog{}, closeWith(buf, err)
		}
		now := time.Now()
		b, err := contract.DecodeBatch(payload, hw, lim, now)
		if err != nil {
			return backlog{}, closeWith(buf, fmt.Errorf("backlog batch: %w", err))
		}
		canonical := b.Canonical()
		info.Readings += len(b.Readings)
		info.CanonicalBytes += int64(len(canonical))
		entries = append(entries, buffer.Entry{BatchID: b.BatchID, HardwareID: b.HardwareID,
			Hash: b.IdentityHash(), Payload: canonical, ReceivedAt: now})
		if len(entries) == commitChunk {
			if err := flush(); err != nil {
				return backlog{}, closeWith(buf, err)
			}
		}
	}
	if err := flush(); err != nil {
		return backlog{}, closeWith(buf, err)
	}
	if err := buf.Close(); err != nil {
		return backlog{}, err
	}
	info.FillSeconds = time.Since(begin).Seconds()
	return info, nil
}

func closeWith(buf *buffer.Buffer, err error) error {
	if cerr := buf.Close(); cerr != nil {
		return fmt.Errorf("%w (and closing the buffer: %v)", err, cerr)
	}
	return err
}

// readBacklog returns every pending batch of the buffer in dir, oldest
// first.
func readBacklog(dir string) ([]buffer.Pending, error) {
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	if err != nil {
		return nil, err
	}
	var all []buffer.Pending
	var after uint64
	for {
		page, err := buf.Pending(after, 1000)
		if err != nil {
			return nil, closeWith(buf, err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
	return all, buf.Close()
}

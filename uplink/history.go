package uplink

import (
	"slices"
	"strings"
	"sync"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function/event"
	"greenhouse-gateway/internal/tablewrite"
)

// deliveredHistory is what the lambda target knows of each device's
// newest readings in device_readings: the readings of the batches the
// function answered delivered or duplicate since the gateway started,
// newest event.HistoryLen by the table's sort key (timestamp, then
// batch_id). Any other answer for one of a device's batches (or a failed
// invocation carrying one) forgets the device: its readings may be in
// the table or not. Events carry a device's history (event.HistoryHint)
// once it holds HistoryLen readings, so that the function need not read
// them (it reads them without a hint, e.g. for a device's first batches
// after a start). It holds at most historyDevices devices and about
// historyBytes of their hints' encoding; a device beyond them has its
// readings read.
type deliveredHistory struct {
	mu      sync.Mutex
	devices map[string]deviceHistory
	total   int // the devices' sizes
}

// deviceHistory is a device's newest readings, oldest first, and their
// size by entrySize.
type deviceHistory struct {
	entries []historyEntry
	size    int
}

// historyDevices and historyBytes bound what a deliveredHistory holds.
const (
	historyDevices = 4096
	historyBytes   = 4 << 20
)

// entrySize is about what a reading takes in a hint's JSON: its
// timestamp and, for each sensor, its name and a number of up to 24
// characters with the quotes and separators.
func entrySize(e historyEntry) int {
	n := 32
	for name := range e.sensors {
		n += len(name) + 28
	}
	return n
}

// hintSize is about what the device's hint adds to an event, 0 without
// one.
func (h *deliveredHistory) hintSize(hw string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.devices[hw]
	if len(d.entries) < event.HistoryLen {
		return 0
	}
	return d.size + len(hw) + 48
}

// historyEntry is one reading of a deliveredHistory.
type historyEntry struct {
	ts      int64
	batchID string
	sensors map[string]float64
}

// hint returns the device's history hint; ok is false while fewer than
// HistoryLen of its readings are known.
func (h *deliveredHistory) hint(hw string) (event.HistoryHint, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	es := h.devices[hw].entries
	if len(es) < event.HistoryLen {
		return event.HistoryHint{}, false
	}
	out := event.HistoryHint{HardwareID: hw, Readings: make([]event.HistoryReading, len(es))}
	for i, e := range es {
		out.Readings[i] = event.HistoryReading{TimestampMS: e.ts, Sensors: e.sensors}
	}
	return out, true
}

// delivered adds the readings of a batch in the cloud. What it keeps is
// its own copy: the decoded batch's strings (hardware_id, batch_id, the
// sensor names) are substrings of its payload, which would otherwise stay
// alive for as long as the device's history holds a reading of it (a map
// assignment stores the assigned key's string each time).
func (h *deliveredHistory) delivered(hw, batchID string, readings []contract.Reading) {
	if len(readings) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.devices == nil {
		h.devices = map[string]deviceHistory{}
	}
	d, known := h.devices[hw]
	es := d.entries
	if !known && (len(h.devices) >= historyDevices || h.total >= historyBytes) {
		return
	}
	hw, batchID = strings.Clone(hw), strings.Clone(batchID)
	names := map[string]string{} // each sensor name copied once a batch
	for _, r := range readings {
		sensors := make(map[string]float64, len(r.Sensors))
		for name, v := range r.Sensors {
			own, ok := names[name]
			if !ok {
				own = strings.Clone(name)
				names[name] = own
			}
			sensors[own] = v
		}
		e := historyEntry{ts: r.TimestampMS, batchID: batchID, sensors: sensors}
		i, found := slices.BinarySearchFunc(es, e, compareEntries)
		if !found {
			es = slices.Insert(es, i, e)
		}
	}
	if n := len(es) - event.HistoryLen; n > 0 {
		es = slices.Delete(es, 0, n)
	}
	size := 0
	for _, e := range es {
		size += entrySize(e)
	}
	h.total += size - d.size
	h.devices[hw] = deviceHistory{entries: es, size: size}
}

// forget drops what is known of the device.
func (h *deliveredHistory) forget(hw string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.total -= h.devices[hw].size
	delete(h.devices, hw)
}

// compareEntries orders entries as device_readings' sort key does.
func compareEntries(a, b historyEntry) int {
	return strings.Compare(tablewrite.TSBatch(a.ts, a.batchID), tablewrite.TSBatch(b.ts, b.batchID))
}

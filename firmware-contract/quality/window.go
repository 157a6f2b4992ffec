package quality

import (
	"container/list"
	"math"
	"sync"

	contract "greenhouse-gateway/firmware-contract"
)

// MaxSensorsPerDevice bounds the sensors whose history is kept per device;
// past it, the sensor not seen for the longest time is forgotten.
const MaxSensorsPerDevice = 128

// history is one device's last HistoryLen finite values per sensor, oldest
// first.
type history struct {
	values map[string][]float64
	seen   map[string]uint64 // sensor -> tick of its last value
	tick   uint64
	keep   int // capacity of a sensor's values: HistoryLen, or fewer for a batch
}

func newHistory(keep int) *history {
	return &history{values: map[string][]float64{}, seen: map[string]uint64{}, keep: keep}
}

// score scores r against the history, then adds r's values to it.
func (h *history) score(r contract.Reading) float64 {
	q := Score(r, h.values)
	h.add(r)
	return q
}

func (h *history) add(r contract.Reading) {
	h.tick++
	// Every value of r gets the same tick, so the order they are added in
	// does not matter (forgetStalest breaks ties by name).
	for name, v := range r.Sensors {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue // Score skips them in recent values too
		}
		vs := h.values[name]
		if vs == nil {
			vs = make([]float64, 0, h.keep)
		}
		if len(vs) == HistoryLen {
			copy(vs, vs[1:])
			vs = vs[:HistoryLen-1]
		}
		h.values[name] = append(vs, v)
		h.seen[name] = h.tick
	}
	for len(h.values) > MaxSensorsPerDevice {
		h.forgetStalest()
	}
}

func (h *history) forgetStalest() {
	stalest, first := "", true
	for name, t := range h.seen {
		if first || t < h.seen[stalest] || (t == h.seen[stalest] && name < stalest) {
			stalest, first = name, false
		}
	}
	delete(h.values, stalest)
	delete(h.seen, stalest)
}

// ScoreSequence scores one device's readings in the order given: each
// reading's recent values are those of the readings before it in readings.
// Pass them in time order.
func ScoreSequence(readings []contract.Reading) []float64 {
	h := newHistory(max(1, min(len(readings), HistoryLen)))
	out := make([]float64, len(readings))
	for i, r := range readings {
		out[i] = h.score(r)
	}
	return out
}

// Window keeps the recent values of a bounded number of devices, for callers
// that score readings as they stream in. It is safe for concurrent use.
type Window struct {
	mu         sync.Mutex
	maxDevices int
	devices    map[string]*list.Element // of *windowEntry
	lru        *list.List               // most recently used first
}

type windowEntry struct {
	device string
	h      *history
}

// NewWindow returns a Window that keeps the history of at most maxDevices
// devices (at least 1), forgetting the least recently used one past that.
func NewWindow(maxDevices int) *Window {
	return &Window{maxDevices: max(maxDevices, 1), devices: map[string]*list.Element{}, lru: list.New()}
}

// Score scores r against the device's recent values in the window, then adds
// r's values to them. Give one device's readings in time order.
func (w *Window) Score(device string, r contract.Reading) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	el, ok := w.devices[device]
	if ok {
		w.lru.MoveToFront(el)
	} else {
		el = w.lru.PushFront(&windowEntry{device: device, h: newHistory(HistoryLen)})
		w.devices[device] = el
		for w.lru.Len() > w.maxDevices {
			oldest := w.lru.Back()
			w.lru.Remove(oldest)
			delete(w.devices, oldest.Value.(*windowEntry).device)
		}
	}
	return el.Value.(*windowEntry).h.score(r)
}

// Len is the number of devices the window holds.
func (w *Window) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lru.Len()
}

package quality

import (
	"math"
	"slices"
	"strings"

	contract "greenhouse-gateway/firmware-contract"
)

// Constants of the formula (see the package documentation).
const (
	// HistoryLen is how many recent values of a sensor the checks use at most.
	HistoryLen = 16
	// MinSpikeHistory is the fewest recent values the spike check needs.
	MinSpikeHistory = 4
	// StuckRun is how many equal recent values make a value stuck.
	StuckRun = 8

	spikeLowZ     = 6.0
	spikeHighZ    = 18.0
	spikeFloor    = 0.2
	madToSigma    = 1.4826
	stuckPenalty  = 0.5
	unknownStatus = 0.5
)

// Unit is the plausible range and the check settings of one unit suffix.
type Unit struct {
	// Suffix ends the sensor names of this unit, e.g. "_c".
	Suffix string
	// Name says what the unit is, for documentation.
	Name string
	// Min and Max bound the values that score 1.
	Min, Max float64
	// LowMargin and HighMargin are the distances below Min and above Max
	// over which the range factor falls linearly from 1 to 0; 0 means any
	// value beyond that bound scores 0.
	LowMargin, HighMargin float64
	// SpikeSpread is the smallest scale of the spike check, in the unit; 0
	// turns the spike check off for the unit.
	SpikeSpread float64
	// Stuck turns the stuck-value check on for the unit.
	Stuck bool
}

// units are the unit suffixes the scorer knows, with ranges chosen for a
// greenhouse (a constant table).
var units = []Unit{
	// Air, soil and water temperature; 85 (the DS18B20 power-on value) and
	// -127 (its "disconnected" value) score 0.
	{Suffix: "_c", Name: "temperature, °C", Min: -20, Max: 60, LowMargin: 20, HighMargin: 25, SpikeSpread: 0.5, Stuck: true},
	// Relative humidity, soil moisture: a percentage.
	{Suffix: "_pct", Name: "percent", Min: 0, Max: 100, LowMargin: 5, HighMargin: 5, SpikeSpread: 2, Stuck: true},
	// Station (not sea-level) air pressure, from sea level to about 4000 m.
	{Suffix: "_hpa", Name: "air pressure, hPa", Min: 600, Max: 1100, LowMargin: 100, HighMargin: 100, SpikeSpread: 1, Stuck: true},
	// Illuminance: 0 at night, about 100000 in full sun.
	{Suffix: "_lux", Name: "illuminance, lx", Min: 0, Max: 150000, LowMargin: 0, HighMargin: 50000},
	// CO2: about 420 outdoors, enriched greenhouses 800..1500, depleted
	// ones down to about 200 on sunny days.
	{Suffix: "_ppm", Name: "CO2, ppm", Min: 150, Max: 5000, LowMargin: 150, HighMargin: 5000, SpikeSpread: 50, Stuck: true},
	// Battery, supply or solar panel voltage.
	{Suffix: "_v", Name: "voltage, V", Min: 0, Max: 15, LowMargin: 0, HighMargin: 15, SpikeSpread: 0.2},
	// Nutrient solution pH.
	{Suffix: "_ph", Name: "pH", Min: 3, Max: 10, LowMargin: 3, HighMargin: 4, SpikeSpread: 0.3, Stuck: true},
	// Nutrient solution electrical conductivity, mS/cm.
	{Suffix: "_ms_cm", Name: "conductivity, mS/cm", Min: 0, Max: 10, LowMargin: 0, HighMargin: 10, SpikeSpread: 0.2, Stuck: true},
	// Solar irradiance.
	{Suffix: "_w_m2", Name: "irradiance, W/m²", Min: 0, Max: 1400, LowMargin: 0, HighMargin: 600},
	// Radio signal strength.
	{Suffix: "_dbm", Name: "signal strength, dBm", Min: -120, Max: 0, LowMargin: 20, HighMargin: 0},
}

// Units returns the unit suffixes the scorer knows, with ranges chosen for a
// greenhouse.
func Units() []Unit { return slices.Clone(units) }

// unitBySuffix maps each unit's suffix to its index in units.
var unitBySuffix = func() map[string]int {
	m := make(map[string]int, len(units))
	for i, u := range units {
		m[u.Suffix] = i
	}
	return m
}()

// UnitOf returns the unit of a sensor name (the longest matching suffix of
// [Units]) and whether there is one.
func UnitOf(name string) (Unit, bool) {
	// Every suffix starts with '_' (TestUnitOfIsTheLongestSuffix): the
	// longest one name ends with starts at the leftmost '_' that begins
	// one.
	for i := 0; i < len(name); i++ {
		if name[i] == '_' {
			if j, ok := unitBySuffix[name[i:]]; ok {
				return units[j], true
			}
		}
	}
	return Unit{}, false
}

// Score is the quality of reading r: the mean of its entries' scores, rounded
// to three decimals. recent maps a sensor name to the device's values of that
// sensor before r, oldest first; only the last HistoryLen count, and a nil or
// missing entry means no history.
func Score(r contract.Reading, recent map[string][]float64) float64 {
	// Entries are summed in name order so that every run, and every
	// implementation, rounds the same sum.
	var sum float64
	n := 0
	var nameKeys, statusKeys [16]string // a typical reading's names fit: no allocation
	names := sortedKeys(nameKeys[:0], r.Sensors)
	statuses := sortedKeys(statusKeys[:0], r.SensorStatus)
	for _, name := range names {
		sum += statusFactor(r.SensorStatus, statuses, name) * Value(name, r.Sensors[name], recent[name])
		n++
	}
	for _, s := range statuses {
		status := r.SensorStatus[s]
		if status == contract.SensorOK || governsAny(s, names) {
			continue
		}
		sum += statusValue(status)
		n++
	}
	if n == 0 {
		return 1
	}
	return round3(sum / float64(n))
}

// Value is the quality of one sensor value from its own checks (range, spike,
// stuck), without the status: the product of their factors. recent is the
// sensor's values before it, oldest first.
func Value(name string, v float64, recent []float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	u, ok := UnitOf(name)
	if !ok {
		return 1
	}
	var last [HistoryLen]float64
	h := lastFinite(last[:0], recent)
	return rangeFactor(u, v) * spikeFactor(u, v, h) * stuckFactor(u, v, h)
}

func rangeFactor(u Unit, v float64) float64 {
	var d, margin float64
	switch {
	case v < u.Min:
		d, margin = u.Min-v, u.LowMargin
	case v > u.Max:
		d, margin = v-u.Max, u.HighMargin
	default:
		return 1
	}
	if margin <= 0 {
		return 0
	}
	return math.Max(0, 1-d/margin)
}

func spikeFactor(u Unit, v float64, h []float64) float64 {
	if u.SpikeSpread <= 0 || len(h) < MinSpikeHistory {
		return 1
	}
	// On the stack for up to HistoryLen values (what Value passes).
	var scratch, devs [HistoryLen]float64
	m := median(scratch[:0], h)
	dev := devs[:0]
	for _, x := range h {
		dev = append(dev, math.Abs(x-m))
	}
	scale := math.Max(madToSigma*median(scratch[:0], dev), u.SpikeSpread)
	z := math.Abs(v-m) / scale
	switch {
	case math.IsNaN(z) || z >= spikeHighZ:
		return spikeFloor
	case z <= spikeLowZ:
		return 1
	default:
		return 1 - (1-spikeFloor)*(z-spikeLowZ)/(spikeHighZ-spikeLowZ)
	}
}

func stuckFactor(u Unit, v float64, h []float64) float64 {
	if !u.Stuck {
		return 1
	}
	n := 0
	for i := len(h) - 1; i >= 0 && h[i] == v; i-- {
		n++
	}
	if n >= StuckRun {
		return stuckPenalty
	}
	return 1
}

// statusFactor is the factor of the status governing the value name; keys
// are the statuses' names.
func statusFactor(statuses map[string]string, keys []string, name string) float64 {
	best, found := "", false
	for _, s := range keys {
		if governs(s, name) && (!found || len(s) > len(best)) {
			best, found = s, true
		}
	}
	if !found {
		return 1
	}
	return statusValue(statuses[best])
}

func statusValue(status string) float64 {
	switch status {
	case contract.SensorOK:
		return 1
	case contract.SensorError:
		return 0
	default:
		return unknownStatus
	}
}

// governs reports whether the status entry s applies to the value name.
func governs(s, name string) bool {
	return name == s || (strings.HasPrefix(name, s) && name[len(s)] == '_')
}

func governsAny(s string, names []string) bool {
	for _, name := range names {
		if governs(s, name) {
			return true
		}
	}
	return false
}

// sortedKeys appends m's keys to dst, sorted.
func sortedKeys[V any](dst []string, m map[string]V) []string {
	for k := range m {
		dst = append(dst, k)
	}
	slices.Sort(dst)
	return dst
}

// lastFinite returns the last at most cap(out) finite values of xs, in
// order, in out.
func lastFinite(out, xs []float64) []float64 {
	n := cap(out)
	for i := len(xs) - 1; i >= 0 && len(out) < n; i-- {
		if !math.IsNaN(xs[i]) && !math.IsInf(xs[i], 0) {
			out = append(out, xs[i])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// median of xs (not empty), sorted in scratch; xs is left unchanged.
func median(scratch, xs []float64) float64 {
	s := append(scratch[:0], xs...)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	return (s[mid-1] + s[mid]) / 2
}

// round3 rounds x to three decimal places, half away from zero.
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

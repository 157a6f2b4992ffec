package quality

import (
	"encoding/binary"
	"math"
	"testing"

	contract "greenhouse-gateway/firmware-contract"
)

// FuzzScore checks, for any value, status and history, that the score is a
// number in [0, 1] with three decimals, that it is deterministic, and that
// ScoreSequence over the history gives the same score as Score.
func FuzzScore(f *testing.F) {
	hist := func(vs ...float64) []byte {
		b := make([]byte, 0, 8*len(vs))
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
		return b
	}
	f.Add("bme280_temp_c", 22.5, "bme280", "ok", hist(22.4, 22.5, 22.6, 22.5))
	f.Add("ds18b20_temp_c", 85.0, "ds18b20", "error", hist())
	f.Add("humidity_pct", 61.3, "soil", "degraded", hist(61.3, 61.3, 61.3, 61.3, 61.3, 61.3, 61.3, 61.3))
	f.Add("co2_ppm", 1e125, "co2_ppm", "ok", hist(math.NaN(), math.Inf(1), -1e125, 420))
	f.Add("rain_count", -1e-130, "", "", hist(0, 0, 0))
	f.Fuzz(func(t *testing.T, name string, v float64, statusName, status string, raw []byte) {
		var recent []float64
		for i := 0; i+8 <= len(raw) && len(recent) < 4*HistoryLen; i += 8 {
			recent = append(recent, math.Float64frombits(binary.LittleEndian.Uint64(raw[i:])))
		}
		r := contract.Reading{Sensors: map[string]float64{name: v}, SensorStatus: map[string]string{}}
		if statusName != "" {
			r.SensorStatus[statusName] = status
		}
		q := Score(r, map[string][]float64{name: recent})
		if math.IsNaN(q) || q < 0 || q > 1 || round3(q) != q {
			t.Fatalf("Score = %v", q)
		}
		if again := Score(r, map[string][]float64{name: recent}); again != q {
			t.Fatalf("Score not deterministic: %v then %v", q, again)
		}
		if x := Value(name, v, recent); math.IsNaN(x) || x < 0 || x > 1 {
			t.Fatalf("Value = %v", x)
		}
		seq := make([]contract.Reading, 0, len(recent)+1)
		for _, x := range recent {
			seq = append(seq, contract.Reading{Sensors: map[string]float64{name: x}})
		}
		scores := ScoreSequence(append(seq, r))
		if last := scores[len(scores)-1]; last != q {
			t.Fatalf("ScoreSequence's last score %v, Score %v", last, q)
		}
	})
}

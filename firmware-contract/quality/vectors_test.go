package quality

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	contract "greenhouse-gateway/firmware-contract"
)

// vectorsFile is the language-neutral quality vectors shared with firmware
// and cloud authors, relative to this package's directory.
var vectorsFile = filepath.Join("..", "testdata", "quality.json")

type vectorReading struct {
	Sensors      map[string]float64 `json:"sensors"`
	SensorStatus map[string]string  `json:"sensor_status"`
}

func (r vectorReading) reading() contract.Reading {
	return contract.Reading{TimestampMS: contract.MinTimestampMS, Sensors: r.Sensors, SensorStatus: r.SensorStatus}
}

type vectors struct {
	About string `json:"about"`
	Cases []struct {
		Name        string               `json:"name"`
		Description string               `json:"description"`
		Reading     vectorReading        `json:"reading"`
		Recent      map[string][]float64 `json:"recent"`
		Score       float64              `json:"score"`
	} `json:"cases"`
	Sequences []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Readings    []vectorReading `json:"readings"`
		Scores      []float64       `json:"scores"`
	} `json:"sequences"`
}

func loadVectors(tb testing.TB) vectors {
	tb.Helper()
	data, err := os.ReadFile(vectorsFile)
	require.NoError(tb, err)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var v vectors
	require.NoError(tb, dec.Decode(&v))
	require.NotEmpty(tb, v.Cases)
	require.NotEmpty(tb, v.Sequences)
	return v
}

func TestVectors(t *testing.T) {
	v := loadVectors(t)
	names := map[string]bool{}
	for _, c := range v.Cases {
		require.False(t, names[c.Name], "case names are unique: %s", c.Name)
		names[c.Name] = true
		require.NotEmpty(t, c.Description, c.Name)
		t.Run(c.Name, func(t *testing.T) {
			// Scores are rounded to three decimals, so equality is exact.
			require.Equal(t, c.Score, Score(c.Reading.reading(), c.Recent), c.Description)
		})
	}
	for _, s := range v.Sequences {
		t.Run(s.Name, func(t *testing.T) {
			rs := make([]contract.Reading, len(s.Readings))
			for i, r := range s.Readings {
				rs[i] = r.reading()
			}
			require.Equal(t, s.Scores, ScoreSequence(rs), s.Description)
			w := NewWindow(1)
			for i, r := range rs {
				require.Equal(t, s.Scores[i], w.Score("AA:BB:CC:DD:EE:FF", r), "reading %d through a Window", i)
			}
		})
	}
}

// TestVectorsCoverEveryRule keeps the vectors a reference: every unit and
// every check appears with a score below 1.
func TestVectorsCoverEveryRule(t *testing.T) {
	v := loadVectors(t)
	lowered := map[string]bool{}
	for _, c := range v.Cases {
		if c.Score < 1 {
			for name := range c.Reading.Sensors {
				if u, ok := UnitOf(name); ok {
					lowered[u.Suffix] = true
				}
			}
		}
	}
	for _, u := range Units() {
		require.True(t, lowered[u.Suffix], "a vector lowers a score for a %s value", u.Suffix)
	}
	for _, prefix := range []string{"spike_", "stuck_", "status_", "unknown_suffix"} {
		found := false
		for _, c := range v.Cases {
			found = found || len(c.Name) >= len(prefix) && c.Name[:len(prefix)] == prefix
		}
		require.True(t, found, "a vector named %s*", prefix)
	}
}

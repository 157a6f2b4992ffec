//go:build linux

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// Figure is one measured figure with its baseline from the same run.
type Figure struct {
	Section string  `json:"section"`
	Name    string  `json:"name"`
	Unit    string  `json:"unit"`
	Value   float64 `json:"value"`
	// Baseline is the same figure of the baseline named by BaselineName.
	Baseline     float64 `json:"baseline"`
	BaselineName string  `json:"baseline_name"`
	// Ratio is Value / Baseline (0 when the baseline is 0).
	Ratio float64 `json:"ratio"`
	// Target and Verdict (PASS or MISS) are set on the figures that have
	// a target.
	Target  string `json:"target,omitempty"`
	Verdict string `json:"verdict,omitempty"`
}

// target checks a figure; pass reports whether it meets the target.
type target struct {
	text string
	pass func(f Figure) bool
}

func ratioAtLeast(x float64) *target {
	return &target{fmt.Sprintf(">= %gx baseline", x), func(f Figure) bool { return f.Ratio >= x }}
}

func ratioAtMost(x float64) *target {
	return &target{fmt.Sprintf("<= %gx baseline", x), func(f Figure) bool { return f.Ratio <= x }}
}

func below(x float64, unit string) *target {
	return &target{fmt.Sprintf("< %g %s", x, unit), func(f Figure) bool { return f.Value < x }}
}

func atLeast(x float64, unit string) *target {
	return &target{fmt.Sprintf(">= %g %s", x, unit), func(f Figure) bool { return f.Value >= x }}
}

func atMost(x float64, unit string) *target {
	return &target{fmt.Sprintf("<= %g %s", x, unit), func(f Figure) bool { return f.Value <= x }}
}

// Results is everything a run measured: the figures and the detail behind
// them.
type Results struct {
	StartedAt time.Time      `json:"started_at"`
	Seconds   float64        `json:"seconds"`
	Host      Host           `json:"host"`
	Config    Config         `json:"config"`
	Figures   []Figure       `json:"figures"`
	Notes     []string       `json:"notes"`
	Details   map[string]any `json:"details"`
}

// Host describes the machine.
type Host struct {
	CPUs        int    `json:"cpus"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"go_version"`
	LoadStart   string `json:"loadavg_start"`
	LoadEnd     string `json:"loadavg_end"`
	GatewayRev  string `json:"gateway_revision"`
	DynamoLocal string `json:"dynamodb_local"`
}

func (r *Results) add(section, name, unit string, value, baseline float64, baselineName string, t *target) {
	f := Figure{Section: section, Name: name, Unit: unit, Value: round(value), Baseline: round(baseline), BaselineName: baselineName}
	if baseline != 0 {
		f.Ratio = math.Round(value/baseline*1000) / 1000
	}
	if t != nil {
		f.Target = t.text
		f.Verdict = "MISS"
		if t.pass(f) {
			f.Verdict = "PASS"
		}
	}
	r.Figures = append(r.Figures, f)
}

func (r *Results) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// round keeps four significant digits.
func round(v float64) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	scale := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(v))))
	return math.Round(v*scale) / scale
}

// PrintTable writes the figures as a table, then the notes.
func (r *Results) PrintTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SECTION\tFIGURE\tVALUE\tBASELINE\tRATIO\tTARGET\tVERDICT")
	section := ""
	for _, f := range r.Figures {
		s := f.Section
		if s == section {
			s = ""
		}
		section = f.Section
		ratio := "-"
		if f.Ratio != 0 {
			ratio = fmt.Sprintf("%.2fx", f.Ratio)
		}
		target, verdict := "-", "-"
		if f.Target != "" {
			target, verdict = f.Target, f.Verdict
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s (%s)\t%s\t%s\t%s\n", s, f.Name, format(f.Value, f.Unit),
			format(f.Baseline, f.Unit), f.BaselineName, ratio, target, verdict)
	}
	_ = tw.Flush()
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, n := range r.Notes {
			fmt.Fprintln(w, "  - "+n)
		}
	}
}

func format(v float64, unit string) string {
	switch {
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f %s", v, unit)
	default:
		return fmt.Sprintf("%.3f %s", v, unit)
	}
}

// WriteJSON writes the results to path, creating its directory.
func (r *Results) WriteJSON(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// mb is bytes in mebibytes.
func mb(b int64) float64 { return float64(b) / (1 << 20) }

func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

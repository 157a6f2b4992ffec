// Package emftest reads the CloudWatch Embedded Metric Format documents a
// process printed (the readings function's stdout, as its emulator
// captures it) and checks them against the EMF specification's structure:
// a JSON object a line, with
//
//	{"_aws":{"Timestamp":<epoch ms>,"CloudWatchMetrics":[{"Namespace":"...",
//	  "Dimensions":[["Dim",...]],"Metrics":[{"Name":"...","Unit":"..."}]}]},
//	 "Dim":"value", "Name":<number>, ...}
//
// where every dimension and metric a directive names is a member of the
// root, dimensions strings and metric values numbers.
package emftest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Units are CloudWatch's metric units (MetricDatum.Unit).
var Units = []string{"Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes",
	"Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
	"Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
	"Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None"}

// Metric is one metric of a document: its directive's namespace and
// dimension set, its name, unit and value.
type Metric struct {
	Namespace  string
	Dimensions []string
	Name, Unit string
	Value      float64
}

// Doc is one EMF document.
type Doc struct {
	// Timestamp is _aws.Timestamp, epoch milliseconds.
	Timestamp int64
	// Root holds the document's members but _aws.
	Root    map[string]any
	Metrics []Metric
}

// Dimension returns the root's string member name.
func (d Doc) Dimension(name string) string {
	s, _ := d.Root[name].(string)
	return s
}

// Value returns the value of metric name and whether the document has it.
func (d Doc) Value(name string) (float64, bool) {
	for _, m := range d.Metrics {
		if m.Name == name {
			return m.Value, true
		}
	}
	return 0, false
}

// MustValue returns the value of metric name, failing tb when the
// document lacks it.
func (d Doc) MustValue(tb testing.TB, name string) float64 {
	tb.Helper()
	v, ok := d.Value(name)
	if !ok {
		tb.Fatalf("the EMF document has no metric %s: %v", name, d.Root)
	}
	return v
}

// Parse returns the EMF documents among output's lines (lines that are
// JSON objects with an _aws member), or the first that breaks the
// structure.
func Parse(output string) ([]Doc, error) {
	var docs []Doc
	for i, line := range strings.Split(output, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "{") || !strings.Contains(line, `"_aws"`) {
			continue
		}
		d, err := parseDoc([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("line %d: %w: %s", i+1, err, line)
		}
		docs = append(docs, d)
	}
	return docs, nil
}

func parseDoc(line []byte) (Doc, error) {
	var root map[string]json.RawMessage
	if err := json.Unmarshal(line, &root); err != nil {
		return Doc{}, fmt.Errorf("not one JSON object: %w", err)
	}
	var meta struct {
		Timestamp         *int64 `json:"Timestamp"`
		CloudWatchMetrics []struct {
			Namespace  string     `json:"Namespace"`
			Dimensions [][]string `json:"Dimensions"`
			Metrics    []struct {
				Name string `json:"Name"`
				Unit string `json:"Unit"`
			} `json:"Metrics"`
		} `json:"CloudWatchMetrics"`
	}
	if err := json.Unmarshal(root["_aws"], &meta); err != nil {
		return Doc{}, fmt.Errorf("_aws: %w", err)
	}
	if meta.Timestamp == nil || *meta.Timestamp <= 0 {
		return Doc{}, errors.New("_aws.Timestamp: want epoch milliseconds")
	}
	if len(meta.CloudWatchMetrics) == 0 {
		return Doc{}, errors.New("_aws.CloudWatchMetrics: want at least one directive")
	}
	d := Doc{Timestamp: *meta.Timestamp, Root: map[string]any{}}
	for k, v := range root {
		if k == "_aws" {
			continue
		}
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return Doc{}, err
		}
		d.Root[k] = x
	}
	for _, dir := range meta.CloudWatchMetrics {
		if dir.Namespace == "" || strings.HasPrefix(dir.Namespace, "AWS/") {
			return Doc{}, fmt.Errorf("namespace %q: want a custom namespace", dir.Namespace)
		}
		if len(dir.Dimensions) == 0 || len(dir.Metrics) == 0 || len(dir.Metrics) > 100 {
			return Doc{}, errors.New("a directive needs Dimensions and 1 to 100 Metrics")
		}
		for _, set := range dir.Dimensions {
			if len(set) > 30 {
				return Doc{}, errors.New("a dimension set of more than 30 dimensions")
			}
			for _, dim := range set {
				if _, ok := d.Root[dim].(string); !ok {
					return Doc{}, fmt.Errorf("dimension %s: want a string member of the root", dim)
				}
			}
		}
		for _, m := range dir.Metrics {
			if m.Unit != "" && !slices.Contains(Units, m.Unit) {
				return Doc{}, fmt.Errorf("metric %s: unit %q is not a CloudWatch unit", m.Name, m.Unit)
			}
			v, ok := d.Root[m.Name].(float64)
			if !ok {
				return Doc{}, fmt.Errorf("metric %s: want a number member of the root", m.Name)
			}
			for _, set := range dir.Dimensions {
				d.Metrics = append(d.Metrics, Metric{Namespace: dir.Namespace, Dimensions: set, Name: m.Name, Unit: m.Unit, Value: v})
			}
		}
	}
	return d, nil
}

// Select returns the documents with every dimension of dims at its value.
func Select(docs []Doc, dims map[string]string) []Doc {
	var out []Doc
	for _, d := range docs {
		match := true
		for k, v := range dims {
			match = match && d.Dimension(k) == v
		}
		if match {
			out = append(out, d)
		}
	}
	return out
}

// Conform checks that every metric of docs is in namespace and that lookup
// knows its name, with the unit and the dimension set it has.
func Conform(docs []Doc, namespace string, lookup func(name string) (unit string, dims []string, ok bool)) error {
	var errs []error
	for _, d := range docs {
		for _, m := range d.Metrics {
			unit, dims, ok := lookup(m.Name)
			switch {
			case m.Namespace != namespace:
				errs = append(errs, fmt.Errorf("metric %s: namespace %q, want %q", m.Name, m.Namespace, namespace))
			case !ok:
				errs = append(errs, fmt.Errorf("metric %s: not a metric the code declares", m.Name))
			case m.Unit != unit || !slices.Equal(m.Dimensions, dims):
				errs = append(errs, fmt.Errorf("metric %s: unit %s, dimensions %v; declared %s, %v", m.Name, m.Unit, m.Dimensions, unit, dims))
			}
		}
	}
	return errors.Join(errs...)
}

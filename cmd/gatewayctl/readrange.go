package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloudread"
	"greenhouse-gateway/internal/readquery"
)

// queryFlags are the flags of the reading queries: the parameters of the
// operator APIs' GET /v1/devices/{hardware_id}/readings and /summary, read
// by the same code (internal/readquery) from the same names.
type queryFlags struct {
	hw      *string
	params  []string
	values  map[string]*string
	jsonOut *bool
}

// windowFlags are the flags of both queries' window.
var windowFlags = map[string]string{
	"from": "the window's start, inclusive: " + timeFlagUsage + " (default: 24 hours before --to)",
	"to":   "the window's end, exclusive: " + timeFlagUsage + " (default: now)",
}

// registerQueryFlags registers --hardware-id, --json, the window's flags
// and params (parameter name → usage).
func registerQueryFlags(fs *flag.FlagSet, params map[string]string) *queryFlags {
	q := &queryFlags{values: map[string]*string{}}
	params = maps.Clone(params)
	maps.Copy(params, windowFlags)
	q.hw = fs.String("hardware-id", "", "the device (required)")
	for name, usage := range params {
		q.params = append(q.params, name)
		q.values[name] = fs.String(strings.ReplaceAll(name, "_", "-"), "", usage)
	}
	sort.Strings(q.params)
	q.jsonOut = fs.Bool("json", false, "print the answer as the read APIs' JSON")
	return q
}

// query returns the flags as the APIs' query parameters, after checking
// the device.
func (q *queryFlags) query() (url.Values, error) {
	if *q.hw == "" {
		return nil, usageError{msg: "--hardware-id is required"}
	}
	if err := contract.ValidHardwareID(*q.hw); err != nil {
		return nil, usageError{msg: "--hardware-id: " + contract.AsError(err).Rule}
	}
	v := url.Values{}
	for _, name := range q.params {
		if s := *q.values[name]; s != "" {
			v.Set(name, s)
		}
	}
	return v, nil
}

// asUsage turns a parameter's error (readquery's message starts with the
// parameter's name) into wrong usage naming the flag.
func asUsage(err error) error {
	var pe *readquery.ParamError
	if !errors.As(err, &pe) {
		return err
	}
	msg := pe.Error()
	if name, rest, ok := strings.Cut(msg, ": "); ok && !strings.Contains(name, " ") {
		msg = "--" + strings.ReplaceAll(name, "_", "-") + ": " + rest
	}
	return usageError{msg: msg}
}

const timeFlagUsage = "an RFC 3339 time (2024-05-01T12:00:00Z) or epoch milliseconds"

func setupReadingsRange(fs *flag.FlagSet, _ func(string) string) func(context.Context, *cmdEnv, []string) error {
	qf := registerQueryFlags(fs, map[string]string{
		"limit":  fmt.Sprintf("sensor values per page, 1 to %d (default %d)", readquery.MaxReadingsLimit, readquery.DefaultReadingsLimit),
		"cursor": "start after the page that returned this next_cursor",
	})
	all := fs.Bool("all", false, "follow the cursors and print every page")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		v, q, reader, err := openQuery(ctx, env, qf, readquery.ParseReadingsQuery)
		if err != nil {
			return err
		}
		header := true
		for {
			page, _, err := reader.Readings(ctx, *qf.hw, q)
			if err != nil {
				return err
			}
			if *qf.jsonOut {
				if err := printJSON(env.stdout, page); err != nil {
					return err
				}
			} else if err := printReadingRows(env.stdout, page, header); err != nil {
				return err
			}
			header = false
			if !page.Truncated {
				return nil
			}
			if !*all {
				fmt.Fprintf(env.stderr, "more readings follow: --cursor %s (or --all)\n", page.NextCursor)
				return nil
			}
			v.Set("cursor", page.NextCursor)
			if q, err = readquery.ParseReadingsQuery(v, q.To); err != nil {
				return err
			}
		}
	}
}

// openQuery reads the query qf's flags give, v, with parse (a usage error
// when it does not parse), and opens a reader of the tables.
func openQuery[Q any](ctx context.Context, env *cmdEnv, qf *queryFlags, parse func(url.Values, time.Time) (Q, error)) (v url.Values, q Q, reader *cloudread.Reader, err error) {
	if v, err = qf.query(); err != nil {
		return nil, q, nil, err
	}
	if q, err = parse(v, time.Now()); err != nil {
		return nil, q, nil, asUsage(err)
	}
	client, tables, err := env.client(ctx)
	if err != nil {
		return nil, q, nil, err
	}
	return v, q, cloudread.New(client, tables), nil
}

// printIndentedJSON writes v as JSON indented by two spaces.
func printIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func printReadingRows(w io.Writer, page readquery.ReadingsPage, header bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "TIMESTAMP\tSENSOR\tVALUE\tUNIT\tQUALITY\tBATCH_ID")
	}
	for _, r := range page.Readings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%s\n", r.Timestamp.Format("2006-01-02T15:04:05.000Z"), r.Sensor,
			strconv.FormatFloat(r.Value, 'g', -1, 64), r.Unit, r.QualityScore, r.BatchID)
	}
	return tw.Flush()
}

func setupReadingsSummary(fs *flag.FlagSet, _ func(string) string) func(context.Context, *cmdEnv, []string) error {
	qf := registerQueryFlags(fs, map[string]string{
		"granularity":   "the buckets: hour, day or month (required)",
		"tz":            "the buckets' IANA time zone, e.g. Europe/Berlin (default UTC)",
		"include_empty": "true (default): averages divide by every bucket of the window and empty buckets are listed; false: by the active ones",
	})
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		_, q, reader, err := openQuery(ctx, env, qf, readquery.ParseSummaryQuery)
		if err != nil {
			return err
		}
		s, st, err := reader.Summary(ctx, *qf.hw, q)
		if err != nil {
			return err
		}
		if *qf.jsonOut {
			return printJSON(env.stdout, s)
		}
		printSummary(env.stdout, s)
		fmt.Fprintf(env.stderr, "%d readings read in %d Query requests (%.1f read capacity units)\n", st.Items, st.Requests, st.ReadCapacity)
		return nil
	}
}

func printSummary(w io.Writer, s readquery.Summary) {
	fmt.Fprintf(w, "%s from %s to %s, %s buckets in %s: %d buckets, %d with readings (averages per bucket divide by %d)\n",
		s.HardwareID, s.From.Format(time.RFC3339), s.To.Format(time.RFC3339), s.Granularity, s.TZ, s.BucketsTotal,
		s.BucketsActive, s.Denominator)
	names := make([]string, 0, len(s.Totals))
	for name := range s.Totals {
		names = append(names, name)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tSENSOR\tCOUNT\tMIN\tMEAN\tMAX")
	for _, b := range s.Buckets {
		for _, name := range names {
			if st := b.Sensors[name]; st != nil {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%g\t%.3f\t%g\n", b.Start.Format(time.RFC3339), name, st.Count, st.Min, st.Mean, st.Max)
			} else if b.Count == 0 && name == names[0] {
				fmt.Fprintf(tw, "%s\t-\t0\t\t\t\n", b.Start.Format(time.RFC3339))
			}
		}
	}
	for _, name := range names {
		st := s.Totals[name]
		fmt.Fprintf(tw, "total\t%s\t%d\t%g\t%.3f\t%g\n", name, st.Count, st.Min, st.Mean, st.Max)
	}
	_ = tw.Flush()
}

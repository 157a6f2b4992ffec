//go:build linux

// Command bench measures gatewayd against baselines measured in the same
// run (mosquitto, a trivial HTTP handler, a minimal DynamoDB SDK loop, an
// empty data directory) and prints each figure with its baseline, the ratio
// and, where there is one, whether it meets its target. It starts its own
// DynamoDB Local, mosquitto and gatewayd on 127.0.0.1 and writes the results
// as JSON. "make bench" runs it; it is not part of CI. See harness/bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"greenhouse-gateway/harness/bench"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 && args[0] == bench.DiscardCommand {
		return discardServer(ctx, args[1:])
	}
	cfg := bench.DefaultConfig()
	out := ".cache/bench/results.json"
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	scenarios := fs.String("scenarios", strings.Join(cfg.Scenarios, ","),
		"comma-separated scenarios to run: mqtt (closed-loop MQTT ingest; idle RSS and CPU per reading), "+
			"fixed (fixed offered load from each fleet size), sdcard (MQTT ingest with every fsync of the data directory 10 ms slower; root, FUSE), "+
			"http, drain (forwarding against the plain-write ceiling; RSS while draining), lambda (drain through the readings function), "+
			"uplink-bytes (bytes, requests and connections on the uplink per reading, live and draining, direct and through the function, against the plain same-items writer; about 2x --bytes-live plus 2 minutes), "+
			"footprint (time to ready, disk per reading), idle (memory breakdown of the largest fleet connected and idle)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured window of each load, after the warm-up")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "warm-up before each measured window")
	devices := fs.String("devices", joinInts(cfg.Devices), "comma-separated MQTT fleet sizes, one run each; "+
		"the largest also serves the fixed-rate scenario and the backlogs")
	fs.IntVar(&cfg.Inflight, "inflight", cfg.Inflight, "QoS 1 batches each MQTT device keeps in flight")
	fs.IntVar(&cfg.Readings, "readings", cfg.Readings, "readings per batch")
	fs.Float64Var(&cfg.FixedRate, "fixed-rate", cfg.FixedRate, "offered load of the fixed-rate scenario, batches/s")
	fs.IntVar(&cfg.HTTPClients, "http-clients", cfg.HTTPClients, "concurrent keep-alive HTTP clients")
	fs.IntVar(&cfg.DrainReadings, "drain-readings", cfg.DrainReadings, "readings in the drain's backlog")
	fs.IntVar(&cfg.DrainBaselineReadings, "drain-baseline-readings", cfg.DrainBaselineReadings,
		"readings of the backlog the SDK loop making transaction mode's requests writes (an explanatory line; its rate is compared; 0: all); the plain-write ceiling always writes the whole backlog")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "bound on one drain")
	fs.DurationVar(&cfg.LinkDelay, "link-delay", cfg.LinkDelay, "drain: delay a proxy adds to every DynamoDB request of the batch-mode drain over a slow link, "+
		"set against the plain writer through the same proxy (0: no slow-link drain)")
	fs.IntVar(&cfg.UplinkConcurrency, "uplink-concurrency", cfg.UplinkConcurrency, "the SDK loop's concurrency, and gatewayd's uplink.concurrency (where its adaptive limit starts; uplink.max_concurrency stays at its default)")
	ceilingGoroutines := fs.String("ceiling-goroutines", joinInts(cfg.CeilingGoroutines), "drain: comma-separated goroutine counts of "+
		"the plain BatchWriteItem writer of the same items (readings and each batch's marker, 25 items a request); the fastest count writes the ceiling just before and just after each drain")
	fs.IntVar(&cfg.DrainRepeats, "drain-repeats", cfg.DrainRepeats, "drain: batch-mode drains, each on its own backlog between its own plain-writer runs; the median by its ratio to its ceiling is reported")
	drainModes := fs.String("drain-modes", strings.Join(cfg.DrainModes, ","), "drain: comma-separated uplink write modes to drain in (transaction, batch)")
	fs.IntVar(&cfg.LambdaInstances, "lambda-instances", cfg.LambdaInstances, "lambda scenario: Runtime Interface Emulators running the readings function side by side (each one invocation at a time)")
	fs.DurationVar(&cfg.BytesLive, "bytes-live", cfg.BytesLive, "uplink-bytes: how long the live rate runs for each uplink target (dynamodb, lambda)")
	fs.IntVar(&cfg.BytesDevices, "bytes-devices", cfg.BytesDevices, "uplink-bytes: devices of the live rate, each sending a batch of --readings readings a minute, and of the backlog")
	fs.IntVar(&cfg.BytesBacklog, "bytes-backlog", cfg.BytesBacklog, "uplink-bytes: readings in the backlog each target drains")
	fs.IntVar(&cfg.ReadyReadings, "ready-readings", cfg.ReadyReadings, "readings pending for the time-to-ready figure")
	fs.IntVar(&cfg.ReadyRuns, "ready-runs", cfg.ReadyRuns, "starts measured for the time-to-ready figure (median reported)")
	fs.StringVar(&cfg.CacheDir, "cache-dir", cfg.CacheDir, "where the time-to-ready data directory is cached (relative to the module root)")
	fs.BoolVar(&cfg.Profile, "profile", false, "record gatewayd with perf during the largest MQTT run")
	fs.StringVar(&cfg.ProfileOut, "profile-out", ".cache/bench/gatewayd-mqtt-perf.txt", "report of --profile")
	fs.DurationVar(&cfg.IdleSettle, "idle-settle", cfg.IdleSettle, "idle scenario: when, after the fleet's first batches, the settled sample is taken")
	fs.StringVar(&cfg.IdleBaselineBin, "idle-baseline-bin", "", "idle scenario: a gatewayd `binary` (e.g. built from an earlier revision) measured the same way first")
	fs.StringVar(&cfg.CPUProfileDir, "cpu-profile-dir", "", "save gatewayd's Go CPU profile of each MQTT run's measured window (cpu-mqtt-N.pb.gz) and of each drain's first 10 s, named after its backlog (cpu-drain-MODE.pb.gz; cpu-drain-batch-N.pb.gz for the repeats; cpu-drain-slow-link.pb.gz; cpu-drain-lambda-0.pb.gz direct, -1 through the function) here, each with what gatewayd allocated in the same window beside it (alloc-*.pb.gz)")
	fs.BoolVar(&cfg.KeepWork, "keep-work", false, "keep the work directory (logs, data directories)")
	fs.Func("gateway-env", "extra `GATEWAY_NAME=VALUE` setting (or GODEBUG, GOGC, GOMEMLIMIT, GOMAXPROCS) for every gatewayd, for experiments (repeatable)", func(v string) error {
		cfg.GatewayEnv = append(cfg.GatewayEnv, v)
		return nil
	})
	fs.StringVar(&out, "out", out, "results file (JSON)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg.Scenarios = strings.Split(*scenarios, ",")
	cfg.DrainModes = nil
	for _, m := range strings.Split(*drainModes, ",") {
		cfg.DrainModes = append(cfg.DrainModes, strings.TrimSpace(m))
	}
	var err error
	if cfg.CeilingGoroutines, err = parseInts(*ceilingGoroutines); err != nil {
		fmt.Fprintln(os.Stderr, "bench: --ceiling-goroutines:", err)
		return 2
	}
	if cfg.Devices, err = parseInts(*devices); err != nil {
		fmt.Fprintln(os.Stderr, "bench: --devices:", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	res, err := bench.Run(ctx, cfg, logger)
	if res != nil && len(res.Figures) > 0 {
		res.PrintTable(os.Stdout)
		if werr := res.WriteJSON(out); werr != nil {
			logger.Error("writing results", "file", out, "err", werr)
			return 1
		}
		fmt.Println("\nresults written to", out)
	}
	if err != nil {
		logger.Error("bench failed", "err", err)
		return 1
	}
	return 0
}

func discardServer(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet(bench.DiscardCommand, flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := bench.ServeDiscard(ctx, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "discard server:", err)
		return 1
	}
	return 0
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

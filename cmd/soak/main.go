// Command soak runs the gateway's fault scenarios and its steady hour (harness/soak) against
// real gatewayd processes and DynamoDB Local, prints their figures, and
// exits 1 if any acknowledged batch was lost or duplicated or anything else
// went wrong.
//
//	go run ./cmd/soak --duration 10m --kill-cycles 100 --powercut-cycles 50 --devices 10 --steady-duration 1h
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"greenhouse-gateway/harness/soak"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	var (
		cfg       soak.Config
		scenarios string
		verbose   bool
	)
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "load time of the fault scenarios, split evenly across them (setup, drain and checks come on top)")
	fs.DurationVar(&cfg.SteadyDuration, "steady-duration", time.Hour, "load time of the steady scenario (no faults; gatewayd's RSS and Go heap peaks, goroutines and open files must stay flat after the first quarter)")
	fs.IntVar(&cfg.SteadyDevices, "steady-devices", 100, "simulated devices of the steady scenario, half MQTT, half HTTP")
	fs.DurationVar(&cfg.SteadyInterval, "steady-interval", 5*time.Second, "time between two batches of a device in the steady scenario")
	fs.IntVar(&cfg.KillCycles, "kill-cycles", 100, "kill -9 cycles of gatewayd in the kill9 scenario")
	torn := fs.Bool("powercut-torn", true, "make every other power cut torn (a random half of the pages written since the last fsync survive); false: every cut drops all of them")
	fs.IntVar(&cfg.PowerCutCycles, "powercut-cycles", 50, "power cuts in the powercut scenario (gatewayd's data directory on a FUSE file system that drops what was not fsynced; needs /dev/fuse and root)")
	fs.IntVar(&cfg.Devices, "devices", 10, "simulated devices per scenario, half MQTT, half HTTP")
	fs.DurationVar(&cfg.Interval, "interval", 500*time.Millisecond, "time between two batches of a device")
	fs.StringVar(&scenarios, "scenarios", strings.Join(soak.Scenarios(), ","), "comma-separated scenarios to run")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of fault timing, fault choice and sensor values; 0 picks one (printed)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the work directory (logs, data directories, device reports)")
	fs.StringVar(&cfg.WorkDir, "work-dir", "", "where to create the work directory (default the system temp directory)")
	fs.StringVar(&cfg.BinDir, "bin-dir", "", "directory with prebuilt gatewayd and devicesim, e.g. bin (default: build ./cmd/gatewayd and ./cmd/devicesim)")
	fs.BoolVar(&cfg.Race, "race", false, "build gatewayd with the race detector (without --bin-dir)")
	fs.StringVar(&cfg.WriteMode, "write-mode", "alternate", "gatewayd's uplink.write_mode: transaction, batch, or alternate (switch at every start)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 10*time.Minute, "bound on the drain after the faults end (without progress; 3x in all)")
	fs.BoolVar(&verbose, "v", false, "log progress at debug level")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "soak: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg.PowerCutUntorn = !*torn
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Scenarios = append(cfg.Scenarios, s)
		}
	}
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := soak.Run(ctx, cfg)
	if len(rep.Scenarios) > 0 {
		fmt.Println()
		rep.WriteTable(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}
	if !rep.OK() {
		fmt.Println("\nsoak: FAILED (see the problems above)")
		return 1
	}
	fmt.Println("\nsoak: every acknowledged batch is in DynamoDB exactly once")
	return 0
}

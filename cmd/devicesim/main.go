// Command devicesim runs simulated greenhouse ESP32 devices against the gateway, over MQTT or
// HTTP, behaving like the real firmware: registration at boot, batches of readings, an offline
// buffer, re-sends until the gateway confirms. It is used by "make run" and by integration tests.
//
// Usage:
//
//	devicesim [--mqtt-url tcp://127.0.0.1:1883 | --http-url http://127.0.0.1:8080] --api-key KEY [flags]
//
// The API key may also come from $DEVICESIM_API_KEY. Each device stops producing after --batches
// batches or after --duration, then keeps re-sending its unconfirmed batches for up to
// --drain-timeout; SIGINT and SIGTERM stop every device at once. A one-line summary per device
// is logged every --summary-every, and a final summary on exit (with the number of reboots).
//
// Flags:
//
//	--mqtt-url URL          MQTT broker (default tcp://127.0.0.1:1883 unless --http-url is set)
//	--http-url URL          gateway HTTP base URL, to send over HTTP instead of MQTT
//	--api-key KEY           fleet API key: MQTT password or HTTP bearer token of devices without a
//	                        device key (default $DEVICESIM_API_KEY)
//	--key-store FILE        JSON file keeping the device keys the devices enroll with (default: memory)
//	--devices N             number of simulated devices (3)
//	--first-mac MAC         hardware_id of the first device (02:00:00:00:00:01)
//	--firmware-version V    firmware_version sent by the devices (1.0.16)
//	--interval D            time between two batches of a device (5s)
//	--readings N            readings per batch, 1..100 (5)
//	--batches N             batches per device, then drain and stop (0 = no limit)
//	--duration D            time devices produce batches, then drain and stop (0 = no limit)
//	--drain-timeout D       time to keep retrying unconfirmed batches after producing (30s)
//	--qos 0|1               MQTT QoS of registrations and readings (1); acks always come on the ack topic
//	--max-inflight N        batches sent before waiting for their answers (1)
//	--buffer-size N         offline buffer per device, in batches (1000)
//	--ack-timeout D         time to wait for an answer before retrying (10s)
//	--clock-sync-after D    no NTP time for this long after each boot: timestamps from 1970 (0 = synced)
//	--reboot-every D        reboot each device after D ± 20% of uptime, per device and boot from the seed (0 = never)
//	--reboots N             at most N reboots per device (0 = no limit; needs --reboot-every)
//	--seed N                seed for sensor values, jitter and reboot times (0 = random, logged)
//	--report FILE           one JSON line per batch with a final answer
//	--summary-every D       time between per-device summary lines (30s; 0 = final summary only)
//	--log-level L           debug, info, warn or error (info)
//
// A reboot behaves like an ESP32 reset: the MQTT connection is cut without a DISCONNECT (over
// plain TCP), the device draws a new boot_id, restarts seq and its uptime at 0, loses the
// answers it was waiting for, and registers again (MQTT devices/{hw}/register, or
// POST /v1/register); with --clock-sync-after it has no NTP time again until the delay passes.
// Its offline buffer is in flash and survives: batches of earlier boots keep their boot_id,
// batch_id and seq and are sent first. Batches and duration count over all boots.
//
// Devices enroll as firmware does: when a register answer (MQTT ack or HTTP body) carries
// "device_key" and "device_key_id", the device stores the key and from then on uses it instead
// of the fleet key, as MQTT password (it reconnects with it) or HTTP bearer token. With
// --key-store FILE the keys are kept in FILE ({"<hardware_id>":"<device key>",...}, written
// atomically with mode 0600 before a key is used) and read at start, so that a restarted
// simulator keeps using them; without it they are kept in memory and a restart loses them (the
// gateway then refuses the fleet key for devices bound to their device key until an operator
// runs gatewayctl devices reset-key). A refusal of the key (device_key_required, forbidden,
// CONNACK not authorized) is logged as an error saying what to do; the device keeps its
// batches and waits the backoff's cap (30s) before it tries again.
//
// With --report FILE, every batch that received a final answer (accepted, duplicate, or a
// rejection other than buffer_full and unknown_device) is written to FILE as one JSON line:
//
//	{"batch_id":"02:00:00:00:00:01_…_1704067200000_1704067204000","hardware_id":"02:00:00:00:00:01",
//	 "boot_id":"…","seq":0,"status":"accepted","readings":5,
//	 "first_timestamp_ms":1704067200000,"last_timestamp_ms":1704067204000,"attempts":1}
//
// with "reason" and "message" added for a rejection.
//
// Exit status: 0 when it ran (whatever the gateway answered), 1 when the simulation could not be
// set up (for example, the report file cannot be created), 2 for bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"greenhouse-gateway/harness/devicesim"
)

const (
	// defaultMQTTURL is used when neither --mqtt-url nor --http-url is given.
	defaultMQTTURL = "tcp://127.0.0.1:1883"
	// envAPIKey is read when --api-key is not given.
	envAPIKey = "DEVICESIM_API_KEY"
)

// errReported marks a usage error the flag package already printed.
var errReported = errors.New("devicesim: bad flags")

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

// run parses args and runs the simulator, returning the exit status.
func run(args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, level, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintln(stderr, err)
		}
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	sim, err := devicesim.New(cfg, logger)
	if err != nil {
		logger.Error("setting up", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := sim.Run(ctx); err != nil {
		logger.Error("running", "err", err)
		return 1
	}
	return 0
}

// parseFlags builds and validates the configuration from the command line. Errors are usage
// errors (exit status 2); flag.ErrHelp means -h was asked for.
func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (devicesim.Config, slog.Level, error) {
	cfg := devicesim.DefaultConfig()
	fs := flag.NewFlagSet("devicesim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: devicesim [--mqtt-url URL | --http-url URL] --api-key KEY [flags]\n\n"+
			"Simulated greenhouse ESP32 devices for the gateway. Each device registers at every boot,\n"+
			"sends batches of readings and keeps them in its offline buffer until the gateway confirms\n"+
			"them. With --reboot-every, devices reboot: new boot_id, seq and uptime from 0, the\n"+
			"connection cut without a DISCONNECT, the buffer kept and its old batches sent first.\n"+
			"A device issued a device key when it registers stores it (--key-store) and uses it from then on.\n\nFlags:\n")
		fs.PrintDefaults()
	}

	fs.StringVar(&cfg.MQTTURL, "mqtt-url", "", "MQTT broker URL (default "+defaultMQTTURL+" unless --http-url is set)")
	fs.StringVar(&cfg.HTTPURL, "http-url", "", "gateway HTTP base URL, e.g. http://127.0.0.1:8080, to send over HTTP instead of MQTT")
	fs.StringVar(&cfg.APIKey, "api-key", "", "fleet API key: MQTT password or HTTP bearer token of devices without a device key (default $"+envAPIKey+")")
	fs.StringVar(&cfg.KeyStorePath, "key-store", "", "JSON file keeping the device keys devices enroll with, read at start (default: in memory, lost at exit)")
	fs.IntVar(&cfg.Devices, "devices", cfg.Devices, "number of simulated devices")
	fs.StringVar(&cfg.FirstMAC, "first-mac", cfg.FirstMAC, "hardware_id of the first device; the others get the following MACs")
	fs.StringVar(&cfg.FirmwareVersion, "firmware-version", cfg.FirmwareVersion, "firmware_version sent by the devices")
	fs.DurationVar(&cfg.Interval, "interval", cfg.Interval, "time between two batches of a device (and the window a batch covers)")
	fs.IntVar(&cfg.Readings, "readings", cfg.Readings, "readings per batch (1..100)")
	fs.IntVar(&cfg.Batches, "batches", cfg.Batches, "batches per device, then drain and stop (0 = no limit)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "time devices produce batches, then drain and stop (0 = no limit)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "time to keep retrying unconfirmed batches after producing stopped (0 = none)")
	fs.IntVar(&cfg.QoS, "qos", cfg.QoS, "MQTT QoS of registrations and readings (0 or 1)")
	fs.IntVar(&cfg.MaxInflight, "max-inflight", cfg.MaxInflight, "batches a device sends before waiting for their answers")
	fs.IntVar(&cfg.BufferSize, "buffer-size", cfg.BufferSize, "offline buffer capacity per device, in batches (oldest dropped when full)")
	fs.DurationVar(&cfg.AckTimeout, "ack-timeout", cfg.AckTimeout, "time to wait for the answer to a batch before retrying it")
	fs.DurationVar(&cfg.ClockSyncAfter, "clock-sync-after", cfg.ClockSyncAfter, "simulate no NTP time for this long after each boot: timestamps count from 1970, with uptime_ms (0 = synced)")
	fs.DurationVar(&cfg.RebootEvery, "reboot-every", cfg.RebootEvery, "reboot each device after this much uptime, ±20% per device and boot from the seed (0 = never)")
	fs.IntVar(&cfg.Reboots, "reboots", cfg.Reboots, "at most this many reboots per device (0 = no limit; needs --reboot-every)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed for sensor values, jitter and reboot times (0 = random, logged)")
	fs.StringVar(&cfg.ReportPath, "report", "", "file to write one JSON line per batch with a final answer")
	fs.DurationVar(&cfg.SummaryInterval, "summary-every", cfg.SummaryInterval, "time between per-device summary lines (0 = only the final summary)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, 0, err
		}
		return cfg, 0, fmt.Errorf("%w: %w", errReported, err)
	}
	if fs.NArg() > 0 {
		return cfg, 0, fmt.Errorf("devicesim: unexpected arguments: %v", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return cfg, 0, fmt.Errorf("devicesim: --log-level: %w", err)
	}
	if cfg.MQTTURL == "" && cfg.HTTPURL == "" {
		cfg.MQTTURL = defaultMQTTURL
	}
	if cfg.APIKey == "" {
		cfg.APIKey = getenv(envAPIKey)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, 0, err
	}
	return cfg, level, nil
}

// Command gatewayd is the greenhouse gateway daemon: it takes reading
// batches from devices over MQTT and HTTP, stores each durably before
// acknowledging it, and forwards them to the cloud DynamoDB tables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/ingest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/config"
	"greenhouse-gateway/internal/pushmetrics"
	"greenhouse-gateway/internal/sdnotify"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
	"greenhouse-gateway/uplink"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Environ()))
}

func run(args, environ []string) int {
	cfg, fl, unknownEnv, err := loadConfig(args, environ)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gatewayd:", err)
		return 2
	}
	if fl.version {
		fmt.Println("gatewayd", version)
		return 0
	}
	if fl.printConfig {
		out, err := config.Encode(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gatewayd: printing the configuration:", err)
			return 1
		}
		os.Stdout.Write(out)
		return 0
	}
	logger := newLogger(cfg)
	for _, name := range unknownEnv {
		logger.Warn("ignoring environment variable that names no setting", "name", name)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, environ, logger); err != nil {
		logger.Error("gatewayd stopped", "err", err)
		return 1
	}
	return 0
}

func newLogger(cfg Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func lookupEnv(environ []string, name string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if len(environ[i]) > len(name) && environ[i][:len(name)+1] == name+"=" {
			return environ[i][len(name)+1:]
		}
	}
	return ""
}

// serve runs the gateway until ctx is done.
//
// Shutdown order, once ctx is done (systemd is told STOPPING=1 first):
//  1. the ingest path stops taking batches: MQTT publishes are left
//     unacknowledged (the device resends) and HTTP answers 503;
//  2. the MQTT broker closes its listener and client connections (in
//     external mode the consumer finishes the messages in progress and
//     disconnects; the broker keeps the rest for the gateway's session),
//     and the HTTP server stops accepting and lets requests in progress
//     finish;
//  3. the uplink stops; a request it had in flight is forgotten, and the
//     batch is sent again after a restart (the cloud marker makes that
//     harmless);
//  4. the audit trail writes the records still queued and closes its
//     segment (records of refusals made after that are not kept), and the
//     pprof listener, when debug.pprof_addr set one, closes;
//  5. the buffer closes last: commits already queued are written and
//     answered, then Badger is closed.
func serve(ctx context.Context, cfg Config, environ []string, logger *slog.Logger) error {
	startedAt := time.Now()
	limit, limitFrom := applyMemoryLimit(cfg.MemoryLimit, environ)
	logger.Info("gatewayd starting", "version", version, "data_dir", cfg.DataDir,
		"memory_limit_bytes", limit, "memory_limit_from", limitFrom)
	pepper, err := cloud.LoadPepper(lookupEnv(environ, envPepper), cfg.APIKeyPepperFile)
	if err != nil {
		return err
	}
	peppers := ingest.Peppers{Current: pepper}
	if lookupEnv(environ, envPepperPrevious) != "" || cfg.APIKeyPepperPreviousFile != "" {
		if peppers.Previous, err = cloud.LoadPepper(lookupEnv(environ, envPepperPrevious), cfg.APIKeyPepperPreviousFile); err != nil {
			return err
		}
	}
	adminToken, err := secret(lookupEnv(environ, envAdminToken), cfg.AdminTokenFile)
	if err != nil {
		return err
	}
	if adminToken == "" {
		logger.Info("operator API disabled: no admin token (GATEWAY_ADMIN_TOKEN or admin_token_file)")
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gateway", Name: "build_info",
		Help: "Always 1; labelled with the version.", ConstLabels: prometheus.Labels{"version": version}})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo)
	pusher, err := pushmetrics.New(cfg.Push, reg, logger)
	if err != nil {
		return err
	}

	if err := makeDataDir(cfg.DataDir); err != nil {
		return fmt.Errorf("creating data directory: %w", err)
	}
	buf, err := buffer.Open(cfg.DataDir, cfg.Buffer, logger, reg)
	if err != nil {
		return err
	}
	// 4. The buffer closes last, after every other component returned.
	defer func() {
		if err := buf.Close(); err != nil {
			logger.Error("closing the buffer", "err", err)
		}
	}()

	clk := clock.New(time.Time{}, reg)
	tables := cloud.TableNames(cfg.TablePrefix)
	keysClient, err := cloud.NewClient(ctx, cfg.cloud(), clk.DynamoDBOption())
	if err != nil {
		return fmt.Errorf("configuring DynamoDB: %w", err)
	}
	// The uplink owns retries (forever, with backoff): no SDK retries.
	uplinkClient, err := cloud.NewClient(ctx, cfg.cloud(), cloud.WithRetryMaxAttempts(1), clk.DynamoDBOption())
	if err != nil {
		return fmt.Errorf("configuring DynamoDB: %w", err)
	}

	keyStore := cloud.NewKeys(keysClient, tables.APIKeys, pepper)
	auth, err := ingest.NewAuthenticator(cfg.Auth, peppers, keyStore, buf, logger, reg)
	if err != nil {
		return err
	}
	deviceKeys, err := ingest.NewDeviceKeys(cfg.Auth.DeviceKeys, peppers, buf, logger, reg)
	if err != nil {
		return err
	}
	auth.UseDeviceKeys(deviceKeys)
	devices, err := registry.New(cfg.Devices, buf, clk, logger, reg)
	if err != nil {
		return err
	}
	in, err := ingest.New(cfg.Ingest, buf, devices, clk, logger, reg)
	if err != nil {
		return err
	}
	// The audit trail stops writing before it could take the buffer's
	// free-space watermark.
	auditLog, err := audit.Open(filepath.Join(cfg.DataDir, "audit"), cfg.Audit.KeepFree(buf.Space().MinFreeBytes), clk.Now, logger, reg)
	if err != nil {
		return err
	}
	defer auditLog.Close() // idempotent: its Run closes it on the way out
	in.SetAudit(auditLog)
	in.SetDeviceKeys(deviceKeys)
	// The MQTT side: the embedded broker, or a consumer of an external one.
	var mqttRun func(context.Context) error
	mqttWhere := ""
	if cfg.MQTT.Mode == "external" {
		ext, err := ingest.NewExternal(cfg.MQTT.External, in, logger, reg)
		if err != nil {
			return err
		}
		mqttRun, mqttWhere = ext.Run, "external "+cfg.MQTT.External.URL
	} else {
		cfg.MQTT.SessionMemory = sessionMemory(cfg.MQTT.SessionMemory, limit)
		broker, err := ingest.NewBroker(cfg.MQTT, in, auth, logger, reg)
		if err != nil {
			return err
		}
		if err := broker.Listen(); err != nil {
			return err
		}
		mqttRun, mqttWhere = broker.Run, broker.Addr()
	}
	probe := func(ctx context.Context) (int, error) {
		return cloud.ProbeTransactionLimit(ctx, uplinkClient, tables.ProcessedBatches)
	}
	up, err := uplink.New(cfg.Uplink, buf, devices, clk, uplinkClient, probe, tables, logger, reg)
	if err != nil {
		return err
	}
	up.SetKeys(deviceKeys, keyStore)
	ready := func() error {
		if ctx.Err() != nil {
			return errors.New("shutting down")
		}
		return buf.Err()
	}
	ops := operator.New(operator.Deps{
		Devices: devices, DeviceKeys: deviceKeys, History: buf, AdminToken: adminToken, DeadLetters: buf,
		Uplink: up.Report, Ready: ready, Audit: auditLog, RetryAfter: cfg.HTTP.RetryAfter,
		Status: operator.StatusSources{Version: version, Now: clk.Now, Uplink: up.Report,
			Uptime: func() time.Duration { return time.Since(startedAt) },
			Buffer: buf.Space, Clock: func() operator.ClockStatus {
				return operator.ClockStatus{OffsetSeconds: clk.Offset().Seconds(), Learned: clk.Learned(), Plausible: clk.Plausible()}
			}},
	}, logger)
	api, err := ingest.NewHTTPServer(cfg.HTTP, ingest.HTTPDeps{
		Ingest: in, Auth: auth, Routes: ops.Routes,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), Ready: ready, Registerer: reg,
	}, logger)
	if err != nil {
		return err
	}
	if err := api.Listen(); err != nil {
		return err
	}
	pprofSrv, err := listenPprof(cfg.Debug.PprofAddr, logger)
	if err != nil {
		return err
	}
	logger.Info("gatewayd ready", "mqtt", mqttWhere, "http", api.Addr(),
		"dynamodb", endpointName(cfg.DynamoDBEndpoint), "tables_prefix", cfg.TablePrefix)

	// systemd (Type=notify): ready now that the listeners are bound and the
	// buffer is open. Outside systemd these calls do nothing.
	if err := sdnotify.Ready(); err != nil {
		logger.Warn("notifying systemd", "err", err)
	}
	_ = sdnotify.Status(fmt.Sprintf("serving: mqtt %s, http %s", mqttWhere, api.Addr()))
	// The watchdog is fed while the buffer's committer answers: a stuck disk
	// gets the gateway restarted. A full buffer or a down uplink does not.
	healthy := func() error {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := buf.Ping(hctx); err != nil {
			logger.Error("health check failed; withholding the systemd watchdog ping", "err", err)
			return err
		}
		return nil
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		<-gctx.Done()
		return in.Close() // 1.
	})
	g.Go(func() error { return mqttRun(gctx) }) // 2.
	g.Go(func() error { return api.Run(gctx) }) // 2.
	g.Go(func() error { return up.Run(gctx) })  // 3.
	g.Go(func() error { return auth.Run(gctx) })
	g.Go(func() error { return buf.Run(gctx) })
	g.Go(func() error { // a failed data directory stops gatewayd; systemd starts it again
		select {
		case <-buf.Failed():
			return fmt.Errorf("%w; stopping so that systemd (Restart=on-failure) starts gatewayd again once the disk "+
				"works, on what is on disk: nothing acknowledged is lost", buf.Err())
		case <-gctx.Done():
			return nil
		}
	})
	g.Go(func() error { return devices.Run(gctx) }) // saves device records once more on the way out
	g.Go(func() error { return pusher.Run(gctx) })  // 3. with push.url set, pushes once more (at most 5 s)
	// WatchdogSec=: WATCHDOG=1 every half interval while healthy() is nil.
	g.Go(func() error { return sdnotify.RunWatchdog(gctx, healthy) })
	g.Go(func() error { return pprofSrv.Run(gctx) }) // 4. with debug.pprof_addr set
	g.Go(func() error { return auditLog.Run(gctx) }) // 4. writes what is still queued, then closes its segment
	g.Go(func() error { return newMemoryReleaser(cfg.MemoryReleaseInterval, logger, reg).Run(gctx) })

	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		return err
	case <-gctx.Done():
	}
	_ = sdnotify.Stopping()
	logger.Info("gatewayd stopping", "deadline", cfg.ShutdownTimeout.String())
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		logger.Info("gatewayd stopped")
		return nil
	case <-time.After(cfg.ShutdownTimeout):
		return fmt.Errorf("shutdown did not finish within %s", cfg.ShutdownTimeout)
	}
}

// secret returns the content of file (trailing newline trimmed) when file
// is set, else value.
func secret(value, file string) (string, error) {
	if file == "" {
		return value, nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading secret: %w", err)
	}
	return strings.TrimRight(string(raw), "\r\n"), nil
}

func endpointName(e string) string {
	if e == "" {
		return "AWS"
	}
	return e
}

// makeDataDir creates dir when it is missing, and syncs its parent so that
// a power cut does not take the new directory, with what gatewayd writes
// and syncs in it, away.
func makeDataDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	parent, err := os.Open(filepath.Dir(filepath.Clean(dir)))
	if err != nil {
		return err
	}
	return errors.Join(parent.Sync(), parent.Close())
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/ingest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/pushmetrics"
	"greenhouse-gateway/internal/sdnotify"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
	"greenhouse-gateway/uplink"
)

// serve runs the gateway until ctx is done or one of its parts fails.
//
// Shutdown order (systemd is told STOPPING=1 first); each step starts once
// the one before it returned, and the whole is bounded by
// shutdown_timeout:
//  1. the ingest path stops taking batches and waits for the commits in
//     flight, which are stored and answered; later MQTT publishes are left
//     unacknowledged (the device resends) and HTTP requests answered 503;
//  2. the device side closes: the MQTT broker closes its listener and
//     client connections (in external mode the consumer finishes the
//     messages in progress and disconnects; the broker keeps the rest for
//     the gateway's session), the HTTP server stops accepting and lets
//     requests in progress finish, and the API key uses still being
//     recorded in api_keys are written;
//  3. the uplink stops; a request it had in flight is forgotten, and the
//     batch is sent again after a restart (the cloud marker makes that
//     harmless);
//  4. the background parts stop: the device registry saves its records
//     once more, metrics are pushed once more (push.url), the audit trail
//     writes the records still queued and closes its segment (refusals
//     after that are not kept), and the buffer's maintenance (collection
//     of expired records, value-log GC), the pprof listener, the systemd
//     watchdog and the memory releaser stop;
//  5. the buffer closes last, when serve returns: commits already queued
//     are written and answered, then Badger is closed.
func serve(ctx context.Context, cfg Config, environ []string, logger *slog.Logger) error {
	startedAt := time.Now()
	limit, limitFrom := applyMemoryLimit(cfg.MemoryLimit, environ)
	logger.Info("gatewayd starting", "version", version, "data_dir", cfg.DataDir,
		"memory_limit_bytes", limit, "memory_limit_from", limitFrom)
	sec, err := loadSecrets(cfg, environ, logger)
	if err != nil {
		return err
	}
	reg := newMetricsRegistry()
	buf, err := openBuffer(cfg, logger, reg)
	if err != nil {
		return err
	}
	defer closeBuffer(buf, logger) // 5.
	clk := clock.New(time.Time{}, reg)
	db, err := newCloud(ctx, cfg, clk, sec.peppers.Current, reg)
	if err != nil {
		return err
	}
	dev, err := newDeviceSide(cfg, sec.peppers, db, buf, clk, logger, reg)
	if err != nil {
		return err
	}
	defer dev.close() // what was opened but never run, on a failed start
	if err := dev.startMQTT(cfg, limit); err != nil {
		return err
	}
	up, err := newUplink(cfg, buf, dev, clk, db, logger, reg)
	if err != nil {
		return err
	}
	st := newStages(ctx)
	api, err := newHTTP(cfg, dev, buf, up, st, sec.adminToken, clk, startedAt, logger, reg)
	if err != nil {
		return err
	}
	defer api.Close() // releases the listener when the start fails after it
	p, err := newBackground(cfg, buf, reg, logger)
	if err != nil {
		return err
	}
	logger.Info("gatewayd ready", "mqtt", dev.mqttWhere, "http", api.Addr(),
		"dynamodb", endpointName(cfg.DynamoDBEndpoint), "tables_prefix", cfg.TablePrefix)
	notifyReady(dev.mqttWhere, api.Addr(), logger)
	runStages(st, dev, api, up, p)
	return stop(st, cfg.ShutdownTimeout, logger)
}

// runStages starts every part, in the stages that stop them in the order
// serve's comment gives.
func runStages(st *stages, dev *deviceSide, api *ingest.HTTPServer, up *uplink.Uplink, p background) {
	st.then(dev.ingest.Close) // 1.
	devices := st.stage()     // 2.
	devices.run(dev.mqttRun)
	devices.run(api.Run)
	devices.run(dev.auth.Run)
	st.stage().run(up.Run) // 3.
	rest := st.stage()     // 4.
	for _, part := range p.parts() {
		rest.run(part)
	}
	rest.run(dev.devices.Run)
	rest.run(dev.audit.Run)
}

// stop waits for the shutdown to be asked for, then runs it within
// timeout.
func stop(st *stages, timeout time.Duration, logger *slog.Logger) error {
	st.wait()
	_ = sdnotify.Stopping()
	logger.Info("gatewayd stopping", "deadline", timeout.String())
	done := make(chan error, 1)
	go func() { done <- st.stop() }()
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		logger.Info("gatewayd stopped")
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("shutdown did not finish within %s", timeout)
	}
}

// secrets are the API key peppers and the admin token.
type secrets struct {
	peppers    ingest.Peppers
	adminToken string
}

// loadSecrets reads the secrets from the environment or their files.
func loadSecrets(cfg Config, environ []string, logger *slog.Logger) (secrets, error) {
	var s secrets
	var err error
	if s.peppers.Current, err = cloud.LoadPepper(lookupEnv(environ, envPepper), cfg.APIKeyPepperFile); err != nil {
		return s, err
	}
	if lookupEnv(environ, envPepperPrevious) != "" || cfg.APIKeyPepperPreviousFile != "" {
		if s.peppers.Previous, err = cloud.LoadPepper(lookupEnv(environ, envPepperPrevious), cfg.APIKeyPepperPreviousFile); err != nil {
			return s, err
		}
	}
	if s.adminToken, err = secret(lookupEnv(environ, envAdminToken), cfg.AdminTokenFile); err != nil {
		return s, err
	}
	if s.adminToken == "" {
		logger.Info("operator API disabled: no admin token (GATEWAY_ADMIN_TOKEN or admin_token_file)")
	}
	return s, nil
}

// newMetricsRegistry returns the one registry every part's metrics go to,
// with the Go and process collectors and gateway_build_info.
func newMetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gateway", Name: "build_info",
		Help: "Always 1; labelled with the version.", ConstLabels: prometheus.Labels{"version": version}})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo)
	return reg
}

// openBuffer creates the data directory when it is missing and opens the
// buffer in it.
func openBuffer(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*buffer.Buffer, error) {
	if err := makeDataDir(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("creating data directory: %w", err)
	}
	return buffer.Open(cfg.DataDir, cfg.Buffer, logger, reg)
}

func closeBuffer(buf *buffer.Buffer, logger *slog.Logger) {
	if err := buf.Close(); err != nil {
		logger.Error("closing the buffer", "err", err)
	}
}

// cloudSide is the gateway's access to its DynamoDB tables.
type cloudSide struct {
	tables cloud.Tables
	// keys reads api_keys for the authenticator and writes device keys.
	keys *cloud.Keys
	// uplink is the uplink's client: the uplink owns retries (forever,
	// with backoff), so it makes no SDK retries.
	uplink *dynamodb.Client
	// lambda is the lambda target's client (uplink.target: lambda; else
	// nil), and gatewayID the gateway's id in its events (the host name).
	lambda    *lambda.Client
	gatewayID string
}

func newCloud(ctx context.Context, cfg Config, clk *clock.Clock, pepper string, reg prometheus.Registerer) (cloudSide, error) {
	tables := cloud.TableNames(cfg.TablePrefix)
	keysBytes, uplinkBytes, lambdaBytes := registerCloudBytes(reg)
	keysClient, err := cloud.NewClient(ctx, cfg.cloud(), clk.DynamoDBOption(), cloud.WithByteCounts(keysBytes))
	if err != nil {
		return cloudSide{}, fmt.Errorf("configuring DynamoDB: %w", err)
	}
	uplinkClient, err := cloud.NewClient(ctx, cfg.cloud(), cloud.WithRetryMaxAttempts(1), clk.DynamoDBOption(),
		cloud.WithConnections(cfg.Uplink.MaxInFlight()), cloud.WithByteCounts(uplinkBytes))
	if err != nil {
		return cloudSide{}, fmt.Errorf("configuring DynamoDB: %w", err)
	}
	side := cloudSide{tables: tables, keys: cloud.NewKeys(keysClient, tables.APIKeys, pepper), uplink: uplinkClient}
	if cfg.Uplink.Target == uplink.TargetLambda {
		lc := cloud.Config{Endpoint: cfg.Uplink.Lambda.Endpoint, Region: cfg.AWSRegion}
		if side.lambda, err = cloud.NewLambdaClient(ctx, lc, cloud.WithLambdaByteCounts(lambdaBytes)); err != nil {
			return cloudSide{}, fmt.Errorf("configuring Lambda: %w", err)
		}
		if side.gatewayID, err = os.Hostname(); err != nil {
			return cloudSide{}, fmt.Errorf("reading the host name (the gateway's id): %w", err)
		}
	}
	return side, nil
}

// registerCloudBytes exports what the gateway's cloud clients send and
// receive, at the socket, as gateway_uplink_bytes_total: what a metered
// link is billed for. client is "dynamodb" (the uplink's writes), "lambda"
// (its invocations, with uplink.target lambda) or "keys" (API key
// lookups and device key writes).
func registerCloudBytes(reg prometheus.Registerer) (keys, dynamo, invoke *cloud.ByteCounts) {
	keys, dynamo, invoke = new(cloud.ByteCounts), new(cloud.ByteCounts), new(cloud.ByteCounts)
	for client, c := range map[string]*cloud.ByteCounts{"keys": keys, "dynamodb": dynamo, "lambda": invoke} {
		for direction, n := range map[string]*atomic.Int64{"sent": &c.Sent, "received": &c.Received} {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: "gateway", Subsystem: "uplink", Name: "bytes_total",
				Help: "Bytes the gateway's cloud clients sent and received, counted at the socket (TLS, HTTP " +
					"headers, retries and connection set-ups included), by client: dynamodb (the uplink's " +
					"writes), lambda (its invocations of the readings function), keys (API key lookups).",
				ConstLabels: prometheus.Labels{"client": client, "direction": direction},
			}, func() float64 { return float64(n.Load()) }))
		}
	}
	return keys, dynamo, invoke
}

// deviceSide is what devices talk to: the authenticator and device keys,
// the device registry, the ingest path with its audit trail, and the MQTT
// side (the embedded broker or a consumer of an external one).
type deviceSide struct {
	auth       *ingest.Authenticator
	deviceKeys *ingest.DeviceKeys
	devices    *registry.Registry
	ingest     *ingest.Ingest
	audit      *audit.Log
	logger     *slog.Logger
	reg        prometheus.Registerer

	mqttRun   func(context.Context) error
	mqttClose func() error
	mqttWhere string
}

func newDeviceSide(cfg Config, peppers ingest.Peppers, db cloudSide, buf *buffer.Buffer, clk *clock.Clock,
	logger *slog.Logger, reg prometheus.Registerer) (*deviceSide, error) {
	d := &deviceSide{logger: logger, reg: reg, mqttClose: func() error { return nil }}
	var err error
	if d.auth, err = ingest.NewAuthenticator(cfg.Auth, peppers, db.keys, buf, logger, reg); err != nil {
		return nil, err
	}
	if d.deviceKeys, err = ingest.NewDeviceKeys(cfg.Auth.DeviceKeys, peppers, buf, logger, reg); err != nil {
		return nil, err
	}
	d.auth.UseDeviceKeys(d.deviceKeys)
	if d.devices, err = registry.New(cfg.Devices, buf, clk, logger, reg); err != nil {
		return nil, err
	}
	if err := d.devices.Load(); err != nil {
		return nil, err
	}
	if d.ingest, err = ingest.New(cfg.Ingest, buf, d.devices, clk, logger, reg); err != nil {
		return nil, err
	}
	// The audit trail stops writing before it could take the buffer's
	// free-space watermark.
	keepFree := cfg.Audit.KeepFree(buf.Space().MinFreeBytes)
	if d.audit, err = audit.Open(filepath.Join(cfg.DataDir, "audit"), keepFree, clk.Now, logger, reg); err != nil {
		return nil, err
	}
	d.ingest.SetAudit(d.audit)
	d.ingest.SetDeviceKeys(d.deviceKeys)
	return d, nil
}

// startMQTT builds the MQTT side; the embedded broker binds its listener.
func (d *deviceSide) startMQTT(cfg Config, memoryLimit int64) error {
	if cfg.MQTT.Mode == "external" {
		ext, err := ingest.NewExternal(cfg.MQTT.External, d.ingest, d.logger, d.reg)
		if err != nil {
			return err
		}
		d.mqttRun, d.mqttWhere = ext.Run, "external "+cfg.MQTT.External.URL
		return nil
	}
	mqttCfg := cfg.MQTT
	mqttCfg.SessionMemory = sessionMemory(mqttCfg.SessionMemory, memoryLimit)
	broker, err := ingest.NewBroker(mqttCfg, d.ingest, d.auth, d.logger, d.reg)
	if err != nil {
		return err
	}
	if err := broker.Listen(); err != nil {
		return err
	}
	d.mqttRun, d.mqttClose, d.mqttWhere = broker.Run, broker.Close, broker.Addr()
	return nil
}

// close releases what the device side holds when serve returns: the
// broker's listener if it never ran, the audit trail's segment (its Run
// closes it too).
func (d *deviceSide) close() {
	_ = d.mqttClose()
	_ = d.audit.Close()
}

func newUplink(cfg Config, buf *buffer.Buffer, dev *deviceSide, clk *clock.Clock, db cloudSide,
	logger *slog.Logger, reg prometheus.Registerer) (*uplink.Uplink, error) {
	probe := func(ctx context.Context) (int, error) {
		return cloud.ProbeTransactionLimit(ctx, db.uplink, db.tables.ProcessedBatches)
	}
	up, err := uplink.New(cfg.Uplink, buf, dev.devices, clk, db.uplink, probe, db.tables, logger, reg)
	if err != nil {
		return nil, err
	}
	up.SetKeys(dev.deviceKeys, db.keys)
	if db.lambda != nil {
		up.SetLambda(db.lambda, db.gatewayID)
	}
	return up, nil
}

// newHTTP builds the operator API and the HTTP server that serves it with
// the device API, metrics and health endpoints, and binds its listener.
// Readiness fails once the shutdown is asked for, or when the buffer
// failed.
func newHTTP(cfg Config, dev *deviceSide, buf *buffer.Buffer, up *uplink.Uplink, st *stages, adminToken string,
	clk *clock.Clock, startedAt time.Time, logger *slog.Logger, reg *prometheus.Registry) (*ingest.HTTPServer, error) {
	ready := func() error {
		if st.stopping() {
			return errors.New("shutting down")
		}
		return buf.Err()
	}
	ops := operator.New(operator.Deps{
		Devices: dev.devices, DeviceKeys: dev.deviceKeys, History: buf, DeadLetters: buf, AdminToken: adminToken,
		Uplink: up.Report, Ready: ready, Audit: dev.audit, RetryAfter: cfg.HTTP.RetryAfter,
		Status: operator.StatusSources{Version: version, Now: clk.Now, Uplink: up.Report, Buffer: buf.Space,
			Uptime: func() time.Duration { return time.Since(startedAt) },
			Clock: func() operator.ClockStatus {
				return operator.ClockStatus{OffsetSeconds: clk.Offset().Seconds(), Learned: clk.Learned(), Plausible: clk.Plausible()}
			}},
	}, logger)
	api, err := ingest.NewHTTPServer(cfg.HTTP, ingest.HTTPDeps{
		Ingest: dev.ingest, Auth: dev.auth, Routes: ops.Routes, Ready: ready, Registerer: reg,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
	}, logger)
	if err != nil {
		return nil, err
	}
	return api, api.Listen()
}

// background are the parts that serve none of the device traffic: the
// buffer's maintenance and the watch on its failure, metrics pushing, the
// systemd watchdog, pprof and the memory releaser.
type background struct {
	buf      *buffer.Buffer
	pusher   *pushmetrics.Pusher
	pprof    *pprofServer
	released *memoryReleaser
	logger   *slog.Logger
}

func newBackground(cfg Config, buf *buffer.Buffer, reg *prometheus.Registry, logger *slog.Logger) (background, error) {
	b := background{buf: buf, logger: logger, released: newMemoryReleaser(cfg.MemoryReleaseInterval, logger, reg)}
	var err error
	if b.pusher, err = pushmetrics.New(cfg.Push, reg, logger); err != nil {
		return b, err
	}
	if b.pprof, err = listenPprof(cfg.Debug.PprofAddr, logger); err != nil {
		return b, err
	}
	return b, nil
}

func (b background) parts() []func(context.Context) error {
	return []func(context.Context) error{b.buf.Run, b.stopOnBufferFailure, b.pusher.Run, b.watchdog, b.pprof.Run, b.released.Run}
}

// stopOnBufferFailure stops gatewayd when the data directory fails;
// systemd starts it again.
func (b background) stopOnBufferFailure(ctx context.Context) error {
	select {
	case <-b.buf.Failed():
		return fmt.Errorf("%w; stopping so that systemd (Restart=on-failure) starts gatewayd again once the disk "+
			"works, on what is on disk: nothing acknowledged is lost", b.buf.Err())
	case <-ctx.Done():
		return nil
	}
}

// watchdog sends WATCHDOG=1 (WatchdogSec=) every half interval while the
// buffer's committer answers: a stuck disk gets the gateway restarted. A
// full buffer or a down uplink does not.
func (b background) watchdog(ctx context.Context) error {
	return sdnotify.RunWatchdog(ctx, func() error {
		hctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := b.buf.Ping(hctx); err != nil {
			b.logger.Error("health check failed; withholding the systemd watchdog ping", "err", err)
			return err
		}
		return nil
	})
}

// notifyReady tells systemd (Type=notify) that the gateway is ready: the
// listeners are bound and the buffer is open. Outside systemd it does
// nothing.
func notifyReady(mqttWhere, httpAddr string, logger *slog.Logger) {
	if err := sdnotify.Ready(); err != nil {
		logger.Warn("notifying systemd", "err", err)
	}
	_ = sdnotify.Status(fmt.Sprintf("serving: mqtt %s, http %s", mqttWhere, httpAddr))
}

package main

import (
	"context"
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

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/pushmetrics"
	"greenhouse-gateway/internal/sdnotify"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/uplink"
)

// serve runs the gateway until ctx is done or one of its parts fails. The
// gateway stops its parts in the order its steps document (systemd is told
// STOPPING=1 first), within shutdown_timeout, and closes the buffer last.
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
	g, err := newGateway(ctx, cfg, sec, buf, startedAt, limit, logger, reg)
	if err != nil {
		closeBuffer(buf, logger)
		return err
	}
	defer g.Close() // what Run opened, when it failed before every part ran
	return g.Run(ctx)
}

// newGateway builds the cloud clients and the background parts, and the
// gateway over buf, which it then owns.
func newGateway(ctx context.Context, cfg Config, sec secrets, buf *buffer.Buffer, startedAt time.Time, memoryLimit int64,
	logger *slog.Logger, reg *prometheus.Registry) (*gateway.Gateway, error) {
	clk := clock.New(time.Time{}, reg)
	db, err := newCloud(ctx, cfg, clk, sec.peppers.Current, reg)
	if err != nil {
		return nil, err
	}
	p, err := newBackground(cfg, buf, reg, logger)
	if err != nil {
		return nil, err
	}
	mqttCfg := cfg.MQTT
	mqttCfg.SessionMemory = sessionMemory(mqttCfg.SessionMemory, memoryLimit)
	g, err := gateway.New(gateway.Config{
		MQTT: mqttCfg, HTTP: cfg.HTTP, Auth: cfg.Auth, Ingest: cfg.Ingest, Devices: cfg.Devices, Uplink: cfg.Uplink,
		// The audit trail stops writing before it could take the buffer's
		// free-space watermark.
		Audit: cfg.Audit.KeepFree(buf.Space().MinFreeBytes), AuditDir: filepath.Join(cfg.DataDir, "audit"),
		Peppers: sec.peppers, AdminToken: sec.adminToken, ShutdownTimeout: cfg.ShutdownTimeout,
	}, gateway.Deps{
		Buffer: buf, Keys: db.keys, Clock: clk, Metrics: reg, Logger: logger,
		Uplink: &gateway.UplinkDeps{
			DynamoDB: db.uplink, Tables: db.tables, KeyWriter: db.keys, Lambda: db.invoker(), GatewayID: db.gatewayID,
			Probe: func(ctx context.Context) (int, error) {
				return cloud.ProbeTransactionLimit(ctx, db.uplink, db.tables.ProcessedBatches)
			},
		},
		Status: operator.StatusSources{Version: version, Now: clk.Now,
			Uptime: func() time.Duration { return time.Since(startedAt) },
			Clock: func() operator.ClockStatus {
				return operator.ClockStatus{OffsetSeconds: clk.Offset().Seconds(), Learned: clk.Learned(), Plausible: clk.Plausible()}
			}},
		Background: p.parts(),
		Ready: func(mqttWhere, httpAddr string) {
			logger.Info("gatewayd ready", "mqtt", mqttWhere, "http", httpAddr,
				"dynamodb", endpointName(cfg.DynamoDBEndpoint), "tables_prefix", cfg.TablePrefix)
			notifyReady(mqttWhere, httpAddr, logger)
		},
		Stopping: func() { _ = sdnotify.Stopping() },
	})
	if err != nil {
		p.pprof.close() // bound by newBackground, run by the gateway only
		return nil, err
	}
	return g, nil
}

// secrets are the API key peppers and the admin token.
type secrets struct {
	peppers    auth.Peppers
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

// invoker is the lambda target's client, or nil (a nil *lambda.Client in
// an interface would not be nil).
func (c cloudSide) invoker() uplink.Invoker {
	if c.lambda == nil {
		return nil
	}
	return c.lambda
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

// background are the parts of the daemon that serve none of the device
// traffic: metrics pushing, the systemd watchdog, pprof and the memory
// releaser.
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

// parts are the background parts the gateway runs and stops with its own,
// in the fourth step of its shutdown.
func (b background) parts() []func(context.Context) error {
	return []func(context.Context) error{b.pusher.Run, b.watchdog, b.pprof.Run, b.released.Run}
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

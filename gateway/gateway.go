package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/bridge"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/delivery"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
	"greenhouse-gateway/uplink"
)

// Config holds the settings of every part the gateway builds.
type Config struct {
	MQTT    broker.MQTTConfig
	HTTP    httpserve.HTTPConfig
	Auth    auth.AuthConfig
	Ingest  ingest.Config
	Devices registry.Config
	Uplink  uplink.Config
	// Audit configures the audit trail, written in AuditDir.
	Audit    audit.Config
	AuditDir string
	// Peppers hash the API keys.
	Peppers auth.Peppers
	// AdminToken guards the operator routes; empty turns them off.
	AdminToken string
	// ShutdownTimeout bounds the shutdown once it starts; 0 leaves it
	// unbounded.
	ShutdownTimeout time.Duration
}

// Deps are what differs between the daemon and an in-process gateway: the
// open buffer, the clients of the cloud, metrics, logs, the clock, and the
// hooks that tell the outside (systemd) about the gateway's state.
type Deps struct {
	// Buffer is the open buffer every part keeps its state in. The gateway
	// owns it from New on: Run closes it last, Close when Run never ran.
	Buffer *buffer.Buffer
	// Committer takes the ingest path's commits; nil: Buffer.
	Committer ingest.Committer
	// Keys is the api_keys table the authenticator reads (cloud.Keys, or
	// a fake).
	Keys auth.KeyStore
	// Uplink is what the uplink forwards through. It must be set unless
	// NoUplink is: a gateway that forwards nothing (an in-process test
	// gateway) says so.
	Uplink   *UplinkDeps
	NoUplink bool
	// Clock is the gateway's clock; nil: the system clock.
	Clock clock.Source
	// Metrics takes every part's metrics and is served on /metrics; nil:
	// a registry of the gateway's own.
	Metrics *prometheus.Registry
	// Logger may be nil.
	Logger *slog.Logger
	// Status feeds the status page (version, uptime, clock); the gateway
	// adds the uplink's report and the buffer's space.
	Status operator.StatusSources
	// Background are further parts that serve none of the device traffic
	// (metrics pushing, the systemd watchdog, pprof, the memory releaser):
	// they stop with the gateway's own background parts, in the fourth
	// step of the shutdown.
	Background []func(context.Context) error
	// Ready is called once every listener is bound and every part runs,
	// with where MQTT and HTTP are served; nil: nothing is told.
	Ready func(mqttWhere, httpAddr string)
	// Stopping is called when the shutdown starts, before its first step;
	// nil: nothing is told.
	Stopping func()
}

// UplinkDeps are the uplink's clients.
type UplinkDeps struct {
	// DynamoDB takes the uplink's writes; Probe measures its transaction
	// limit; Tables names the tables.
	DynamoDB uplink.DynamoDB
	Probe    uplink.Prober
	Tables   cloud.Tables
	// KeyWriter writes the device keys issued and reset here to api_keys.
	KeyWriter uplink.KeyWriter
	// Lambda invokes the readings function (uplink.target: lambda; else
	// nil), and GatewayID is the gateway's id in its events.
	Lambda    uplink.Invoker
	GatewayID string
}

// Gateway is the daemon as one assembly: every part built by New, run and
// stopped by Run.
type Gateway struct {
	cfg    Config
	deps   Deps
	buf    *buffer.Buffer
	reg    *prometheus.Registry
	logger *slog.Logger

	auth       *auth.Authenticator
	deviceKeys *auth.DeviceKeys
	devices    *registry.Registry
	audit      *audit.Log
	ingest     *ingest.Ingest
	// broker is the embedded MQTT broker, nil in external mode; mqttRun
	// runs it or the consumer of the external broker.
	broker   *broker.Broker
	mqttRun  func(context.Context) error
	mqttAddr func() string
	up       *uplink.Uplink // nil: no uplink
	http     *httpserve.HTTPServer

	// stages is set by Run; readiness fails once its shutdown started.
	stages atomic.Pointer[stages]
	// closeBuffer closes the buffer once, from Run or Close.
	closeBuffer func() error
}

// New builds every part of the gateway: it binds nothing, reads nothing
// and starts nothing (Run does).
func New(cfg Config, deps Deps) (*Gateway, error) {
	if deps.Buffer == nil {
		return nil, errors.New("gateway: New needs an open buffer")
	}
	if deps.Uplink == nil && !deps.NoUplink {
		return nil, errors.New("gateway: New needs the uplink's clients (Deps.Uplink), or Deps.NoUplink")
	}
	g := &Gateway{cfg: cfg, deps: deps, buf: deps.Buffer, reg: deps.Metrics, logger: deps.Logger}
	g.closeBuffer = sync.OnceValue(g.buf.Close)
	if g.reg == nil {
		g.reg = prometheus.NewRegistry()
	}
	if g.logger == nil {
		g.logger = slog.New(slog.DiscardHandler)
	}
	if err := g.buildDeviceSide(); err != nil {
		return nil, err
	}
	if err := g.buildMQTT(); err != nil {
		return nil, err
	}
	if err := g.buildUplink(); err != nil {
		return nil, err
	}
	if err := g.buildHTTP(); err != nil {
		return nil, err
	}
	return g, nil
}

// buildDeviceSide builds what devices are checked against and recorded
// in: the device keys, the authenticator, the device registry, the audit
// trail and the ingest path.
func (g *Gateway) buildDeviceSide() error {
	cfg, deps, logger, reg := g.cfg, g.deps, g.logger, g.reg
	var err error
	if g.deviceKeys, err = auth.NewDeviceKeys(cfg.Auth.DeviceKeys, cfg.Peppers, g.buf, logger, reg); err != nil {
		return err
	}
	if g.auth, err = auth.NewAuthenticator(cfg.Auth, cfg.Peppers, deps.Keys, g.buf, g.deviceKeys, logger, reg); err != nil {
		return err
	}
	if g.devices, err = registry.New(cfg.Devices, g.buf, deps.Clock, logger, reg); err != nil {
		return err
	}
	var now func() time.Time
	if deps.Clock != nil {
		now = deps.Clock.Now
	}
	if g.audit, err = audit.New(cfg.AuditDir, cfg.Audit, now, logger, reg); err != nil {
		return err
	}
	var store ingest.Committer = g.buf
	if deps.Committer != nil {
		store = deps.Committer
	}
	g.ingest, err = ingest.New(cfg.Ingest, ingest.Deps{Store: store, Devices: g.devices, Keys: g.deviceKeys,
		Audit: g.audit, Clock: deps.Clock, Logger: logger, Registerer: reg})
	return err
}

// buildMQTT builds the MQTT side: the embedded broker, or the consumer of
// an external one (mqtt.mode: external).
func (g *Gateway) buildMQTT() error {
	if g.cfg.MQTT.Mode == "external" {
		ext, err := bridge.NewExternal(g.cfg.MQTT.External, g.ingest, g.logger, g.reg)
		if err != nil {
			return err
		}
		where := "external " + g.cfg.MQTT.External.URL
		g.mqttRun, g.mqttAddr = ext.Run, func() string { return where }
		return nil
	}
	b, err := broker.NewBroker(g.cfg.MQTT, g.ingest, g.auth, g.logger, g.reg)
	if err != nil {
		return err
	}
	g.broker, g.mqttRun, g.mqttAddr = b, b.Run, b.Addr
	return nil
}

// buildUplink builds the uplink, unless the gateway has none.
func (g *Gateway) buildUplink() error {
	u := g.deps.Uplink
	if u == nil {
		return nil
	}
	up, err := uplink.New(g.cfg.Uplink, uplink.Deps{Store: g.buf, Devices: g.devices, Clock: g.deps.Clock,
		DynamoDB: u.DynamoDB, Probe: u.Probe, Tables: u.Tables, Keys: g.deviceKeys, KeyWriter: u.KeyWriter,
		Lambda: u.Lambda, GatewayID: u.GatewayID, Logger: g.logger, Registerer: g.reg})
	if err != nil {
		return err
	}
	g.up = up
	return nil
}

// buildHTTP builds the operator API and the HTTP listener that serves it
// with the device API, metrics and health endpoints. Readiness fails once
// the shutdown is asked for, or when the buffer failed.
func (g *Gateway) buildHTTP() error {
	ready := func() error {
		if st := g.stages.Load(); st != nil && st.stopping() {
			return errors.New("shutting down")
		}
		return g.buf.Err()
	}
	status := g.deps.Status
	status.Buffer = g.buf.Space
	var report func() delivery.Report
	if g.up != nil {
		report = g.up.Report
		status.Uplink = g.up.Report
	}
	ops := operator.New(operator.Deps{
		Devices: g.devices, DeviceKeys: g.deviceKeys, History: g.buf, DeadLetters: g.buf, AdminToken: g.cfg.AdminToken,
		Uplink: report, Ready: ready, Audit: g.audit, RetryAfter: g.cfg.HTTP.RetryAfter, Status: status,
	}, g.logger)
	var err error
	g.http, err = httpserve.NewHTTPServer(g.cfg.HTTP, httpserve.HTTPDeps{
		Ingest: g.ingest, Auth: g.auth, Routes: ops.Routes, Ready: ready, Registerer: g.reg,
		Metrics: promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{Registry: g.reg}),
	}, g.logger)
	return err
}

// Devices is the device registry.
func (g *Gateway) Devices() *registry.Registry { return g.devices }

// DeviceKeys is the device keys.
func (g *Gateway) DeviceKeys() *auth.DeviceKeys { return g.deviceKeys }

// MQTTAddr is where MQTT is served once Run bound it: the embedded
// broker's address, or "external" and the external broker's URL.
func (g *Gateway) MQTTAddr() string { return g.mqttAddr() }

// HTTPAddr is the HTTP listener's address once Run bound it.
func (g *Gateway) HTTPAddr() string { return g.http.Addr() }

// Run loads what the parts keep in the buffer, binds the listeners, tells
// Deps.Ready, and runs every part until ctx is done or one of them fails;
// then it stops them in the order of shutdownSteps and closes the buffer.
// When it fails before every part runs, Close releases what it opened.
func (g *Gateway) Run(ctx context.Context) error {
	if err := g.open(); err != nil {
		return err
	}
	st := newStages(ctx)
	g.stages.Store(st)
	return runSteps(st, g.steps(), g.cfg.ShutdownTimeout, g.deps.Ready, g.deps.Stopping, g.logger,
		g.mqttAddr, g.http.Addr)
}

// open reads the records the authenticator, the device keys, the device
// registry and the audit trail keep, and binds the listeners.
func (g *Gateway) open() error {
	if err := g.auth.Load(); err != nil {
		return err
	}
	if err := g.deviceKeys.Load(); err != nil {
		return err
	}
	if err := g.devices.Load(); err != nil {
		return err
	}
	if err := g.audit.Open(); err != nil {
		return err
	}
	if g.broker != nil {
		if err := g.broker.Listen(); err != nil {
			return err
		}
	}
	return g.http.Listen()
}

// Close releases what the gateway holds when Run never ran or failed
// before every part ran: the listeners, the audit trail's segment and the
// buffer. After a Run that ran every part it has nothing left to do.
func (g *Gateway) Close() error {
	var errs []error
	if g.broker != nil {
		errs = append(errs, g.broker.Close())
	}
	errs = append(errs, g.http.Close(), g.audit.Close(), g.closeBuffer())
	return errors.Join(errs...)
}

// steps are the gateway's parts by shutdown step:
//  1. the ingest path stops taking batches and waits for the commits in
//     flight, which are stored and answered; later MQTT publishes are left
//     unacknowledged (the device resends) and HTTP requests answered 503;
//  2. the device side closes: the MQTT broker closes its listener and
//     client connections (in external mode the consumer finishes the
//     messages in progress and disconnects; the broker keeps the rest for
//     the gateway's session), the HTTP server stops accepting and lets
//     requests in progress finish, and the API key uses still being
//     recorded in api_keys are written;
//  3. the uplink stops, and so does its syncing of device records and
//     keys; a request it had in flight is forgotten, and the batch is sent
//     again after a restart (the cloud marker makes that harmless);
//  4. the background parts stop: the device registry saves its records
//     once more, the audit trail writes the records still queued and
//     closes its segment (refusals after that are not kept), the buffer's
//     maintenance (collection of expired records, value-log GC) and the
//     watch on its failure stop, and so do Deps.Background (metrics
//     pushed once more, the pprof listener, the systemd watchdog, the
//     memory releaser);
//  5. the buffer closes last: commits already queued are written and
//     answered, then Badger is closed.
type steps struct {
	stopIngest func() error
	device     []func(context.Context) error
	uplink     []func(context.Context) error
	background []func(context.Context) error
	closeStore func() error
}

func (g *Gateway) steps() steps {
	s := steps{
		stopIngest: g.ingest.Close,
		device:     []func(context.Context) error{g.mqttRun, g.http.Run, g.auth.Run},
		background: append([]func(context.Context) error{g.buf.Run, g.stopOnBufferFailure, g.devices.Run, g.audit.Run},
			g.deps.Background...),
		closeStore: g.closeBuffer,
	}
	if g.up != nil {
		s.uplink = []func(context.Context) error{g.up.Run, g.up.Sync().Run}
	}
	return s
}

// runSteps runs every part of s in the stages that stop them in the
// order of steps, tells ready, waits for the shutdown to be asked for (or
// a part to fail), then tells stopping, runs the shutdown within timeout
// and closes the store: also when the shutdown did not finish in time,
// then with parts still running.
func runSteps(st *stages, s steps, timeout time.Duration, ready func(mqttWhere, httpAddr string), stopping func(),
	logger *slog.Logger, mqttWhere, httpAddr func() string) error {
	st.then(s.stopIngest)                                                                     // 1.
	for _, parts := range [][]func(context.Context) error{s.device, s.uplink, s.background} { // 2., 3., 4.
		stage := st.stage()
		for _, part := range parts {
			stage.run(part)
		}
	}
	if ready != nil {
		ready(mqttWhere(), httpAddr())
	}
	err := stop(st, timeout, stopping, logger)
	if cerr := s.closeStore(); cerr != nil { // 5.
		logger.Error("closing the buffer", "err", cerr)
	}
	return err
}

// stop waits for the shutdown to be asked for, then runs it within
// timeout (0: unbounded).
func stop(st *stages, timeout time.Duration, stopping func(), logger *slog.Logger) error {
	st.wait()
	if stopping != nil {
		stopping()
	}
	logger.Info("gatewayd stopping", "deadline", timeout.String())
	done := make(chan error, 1)
	go func() { done <- st.stop() }()
	var expired <-chan time.Time
	if timeout > 0 {
		expired = time.After(timeout)
	}
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		logger.Info("gatewayd stopped")
		return nil
	case <-expired:
		return fmt.Errorf("shutdown did not finish within %s", timeout)
	}
}

// stopOnBufferFailure stops the gateway when the data directory fails;
// systemd starts it again.
func (g *Gateway) stopOnBufferFailure(ctx context.Context) error {
	select {
	case <-g.buf.Failed():
		return fmt.Errorf("%w; stopping so that systemd (Restart=on-failure) starts gatewayd again once the disk "+
			"works, on what is on disk: nothing acknowledged is lost", g.buf.Err())
	case <-ctx.Done():
		return nil
	}
}

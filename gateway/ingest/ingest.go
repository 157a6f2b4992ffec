package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/internal/logpace"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/registry"
)

// ErrShuttingDown is returned while the gateway stops: nothing new is
// committed or acknowledged.
var ErrShuttingDown = errors.New("gateway: shutting down")

// Committer stores batches durably (the buffer).
type Committer interface {
	// Submit queues entries for a durable commit and returns what waits
	// for it: the outcome of each entry, or an error when none may be
	// acknowledged. Commits queued in order are stored in that order
	// (buffer.Buffer's Submit), so a device's next message can be queued
	// while the previous one commits. An error from Submit itself means
	// nothing was queued.
	Submit(ctx context.Context, entries []buffer.Entry) (wait func() ([]buffer.Outcome, error), err error)
}

// CommitFunc is a Committer that commits synchronously, in Submit: a
// store without a queue of its own (a test's, say).
type CommitFunc func(ctx context.Context, entries []buffer.Entry) ([]buffer.Outcome, error)

// Submit commits entries and returns their result.
func (f CommitFunc) Submit(ctx context.Context, entries []buffer.Entry) (func() ([]buffer.Outcome, error), error) {
	out, err := f(ctx, entries)
	return func() ([]buffer.Outcome, error) { return out, err }, nil
}

// Config holds the contract's configurable limits and the ordering
// rule.
type Config struct {
	// MaxReadingsPerBatch caps readings in one batch. Default 100.
	MaxReadingsPerBatch int `yaml:"max_readings_per_batch"`
	// MaxSensorsPerReading caps sensors (and sensor_status entries) per
	// reading. Default 64.
	MaxSensorsPerReading int `yaml:"max_sensors_per_reading"`
	// MaxClockSkew is how far in the future a timestamp may be. Default 5m.
	MaxClockSkew time.Duration `yaml:"max_clock_skew"`
	// Ordering is "accept_older" (default: batches older than what the
	// device already sent are store-and-forward replays, accepted and
	// counted) or "reject_older" (rejected with timestamp_conflict when
	// they start more than OrderingGrace before the newest reading
	// accepted from the device).
	Ordering string `yaml:"ordering"`
	// OrderingGrace is the tolerance of reject_older. Default 5m.
	OrderingGrace time.Duration `yaml:"ordering_grace"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	lim := contract.DefaultLimits()
	return Config{MaxReadingsPerBatch: lim.MaxReadings, MaxSensorsPerReading: lim.MaxSensors,
		MaxClockSkew: lim.MaxClockSkew, Ordering: "accept_older", OrderingGrace: 5 * time.Minute}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.MaxReadingsPerBatch < 0 || c.MaxReadingsPerBatch > 1000:
		return errors.New("ingest.max_readings_per_batch: must be between 1 and 1000")
	case c.MaxSensorsPerReading < 0 || c.MaxSensorsPerReading > 1000:
		return errors.New("ingest.max_sensors_per_reading: must be between 1 and 1000")
	case c.MaxClockSkew < 0:
		return errors.New("ingest.max_clock_skew: must not be negative")
	case c.OrderingGrace < 0:
		return errors.New("ingest.ordering_grace: must not be negative")
	}
	switch c.Ordering {
	case "", "accept_older", "reject_older":
	default:
		return fmt.Errorf("ingest.ordering: %q is not one of accept_older, reject_older", c.Ordering)
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.MaxReadingsPerBatch == 0 {
		c.MaxReadingsPerBatch = d.MaxReadingsPerBatch
	}
	if c.MaxSensorsPerReading == 0 {
		c.MaxSensorsPerReading = d.MaxSensorsPerReading
	}
	if c.MaxClockSkew == 0 {
		c.MaxClockSkew = d.MaxClockSkew
	}
	if c.Ordering == "" {
		c.Ordering = d.Ordering
	}
	if c.OrderingGrace == 0 {
		c.OrderingGrace = d.OrderingGrace
	}
	return c
}

func (c Config) limits() contract.Limits {
	return contract.Limits{MaxReadings: c.MaxReadingsPerBatch, MaxSensors: c.MaxSensorsPerReading, MaxClockSkew: c.MaxClockSkew}
}

// Ingest is the one ingest path behind both transports.
type Ingest struct {
	cfg     Config
	limits  contract.Limits
	store   Committer
	devices *registry.Registry
	clock   clock.Source
	logger  *slog.Logger
	results *prometheus.CounterVec
	// counted holds results' children of both transports, resolved once:
	// every batch counts one.
	counted [2]map[string]prometheus.Counter
	// took holds each transport's ingest duration histogram (see
	// Readings), resolved once like counted.
	took [2]prometheus.Observer
	// mu guards stopped and the admission of calls into inflight, so that
	// Close waits for every call that got in.
	mu       sync.RWMutex
	stopped  bool
	inflight sync.WaitGroup
	audit    *audit.Log // nil: nothing recorded
	// keys authorizes principals and enrolls devices (nil: none);
	// identityLog paces the log lines of identity refusals.
	keys        *auth.DeviceKeys
	identityLog *logpace.Log
}

// Deps are what the ingest path commits to, tells and records.
type Deps struct {
	// Store takes the commits (the buffer).
	Store Committer
	// Devices is the device registry; nil: none (registrations are
	// refused).
	Devices *registry.Registry
	// Keys authorizes each message's principal for its hardware_id and
	// enrolls devices registering with a fleet key; nil: a device key
	// still acts for its own device only, and nothing is enrolled.
	Keys *auth.DeviceKeys
	// Audit records every attempt refused or not stored; nil: nothing is
	// recorded.
	Audit *audit.Log
	// Clock is the gateway's clock; nil: the system clock.
	Clock clock.Source
	// Logger and Registerer may be nil.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// New returns the ingest path; it starts nothing and opens nothing.
func New(cfg Config, deps Deps) (*Ingest, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	logger, reg, clk := deps.Logger, deps.Registerer, deps.Clock
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if clk == nil {
		clk = clock.System{}
	}
	in := &Ingest{
		cfg:         cfg,
		limits:      cfg.limits(),
		store:       deps.Store,
		devices:     deps.Devices,
		keys:        deps.Keys,
		audit:       deps.Audit,
		clock:       clk,
		logger:      logger.With("component", "ingest"),
		identityLog: logpace.New(logpace.Interval),
		results: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "ingest", Name: "batches_total",
			Help: "Reading batches received, by transport and result (accepted, duplicate, or the rejection reason).",
		}, []string{"transport", "result"}),
	}
	durations := promauto.With(reg).NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "gateway", Subsystem: "ingest", Name: "duration_seconds",
		Help: "Time from a message or request handed to the ingest path to its results, by transport: decoding, " +
			"validation and the durable commit (fsync), before the acknowledgement is sent.",
		Buckets: prometheus.ExponentialBuckets(0.00025, 2, 15), // 0.25 ms to about 4 s
	}, []string{"transport"})
	for k, t := range []string{contract.TransportMQTT, contract.TransportHTTP} {
		in.took[k] = durations.WithLabelValues(t)
		in.counted[k] = map[string]prometheus.Counter{}
		for _, r := range []string{string(contract.StatusAccepted), string(contract.StatusDuplicate), string(contract.ReasonValidation),
			string(contract.ReasonClockNotSynced), string(contract.ReasonConflict), string(contract.ReasonBufferFull),
			string(contract.ReasonUnknownDevice), string(contract.ReasonTimestampConflict), string(contract.ReasonForbidden),
			string(contract.ReasonDeviceKeyRequired)} {
			in.counted[k][r] = in.results.WithLabelValues(t, r)
		}
	}
	return in, nil
}

// transportIndex is transport's index in counted and took, -1 if neither.
func transportIndex(transport string) int {
	switch transport {
	case contract.TransportMQTT:
		return 0
	case contract.TransportHTTP:
		return 1
	}
	return -1
}

// count counts one batch's result.
func (in *Ingest) count(transport string, r contract.Result) {
	label := resultLabel(r)
	if k := transportIndex(transport); k >= 0 {
		if c, ok := in.counted[k][label]; ok {
			c.Inc()
			return
		}
	}
	in.results.WithLabelValues(transport, label).Inc()
}

// Close makes every later call fail with ErrShuttingDown and returns once
// the calls already in progress returned: their batches are committed and
// answered (or reported not stored). It holds no other resource, and a
// second Close returns at once.
func (in *Ingest) Close() error {
	in.mu.Lock()
	in.stopped = true
	in.mu.Unlock()
	in.inflight.Wait()
	return nil
}

// Stopping reports whether Close was called.
func (in *Ingest) Stopping() bool {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return in.stopped
}

// enter admits a call unless Close was called; an admitted call ends with
// in.inflight.Done.
func (in *Ingest) enter() bool {
	in.mu.RLock()
	defer in.mu.RUnlock()
	if in.stopped {
		return false
	}
	in.inflight.Add(1)
	return true
}

// Sender is who sent a message, as its transport knows it.
type Sender struct {
	// HardwareID is the hardware_id of the MQTT topic the message came on
	// (devices/{hw}/{kind}); "" over HTTP, where each batch and
	// registration names its own device.
	HardwareID string
	// RemoteAddr is the sender's address, for the audit trail.
	RemoteAddr string
	// Principal is the API key the transport verified; nil when it
	// verifies none (an external broker authenticates its clients itself).
	Principal *auth.Principal
}

// Transport names the transport a message from s came over: MQTT when it
// came on a topic, else HTTP.
func (s Sender) Transport() string { return transportOf(s.HardwareID) }

// from carries s's principal and address in ctx, for the checks and the
// audit records of one call.
func (in *Ingest) from(ctx context.Context, s Sender) context.Context {
	ctx = in.withRemoteAddr(ctx, s.RemoteAddr)
	if s.Principal != nil {
		ctx = withPrincipal(ctx, *s.Principal)
	}
	return ctx
}

// MQTTMessage handles one message of kind a device published on
// devices/{hw}/{kind} (s.HardwareID), from the embedded broker or an
// external one. It returns the ack to publish on the device's ack topic
// (nil: none) and whether the message may be acknowledged at the MQTT
// level: false when nothing was stored (the commit failed, the buffer is
// full, the gateway is stopping), so that a QoS 1 device or broker keeps
// the message and delivers it again.
func (in *Ingest) MQTTMessage(ctx context.Context, s Sender, kind string, payload []byte) (*contract.Ack, bool) {
	ctx, hw := in.from(ctx, s), s.HardwareID
	if kind == contract.KindReadings {
		return in.startMQTTReadings(ctx, hw, payload)()
	}
	if kind == contract.KindRegister {
		ack, _, err := in.register(ctx, hw, payload)
		if errors.Is(err, ErrShuttingDown) {
			return nil, false
		}
		return &ack, err == nil || contract.AsError(err).Reason != contract.ReasonBufferFull
	}
	return nil, true
}

// StartMQTTReadings does the part of MQTTMessage for a readings message
// that must follow the device's earlier messages (decoding, validation,
// the registry's rules) and queues its commit; the function it returns
// waits for the commit and answers as MQTTMessage does. It must be called
// exactly once.
func (in *Ingest) StartMQTTReadings(ctx context.Context, s Sender, payload []byte) func() (*contract.Ack, bool) {
	return in.startMQTTReadings(in.from(ctx, s), s.HardwareID, payload)
}

func (in *Ingest) startMQTTReadings(ctx context.Context, hw string, payload []byte) func() (*contract.Ack, bool) {
	call, err := in.startReadings(ctx, contract.TransportMQTT, hw, [][]byte{payload})
	if err != nil { // ErrShuttingDown
		return func() (*contract.Ack, bool) { return nil, false }
	}
	return func() (*contract.Ack, bool) {
		results, err := call.finish()
		r := results[0]
		ack := contract.Ack{Type: contract.AckTypeReadings, BatchID: r.BatchID, Status: r.Status, Reason: r.Reason, Message: r.Message}
		if err != nil {
			in.logger.Error("commit failed; MQTT acknowledgement withheld", "hardware_id", hw, "batch_id", r.BatchID, "err", err)
			return &ack, false
		}
		return &ack, r.Reason == nil || *r.Reason != contract.ReasonBufferFull
	}
}

// Register handles a registration from s (on its MQTT topic, or over
// HTTP). It returns the ack, whether this was the
// device's first registration, and an error when it was refused: an
// *contract.Error (invalid; reason buffer_full when it could not be saved)
// or ErrShuttingDown.
func (in *Ingest) Register(ctx context.Context, s Sender, payload []byte) (contract.Ack, bool, error) {
	return in.register(in.from(ctx, s), s.HardwareID, payload)
}

func (in *Ingest) register(ctx context.Context, sender string, payload []byte) (contract.Ack, bool, error) {
	if !in.enter() {
		return contract.Ack{}, false, ErrShuttingDown
	}
	defer in.inflight.Done()
	reg, err := contract.DecodeRegistration(payload, sender)
	if err == nil && in.devices == nil {
		err = contract.NewError(contract.ReasonUnknownDevice, "", "this gateway keeps no device registry")
	}
	if err == nil {
		if cerr := in.authorizeCtx(ctx, reg.HardwareID, auth.ActRegister, transportOf(sender)); cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		in.auditRegister(ctx, sender, payload, err)
		return contract.RegisterAck("", err), false, err
	}
	id, first, err := in.devices.Register(reg)
	if err != nil {
		in.logger.Error("registration not saved", "hardware_id", reg.HardwareID, "err", err)
		cerr := contract.NewError(contract.ReasonBufferFull, "", "the gateway could not save the registration; retry later")
		in.auditRegister(ctx, reg.HardwareID, payload, cerr)
		return contract.RegisterAck("", cerr), false, cerr
	}
	if first {
		in.logger.Info("device registered", "hardware_id", reg.HardwareID, "confirmation_id", id,
			"firmware_version", reg.FirmwareVersion)
	}
	ack := contract.RegisterAck(id, nil)
	in.enroll(ctx, reg.HardwareID, &ack)
	return ack, first, nil
}

// transportOf names the transport of a message from sender (the MQTT
// topic's hardware_id, or "" over HTTP).
func transportOf(sender string) string {
	if sender == "" {
		return contract.TransportHTTP
	}
	return contract.TransportMQTT
}

// Readings decodes, validates and commits reading batches, all from s (on
// its MQTT topic, or over HTTP, where each batch names its own device). It
// returns one result per payload, in order.
//
// A batch is acknowledged (accepted or duplicate) only after it is on disk.
// When the commit itself fails, every batch that needed it is reported
// rejected with reason buffer_full and the returned error is non-nil, so
// the transport withholds its acknowledgement.
func (in *Ingest) Readings(ctx context.Context, s Sender, payloads [][]byte) ([]contract.Result, error) {
	call, err := in.startReadings(in.from(ctx, s), s.Transport(), s.HardwareID, payloads)
	if err != nil {
		return nil, err
	}
	return call.finish()
}

// readingsCall is a Readings call whose batches are decoded, validated and
// queued for their commit; finish waits for the commit and reports.
type readingsCall struct {
	in        *Ingest
	ctx       context.Context
	transport string
	start     time.Time
	results   []contract.Result
	sent      []committed
	// wait answers the commit of the batches in sent (nil: none to
	// commit); submitErr is why they could not be queued.
	wait      func() ([]buffer.Outcome, error)
	submitErr error
}

// committed is a batch sent to the commit: the payload it came from (i)
// and what the registry is told about it.
type committed struct {
	i     int
	batch *contract.Batch
	fixed bool
}

// startReadings does Readings up to its commit, which it queues. Unless it
// returns an error (ErrShuttingDown), its finish must be called, once.
func (in *Ingest) startReadings(ctx context.Context, transport, sender string, payloads [][]byte) (*readingsCall, error) {
	if !in.enter() {
		return nil, ErrShuttingDown
	}
	c := &readingsCall{in: in, ctx: ctx, transport: transport, start: time.Now(),
		results: make([]contract.Result, len(payloads))}
	now := in.clock.Now()
	principal, _ := principalFrom(ctx)
	var entries []buffer.Entry
	if len(payloads) == 1 { // MQTT: one message, one batch
		entries = make([]buffer.Entry, 0, 1)
		c.sent = make([]committed, 0, 1)
	}
	for i, p := range payloads {
		b, fixed, err := in.prepare(ctx, transport, p, sender, now)
		if err != nil {
			c.results[i] = rejected(batchIDOf(b, p, err), err)
			in.auditBatch(ctx, transport, hardwareIDOf(sender, b), p, c.results[i], err)
			continue
		}
		entries = append(entries, buffer.Entry{
			BatchID: b.BatchID, HardwareID: b.HardwareID,
			Hash: b.hash, Payload: b.canonical, ReceivedAt: now, Key: principal.KeyID,
		})
		c.sent = append(c.sent, committed{i: i, batch: b.Batch, fixed: fixed})
		c.results[i].BatchID = b.BatchID
	}
	if len(entries) == 0 {
		return c, nil
	}
	c.wait, c.submitErr = in.store.Submit(ctx, entries)
	return c, nil
}

// finish waits for the commit startReadings queued and returns one result
// per payload, in order, and the commit's error.
func (c *readingsCall) finish() ([]contract.Result, error) {
	in := c.in
	defer in.inflight.Done()
	if k := transportIndex(c.transport); k >= 0 {
		defer func() { in.took[k].Observe(time.Since(c.start).Seconds()) }()
	}
	results := c.results
	var commitErr error
	if len(c.sent) > 0 {
		var outcomes []buffer.Outcome
		err := c.submitErr
		if err == nil {
			outcomes, err = c.wait()
		}
		if err != nil {
			commitErr = fmt.Errorf("committing %d batches: %w", len(c.sent), err)
			for _, b := range c.sent {
				results[b.i] = fullResult(results[b.i].BatchID, "the gateway could not store the batch; nothing was stored, retry later")
			}
		} else {
			for k, b := range c.sent {
				results[b.i] = outcomeResult(results[b.i].BatchID, outcomes[k])
				if in.devices != nil && (outcomes[k] == buffer.Stored || outcomes[k] == buffer.Duplicate) {
					in.devices.Observe(b.batch, b.fixed, outcomes[k] == buffer.Stored)
				}
			}
		}
	}
	if in.audit != nil {
		for _, b := range c.sent {
			in.auditBatch(c.ctx, c.transport, b.batch.HardwareID, nil, results[b.i], nil)
		}
	}
	for _, r := range results {
		in.count(c.transport, r)
		if r.Status == contract.StatusRejected {
			in.logger.Debug("batch rejected", "transport", c.transport, "batch_id", r.BatchID,
				"reason", *r.Reason, "message", *r.Message)
		}
	}
	return results, commitErr
}

// prepared is a decoded batch with its canonical encoding (after any
// clock repair: what is stored) and its identity hash (taken before any
// clock repair, as the device sent it).
type prepared struct {
	*contract.Batch
	canonical []byte
	hash      [32]byte
}

// prepare decodes and validates one batch, authorizes its sender for the
// batch's hardware_id (before anything of the device changes), and applies
// the registry's rules: unknown devices, clock repair and ordering. It
// reports whether the clock was repaired.
func (in *Ingest) prepare(ctx context.Context, transport string, payload []byte, sender string, now time.Time) (prepared, bool, error) {
	plausible := in.clock.Plausible()
	check := now
	if !plausible {
		check = time.Time{} // no "too far in the future" check against a wrong clock
	}
	b, err := contract.DecodeBatch(payload, sender, in.limits, check)
	if err != nil {
		if in.devices != nil && contract.AsError(err).Reason == contract.ReasonClockNotSynced && sender != "" {
			in.devices.NotSynced(sender)
		}
		return prepared{}, false, err
	}
	if cerr := in.authorizeCtx(ctx, b.HardwareID, auth.ActReadings, transport); cerr != nil {
		return prepared{Batch: b}, false, cerr
	}
	// One encoding gives both, unless the clock is repaired below.
	canonical, hash := b.CanonicalIdentity()
	p := prepared{Batch: b, canonical: canonical, hash: hash}
	if in.devices == nil {
		if b.NeedsClockRepair() {
			return p, false, contract.NewError(contract.ReasonClockNotSynced, "readings",
				"timestamps before 2000-01-01 and no device registry to repair them")
		}
		return p, false, nil
	}
	if !in.devices.Admits(b.HardwareID) {
		return p, false, contract.NewError(contract.ReasonUnknownDevice, "hardware_id",
			"the device has not registered; publish a registration first")
	}
	fixed := false
	if b.NeedsClockRepair() && !plausible {
		return p, false, contract.NewError(contract.ReasonClockNotSynced, "readings",
			"timestamps before 2000-01-01, and the gateway's own clock is not synced yet to repair them; resend later")
	}
	if b.NeedsClockRepair() {
		anchor, err := in.devices.Anchor(b.HardwareID, b.BootID, now.UnixMilli(), *b.SentUptimeMS)
		if err != nil {
			return p, false, contract.NewError(contract.ReasonBufferFull, "", "the gateway could not save the clock anchor; retry later")
		}
		b.RepairClock(anchor)
		if err := b.Validate(in.limits, check); err != nil {
			return p, false, err
		}
		p.canonical = b.Canonical()
		fixed = true
	}
	if in.cfg.Ordering == "reject_older" {
		if err := b.CheckOrder(in.devices.LastTimestamp(b.HardwareID), in.cfg.OrderingGrace); err != nil && !in.known(b.BatchID) {
			return p, false, err
		}
	}
	return p, fixed, nil
}

// lookup is the part of the buffer that tells a batch_id it holds.
type lookup interface {
	Lookup(batchID string) (string, error)
}

// known reports whether the store holds a marker of batchID (pending,
// delivered or dead-lettered): a resend, which its commit answers
// duplicate (or conflict), so that the ordering rule, against a newest
// reading that includes the batch itself, does not refuse it.
func (in *Ingest) known(batchID string) bool {
	l, ok := in.store.(lookup)
	if !ok {
		return false
	}
	_, err := l.Lookup(batchID)
	return err == nil
}

func resultLabel(r contract.Result) string {
	if r.Status == contract.StatusRejected && r.Reason != nil {
		return string(*r.Reason)
	}
	return string(r.Status)
}

func outcomeResult(batchID string, o buffer.Outcome) contract.Result {
	switch o {
	case buffer.Stored:
		return contract.Result{BatchID: batchID, Status: contract.StatusAccepted}
	case buffer.Duplicate:
		return contract.Result{BatchID: batchID, Status: contract.StatusDuplicate}
	case buffer.Conflict:
		reason := contract.ReasonConflict
		msg := "batch_id was already received with a different payload"
		return contract.Result{BatchID: batchID, Status: contract.StatusRejected, Reason: &reason, Message: &msg}
	case buffer.Limited:
		return fullResult(batchID, limitedMessage)
	default:
		return fullResult(batchID, "the gateway's buffer is full; nothing was stored, retry later")
	}
}

// limitedMessage is the message of a batch refused because its device or
// key holds its share of the buffer or sent new batches too fast: reason
// buffer_full, so that every firmware keeps it and resends it later.
const limitedMessage = "this device (or its API key) holds its share of the gateway's buffer, or sends new batches " +
	"faster than the gateway takes from one device; nothing was stored, retry later"

// OnlyLimited reports whether every batch refused as buffer_full in results
// was refused for its device's or key's share or rate, none for a full
// buffer: the HTTP answer is then 429, not 507.
func OnlyLimited(results []contract.Result) bool {
	limited := false
	for _, r := range results {
		if r.Reason == nil || *r.Reason != contract.ReasonBufferFull {
			continue
		}
		if r.Message == nil || *r.Message != limitedMessage {
			return false
		}
		limited = true
	}
	return limited
}

func fullResult(batchID, msg string) contract.Result {
	reason := contract.ReasonBufferFull
	return contract.Result{BatchID: batchID, Status: contract.StatusRejected, Reason: &reason, Message: &msg}
}

func rejected(batchID string, err error) contract.Result {
	reason := contract.ReasonValidation
	var ce *contract.Error
	if errors.As(err, &ce) {
		reason = ce.Reason
	}
	msg := err.Error()
	return contract.Result{BatchID: batchID, Status: contract.StatusRejected, Reason: &reason, Message: &msg}
}

// hardwareIDOf returns the sender, else the decoded batch's hardware_id,
// else "".
func hardwareIDOf(sender string, b prepared) string {
	if sender == "" && b.Batch != nil {
		return b.HardwareID
	}
	return sender
}

// batchIDOf names a rejected batch as well as it can: the decoded batch_id,
// else the one the decoder saw in the payload.
func batchIDOf(b prepared, payload []byte, err error) string {
	if b.Batch != nil {
		return b.BatchID
	}
	return contract.AsError(err).BatchID
}

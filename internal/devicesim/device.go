package devicesim

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"greenhouse-gateway/internal/contract"
)

// Causes of a retry, as counted in [DeviceStats.Retried]. The contract's rejection reasons
// that lead to a retry ("buffer_full", "unknown_device") are counted under their own name.
const (
	causeTimeout      = "timeout"      // no answer within the ack timeout
	causeTransport    = "transport"    // not connected, network error, retryable HTTP status
	causeDisconnected = "disconnected" // the connection was lost while the batch was in flight
	causeUnexpected   = "unexpected"   // an answer with a status the contract does not know
)

// eventBuffer is the capacity of a device's event channel.
const eventBuffer = 256

// DeviceStats counts what one simulated device did during a run.
type DeviceStats struct {
	// HardwareID and BootID identify the device and its boot.
	HardwareID string
	BootID     string
	// Registered reports whether the gateway confirmed a registration of this boot.
	Registered bool
	// Built is the number of batches built.
	Built int
	// Sent is the number of transmissions of batches, first sends and re-sends;
	// Resent is the number of re-sends among them.
	Sent   int
	Resent int
	// Accepted and Duplicates count batches confirmed with "accepted" and "duplicate".
	Accepted   int
	Duplicates int
	// Rejected counts batches dropped after a final rejection, by reason.
	Rejected map[string]int
	// Retried counts failed attempts that kept the batch for a later retry, by cause:
	// "buffer_full", "unknown_device", "timeout", "transport", "disconnected", "unexpected".
	Retried map[string]int
	// Overflow is the number of unconfirmed batches dropped because the offline buffer was full.
	Overflow int
	// Pending is the number of unconfirmed batches left in the buffer when the device stopped.
	Pending int
}

func (s *DeviceStats) rejectedTotal() int { return sumCounts(s.Rejected) }

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// formatCounts writes a count map as "a=1,b=2" in key order, or "none".
func formatCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

type regState int

const (
	regNone    regState = iota // not sent on this connection
	regWaiting                 // sent, waiting for the answer until regDeadline
	regDone                    // confirmed by the gateway
	regGaveUp                  // not confirmed; readings are sent anyway
)

// device is one simulated ESP32: a sampling generator, an offline buffer and a link, driven
// by one goroutine.
type device struct {
	cfg        *Config
	log        *slog.Logger
	gen        *generator
	out        *outbox
	dial       dialFunc
	report     *reportWriter
	jitter     *rand.Rand
	now        func() time.Time
	regPayload []byte

	stats DeviceStats

	connected     bool
	everConnected bool
	reg           regState
	regDeadline   time.Time

	failures     int       // consecutive failed attempts
	failingSince time.Time // first of those failures
	nextAttempt  time.Time // no batch is sent before this time

	producing  bool
	stopAt     time.Time // when producing stops (Duration); zero: never
	drainUntil time.Time // when a device that stopped producing gives up on its buffer
}

func newDevice(cfg *Config, logger *slog.Logger, gen *generator, dial dialFunc, report *reportWriter, jitter *rand.Rand, now func() time.Time) (*device, error) {
	regPayload, err := json.Marshal(gen.registration())
	if err != nil {
		return nil, fmt.Errorf("encoding registration of %s: %w", gen.hardwareID, err)
	}
	return &device{
		cfg:        cfg,
		log:        logger.With("hardware_id", gen.hardwareID),
		gen:        gen,
		out:        newOutbox(cfg.BufferSize),
		dial:       dial,
		report:     report,
		jitter:     jitter,
		now:        now,
		regPayload: regPayload,
		stats: DeviceStats{
			HardwareID: gen.hardwareID,
			BootID:     gen.bootID,
			Rejected:   map[string]int{},
			Retried:    map[string]int{},
		},
	}, nil
}

// run drives the device until ctx is done, or until it stopped producing and its buffer is
// empty or the drain timeout passed. It returns the device's counters.
func (d *device) run(ctx context.Context) (DeviceStats, error) {
	linkCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan event, eventBuffer)
	l, err := d.dial(linkCtx, d.gen.hardwareID, events)
	if err != nil {
		return d.stats, fmt.Errorf("devicesim: setting up the link of %s: %w", d.gen.hardwareID, err)
	}

	start := d.now()
	d.producing = true
	if d.cfg.Duration > 0 {
		d.stopAt = start.Add(d.cfg.Duration)
	}
	d.log.Info("device booted", "boot_id", d.gen.bootID)

	ticker := time.NewTicker(d.cfg.Interval)
	defer ticker.Stop()
	var summaryC <-chan time.Time
	if d.cfg.SummaryInterval > 0 {
		st := time.NewTicker(d.cfg.SummaryInterval)
		defer st.Stop()
		summaryC = st.C
	}
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()

	stopped := false
	for !stopped {
		now := d.now()
		d.advance(now)
		if d.finished(now) {
			break
		}
		d.pump(l, now)
		tickC := ticker.C
		if !d.producing {
			tickC = nil
		}
		wake.Reset(d.nextWake(now))
		select {
		case <-ctx.Done():
			stopped = true
		case <-tickC:
			d.produce(d.now())
		case ev := <-events:
			d.handle(l, ev, d.now())
		case <-wake.C:
		case <-summaryC:
			d.logSummary("device summary")
		}
	}

	cancel()
	closeErr := l.Close()
	d.stats.Pending = d.out.len()
	if d.stats.Pending > 0 {
		d.log.Info("device stopped with unconfirmed batches", "pending", d.stats.Pending)
	}
	if closeErr != nil {
		d.log.Warn("closing connection", "err", closeErr)
	}
	return d.stats, nil
}

// advance applies everything that is due at now: the end of production, answers that did not
// come, a registration that was not confirmed.
func (d *device) advance(now time.Time) {
	if d.producing && !d.stopAt.IsZero() && !now.Before(d.stopAt) {
		d.stopProducing(now, "duration reached")
	}
	if expired := d.out.expired(now); len(expired) > 0 {
		d.stats.Retried[causeTimeout] += len(expired)
		d.failed(now, 0, "no answer within the ack timeout", nil, "batch_id", expired[0].id, "batches", len(expired))
	}
	if d.reg == regWaiting && !now.Before(d.regDeadline) {
		d.reg = regGaveUp
		d.log.Warn("registration not confirmed within the ack timeout; sending readings anyway")
	}
}

func (d *device) stopProducing(now time.Time, why string) {
	d.producing = false
	d.drainUntil = now.Add(d.cfg.DrainTimeout)
	if n := d.out.len(); n > 0 {
		d.log.Info("stopped producing, draining the buffer", "why", why, "pending", n, "drain_timeout", d.cfg.DrainTimeout)
	} else {
		d.log.Info("stopped producing", "why", why)
	}
}

// finished reports whether the device is done: no longer producing, and nothing left to
// deliver or no time left to deliver it.
func (d *device) finished(now time.Time) bool {
	return !d.producing && (d.out.len() == 0 || !now.Before(d.drainUntil))
}

// pump sends the oldest unsent batches while the link is up, the backoff has passed and fewer
// than MaxInflight batches wait for their answer.
func (d *device) pump(l link, now time.Time) {
	if !d.connected || d.reg == regWaiting || now.Before(d.nextAttempt) {
		return
	}
	for d.out.inflight < d.cfg.MaxInflight {
		e := d.out.nextUnsent()
		if e == nil {
			return
		}
		payload, err := e.encode(d.gen.uptime(now))
		if err != nil {
			// Cannot happen with the values a generator builds; drop rather than loop.
			d.out.remove(e.id)
			d.log.Error("dropping a batch that does not encode", "batch_id", e.id, "err", err)
			continue
		}
		if err := l.Send(e.id, payload); err != nil {
			d.stats.Retried[causeTransport]++
			d.failed(now, 0, "sending batch", err, "batch_id", e.id)
			return
		}
		e.attempts++
		d.stats.Sent++
		if e.attempts > 1 {
			d.stats.Resent++
		}
		d.out.markInflight(e, now.Add(d.cfg.AckTimeout))
	}
}

// nextWake returns how long the loop may sleep before something is due, if no event comes.
func (d *device) nextWake(now time.Time) time.Duration {
	next := now.Add(time.Hour)
	consider := func(t time.Time) {
		if t.Before(next) {
			next = t
		}
	}
	if t, ok := d.out.earliestDeadline(); ok {
		consider(t)
	}
	if d.reg == regWaiting {
		consider(d.regDeadline)
	}
	if now.Before(d.nextAttempt) && d.out.len() > d.out.inflight {
		consider(d.nextAttempt)
	}
	if d.producing && !d.stopAt.IsZero() {
		consider(d.stopAt)
	}
	if !d.producing {
		consider(d.drainUntil)
	}
	return max(next.Sub(now), 0)
}

// produce builds the next batch and puts it into the offline buffer.
func (d *device) produce(now time.Time) {
	if !d.producing {
		return
	}
	e := newEntry(d.gen.next(now))
	if dropped := d.out.push(e); dropped != nil {
		d.stats.Overflow++
		level := slog.LevelDebug
		if d.stats.Overflow == 1 || d.stats.Overflow%100 == 0 {
			level = slog.LevelWarn
		}
		d.log.Log(context.Background(), level, "offline buffer full, dropped the oldest batch",
			"batch_id", dropped.id, "dropped_total", d.stats.Overflow, "capacity", d.cfg.BufferSize)
	}
	d.stats.Built++
	if d.cfg.Batches > 0 && d.stats.Built >= d.cfg.Batches {
		d.stopProducing(now, "batch count reached")
	}
}

// register sends the boot's registration and holds readings back until it is answered or the
// ack timeout passes.
func (d *device) register(l link, now time.Time) {
	if err := l.Register(d.regPayload); err != nil {
		d.reg = regGaveUp
		d.log.Warn("sending registration", "err", err)
		return
	}
	d.reg = regWaiting
	d.regDeadline = now.Add(d.cfg.AckTimeout)
}

func (d *device) handle(l link, ev event, now time.Time) {
	switch ev.kind {
	case evConnected:
		if d.everConnected {
			d.log.Info("reconnected")
		} else {
			d.log.Info("connected")
		}
		d.connected, d.everConnected = true, true
		d.register(l, now)
	case evDisconnected:
		d.connected = false
		n := d.out.releaseAll()
		if n > 0 {
			d.stats.Retried[causeDisconnected] += n
		}
		if d.reg == regWaiting {
			d.reg = regNone
		}
		d.log.Warn("connection lost", "err", ev.err, "in_flight", n)
	case evRegisterFailed:
		if d.reg == regWaiting {
			d.reg = regGaveUp
		}
		d.log.Warn("registration not delivered; sending readings anyway", "err", ev.err)
	case evSendFailed:
		e := d.out.get(ev.batchID)
		if e == nil || !e.inflight {
			return // answered, dropped or already released meanwhile
		}
		d.out.release(e)
		d.stats.Retried[causeTransport]++
		d.failed(now, ev.retryAfter, "batch not delivered", ev.err, "batch_id", e.id)
	case evAck:
		d.handleAck(l, ev, now)
	}
}

// handleAck applies one answer of the gateway. Answers are matched to batches by batch_id;
// answers for batches the device no longer holds are ignored.
func (d *device) handleAck(l link, ev event, now time.Time) {
	a := ev.ack
	if a.Type == contract.AckTypeRegister || (a.BatchID == "" && a.Status == contract.StatusRegistered) {
		if a.Status == contract.StatusRegistered {
			d.reg = regDone
			d.stats.Registered = true
			d.log.Info("registered", "confirmation_id", a.ConfirmationID)
			return
		}
		if d.reg == regWaiting {
			d.reg = regGaveUp
		}
		d.log.Warn("registration refused; sending readings anyway",
			"status", string(a.Status), "reason", reasonOf(a.Reason), "message", deref(a.Message))
		return
	}

	e := d.out.get(a.BatchID)
	if e == nil {
		d.log.Debug("ignoring answer for a batch not in the buffer", "batch_id", a.BatchID, "status", string(a.Status))
		return
	}
	switch a.Status {
	case contract.StatusAccepted, contract.StatusDuplicate:
		d.out.remove(e.id)
		if a.Status == contract.StatusAccepted {
			d.stats.Accepted++
		} else {
			d.stats.Duplicates++
		}
		d.recovered(now)
		d.final(e, a)
	case contract.StatusRejected:
		reason := rejectionReason(a.Reason)
		switch reason {
		case string(contract.ReasonBufferFull):
			d.out.release(e)
			d.stats.Retried[reason]++
			d.failed(now, ev.retryAfter, "gateway buffer full, keeping the batch", nil, "batch_id", e.id)
		case string(contract.ReasonUnknownDevice):
			d.out.release(e)
			d.stats.Retried[reason]++
			d.failed(now, ev.retryAfter, "gateway does not know the device, registering again", nil, "batch_id", e.id)
			if d.reg != regWaiting {
				d.register(l, now)
			}
		default:
			d.out.remove(e.id)
			d.stats.Rejected[reason]++
			d.log.Error("batch rejected, dropping it", "batch_id", e.id, "reason", reason, "message", deref(a.Message))
			d.final(e, a)
		}
	default:
		d.out.release(e)
		d.stats.Retried[causeUnexpected]++
		d.failed(now, ev.retryAfter, "answer with an unknown status, keeping the batch", nil,
			"batch_id", e.id, "status", string(a.Status))
	}
}

// final records a batch's final answer in the report.
func (d *device) final(e *entry, a contract.Ack) {
	d.report.write(ReportLine{
		BatchID:          e.id,
		HardwareID:       d.gen.hardwareID,
		BootID:           d.gen.bootID,
		Seq:              e.seq,
		Status:           string(a.Status),
		Reason:           reasonOf(a.Reason),
		Message:          deref(a.Message),
		Readings:         e.readings,
		FirstTimestampMS: e.firstTS,
		LastTimestampMS:  e.lastTS,
		Attempts:         e.attempts,
	})
}

// failed records a failed attempt and schedules the next one after a backoff, or after the
// server's retry-after if that is longer. The first failure of a series is logged as a
// warning, the following ones at debug level, as the link is expected to be flaky.
func (d *device) failed(now time.Time, retryAfter time.Duration, msg string, err error, attrs ...any) {
	d.failures++
	wait := max(backoff(d.failures, d.cfg.RetryMin, d.cfg.RetryMax, d.jitter), retryAfter)
	d.nextAttempt = now.Add(wait)
	attrs = append(attrs, "retry_in", wait.Round(time.Millisecond))
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	if d.failures == 1 {
		d.failingSince = now
		d.log.Warn(msg, attrs...)
		return
	}
	d.log.Debug(msg, append(attrs, "failures", d.failures)...)
}

// recovered ends a series of failures, logging it once.
func (d *device) recovered(now time.Time) {
	if d.failures == 0 {
		return
	}
	d.log.Info("delivering again", "failures", d.failures, "after", now.Sub(d.failingSince).Round(time.Millisecond))
	d.failures = 0
	d.nextAttempt = time.Time{}
}

func (d *device) logSummary(msg string) {
	d.log.Info(msg,
		"built", d.stats.Built,
		"sent", d.stats.Sent,
		"accepted", d.stats.Accepted,
		"duplicates", d.stats.Duplicates,
		"rejected", formatCounts(d.stats.Rejected),
		"retried", formatCounts(d.stats.Retried),
		"overflow", d.stats.Overflow,
		"pending", d.out.len(),
		"connected", d.connected,
	)
}

// reasonOf returns the reason of an ack, or "" if it has none.
func reasonOf(r *contract.Reason) string {
	if r == nil {
		return ""
	}
	return string(*r)
}

// rejectionReason returns the reason of a rejection for counting: "unspecified" if it has none.
func rejectionReason(r *contract.Reason) string {
	if r == nil || *r == "" {
		return "unspecified"
	}
	return string(*r)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

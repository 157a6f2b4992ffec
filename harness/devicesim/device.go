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

	"github.com/google/uuid"

	"greenhouse-gateway/firmware-contract"
)

// Causes of a retry, as counted in [DeviceStats.Retried]. The contract's rejection reasons
// that lead to a retry ("buffer_full", "unknown_device") are counted under their own name.
const (
	causeTimeout      = "timeout"      // no answer within the ack timeout
	causeTransport    = "transport"    // not connected, network error, retryable HTTP status
	causeDisconnected = "disconnected" // the connection was lost while the batch was in flight
	causeUnexpected   = "unexpected"   // an answer with a status the contract does not know
	causeReboot       = "reboot"       // the device rebooted while the batch was in flight
)

// What key a device uses, as reported in [DeviceStats.Key].
const (
	keyFleet    = "fleet"    // the fleet key (Config.APIKey): no device key yet
	keyStored   = "stored"   // its device key, read from the key store at start
	keyEnrolled = "enrolled" // its device key, received in a register answer during this run
)

// eventBuffer is the capacity of a device's event channel.
const eventBuffer = 256

// DeviceStats counts what one simulated device did during a run.
type DeviceStats struct {
	// HardwareID identifies the device; BootID is its current (last) boot.
	HardwareID string
	BootID     string
	// Reboots is the number of times the device rebooted (Config.RebootEvery).
	Reboots int
	// Registered reports whether the gateway confirmed a registration of the current boot.
	Registered bool
	// Registrations counts the registrations the gateway confirmed, over all boots.
	Registrations int
	// ConfirmationID is the confirmation_id of the last confirmed registration that carried
	// one; empty if none did.
	ConfirmationID string
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
	// "buffer_full", "unknown_device", "forbidden", "device_key_required", "timeout",
	// "transport", "disconnected", "reboot", "unexpected".
	Retried map[string]int
	// Overflow is the number of unconfirmed batches dropped because the offline buffer was full.
	Overflow int
	// Pending is the number of unconfirmed batches left in the buffer when the device stopped.
	Pending int
	// Key is the key the device used last: "fleet" (Config.APIKey), "stored" (its device key
	// from the key store) or "enrolled" (its device key, issued in a register answer during
	// the run). DeviceKeyID is the key_id of a device key issued during the run.
	Key         string
	DeviceKeyID string
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
	regNone     regState = iota // not sent on this connection
	regWaiting                  // sent, readings held back until the answer or regDeadline
	regRetrying                 // sent again, waiting for the answer until regDeadline; readings go
	regDone                     // confirmed by the gateway
	regGaveUp                   // not confirmed; readings are sent anyway, and regRetryAt, if set, registers again
)

// device is one simulated ESP32: a sampling generator, an offline buffer and a link, driven
// by one goroutine. A reboot keeps the offline buffer (flash), the counters and the
// confirmation_id, and resets everything else a real device holds in RAM.
type device struct {
	cfg        *Config
	log        *slog.Logger
	gen        *generator
	out        *outbox
	dial       dialFunc
	report     *reportWriter
	jitter     *rand.Rand // backoff jitter
	rebootRNG  *rand.Rand // time between reboots
	now        func() time.Time
	newBootID  func() (string, error)
	regPayload []byte
	keys       *keyStore
	key        string // the MQTT password / HTTP bearer token: the device key once it has one
	redial     bool   // a new key was stored: reconnect with it

	stats DeviceStats

	connected     bool
	everConnected bool
	reg           regState
	regDeadline   time.Time
	regFailures   int       // consecutive registrations of this boot not confirmed
	regRetryAt    time.Time // when a registration not confirmed is sent again; zero: not

	failures     int       // consecutive failed attempts
	failingSince time.Time // first of those failures
	nextAttempt  time.Time // no batch is sent before this time

	producing  bool
	stopAt     time.Time // when producing stops (Duration); zero: never
	drainUntil time.Time // when a device that stopped producing gives up on its buffer
	rebootAt   time.Time // when the device reboots next; zero: never
}

// randomBootID draws a boot_id: a random UUID v4.
func randomBootID() (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// newDevice prepares a device. jitter drives the backoff and rebootRNG the time between
// reboots, so that reboot times depend on the seed only, not on what the network does. The
// device uses its key from keys if it has one there, the fleet key otherwise.
func newDevice(cfg *Config, logger *slog.Logger, gen *generator, dial dialFunc, report *reportWriter, keys *keyStore, jitter, rebootRNG *rand.Rand, now func() time.Time) (*device, error) {
	regPayload, err := json.Marshal(gen.registration())
	if err != nil {
		return nil, fmt.Errorf("encoding registration of %s: %w", gen.hardwareID, err)
	}
	key, source := cfg.APIKey, keyFleet
	if stored, ok := keys.get(gen.hardwareID); ok {
		key, source = stored, keyStored
	}
	return &device{
		cfg:        cfg,
		log:        logger.With("hardware_id", gen.hardwareID),
		gen:        gen,
		out:        newOutbox(cfg.BufferSize),
		dial:       dial,
		report:     report,
		jitter:     jitter,
		rebootRNG:  rebootRNG,
		now:        now,
		newBootID:  randomBootID,
		regPayload: regPayload,
		keys:       keys,
		key:        key,
		stats: DeviceStats{
			HardwareID: gen.hardwareID,
			BootID:     gen.bootID,
			Rejected:   map[string]int{},
			Retried:    map[string]int{},
			Key:        source,
		},
	}, nil
}

// run drives the device until ctx is done, or until it stopped producing and its buffer is
// empty or the drain timeout passed. It returns the device's counters. Batches and Duration
// count over the whole run, across reboots.
func (d *device) run(ctx context.Context) (DeviceStats, error) {
	linkCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan event, eventBuffer)
	l, err := d.dial(linkCtx, d.gen.hardwareID, d.key, events)
	if err != nil {
		return d.stats, fmt.Errorf("devicesim: setting up the link of %s: %w", d.gen.hardwareID, err)
	}

	start := d.now()
	d.producing = true
	if d.cfg.Duration > 0 {
		d.stopAt = start.Add(d.cfg.Duration)
	}
	d.scheduleReboot(start)
	d.log.Info("device booted", "boot_id", d.gen.bootID, "key", d.stats.Key)

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

	var runErr error
	stopped := false
	for !stopped {
		now := d.now()
		d.advance(now)
		if d.finished(now) {
			break
		}
		if d.rebootDue(now) {
			l, runErr = d.reboot(linkCtx, l, events, now)
			if runErr != nil {
				break
			}
			ticker.Reset(d.cfg.Interval) // the sampling timer starts again with the boot
			continue
		}
		if d.redial {
			l, runErr = d.reconnect(linkCtx, l, events)
			if runErr != nil {
				break
			}
			continue
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
	if l != nil {
		if err := l.Close(); err != nil {
			d.log.Warn("closing connection", "err", err)
		}
	}
	d.stats.Pending = d.out.len()
	if d.stats.Pending > 0 {
		d.log.Info("device stopped with unconfirmed batches", "pending", d.stats.Pending)
	}
	return d.stats, runErr
}

// scheduleReboot sets the time of the next reboot for a boot that started at boot:
// RebootEvery ± RebootJitter, unless reboots are off or their cap is reached.
func (d *device) scheduleReboot(boot time.Time) {
	d.rebootAt = time.Time{}
	if d.cfg.RebootEvery <= 0 || (d.cfg.Reboots > 0 && d.stats.Reboots >= d.cfg.Reboots) {
		return
	}
	d.rebootAt = boot.Add(rebootDelay(d.cfg.RebootEvery, d.rebootRNG))
}

// rebootDelay returns a boot's lifetime: a uniform random time in every ± RebootJitter.
func rebootDelay(every time.Duration, rng *rand.Rand) time.Duration {
	spread := time.Duration(float64(every) * RebootJitter)
	return every - spread + time.Duration(rng.Int64N(int64(2*spread)+1))
}

func (d *device) rebootDue(now time.Time) bool {
	return !d.rebootAt.IsZero() && !now.Before(d.rebootAt)
}

// reboot restarts the device at now as a reset ESP32 does. The connection is dropped without
// a clean disconnect and what the device held in RAM is lost: answers not yet handled, the
// batches it was waiting for (they are sent again), the registration state, the backoff. The
// offline buffer is in flash and survives, its batches keeping their boot_id, batch_id and
// seq; being the oldest, they are sent first. The new boot has a new boot_id, seq and uptime
// from 0, no NTP time for ClockSyncAfter, and registers as soon as it is connected.
// It returns the new link.
func (d *device) reboot(ctx context.Context, old link, events chan event, now time.Time) (link, error) {
	if err := old.Drop(); err != nil {
		d.log.Warn("dropping the connection", "err", err)
	}
	// Nothing arrives from the old link any more; what it already delivered died with the RAM.
	for discarding := true; discarding; {
		select {
		case <-events:
		default:
			discarding = false
		}
	}

	bootID, err := d.newBootID()
	if err != nil {
		return nil, fmt.Errorf("devicesim: boot id for %s: %w", d.gen.hardwareID, err)
	}
	prev := d.gen.bootID
	d.gen.reboot(bootID, now)
	regPayload, err := json.Marshal(d.gen.registration())
	if err != nil {
		return nil, fmt.Errorf("devicesim: encoding registration of %s: %w", d.gen.hardwareID, err)
	}
	d.regPayload = regPayload

	lost := d.out.releaseAll()
	if lost > 0 {
		d.stats.Retried[causeReboot] += lost
	}
	d.stats.Reboots++
	d.stats.BootID = bootID
	d.stats.Registered = false
	d.connected, d.everConnected = false, false
	d.reg, d.regDeadline, d.regFailures, d.regRetryAt = regNone, time.Time{}, 0, time.Time{}
	d.failures, d.failingSince, d.nextAttempt = 0, time.Time{}, time.Time{}
	d.scheduleReboot(now)

	d.log.Info("device rebooted", "boot_id", bootID, "previous_boot_id", prev, "reboots", d.stats.Reboots,
		"kept_batches", d.out.len(), "in_flight_lost", lost)
	l, err := d.dial(ctx, d.gen.hardwareID, d.key, events)
	if err != nil {
		return nil, fmt.Errorf("devicesim: setting up the link of %s: %w", d.gen.hardwareID, err)
	}
	return l, nil
}

// reconnect closes the link cleanly and dials a new one with the device's key, as firmware
// does once it has stored the device key it was issued: over MQTT a new session with the key
// as password, over HTTP the key as bearer token. Answers already received stay queued and
// count; batches in flight are sent again (a resend is answered "duplicate"), and the new
// connection registers again, with the device key.
func (d *device) reconnect(ctx context.Context, old link, events chan event) (link, error) {
	d.redial = false
	if err := old.Close(); err != nil {
		d.log.Warn("closing the connection", "err", err)
	}
	if n := d.out.releaseAll(); n > 0 {
		d.stats.Retried[causeDisconnected] += n
	}
	d.connected = false
	if d.reg == regWaiting || d.reg == regRetrying {
		d.reg = regNone
	}
	l, err := d.dial(ctx, d.gen.hardwareID, d.key, events)
	if err != nil {
		return nil, fmt.Errorf("devicesim: setting up the link of %s: %w", d.gen.hardwareID, err)
	}
	return l, nil
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
	if (d.reg == regWaiting || d.reg == regRetrying) && !now.Before(d.regDeadline) {
		d.registrationFailed(now, 0, "registration not answered within the ack timeout", nil)
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
// deliver (no batch, no registration waiting for its answer) or no time left to deliver it.
func (d *device) finished(now time.Time) bool {
	registering := d.reg == regWaiting || d.reg == regRetrying
	return !d.producing && ((d.out.len() == 0 && !registering) || !now.Before(d.drainUntil))
}

// pump sends the oldest unsent batches while the link is up, the backoff has passed and fewer
// than MaxInflight batches wait for their answer.
//
// It also sends again a registration that was not confirmed, when its backoff has passed.
func (d *device) pump(l link, now time.Time) {
	if d.connected && d.reg == regGaveUp && !d.regRetryAt.IsZero() && !now.Before(d.regRetryAt) {
		d.register(l, now, false)
	}
	if !d.connected || d.reg == regWaiting || now.Before(d.nextAttempt) {
		return
	}
	for d.out.inflight < d.cfg.MaxInflight {
		e := d.out.nextUnsent()
		if e == nil {
			return
		}
		payload, err := e.encode(e.uptime(now))
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
	if d.reg == regWaiting || d.reg == regRetrying {
		consider(d.regDeadline)
	}
	if d.connected && d.reg == regGaveUp && !d.regRetryAt.IsZero() {
		consider(d.regRetryAt)
	}
	if now.Before(d.nextAttempt) && d.out.len() > d.out.inflight {
		consider(d.nextAttempt)
	}
	if d.producing && !d.stopAt.IsZero() {
		consider(d.stopAt)
	}
	if !d.rebootAt.IsZero() {
		consider(d.rebootAt)
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
	e := d.gen.entry(now)
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

// register sends the boot's registration. With hold (the first registration of a connection,
// or after "unknown_device") readings are held back until it is answered or the ack timeout
// passes; a retry of a registration that was not confirmed does not hold them.
func (d *device) register(l link, now time.Time, hold bool) {
	d.regRetryAt = time.Time{}
	if err := l.Register(d.regPayload); err != nil {
		d.registrationFailed(now, 0, "sending registration", err)
		return
	}
	d.reg = regRetrying
	if hold {
		d.reg = regWaiting
	}
	d.regDeadline = now.Add(d.cfg.AckTimeout)
}

// registrationFailed records a registration of this boot that was not confirmed for a reason
// that may pass (not delivered, not answered, buffer_full): readings go anyway, and the
// registration is sent again after a backoff, or after the server's retry-after if longer.
// The first failure of a series is a warning, the following ones are logged at debug level.
func (d *device) registrationFailed(now time.Time, retryAfter time.Duration, msg string, err error, attrs ...any) {
	d.registrationFailedAt(slog.LevelWarn, now, retryAfter, msg, err, attrs...)
}

// registrationFailedAt is registrationFailed with the first failure of a series logged at
// level.
func (d *device) registrationFailedAt(level slog.Level, now time.Time, retryAfter time.Duration, msg string, err error, attrs ...any) {
	d.reg = regGaveUp
	d.regFailures++
	wait := max(backoff(d.regFailures, d.cfg.RetryMin, d.cfg.RetryMax, d.jitter), retryAfter)
	d.regRetryAt = now.Add(wait)
	attrs = append(attrs, "boot_id", d.gen.bootID, "register_again_in", wait.Round(time.Millisecond))
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	if d.regFailures == 1 {
		d.log.Log(context.Background(), level, msg+"; sending readings anyway", attrs...)
		return
	}
	d.log.Debug(msg+"; sending readings anyway", append(attrs, "failures", d.regFailures)...)
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
		d.register(l, now, true)
	case evDisconnected:
		d.connected = false
		n := d.out.releaseAll()
		if n > 0 {
			d.stats.Retried[causeDisconnected] += n
		}
		if d.reg == regWaiting || d.reg == regRetrying {
			d.reg = regNone // registered again on reconnect
		}
		d.log.Warn("connection lost", "err", ev.err, "in_flight", n)
	case evRegisterFailed:
		if d.reg != regWaiting && d.reg != regRetrying {
			d.log.Debug("ignoring a failure of an earlier registration", "err", ev.err)
			return
		}
		d.registrationFailed(now, ev.retryAfter, "registration not delivered", ev.err)
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
			d.registered(a.ConfirmationID, ev.httpStatus)
			if a.DeviceKey != "" || a.DeviceKeyID != "" {
				d.enroll(a.DeviceKey, a.DeviceKeyID)
			}
			return
		}
		reason := rejectionReason(a.Reason)
		if d.reg == regDone {
			d.log.Debug("ignoring a rejection of an earlier registration", "reason", reason)
			return
		}
		if reason == string(contract.ReasonBufferFull) {
			d.registrationFailed(now, ev.retryAfter, "registration rejected", nil,
				"reason", reason, "message", deref(a.Message))
			return
		}
		if keyRefusal(reason) {
			// Sent again after RetryMax: an operator's reset-key lets it enroll then.
			d.registrationFailedAt(slog.LevelError, now, d.cfg.RetryMax, "registration refused: "+d.refusalHint(reason), nil,
				"reason", reason, "message", deref(a.Message), "key", d.stats.Key)
			return
		}
		// Sending the same registration again would be rejected again: not before the next boot
		// or reconnect.
		d.reg, d.regRetryAt = regGaveUp, time.Time{}
		d.log.Warn("registration rejected; sending readings anyway", "boot_id", d.gen.bootID,
			"status", string(a.Status), "reason", reason, "message", deref(a.Message))
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
				d.register(l, now, true)
			}
		case string(contract.ReasonForbidden), string(contract.ReasonDeviceKeyRequired):
			// The batch is fine, the key is not: keep it, and do not hammer the gateway.
			d.out.release(e)
			d.stats.Retried[reason]++
			d.failedAt(slog.LevelError, now, max(ev.retryAfter, d.cfg.RetryMax), "batch refused, keeping it: "+d.refusalHint(reason),
				nil, "batch_id", e.id, "reason", reason, "message", deref(a.Message), "key", d.stats.Key)
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

// registered applies a confirmed registration. The confirmation_id is kept and logged the
// first time; the contract keeps it stable, so a different one is worth a warning. Later
// confirmations (reconnects, reboots) are logged at debug level.
func (d *device) registered(confirmationID string, httpStatus int) {
	if d.regFailures > 0 {
		d.log.Info("registration confirmed after failures", "failures", d.regFailures)
	}
	d.reg, d.regFailures, d.regRetryAt = regDone, 0, time.Time{}
	d.stats.Registered = true
	d.stats.Registrations++
	attrs := []any{"boot_id", d.gen.bootID}
	if httpStatus != 0 {
		attrs = append(attrs, "http_status", httpStatus)
	}
	prev := d.stats.ConfirmationID
	switch {
	case confirmationID == "" && d.stats.Registrations == 1:
		d.log.Info("registered; the answer carried no confirmation_id", attrs...)
	case confirmationID == "" || confirmationID == prev:
		d.log.Debug("registration confirmed", append(attrs, "registrations", d.stats.Registrations)...)
	case prev == "":
		d.stats.ConfirmationID = confirmationID
		d.log.Info("registered", append(attrs, "confirmation_id", confirmationID)...)
	default:
		d.stats.ConfirmationID = confirmationID
		d.log.Warn("the gateway answered a different confirmation_id",
			append(attrs, "confirmation_id", confirmationID, "previous_confirmation_id", prev)...)
	}
}

// enroll applies the device key of an enrolling register answer as firmware does: it checks
// its form, stores it (the key store is the device's NVS) and only then uses it, reconnecting
// with it. The key is never logged. A key that cannot be stored is not used: the device keeps
// its fleet key, which the gateway accepts until the device has used its device key once.
func (d *device) enroll(key, keyID string) {
	if !validDeviceKey(key) || contract.ValidUUIDv4(keyID) != nil {
		d.log.Error("ignoring a device key in the register answer: device_key must be 64 lower-case hexadecimal "+
			"digits and device_key_id a UUID v4, both present", "device_key_id", keyID)
		return
	}
	if err := d.keys.put(d.gen.hardwareID, key); err != nil {
		d.log.Error("could not store the device key the gateway issued; going on with the current key "+
			"(if the gateway binds the device, an operator runs gatewayctl devices reset-key)", "device_key_id", keyID, "err", err)
		return
	}
	prev := d.stats.Key
	d.key, d.redial = key, true
	d.stats.Key, d.stats.DeviceKeyID = keyEnrolled, keyID
	d.log.Info("enrolled: the gateway issued the device its own key; stored it, reconnecting with it",
		"device_key_id", keyID, "previous_key", prev, "key_store", d.keys.where())
}

// keyRefusal reports whether a rejection reason refuses the device's key for its hardware_id.
func keyRefusal(reason string) bool {
	return reason == string(contract.ReasonForbidden) || reason == string(contract.ReasonDeviceKeyRequired)
}

// refusalHint says what a refusal of the device's key means and what fixes it.
func (d *device) refusalHint(reason string) string {
	switch {
	case reason == string(contract.ReasonForbidden):
		return "the key is bound to another hardware_id (a configuration problem: check the key store and --api-key)"
	case d.stats.Key == keyFleet:
		return "the gateway wants the device's own device key, and the device has none " +
			"(lost: an operator runs gatewayctl devices reset-key, and the device enrolls at its next registration)"
	default:
		return "the gateway refuses the device key for this device (a configuration problem)"
	}
}

// final records a batch's final answer in the report, with the batch's own boot_id (which
// is not the current one for a batch built before a reboot).
func (d *device) final(e *entry, a contract.Ack) {
	d.report.write(ReportLine{
		BatchID:          e.id,
		HardwareID:       d.gen.hardwareID,
		BootID:           e.batch.BootID,
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
	d.failedAt(slog.LevelWarn, now, retryAfter, msg, err, attrs...)
}

// failedAt is failed with the first failure of a series logged at level.
func (d *device) failedAt(level slog.Level, now time.Time, retryAfter time.Duration, msg string, err error, attrs ...any) {
	d.failures++
	wait := max(backoff(d.failures, d.cfg.RetryMin, d.cfg.RetryMax, d.jitter), retryAfter)
	d.nextAttempt = now.Add(wait)
	attrs = append(attrs, "retry_in", wait.Round(time.Millisecond))
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	if d.failures == 1 {
		d.failingSince = now
		d.log.Log(context.Background(), level, msg, attrs...)
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
		"boot_id", d.gen.bootID,
		"reboots", d.stats.Reboots,
		"registered", d.stats.Registered,
		"built", d.stats.Built,
		"sent", d.stats.Sent,
		"accepted", d.stats.Accepted,
		"duplicates", d.stats.Duplicates,
		"rejected", formatCounts(d.stats.Rejected),
		"retried", formatCounts(d.stats.Retried),
		"overflow", d.stats.Overflow,
		"pending", d.out.len(),
		"connected", d.connected,
		"key", d.stats.Key,
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

//go:build linux

package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/fleetgen"
)

// MQTT client settings.
const (
	connectParallel = 32               // connections opened at once
	connectTimeout  = 15 * time.Second // bound on CONNECT and on SUBSCRIBE
	answerTimeout   = 30 * time.Second // a PUBACK or ack later than this is an error
	settleTimeout   = 30 * time.Second // bound on waiting for answers after the load
	maxOutstanding  = 64               // open loop: batches in flight per device
)

// fleetSpec describes a fleet of MQTT devices.
type fleetSpec struct {
	addr     string
	fleet    byte // keeps the hardware_ids of runs apart
	devices  int
	readings int    // per batch
	key      string // API key; empty: anonymous (mosquitto)
	// waitAck makes a batch complete only when the ack-topic message has
	// arrived too (gatewayd's durable acknowledgement); otherwise the
	// PUBACK completes it (mosquitto).
	waitAck bool
	// sources, when above 0, spreads the devices over that many loopback
	// addresses (127.0.1.1 on), each client's socket bound to its own, as
	// devices behind one access point arrive from many addresses.
	sources int
	// parallel is how many connections are opened at once; 0 is
	// connectParallel.
	parallel int
}

// fleet is a set of connected devices, each its own paho client.
type fleet struct {
	spec    fleetSpec
	devices []*mqttDevice
	lost    atomic.Int64
	run     atomic.Pointer[loadRun]
	// Connect is how long connecting and subscribing every device took.
	connect time.Duration
}

type mqttDevice struct {
	f      *fleet
	hw     string
	gen    *fleetgen.Device
	client paho.Client
	topic  string
	local  *net.TCPAddr // source address; nil: the system's choice

	mu       sync.Mutex
	inflight map[string]*flight
}

// flight is one published batch waiting for its answers.
type flight struct {
	sent  time.Time
	acked chan struct{} // closed when the ack-topic message arrived
	once  sync.Once
	ackAt time.Time // valid after acked is closed
}

// connectFleet connects spec.devices clients and subscribes each to its ack
// topic at QoS 1.
func connectFleet(ctx context.Context, spec fleetSpec) (*fleet, error) {
	f := &fleet{spec: spec}
	begin := time.Now()
	start := begin.Add(-48 * time.Hour)
	for i := range spec.devices {
		hw := fleetgen.HardwareID(spec.fleet, i)
		f.devices = append(f.devices, &mqttDevice{f: f, hw: hw, gen: fleetgen.NewDevice(hw, start, uint64(i)),
			topic: contract.ReadingsTopic(hw), inflight: map[string]*flight{}})
	}
	sem := make(chan struct{}, cmp.Or(spec.parallel, connectParallel))
	errs := make(chan error, len(f.devices))
	var wg sync.WaitGroup
	for i, d := range f.devices {
		if spec.sources > 0 {
			d.local = sourceAddr(i % spec.sources)
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if ctx.Err() != nil {
				errs <- ctx.Err()
				return
			}
			errs <- d.connect()
		})
	}
	wg.Wait()
	close(errs)
	var first error
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			first = cmp.Or(first, err)
		}
	}
	if failed > 0 {
		f.disconnect()
		return nil, fmt.Errorf("%d of %d devices did not connect (from %d source addresses); the first: %w",
			failed, len(f.devices), max(spec.sources, 1), first)
	}
	f.connect = time.Since(begin)
	return f, nil
}

func (d *mqttDevice) connect() error {
	opts := paho.NewClientOptions().AddBroker("tcp://" + d.f.spec.addr).SetClientID(d.hw).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(connectTimeout).SetKeepAlive(60 * time.Second).SetWriteTimeout(answerTimeout).
		SetOrderMatters(false).
		SetConnectionLostHandler(func(paho.Client, error) { d.f.lost.Add(1) })
	if d.local != nil {
		opts.SetDialer(&net.Dialer{Timeout: connectTimeout, LocalAddr: d.local})
	}
	if d.f.spec.key != "" {
		opts.SetUsername(d.hw).SetPassword(d.f.spec.key)
	}
	d.client = paho.NewClient(opts)
	tok := d.client.Connect()
	if !tok.WaitTimeout(connectTimeout) {
		return fmt.Errorf("connecting %s to %s: no CONNACK within %s", d.hw, d.f.spec.addr, connectTimeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("connecting %s to %s: %w", d.hw, d.f.spec.addr, err)
	}
	sub := d.client.Subscribe(contract.AckTopic(d.hw), 1, d.onAck)
	if !sub.WaitTimeout(connectTimeout) {
		return fmt.Errorf("subscribing %s: no SUBACK within %s", d.hw, connectTimeout)
	}
	if err := sub.Error(); err != nil {
		return fmt.Errorf("subscribing %s: %w", d.hw, err)
	}
	return nil
}

// sourceAddr is the i-th loopback source address of a fleet spread over
// many: 127.0.1.1, 127.0.1.2, ... (250 to a /24).
func sourceAddr(i int) *net.TCPAddr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, byte(1+i/250), byte(1+i%250))}
}

// held counts the devices whose client is still connected.
func (f *fleet) held() int {
	n := 0
	for _, d := range f.devices {
		if d.client != nil && d.client.IsConnected() {
			n++
		}
	}
	return n
}

// disconnect disconnects every connected client.
func (f *fleet) disconnect() {
	var wg sync.WaitGroup
	for _, d := range f.devices {
		if d.client != nil && d.client.IsConnected() {
			wg.Go(func() { d.client.Disconnect(50) })
		}
	}
	wg.Wait()
}

func (d *mqttDevice) onAck(_ paho.Client, m paho.Message) {
	now := time.Now()
	var a struct {
		BatchID string  `json:"batch_id"`
		Status  string  `json:"status"`
		Reason  *string `json:"reason"`
	}
	if json.Unmarshal(m.Payload(), &a) != nil {
		return
	}
	d.mu.Lock()
	fl := d.inflight[a.BatchID]
	d.mu.Unlock()
	if fl == nil {
		return
	}
	status := a.Status
	if a.Reason != nil {
		status += "/" + *a.Reason
	}
	if r := d.f.run.Load(); r != nil {
		r.status(status)
	}
	fl.once.Do(func() {
		fl.ackAt = now
		close(fl.acked)
	})
}

// loadRun is one timed load on a fleet: a warm-up, then the measured
// window [t0, t1).
type loadRun struct {
	t0, t1  time.Time
	puback  latencies
	ack     latencies
	sent    atomic.Int64 // published within the window
	done    atomic.Int64 // completed within the window
	errors  atomic.Int64 // no PUBACK, or no ack, within answerTimeout
	skipped atomic.Int64 // open loop: not sent, maxOutstanding in flight
	mu      sync.Mutex
	answers map[string]int64
	// perSecond holds the completion latencies (ack, else PUBACK) by the
	// second of the window they were sent in.
	perSecond map[int][]time.Duration
}

// second records a completion latency by the second it was sent in.
func (r *loadRun) second(sent time.Time, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.perSecond == nil {
		r.perSecond = map[int][]time.Duration{}
	}
	i := int(sent.Sub(r.t0) / time.Second)
	r.perSecond[i] = append(r.perSecond[i], d)
}

// secondStats is the latency of the batches sent in one second of the
// window.
type secondStats struct {
	Second int     `json:"second"`
	Count  int     `json:"count"`
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	Max    float64 `json:"max_ms"`
}

func (r *loadRun) series() []secondStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []secondStats
	for i, d := range r.perSecond {
		slices.Sort(d)
		out = append(out, secondStats{Second: i, Count: len(d), P50: ms(quantile(d, 0.5)), P99: ms(quantile(d, 0.99)), Max: ms(d[len(d)-1])})
	}
	slices.SortFunc(out, func(a, b secondStats) int { return a.Second - b.Second })
	return out
}

func (r *loadRun) status(s string) {
	r.mu.Lock()
	r.answers[s]++
	r.mu.Unlock()
}

func (r *loadRun) inWindow(t time.Time) bool { return !t.Before(r.t0) && t.Before(r.t1) }

// loadResult is what a load run measured.
type loadResult struct {
	Devices        int              `json:"devices"`
	Inflight       int              `json:"inflight_per_device,omitempty"`
	OfferedPerSec  float64          `json:"offered_batches_per_s,omitempty"`
	WindowSeconds  float64          `json:"window_s"`
	Sent           int64            `json:"sent"`
	Completed      int64            `json:"completed"`
	BatchesPerSec  float64          `json:"batches_per_s"`
	ReadingsPerSec float64          `json:"readings_per_s"`
	Ack            summary          `json:"ack_latency,omitempty"` // publish → ack-topic message
	Puback         summary          `json:"puback_latency"`        // publish → PUBACK
	Errors         int64            `json:"errors"`
	Skipped        int64            `json:"skipped,omitempty"`
	LostConns      int64            `json:"lost_connections"`
	Answers        map[string]int64 `json:"answers,omitempty"`
	ConnectSeconds float64          `json:"connect_s"`
	ServerCPU      float64          `json:"server_cpu_s"`
	// ClientCPU is the CPU time the benchmark process (the load
	// generator) used in the window.
	ClientCPU float64 `json:"client_cpu_s"`
	// PerSecond is the completion latency (ack, else PUBACK) of the
	// batches sent in each second of the window.
	PerSecond []secondStats `json:"per_second,omitempty"`
}

// loadHooks run at the start and the end of the measured window (CPU and
// metrics snapshots of the server).
type loadHooks struct {
	start, end func()
}

// closedLoop keeps inflight batches in flight per device: a device sends its
// next batch when one completes. It warms up for warmup, then measures for
// window.
func (f *fleet) closedLoop(ctx context.Context, inflight int, warmup, window time.Duration, hooks loadHooks) (loadResult, error) {
	r := f.newRun(warmup, window)
	var wg sync.WaitGroup
	for _, d := range f.devices {
		slots := make(chan struct{}, inflight)
		for range inflight {
			slots <- struct{}{}
		}
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-slots:
				}
				now := time.Now()
				if !now.Before(r.t1) {
					return
				}
				if !d.client.IsConnectionOpen() {
					r.errors.Add(1) // counted in lost connections too
					return
				}
				if err := d.publish(r, now, func() { slots <- struct{}{} }); err != nil {
					r.errors.Add(1)
					return
				}
			}
		})
	}
	return f.finish(ctx, r, &wg, hooks, loadResult{Inflight: inflight})
}

// openLoop sends rate batches per second in all, spread over the devices
// with random phases, whatever the answers do (latency is measured from
// the scheduled send time, so a slow server shows as latency).
func (f *fleet) openLoop(ctx context.Context, rate float64, warmup, window time.Duration, hooks loadHooks) (loadResult, error) {
	r := f.newRun(warmup, window)
	period := time.Duration(float64(time.Second) * float64(len(f.devices)) / rate)
	begin := time.Now()
	var wg sync.WaitGroup
	for _, d := range f.devices {
		n := new(atomic.Int64) // the device's batches in flight
		next := begin.Add(time.Duration(rand.Int64N(int64(period))))
		wg.Go(func() {
			t := time.NewTimer(time.Until(next))
			defer t.Stop()
			for next.Before(r.t1) {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if !d.client.IsConnectionOpen() {
					r.errors.Add(1)
					return
				}
				if n.Load() >= maxOutstanding {
					r.skipped.Add(1)
				} else {
					n.Add(1)
					if err := d.publish(r, next, func() { n.Add(-1) }); err != nil {
						r.errors.Add(1)
						return
					}
				}
				next = next.Add(period)
				t.Reset(time.Until(next))
			}
		})
	}
	return f.finish(ctx, r, &wg, hooks, loadResult{OfferedPerSec: rate})
}

// primeTimeout bounds the wait for the first batch of every device.
const primeTimeout = 3 * time.Minute

// primeResult is how the first batch of every device went.
type primeResult struct {
	Devices int     `json:"devices"`
	Seconds float64 `json:"all_answered_s"` // until the last device's batch completed
	Latency summary `json:"latency"`        // per device: publish → completion
	Errors  int64   `json:"errors"`
}

// prime has every device send one batch at the same moment and waits until
// all have completed: the first batch of a fresh boot_id from a whole
// fleet, as after a power cut in the greenhouse. The loads measure steady
// state after it.
func (f *fleet) prime(ctx context.Context) (primeResult, error) {
	begin := time.Now()
	r := &loadRun{t0: begin, t1: begin.Add(primeTimeout), answers: map[string]int64{}}
	f.run.Store(r)
	done := make(chan struct{}, len(f.devices))
	var lat latencies
	for _, d := range f.devices {
		sent := time.Now()
		if err := d.publish(r, sent, func() {
			lat.add(time.Since(sent))
			done <- struct{}{}
		}); err != nil {
			return primeResult{}, err
		}
	}
	timeout := time.NewTimer(primeTimeout)
	defer timeout.Stop()
	for range f.devices {
		select {
		case <-done:
		case <-ctx.Done():
			return primeResult{}, ctx.Err()
		case <-timeout.C:
			return primeResult{}, fmt.Errorf("the first batches of %d devices not answered within %s", len(f.devices), primeTimeout)
		}
	}
	return primeResult{Devices: len(f.devices), Seconds: time.Since(begin).Seconds(), Latency: lat.summary(),
		Errors: r.errors.Load()}, nil
}

func (f *fleet) newRun(warmup, window time.Duration) *loadRun {
	t0 := time.Now().Add(warmup)
	r := &loadRun{t0: t0, t1: t0.Add(window), answers: map[string]int64{}}
	f.run.Store(r)
	return r
}

// finish runs the hooks at the window's edges, waits for the senders and
// for the answers of what they sent, and sums up.
func (f *fleet) finish(ctx context.Context, r *loadRun, senders *sync.WaitGroup, hooks loadHooks, res loadResult) (loadResult, error) {
	sleepUntil(ctx, r.t0)
	if hooks.start != nil {
		hooks.start()
	}
	sleepUntil(ctx, r.t1)
	if hooks.end != nil {
		hooks.end()
	}
	senders.Wait()
	// Wait for the answers of every batch in flight.
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) && ctx.Err() == nil && f.inflight() > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	window := r.t1.Sub(r.t0).Seconds()
	res.Devices = len(f.devices)
	res.WindowSeconds = window
	res.Sent = r.sent.Load()
	res.Completed = r.done.Load()
	res.BatchesPerSec = float64(res.Completed) / window
	res.ReadingsPerSec = res.BatchesPerSec * float64(f.spec.readings)
	res.Puback = r.puback.summary()
	if f.spec.waitAck {
		res.Ack = r.ack.summary()
	}
	res.Errors = r.errors.Load() + int64(f.inflight())
	res.Skipped = r.skipped.Load()
	res.LostConns = f.lost.Load()
	res.Answers = r.answers
	res.ConnectSeconds = f.connect.Seconds()
	res.PerSecond = r.series()
	return res, nil
}

func (f *fleet) inflight() int {
	n := 0
	for _, d := range f.devices {
		d.mu.Lock()
		n += len(d.inflight)
		d.mu.Unlock()
	}
	return n
}

// publish sends the device's next batch at QoS 1, as if at time sent, and
// calls release once its answers are in (or timed out).
func (d *mqttDevice) publish(r *loadRun, sent time.Time, release func()) error {
	id, payload, err := d.gen.Next(d.f.spec.readings)
	if err != nil {
		return err
	}
	fl := &flight{sent: sent, acked: make(chan struct{})}
	d.mu.Lock()
	d.inflight[id] = fl
	d.mu.Unlock()
	if r.inWindow(sent) {
		r.sent.Add(1)
	}
	tok := d.client.Publish(d.topic, 1, false, payload)
	go func() {
		defer release()
		defer func() {
			d.mu.Lock()
			delete(d.inflight, id)
			d.mu.Unlock()
		}()
		if !tok.WaitTimeout(answerTimeout) || tok.Error() != nil {
			r.errors.Add(1)
			return
		}
		pubackAt := time.Now()
		done := pubackAt
		if d.f.spec.waitAck {
			t := time.NewTimer(answerTimeout)
			defer t.Stop()
			select {
			case <-fl.acked:
			case <-t.C:
				r.errors.Add(1)
				return
			}
			done = maxTime(pubackAt, fl.ackAt)
		}
		if r.inWindow(sent) {
			r.puback.add(pubackAt.Sub(sent))
			if d.f.spec.waitAck {
				r.ack.add(fl.ackAt.Sub(sent))
				r.second(sent, fl.ackAt.Sub(sent))
			} else {
				r.second(sent, pubackAt.Sub(sent))
			}
		}
		if r.inWindow(done) {
			r.done.Add(1)
		}
	}()
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

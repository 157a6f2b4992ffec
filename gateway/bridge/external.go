package bridge

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/ingest"
)

// ExternalConfig configures the external broker mode: instead of embedding
// a broker, the gateway consumes device messages from an existing one (for
// example mosquitto) as an MQTT 3.1.1 client with a persistent session.
//
// The external broker authenticates devices and enforces their topic
// permissions; the gateway does no API key check in this mode. Each
// gateway needs its own ClientID: two clients with one ID take the session
// from each other.
type ExternalConfig struct {
	// URL is the broker, scheme://host:port with scheme tcp or mqtt (plain),
	// or ssl, tls, mqtts or tcps (TLS, verified against the system's root
	// certificates). Credentials go in Username and Password, not in the
	// URL. Required: there is no default, and the zero value is invalid.
	URL string `yaml:"url"`
	// ClientID is the MQTT client ID, fixed so that the broker keeps the
	// gateway's session (its subscriptions and the QoS 1 messages not yet
	// acknowledged) while the gateway is down. Default (zero value)
	// "greenhouse-gateway".
	ClientID string `yaml:"client_id"`
	// Username is the MQTT user name; empty (the default) sends none.
	Username string `yaml:"username"`
	// Password is the MQTT password; empty (the default) sends none. It
	// needs a Username (MQTT 3.1.1).
	Password string `yaml:"password"`
	// SharedGroup, when set, subscribes through the shared subscription
	// $share/SharedGroup/devices/+/readings (and .../register), so that the
	// gateways of one group share the messages, each delivered to one of
	// them. Empty (the default): plain subscriptions, every gateway gets
	// every message. Changing it leaves the old subscription in the
	// session: change ClientID with it.
	SharedGroup string `yaml:"shared_group"`
	// QoS is the subscription QoS, 1 or 2; a message is delivered at the
	// lower of this and the QoS it was published with. Default (zero value)
	// 1. QoS 0 is not offered: the broker would not keep or redeliver
	// messages the gateway could not store.
	QoS int `yaml:"qos"`
	// ConnectTimeout bounds one connection attempt: TCP (and TLS) set-up
	// and the CONNECT/CONNACK handshake. Default (zero value) 10s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// AckTimeout bounds each step of answering one message: committing it,
	// and waiting for the broker's PUBACK of the ack published to the
	// device. A message whose step times out is left unacknowledged, and
	// the broker delivers it again. It also bounds the SUBSCRIBE and a
	// socket write. Default (zero value) 15s.
	AckTimeout time.Duration `yaml:"ack_timeout"`
}

// DefaultExternalConfig returns the defaults documented on ExternalConfig
// (URL has none).
func DefaultExternalConfig() ExternalConfig {
	return ExternalConfig{
		ClientID:       "greenhouse-gateway",
		QoS:            1,
		ConnectTimeout: 10 * time.Second,
		AckTimeout:     15 * time.Second,
	}
}

func (c ExternalConfig) withDefaults() ExternalConfig {
	d := DefaultExternalConfig()
	if c.ClientID == "" {
		c.ClientID = d.ClientID
	}
	if c.QoS == 0 {
		c.QoS = d.QoS
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = d.AckTimeout
	}
	return c
}

// Validate reports the first invalid field. Zero values stand for the
// defaults, except URL, which is required.
func (c ExternalConfig) Validate() error {
	if c.URL == "" {
		return errors.New("mqtt.external.url: must be set, e.g. tcp://broker.lan:1883")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("mqtt.external.url: %w", err)
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps":
	default:
		return fmt.Errorf("mqtt.external.url: scheme %q is not one of tcp, mqtt, ssl, tls, mqtts, tcps", u.Scheme)
	}
	if u.User != nil {
		return errors.New("mqtt.external.url: must not hold credentials; use mqtt.external.username and mqtt.external.password")
	}
	if u.Hostname() == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return fmt.Errorf("mqtt.external.url: %q is not scheme://host:port", c.URL)
	}
	if len(c.ClientID) > 65535 || !utf8.ValidString(c.ClientID) || strings.ContainsRune(c.ClientID, 0) {
		return errors.New("mqtt.external.client_id: must be UTF-8 without NUL, at most 65535 bytes")
	}
	if c.Password != "" && c.Username == "" {
		return errors.New("mqtt.external.password: needs mqtt.external.username (MQTT 3.1.1 sends no password without a user name)")
	}
	if c.SharedGroup != "" && (strings.ContainsAny(c.SharedGroup, "/+#\x00") || !utf8.ValidString(c.SharedGroup)) {
		return errors.New("mqtt.external.shared_group: must not contain '/', '+', '#' or NUL")
	}
	if c.QoS < 0 || c.QoS > 2 {
		return fmt.Errorf("mqtt.external.qos: %d is not 1 or 2", c.QoS)
	}
	if c.ConnectTimeout < 0 {
		return errors.New("mqtt.external.connect_timeout: must not be negative")
	}
	if c.AckTimeout < 0 {
		return errors.New("mqtt.external.ack_timeout: must not be negative")
	}
	return nil
}

// filters returns the subscription topic filters.
func (c ExternalConfig) filters() []string {
	f := []string{contract.TopicPrefix + "+/" + contract.KindReadings, contract.TopicPrefix + "+/" + contract.KindRegister}
	if c.SharedGroup != "" {
		for i := range f {
			f[i] = "$share/" + c.SharedGroup + "/" + f[i]
		}
	}
	return f
}

// Timing of the external mode that has no setting.
const (
	// extMinBackoff is the first wait before reconnecting; it doubles, with
	// jitter, up to extMaxBackoff while attempts fail.
	extMinBackoff = 250 * time.Millisecond
	extMaxBackoff = 30 * time.Second
	// extStable is how long a connection must have lasted for the backoff
	// to start again from extMinBackoff after it ends.
	extStable = time.Minute
	// extKeepAlive is the MQTT keep-alive; a broker that does not answer a
	// PINGREQ within extPingTimeout is taken as lost.
	extKeepAlive   = 30 * time.Second
	extPingTimeout = 10 * time.Second
	// extQuiesce is how long Disconnect waits for the DISCONNECT (and the
	// PUBACKs before it) to be written.
	extQuiesce = 250 * time.Millisecond
)

// Results of one received message, as metric labels.
const (
	extAcked    = "acked"    // answered and acknowledged (stored, duplicate or rejected)
	extIgnored  = "ignored"  // not a device topic; acknowledged unread
	extWithheld = "withheld" // not stored, or its ack not confirmed: left for redelivery
	extDeferred = "deferred" // not handled (connection ending, gateway stopping): left for redelivery
)

// External consumes device messages from an external MQTT broker and feeds
// them to the ingest path. See Run.
type External struct {
	cfg     ExternalConfig
	ingest  *ingest.Ingest
	logger  *slog.Logger
	filters []string

	connected prometheus.Gauge
	messages  *prometheus.CounterVec

	up    atomic.Bool
	acked atomic.Uint64 // messages acknowledged, to reset the backoff

	mu       sync.Mutex
	stopping bool
	queues   map[string][]extDelivery // per hardware_id, in arrival order; the head is in hand
	workers  sync.WaitGroup           // one per non-empty queue
}

// NewExternal returns the external broker client; it does not connect yet.
// logger and reg may be nil.
func NewExternal(cfg ExternalConfig, in *ingest.Ingest, logger *slog.Logger, reg prometheus.Registerer) (*External, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if in == nil {
		return nil, errors.New("gateway: NewExternal needs an ingest path")
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	e := &External{
		cfg: cfg, ingest: in, filters: cfg.filters(),
		logger: logger.With("component", "mqtt_external"),
		queues: map[string][]extDelivery{},
		connected: promauto.With(reg).NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "mqtt", Name: "external_connected",
			Help: "1 while the gateway is connected and subscribed to the external MQTT broker, else 0.",
		}),
		messages: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "mqtt", Name: "external_messages_total",
			Help: "Messages received from the external MQTT broker, by result: acked, ignored (not a device topic), " +
				"withheld (not stored: left for redelivery), deferred (not handled before a reconnect or stop: left for redelivery).",
		}, []string{"result"}),
	}
	for _, r := range []string{extAcked, extIgnored, extWithheld, extDeferred} {
		e.messages.WithLabelValues(r)
	}
	return e, nil
}

// Connected reports whether the gateway is connected and subscribed to the
// broker now.
func (e *External) Connected() bool { return e.up.Load() }

// Run connects to the broker with a persistent session (CleanSession
// false, the fixed client ID), subscribes to devices/+/readings and
// devices/+/register (shared when SharedGroup is set), and hands every
// message to the ingest path, until ctx is done. It then stops taking
// messages, lets those in hand finish (bounded by twice AckTimeout),
// disconnects cleanly and returns nil. Run is called once.
//
// A message is acknowledged (PUBACK) only after the ingest path allows it,
// and after the broker acknowledged the ack published to the device; a
// message that was not stored is left unacknowledged. MQTT 3.1.1 brokers
// redeliver unacknowledged messages only when the session reconnects, so
// the gateway then disconnects, waits a backoff, and reconnects. Messages
// of one device are handled one at a time, in the order received; devices
// are handled in parallel, so PUBACKs of different devices may leave out
// of order. A lost connection is retried forever with capped, jittered
// backoff.
func (e *External) Run(ctx context.Context) error {
	e.logger.Info("consuming device messages from an external MQTT broker", "url", e.cfg.URL,
		"client_id", e.cfg.ClientID, "filters", strings.Join(e.filters, " "), "qos", e.cfg.QoS)
	defer func() {
		e.up.Store(false)
		e.connected.Set(0)
	}()
	s := extState{backoff: extMinBackoff, first: true}
	for {
		c, sessionPresent, err := e.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			e.connectFailed(&s, err)
		} else if !e.serve(ctx, &s, c, sessionPresent) {
			return nil
		}
		if !e.sleep(ctx, extJitter(s.backoff)) {
			return nil
		}
		s.backoff = min(s.backoff*2, extMaxBackoff)
	}
}

// extState is what Run knows of its connections across attempts: what to
// log, and how long to wait before the next attempt.
type extState struct {
	backoff   time.Duration
	first     bool
	down      bool // a loss or failure was logged; the next connection is logged as a recovery
	downSince time.Time
	failures  int    // failed attempts since the last connection
	lastErr   string // of the latest failure or loss
	quiet     bool   // a redelivery reconnect was logged; no message acked since
}

// connectFailed logs a failed connection attempt: a warning for the first
// one, then at debug level until a connection succeeds.
func (e *External) connectFailed(s *extState, err error) {
	s.failures++
	s.lastErr = err.Error()
	if !s.down {
		e.logger.Warn("cannot connect to the MQTT broker; retrying", "url", e.cfg.URL, "err", err)
		s.down, s.downSince = true, time.Now()
	} else {
		e.logger.Debug("MQTT broker connection attempt failed", "attempt", s.failures, "err", err)
	}
}

// serve keeps connection c until ctx is done (it then shuts c down and
// returns false), the connection is lost, or a message was not stored (it
// then ends c, for the broker to deliver the message again on the next
// connection).
func (e *External) serve(ctx context.Context, s *extState, c *extConn, sessionPresent bool) bool {
	switch {
	case s.down:
		e.logger.Info("connected to the MQTT broker again", "url", e.cfg.URL, "session_present", sessionPresent,
			"failed_attempts", s.failures, "down_for", time.Since(s.downSince).Round(time.Millisecond).String(),
			"last_err", s.lastErr)
	case s.first:
		e.logger.Info("connected to the MQTT broker", "url", e.cfg.URL, "session_present", sessionPresent)
	default: // after a reconnect for redelivery
		e.logger.Debug("reconnected to the MQTT broker", "session_present", sessionPresent)
	}
	s.first, s.down, s.failures, s.lastErr = false, false, 0, ""
	e.up.Store(true)
	e.connected.Set(1)
	since, ackedBefore := time.Now(), e.acked.Load()

	var lostErr error
	select {
	case <-ctx.Done():
	case <-c.lost:
		lostErr = c.lostErr
	case <-c.retry:
	}
	e.up.Store(false)
	e.connected.Set(0)
	if ctx.Err() != nil {
		e.shutdown(c)
		return false
	}
	if e.acked.Load() != ackedBefore || time.Since(since) >= extStable {
		s.backoff, s.quiet = extMinBackoff, false
	}
	if lostErr == nil {
		// A message was not stored: end the connection, so that the broker
		// delivers it again on the next one (MQTT 3.1.1 redelivers only then).
		if !s.quiet {
			e.logger.Warn("a message was not stored; reconnecting so that the broker delivers it again",
				"backoff", s.backoff.String())
			s.quiet = true
		} else {
			e.logger.Debug("reconnecting for redelivery", "backoff", s.backoff.String())
		}
		e.finish(c, e.cfg.AckTimeout)
	} else {
		e.logger.Warn("MQTT broker connection lost; reconnecting", "err", lostErr,
			"connected_for", time.Since(since).Round(time.Millisecond).String())
		s.down, s.downSince, s.lastErr = true, time.Now(), lostErr.Error()
		e.finish(c, 0)
	}
	return true
}

// connect makes a new client with a persistent session, connects it and
// subscribes. Messages the broker held arrive as soon as the CONNACK is
// sent, possibly before the SUBACK; they are handled like any other.
func (e *External) connect(ctx context.Context) (*extConn, bool, error) {
	c := &extConn{lost: make(chan struct{}), retry: make(chan struct{})}
	opts := paho.NewClientOptions().
		AddBroker(e.cfg.URL).
		SetClientID(e.cfg.ClientID).
		SetProtocolVersion(4). // MQTT 3.1.1, no fallback to 3.1
		SetCleanSession(false).
		SetAutoReconnect(false). // Run reconnects, with a new client each time
		SetStore(noResumeStore{}).
		SetConnectRetry(false).
		SetConnectTimeout(e.cfg.ConnectTimeout).
		SetDialer(&net.Dialer{Timeout: e.cfg.ConnectTimeout}).
		SetKeepAlive(extKeepAlive).
		SetPingTimeout(extPingTimeout).
		SetWriteTimeout(e.cfg.AckTimeout).
		SetTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}).
		// The handler only queues (it must not block paho's router), so the
		// order of arrival is kept per device; see onMessage.
		SetOrderMatters(true).
		SetAutoAckDisabled(true).
		// Every message goes to the default handler: messages the session
		// held arrive before Subscribe could register a route, and a
		// message without a handler would never be acknowledged.
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { e.onMessage(c, m) }).
		SetConnectionLostHandler(func(_ paho.Client, err error) { c.setLost(err) })
	if e.cfg.Username != "" {
		opts.SetUsername(e.cfg.Username)
	}
	if e.cfg.Password != "" {
		opts.SetPassword(e.cfg.Password)
	}
	c.client = paho.NewClient(opts)

	tok := c.client.Connect()
	if err := e.await(ctx, tok, e.cfg.ConnectTimeout+time.Second, "connecting"); err != nil {
		c.client.Disconnect(0)
		return nil, false, err
	}
	sessionPresent := tok.(*paho.ConnectToken).SessionPresent()

	subs := make(map[string]byte, len(e.filters))
	for _, f := range e.filters {
		subs[f] = byte(e.cfg.QoS)
	}
	stok := c.client.SubscribeMultiple(subs, nil)
	err := e.await(ctx, stok, e.cfg.AckTimeout, "subscribing")
	if err == nil {
		for f, q := range stok.(*paho.SubscribeToken).Result() {
			if q > 2 { // 0x80: refused
				err = fmt.Errorf("the broker refused the subscription to %s", f)
				break
			}
		}
	}
	if err != nil {
		e.finish(c, 0)
		return nil, false, err
	}
	return c, sessionPresent, nil
}

// noResumeStore is the paho store of a client that lives for one
// connection: it keeps nothing, so the client has nothing to resend.
//
// With a persistent session paho "resumes" its store once a connection is
// up, resending every publish in it with the DUP flag set. But messages the
// broker held arrive as soon as the connection is up, and their acks are
// published (and stored) before that resume runs: it would send them a
// second time, and set DUP on a packet the connection's writer is encoding
// (a data race). A new client's store holds nothing from an earlier
// connection, and paho reads a store only to resume, so keeping nothing
// loses nothing: a publish refused for want of a connection fails (paho
// does not queue it without ConnectRetry or AutoReconnect), and the broker
// keeps the device's message until its PUBACK.
type noResumeStore struct{}

func (noResumeStore) Open()                             {}
func (noResumeStore) Put(string, packets.ControlPacket) {}
func (noResumeStore) Get(string) packets.ControlPacket  { return nil }
func (noResumeStore) All() []string                     { return nil }
func (noResumeStore) Del(string)                        {}
func (noResumeStore) Close()                            {}
func (noResumeStore) Reset()                            {}

// await waits for tok, at most timeout, and less when ctx ends.
func (e *External) await(ctx context.Context, tok paho.Token, timeout time.Duration, what string) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case <-timer.C:
		return fmt.Errorf("%s: no answer within %s", what, timeout)
	}
}

// onMessage runs on paho's router goroutine, once per message in the order
// received, and must not block: it queues the message for its device.
func (e *External) onMessage(c *extConn, m paho.Message) {
	hw, kind, ok := contract.ParseTopic(m.Topic())
	if !ok || kind == contract.KindAck {
		// Not ours (a subscription left in the session, say): acknowledged,
		// or it would take a slot of the broker's in-flight window forever.
		m.Ack()
		e.messages.WithLabelValues(extIgnored).Inc()
		return
	}
	e.mu.Lock()
	if e.stopping || c.ending() {
		e.mu.Unlock()
		e.messages.WithLabelValues(extDeferred).Inc()
		return
	}
	q := e.queues[hw]
	e.queues[hw] = append(q, extDelivery{c: c, msg: m, hw: hw, kind: kind})
	start := len(q) == 0
	if start {
		e.workers.Add(1)
	}
	e.mu.Unlock()
	if start {
		go e.drain(hw)
	}
}

// drain handles the queue of one device until it is empty.
func (e *External) drain(hw string) {
	defer e.workers.Done()
	for {
		e.mu.Lock()
		d := e.queues[hw][0]
		e.mu.Unlock()

		e.handle(d)

		e.mu.Lock()
		q := e.queues[hw][1:]
		if len(q) == 0 {
			delete(e.queues, hw)
			e.mu.Unlock()
			return
		}
		e.queues[hw] = q
		e.mu.Unlock()
	}
}

// handle answers one message. Once a message of a connection could not be
// stored, the later ones of that connection are left alone: the broker
// delivers them again after the reconnect, in order.
func (e *External) handle(d extDelivery) {
	if !d.c.begin() {
		e.messages.WithLabelValues(extDeferred).Inc()
		return
	}
	defer d.c.end()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.AckTimeout)
	ack, ackMQTT := e.ingest.MQTTMessage(ctx, ingest.Sender{HardwareID: d.hw}, d.kind, d.msg.Payload())
	cancel()
	if ack != nil {
		if err := e.publishAck(d.c, d.hw, *ack); err != nil {
			if !d.c.ending() {
				e.logger.Warn("publishing an ack; the message is left for redelivery", "hardware_id", d.hw, "err", err)
			}
			e.messages.WithLabelValues(extWithheld).Inc()
			d.c.requestRetry()
			return
		}
	}
	if !ackMQTT {
		e.messages.WithLabelValues(extWithheld).Inc()
		d.c.requestRetry()
		return
	}
	// Sent even when the connection is ending: the batch is stored, and a
	// PUBACK that still makes it spares a redelivery. paho drops it if the
	// connection is gone.
	d.msg.Ack()
	e.acked.Add(1)
	e.messages.WithLabelValues(extAcked).Inc()
}

// publishAck publishes ack on the device's ack topic at QoS 1 through the
// connection the message came on, and waits for the broker's PUBACK.
func (e *External) publishAck(c *extConn, hw string, ack contract.Ack) error {
	payload, err := json.Marshal(ack)
	if err != nil {
		return fmt.Errorf("encoding the ack: %w", err)
	}
	tok := c.client.Publish(contract.AckTopic(hw), 1, false, payload)
	timer := time.NewTimer(e.cfg.AckTimeout)
	defer timer.Stop()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-c.lost:
		return errors.New("connection lost")
	case <-timer.C:
		return fmt.Errorf("no PUBACK within %s", e.cfg.AckTimeout)
	}
}

// finish ends a connection: no message of it is handled from now on; those
// in hand get up to wait to finish (so their PUBACKs go out before the
// DISCONNECT), then the client disconnects.
func (e *External) finish(c *extConn, wait time.Duration) {
	idle := c.close()
	if wait > 0 {
		timer := time.NewTimer(wait)
		select {
		case <-idle:
		case <-timer.C:
			e.logger.Warn("messages still in hand at disconnect; the broker will deliver them again", "waited", wait.String())
		}
		timer.Stop()
	}
	c.client.Disconnect(uint(extQuiesce / time.Millisecond))
}

// shutdown stops taking messages, waits (bounded) for those in hand and
// disconnects.
func (e *External) shutdown(c *extConn) {
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	e.finish(c, 2*e.cfg.AckTimeout)
	// The queues now only skip what is left; their workers end at once.
	done := make(chan struct{})
	go func() {
		e.workers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * e.cfg.AckTimeout):
		e.logger.Warn("message handlers still running after disconnect")
	}
	e.logger.Info("disconnected from the MQTT broker")
}

// sleep waits d, or less when ctx ends; it reports whether ctx is still live.
func (e *External) sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// extJitter returns a duration between d/2 and d.
func extJitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// extDelivery is one message waiting in its device's queue.
type extDelivery struct {
	c    *extConn
	msg  paho.Message
	hw   string
	kind string
}

// extConn is one connection of the session: a paho client used once.
type extConn struct {
	client paho.Client

	lost     chan struct{} // closed when paho reports the connection lost
	lostOnce sync.Once
	lostErr  error // set before lost is closed

	retry     chan struct{} // closed when a message must be delivered again
	retryOnce sync.Once

	mu      sync.Mutex
	closing bool          // no message is handled any more
	active  int           // messages in hand
	idle    chan struct{} // closed when closing and active is 0
}

func (c *extConn) setLost(err error) {
	c.lostOnce.Do(func() {
		if err == nil {
			err = errors.New("connection closed")
		}
		c.lostErr = err
		close(c.lost)
	})
}

// requestRetry asks Run to reconnect, and stops the connection from
// handling further messages: they are to be delivered again, in order.
func (c *extConn) requestRetry() {
	c.retryOnce.Do(func() { close(c.retry) })
	c.mu.Lock()
	c.closing = true
	c.signalIdle()
	c.mu.Unlock()
}

// isLost reports whether the connection was lost.
func (c *extConn) isLost() bool {
	select {
	case <-c.lost:
		return true
	default:
		return false
	}
}

// ending reports whether the connection takes no more messages.
func (c *extConn) ending() bool {
	if c.isLost() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// begin reserves the handling of one message; false when the connection
// is ending.
func (c *extConn) begin() bool {
	if c.isLost() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	c.active++
	return true
}

func (c *extConn) end() {
	c.mu.Lock()
	c.active--
	c.signalIdle()
	c.mu.Unlock()
}

// close marks the connection ending and returns a channel closed once no
// message is in hand.
func (c *extConn) close() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	c.signalIdle()
	return c.idle
}

// signalIdle closes idle when it is wanted and nothing is in hand; c.mu is
// held.
func (c *extConn) signalIdle() {
	if c.closing && c.active == 0 && c.idle != nil {
		select {
		case <-c.idle:
		default:
			close(c.idle)
		}
	}
}

package devicesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"greenhouse-gateway/firmware-contract"
)

// MQTT session settings of a simulated device.
const (
	mqttConnectTimeout = 10 * time.Second
	mqttKeepAlive      = 30 * time.Second
	mqttQuiesceMS      = 250 // time given to a DISCONNECT on close, in milliseconds
	ackQoS             = 1
)

// mqttDialer returns the dialFunc of the MQTT transport: one client per device, with client
// ID and username the hardware id and password the API key it is dialled with (the fleet key
// or the device key), reconnecting after a lost connection. The ack topic
// is subscribed at QoS 1 on every (re)connect, before the device may publish. A reboot dials
// a new client.
//
// Over plain TCP ("tcp", "mqtt") the link opens the connection itself and keeps it, so that
// Drop can cut it without a DISCONNECT packet, as a device losing power does; over TLS and
// websockets Drop falls back to a clean disconnect.
func mqttDialer(cfg *Config, logger *slog.Logger) dialFunc {
	rawTCP := false
	if u, err := url.Parse(cfg.MQTTURL); err == nil && (u.Scheme == "tcp" || u.Scheme == "mqtt") {
		rawTCP = true
	}
	return func(ctx context.Context, hardwareID, apiKey string, events chan<- event) (link, error) {
		lctx, cancel := context.WithCancel(ctx)
		l := &mqttLink{
			cfg:    cfg,
			hw:     hardwareID,
			events: events,
			log:    logger.With("hardware_id", hardwareID),
			ctx:    lctx,
			cancel: cancel,
		}
		opts := mqtt.NewClientOptions().
			AddBroker(cfg.MQTTURL).
			SetClientID(hardwareID).
			SetUsername(hardwareID).
			SetPassword(apiKey).
			SetCleanSession(true).
			SetResumeSubs(false).
			// The link reconnects itself (onConnectionLost): paho's own reconnect re-sends
			// the publishes in flight, and in v1.5.1 that races with the old connection's
			// writer and can close a completed token twice (a panic). A device resends
			// unacknowledged batches itself.
			SetAutoReconnect(false).
			SetConnectRetry(false).
			SetConnectTimeout(mqttConnectTimeout).
			SetKeepAlive(mqttKeepAlive).
			SetOrderMatters(false).
			SetOnConnectHandler(l.onConnect).
			SetConnectionLostHandler(l.onConnectionLost)
		if rawTCP {
			opts.SetCustomOpenConnectionFn(l.openTCP)
		}
		l.client = mqtt.NewClient(opts)
		if !l.enter() {
			cancel()
			return nil, errNotConnected
		}
		go l.connectLoop()
		return l, nil
	}
}

// mqttLink is the MQTT link of one device. The paho client calls its handlers on goroutines
// of its own; enter and wg make sure none of them outlives Close.
type mqttLink struct {
	cfg    *Config
	hw     string
	client mqtt.Client
	events chan<- event
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	conn   net.Conn // the current TCP connection, when the link opens it itself
	wg     sync.WaitGroup
}

// openTCP opens the TCP connection to the broker for paho and remembers it for Drop.
func (l *mqttLink) openTCP(uri *url.URL, opts mqtt.ClientOptions) (net.Conn, error) {
	d := net.Dialer{Timeout: opts.ConnectTimeout}
	conn, err := d.DialContext(l.ctx, "tcp", uri.Host)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = conn.Close()
		return nil, errNotConnected
	}
	l.conn = conn
	return conn, nil
}

// enter registers a goroutine that will call wg.Done, unless the link is closed.
func (l *mqttLink) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	return true
}

// connectLoop connects, first and after a lost connection, retrying with backoff.
// A key the broker refuses (CONNACK not authorized) is a configuration problem that retrying
// soon does not fix: it is logged as an error and retried every RetryMax.
func (l *mqttLink) connectLoop() {
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	refusals := 0
	for failures := 0; ; failures++ {
		// Started under mu, after the closed check: a Close that comes
		// later disconnects it; one that came first is seen here.
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return
		}
		tok := l.client.Connect() // bounded by the connect timeout
		l.mu.Unlock()
		select {
		case <-tok.Done():
		case <-l.ctx.Done():
			return
		}
		err := tok.Error()
		if err == nil {
			return
		}
		wait := backoff(failures+1, l.cfg.RetryMin, l.cfg.RetryMax, rng)
		refused := errors.Is(err, packets.ErrorRefusedNotAuthorised)
		if refused {
			refusals++
		}
		switch {
		case refused && refusals == 1:
			wait = l.cfg.RetryMax
			l.log.Error("the broker refused the key (CONNACK not authorized): an unknown or revoked key, "+
				"a device key of another hardware_id, or a fleet key for a device that holds its own device key "+
				"(if the device lost it, an operator runs gatewayctl devices reset-key); will retry",
				"err", err, "retry_in", wait)
		case refused:
			wait = l.cfg.RetryMax
			l.log.Debug("the broker refused the key, will retry", "refusals", refusals)
		case failures == 0:
			l.log.Warn("connecting to the broker, will retry", "err", err, "retry_in", wait.Round(time.Millisecond))
		default:
			l.log.Debug("connecting to the broker, will retry", "err", err, "failures", failures+1)
		}
		if !sleep(l.ctx, wait) {
			return
		}
	}
}

// onConnect subscribes to the ack topic and then tells the device it may publish.
func (l *mqttLink) onConnect(c mqtt.Client) {
	if !l.enter() {
		return
	}
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	topic := contract.AckTopic(l.hw)
	for attempt := 1; ; attempt++ {
		tok := c.Subscribe(topic, ackQoS, l.onMessage)
		if !waitToken(l.ctx, tok, l.cfg.AckTimeout) {
			return
		}
		err := tok.Error()
		if err == nil {
			if granted, ok := tok.(*mqtt.SubscribeToken).Result()[topic]; ok && granted == 0x80 {
				err = fmt.Errorf("broker refused the subscription to %s", topic)
			}
		}
		if err == nil {
			deliver(l.ctx, l.events, event{kind: evConnected})
			return
		}
		if !c.IsConnectionOpen() {
			return // onConnect runs again after the reconnect
		}
		wait := backoff(attempt, l.cfg.RetryMin, l.cfg.RetryMax, rng)
		l.log.Warn("subscribing to the ack topic, will retry", "topic", topic, "err", err, "attempt", attempt)
		if !sleep(l.ctx, wait) {
			return
		}
	}
}

// onConnectionLost tells the device and, after RetryMin (so that a connection the broker
// keeps dropping, such as a session another client with the same id takes over, is not
// reopened in a tight loop), connects again. paho has completed the publishes in flight with
// an error by then (a clean session); the device resends what is unacknowledged.
func (l *mqttLink) onConnectionLost(_ mqtt.Client, err error) {
	if !l.enter() {
		return
	}
	deliver(l.ctx, l.events, event{kind: evDisconnected, err: err})
	if !sleep(l.ctx, l.cfg.RetryMin) {
		l.wg.Done()
		return
	}
	l.connectLoop() // it calls l.wg.Done
}

func (l *mqttLink) onMessage(_ mqtt.Client, m mqtt.Message) {
	if !l.enter() {
		return
	}
	defer l.wg.Done()
	var a contract.Ack
	if err := json.Unmarshal(m.Payload(), &a); err != nil {
		l.log.Warn("ignoring an ack that does not decode", "topic", m.Topic(), "err", err)
		return
	}
	deliver(l.ctx, l.events, event{kind: evAck, ack: a})
}

func (l *mqttLink) Register(payload []byte) error {
	return l.publish(contract.RegisterTopic(l.hw), payload, func(err error) event {
		return event{kind: evRegisterFailed, err: err}
	})
}

func (l *mqttLink) Send(batchID string, payload []byte) error {
	return l.publish(contract.ReadingsTopic(l.hw), payload, func(err error) event {
		return event{kind: evSendFailed, batchID: batchID, err: err}
	})
}

// publish starts a publish and reports its failure, if it fails within the ack timeout, as
// the event failure builds. Success is reported by the gateway, on the ack topic.
func (l *mqttLink) publish(topic string, payload []byte, failure func(error) event) error {
	if !l.client.IsConnectionOpen() {
		return errNotConnected
	}
	if !l.enter() {
		return errNotConnected
	}
	tok := l.client.Publish(topic, byte(l.cfg.QoS), false, payload)
	go func() {
		defer l.wg.Done()
		if !waitToken(l.ctx, tok, l.cfg.AckTimeout) {
			return
		}
		if err := tok.Error(); err != nil {
			deliver(l.ctx, l.events, failure(fmt.Errorf("publishing to %s: %w", topic, err)))
		}
	}()
	return nil
}

// Close disconnects cleanly and waits for every handler and watcher of the link. It is
// idempotent.
func (l *mqttLink) Close() error { return l.stop(false) }

// Drop cuts the TCP connection without a DISCONNECT, as a rebooting device does: the broker
// sees the connection drop (and would publish a will). Over TLS or websockets it disconnects
// cleanly. It waits like Close, and is idempotent with it.
func (l *mqttLink) Drop() error { return l.stop(true) }

func (l *mqttLink) stop(cut bool) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	conn := l.conn
	l.mu.Unlock()
	l.cancel()
	if cut && conn != nil {
		// Closed before paho's Disconnect, so that its DISCONNECT packet cannot go out; paho
		// then only stops its goroutines (and does not reconnect).
		_ = conn.Close()
	}
	l.client.Disconnect(mqttQuiesceMS)
	l.wg.Wait()
	return nil
}

// waitToken waits for tok until timeout or ctx is done, and reports whether tok completed.
func waitToken(ctx context.Context, tok mqtt.Token, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return true
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	}
}

// sleep waits for d and reports false if ctx was done first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

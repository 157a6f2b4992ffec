package broker

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/bridge"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/gateway/internal/listen"
	"greenhouse-gateway/gateway/internal/logpace"
	"greenhouse-gateway/internal/audit"
)

// MQTTConfig configures MQTT: the embedded broker, or an external one.
type MQTTConfig struct {
	// Mode is "embedded" (default: the gateway is the broker) or
	// "external" (the gateway consumes from an existing broker, External).
	Mode string `yaml:"mode"`
	// External configures the external broker mode.
	External bridge.ExternalConfig `yaml:"external"`
	// Addr is the TCP listen address. Default ":1883".
	Addr string `yaml:"addr"`
	// MaxPacketSize is the largest MQTT packet accepted, in bytes; larger
	// packets end the connection. Default 262144 (256 KiB).
	MaxPacketSize uint32 `yaml:"max_packet_size"`
	// MaxClients caps simultaneous connections. Default 10000.
	MaxClients int64 `yaml:"max_clients"`
	// ConnectTimeout is how long a new connection has to deliver its
	// CONNECT (TLS handshake included). Default 10s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// MaxUnauthenticated caps connections that have not authenticated
	// yet; a new one beyond it sheds the oldest. Default 1024.
	MaxUnauthenticated int `yaml:"max_unauthenticated"`
	// MaxUnauthenticatedPerAddress caps them per source address (IPv4
	// address, IPv6 /64); a new one beyond it sheds the oldest of the
	// address. Default 64.
	MaxUnauthenticatedPerAddress int `yaml:"max_unauthenticated_per_address"`
	// MaxSessionsPerDevice caps the client IDs (HW, HW-suffix) one
	// hardware_id has connected at once. Default 8.
	MaxSessionsPerDevice int `yaml:"max_sessions_per_device"`
	// MaxClientsPerKeyPercent caps the share of MaxClients the connections
	// of one API key hold, in percent; 100 sets no cap of its own.
	// Default 90.
	MaxClientsPerKeyPercent int `yaml:"max_clients_per_key_percent"`
	// TLSCertFile and TLSKeyFile, when both set, make the listener speak
	// MQTT over TLS (TLS 1.2 or later) with this PEM certificate and key.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// SessionExpiry is how long the broker keeps the persistent session of
	// a client that disconnected (its subscription and the acks queued
	// for it); an MQTT 5 client's Session Expiry Interval is capped by it.
	// Whole seconds, at least 1s. Default 1h.
	SessionExpiry time.Duration `yaml:"session_expiry"`
	// MaxQueuedPerClient caps the messages (acks) queued for one client,
	// connected or not; a new one sheds the oldest. Default 100.
	MaxQueuedPerClient int `yaml:"max_queued_per_client"`
	// MaxOfflineSessions caps the persistent sessions kept for clients
	// that are not connected; beyond it the one offline longest ends.
	// Default 1000.
	MaxOfflineSessions int `yaml:"max_offline_sessions"`
	// MaxOfflineSessionsPerDevice is MaxOfflineSessions for the client IDs
	// of one hardware_id. Default 4.
	MaxOfflineSessionsPerDevice int `yaml:"max_offline_sessions_per_device"`
	// SessionMemory bounds the bytes of queued messages and offline
	// sessions; beyond it the oldest messages queued for offline clients
	// are shed, then the sessions offline longest end. Default 12 MiB
	// (gatewayd derives it from memory_limit).
	SessionMemory int64 `yaml:"session_memory"`
}

func (c MQTTConfig) withDefaults() MQTTConfig {
	if c.Addr == "" {
		c.Addr = ":1883"
	}
	if c.MaxPacketSize == 0 {
		c.MaxPacketSize = 256 << 10
	}
	if c.MaxClients == 0 {
		c.MaxClients = 10000
	}
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, defaultConnectTimeout)
	c.MaxUnauthenticated = cmp.Or(c.MaxUnauthenticated, defaultMaxUnauthenticated)
	c.MaxUnauthenticatedPerAddress = cmp.Or(c.MaxUnauthenticatedPerAddress, defaultMaxUnauthenticatedPerAddress)
	c.MaxSessionsPerDevice = cmp.Or(c.MaxSessionsPerDevice, defaultMaxSessionsPerDevice)
	c.MaxClientsPerKeyPercent = cmp.Or(c.MaxClientsPerKeyPercent, defaultMaxClientsPerKeyPercent)
	c.SessionExpiry = cmp.Or(c.SessionExpiry, defaultSessionExpiry)
	c.MaxQueuedPerClient = cmp.Or(c.MaxQueuedPerClient, defaultMaxQueuedPerClient)
	c.MaxOfflineSessions = cmp.Or(c.MaxOfflineSessions, defaultMaxOfflineSessions)
	c.MaxOfflineSessionsPerDevice = cmp.Or(c.MaxOfflineSessionsPerDevice, defaultMaxOfflineSessionsPerDevice)
	c.SessionMemory = cmp.Or(c.SessionMemory, DefaultSessionMemory)
	return c
}

// Validate reports the first invalid field.
func (c MQTTConfig) Validate() error {
	switch c.Mode {
	case "", "embedded":
	case "external":
		if err := c.External.Validate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("mqtt.mode: %q is not one of embedded, external", c.Mode)
	}
	if c.MaxClients < 0 {
		return errors.New("mqtt.max_clients: must not be negative")
	}
	if err := c.validateAdmission(); err != nil {
		return err
	}
	if c.MaxPacketSize != 0 && c.MaxPacketSize < 1024 {
		return errors.New("mqtt.max_packet_size: must be at least 1024 bytes")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("mqtt.tls_cert_file and mqtt.tls_key_file: set both or neither")
	}
	return c.validateSessions()
}

// validateAdmission checks the limits on connections before and after
// they authenticate.
func (c MQTTConfig) validateAdmission() error {
	if c.ConnectTimeout < 0 {
		return errors.New("mqtt.connect_timeout: must not be negative")
	}
	for _, v := range []struct {
		setting string
		value   int
	}{
		{"mqtt.max_unauthenticated", c.MaxUnauthenticated},
		{"mqtt.max_unauthenticated_per_address", c.MaxUnauthenticatedPerAddress},
		{"mqtt.max_sessions_per_device", c.MaxSessionsPerDevice},
	} {
		if v.value < 0 {
			return fmt.Errorf("%s: must not be negative", v.setting)
		}
	}
	if c.MaxClientsPerKeyPercent < 0 {
		return errors.New("mqtt.max_clients_per_key_percent: must not be negative")
	}
	if c.MaxClientsPerKeyPercent > 100 {
		return errors.New("mqtt.max_clients_per_key_percent: must be at most 100")
	}
	return nil
}

// Broker is the embedded MQTT broker (mochi-mqtt) wired to the ingest path.
type Broker struct {
	cfg      MQTTConfig
	server   *mqtt.Server
	listener *listeners.Net
	guard    *guardListener // under listener
	ingest   *ingest.Ingest
	auth     *auth.Authenticator
	logger   *slog.Logger
	refused  *prometheus.CounterVec
	// takeovers counts connections that took over a connected session.
	takeovers *prometheus.CounterVec
	// adm admits connections until they authenticate (mqttguard.go);
	// slots shares the client slots among devices and keys (mqttslots.go).
	adm   *mqttAdmission
	slots *sessionSlots
	// sessions bounds offline persistent sessions and queued acks
	// (sessions.go).
	sessions *sessions
	// served is set once Run starts mochi's server, which then closes the
	// listener.
	served atomic.Bool
	// answer answers the QoS 1 and 2 messages whose answer waits for
	// their commit (mqttpipe.go), while Run serves.
	answer *answerers
}

// NewBroker returns a broker; it does not listen yet.
func NewBroker(cfg MQTTConfig, in *ingest.Ingest, authn *auth.Authenticator, logger *slog.Logger, reg prometheus.Registerer) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	logger = logger.With("component", "mqtt")
	server := newMochi(cfg, logger)
	b := &Broker{
		cfg: cfg, server: server, ingest: in, auth: authn, logger: logger,
		adm:    newMQTTAdmission(cfg.MaxUnauthenticated, cfg.MaxUnauthenticatedPerAddress),
		slots:  newSessionSlots(cfg.MaxSessionsPerDevice, cfg.MaxClients, cfg.MaxClientsPerKeyPercent),
		answer: newAnswerers(max(2, runtime.GOMAXPROCS(0))),
	}
	b.registerMetrics(reg)
	if err := b.addHooks(reg); err != nil {
		return nil, err
	}
	return b, nil
}

// newMochi returns mochi's server, configured for the gateway's devices.
func newMochi(cfg MQTTConfig, logger *slog.Logger) *mqtt.Server {
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumPacketSize = cfg.MaxPacketSize
	// QoS 2: mochi sends PUBREC once the batch is stored (AckDeferred, or
	// after the OnPublish hook; withheld when it is not), and keeps the
	// message's state until PUBREL, at most receiveMaximum messages a
	// client.
	caps.MaximumQos = 2
	caps.ReceiveMaximum = receiveMaximum
	// Acks (PUBACK, PUBREC, PUBCOMP) carry no copy of the PUBLISH's
	// properties, nor do the QoS 2 states kept until PUBREL.
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	caps.RetainAvailable = 0
	caps.WildcardSubAvailable = 0
	caps.SharedSubAvailable = 0
	caps.MaximumSessionExpiryInterval = uint32(cfg.SessionExpiry / time.Second)
	caps.MaximumInflight = uint16(cfg.MaxQueuedPerClient + inflightSlack)
	// mochi allocates each connection's write queue up front (8192 slots,
	// 64 KiB, by default), before CONNECT. A device's queue holds the
	// messages of its ack topic not yet written to its socket, one per
	// batch, drained as fast as the socket takes them: 256 slots (2 KiB a
	// connection) leave room for a burst.
	// A message beyond them is dropped and logged; the device, missing its
	// ack, resends the batch and is answered duplicate.
	caps.MaximumClientWritesPending = 256
	return mqtt.New(&mqtt.Options{
		Capabilities: caps,
		// The guard (mqttguard.go) reads each connection through its own
		// buffer and hands mochi whole packets: mochi's per-connection
		// read buffer (2 KiB by default, held by every idle device) only
		// needs to hold a fixed header; larger reads bypass it.
		ClientNetReadBufferSize: clientReadBufferSize,
		InlineClient:            true,
		// mochi logs every refused connection as a warning; ours are
		// counted in metrics instead.
		Logger: slog.New(minLevel{logger.Handler(), slog.LevelError}),
	})
}

// registerMetrics registers the broker's metrics, every series of a
// reason from the start.
func (b *Broker) registerMetrics(reg prometheus.Registerer) {
	b.refused = promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "gateway", Subsystem: "mqtt", Name: "connections_refused_total",
		Help: "MQTT connections refused or ended, by reason: bad_identity, unauthorized, unavailable, bad_will, " +
			"forbidden (a device key for another hardware_id), device_key_required (a fleet key for a device " +
			"holding its own key) (CONNECT refused); max_clients, device_sessions, key_share (over mqtt.max_clients, " +
			"mqtt.max_sessions_per_device, mqtt.max_clients_per_key_percent); connect_timeout (no CONNECT within " +
			"mqtt.connect_timeout); shed_address_cap, shed_total_cap (unauthenticated, shed for a newer connection " +
			"over mqtt.max_unauthenticated_per_address, mqtt.max_unauthenticated); malformed, protocol_error, " +
			"bad_auth_method.",
	}, []string{"reason"})
	for _, r := range []string{"bad_identity", "unauthorized", "unavailable", "bad_will", string(contract.ReasonForbidden),
		string(contract.ReasonDeviceKeyRequired), reasonMaxClients,
		reasonDeviceSessions, reasonKeyShare, "connect_timeout", reasonShedAddress, reasonShedTotal, refusedMalformed,
		refusedProtocolError, refusedAuthMethod} {
		b.refused.WithLabelValues(r) // every series from the start
	}
	b.takeovers = promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "gateway", Subsystem: "mqtt", Name: "session_takeovers_total",
		Help: "MQTT connections that took over the connected session of their client ID (the earlier connection is " +
			"closed), by the kind of key the new one used: device or fleet.",
	}, []string{"key"})
	b.takeovers.WithLabelValues("device")
	b.takeovers.WithLabelValues("fleet")
	promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "mqtt", Name: "unauthenticated_connections",
		Help: "MQTT connections accepted that have not authenticated yet.",
	}, func() float64 { n, _ := b.adm.counts(); return float64(n) })
	promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "gateway", Subsystem: "mqtt", Name: "clients_connected",
		Help: "MQTT clients connected to the embedded broker.",
	}, func() float64 { return float64(atomic.LoadInt64(&b.server.Info.ClientsConnected)) }) // mochi updates it atomically
}

// addHooks adds the broker's hooks to mochi's server: conformance, the
// gateway's own (authentication, access, ingest) and the session limits.
func (b *Broker) addHooks(reg prometheus.Registerer) error {
	// The conformance hook runs first: a CONNECT that breaks MQTT is
	// refused before authentication.
	if err := b.server.AddHook(&conformHook{b: b}, nil); err != nil {
		return fmt.Errorf("adding the conformance hook: %w", err)
	}
	if err := b.server.AddHook(&hook{b: b}, nil); err != nil {
		return fmt.Errorf("adding the gateway hook: %w", err)
	}
	b.sessions = newSessions(b.server, sessionLimits{maxQueued: b.cfg.MaxQueuedPerClient, maxOffline: b.cfg.MaxOfflineSessions,
		maxOfflinePerDevice: b.cfg.MaxOfflineSessionsPerDevice, budget: b.cfg.SessionMemory}, b.logger, reg)
	if err := b.server.AddHook(b.sessions, nil); err != nil {
		return fmt.Errorf("adding the session hook: %w", err)
	}
	return nil
}

// Listen binds the TCP listener: the broker's start, before Run, so that
// the caller knows the address (and that it is free) before it reports
// ready. Run listens itself when Listen was not called.
func (b *Broker) Listen() error {
	tlsConfig, err := listen.LoadTLS(b.cfg.TLSCertFile, b.cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("mqtt TLS: %w", err)
	}
	l, err := listen.TCP(b.cfg.Addr, b.cfg.ConnectTimeout)
	if err != nil {
		return fmt.Errorf("listening for MQTT on %s: %w", b.cfg.Addr, err)
	}
	if tlsConfig != nil {
		l = tls.NewListener(l, tlsConfig)
	}
	b.guard = b.guardListener(l)
	b.listener = listeners.NewNet("tcp", b.guard)
	if err := b.server.AddListener(b.listener); err != nil {
		_ = l.Close()
		return fmt.Errorf("listening for MQTT on %s: %w", b.cfg.Addr, err)
	}
	return nil
}

// guardListener wraps l in the connection guard and the admission.
func (b *Broker) guardListener(l net.Listener) *guardListener {
	admitted := logpace.New(logpace.Interval)
	return &guardListener{Listener: l, timeout: b.cfg.ConnectTimeout, adm: b.adm, maxPacket: b.cfg.MaxPacketSize,
		logger: b.logger, refused: func(reason string) {
			b.refused.WithLabelValues(reason).Inc()
			switch reason {
			case reasonShedTotal, reasonShedAddress, "connect_timeout":
				if counts := admitted.Add(reason); counts != nil {
					b.logAdmission(counts)
				}
			}
		}}
}

// logAdmission reports unauthenticated connections ended by the admission
// since its last line.
func (b *Broker) logAdmission(counts map[string]int) {
	b.logger.Warn("MQTT connections that did not authenticate were ended (see gateway_mqtt_connections_refused_total)",
		"shed_total_cap", counts[reasonShedTotal], "shed_address_cap", counts[reasonShedAddress],
		"connect_timeout", counts["connect_timeout"], "max_unauthenticated", b.cfg.MaxUnauthenticated,
		"max_unauthenticated_per_address", b.cfg.MaxUnauthenticatedPerAddress,
		"connect_timeout_setting", b.cfg.ConnectTimeout.String())
}

// Addr returns the bound address (after Listen).
func (b *Broker) Addr() string { return b.listener.Address() }

// Run serves until ctx is done, then closes the listener and every client
// connection.
func (b *Broker) Run(ctx context.Context) error {
	if b.listener == nil {
		if err := b.Listen(); err != nil {
			return err
		}
	}
	b.served.Store(true)
	b.answer.start()
	defer b.answer.stop()                    // after mochi's Close: what its clients left deferred is answered
	if err := b.server.Serve(); err != nil { // does not block
		return fmt.Errorf("serving MQTT: %w", err)
	}
	b.logger.Info("MQTT broker listening", "addr", b.Addr())
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		b.sessions.run(ctx, sweepInterval)
	}()
	<-ctx.Done()
	<-swept
	// mochi's Close can deadlock when a client disconnects while the
	// listener closes (Clients.GetByListener takes its read lock twice;
	// mochi-mqtt/server issue 488). Do not let that hold the shutdown: the
	// buffer still closes cleanly and the process exits.
	closed := make(chan error, 1)
	b.guard.drain(closeTimeout)
	go func() { closed <- b.server.Close() }()
	select {
	case err := <-closed:
		return err
	case <-time.After(closeTimeout):
		b.logger.Error("MQTT broker did not close in time (mochi-mqtt issue 488); going on with the shutdown",
			"timeout", closeTimeout.String())
		return nil
	}
}

// Close releases the listener of a broker that was started (Listen) but
// never run; after Run, which closes everything it served, it does
// nothing.
func (b *Broker) Close() error {
	if b.listener == nil || b.served.Load() {
		return nil
	}
	b.listener.Close(func(string) {}) // no client connected yet
	return nil
}

// clientReadBufferSize is mochi's read buffer per connection, in bytes.
const clientReadBufferSize = 64

// closeTimeout bounds the embedded broker's Close.
const closeTimeout = 5 * time.Second

// ackPayload encodes an ack as published on the ack topic (the bytes of
// encoding/json, without its reflection: one per message).
func ackPayload(ack contract.Ack) []byte {
	return contract.EncodeAck(ack)
}

// publishAck sends one result to the device's ack topic.
func (b *Broker) publishAck(hw string, ack contract.Ack) {
	payload := ackPayload(ack)
	if err := b.server.Publish(contract.AckTopic(hw), payload, false, 1); err != nil {
		b.logger.Warn("publishing an ack", "hardware_id", hw, "err", err)
	}
}

// hook enforces identity and access and feeds publishes to the ingest path.
type hook struct {
	mqtt.HookBase
	b *Broker
}

func (h *hook) ID() string { return "gateway" }

func (h *hook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnect, mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPublish,
		mqtt.OnDisconnect}, []byte{b})
}

// OnConnect authenticates: username = hardware_id, password = API key, and
// the client ID is the hardware_id, optionally followed by "-" and a suffix.
// Refusals answer CONNACK "not authorized" (or "server unavailable" when the
// key cannot be checked now, "quota exceeded" when the device or the key
// holds its share of slots, "server busy" when every slot is taken; the
// last two are "server unavailable" in MQTT 3.1.1) and end the connection.
// An accepted connection leaves the admission and holds its slot until it
// closes.
func (h *hook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	hw := string(pk.Connect.Username)
	// refuse answers the CONNECT with code; reason, unless empty (the
	// caller counted and recorded the refusal), is counted and recorded.
	refuse := func(reason string, code packets.Code) error {
		if reason != "" {
			h.b.refused.WithLabelValues(reason).Inc()
			h.b.auditConnectRefusal(cl, hw, reason, pk.Connect.WillTopic)
		}
		if code == packets.ErrNotAuthorized && cl.Properties.ProtocolVersion < 5 {
			// mochi maps this one to MQTT 3's return code 5, "not authorized".
			code = packets.ErrBadUsernameOrPassword
		}
		if (code == packets.ErrQuotaExceeded || code == packets.ErrServerBusy) && cl.Properties.ProtocolVersion < 5 {
			code = packets.ErrServerUnavailable // MQTT 3's return code 3
		}
		if err := h.b.server.SendConnack(cl, code, false, nil); err != nil {
			return fmt.Errorf("refusing %s: %w", cl.ID, err)
		}
		return code
	}
	if contract.ValidHardwareID(hw) != nil || (cl.ID != hw && !strings.HasPrefix(cl.ID, hw+"-")) {
		return refuse("bad_identity", packets.ErrNotAuthorized)
	}
	// mochi publishes a will to subscribers without an ACL check: a will
	// on another device's ack topic would forge its acks.
	if pk.Connect.WillFlag && !aclAllows(hw, pk.Connect.WillTopic, true) {
		return refuse("bad_will", packets.ErrNotAuthorized)
	}
	p, err := h.b.auth.Identify(context.Background(), string(pk.Connect.Password))
	switch {
	case errors.Is(err, auth.ErrAuthUnavailable):
		return refuse("unavailable", packets.ErrServerUnavailable)
	case err != nil:
		return refuse("unauthorized", packets.ErrNotAuthorized)
	}
	if cerr := h.b.ingest.Authorize(p, hw, auth.ActConnect, contract.TransportMQTT); cerr != nil {
		h.b.refused.WithLabelValues(string(cerr.Reason)).Inc()
		h.b.auditMQTT(cl, "connect", hw, string(cerr.Reason), "", cerr.Rule)
		return refuse("", packets.ErrNotAuthorized)
	}
	lease, over := h.b.slots.acquire(hw, cl.ID, p.KeyID)
	if over != nil {
		if log, suppressed := h.b.slots.logRefusal(over.reason, time.Now()); log {
			h.b.logger.Warn("MQTT connection refused: "+over.Error(), "reason", over.reason, "setting", over.setting,
				"limit", over.limit, "hardware_id", hw, "client_id", cl.ID, "key_id", p.KeyID, "remote", cl.Net.Remote,
				"not_logged_since_last", suppressed)
		}
		return refuse(over.reason, over.code())
	}
	g, ok := cl.Net.Conn.(*guardConn)
	if !ok {
		lease()
		return errors.New("gateway: MQTT connection outside the guard") // unreachable: every listener is guarded
	}
	g.principal = p
	if old, ok := h.b.server.Clients.Get(cl.ID); ok && !old.Closed() {
		h.b.takeover(cl, old, hw, p)
	}
	return g.authenticated(lease)
}

// OnConnectAuthenticate is reached only by clients OnConnect accepted.
func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool { return true }

// OnACLCheck lets a device publish only to its own register and readings
// topics and subscribe only to its own ack topic.
func (h *hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	hw := string(cl.Properties.Username)
	if aclAllows(hw, topic, write) {
		return true
	}
	h.b.auditACLDenial(cl, hw, topic, write)
	return false
}

func aclAllows(hw, topic string, write bool) bool {
	if write {
		return topic == contract.ReadingsTopic(hw) || topic == contract.RegisterTopic(hw)
	}
	return topic == contract.AckTopic(hw)
}

// OnPublish hands a device's message to the ingest path before mochi sends
// the PUBACK (QoS 1) or PUBREC (QoS 2), which it withholds when the
// message was not stored. A QoS 1 or 2 message is deferred (ackPipe): the
// hook returns once a batch is queued for its commit (a registration once
// it is saved), and the answer follows through mochi's AckDeferred. A QoS
// 0 message is answered (its ack-topic message) after them, and
// CodeSuccessIgnore keeps every message from being fanned out to
// subscribers.
func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil // our own acks
	}
	hw, kind, ok := contract.ParseTopic(pk.TopicName)
	if !ok {
		return pk, packets.CodeSuccessIgnore // unreachable: the ACL admits only device topics
	}
	ctx := context.Background()
	sender := ingest.Sender{HardwareID: hw, RemoteAddr: cl.Net.Remote}
	g, _ := cl.Net.Conn.(*guardConn)
	if g != nil {
		p := g.principal
		sender.Principal = &p
		if pk.FixedHeader.Qos > 0 {
			payload := pk.Payload
			pk.Payload = nil // not kept while the commit is under way
			g.acks.add(h.b.answer, func() func() (*contract.Ack, bool) {
				if kind == contract.KindReadings {
					return h.b.ingest.StartMQTTReadings(ctx, sender, payload)
				}
				ack, ok := h.b.ingest.MQTTMessage(ctx, sender, kind, payload) // before the next message: it may admit the device
				return func() (*contract.Ack, bool) { return ack, ok }
			}, func(ack *contract.Ack, ok bool) {
				// At QoS 1 the ack-topic message goes first: a device that
				// sleeps once it has its PUBACK has its ack too. At QoS 2
				// the PUBREC's state must hold its packet ID before that
				// message takes one; the flow ends (PUBCOMP) after it
				// anyway. AckDeferred fails only for a connection gone or
				// not reading.
				if pk.FixedHeader.Qos == 2 {
					_ = h.b.server.AckDeferred(cl, pk, ok)
				}
				if ack != nil {
					h.b.publishAck(hw, *ack)
				}
				if pk.FixedHeader.Qos == 1 {
					_ = h.b.server.AckDeferred(cl, pk, ok)
				}
			})
			return pk, mqtt.ErrPublishDeferred
		}
		g.acks.idle()
	}
	ack, ackMQTT := h.b.ingest.MQTTMessage(ctx, sender, kind, pk.Payload)
	if ack != nil {
		h.b.publishAck(hw, *ack)
	}
	if !ackMQTT {
		return pk, packets.ErrRejectPacket
	}
	return pk, packets.CodeSuccessIgnore
}

// OnDisconnect records a client the broker disconnected for a packet over
// mqtt.max_packet_size.
func (h *hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if errors.Is(err, packets.ErrPacketTooLarge) {
		h.b.auditMQTT(cl, "publish", string(cl.Properties.Username), audit.ReasonOversize, "",
			fmt.Sprintf("packet over mqtt.max_packet_size (%d bytes); disconnected", h.b.cfg.MaxPacketSize))
	}
}

// minLevel drops records below a level.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.Handler.Enabled(ctx, l)
}

func (m minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{m.Handler.WithAttrs(attrs), m.min}
}

func (m minLevel) WithGroup(name string) slog.Handler {
	return minLevel{m.Handler.WithGroup(name), m.min}
}

package ingest

import (
	"net"
	"net/http"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"greenhouse-gateway/firmware-contract"
)

// Test hooks for the tests of package ingest_test: they read or change
// unexported fields, before Listen or Run when they change them.

// MaxConnectPacketSize is the guard's limit on CONNECT packets.
const MaxConnectPacketSize = maxConnectPacketSize

// MinBatchBytes bounds the batches of one HTTP request.
const MinBatchBytes = contract.MinBatchBytes

// SetConnectLimits sets the broker's connect timeout and its cap on
// unauthenticated connections in total; call it before Listen.
func SetConnectLimits(b *Broker, timeout time.Duration, maxUnauthenticated int64) {
	b.cfg.ConnectTimeout = timeout
	b.cfg.MaxUnauthenticated = int(maxUnauthenticated)
	b.adm = newMQTTAdmission(b.cfg.MaxUnauthenticated, b.cfg.MaxUnauthenticatedPerAddress)
}

// SetMessageExpiry sets how long mochi keeps a message in flight
// (Capabilities.MaximumMessageExpiryInterval; a day by default); call it
// before Run.
func SetMessageExpiry(b *Broker, d time.Duration) {
	b.server.Options.Capabilities.MaximumMessageExpiryInterval = int64(d / time.Second)
}

// ServeMQTTConn serves one client connection (a net.Pipe, say) as the
// broker's listener would, through the connection guard, and returns when
// mochi is done with it. The broker must be running.
func ServeMQTTConn(b *Broker, c net.Conn) error {
	return b.server.EstablishConnection("tcp", b.guardListener(nil).guard(c))
}

// SetHTTPTimeouts shortens the HTTP server's ReadHeaderTimeout and
// ReadTimeout; call it before Run.
func SetHTTPTimeouts(h *HTTPServer, readHeader, read time.Duration) {
	h.server.ReadHeaderTimeout = readHeader
	h.server.ReadTimeout = read
}

// HTTPHandler returns the API's handler, to serve requests without a
// listener.
func HTTPHandler(h *HTTPServer) http.Handler { return h.server.Handler }

// MQTTACLCheck runs the broker's access check for a connected client whose
// username is username.
func MQTTACLCheck(username, topic string, write bool) bool {
	cl := &mqtt.Client{}
	cl.Properties.Username = []byte(username)
	return (&hook{b: &Broker{ingest: &Ingest{}}}).OnACLCheck(cl, topic, write)
}

// UnknownKeys returns how many unknown key hashes a remembers.
func UnknownKeys(a *Authenticator) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.unknown)
}

// SetAuthClock makes a read the time from now.
func SetAuthClock(a *Authenticator, now func() time.Time) { a.now = now }

// MaxUnknownKeys is maxUnknownKeys.
const MaxUnknownKeys = maxUnknownKeys

// SetDeviceKeysClock makes k read the time from now.
func SetDeviceKeysClock(k *DeviceKeys, now func() time.Time) { k.now = now }

// HTTPTimeouts returns the HTTP server's read header, read, write and idle
// timeouts.
func HTTPTimeouts(h *HTTPServer) [4]time.Duration {
	s := h.server
	return [4]time.Duration{s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout}
}

// HTTPConfigWithDefaults returns c with its defaults filled in.
func HTTPConfigWithDefaults(c HTTPConfig) HTTPConfig { return c.withDefaults() }

// OfflineSessionBytes is what the session accounting charges for one
// offline session without queued messages.
func OfflineSessionBytes(b *Broker) int64 { return b.sessions.offlineBytes() }

// QueuedMessageBytes is what the session accounting charges for one queued
// message of that topic and payload.
func QueuedMessageBytes(topic string, payload []byte) int64 {
	return messageBytes(packets.Packet{TopicName: topic, Payload: payload})
}

// TopicSubscribers returns the client IDs the broker's topic index holds a
// subscription of topic for.
func TopicSubscribers(b *Broker, topic string) []string {
	var ids []string
	for id := range b.server.Topics.Subscribers(topic).Subscriptions {
		ids = append(ids, id)
	}
	return ids
}

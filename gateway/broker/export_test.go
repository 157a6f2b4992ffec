package broker

import (
	"net"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"greenhouse-gateway/gateway/ingest"
)

// Test hooks for the tests of package broker_test: they read or change
// unexported fields, before Listen or Run when they change them.

// MaxConnectPacketSize is the guard's limit on CONNECT packets.
const MaxConnectPacketSize = maxConnectPacketSize

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

// MQTTACLCheck runs the broker's access check for a connected client whose
// username is username.
func MQTTACLCheck(username, topic string, write bool) bool {
	cl := &mqtt.Client{}
	cl.Properties.Username = []byte(username)
	return (&hook{b: &Broker{ingest: &ingest.Ingest{}}}).OnACLCheck(cl, topic, write)
}

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

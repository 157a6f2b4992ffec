package ingest

import (
	"net"
	"net/http"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// Test hooks for the hostile-input tests and fuzz targets (package
// ingest_test). They change only unexported fields, before Listen or Run.

// MaxConnectPacketSize is the guard's limit on CONNECT packets.
const MaxConnectPacketSize = maxConnectPacketSize

// MinBatchBytes bounds the batches of one HTTP request.
const MinBatchBytes = minBatchBytes

// SetConnectLimits sets the broker's connect timeout and its cap on
// unauthenticated connections in total; call it before Listen.
func SetConnectLimits(b *Broker, timeout time.Duration, maxUnauthenticated int64) {
	b.cfg.ConnectTimeout = timeout
	b.cfg.MaxUnauthenticated = int(maxUnauthenticated)
	b.adm = newMQTTAdmission(b.cfg.MaxUnauthenticated, b.cfg.MaxUnauthenticatedPerAddress)
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

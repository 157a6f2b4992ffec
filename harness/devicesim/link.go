package devicesim

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"greenhouse-gateway/firmware-contract"
)

// errNotConnected is returned by a link that cannot send right now; the device retries later.
var errNotConnected = errors.New("devicesim: not connected")

// link is one device's connection to the gateway. Its methods do not block on the network:
// they start the transmission and report its outcome later as events on the channel the link
// was dialled with. An error from Send or Register means nothing was sent.
type link interface {
	// Register sends the registration payload.
	Register(payload []byte) error
	// Send sends the serialised batch with the given id.
	Send(batchID string, payload []byte) error
	// Close stops the link and waits for its goroutines. No event is delivered after it
	// returns.
	Close() error
	// Drop stops the link as a reboot does: the connection is cut without a clean MQTT
	// DISCONNECT where the transport allows it, and requests in flight are abandoned. It
	// waits for the link's goroutines; no event is delivered after it returns.
	Drop() error
}

// dialFunc creates the link of the device with the given hardware id, authenticated with
// apiKey (the MQTT password or the HTTP bearer token: the fleet key, or the device's own
// device key). It does no blocking I/O: the link connects in the background and delivers
// evConnected when it can send.
type dialFunc func(ctx context.Context, hardwareID, apiKey string, events chan<- event) (link, error)

type eventKind int

const (
	// evConnected: the link can send (for MQTT: connected and subscribed to the ack topic).
	evConnected eventKind = iota + 1
	// evDisconnected: the link lost its connection; nothing in flight will be answered.
	evDisconnected
	// evAck: an answer from the gateway, for a registration or for one batch.
	evAck
	// evSendFailed: a batch was not delivered (transport error, retryable HTTP status).
	evSendFailed
	// evRegisterFailed: a registration was not delivered.
	evRegisterFailed
)

// event is something that happened on a link, delivered to the device's loop.
type event struct {
	kind       eventKind
	ack        contract.Ack  // evAck
	batchID    string        // evSendFailed
	err        error         // evDisconnected, evSendFailed, evRegisterFailed
	retryAfter time.Duration // evAck, evSendFailed: the server asked to wait this long
	httpStatus int           // evAck of a registration over HTTP: the status code (201 or 200)
}

// deliver hands ev to the device unless ctx is done first.
func deliver(ctx context.Context, events chan<- event, ev event) {
	select {
	case events <- ev:
	case <-ctx.Done():
	}
}

// backoff returns the wait before retry number failures (1 for the first failure): a random
// time in [d/2, d] with d = min(hi, lo * 2^(failures-1)).
func backoff(failures int, lo, hi time.Duration, rng *rand.Rand) time.Duration {
	d := lo
	for i := 1; i < failures && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	half := d / 2
	return half + time.Duration(rng.Int64N(int64(d-half)+1))
}

// maxRetryAfter bounds a server's Retry-After, so that a bad header cannot park a device.
const maxRetryAfter = 5 * time.Minute

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
// It returns zero when the header is absent or not understood.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		d = time.Duration(min(max(secs, 0), int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}

// Package clock is the gateway's own clock: it owns the offset it learns
// from the cloud's answers and the judgement whether the time can be trusted.
//
// A Raspberry Pi has no real-time clock: until NTP syncs (and NTP may be
// unreachable behind a flaky uplink) its clock can be hours or years off.
// The gateway stamps receive times, repairs device clocks and checks device
// timestamps with this clock, so it corrects the system clock by an offset
// learned from the Date header of DynamoDB's answers, and it knows when the
// time cannot be trusted at all: before a floor (the release date of this
// build) the clock is implausible.
package clock

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// DefaultFloor is the earliest plausible time: no gateway runs before this
// code existed.
var DefaultFloor = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// minCorrection is the smallest offset applied: Date headers have a
// resolution of one second, so smaller differences are noise.
const minCorrection = 2 * time.Second

// Clock is the system clock corrected by a learned offset. Its methods are
// safe for concurrent use.
type Clock struct {
	floor  time.Time
	system func() time.Time

	mu      sync.Mutex
	offset  time.Duration
	learned bool
}

// New returns a clock with the given plausibility floor (DefaultFloor when
// zero). reg may be nil.
func New(floor time.Time, reg prometheus.Registerer) *Clock {
	if floor.IsZero() {
		floor = DefaultFloor
	}
	c := &Clock{floor: floor, system: time.Now}
	if reg != nil {
		f := promauto.With(reg)
		f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "gateway", Subsystem: "clock", Name: "offset_seconds",
			Help: "Correction applied to the system clock, learned from DynamoDB's Date headers (positive: the system clock is behind)."},
			func() float64 { return c.Offset().Seconds() })
		f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "gateway", Subsystem: "clock", Name: "plausible",
			Help: "1 when the gateway's corrected clock is after its plausibility floor; 0 while it cannot be trusted."},
			func() float64 {
				if c.Plausible() {
					return 1
				}
				return 0
			})
	}
	return c
}

// Now returns the corrected time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	off := c.offset
	c.mu.Unlock()
	return c.system().Add(off)
}

// Offset returns the correction applied to the system clock.
func (c *Clock) Offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset
}

// Plausible reports whether the corrected time is after the floor.
func (c *Clock) Plausible() bool { return !c.Now().Before(c.floor) }

// Learned reports whether a server time was observed.
func (c *Clock) Learned() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.learned
}

// Observe learns from a server's time (a Date header, whole seconds) seen
// in an answer to a request sent at sent and answered at received, both
// system times.
func (c *Clock) Observe(server, sent, received time.Time) {
	// The server stamped somewhere between sent and received; its header
	// truncates to the second, so its true time is about 0.5 s later.
	mid := sent.Add(received.Sub(sent) / 2)
	diff := server.Add(500 * time.Millisecond).Sub(mid)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.learned = true
	if diff > -minCorrection && diff < minCorrection {
		c.offset = 0 // the system clock is right (NTP synced)
		return
	}
	c.offset = diff.Round(time.Second)
}

// DynamoDBOption installs a middleware on a DynamoDB client that feeds the
// Date header of every answer to the clock.
func (c *Clock) DynamoDBOption() func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("GatewayClock",
				func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
					sent := c.system()
					out, md, err := next.HandleDeserialize(ctx, in)
					if resp, ok := out.RawResponse.(*smithyhttp.Response); ok && resp != nil {
						if d, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
							c.Observe(d, sent, c.system())
						}
					}
					return out, md, err
				}), middleware.After)
		})
	}
}

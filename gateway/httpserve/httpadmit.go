package httpserve

import (
	"container/list"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"greenhouse-gateway/gateway/internal/listen"
	"greenhouse-gateway/gateway/internal/logpace"
)

// HTTP admission control. Every accepted connection is tracked, in total
// and per source (an IPv4 address, an IPv6 /64). A connection is
// "waiting" while it is not inside a handler: new, in its TLS handshake,
// sending its request line and headers, or idle between keep-alive
// requests. When a cap is reached, the waiting connection that has waited
// longest (since it was accepted or last left a handler) is closed to make
// room, so that a client that sends its request at once is served however
// many sockets others hold open. A connection inside a handler is never
// shed; when every connection counted against a cap is inside one, the
// newcomer is closed at once.

// Reasons of shed and refused connections (metric labels).
const (
	admitTotalCap   = "total_cap"
	admitAddressCap = "address_cap"
)

// admission tracks open connections; it is safe for concurrent use.
type admission struct {
	maxConns, maxPerAddr int
	logger               *slog.Logger

	mu      sync.Mutex
	open    int
	waiting list.List // of *admitConn, longest waiting first
	sources map[netip.Addr]*admitSource
	// logged gathers shed and refused connections for one log line a
	// minute.
	logged *logpace.Log

	shed, refused *prometheus.CounterVec
	openGauge     prometheus.Gauge
}

// admitSource is what one source address holds.
type admitSource struct {
	open    int
	waiting list.List // of *admitConn, longest waiting first
}

// admitConn is an admitted connection. Its fields other than Conn are
// guarded by admission.mu.
type admitConn struct {
	net.Conn
	adm     *admission
	source  netip.Addr
	tracked bool          // counted in open; false once closed or shed
	elem    *list.Element // in admission.waiting; nil while in a handler
	srcElem *list.Element // in its source's waiting list
}

func newAdmission(maxConns, maxPerAddr int, logger *slog.Logger, reg prometheus.Registerer) *admission {
	a := &admission{
		maxConns: maxConns, maxPerAddr: maxPerAddr, logger: logger, sources: map[netip.Addr]*admitSource{},
		logged: logpace.New(logpace.Interval),
		shed: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "http", Name: "connections_shed_total",
			Help: "HTTP connections not inside a handler closed to make room for a new one, by the cap reached " +
				"(total_cap: http.max_conns, address_cap: http.max_conns_per_addr).",
		}, []string{"reason"}),
		refused: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "http", Name: "connections_refused_total",
			Help: "New HTTP connections closed at once because every connection counted against the cap was inside " +
				"a handler, by the cap (total_cap, address_cap).",
		}, []string{"reason"}),
		openGauge: promauto.With(reg).NewGauge(prometheus.GaugeOpts{
			Namespace: "gateway", Subsystem: "http", Name: "connections_open",
			Help: "Open HTTP connections (capped by http.max_conns).",
		}),
	}
	for _, r := range []string{admitTotalCap, admitAddressCap} {
		a.shed.WithLabelValues(r)
		a.refused.WithLabelValues(r)
	}
	return a
}

// admit tracks c, shedding waiting connections when a cap is reached; it
// returns nil, having closed c, when c itself is refused.
func (a *admission) admit(c net.Conn) *admitConn {
	ac := &admitConn{Conn: c, adm: a, source: listen.SourceOf(c.RemoteAddr())}
	victims, reason := a.makeRoom(ac)
	for _, v := range victims {
		_ = v.Conn.Close()
	}
	if reason != "" {
		_ = c.Close()
	}
	if len(victims) > 0 || reason != "" {
		a.logNow(c.RemoteAddr())
	}
	if reason != "" {
		return nil
	}
	return ac
}

// logNow writes what was shed and refused since the last log line, at
// most once per logpace.Interval; addr is the newest connection's.
func (a *admission) logNow(addr net.Addr) {
	counts := a.logged.Take()
	if counts == nil {
		return
	}
	a.logger.Warn("HTTP connection caps reached: waiting connections shed for new ones (see gateway_http_connections_shed_total)",
		"shed_total_cap", counts["shed_"+admitTotalCap], "shed_address_cap", counts["shed_"+admitAddressCap],
		"refused_total_cap", counts["refused_"+admitTotalCap], "refused_address_cap", counts["refused_"+admitAddressCap],
		"max_conns", a.maxConns, "max_conns_per_addr", a.maxPerAddr, "newest_from", addr.String())
}

// makeRoom sheds up to one waiting connection for each cap reached and
// admits ac, or admits nothing and returns the cap that refuses ac.
func (a *admission) makeRoom(ac *admitConn) (victims []*admitConn, refused string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	src := a.sources[ac.source]
	var bySource *admitConn
	if src != nil && src.open >= a.maxPerAddr {
		if src.waiting.Len() == 0 {
			return nil, a.refuse(admitAddressCap)
		}
		bySource = src.waiting.Front().Value.(*admitConn)
	}
	var byTotal *admitConn
	if open := a.open - countOf(bySource); open >= a.maxConns {
		e := a.waiting.Front()
		if e != nil && e.Value.(*admitConn) == bySource {
			e = e.Next()
		}
		if e == nil {
			return nil, a.refuse(admitTotalCap)
		}
		byTotal = e.Value.(*admitConn)
	}
	if bySource != nil {
		victims = append(victims, a.shedConn(bySource, admitAddressCap))
	}
	if byTotal != nil {
		victims = append(victims, a.shedConn(byTotal, admitTotalCap))
	}
	if src = a.sources[ac.source]; src == nil { // untrack may have removed it
		src = &admitSource{}
		a.sources[ac.source] = src
	}
	ac.tracked = true
	a.open++
	src.open++
	a.openGauge.Set(float64(a.open))
	a.wait(ac, src)
	return victims, ""
}

// refuse counts a refused newcomer; a.mu is held.
func (a *admission) refuse(reason string) string {
	a.refused.WithLabelValues(reason).Inc()
	a.logged.Count("refused_" + reason)
	return reason
}

// shedConn forgets a waiting connection to be closed; a.mu is held.
func (a *admission) shedConn(ac *admitConn, reason string) *admitConn {
	a.untrack(ac)
	a.shed.WithLabelValues(reason).Inc()
	a.logged.Count("shed_" + reason)
	return ac
}

func countOf(c *admitConn) int {
	if c == nil {
		return 0
	}
	return 1
}

// wait puts a tracked connection at the end of the waiting lists.
func (a *admission) wait(ac *admitConn, src *admitSource) {
	ac.elem = a.waiting.PushBack(ac)
	ac.srcElem = src.waiting.PushBack(ac)
}

// unwait takes a connection out of the waiting lists.
func (a *admission) unwait(ac *admitConn) {
	if ac.elem == nil {
		return
	}
	a.waiting.Remove(ac.elem)
	a.sources[ac.source].waiting.Remove(ac.srcElem)
	ac.elem, ac.srcElem = nil, nil
}

// untrack forgets a connection; a.mu is held.
func (a *admission) untrack(ac *admitConn) {
	if !ac.tracked {
		return
	}
	a.unwait(ac)
	ac.tracked = false
	a.open--
	a.openGauge.Set(float64(a.open))
	src := a.sources[ac.source]
	if src.open--; src.open == 0 {
		delete(a.sources, ac.source)
	}
}

// enterHandler marks a connection as inside a handler: it is not shed.
func (a *admission) enterHandler(ac *admitConn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.unwait(ac)
}

// leaveHandler makes a connection waiting again, as the one that has
// waited least.
func (a *admission) leaveHandler(ac *admitConn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ac.tracked && ac.elem == nil {
		a.wait(ac, a.sources[ac.source])
	}
}

// Close forgets the connection and closes it.
func (c *admitConn) Close() error {
	c.adm.mu.Lock()
	c.adm.untrack(c)
	c.adm.mu.Unlock()
	return c.Conn.Close()
}

// CloseWrite half-closes a TCP connection (net/http does so before closing
// one whose request it refused, so that its answer is not lost to a reset).
func (c *admitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// admitListener admits each accepted connection; refused ones are closed
// and never reach the server.
type admitListener struct {
	net.Listener
	adm *admission
}

func (l admitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ac := l.adm.admit(c); ac != nil {
			return ac, nil
		}
	}
}

// admitConnKey is the context key of a request's *admitConn.
type admitConnKey struct{}

// connContext is the http.Server's ConnContext: it records the admitted
// connection (under a TLS connection, its transport) for handlers.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if ac, ok := c.(*admitConn); ok {
		return context.WithValue(ctx, admitConnKey{}, ac)
	}
	return ctx
}

// inHandler marks the request's connection as inside a handler while next
// runs, so that it is not shed.
func inHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ac, ok := r.Context().Value(admitConnKey{}).(*admitConn); ok {
			ac.adm.enterHandler(ac)
			defer ac.adm.leaveHandler(ac)
		}
		next.ServeHTTP(w, r)
	})
}

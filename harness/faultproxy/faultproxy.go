// Package faultproxy is an HTTP reverse proxy that injects the faults of a
// flaky link to DynamoDB. It sits between a client (gatewayd's uplink, with
// --dynamodb-endpoint pointing at the proxy) and DynamoDB Local, and does to
// each request what its current plan says:
//
//   - pass: forward the request and the answer unchanged;
//   - latency: wait Fault.Delay, then forward;
//   - reset: reset the client connection (TCP RST) before forwarding
//     anything: DynamoDB never sees the request;
//   - lost_response: forward the request, let DynamoDB answer (so a write is
//     committed), then reset the client connection: the answer is lost after
//     the write, the classic maker of duplicates;
//   - truncate: forward, then send the answer's status and headers with its
//     full Content-Length but only half of its body, and close;
//   - blackhole: read the request and never answer, until the plan changes
//     (the connection is then reset) or the client gives up;
//   - throttle: answer HTTP 400 with DynamoDB's JSON error
//     ProvisionedThroughputExceededException or ThrottlingException;
//   - error5xx: answer HTTP 500 InternalServerError or HTTP 503
//     ServiceUnavailable, as DynamoDB's JSON error.
//
// A plan is one fault for every request ([Proxy.Set]) or a mix in which each
// request draws its fault from a seeded random number generator
// ([Proxy.Mix]). Every mode applied is counted ([Proxy.Stats]). A Proxy is
// safe for concurrent use; its plan may change while requests are in flight.
//
// The proxy speaks HTTP/1.1 to its clients and holds whole answers in
// memory, which suits DynamoDB's JSON API. When the upstream cannot be
// reached it resets the client connection, so the client sees a network
// error as it would without the proxy.
package faultproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Mode is what the proxy does to a request.
type Mode string

// The modes; see the package documentation.
const (
	Pass         Mode = "pass"
	Latency      Mode = "latency"
	Reset        Mode = "reset"
	LostResponse Mode = "lost_response"
	Truncate     Mode = "truncate"
	Blackhole    Mode = "blackhole"
	Throttle     Mode = "throttle"
	Error5xx     Mode = "error5xx"
)

// Modes returns every mode, pass first.
func Modes() []Mode {
	return []Mode{Pass, Latency, Reset, LostResponse, Truncate, Blackhole, Throttle, Error5xx}
}

// DynamoDB error codes the proxy answers with (the part of __type after '#').
const (
	CodeProvisionedThroughputExceeded = "ProvisionedThroughputExceededException"
	CodeThrottling                    = "ThrottlingException"
	CodeInternalServerError           = "InternalServerError"
	CodeServiceUnavailable            = "ServiceUnavailable"
)

// errorAnswers are the canned DynamoDB errors, by code.
var errorAnswers = map[string]struct {
	status   int
	typeName string
	message  string
}{
	CodeProvisionedThroughputExceeded: {http.StatusBadRequest, "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
		"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API."},
	CodeThrottling: {http.StatusBadRequest, "com.amazon.coral.availability#ThrottlingException",
		"Rate of requests exceeds the allowed throughput."},
	CodeInternalServerError: {http.StatusInternalServerError, "com.amazonaws.dynamodb.v20120810#InternalServerError",
		"Internal server error"},
	CodeServiceUnavailable: {http.StatusServiceUnavailable, "com.amazonaws.dynamodb.v20120810#ServiceUnavailable",
		"Service unavailable"},
}

// modeCodes are the codes of the error modes; an empty Fault.Code takes them
// in turn.
var modeCodes = map[Mode][]string{
	Throttle: {CodeProvisionedThroughputExceeded, CodeThrottling},
	Error5xx: {CodeInternalServerError, CodeServiceUnavailable},
}

// Fault is what the proxy does to one request.
type Fault struct {
	// Mode is the kind of fault. The zero value means Pass.
	Mode Mode
	// Delay is the wait before forwarding, for Latency. Zero forwards at once.
	Delay time.Duration
	// Code chooses the error of Throttle (CodeProvisionedThroughputExceeded
	// or CodeThrottling) and of Error5xx (CodeInternalServerError, HTTP 500,
	// or CodeServiceUnavailable, HTTP 503). Empty takes the mode's two
	// errors in turn, request by request.
	Code string
}

func (f Fault) String() string {
	switch {
	case f.Mode == "":
		return string(Pass)
	case f.Mode == Latency:
		return fmt.Sprintf("%s(%s)", f.Mode, f.Delay)
	case f.Code != "":
		return fmt.Sprintf("%s(%s)", f.Mode, f.Code)
	}
	return string(f.Mode)
}

func (f Fault) validate() error {
	switch f.Mode {
	case "", Pass, Reset, LostResponse, Truncate, Blackhole:
	case Latency:
		if f.Delay < 0 {
			return fmt.Errorf("faultproxy: negative latency %s", f.Delay)
		}
	case Throttle, Error5xx:
		if f.Code == "" {
			break
		}
		ok := false
		for _, c := range modeCodes[f.Mode] {
			ok = ok || c == f.Code
		}
		if !ok {
			return fmt.Errorf("faultproxy: code %q is not one of %v for %s", f.Code, modeCodes[f.Mode], f.Mode)
		}
	default:
		return fmt.Errorf("faultproxy: unknown mode %q", f.Mode)
	}
	if f.Mode != Latency && f.Delay != 0 {
		return fmt.Errorf("faultproxy: a delay needs mode %s, not %s", Latency, f.Mode)
	}
	return nil
}

// Chance is a fault that a share of the requests get.
type Chance struct {
	Fault
	// P is the probability that a request gets Fault, in (0, 1].
	P float64
}

// Config configures a Proxy.
type Config struct {
	// Target is the upstream base URL, e.g. "http://127.0.0.1:8000". Required.
	Target string
	// Addr is the address Listen binds. Default "127.0.0.1:0" (a free
	// loopback port).
	Addr string
	// Seed seeds the random number generator that draws the fault of each
	// request under a Mix, so that a run can be repeated.
	Seed uint64
	// UpstreamTimeout bounds a request forwarded for LostResponse and
	// Truncate, which is not cancelled when the client goes away (the write
	// must happen). Default 30s.
	UpstreamTimeout time.Duration
}

// Stats counts what the proxy did since it was created.
type Stats struct {
	// Requests counts requests by the mode applied to them.
	Requests map[Mode]uint64
	// Errors counts canned error answers (Throttle, Error5xx) by code.
	Errors map[string]uint64
	// Forwarded counts requests that reached the upstream and got its answer.
	Forwarded uint64
	// AnswersLost counts requests the upstream answered whose answer the
	// client did not get whole (LostResponse, Truncate): writes that
	// happened without the client knowing.
	AnswersLost uint64
	// UpstreamErrors counts requests the upstream did not answer (refused,
	// reset, hung up); the client's connection was reset.
	UpstreamErrors uint64
	// Abandoned counts requests whose client went away (gave up, or its
	// process ended) before the answer.
	Abandoned uint64
	// Released counts blackholed requests reset because the plan changed or
	// the proxy stopped; the others ended when their client gave up
	// (Abandoned).
	Released uint64
}

// Total returns the number of requests, all modes together.
func (s Stats) Total() uint64 {
	var n uint64
	for _, v := range s.Requests {
		n += v
	}
	return n
}

// Proxy is the fault-injecting reverse proxy. It is an http.Handler; Listen
// and Run serve it on a loopback port.
type Proxy struct {
	cfg    Config
	target *url.URL
	client *http.Client
	log    *slog.Logger

	mu      sync.Mutex
	chances []Chance      // the current plan; one with P 1 is "every request"
	changed chan struct{} // closed when the plan changes
	rng     *rand.Rand
	turn    map[Mode]int // next code index of the error modes
	stats   Stats

	listener net.Listener
	server   *http.Server
}

// New validates cfg and returns a proxy in Pass mode. It does no I/O.
// A nil logger discards the log.
func New(cfg Config, logger *slog.Logger) (*Proxy, error) {
	target, err := url.Parse(cfg.Target)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		return nil, fmt.Errorf("faultproxy: target %q is not an http(s) URL", cfg.Target)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = 30 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		DisableCompression:    true, // bodies pass through byte for byte
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // the client's own timeout governs a hung upstream
	}
	return &Proxy{
		cfg:     cfg,
		target:  target,
		client:  &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		log:     logger.With("component", "faultproxy"),
		changed: make(chan struct{}),
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x6661756c74)), // "fault"
		turn:    map[Mode]int{},
		stats:   Stats{Requests: map[Mode]uint64{}, Errors: map[string]uint64{}},
	}, nil
}

// Set makes every later request get f. Requests held by Blackhole are
// released (their connections reset).
func (p *Proxy) Set(f Fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	p.setPlan([]Chance{{Fault: f, P: 1}})
	return nil
}

// Mix makes each later request draw its fault: the first chance with
// probability chances[0].P, else the second with chances[1].P, and so on;
// a request that draws none is passed. The probabilities must add up to at
// most 1. Requests held by Blackhole are released.
func (p *Proxy) Mix(chances ...Chance) error {
	sum := 0.0
	for _, c := range chances {
		if err := c.validate(); err != nil {
			return err
		}
		if !(c.P > 0 && c.P <= 1) {
			return fmt.Errorf("faultproxy: probability %v of %s is not in (0, 1]", c.P, c.Fault)
		}
		sum += c.P
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("faultproxy: probabilities add up to %v, more than 1", sum)
	}
	p.setPlan(append([]Chance(nil), chances...))
	return nil
}

func (p *Proxy) setPlan(chances []Chance) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.chances = chances
	close(p.changed)
	p.changed = make(chan struct{})
}

// Plan describes the current plan, e.g. "pass" or "lost_response 50%".
func (p *Proxy) Plan() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.chances) == 0 {
		return string(Pass)
	}
	parts := make([]string, 0, len(p.chances))
	for _, c := range p.chances {
		if c.P == 1 {
			parts = append(parts, c.Fault.String())
		} else {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", c.Fault, c.P*100))
		}
	}
	return strings.Join(parts, ", ")
}

// Stats returns a copy of the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Requests = make(map[Mode]uint64, len(p.stats.Requests))
	for k, v := range p.stats.Requests {
		s.Requests[k] = v
	}
	s.Errors = make(map[string]uint64, len(p.stats.Errors))
	for k, v := range p.stats.Errors {
		s.Errors[k] = v
	}
	return s
}

// draw picks the fault of one request, counts it and returns it with the
// channel that closes when the plan changes.
func (p *Proxy) draw() (Fault, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := Fault{Mode: Pass}
	if len(p.chances) == 1 && p.chances[0].P == 1 {
		f = p.chances[0].Fault
	} else if len(p.chances) > 0 {
		x := p.rng.Float64()
		for _, c := range p.chances {
			if x < c.P {
				f = c.Fault
				break
			}
			x -= c.P
		}
	}
	if f.Mode == "" {
		f.Mode = Pass
	}
	if codes := modeCodes[f.Mode]; codes != nil && f.Code == "" {
		f.Code = codes[p.turn[f.Mode]%len(codes)]
		p.turn[f.Mode]++
	}
	p.stats.Requests[f.Mode]++
	if f.Code != "" {
		p.stats.Errors[f.Code]++
	}
	return f, p.changed
}

func (p *Proxy) count(f func(*Stats)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.stats)
}

// ServeHTTP applies the current plan to one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fault, changed := p.draw()
	if fault.Mode == Reset {
		resetConn(w)
		return
	}
	// Read the whole request first: the upstream gets it in one piece, and
	// the server notices a client that goes away only once the body is read.
	body, err := io.ReadAll(r.Body)
	if err != nil {
		resetConn(w)
		return
	}
	switch fault.Mode {
	case Blackhole:
		select {
		case <-r.Context().Done(): // the client gave up
			p.count(func(s *Stats) { s.Abandoned++ })
			resetConn(w)
		case <-changed:
			p.count(func(s *Stats) { s.Released++ })
			resetConn(w)
		}
		return
	case Throttle, Error5xx:
		writeError(w, fault.Code)
		return
	case Latency:
		t := time.NewTimer(fault.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			p.count(func(s *Stats) { s.Abandoned++ })
			resetConn(w)
			return
		}
	}

	ctx := r.Context()
	if fault.Mode == LostResponse || fault.Mode == Truncate {
		// The write must reach the upstream even if the client gives up.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), p.cfg.UpstreamTimeout)
		defer cancel()
	}
	ans, err := p.forward(ctx, r, body)
	if err != nil {
		if r.Context().Err() != nil && fault.Mode != LostResponse && fault.Mode != Truncate {
			p.count(func(s *Stats) { s.Abandoned++ })
			resetConn(w)
			return
		}
		p.count(func(s *Stats) { s.UpstreamErrors++ })
		p.log.Debug("upstream did not answer; resetting the client", "err", err)
		resetConn(w)
		return
	}
	p.count(func(s *Stats) { s.Forwarded++ })
	switch fault.Mode {
	case LostResponse:
		p.count(func(s *Stats) { s.AnswersLost++ })
		resetConn(w)
	case Truncate:
		p.count(func(s *Stats) { s.AnswersLost++ })
		writeTruncated(w, ans)
	default:
		writeAnswer(w, ans)
	}
}

// answer is an upstream answer, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// hopHeaders are the hop-by-hop headers a proxy does not pass on.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func (p *Proxy) forward(ctx context.Context, r *http.Request, body []byte) (*answer, error) {
	u := *p.target
	u.Path = strings.TrimRight(p.target.Path, "/") + r.URL.Path
	u.RawQuery = r.URL.RawQuery
	req, err := http.NewRequestWithContext(ctx, r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = r.Header.Clone()
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	// Keep the Host the client signed (SigV4 signs it).
	req.Host = r.Host
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	h := resp.Header.Clone()
	for _, name := range hopHeaders {
		h.Del(name)
	}
	h.Del("Content-Length")
	return &answer{status: resp.StatusCode, header: h, body: raw}, nil
}

func writeAnswer(w http.ResponseWriter, a *answer) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// writeTruncated sends a's status and headers with its full Content-Length,
// half of its body, and closes the connection.
func writeTruncated(w http.ResponseWriter, a *answer) {
	conn, rw, err := hijack(w)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	defer conn.Close()
	length, half := len(a.body), len(a.body)/2
	if length == 0 {
		length = 1 // promise a byte that never comes
	}
	h := a.header.Clone()
	h.Set("Content-Length", strconv.Itoa(length))
	h.Set("Connection", "close")
	fmt.Fprintf(rw, "HTTP/1.1 %d %s\r\n", a.status, http.StatusText(a.status))
	_ = h.Write(rw)
	_, _ = rw.WriteString("\r\n")
	_, _ = rw.Write(a.body[:half])
	_ = rw.Flush()
}

// writeError answers with DynamoDB's JSON error for code.
func writeError(w http.ResponseWriter, code string) {
	e := errorAnswers[code]
	body := fmt.Sprintf(`{"__type":%q,"message":%q}`, e.typeName, e.message)
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-Requestid", fmt.Sprintf("FAULTPROXY%016X", rand.Uint64()))
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.status)
	_, _ = io.WriteString(w, body)
}

// resetConn closes the client connection with a TCP RST, without an answer.
func resetConn(w http.ResponseWriter) {
	conn, _, err := hijack(w)
	if err != nil {
		// Not hijackable (HTTP/2): abort, which at least closes the stream.
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func hijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("faultproxy: connection cannot be hijacked")
	}
	return hj.Hijack()
}

// Listen binds Config.Addr.
func (p *Proxy) Listen() error {
	l, err := net.Listen("tcp", p.cfg.Addr)
	if err != nil {
		return fmt.Errorf("faultproxy: listening on %s: %w", p.cfg.Addr, err)
	}
	p.listener = l
	return nil
}

// Addr returns the bound address (after Listen).
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// URL returns the proxy's base URL (after Listen), for clients.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Run serves until ctx is done, then releases blackholed requests, closes
// every connection and returns. It listens first if Listen was not called.
func (p *Proxy) Run(ctx context.Context) error {
	if p.listener == nil {
		if err := p.Listen(); err != nil {
			return err
		}
	}
	p.server = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- p.server.Serve(p.listener) }()
	select {
	case err := <-errc:
		return fmt.Errorf("faultproxy: serving: %w", err)
	case <-ctx.Done():
	}
	p.setPlan(nil) // release blackholed requests
	err := p.server.Close()
	<-errc
	p.client.CloseIdleConnections()
	return err
}

// Package invokeproxy serialises Lambda Invoke requests in front of the
// AWS Lambda Runtime Interface Emulator, which crashes when two invokes
// reach it at once (upstream issue #97). The proxy forwards one request
// at a time and holds the next ones until the emulator answered the one
// before, even when that one's caller has gone away (a killed gateway, a
// timed-out invocation): the emulator is still running it.
//
// With several emulators (each running the function once) the proxy
// passes each invoke to a free one, as Lambda passes invocations to its
// concurrent instances.
//
// It is a development and test tool.
package invokeproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"
)

// maxPayload bounds a request body: Lambda's 6 MB synchronous payload.
const maxPayload = 6 << 20

// Proxy forwards requests to emulators, one at a time to each.
type Proxy struct {
	upstreams []*url.URL
	timeout   time.Duration
	logger    *slog.Logger
	client    *http.Client
	ln        net.Listener
	srv       *http.Server

	// free holds the indexes of the emulators without a request.
	free chan int
}

// New returns a proxy to the emulators at upstreams (base URLs, e.g.
// http://127.0.0.1:9001); timeout bounds one invocation at an emulator
// (0: 5 minutes). It does no I/O.
func New(upstreams []string, timeout time.Duration, logger *slog.Logger) (*Proxy, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("invokeproxy: no upstream")
	}
	p := &Proxy{free: make(chan int, len(upstreams))}
	for i, up := range upstreams {
		u, err := url.Parse(up)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("invokeproxy: upstream %q must be an http URL with a host", up)
		}
		p.upstreams = append(p.upstreams, u)
		p.free <- i
	}
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p.timeout, p.logger, p.client = timeout, logger, &http.Client{}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	return p, nil
}

// Listen binds addr (e.g. 127.0.0.1:0).
func (p *Proxy) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("invokeproxy: %w", err)
	}
	p.ln = ln
	return nil
}

// URL is the proxy's base URL, for a Lambda client's endpoint.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Run serves until ctx is done or Close is called.
func (p *Proxy) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = p.srv.Close() })
	defer stop()
	if err := p.srv.Serve(p.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("invokeproxy: %w", err)
	}
	return nil
}

// Handler is the proxy's handler, for a server of the caller's.
func (p *Proxy) Handler() http.Handler { return p.srv.Handler }

// Close stops serving.
func (p *Proxy) Close() error { return p.srv.Close() }

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPayload))
	if err != nil {
		http.Error(w, `{"Type":"User","message":"request body: `+err.Error()+`"}`, http.StatusRequestEntityTooLarge)
		return
	}
	var i int
	select {
	case i = <-p.free:
	case <-r.Context().Done():
		return // gone before anything was sent
	}
	resp, respBody, err := p.forward(p.upstreams[i], r, body)
	p.free <- i
	if err != nil {
		p.logger.Warn("the emulator did not answer", "path", r.URL.Path, "err", err)
		w.Header().Set("X-Amzn-ErrorType", "ServiceException")
		http.Error(w, `{"Type":"Service","message":"emulator unreachable"}`, http.StatusBadGateway)
		return
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(respBody)
}

// forward sends one request to an emulator and reads its whole answer.
// Its context is not the caller's: a caller that goes away does not end
// the invocation at the emulator, so the next one must wait for it.
func (p *Proxy) forward(upstream *url.URL, r *http.Request, body []byte) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	target := *upstream
	target.Path, target.RawQuery = r.URL.Path, r.URL.RawQuery
	req, err := http.NewRequestWithContext(ctx, r.Method, target.String(), bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	return resp, respBody, nil
}

package byterelay

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// Relay is a running relay. Its counts only grow, from Start on; Counts
// and Counts.Sub give what crossed it over a window.
type Relay struct {
	ln     net.Listener
	target string
	up     atomic.Int64 // from the clients
	down   atomic.Int64 // to the clients
	conns  atomic.Int64
	reqs   atomic.Int64
	// unparsed counts client streams that stopped being HTTP/1.x before
	// they ended: their later requests are not counted.
	unparsed atomic.Int64

	opsMu sync.Mutex
	ops   map[string]Operation // by X-Amz-Target

	wg     sync.WaitGroup
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
}

// Counts is what crossed a relay.
type Counts struct {
	// Up is the bytes from the clients to the target, Down the bytes back.
	Up   int64 `json:"bytes_up"`
	Down int64 `json:"bytes_down"`
	// Connections is the connections relayed (accepted and connected to
	// the target).
	Connections int64 `json:"connections"`
	// Requests is the HTTP/1.x requests read from the clients' streams.
	Requests int64 `json:"requests"`
	// Unparsed is the connections whose stream stopped parsing as HTTP/1.x
	// requests before it ended.
	Unparsed int64 `json:"connections_unparsed"`
}

// Operation is the requests of one API operation (their X-Amz-Target
// header, "" for requests without one) and their bytes up: request line,
// headers and body.
type Operation struct {
	Requests int64 `json:"requests"`
	Up       int64 `json:"bytes_up"`
}

// Operations is the requests and bytes up by operation.
type Operations map[string]Operation

// Sub is o minus before: what crossed between two readings.
func (o Operations) Sub(before Operations) Operations {
	out := Operations{}
	for k, v := range o {
		b := before[k]
		if d := (Operation{Requests: v.Requests - b.Requests, Up: v.Up - b.Up}); d.Requests != 0 || d.Up != 0 {
			out[k] = d
		}
	}
	return out
}

// Sub is c minus before: what crossed between two readings.
func (c Counts) Sub(before Counts) Counts {
	return Counts{Up: c.Up - before.Up, Down: c.Down - before.Down, Connections: c.Connections - before.Connections,
		Requests: c.Requests - before.Requests, Unparsed: c.Unparsed - before.Unparsed}
}

// Add is c plus o.
func (c Counts) Add(o Counts) Counts {
	return Counts{Up: c.Up + o.Up, Down: c.Down + o.Down, Connections: c.Connections + o.Connections,
		Requests: c.Requests + o.Requests, Unparsed: c.Unparsed + o.Unparsed}
}

// Start listens on a free port of 127.0.0.1 and relays every connection to
// target (host:port) until Close.
func Start(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: target, open: map[net.Conn]struct{}{}, ops: map[string]Operation{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's address, host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// URL is http:// and the relay's address: an endpoint for an HTTP client.
func (r *Relay) URL() string { return "http://" + r.Addr() }

// Up is the bytes relayed from the clients to the target so far.
func (r *Relay) Up() int64 { return r.up.Load() }

// Down is the bytes relayed from the target to the clients so far.
func (r *Relay) Down() int64 { return r.down.Load() }

// Connections is the connections relayed so far.
func (r *Relay) Connections() int64 { return r.conns.Load() }

// Requests is the HTTP/1.x requests the clients sent so far.
func (r *Relay) Requests() int64 { return r.reqs.Load() }

// Counts reads every count.
func (r *Relay) Counts() Counts {
	return Counts{Up: r.up.Load(), Down: r.down.Load(), Connections: r.conns.Load(), Requests: r.reqs.Load(),
		Unparsed: r.unparsed.Load()}
}

// Operations reads the requests and bytes up by operation so far. A
// request is counted once its body has been read.
func (r *Relay) Operations() Operations {
	r.opsMu.Lock()
	defer r.opsMu.Unlock()
	out := make(Operations, len(r.ops))
	for k, v := range r.ops {
		out[k] = v
	}
	return out
}

// Close stops listening, closes every relayed connection and waits for the
// relay's goroutines.
func (r *Relay) Close() error {
	err := r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.open {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// track adds c to the open connections, or reports false once the relay
// is closed.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.open[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.open, c)
	r.mu.Unlock()
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !r.track(in) || !r.track(out) {
			r.untrack(in)
			_ = in.Close()
			_ = out.Close()
			return
		}
		r.conns.Add(1)
		r.wg.Add(3)
		parse, requests := io.Pipe()
		go r.countRequests(parse)
		go r.pipe(out, in, &r.up, requests)
		go r.pipe(in, out, &r.down, nil)
	}
}

// pipe copies src to dst, counting in n, and each byte to tee too when it
// is not nil; then closes both connections (and tee).
func (r *Relay) pipe(dst, src net.Conn, n *atomic.Int64, tee *io.PipeWriter) {
	defer r.wg.Done()
	_, _ = io.Copy(countingWriter{w: dst, n: n, tee: tee}, src)
	if tee != nil {
		_ = tee.Close()
	}
	_ = dst.Close()
	_ = src.Close()
	r.untrack(dst)
	r.untrack(src)
}

// countRequests reads HTTP/1.x requests, bodies included, off a client's
// stream and counts them; once the stream is not HTTP/1.x it reads the
// rest unparsed.
func (r *Relay) countRequests(stream *io.PipeReader) {
	defer r.wg.Done()
	counted := &countingReader{r: stream}
	br := bufio.NewReader(counted)
	for {
		start := counted.n - int64(br.Buffered())
		req, err := http.ReadRequest(br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.unparsed.Add(1)
			}
			break
		}
		_, err = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
		if err != nil {
			r.reqs.Add(1)
			r.unparsed.Add(1)
			break
		}
		op := req.Header.Get("X-Amz-Target")
		r.opsMu.Lock()
		o := r.ops[op]
		o.Requests++
		o.Up += counted.n - int64(br.Buffered()) - start
		r.ops[op] = o
		r.opsMu.Unlock()
		r.reqs.Add(1)
	}
	_, _ = io.Copy(io.Discard, br)
	_ = stream.Close()
}

// countingWriter counts what it writes to w, as it writes it, and passes
// the same bytes to tee.
type countingWriter struct {
	w   io.Writer
	n   *atomic.Int64
	tee *io.PipeWriter
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	if c.tee != nil && n > 0 {
		_, _ = c.tee.Write(p[:n])
	}
	return n, err
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

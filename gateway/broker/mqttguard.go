package broker

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/internal/listen"
)

// Limits on connections that have not authenticated yet. mochi itself
// sets no deadline before CONNECT, allocates a packet's declared remaining
// length before reading it, and keeps such connections forever
// (mochi-mqtt/server issue 502); the guard below bounds them, and the
// admission (mqttadmission.go) caps how many there are.
const (
	// defaultConnectTimeout is how long a new connection has to deliver its
	// whole CONNECT packet (TLS handshake included).
	defaultConnectTimeout = 10 * time.Second
	// maxConnectPacketSize is the largest CONNECT packet accepted, in bytes.
	// A device's CONNECT (client ID, hardware_id, API key) is well under
	// 1 KiB.
	maxConnectPacketSize = 16 << 10
	// defaultMaxUnauthenticated caps unauthenticated connections in total.
	defaultMaxUnauthenticated = 1024
	// defaultMaxUnauthenticatedPerAddress caps them per source address.
	defaultMaxUnauthenticatedPerAddress = 64
)

// Accept retries after an error other than a closed listener (too many
// open files, say) after a pause that doubles up to maxAcceptBackoff: mochi
// stops serving the listener for good at the first error Accept returns.
const (
	minAcceptBackoff = 5 * time.Millisecond
	maxAcceptBackoff = time.Second
)

// errMalformedStream ends a connection whose byte stream the guard refuses.
var errMalformedStream = errors.New("gateway: malformed MQTT stream")

// errShed ends a connection shed by the admission while it authenticated.
var errShed = errors.New("gateway: connection shed before it authenticated")

// guardListener hands mochi connections wrapped in a guardConn, each
// admitted as unauthenticated until OnConnect accepts it.
type guardListener struct {
	net.Listener
	timeout   time.Duration
	adm       *mqttAdmission
	maxPacket uint32
	refused   func(reason string)
	logger    *slog.Logger

	// handing counts connections Accept returned that mochi has not read
	// from yet (see drain); closing refuses new ones.
	handMu  sync.Mutex
	handing int
	closing bool
	idle    chan struct{} // closed when handing reaches 0 after closing
}

// handed hands c to mochi: counted until mochi first reads it or closes it.
func (l *guardListener) handed(c *guardConn) (net.Conn, error) {
	l.handMu.Lock()
	closing := l.closing
	if !closing {
		l.handing++
	}
	l.handMu.Unlock()
	if closing {
		c.taken.Do(func() {}) // never counted
		_ = c.Close()
		return nil, net.ErrClosed
	}
	return c, nil
}

func (l *guardListener) taken() {
	l.handMu.Lock()
	l.handing--
	if l.handing == 0 && l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
	l.handMu.Unlock()
}

// drain stops accepting and waits, at most timeout, until mochi has
// started reading every connection it was handed. mochi counts a
// connection in a WaitGroup (Listeners.ClientsWg.Add, before its first
// read) that Server.Close waits on; an Add racing that Wait is a data race
// in mochi, so the broker drains before it closes the server.
func (l *guardListener) drain(timeout time.Duration) {
	l.handMu.Lock()
	l.closing = true
	var idle chan struct{}
	if l.handing > 0 {
		idle = make(chan struct{})
		l.idle = idle
	}
	l.handMu.Unlock()
	_ = l.Listener.Close()
	if idle == nil {
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// Accept returns the next connection, shedding the connections its
// admission displaces.
func (l *guardListener) Accept() (net.Conn, error) {
	backoff := time.Duration(0)
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			backoff = min(max(2*backoff, minAcceptBackoff), maxAcceptBackoff)
			l.logger.Warn("accepting an MQTT connection failed; retrying", "err", err, "retry_in", backoff.String())
			time.Sleep(backoff)
			continue
		}
		return l.handed(l.guard(c))
	}
}

// guardReadBuffer is the read buffer every connection holds, idle or not,
// in bytes. It needs to hold only a packet's fixed header: a packet's body
// is read into its own buffer (readBody), straight from the socket once
// what the header's read brought along is copied. A packet larger than
// the buffer takes two reads; a batch's PUBLISH (1.5 KB or more at ten
// readings) took two with 1 KiB too, a packet of 128 B to 1 KiB now takes
// one more, and every idle device holds 900 bytes less.
const guardReadBuffer = 128

// guard wraps a new connection and admits it as unauthenticated.
func (l *guardListener) guard(c net.Conn) *guardConn {
	_ = c.SetReadDeadline(time.Now().Add(l.timeout)) // mochi resets it after CONNECT (keepalive)
	g := &guardConn{Conn: c, l: l, r: bufio.NewReaderSize(c, guardReadBuffer), version: 4}
	g.entry = admEntry{conn: rawConn(c), addr: listen.SourceOf(c.RemoteAddr())}
	for _, v := range l.adm.add(&g.entry) {
		l.refused(v.reason)
		_ = v.entry.conn.Close() // its reader fails and mochi ends it
	}
	return g
}

// rawConn returns the TCP connection under a TLS one: closing it ends a
// handshake at once, without a close_notify to a peer that may not read.
func rawConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}

// guardConn frames the MQTT packets of one connection before mochi reads
// them and passes each on unchanged, except that it ends the connection
// (Read fails, and mochi disconnects the client through its usual path)
// where mochi would misbehave:
//
//   - the first packet is not a CONNECT, or is larger than
//     maxConnectPacketSize, or is not complete within the connect timeout;
//   - a remaining length is encoded in more than 4 bytes;
//   - mochi's decoder panics on the packet (an MQTT 5 SUBSCRIBE without its
//     options byte: mochi-mqtt/server issue 501), which would otherwise end
//     the whole process.
//
// It also notes the rules of MQTT the CONNECT breaks that mochi does not
// check, and has MQTT 5 packets mochi would end the connection for without
// a word answered with a DISCONNECT (mqttconform.go).
//
// A packet's bytes are buffered as they arrive, so memory follows what a
// client has sent, not what its header declares.
type guardConn struct {
	net.Conn
	l       *guardListener
	r       *bufio.Reader
	pending []byte // bytes of checked packets not yet read by mochi
	// pooled is pending's buffer when it came from packetBufs: returned
	// there once mochi has read it all.
	pooled    *[]byte
	err       error // returned once pending is drained
	connected bool  // the CONNECT has passed
	version   byte  // protocol version of the CONNECT
	// connectRule is the rule of MQTT the CONNECT broke that mochi does
	// not check (mqttconform.go), answered by conformHook.OnConnect.
	connectRule *violation
	// disconnect is the reason code of the packet conform replaced.
	disconnect *packets.Code
	entry      admEntry
	// principal is who the CONNECT authenticated as (set by the gateway
	// hook's OnConnect, read by its OnPublish: both on the connection's
	// own goroutine).
	principal auth.Principal
	// acks answers the connection's deferred messages (the gateway
	// hook's OnPublish, on the connection's goroutine).
	acks ackPipe

	mu     sync.Mutex
	closed bool
	lease  func() // releases the session slots of an authenticated connection
	// taken ends the connection's count in the listener's handing.
	taken sync.Once
}

func (c *guardConn) Read(p []byte) (int, error) {
	c.taken.Do(c.l.taken)
	for len(c.pending) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		c.pending, c.err = c.next()
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	if len(c.pending) == 0 {
		c.pending = nil // an idle connection keeps no packet alive
		c.release()
	}
	return n, nil
}

// pooledPacket is the largest packet read into a buffer of packetBufs: a
// typical batch's PUBLISH fits.
const pooledPacket = 4096

// packetBufs holds the buffers packets are read into once the connection
// is established. Mochi copies a packet out as it reads it, so a buffer is
// free again as soon as the packet is read through, and the guard
// allocates none per packet. A CONNECT is read into its own buffer: what
// noteConnect keeps of it may point into it.
var packetBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, pooledPacket)
	return &b
}}

// release returns the buffer of the packet just read through, if pooled.
func (c *guardConn) release() {
	if c.pooled != nil {
		*c.pooled = (*c.pooled)[:0]
		packetBufs.Put(c.pooled)
		c.pooled = nil
	}
}

// Close closes the connection and releases what it holds: its place in
// the admission, or its session slots.
func (c *guardConn) Close() error {
	c.taken.Do(c.l.taken)
	c.mu.Lock()
	c.closed = true
	lease := c.lease
	c.lease = nil
	c.mu.Unlock()
	c.l.adm.remove(&c.entry)
	if lease != nil {
		lease()
	}
	return c.Conn.Close()
}

// authenticated takes the connection out of the admission once its
// credentials are accepted, and holds lease until it closes. It returns
// errShed, and releases lease, when the connection was shed or closed
// meanwhile.
func (c *guardConn) authenticated(lease func()) error {
	if !c.l.adm.remove(&c.entry) {
		lease()
		return errShed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		lease()
		return errShed
	}
	c.lease = lease
	return nil
}

// next reads one packet and returns its bytes for mochi, or what to hand
// mochi before failing with the error.
//
// An idle connection's goroutine waits here, below mochi's frames, for the
// next packet: the stack it holds while waiting decides how far the garbage
// collector can shrink it (only below a quarter in use), so next keeps its
// frame small and leaves decoding, with its packets.Packet, to frames that
// exist only while a packet is checked.
func (c *guardConn) next() ([]byte, error) {
	first, err := c.r.ReadByte()
	if err != nil {
		return nil, c.readErr(err)
	}
	return c.rest(first)
}

// rest reads the packet whose first byte is first.
func (c *guardConn) rest(first byte) ([]byte, error) {
	header := []byte{first}
	remaining := 0
	for i := 0; ; i++ {
		if i == 4 {
			return nil, c.refuse(fmt.Errorf("%w: remaining length longer than 4 bytes", errMalformedStream))
		}
		b, err := c.r.ReadByte()
		if err != nil {
			return nil, c.readErr(err)
		}
		header = append(header, b)
		remaining |= int(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			break
		}
	}
	var fh packets.FixedHeader
	fhErr := fh.Decode(first)
	if !c.connected {
		if fhErr != nil || fh.Type != packets.Connect {
			return nil, c.refuse(fmt.Errorf("%w: first packet is not a CONNECT", errMalformedStream))
		}
		if remaining+1 > maxConnectPacketSize {
			return nil, c.refuse(fmt.Errorf("%w: CONNECT of %d bytes, over %d", errMalformedStream, remaining+1, maxConnectPacketSize))
		}
	} else if c.l.maxPacket > 0 && uint32(remaining+1) > c.l.maxPacket {
		// mochi refuses it from the header alone (packet too large).
		return header, fmt.Errorf("%w: packet of %d bytes, over %d", errMalformedStream, remaining+1, c.l.maxPacket)
	}
	buf, err := c.readBody(header, remaining)
	if err != nil {
		return nil, c.readErr(err)
	}
	decodeErr := fhErr
	if fhErr == nil {
		fh.Remaining = remaining
		var version byte
		var panicked error
		version, decodeErr, panicked = tryDecode(fh, c.version, buf[len(header):])
		if panicked != nil {
			c.release()
			c.l.refused("malformed")
			c.l.logger.Warn("MQTT packet that mochi cannot decode; connection closed",
				"remote", c.RemoteAddr().String(), "err", panicked)
			return nil, panicked
		}
		if !c.connected && version != 0 {
			c.version = version
		}
	}
	if !c.connected {
		c.noteConnect(fh, buf[len(header):])
		c.connected = true
		c.l.adm.connecting(&c.entry)
	} else if pk := c.conform(fh.Type, decodeErr); pk != nil {
		c.release()
		return pk, nil
	}
	return buf, nil
}

// readBody returns header followed by the remaining bytes of its packet.
// On an established connection a packet of up to pooledPacket bytes is
// read into a buffer of packetBufs (c.pooled until released). Otherwise up
// to 4 KiB is allocated at once (a typical batch: one allocation of its
// size); a larger packet's buffer grows as its bytes arrive, at most
// doubling and never past the declared size.
func (c *guardConn) readBody(header []byte, remaining int) ([]byte, error) {
	total := len(header) + remaining
	var buf []byte
	if c.connected && total <= pooledPacket {
		c.pooled = packetBufs.Get().(*[]byte)
		buf = append((*c.pooled)[:0], header...)
	} else {
		buf = make([]byte, len(header), len(header)+min(remaining, 4096))
		copy(buf, header)
	}
	for len(buf) < total {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(total-len(buf), cap(buf)))
		}
		n, err := c.r.Read(buf[len(buf):min(cap(buf), total)])
		buf = buf[:len(buf)+n]
		if err != nil && len(buf) < total {
			c.release()
			return nil, err
		}
	}
	return buf, nil
}

// readErr counts a connection that did not deliver its CONNECT in time.
func (c *guardConn) readErr(err error) error {
	var ne net.Error
	if !c.connected && errors.As(err, &ne) && ne.Timeout() {
		c.l.refused("connect_timeout")
	}
	return err
}

func (c *guardConn) refuse(err error) error {
	c.l.refused("malformed")
	return err
}

// tryDecode runs mochi's decoder of the packet's type, as mochi's
// Client.ReadPacket will, and reports a panic as an error. It returns the
// packet's protocol version (a CONNECT's own) and the decoder's error.
func tryDecode(fh packets.FixedHeader, version byte, body []byte) (decoded byte, decodeErr, panicked error) {
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Errorf("%w: packet type %d does not decode (%v)", errMalformedStream, fh.Type, r)
		}
	}()
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: version}
	px := body // the decoders only read it
	switch fh.Type {
	case packets.Connect:
		decodeErr = pk.ConnectDecode(px)
	case packets.Disconnect:
		decodeErr = pk.DisconnectDecode(px)
	case packets.Connack:
		decodeErr = pk.ConnackDecode(px)
	case packets.Publish:
		decodeErr = pk.PublishDecode(px)
	case packets.Puback:
		decodeErr = pk.PubackDecode(px)
	case packets.Pubrec:
		decodeErr = pk.PubrecDecode(px)
	case packets.Pubrel:
		decodeErr = pk.PubrelDecode(px)
	case packets.Pubcomp:
		decodeErr = pk.PubcompDecode(px)
	case packets.Subscribe:
		decodeErr = pk.SubscribeDecode(px)
	case packets.Suback:
		decodeErr = pk.SubackDecode(px)
	case packets.Unsubscribe:
		decodeErr = pk.UnsubscribeDecode(px)
	case packets.Unsuback:
		decodeErr = pk.UnsubackDecode(px)
	case packets.Auth:
		decodeErr = pk.AuthDecode(px)
	}
	return pk.ProtocolVersion, decodeErr, nil
}

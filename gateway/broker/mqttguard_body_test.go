package broker

import (
	"bufio"
	"bytes"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

func TestGuardReadBody(t *testing.T) {
	header := []byte{0x30, 0x80, 0x01}
	tests := []struct {
		name      string
		remaining int
		sent      int // bytes of the body the client sends
		wantErr   error
	}{
		{"empty body", 0, 0, nil},
		{"one byte", 1, 1, nil},
		{"a typical batch", 2400, 2400, nil},
		{"exactly the first allocation", 4096, 4096, nil},
		{"one byte over it", 4097, 4097, nil},
		{"large packet", 200_000, 200_000, nil},
		{"more bytes follow the packet", 10, 25, nil},
		{"truncated small packet", 2400, 1000, io.EOF},
		{"truncated large packet", 200_000, 150_000, io.EOF},
		{"nothing sent", 50, 0, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := make([]byte, tt.sent)
			for i := range body {
				body[i] = byte(i * 7)
			}
			for _, slow := range []bool{false, true} {
				for _, connected := range []bool{false, true} {
					var r io.Reader = bytes.NewReader(body)
					if slow {
						r = iotest.OneByteReader(r)
					}
					c := &guardConn{r: bufio.NewReaderSize(r, 1024), connected: connected}
					got, err := c.readBody(header, tt.remaining)
					if tt.wantErr != nil {
						require.ErrorIs(t, err, tt.wantErr)
						require.Nil(t, c.pooled, "a failed read gives its buffer back")
						continue
					}
					require.NoError(t, err)
					require.Equal(t, header, got[:len(header)])
					require.Equal(t, body[:tt.remaining], got[len(header):])
					if connected && len(header)+tt.remaining <= pooledPacket {
						require.NotNil(t, c.pooled)
						require.Equal(t, pooledPacket, cap(got), "read into a pooled buffer")
						c.release()
						continue
					}
					require.Nil(t, c.pooled)
					require.LessOrEqual(t, cap(got), 2*(len(header)+tt.remaining)+64, "grows at most by doubling")
				}
			}
		})
	}
}

// TestGuardPooledBuffersKeepEveryPacketIntact reads two streams of
// PUBLISH packets of different sizes through two established guardConns,
// a few bytes from one and then from the other, as two connections'
// readers do while they share the pool: every byte of each comes out as
// sent.
func TestGuardPooledBuffersKeepEveryPacketIntact(t *testing.T) {
	publishes := func(seed byte) []byte {
		var stream bytes.Buffer
		for i := range 200 {
			body := []byte{0, 5, 'a', '/', 'b', '/', 'c', byte((i + 1) >> 8), byte(i + 1)} // topic, packet id
			body = append(body, bytes.Repeat([]byte{seed + byte(i)}, (i*37)%3000)...)
			stream.WriteByte(0x32) // PUBLISH, QoS 1
			for n := len(body); ; {
				b := byte(n & 0x7f)
				n >>= 7
				if n > 0 {
					b |= 0x80
				}
				stream.WriteByte(b)
				if n == 0 {
					break
				}
			}
			stream.Write(body)
		}
		return stream.Bytes()
	}
	type conn struct {
		c         *guardConn
		want, got []byte
		done      bool
	}
	var conns []*conn
	for _, seed := range []byte{1, 101} {
		want := publishes(seed)
		conns = append(conns, &conn{want: want, c: &guardConn{l: &guardListener{maxPacket: 1 << 20},
			r: bufio.NewReaderSize(bytes.NewReader(want), 1024), connected: true, version: 4}})
	}
	p := make([]byte, 97)
	for !conns[0].done || !conns[1].done {
		for i, cn := range conns {
			if cn.done {
				continue
			}
			n, err := cn.c.Read(p[:7+i*6])
			cn.got = append(cn.got, p[:n]...)
			if err == io.EOF {
				cn.done = true
				continue
			}
			require.NoError(t, err)
		}
	}
	for _, cn := range conns {
		require.Equal(t, len(cn.want), len(cn.got))
		require.True(t, bytes.Equal(cn.want, cn.got), "the packets read back as sent")
		require.Nil(t, cn.c.pooled)
	}
}

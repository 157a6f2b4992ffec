package ingest

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
				var r io.Reader = bytes.NewReader(body)
				if slow {
					r = iotest.OneByteReader(r)
				}
				c := &guardConn{r: bufio.NewReaderSize(r, 1024)}
				got, err := c.readBody(header, tt.remaining)
				if tt.wantErr != nil {
					require.ErrorIs(t, err, tt.wantErr)
					continue
				}
				require.NoError(t, err)
				require.Equal(t, header, got[:len(header)])
				require.Equal(t, body[:tt.remaining], got[len(header):])
				require.LessOrEqual(t, cap(got), 2*(len(header)+tt.remaining)+64, "grows at most by doubling")
			}
		})
	}
}

package cloud

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
)

// ByteCounts counts what a client's connections send and receive, at the
// socket: TLS records, HTTP headers and bodies, retries and connection
// set-ups included, which is what a metered link bills.
type ByteCounts struct {
	Sent, Received atomic.Int64
}

// WithByteCounts returns a DynamoDB client option that counts its
// connections' bytes in c.
func WithByteCounts(c *ByteCounts) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) { o.HTTPClient = c.client(o.HTTPClient) }
}

// WithLambdaByteCounts is WithByteCounts for a Lambda client.
func WithLambdaByteCounts(c *ByteCounts) func(*lambda.Options) {
	return func(o *lambda.Options) { o.HTTPClient = c.client(o.HTTPClient) }
}

// httpDoer is the HTTP client of an SDK service client.
type httpDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// client returns hc dialling through c, when hc is the SDK's buildable
// client (NewClient's and NewLambdaClient's); any other client is returned
// as it is, uncounted.
func (c *ByteCounts) client(hc httpDoer) httpDoer {
	b, ok := hc.(*awshttp.BuildableClient)
	if !ok {
		return hc
	}
	return b.WithTransportOptions(func(tr *http.Transport) {
		dial := tr.DialContext
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countedConn{Conn: conn, c: c}, nil
		}
	})
}

// countedConn is a connection whose reads and writes are counted.
type countedConn struct {
	net.Conn
	c *ByteCounts
}

func (cc countedConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	cc.c.Received.Add(int64(n))
	return n, err
}

func (cc countedConn) Write(p []byte) (int, error) {
	n, err := cc.Conn.Write(p)
	cc.c.Sent.Add(int64(n))
	return n, err
}

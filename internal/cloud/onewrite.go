package cloud

import (
	"bytes"
	"io"
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// requestBuffer is how much of a request each connection buffers before
// it writes (net/http's default is 4 KB): a BatchWriteItem of 25
// readings, headers included, is about 13 KB, and a BatchGetItem of 100
// markers about as much.
const requestBuffer = 32 << 10

// newHTTPClient is the SDK's buildable client with connections that
// buffer requestBuffer bytes of a request.
func newHTTPClient() *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.WriteBufferSize = max(tr.WriteBufferSize, requestBuffer)
	})
}

// oneWrite sends each request of up to requestBuffer bytes in one write.
// net/http writes a request's headers on their own before its body unless
// the body is one of the in-memory readers it knows, and the SDK wraps
// every body in its own reader: two writes, and two wake-ups of the
// server, for every request, and a copy buffer allocated for each body.
// oneWrite reads such a body into memory and hands it on as a
// bytes.Reader, so that headers and body fill the connection's buffer and
// go out together.
type oneWrite struct {
	next interface {
		Do(*http.Request) (*http.Response, error)
	}
}

// withOneWrite wraps a client's HTTP client in oneWrite.
func withOneWrite(o *dynamodb.Options) {
	if _, done := o.HTTPClient.(oneWrite); !done && o.HTTPClient != nil {
		o.HTTPClient = oneWrite{next: o.HTTPClient}
	}
}

func (c oneWrite) Do(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 || req.ContentLength > requestBuffer {
		return c.next.Do(req)
	}
	body := make([]byte, req.ContentLength)
	_, err := io.ReadFull(req.Body, body)
	if cerr := req.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	r := *req // the SDK builds a request for each attempt; this one is its own
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return c.next.Do(&r)
}

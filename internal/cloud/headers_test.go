package cloud_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/cloud"
)

// TestRequestsCarryNoTelemetryHeaders sends a DynamoDB and a Lambda call to
// an endpoint that records them: neither carries the SDK's invocation id or
// attempt header, the User-Agent is the gateway's, and the signature,
// computed again here over what arrived, is valid and names only what was
// sent.
func TestRequestsCarryNoTelemetryHeaders(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	type seen struct {
		header http.Header
		host   string
		body   []byte
		url    string
	}
	got := make(chan seen, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{header: r.Header.Clone(), host: r.Host, body: body, url: r.URL.String()}
		if strings.HasPrefix(r.URL.Path, "/2015-03-31/functions/") {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{}`))
			return
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := cloud.Config{Endpoint: srv.URL, Region: "eu-west-1"}

	ddb, err := cloud.NewClient(ctx, cfg)
	require.NoError(t, err)
	_, err = ddb.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{
		"readings": {{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "x"}}}}},
	}})
	require.NoError(t, err)
	fn, err := cloud.NewLambdaClient(ctx, cfg)
	require.NoError(t, err)
	_, err = fn.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("readings"), Payload: []byte(`{}`)})
	require.NoError(t, err)

	for _, service := range []string{"dynamodb", "lambda"} {
		s := <-got
		require.Empty(t, s.header.Values("Amz-Sdk-Invocation-Id"), service)
		require.Empty(t, s.header.Values("Amz-Sdk-Request"), service)
		require.Equal(t, "greenhouse-gateway", s.header.Get("User-Agent"), service)
		auth := s.header.Get("Authorization")
		require.Contains(t, auth, "SignedHeaders=", service)
		require.NotContains(t, auth, "amz-sdk-", service)

		// The signature over what arrived, computed by the SDK's signer.
		signedAt, err := time.Parse("20060102T150405Z", s.header.Get("X-Amz-Date"))
		require.NoError(t, err, service)
		req, err := http.NewRequest(http.MethodPost, srv.URL+s.url, bytes.NewReader(s.body))
		require.NoError(t, err)
		req.Host = s.host
		for _, name := range signedHeaderNames(auth) {
			if name != "host" && name != "content-length" {
				req.Header[http.CanonicalHeaderKey(name)] = s.header.Values(name)
			}
		}
		sum := sha256.Sum256(s.body)
		require.NoError(t, v4.NewSigner().SignHTTP(ctx, aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "secret"},
			req, hex.EncodeToString(sum[:]), service, "eu-west-1", signedAt), service)
		require.Equal(t, auth, req.Header.Get("Authorization"), service)
	}
}

// signedHeaderNames returns the SignedHeaders list of a SigV4 Authorization header.
func signedHeaderNames(auth string) []string {
	_, rest, _ := strings.Cut(auth, "SignedHeaders=")
	list, _, _ := strings.Cut(rest, ",")
	return strings.Split(list, ";")
}

package function_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function"
	"greenhouse-gateway/harness/dynamotest"
)

// postEvent posts body to /v1/readings and returns the whole response,
// headers included.
func (r *rig) postEvent(t *testing.T, headers map[string]string, body string) events.APIGatewayV2HTTPResponse {
	t.Helper()
	var resp events.APIGatewayV2HTTPResponse
	r.invoke(t, postRequest("/v1/readings", r.key, headers, body), &resp)
	return resp
}

// With the three documented variables alone (no TRANSACTION_MAX_ITEMS),
// the function finds DynamoDB Local's limit of 10 actions: a 10-reading
// batch (11 actions) is stored, over HTTP and in a gateway's event.
func TestThreeVariablesSufficeAgainstDynamoDBLocal(t *testing.T) {
	r := newRig(t, map[string]string{"TRANSACTION_MAX_ITEMS": ""})
	hw := "AA:BB:CC:00:15:31"
	b := batch(hw, base(), 0, 10, 21)
	code, resp := r.readings(t, nil, jsonOf(t, b))
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	require.Equal(t, contract.StatusAccepted, resp.Results[0].Status)
	require.Len(t, r.items(t, hw), 10)
	require.NotEmpty(t, r.marker(t, b.BatchID))

	next := batch(hw, base(), 20, 10, 21)
	var out function.BatchResponse
	r.invoke(t, nativeEvent(t, map[string]*contract.Batch{"c-1": next}, []string{"c-1"}), &out)
	require.Equal(t, function.StatusDelivered, out.Results[0].Status, "%+v", out.Results[0])
	require.Len(t, r.items(t, hw), 20)
}

// interceptedEndpoint is DynamoDB Local behind a proxy that hands each
// request to intercept first, which answers it itself when it returns
// true; the others go on to DynamoDB Local.
func interceptedEndpoint(t *testing.T, intercept func(w http.ResponseWriter, op string) bool) string {
	t.Helper()
	target, err := url.Parse(dynamotest.Shared(t).Endpoint)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, op, _ := strings.Cut(req.Header.Get("X-Amz-Target"), ".")
		if !intercept(w, op) {
			proxy.ServeHTTP(w, req)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// refusingEndpoint refuses every TransactWriteItems with a
// ValidationException about the request (message): what an endpoint does
// with a request it does not take, whatever the batch holds.
func refusingEndpoint(t *testing.T, message string) string {
	return interceptedEndpoint(t, func(w http.ResponseWriter, op string) bool {
		if op != "TransactWriteItems" {
			return false
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"com.amazon.coral.validate#ValidationException","message":"` + message + `"}`))
		return true
	})
}

// A refusal of the request, not of the batch, is answered as to be
// retried: 503 with Retry-After to a device, error (not rejected, which
// a gateway dead-letters) in a gateway's event; the function logs its
// cause.
func TestRequestRefusalIsRetriedNotRejected(t *testing.T) {
	r := newRig(t, map[string]string{"DYNAMODB_ENDPOINT": refusingEndpoint(t, "Transaction request cannot be larger than 4 MB")})
	hw := "AA:BB:CC:00:15:32"

	resp := r.postEvent(t, nil, jsonOf(t, batch(hw, base(), 0, 3, 21)))
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, resp.Body)
	require.Equal(t, "2", resp.Headers["Retry-After"])
	require.Contains(t, resp.Body, `"buffer_full"`)
	require.NotContains(t, resp.Body, `"validation_error"`)

	var out function.BatchResponse
	r.invoke(t, nativeEvent(t, map[string]*contract.Batch{"c-1": batch(hw, base(), 5, 3, 21)}, []string{"c-1"}), &out)
	require.Equal(t, function.StatusError, out.Results[0].Status, "%+v", out.Results[0])
	require.Contains(t, out.Results[0].Message, "request_limit")
	require.Empty(t, r.items(t, hw))

	require.Eventually(t, func() bool {
		return strings.Contains(r.em.Output(), `"cause":"request_limit"`)
	}, 30*time.Second, 50*time.Millisecond, "the refusal is logged with its cause:\n%s", r.em.Output())
}

package function_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/lambdatest"
)

// Two requests with one Idempotency-Key at once, in two execution
// environments: the second finds the first in progress and answers 503
// with Retry-After instead of doing the work again; the first's answer is
// the key's answer from then on. The first request's transaction is held
// at the endpoint until the second has answered.
func TestConcurrentRequestsWithOneIdempotencyKeyDoTheWorkOnce(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	var transactions atomic.Int32
	endpoint := interceptedEndpoint(t, func(_ http.ResponseWriter, op string) bool {
		if op == "TransactWriteItems" && transactions.Add(1) == 1 {
			close(held)
			<-release
		}
		return false
	})
	r := newRig(t, map[string]string{"DYNAMODB_ENDPOINT": endpoint})
	other := *r
	other.em = lambdatest.Start(t, lambdatest.BuildFunction(t), r.env)

	hw := "AA:BB:CC:00:15:51"
	body := jsonOf(t, batch(hw, base(), 0, 3, 21))
	key := map[string]string{"Idempotency-Key": "req-concurrent"}
	first := make(chan events.APIGatewayV2HTTPResponse, 1)
	go func() {
		defer close(first)
		payload, _ := json.Marshal(postRequest("/v1/readings", r.key, key, body))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := r.em.Invoke(ctx, payload)
		var resp events.APIGatewayV2HTTPResponse
		if err == nil && json.Unmarshal(out, &resp) == nil {
			first <- resp
		}
	}()
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		close(release)
		t.Fatalf("the first request's transaction never reached DynamoDB:\n%s", r.em.Output())
	}

	second := other.postEvent(t, key, body)
	close(release)
	require.Equal(t, http.StatusServiceUnavailable, second.StatusCode, second.Body)
	require.Equal(t, "2", second.Headers["Retry-After"])
	require.Contains(t, second.Body, "Idempotency-Key")
	require.Contains(t, second.Body, "in progress")

	a, ok := <-first
	require.True(t, ok, "the first request failed:\n%s", r.em.Output())
	require.Equal(t, http.StatusOK, a.StatusCode, a.Body)
	var resp contract.ReadingsResponse
	require.NoError(t, json.Unmarshal([]byte(a.Body), &resp))
	require.Equal(t, contract.StatusAccepted, resp.Results[0].Status)

	replay := other.postEvent(t, key, body)
	require.Equal(t, http.StatusOK, replay.StatusCode)
	require.JSONEq(t, a.Body, replay.Body, "the key's answer is the first request's")
	require.Len(t, r.items(t, hw), 3)
}

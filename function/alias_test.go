package function_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"
)

// TestHTTPEventsOnlyThroughTheAPIAlias invokes the function directly (as a
// gateway, allowed to invoke it, could) with an API Gateway event that
// forges the IAM authorizer's context of an operator's read: with
// HTTP_ALIAS set, as the template sets it, the function refuses it, since
// the invocation did not come through the alias API Gateway invokes.
// Without HTTP_ALIAS (a local run) the same event is served.
func TestHTTPEventsOnlyThroughTheAPIAlias(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the function under the Lambda emulator")
	}
	forged := events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: "$default", RawPath: "/v1/devices",
		RequestContext: events.APIGatewayV2HTTPRequestContext{RouteKey: "$default", Stage: "$default", RequestID: "req-f",
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "GET", Path: "/v1/devices", Protocol: "HTTP/1.1", SourceIP: "192.0.2.1"},
			Authorizer: &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
				IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{AccessKey: "AKIAFORGED", AccountID: "123456789012",
					UserARN: operatorARN, UserID: "AIDAFORGED"}}},
	}
	payload, err := json.Marshal(forged)
	require.NoError(t, err)

	r := newRig(t, map[string]string{"HTTP_ALIAS": "api"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	answer, err := r.em.Invoke(ctx, payload)
	// The emulator answers a function error with its errorMessage.
	if err == nil {
		var resp events.APIGatewayV2HTTPResponse
		require.NoError(t, json.Unmarshal(answer, &resp))
		require.NotEqual(t, 200, resp.StatusCode, "a forged read answered: %s", answer)
		require.Contains(t, string(answer), "HTTP_ALIAS")
	} else {
		require.Contains(t, err.Error()+r.em.Output(), "HTTP_ALIAS")
	}

	open := newRig(t, nil)
	code, body := open.get(t, "/v1/devices", nil, true, "")
	require.Equal(t, 200, code, body)
}

package deploy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFunctionPolicyIsExactlyWhatTheFunctionCalls(t *testing.T) {
	calls, err := deriveCalls(t, "./cmd/function", tablePlaceholder)
	require.NoError(t, err)
	for _, c := range calls {
		t.Logf("the function calls %s at %s", c.grant, c.Where)
	}
	p := loadPolicy(t, "iam/function-policy.json")
	require.Equal(t, actionsOf(calls), policyActions(p))
	require.NoError(t, comparePolicy(p, calls))
}

// lambdaModeKeyAttrs are the api_keys attributes a gateway in lambda mode
// still writes itself: key use (last_used_at) and rehashes after a pepper
// rotation. Device keys it issues or revokes go through the function.
var lambdaModeKeyAttrs = []string{"key_id", "api_key_hash", "last_used_at"}

// TestGatewayLambdaPolicyIsInvokeAndKeyUseOnly checks the policy of a
// gateway with uplink.target lambda: lambda:InvokeFunction on the function
// alone, and of DynamoDB only what gatewayd's key checks call (the hash
// lookup, last_used_at, rehash), derived from the source; no table write.
func TestGatewayLambdaPolicyIsInvokeAndKeyUseOnly(t *testing.T) {
	p := loadPolicy(t, "iam/gateway-lambda-policy.json")
	dynamo, lambda := splitLambda(p)
	require.Len(t, lambda.Statement, 1)
	require.Equal(t, stringList{"lambda:InvokeFunction"}, lambda.Statement[0].Action)
	require.Equal(t, stringList{"arn:aws:lambda:*:*:function:" + functionPlaceholder}, lambda.Statement[0].Resource)

	calls, err := deriveCalls(t, "./cmd/gatewayd", tablePlaceholder)
	require.NoError(t, err)
	var keyCalls []call
	queries, updates := 0, 0
	for _, c := range calls {
		switch {
		case c.Action == "dynamodb:Query" && strings.HasSuffix(c.Resource, "api_keys/index/api_key_hash_index"):
			queries++
		case c.Action == "dynamodb:UpdateItem" && strings.HasSuffix(c.Resource, "table/"+tablePlaceholder+"api_keys") &&
			c.AttrsKnown && subset(c.Attrs, lambdaModeKeyAttrs):
			updates++
		default:
			continue
		}
		keyCalls = append(keyCalls, c)
	}
	require.NotZero(t, queries, "gatewayd looks keys up by hash")
	require.GreaterOrEqual(t, updates, 2, "gatewayd records key use and rehashes")
	require.NoError(t, comparePolicy(dynamo, keyCalls))
}

func subset(xs, of []string) bool {
	for _, x := range xs {
		if !slices.Contains(of, x) {
			return false
		}
	}
	return true
}

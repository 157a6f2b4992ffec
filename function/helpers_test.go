package function_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/lambdatest"
	"greenhouse-gateway/internal/cloud"
)

const testPepper = "test-pepper"

// rig is the function under the emulator against DynamoDB Local.
type rig struct {
	tables cloud.Tables
	db     *dynamodb.Client
	em     *lambdatest.Emulator
	key    string            // a raw fleet key
	env    map[string]string // the function's environment
}

// newRig starts the function with its tables, a fleet key and env added to
// its environment.
func newRig(t testing.TB, env map[string]string) *rig {
	t.Helper()
	local := dynamotest.Shared(t)
	r := &rig{tables: local.NewTables(t), db: local.Client(t)}
	raw, _, err := cloud.NewKeys(r.db, r.tables.APIKeys, testPepper).Create(context.Background(), "test fleet key")
	require.NoError(t, err)
	r.key = raw
	all := map[string]string{
		"API_KEY_PEPPER":        testPepper,
		"TABLE_PREFIX":          strings.TrimSuffix(r.tables.Devices, "devices"),
		"DYNAMODB_ENDPOINT":     local.Endpoint,
		"TRANSACTION_MAX_ITEMS": "10", // DynamoDB Local's limit
		"AWS_REGION":            "us-east-1",
		"AWS_ACCESS_KEY_ID":     "local",
		"AWS_SECRET_ACCESS_KEY": "local",
	}
	for k, v := range env {
		all[k] = v
	}
	r.env = all
	r.em = lambdatest.Start(t, lambdatest.BuildFunction(t), all)
	return r
}

// invoke invokes the function with v encoded as JSON and decodes its
// answer into out.
func (r *rig) invoke(t testing.TB, v, out any) {
	t.Helper()
	payload, err := json.Marshal(v)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	answer, err := r.em.Invoke(ctx, payload)
	require.NoError(t, err, "emulator output:\n%s", r.em.Output())
	require.NoError(t, json.Unmarshal(answer, out), "%s", answer)
}

// postRequest is an API Gateway HTTP API event posting body to path with
// key (none when empty) and headers.
func postRequest(path, key string, headers map[string]string, body string) events.APIGatewayV2HTTPRequest {
	h := map[string]string{"content-type": "application/json"}
	if key != "" {
		h["authorization"] = "Bearer " + key
	}
	for k, v := range headers {
		h[strings.ToLower(k)] = v
	}
	return events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: "POST " + path, RawPath: path, Headers: h, Body: body,
		RequestContext: events.APIGatewayV2HTTPRequestContext{RouteKey: "POST " + path, Stage: "$default", RequestID: "req-1",
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "POST", Path: path, Protocol: "HTTP/1.1", SourceIP: "192.0.2.1"}},
	}
}

// post sends an API Gateway HTTP API event and returns the status code and
// the body.
func (r *rig) post(t *testing.T, path, key string, headers map[string]string, body string) (int, string) {
	t.Helper()
	var resp events.APIGatewayV2HTTPResponse
	r.invoke(t, postRequest(path, key, headers, body), &resp)
	return resp.StatusCode, resp.Body
}

// readings posts body to /v1/readings and decodes the answer.
func (r *rig) readings(t *testing.T, headers map[string]string, body string) (int, contract.ReadingsResponse) {
	t.Helper()
	code, raw := r.post(t, "/v1/readings", r.key, headers, body)
	var resp contract.ReadingsResponse
	require.NoError(t, json.Unmarshal([]byte(raw), &resp), raw)
	return code, resp
}

const testBoot = "7c9e6679-7425-40de-944b-e07fc1f90ae7"

// batch returns a batch of n readings a minute apart, in the window that
// starts window minutes after base, with temperature temp.
func batch(hw string, base time.Time, window, n int, temp float64) *contract.Batch {
	start := base.Add(time.Duration(window) * time.Minute).UnixMilli()
	b := &contract.Batch{
		BatchID: fmt.Sprintf("%s_%s_%d_%d", hw, testBoot, start, start+int64(n)*1000), HardwareID: hw,
		BootID: testBoot, FirmwareVersion: "1.0.16",
	}
	for i := range n {
		b.Readings = append(b.Readings, contract.Reading{TimestampMS: start + int64(i)*1000,
			Sensors:      map[string]float64{"bme280_temp_c": temp, "humidity_pct": 45.2},
			SensorStatus: map[string]string{"bme280": "ok"}})
	}
	return b
}

// testBase is base's time, fixed when the test binary starts: a test that
// builds the same batch twice gets the same batch_id even when a minute
// turns between the two.
var testBase = time.Now().Add(-time.Hour).Truncate(time.Minute)

// base is an hour before the tests started, on the minute: batches are
// recent (readings TTL) and not in the future (clock skew).
func base() time.Time { return testBase }

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// items reads a device's device_readings items.
func (r *rig) items(t *testing.T, hw string) []map[string]types.AttributeValue {
	t.Helper()
	out, err := r.db.Query(context.Background(), &dynamodb.QueryInput{
		TableName:                 aws.String(r.tables.Readings),
		KeyConditionExpression:    aws.String("hardware_id = :hw"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: hw}},
		ConsistentRead:            aws.Bool(true),
	})
	require.NoError(t, err)
	return out.Items
}

// marker reads a processed_batches item; nil when there is none.
func (r *rig) marker(t *testing.T, batchID string) map[string]types.AttributeValue {
	t.Helper()
	out, err := r.db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(r.tables.ProcessedBatches), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"batch_id": &types.AttributeValueMemberS{Value: batchID}},
	})
	require.NoError(t, err)
	return out.Item
}

func str(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func num(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		return v.Value
	}
	return ""
}

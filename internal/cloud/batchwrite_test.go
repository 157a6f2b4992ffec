package cloud

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
)

// captured is one request an endpoint received.
type captured struct {
	target, contentType string
	length              int64
	body                []byte
}

// captureEndpoint answers every request with an empty BatchWriteItem
// output and keeps what it received.
func captureEndpoint(t testing.TB) (string, func() []captured) {
	var mu sync.Mutex
	var got []captured
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, captured{target: r.Header.Get("X-Amz-Target"), contentType: r.Header.Get("Content-Type"),
			length: r.ContentLength, body: body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = io.WriteString(w, `{"UnprocessedItems":{}}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []captured {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
}

// sdkSerializer puts the SDK's own protocol back on a client.
func sdkSerializer(o *dynamodb.Options) {
	if p, ok := o.Protocol.(batchWriteProtocol); ok {
		o.Protocol = p.ClientProtocol
	}
}

func testClient(t testing.TB, endpoint string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	t.Setenv("AWS_ACCESS_KEY_ID", "local")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
	t.Setenv("AWS_REGION", "us-east-1")
	c, err := NewClient(context.Background(), Config{Endpoint: endpoint}, append([]func(*dynamodb.Options){WithRetryMaxAttempts(1)}, opts...)...)
	require.NoError(t, err)
	return c
}

func readingRequest(i int) types.WriteRequest {
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	return types.WriteRequest{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{
		"hardware_id": s("02:00:00:00:00:01"), "ts_batch": s(fmt.Sprintf("%013d#b-%d", 1_760_000_000_000+i, i/10)),
		"timestamp_ms": n(strconv.Itoa(1_760_000_000_000 + i)), "batch_id": s(fmt.Sprintf("b-%d", i/10)),
		"boot_id": s("6f1c1e9e-3b6a-4f43-9b7e-0d9d1c2b3a40"), "firmware_version": s("1.0.16"),
		"sensors": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"bme280_temp_c": n("21.5"), "bme280_humidity_pct": n("45.2"), "soil_moisture_pct": n("62.3")}},
		"sensor_status":   &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"bme280": s("ok")}},
		"expiration_time": n("1762592000"), "quality_score": n("0.975"),
	}}}
}

// batchWriteInputs are requests covering what the encoder writes: the
// uplink's readings and markers, every attribute type, strings that need
// escaping, deletes and the optional members.
func batchWriteInputs() map[string]*dynamodb.BatchWriteItemInput {
	var readings []types.WriteRequest
	for i := range 22 {
		readings = append(readings, readingRequest(i))
	}
	strs := []string{"", `quote " and \ backslash`, "line\nreturn\rtab\t", "nul \x00 unit \x1f del \x7f",
		"é ü 温室 🌱", "separators \u2028 \u2029", "bad utf-8 \xff\xfe end", "<html> & 'x'", "/slash"}
	odd := map[string]types.AttributeValue{
		"pk":    &types.AttributeValueMemberS{Value: "odd"},
		"blob":  &types.AttributeValueMemberB{Value: []byte{0, 1, 2, 250, 255}},
		"empty": &types.AttributeValueMemberB{Value: []byte{}},
		"yes":   &types.AttributeValueMemberBOOL{Value: true},
		"no":    &types.AttributeValueMemberBOOL{Value: false},
		"null":  &types.AttributeValueMemberNULL{Value: true},
		"list": &types.AttributeValueMemberL{Value: []types.AttributeValue{
			&types.AttributeValueMemberN{Value: "-1.5e-7"},
			&types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"in": &types.AttributeValueMemberS{Value: "list"}}},
			&types.AttributeValueMemberL{Value: []types.AttributeValue{}},
		}},
		"emptymap": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}},
		"ss":       &types.AttributeValueMemberSS{Value: strs},
		"ns":       &types.AttributeValueMemberNS{Value: []string{"1", "2.5", "-3e10"}},
		"bs":       &types.AttributeValueMemberBS{Value: [][]byte{{1}, {2, 3}, {}}},
	}
	for i, v := range strs {
		odd[fmt.Sprintf("s%d %s", i, v)] = &types.AttributeValueMemberS{Value: v}
	}
	return map[string]*dynamodb.BatchWriteItemInput{
		"readings and markers": {RequestItems: map[string][]types.WriteRequest{
			"device_readings": readings,
			"processed_batches": {{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{
				"batch_id": &types.AttributeValueMemberS{Value: "b-0"}, "payload_hash": &types.AttributeValueMemberS{Value: "ab12"},
			}}}},
		}},
		"every type and escape": {RequestItems: map[string][]types.WriteRequest{
			"t \"quoted\" table": {{PutRequest: &types.PutRequest{Item: odd}}},
		}},
		"deletes and options": {
			RequestItems: map[string][]types.WriteRequest{"device_readings": {
				{DeleteRequest: &types.DeleteRequest{Key: map[string]types.AttributeValue{
					"hardware_id": &types.AttributeValueMemberS{Value: "h"}, "ts_batch": &types.AttributeValueMemberS{Value: "1#b"}}}},
				readingRequest(99),
			}},
			ReturnConsumedCapacity:      types.ReturnConsumedCapacityTotal,
			ReturnItemCollectionMetrics: types.ReturnItemCollectionMetricsSize,
		},
	}
}

func decodeJSON(t testing.TB, b []byte) any {
	var v any
	require.NoError(t, json.Unmarshal(b, &v), "%s", b)
	return v
}

// TestBatchWriteEncoderSendsWhatTheSDKSends sends each input through a
// client with the encoder and one with the SDK's serializer, and compares
// what the endpoint received: the same headers, a Content-Length that is
// the body's, and bodies that are the same JSON value.
func TestBatchWriteEncoderSendsWhatTheSDKSends(t *testing.T) {
	endpoint, received := captureEndpoint(t)
	ours := testClient(t, endpoint)
	_, installed := ours.Options().Protocol.(batchWriteProtocol)
	require.True(t, installed, "NewClient installs the encoder")
	sdk := testClient(t, endpoint, sdkSerializer)
	_, installed = sdk.Options().Protocol.(batchWriteProtocol)
	require.False(t, installed)

	for name, in := range batchWriteInputs() {
		t.Run(name, func(t *testing.T) {
			_, err := ours.BatchWriteItem(context.Background(), in)
			require.NoError(t, err)
			_, err = sdk.BatchWriteItem(context.Background(), in)
			require.NoError(t, err)
			got := received()
			require.Len(t, got, 2)
			enc, want := got[0], got[1]
			require.Equal(t, "DynamoDB_20120810.BatchWriteItem", enc.target)
			require.Equal(t, want.target, enc.target)
			require.Equal(t, want.contentType, enc.contentType)
			require.Equal(t, int64(len(enc.body)), enc.length)
			require.Equal(t, decodeJSON(t, want.body), decodeJSON(t, enc.body))
			// The protocol is installed and encodes this input (it falls back
			// to the SDK only where appendBatchWriteItem reports false).
			direct, ok := appendBatchWriteItem(nil, in)
			require.True(t, ok)
			require.Equal(t, decodeJSON(t, want.body), decodeJSON(t, direct))
		})
	}
}

// TestBatchWriteEncoderLeavesTheRestToTheSDK checks that an input the
// encoder does not know, and every other operation, go out as the SDK
// writes them.
func TestBatchWriteEncoderLeavesTheRestToTheSDK(t *testing.T) {
	endpoint, received := captureEndpoint(t)
	ours := testClient(t, endpoint)
	sdk := testClient(t, endpoint, sdkSerializer)
	unknown := &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{"t": {{PutRequest: &types.PutRequest{
		Item: map[string]types.AttributeValue{"nil": nil}}}}}}
	_, ok := appendBatchWriteItem(nil, unknown)
	require.False(t, ok, "a nil attribute value is not encoded")
	for _, c := range []*dynamodb.Client{ours, sdk} {
		_, _ = c.BatchWriteItem(context.Background(), unknown)
		_, _ = c.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String("t"),
			Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "x"}}})
	}
	got := received()
	require.Len(t, got, 4)
	for i := range 2 {
		require.Equal(t, got[i+2].target, got[i].target)
		require.Equal(t, string(got[i+2].body), string(got[i].body))
	}
}

// TestItemsGivenEncodedAreSentAsTheyAre sends readings given encoded
// (EncodedItem) beside maps, and checks the body is the one of the same
// items as maps; and that a request the encoder cannot write whole fails
// rather than reach the SDK's serializer, which does not know encoded
// items.
func TestItemsGivenEncodedAreSentAsTheyAre(t *testing.T) {
	endpoint, received := captureEndpoint(t)
	ours := testClient(t, endpoint)
	require.True(t, EncodesItems(ours))
	require.False(t, EncodesItems(testClient(t, endpoint, sdkSerializer)))

	asMaps := batchWriteInputs()["readings and markers"]
	given := &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{}}
	for table, reqs := range asMaps.RequestItems {
		for i, r := range reqs {
			if i%2 == 0 && table == "device_readings" {
				raw, ok := appendItem(nil, r.PutRequest.Item)
				require.True(t, ok)
				r = types.WriteRequest{PutRequest: &types.PutRequest{Item: EncodedItem(raw)}}
			}
			given.RequestItems[table] = append(given.RequestItems[table], r)
		}
	}
	for _, in := range []*dynamodb.BatchWriteItemInput{asMaps, given} {
		_, err := ours.BatchWriteItem(context.Background(), in)
		require.NoError(t, err)
	}
	got := received()
	require.Len(t, got, 2)
	require.Equal(t, decodeJSON(t, got[0].body), decodeJSON(t, got[1].body))

	given.RequestItems["device_readings"] = append(given.RequestItems["device_readings"],
		types.WriteRequest{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{"nil": nil}}})
	_, err := ours.BatchWriteItem(context.Background(), given)
	require.ErrorContains(t, err, "items given encoded")
	require.Empty(t, received(), "nothing sent")
}

// BenchmarkBatchWriteItemCall is one 25-item BatchWriteItem call of the
// uplink's reading items against an in-process endpoint, with the SDK's
// serializer and with the encoder: the client's whole cost of a request
// (middleware, signing, HTTP) and the endpoint's, which is the same in
// both.
func BenchmarkBatchWriteItemCall(b *testing.B) {
	var reqs []types.WriteRequest
	for i := range 25 {
		reqs = append(reqs, readingRequest(i))
	}
	in := &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{"device_readings": reqs}}
	endpoint, received := captureEndpoint(b)
	for _, tc := range []struct {
		name string
		opts []func(*dynamodb.Options)
	}{{"sdk", []func(*dynamodb.Options){sdkSerializer}}, {"encoder", nil}} {
		b.Run(tc.name, func(b *testing.B) {
			c := testClient(b, endpoint, tc.opts...)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := c.BatchWriteItem(context.Background(), in); err != nil {
					b.Fatal(err)
				}
				if i%1000 == 0 {
					received()
				}
			}
		})
	}
}

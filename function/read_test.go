package function_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/readquery"
)

// operatorARN is the IAM caller of the test's signed reads.
const operatorARN = "arn:aws:iam::123456789012:user/operator"

// get sends an API Gateway GET event for path and query. With iam the
// event carries the IAM authorizer's context, as API Gateway's AWS_IAM
// authorization adds it; key, when set, is sent as a Bearer API key.
func (r *rig) get(t testing.TB, path string, q url.Values, iam bool, key string) (int, string) {
	t.Helper()
	h := map[string]string{}
	if key != "" {
		h["authorization"] = "Bearer " + key
	}
	ev := events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: "$default", RawPath: path, RawQueryString: q.Encode(), Headers: h,
		RequestContext: events.APIGatewayV2HTTPRequestContext{RouteKey: "$default", Stage: "$default", RequestID: "req-r",
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "GET", Path: path, Protocol: "HTTP/1.1", SourceIP: "192.0.2.1"}},
	}
	if iam {
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{AccessKey: "AKIAOPERATOR", AccountID: "123456789012",
				UserARN: operatorARN, UserID: "AIDAOPERATOR"}}
	}
	var resp events.APIGatewayV2HTTPResponse
	r.invoke(t, ev, &resp)
	return resp.StatusCode, resp.Body
}

// getJSON is a signed GET that must answer 200, decoded into out.
func (r *rig) getJSON(t *testing.T, path string, q url.Values, out any) {
	t.Helper()
	code, body := r.get(t, path, q, true, "")
	require.Equal(t, http.StatusOK, code, body)
	require.NoError(t, json.Unmarshal([]byte(body), out), body)
}

// spread returns batches of per readings of hw, n readings in all, every
// step from start, with two sensors whose values follow the reading's
// index.
func spread(hw string, start time.Time, step time.Duration, n, per int) []*contract.Batch {
	var out []*contract.Batch
	for i := 0; i < n; i += per {
		first := start.Add(time.Duration(i) * step).UnixMilli()
		b := &contract.Batch{HardwareID: hw, BootID: testBoot, FirmwareVersion: "1.0.16"}
		for j := i; j < min(i+per, n); j++ {
			b.Readings = append(b.Readings, contract.Reading{TimestampMS: start.Add(time.Duration(j) * step).UnixMilli(),
				Sensors:      map[string]float64{"bme280_temp_c": 18 + float64(j%40)/4, "humidity_pct": 40 + float64(j%7)},
				SensorStatus: map[string]string{"bme280": "ok"}})
		}
		b.BatchID = fmt.Sprintf("%s_%s_%d_%d", hw, testBoot, first, b.Readings[len(b.Readings)-1].TimestampMS)
		out = append(out, b)
	}
	return out
}

// store posts batches to the function, 20 to a request, and requires each
// one accepted.
func (r *rig) store(t *testing.T, batches []*contract.Batch) {
	t.Helper()
	for i := 0; i < len(batches); i += 20 {
		part := batches[i:min(i+20, len(batches))]
		code, resp := r.readings(t, nil, jsonOf(t, map[string]any{"batches": part}))
		require.Equal(t, http.StatusOK, code, "%+v", resp)
		for _, res := range resp.Results {
			require.Equal(t, contract.StatusAccepted, res.Status, "%+v", res)
		}
	}
}

func TestReadRoutesUnderTheEmulator(t *testing.T) {
	r := newRig(t, nil)
	hw, other := "AA:BB:CC:00:16:01", "AA:BB:CC:00:16:02"
	for _, dev := range []string{other, hw} {
		reg := `{"hardware_id":"` + dev + `","boot_id":"` + testBoot + `","firmware_version":"1.0.16",
			"friendly_name":"greenhouse-sensor","capabilities":{"sensors":["bme280"],"features":{"tft_display":true}}}`
		code, body := r.post(t, "/v1/register", r.key, nil, reg)
		require.Equal(t, http.StatusCreated, code, body)
	}
	// awscli moves other's last activity an hour back, and writes a third
	// device, seen long ago, as the schema's item.
	endpoint := dynamotest.Shared(t).Endpoint
	hourAgo := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	awsCLI(t, endpoint, "dynamodb", "update-item", "--table-name", r.tables.Devices,
		"--key", `{"hardware_id":{"S":"`+other+`"}}`, "--update-expression", "SET last_seen_at = :t, gsi1sk = :t",
		"--expression-attribute-values", `{":t":{"S":"`+hourAgo+`"}}`)
	batches := spread(hw, base().Add(-30*time.Minute), 30*time.Second, 40, 10)
	r.store(t, batches)

	awsDev := "AA:BB:CC:00:16:0A"
	awsCLI(t, endpoint, "dynamodb", "put-item", "--table-name", r.tables.Devices, "--item", `{"hardware_id":{"S":"`+awsDev+`"},
		"confirmation_id":{"S":"550e8400-e29b-41d4-a716-446655440000"},"capabilities":{"M":{"sensors":{"L":[{"S":"ds18b20"}]},"features":{"M":{}}}},
		"first_registered_at":{"S":"2020-01-01T00:00:00Z"},"last_seen_at":{"S":"2020-01-02T00:00:00Z"},"last_boot_id":{"S":"`+testBoot+`"},
		"firmware_version":{"S":"1.0.1"},"gsi1pk":{"S":"devices"},"gsi1sk":{"S":"2020-01-02T00:00:00Z"}}`)

	// The device list, newest first, one to a page.
	var listed []string
	q := url.Values{"limit": {"1"}}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		var p function.DevicesPage
		r.getJSON(t, "/v1/devices", q, &p)
		for _, d := range p.Devices {
			listed = append(listed, d.HardwareID)
		}
		if !p.Truncated {
			break
		}
		q.Set("cursor", p.NextCursor)
	}
	require.Equal(t, []string{hw, other, awsDev}, listed, "most recently seen first, each once")
	var all function.DevicesPage
	r.getJSON(t, "/v1/devices", nil, &all)
	require.Equal(t, 3, all.Count)
	require.False(t, all.Truncated)
	require.Equal(t, time.Date(2020, 1, 2, 0, 0, 0, 0, time.UTC), all.Devices[2].LastSeenAt)

	var d function.Device
	r.getJSON(t, "/v1/devices/"+url.PathEscape(hw), nil, &d)
	require.Equal(t, hw, d.HardwareID)
	require.True(t, d.Registered)
	require.Equal(t, testBoot, d.BootID)
	require.Equal(t, []string{"bme280"}, d.Capabilities.Sensors)
	code, body := r.get(t, "/v1/devices/AA:BB:CC:00:16:99", nil, true, "")
	require.Equal(t, http.StatusNotFound, code, body)

	// Readings: every value once, oldest first, across pages.
	win := url.Values{"from": {base().Add(-time.Hour).Format(time.RFC3339)}, "to": {base().Format(time.RFC3339)}, "limit": {"7"}}
	got := map[string]int{}
	var last int64
	for pages := 0; ; pages++ {
		require.Less(t, pages, 100)
		var p readquery.ReadingsPage
		r.getJSON(t, "/v1/devices/"+hw+"/readings", win, &p)
		for _, row := range p.Readings {
			require.GreaterOrEqual(t, row.TimestampMS, last, "oldest first")
			last = row.TimestampMS
			require.Equal(t, readquery.StateDelivered, row.State)
			got[fmt.Sprintf("%d/%s/%s", row.TimestampMS, row.BatchID, row.Sensor)]++
		}
		if !p.Truncated {
			break
		}
		win.Set("cursor", p.NextCursor)
	}
	require.Len(t, got, 80, "40 readings of two sensors")
	var counted struct{ Count int }
	require.NoError(t, json.Unmarshal(awsCLI(t, endpoint, "dynamodb", "query", "--table-name", r.tables.Readings,
		"--key-condition-expression", "hardware_id = :hw", "--expression-attribute-values", `{":hw":{"S":"`+hw+`"}}`,
		"--select", "COUNT"), &counted))
	require.Equal(t, 40, counted.Count, "awscli counts the same items")
	for k, n := range got {
		require.Equal(t, 1, n, k)
	}

	var s readquery.Summary
	r.getJSON(t, "/v1/devices/"+hw+"/summary", url.Values{"from": win["from"], "to": win["to"], "granularity": {"hour"},
		"tz": {"Asia/Kolkata"}}, &s)
	require.EqualValues(t, 40, s.Totals["humidity_pct"].Count)
	require.Equal(t, "Asia/Kolkata", s.TZ)
}

func TestReadRoutesAreForOperatorsOnly(t *testing.T) {
	r := newRig(t, nil)
	hw := "AA:BB:CC:00:16:03"
	r.store(t, spread(hw, base().Add(-10*time.Minute), time.Minute, 5, 5))
	deviceKey, _, err := cloud.NewKeys(r.db, r.tables.APIKeys, testPepper).CreateBound(context.Background(), "device key", hw)
	require.NoError(t, err)
	path := "/v1/devices/" + hw + "/readings"
	for name, key := range map[string]string{"no credentials": "", "the fleet key": r.key, "the device's own key": deviceKey} {
		t.Run(name, func(t *testing.T) {
			code, body := r.get(t, path, nil, false, key)
			require.Equal(t, http.StatusForbidden, code, body)
			require.Contains(t, body, "AWS_IAM")
			require.NotContains(t, body, "readings\":[", "nothing is read")
		})
	}
	for _, p := range []string{"/v1/devices", "/v1/devices/" + hw, "/v1/devices/" + hw + "/summary"} {
		code, _ := r.get(t, p, url.Values{"granularity": {"day"}}, false, deviceKey)
		require.Equal(t, http.StatusForbidden, code, p)
	}
	// An IAM context without an identity is refused too.
	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: path, RequestContext: events.APIGatewayV2HTTPRequestContext{
		HTTP:       events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "GET", Path: path},
		Authorizer: &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{}}}}
	var resp events.APIGatewayV2HTTPResponse
	r.invoke(t, ev, &resp)
	require.Equal(t, http.StatusForbidden, resp.StatusCode, resp.Body)
	// The same key still writes its device's readings.
	code, _ := r.post(t, "/v1/readings", deviceKey, nil, jsonOf(t, spread(hw, base(), time.Minute, 1, 1)[0]))
	require.Equal(t, http.StatusOK, code)
}

func TestReadRoutesNameTheBadParameter(t *testing.T) {
	r := newRig(t, nil)
	hw := "AA:BB:CC:00:16:04"
	tests := []struct {
		path  string
		query url.Values
		want  string
	}{
		{"/v1/devices/" + hw + "/readings", url.Values{"from": {"yesterday"}}, `from: "yesterday" must be an RFC 3339 time`},
		{"/v1/devices/" + hw + "/readings", url.Values{"limit": {"0"}}, "limit: \"0\" must be a whole number from 1 to 10000"},
		{"/v1/devices/" + hw + "/readings", url.Values{"cursor": {"bm9wZQ"}}, "cursor: "},
		{"/v1/devices/" + hw + "/readings", url.Values{"from": {"2024-05-02T00:00:00Z"}, "to": {"2024-05-01T00:00:00Z"}}, "to: must be after from"},
		{"/v1/devices/" + hw + "/summary", nil, "granularity: required, one of hour, day, month"},
		{"/v1/devices/" + hw + "/summary", url.Values{"granularity": {"week"}}, `granularity: "week" is not one of hour, day, month`},
		{"/v1/devices/" + hw + "/summary", url.Values{"granularity": {"day"}, "tz": {"Mars/Olympus_Mons"}}, "tz: unknown time zone"},
		{"/v1/devices/" + hw + "/summary", url.Values{"granularity": {"day"}, "include_empty": {"maybe"}}, `include_empty: "maybe" must be true or false`},
		{"/v1/devices/" + hw + "/summary", url.Values{"granularity": {"hour"}, "from": {"2024-01-01T00:00:00Z"}, "to": {"2024-03-01T00:00:00Z"}}, "more than 1000 hour buckets"},
		{"/v1/devices/aa:bb:cc:00:16:04/readings", nil, "hardware_id"},
		{"/v1/devices", url.Values{"limit": {"5000"}}, "limit: \"5000\" must be a whole number from 1 to 1000"},
		{"/v1/devices", url.Values{"cursor": {"e30"}}, "cursor: "},
	}
	for _, tt := range tests {
		t.Run(tt.path+"?"+tt.query.Encode(), func(t *testing.T) {
			code, body := r.get(t, tt.path, tt.query, true, "")
			require.Equal(t, http.StatusBadRequest, code, body)
			var e struct{ Status, Message string }
			require.NoError(t, json.Unmarshal([]byte(body), &e))
			require.Equal(t, "error", e.Status)
			require.Contains(t, e.Message, tt.want)
		})
	}
	code, _ := r.get(t, "/v1/devices/"+hw+"/history", nil, true, "")
	require.Equal(t, http.StatusNotFound, code)
}

// awsCLI runs Debian's awscli against DynamoDB Local, skipping the test
// when it is not installed.
func awsCLI(t *testing.T, endpoint string, args ...string) []byte {
	t.Helper()
	const cli = "/usr/bin/aws"
	if _, err := os.Stat(cli); err != nil {
		t.Skipf("%s is missing: install Debian's awscli (apt-get install awscli) to read the tables independently", cli)
	}
	cmd := exec.Command(cli, append([]string{"--endpoint-url", endpoint, "--region", "us-east-1", "--output", "json"}, args...)...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local", "AWS_PAGER=")
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "aws %s: %s", strings.Join(args, " "), stderr)
	return out
}

// TestCloudAnswersAsTheGateway posts the same batches to a gateway and to
// the function, and asks both the same summaries and readings pages: the
// summaries are the same JSON, the pages the same rows with the same
// cursors (the cloud's rows are delivered; each API scores quality its own
// way, so scores are not compared).
func TestCloudAnswersAsTheGateway(t *testing.T) {
	r := newRig(t, nil)
	g := gatewaytest.Start(t, nil)
	hw := "AA:BB:CC:00:16:05"
	from := base().Add(-80 * time.Hour)
	batches := spread(hw, from.Add(7*time.Minute), 10*time.Minute, 470, 12)
	// Two batches share their readings' timestamps: rows of one time in
	// batch_id order.
	twin := spread(hw, from.Add(7*time.Minute), 10*time.Minute, 12, 12)[0]
	twin.BootID = "3f2a6c1e-8d4b-4c9a-9e7f-1b2c3d4e5f60"
	twin.BatchID = strings.Replace(twin.BatchID, testBoot, twin.BootID, 1)
	batches = append(batches, twin)
	r.store(t, batches)
	for _, b := range batches {
		resp, out := gatewaytest.PostJSON(t, g.HTTPURL+"/v1/readings", gatewaytest.GoodKey, []byte(jsonOf(t, b)))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", out)
	}
	window := func(extra url.Values) url.Values {
		q := url.Values{"from": {from.Format(time.RFC3339)}, "to": {base().Format(time.RFC3339)}}
		for k, v := range extra {
			q[k] = v
		}
		return q
	}
	summaries := []url.Values{
		{"granularity": {"hour"}},
		{"granularity": {"day"}, "tz": {"America/New_York"}, "include_empty": {"false"}},
		{"granularity": {"day"}, "tz": {"Asia/Kolkata"}},
		{"granularity": {"month"}, "tz": {"Europe/Berlin"}},
	}
	for _, extra := range summaries {
		t.Run("summary "+extra.Encode(), func(t *testing.T) {
			q := window(extra)
			var atGateway, inCloud any
			require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, g, "/v1/devices/"+hw+"/summary?"+q.Encode(), &atGateway))
			r.getJSON(t, "/v1/devices/"+hw+"/summary", q, &inCloud)
			require.Equal(t, atGateway, inCloud)
			var s readquery.Summary
			r.getJSON(t, "/v1/devices/"+hw+"/summary", q, &s)
			require.EqualValues(t, 482, s.Totals["bme280_temp_c"].Count, "every reading of the window counted")
		})
	}

	q := window(url.Values{"limit": {"97"}})
	rows := 0
	for pages := 0; ; pages++ {
		require.Less(t, pages, 20)
		var atGateway, inCloud readquery.ReadingsPage
		require.Equal(t, http.StatusOK, gatewaytest.AdminGet(t, g, "/v1/devices/"+hw+"/readings?"+q.Encode(), &atGateway))
		r.getJSON(t, "/v1/devices/"+hw+"/readings", q, &inCloud)
		require.Equal(t, atGateway.NextCursor, inCloud.NextCursor, "the same cursor")
		require.Equal(t, atGateway.Count, inCloud.Count)
		for i := range atGateway.Readings {
			a, c := atGateway.Readings[i], inCloud.Readings[i]
			require.Equal(t, readquery.StatePending, a.State)
			require.Equal(t, readquery.StateDelivered, c.State)
			a.State, a.Delivered, a.QualityScore = c.State, c.Delivered, c.QualityScore
			require.Equal(t, a, c, "row %d", rows+i)
		}
		rows += inCloud.Count
		if !inCloud.Truncated {
			break
		}
		q.Set("cursor", inCloud.NextCursor)
	}
	require.Equal(t, 2*482, rows)
}

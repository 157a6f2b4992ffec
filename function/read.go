package function

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/cloudread"
	"greenhouse-gateway/internal/readquery"
	"greenhouse-gateway/internal/tablewrite"
)

// ReadRoutes are the operators' read routes (API Gateway route keys): the
// paths, parameters and answers of the gateway's operator API, over the
// cloud tables. The template gives them AWS_IAM authorization, and the
// function answers them only for an event that carries the IAM
// authorizer's context.
var ReadRoutes = []string{
	"GET /v1/devices",
	"GET /v1/devices/{hardware_id}",
	"GET /v1/devices/{hardware_id}/readings",
	"GET /v1/devices/{hardware_id}/summary",
}

// Device list pages.
const (
	defaultDevicesLimit = 100
	maxDevicesLimit     = 1000
)

// readError is a read route's error answer, as the gateway's operator
// API words them.
func readError(code int, msg string) answer {
	return jsonAnswer(code, map[string]string{"status": "error", "message": msg})
}

// serveRead answers a GET: an operator's read of the cloud tables.
func (f *Function) serveRead(ctx context.Context, req events.APIGatewayV2HTTPRequest) answer {
	rest, ok := strings.CutPrefix(req.RawPath, "/v1/devices")
	if !ok || (rest != "" && !strings.HasPrefix(rest, "/")) {
		return readError(http.StatusNotFound, fmt.Sprintf("no route GET %s; the read routes are %s", req.RawPath, strings.Join(ReadRoutes, ", ")))
	}
	parts := strings.Split(strings.TrimPrefix(rest, "/"), "/")
	if rest == "" {
		parts = nil
	}
	if len(parts) > 2 || (len(parts) == 2 && parts[1] != "readings" && parts[1] != "summary") {
		return readError(http.StatusNotFound, fmt.Sprintf("no route GET %s; the read routes are %s", req.RawPath, strings.Join(ReadRoutes, ", ")))
	}
	iam := req.RequestContext.Authorizer
	if iam == nil || iam.IAM == nil || (iam.IAM.UserARN == "" && iam.IAM.AccessKey == "" && iam.IAM.AccountID == "") {
		return readError(http.StatusForbidden, "the read routes are for operators: sign the request with AWS credentials "+
			"(the HTTP API's AWS_IAM authorization); API keys do not read")
	}
	q, err := url.ParseQuery(req.RawQueryString)
	if err != nil {
		return readError(http.StatusBadRequest, "the query string does not parse: "+err.Error())
	}
	if len(parts) == 0 {
		return f.listDevices(ctx, q)
	}
	hw, err := url.PathUnescape(parts[0])
	if err == nil {
		err = contract.ValidHardwareID(hw)
	}
	if err != nil {
		return readError(http.StatusBadRequest, err.Error())
	}
	if len(parts) == 1 {
		return f.getDevice(ctx, hw)
	}
	reader := cloudread.New(f.db, f.cfg.Tables)
	if parts[1] == "readings" {
		return deviceQuery(ctx, f, hw, q, readquery.ParseReadingsQuery, reader.Readings)
	}
	return deviceQuery(ctx, f, hw, q, readquery.ParseSummaryQuery, reader.Summary)
}

// deviceQuery answers a query of device hw's readings: parse reads it
// from q (400 when it does not parse), read runs it.
func deviceQuery[Q, A any](ctx context.Context, f *Function, hw string, q url.Values,
	parse func(url.Values, time.Time) (Q, error),
	read func(context.Context, string, Q) (A, cloudread.Stats, error)) answer {
	query, err := parse(q, f.now())
	if err != nil {
		return readError(http.StatusBadRequest, err.Error())
	}
	a, _, err := read(ctx, hw, query)
	if err != nil {
		return f.readFailed(err)
	}
	return jsonAnswer(http.StatusOK, a)
}

// readFailed answers a read DynamoDB did not serve: 429 throttled, else
// 503, both with Retry-After.
func (f *Function) readFailed(err error) answer {
	f.logger.Warn("a read of the tables failed", "err", err)
	if tablewrite.Throttling(err) {
		return readError(http.StatusTooManyRequests, "DynamoDB throttled the read; retry later")
	}
	return readError(http.StatusServiceUnavailable, "the tables cannot be read now; retry later")
}

// Device is a devices-table item as the read routes answer it: the fields
// of the gateway's device record the table holds, by the same names
// (boot_id is the item's last_boot_id). Counters only a gateway keeps
// (boots, gaps, clock state) are not in the table.
type Device struct {
	HardwareID        string                 `json:"hardware_id"`
	Registered        bool                   `json:"registered"`
	ConfirmationID    string                 `json:"confirmation_id,omitempty"`
	FriendlyName      string                 `json:"friendly_name,omitempty"`
	FirmwareVersion   string                 `json:"firmware_version,omitempty"`
	Capabilities      *contract.Capabilities `json:"capabilities,omitempty"`
	FirstRegisteredAt time.Time              `json:"first_registered_at,omitzero"`
	LastSeenAt        time.Time              `json:"last_seen_at"`
	BootID            string                 `json:"boot_id,omitempty"`
}

// DevicesPage is the answer of GET /v1/devices: the gateway's {count,
// devices}, most recently seen first, with truncated and next_cursor as
// on a readings page.
type DevicesPage struct {
	Count      int      `json:"count"`
	Devices    []Device `json:"devices"`
	Truncated  bool     `json:"truncated"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// listDevices answers GET /v1/devices?limit&cursor: a Query of the devices
// table's gsi1 (gsi1pk "devices"), newest last_seen_at first.
func (f *Function) listDevices(ctx context.Context, q url.Values) answer {
	limit := defaultDevicesLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxDevicesLimit {
			return readError(http.StatusBadRequest, fmt.Sprintf("limit: %q must be a whole number from 1 to %d", s, maxDevicesLimit))
		}
		limit = n
	}
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(f.cfg.Tables.Devices),
		IndexName:                 aws.String(cloud.GSI1Index),
		KeyConditionExpression:    aws.String("gsi1pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "devices"}},
		ScanIndexForward:          aws.Bool(false),
	}
	if s := q.Get("cursor"); s != "" {
		start, err := parseDevicesCursor(s)
		if err != nil {
			return readError(http.StatusBadRequest, err.Error())
		}
		in.ExclusiveStartKey = start
	}
	var items []map[string]types.AttributeValue
	for len(items) <= limit {
		in.Limit = aws.Int32(int32(limit + 1 - len(items)))
		out, err := f.db.Query(ctx, in)
		if err != nil {
			return f.readFailed(fmt.Errorf("Query of %s's %s: %w", f.cfg.Tables.Devices, cloud.GSI1Index, err))
		}
		items = append(items, out.Items...)
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	page := DevicesPage{Devices: []Device{}}
	if len(items) > limit {
		items = items[:limit]
		page.Truncated = true
		page.NextCursor = devicesCursor(items[limit-1])
	}
	for _, item := range items {
		page.Devices = append(page.Devices, deviceOf(item))
	}
	page.Count = len(page.Devices)
	return jsonAnswer(http.StatusOK, page)
}

// devicesCursorKeys are the attributes of a gsi1 page's last key.
var devicesCursorKeys = []string{"hardware_id", "gsi1pk", "gsi1sk"}

// devicesCursor encodes the gsi1 key of a page's last device (its
// hardware_id, gsi1pk and gsi1sk) as JSON, in base64url: the next page's
// ExclusiveStartKey.
func devicesCursor(key map[string]types.AttributeValue) string {
	m := map[string]string{}
	for _, name := range devicesCursorKeys {
		if s, ok := key[name].(*types.AttributeValueMemberS); ok {
			m[name] = s.Value
		}
	}
	b, _ := json.Marshal(m)
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseDevicesCursor(s string) (map[string]types.AttributeValue, error) {
	bad := fmt.Errorf("cursor: %q is not a cursor this endpoint returned", s)
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil || len(m) != len(devicesCursorKeys) {
		return nil, bad
	}
	key := map[string]types.AttributeValue{}
	for _, name := range devicesCursorKeys {
		v, ok := m[name]
		if !ok {
			return nil, bad
		}
		key[name] = &types.AttributeValueMemberS{Value: v}
	}
	if m["gsi1pk"] != "devices" || contract.ValidHardwareID(m["hardware_id"]) != nil {
		return nil, bad
	}
	return key, nil
}

// getDevice answers GET /v1/devices/{hardware_id}: the device's item, 404
// when the table has none.
func (f *Function) getDevice(ctx context.Context, hw string) answer {
	out, err := f.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(f.cfg.Tables.Devices),
		Key:       map[string]types.AttributeValue{"hardware_id": &types.AttributeValueMemberS{Value: hw}},
	})
	if err != nil {
		return f.readFailed(fmt.Errorf("GetItem of device %s: %w", hw, err))
	}
	if out.Item == nil {
		return readError(http.StatusNotFound, "no device "+hw)
	}
	return jsonAnswer(http.StatusOK, deviceOf(out.Item))
}

// deviceOf decodes a devices item (schema 002).
func deviceOf(item map[string]types.AttributeValue) Device {
	str := func(name string) string {
		if v, ok := item[name].(*types.AttributeValueMemberS); ok {
			return v.Value
		}
		return ""
	}
	at := func(name string) time.Time {
		t, err := time.Parse(time.RFC3339, str(name))
		if err != nil {
			return time.Time{}
		}
		return t.UTC()
	}
	d := Device{HardwareID: str("hardware_id"), ConfirmationID: str("confirmation_id"), FriendlyName: str("friendly_name"),
		FirmwareVersion: str("firmware_version"), FirstRegisteredAt: at("first_registered_at"), LastSeenAt: at("last_seen_at"),
		BootID: str("last_boot_id")}
	d.Registered = d.ConfirmationID != ""
	if caps, ok := item["capabilities"].(*types.AttributeValueMemberM); ok {
		c := contract.Capabilities{Sensors: []string{}, Features: map[string]bool{}}
		if l, ok := caps.Value["sensors"].(*types.AttributeValueMemberL); ok {
			for _, v := range l.Value {
				if s, ok := v.(*types.AttributeValueMemberS); ok {
					c.Sensors = append(c.Sensors, s.Value)
				}
			}
		}
		if m, ok := caps.Value["features"].(*types.AttributeValueMemberM); ok {
			for k, v := range m.Value {
				if b, ok := v.(*types.AttributeValueMemberBOOL); ok {
					c.Features[k] = b.Value
				}
			}
		}
		d.Capabilities = &c
	}
	return d
}

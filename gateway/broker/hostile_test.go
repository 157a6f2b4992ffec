package broker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/operator"
	"greenhouse-gateway/registry"
)

// hostileOptions sizes a test gateway for hostile input: short timeouts so
// that the tests wait seconds, not the production tens of seconds.
type hostileOptions struct {
	mqtt              broker.MQTTConfig
	http              httpserve.HTTPConfig
	connectTimeout    time.Duration    // before CONNECT; default 1s
	maxPending        int64            // unauthenticated connections; default 1024
	readHeaderTimeout time.Duration    // default 1s
	readTimeout       time.Duration    // default 2s
	store             ingest.Committer // replaces the buffer for commits
	messageExpiry     time.Duration    // mochi's maximum message expiry; default a day
}

// startHostile runs the broker and HTTP API on loopback ports over a real
// buffer, like startGateway, with hostileOptions.
func startHostile(tb testing.TB, o hostileOptions) *gatewaytest.Gateway {
	tb.Helper()
	h, _ := startHostileBroker(tb, o)
	return h
}

// startHostileBroker is startHostile, returning the broker too.
func startHostileBroker(tb testing.TB, o hostileOptions) (*gatewaytest.Gateway, *broker.Broker) {
	tb.Helper()
	if o.connectTimeout == 0 {
		o.connectTimeout = time.Second
	}
	if o.maxPending == 0 {
		o.maxPending = 1024
	}
	if o.readHeaderTimeout == 0 {
		o.readHeaderTimeout = time.Second
	}
	if o.readTimeout == 0 {
		o.readTimeout = 2 * time.Second
	}
	if o.mqtt.MaxUnauthenticatedPerAddress == 0 {
		// Every connection of these tests comes from 127.0.0.1.
		o.mqtt.MaxUnauthenticatedPerAddress = int(o.maxPending)
	}
	o.mqtt.Addr = "127.0.0.1:0"
	o.http.Addr = "127.0.0.1:0"
	o.http.ReadHeaderTimeout, o.http.ReadTimeout = o.readHeaderTimeout, o.readTimeout
	if o.http.MaxBodyBytes == 0 {
		o.http.MaxBodyBytes = 64 << 10
	}
	buf, err := buffer.Open(tb.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, buf.Close()) })
	reg := prometheus.NewRegistry()
	keys := gatewaytest.NewFakeKeys()
	authn, err := auth.NewAuthenticator(auth.AuthConfig{}, auth.Peppers{Current: gatewaytest.Pepper}, keys, buf, nil, nil, reg)
	require.NoError(tb, err)
	require.NoError(tb, authn.Load())
	devices, err := registry.New(registry.Config{}, buf, nil, nil, reg)
	require.NoError(tb, err)
	require.NoError(tb, devices.Load())
	var store ingest.Committer = buf
	if o.store != nil {
		store = o.store
	}
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: store, Devices: devices, Registerer: reg})
	require.NoError(tb, err)
	mqttBroker, err := broker.NewBroker(o.mqtt, ing, authn, nil, reg)
	require.NoError(tb, err)
	broker.SetConnectLimits(mqttBroker, o.connectTimeout, o.maxPending)
	if o.messageExpiry > 0 {
		broker.SetMessageExpiry(mqttBroker, o.messageExpiry)
	}
	require.NoError(tb, mqttBroker.Listen())
	ready := func() error { return nil }
	ops := operator.New(operator.Deps{Devices: devices, AdminToken: gatewaytest.AdminToken, Ready: ready}, nil)
	api, err := httpserve.NewHTTPServer(o.http, httpserve.HTTPDeps{
		Ingest: ing, Auth: authn, Routes: ops.Routes,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: ready,
	}, nil)
	require.NoError(tb, err)
	require.NoError(tb, api.Listen())

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{mqttBroker.Run, api.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				tb.Errorf("gateway component: %v", err)
			}
		}()
	}
	tb.Cleanup(func() {
		ing.Close()
		cancel()
		wg.Wait()
	})
	return &gatewaytest.Gateway{Buf: buf, Devices: devices, Reg: reg, Keys: keys,
		MQTTAddr: "tcp://" + mqttBroker.Addr(), HTTPURL: "http://" + api.Addr()}, mqttBroker
}

// goodDevices numbers the well-behaved devices of requireServes.
var goodDevices atomic.Int64

// requireServes checks that the gateway still serves a well-behaved device:
// a fresh MQTT connection publishes a valid batch and gets "accepted", and
// an HTTP POST of another valid batch gets 200.
func requireServes(t *testing.T, h *gatewaytest.Gateway) {
	t.Helper()
	n := goodDevices.Add(1)
	hw := fmt.Sprintf("AA:BB:CC:00:%02X:%02X", n>>8&0xff, n&0xff)
	d, err := gatewaytest.ConnectDevice(t, h, hw, gatewaytest.GoodKey)
	require.NoError(t, err, "a well-behaved device connects")
	tok := d.Publish(gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 2))
	require.True(t, tok.WaitTimeout(20*time.Second), "PUBACK")
	require.NoError(t, tok.Error())
	require.Equal(t, contract.StatusAccepted, d.NextAck(t).Status)
	d.Client.Disconnect(50)
	resp, out := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 1, 2))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, 1, out.Summary.Accepted)
}

// --- HTTP -----------------------------------------------------------------

// httpAnswer is an HTTP answer as a device sees it.
type httpAnswer struct {
	status int
	ctype  string
	body   []byte
}

// hostilePost sends body to path with the good API key (unless header sets
// Authorization or X-API-Key) and returns the answer.
func hostilePost(t *testing.T, h *gatewaytest.Gateway, path string, header map[string]string, body io.Reader) httpAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.HTTPURL+path, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.GoodKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return httpAnswer{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: out}
}

func hostilePostBody(t *testing.T, h *gatewaytest.Gateway, path string, body []byte) httpAnswer {
	t.Helper()
	return hostilePost(t, h, path, nil, bytes.NewReader(body))
}

// answerMessages returns every message of a JSON answer: the request's, each
// result's, or the ack's.
func answerMessages(t *testing.T, body []byte) []string {
	t.Helper()
	var v struct {
		Message *string `json:"message"`
		Results []struct {
			Message *string `json:"message"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(body, &v), "the answer is JSON: %.300s", body)
	var out []string
	if v.Message != nil {
		out = append(out, *v.Message)
	}
	for _, r := range v.Results {
		if r.Message != nil {
			out = append(out, *r.Message)
		}
	}
	return out
}

// requireJSONError checks an answer's status, that it is JSON, and that a
// message says want.
func requireJSONError(t *testing.T, a httpAnswer, status int, want string) {
	t.Helper()
	require.Equal(t, status, a.status, "%.300s", a.body)
	require.Equal(t, "application/json", a.ctype)
	msgs := answerMessages(t, a.body)
	for _, m := range msgs {
		if strings.Contains(m, want) {
			return
		}
	}
	t.Fatalf("no message says %q: %q", want, msgs)
}

// httpErrorCase posts body to /v1/readings (or path) and expects a JSON error.
func httpErrorCase(path string, body []byte, status int, want string) func(t *testing.T, h *gatewaytest.Gateway) {
	return func(t *testing.T, h *gatewaytest.Gateway) {
		requireJSONError(t, hostilePostBody(t, h, path, body), status, want)
	}
}

// rawHTTPStatus writes a raw request on a new connection and returns the
// status line (empty when the server closed without answering).
func rawHTTPStatus(t *testing.T, h *gatewaytest.Gateway, request string) string {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.HTTPURL, "http://"))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, request)
	require.NoError(t, err)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	out, _ := io.ReadAll(c)
	line, _, _ := strings.Cut(string(out), "\r\n")
	return line
}

// hostileBatch returns a valid batch of the hostile device with one field
// replaced by a raw JSON fragment: field "" adds nothing; "x" appends
// "x":value.
func hostileBatch(field, value string) string {
	b := map[string]string{
		"batch_id":         `"` + hostileHW + `_b1"`,
		"hardware_id":      `"` + hostileHW + `"`,
		"boot_id":          `"7c9e6679-7425-40de-944b-e07fc1f90ae7"`,
		"firmware_version": `"1.0.16"`,
		"readings":         fmt.Sprintf(`[{"timestamp_ms":%d,"sensors":{"t":20.5},"sensor_status":{"bme280":"ok"}}]`, time.Now().Add(-time.Minute).UnixMilli()),
	}
	if field != "" {
		b[field] = value
	}
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var s strings.Builder
	s.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			s.WriteByte(',')
		}
		s.WriteString(`"` + k + `":` + b[k]) // keys raw: a test may put any bytes in one
	}
	s.WriteByte('}')
	return s.String()
}

// hostileReading returns the readings array of one reading with sensors set to
// the raw JSON fragment.
func hostileReading(sensors string) string {
	return fmt.Sprintf(`[{"timestamp_ms":%d,"sensors":%s,"sensor_status":{}}]`, time.Now().Add(-time.Minute).UnixMilli(), sensors)
}

// hostileRegistration returns a valid registration of the hostile device,
// with "field":value appended unless field is "".
func hostileRegistration(field, value string) string {
	b := `{"hardware_id":"` + hostileHW + `","boot_id":"7c9e6679-7425-40de-944b-e07fc1f90ae7","firmware_version":"1.0.16",` +
		`"friendly_name":"gh","capabilities":{"sensors":["bme280"],"features":{}}`
	if field != "" {
		b += `,"` + field + `":` + value
	}
	return b + "}"
}

// jsonNested wraps inner in depth levels of open and close.
func jsonNested(open, close string, depth int, inner string) string {
	return strings.Repeat(open, depth) + inner + strings.Repeat(close, depth)
}

// --- MQTT -----------------------------------------------------------------

// hostileHW is the hardware_id of hostile MQTT clients.
const hostileHW = "AA:BB:CC:DD:EE:66"

// mqttRejectCase publishes payload from the hostile device on its readings (or
// register) topic and expects a rejected ack with reason and a message
// saying want.
func mqttRejectCase(kind string, payload []byte, reason contract.Reason, want string) func(t *testing.T, h *gatewaytest.Gateway) {
	return func(t *testing.T, h *gatewaytest.Gateway) {
		d, err := gatewaytest.ConnectDevice(t, h, hostileHW, gatewaytest.GoodKey)
		require.NoError(t, err)
		defer d.Client.Disconnect(50)
		topic := contract.ReadingsTopic(hostileHW)
		if kind == contract.KindRegister {
			topic = contract.RegisterTopic(hostileHW)
		}
		tok := d.Client.Publish(topic, 1, false, payload)
		require.True(t, tok.WaitTimeout(20*time.Second))
		require.NoError(t, tok.Error(), "an invalid payload is answered, not left unacknowledged")
		a := d.NextAck(t)
		require.Equal(t, contract.StatusRejected, a.Status)
		require.Equal(t, reason, *a.Reason)
		require.Contains(t, *a.Message, want)
	}
}

func dialMQTT(t testing.TB, h *gatewaytest.Gateway) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.MQTTAddr, "tcp://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// mqttSession opens a raw connection authenticated as the hostile device.
func mqttSession(t *testing.T, h *gatewaytest.Gateway, version byte) net.Conn {
	t.Helper()
	c := dialMQTT(t, h)
	_, err := c.Write(gatewaytest.ConnectPacket(version, hostileHW, hostileHW, gatewaytest.GoodKey))
	require.NoError(t, err)
	first, body, err := gatewaytest.ReadPacket(c, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, byte(0x20), first, "CONNACK")
	require.Equal(t, byte(0), body[1], "CONNACK success")
	return c
}

// requireClosed waits for the broker to close c and returns the packet
// types (first header bytes) it sent before.
func requireClosed(t *testing.T, c net.Conn, within time.Duration) []byte {
	t.Helper()
	deadline := time.Now().Add(within)
	var got []byte
	for {
		first, _, err := gatewaytest.ReadPacket(c, time.Until(deadline))
		var ne net.Error
		switch {
		case err == nil:
			got = append(got, first)
			continue
		case errors.As(err, &ne) && ne.Timeout():
			t.Fatalf("the connection is still open after %s (received % x)", within, got)
		}
		return got // EOF or reset: closed
	}
}

// mqttClosedCase writes bytes on a fresh connection (after an authenticated
// CONNECT of version when version > 0) and expects the broker to close it
// for what it sent (not by the connect timeout), having sent only the
// packet types in want.
func mqttClosedCase(version byte, data []byte, want ...byte) func(t *testing.T, h *gatewaytest.Gateway) {
	return func(t *testing.T, h *gatewaytest.Gateway) {
		timeouts := refusedCount(t, h, "connect_timeout")
		var c net.Conn
		if version > 0 {
			c = mqttSession(t, h, version)
		} else {
			c = dialMQTT(t, h)
		}
		_, err := c.Write(data)
		require.NoError(t, err)
		got := requireClosed(t, c, 5*time.Second)
		if want == nil {
			want = []byte{}
		}
		require.Equal(t, want, append([]byte{}, got...))
		require.Equal(t, timeouts, refusedCount(t, h, "connect_timeout"), "closed for what it sent, not by the connect timeout")
	}
}

// mqttTimeoutCase writes bytes on a fresh connection and expects the broker
// to close it after the connect timeout (1s here), without a word.
func mqttTimeoutCase(data []byte) func(t *testing.T, h *gatewaytest.Gateway) {
	return func(t *testing.T, h *gatewaytest.Gateway) {
		timeouts := refusedCount(t, h, "connect_timeout")
		start := time.Now()
		c := dialMQTT(t, h)
		_, err := c.Write(data)
		require.NoError(t, err)
		require.Empty(t, requireClosed(t, c, 5*time.Second))
		require.GreaterOrEqual(t, time.Since(start), 800*time.Millisecond, "closed by the connect timeout")
		require.Equal(t, timeouts+1, refusedCount(t, h, "connect_timeout"))
	}
}

// mqttRefusedCase writes a CONNECT and expects a CONNACK with return code
// code, then the close.
func mqttRefusedCase(data []byte, code byte) func(t *testing.T, h *gatewaytest.Gateway) {
	return func(t *testing.T, h *gatewaytest.Gateway) {
		c := dialMQTT(t, h)
		_, err := c.Write(data)
		require.NoError(t, err)
		first, body, err := gatewaytest.ReadPacket(c, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte(0x20), first, "CONNACK")
		require.Equal(t, code, body[1], "CONNACK return code")
		requireClosed(t, c, 5*time.Second)
	}
}

// --- the catalogue ----------------------------------------------------------

type hostileCase struct {
	category string
	name     string
	run      func(t *testing.T, h *gatewaytest.Gateway)
}

func hostileCatalogue() []hostileCase {
	ts := time.Now().Add(-time.Minute).UnixMilli()
	long := strings.Repeat("x", 60<<10)
	manySensors := func(n int) string {
		var s strings.Builder
		s.WriteByte('{')
		for i := range n {
			if i > 0 {
				s.WriteByte(',')
			}
			fmt.Fprintf(&s, `"s%d":1`, i)
		}
		return s.String() + "}"
	}
	manyReadings := func(n int) string {
		var s strings.Builder
		s.WriteByte('[')
		for i := range n {
			if i > 0 {
				s.WriteByte(',')
			}
			fmt.Fprintf(&s, `{"timestamp_ms":%d,"sensors":{},"sensor_status":{}}`, ts-int64(i))
		}
		return s.String() + "]"
	}
	emptyBatches := func(n int) []byte {
		return []byte(`{"batches":[` + strings.TrimSuffix(strings.Repeat("{},", n), ",") + `]}`)
	}
	v5Subscribe := func(body []byte) []byte { return gatewaytest.MQTTPacket(0x82, body) }
	ackFilter := gatewaytest.MQTTString(contract.AckTopic(hostileHW))
	bv := func(s string) []byte { return []byte(s) }
	var cs []hostileCase
	add := func(category, name string, run func(t *testing.T, h *gatewaytest.Gateway)) {
		cs = append(cs, hostileCase{category, name, run})
	}

	// JSON through POST /v1/readings: each gets 400 and a message naming the problem.
	const R = "/v1/readings"
	add("json", "arrays nested 10000 deep", httpErrorCase(R, bv(hostileBatch("x", jsonNested("[", "]", 10000, ""))), 400, "nesting deeper than 16 levels"))
	add("json", "objects nested 10000 deep", httpErrorCase(R, bv(hostileBatch("x", jsonNested(`{"a":`, "}", 10000, "1"))), 400, "nesting deeper than 16 levels"))
	add("json", "nesting 17 deep in a sensor value", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":`+jsonNested("[", "]", 15, "1")+`}`))), 400, "nesting deeper than 16 levels"))
	add("json", "deep nesting inside the batches array", httpErrorCase(R, bv(`{"batches":[`+jsonNested("[", "]", 100, "")+`]}`), 400, "nesting deeper"))
	add("json", "timestamp of 30 digits", httpErrorCase(R, bv(hostileBatch("readings", `[{"timestamp_ms":100000000000000000000000000000,"sensors":{},"sensor_status":{}}]`)), 400, "readings[0].timestamp_ms: is out of range"))
	add("json", "sensor value of 10000 digits", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":1`+strings.Repeat("0", 10000)+`}`))), 400, "readings[0].sensors.t: must be a finite number that DynamoDB can store"))
	add("json", "sensor value 1e400 (overflow)", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":1e400}`))), 400, "readings[0].sensors.t: must be a finite number that DynamoDB can store"))
	add("json", "sensor value -1e400", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":-1e400}`))), 400, "readings[0].sensors.t: must be a finite number that DynamoDB can store"))
	add("json", "sensor value 1e-400 (underflow)", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":1e-400}`))), 400, "readings[0].sensors.t: must be a finite number that DynamoDB can store"))
	add("json", "exponent of 5000 digits", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":1e`+strings.Repeat("9", 5000)+`}`))), 400, "readings[0].sensors.t: must be a finite number that DynamoDB can store"))
	add("json", "NaN literal", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":NaN}`))), 400, "NaN is not valid JSON"))
	add("json", "Infinity literal", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":Infinity}`))), 400, "Infinity is not valid JSON"))
	add("json", "-Infinity literal", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":-Infinity}`))), 400, "-Infinity is not valid JSON"))
	add("json", `"NaN" as a string value`, httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":"NaN"}`))), 400, "readings[0].sensors.t: must be a finite number, not a string"))
	add("json", "duplicate key batch_id", httpErrorCase(R, bv(strings.Replace(hostileBatch("", ""), "{", `{"batch_id":"`+hostileHW+`_b0",`, 1)), 400, "batch_id: duplicate key"))
	add("json", "duplicate key spelled with an escape", httpErrorCase(R, bv(strings.Replace(hostileBatch("", ""), "{", `{"batch\u005fid":"`+hostileHW+`_b0",`, 1)), 400, "batch_id: duplicate key"))
	add("json", "duplicate sensor name", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(`{"t":1,"t":2}`))), 400, "readings[0].sensors.t: duplicate key"))
	add("json", `"batches" twice`, httpErrorCase(R, bv(`{"batches":[`+hostileBatch("", "")+`],"batches":[`+hostileBatch("", "")+`]}`), 400, "batches: unknown field"))
	add("json", "invalid UTF-8 in a value", httpErrorCase(R, bv(hostileBatch("firmware_version", "\"1.0\xff\"")), 400, "invalid UTF-8"))
	add("json", "invalid UTF-8 in a key", httpErrorCase(R, bv(hostileBatch("x\xfe", "1")), 400, "invalid UTF-8"))
	add("json", "overlong UTF-8 encoding of '/'", httpErrorCase(R, bv(hostileBatch("firmware_version", "\"\xc0\xaf\"")), 400, "invalid UTF-8"))
	add("json", "UTF-8 encoded surrogate", httpErrorCase(R, bv(hostileBatch("firmware_version", "\"\xed\xa0\x80\"")), 400, "invalid UTF-8"))
	add("json", `unpaired surrogate escape \ud800`, httpErrorCase(R, bv(hostileBatch("firmware_version", `"\ud800"`)), 400, "unpaired UTF-16 surrogate"))
	add("json", "raw NUL in a string", httpErrorCase(R, bv(hostileBatch("firmware_version", "\"a\x00b\"")), 400, "control character U+0000"))
	add("json", "byte order mark", httpErrorCase(R, bv("\xef\xbb\xbf"+hostileBatch("", "")), 400, "byte order mark"))
	add("json", "60 KiB firmware_version", httpErrorCase(R, bv(hostileBatch("firmware_version", `"`+long+`"`)), 400, "firmware_version: must be 1 to 64 printable ASCII characters"))
	add("json", "60 KiB key", httpErrorCase(R, bv(hostileBatch(long, "1")), 400, "unknown field"))
	add("json", "60 KiB batch_id", httpErrorCase(R, bv(hostileBatch("batch_id", `"`+hostileHW+"_"+long+`"`)), 400, "batch_id: must be 1 to 256 characters long"))
	add("json", "5000 sensors in a reading", httpErrorCase(R, bv(hostileBatch("readings", hostileReading(manySensors(5000)))), 400, "readings[0].sensors: must have at most 64 entries"))
	add("json", "1000 readings in a batch", httpErrorCase(R, bv(hostileBatch("readings", manyReadings(1000))), 400, "readings: must contain at most 100 readings"))
	add("json", "empty body", httpErrorCase(R, nil, 400, "empty payload"))
	add("json", "whitespace only", httpErrorCase(R, bv(" \n\t "), 400, "only whitespace"))
	add("json", "data after the batch", httpErrorCase(R, bv(hostileBatch("", "")+"garbage"), 400, "unexpected data after the JSON value"))
	add("json", "two batches back to back", httpErrorCase(R, bv(hostileBatch("", "")+hostileBatch("", "")), 400, "unexpected data after the JSON value"))
	add("json", "top-level array", httpErrorCase(R, bv(`[`+hostileBatch("", "")+`]`), 400, "must be a batch object"))
	add("json", "top-level number", httpErrorCase(R, bv(`12`), 400, "must be a batch object"))
	add("json", "empty batches array", httpErrorCase(R, bv(`{"batches":[]}`), 400, "at least 1 batch"))
	add("json", "batches not an array", httpErrorCase(R, bv(`{"batches":{}}`), 400, "must be an array"))
	add("json", "9000 empty batches in 27 KB", httpErrorCase(R, emptyBatches(9000), 400, "batches in one request"))
	add("json", "truncated batch", httpErrorCase(R, bv(hostileBatch("", "")[:80]), 400, "truncated"))
	add("json", "register: nested 10000 deep", httpErrorCase("/v1/register", bv(hostileRegistration("x", jsonNested("[", "]", 10000, ""))), 400, "nesting deeper"))
	add("json", "register: NaN literal", httpErrorCase("/v1/register", bv(hostileRegistration("x", "NaN")), 400, "NaN"))
	add("json", "register: duplicate key", httpErrorCase("/v1/register", bv(hostileRegistration("hardware_id", `"`+hostileHW+`"`)), 400, "hardware_id: duplicate key"))
	add("json", "register: invalid UTF-8", httpErrorCase("/v1/register", bv(strings.Replace(hostileRegistration("", ""), `"gh"`, "\"g\xffh\"", 1)), 400, "invalid UTF-8"))

	// HTTP framing, sizes, headers and clients.
	add("http", "body over http.max_body_bytes", httpErrorCase(R, bytes.Repeat([]byte(" "), 64<<10+1), 413, "larger than 65536 bytes"))
	add("http", "register body over the limit", httpErrorCase("/v1/register", bytes.Repeat([]byte(" "), 64<<10+1), 413, "larger than 65536 bytes"))
	add("http", "chunked body over the limit", func(t *testing.T, h *gatewaytest.Gateway) {
		// A reader of unknown length makes net/http send the body chunked.
		body := io.MultiReader(strings.NewReader(`{"batches":[`), strings.NewReader(strings.Repeat(" ", 100<<10)))
		requireJSONError(t, hostilePost(t, h, R, nil, body), 413, "larger than 65536 bytes")
	})
	add("http", "Content-Length of 10 GB", func(t *testing.T, h *gatewaytest.Gateway) {
		line := rawHTTPStatus(t, h, "POST /v1/readings HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+gatewaytest.GoodKey+
			"\r\nContent-Length: 10000000000\r\n\r\n"+strings.Repeat(" ", 70<<10))
		require.Equal(t, "HTTP/1.1 413 Request Entity Too Large", line)
	})
	add("http", "body shorter than its Content-Length", func(t *testing.T, h *gatewaytest.Gateway) {
		line := rawHTTPStatus(t, h, "POST /v1/readings HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+gatewaytest.GoodKey+
			"\r\nContent-Length: 1000\r\n\r\n{\"batch_id\"")
		require.Equal(t, "HTTP/1.1 400 Bad Request", line)
	})
	add("http", "Content-Length and Transfer-Encoding both", func(t *testing.T, h *gatewaytest.Gateway) {
		line := rawHTTPStatus(t, h, "POST /v1/readings HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+gatewaytest.GoodKey+
			"\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
		require.Equal(t, "HTTP/1.1 400 Bad Request", line)
	})
	add("http", "headers over MaxHeaderBytes", func(t *testing.T, h *gatewaytest.Gateway) {
		a := hostilePost(t, h, R, map[string]string{"X-Padding": strings.Repeat("p", 64<<10)}, strings.NewReader(hostileBatch("", "")))
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, a.status)
	})
	add("http", "10 KiB API key", func(t *testing.T, h *gatewaytest.Gateway) {
		a := hostilePost(t, h, R, map[string]string{"Authorization": "Bearer " + strings.Repeat("k", 10<<10)}, strings.NewReader(hostileBatch("", "")))
		requireJSONError(t, a, 401, "API key")
	})
	add("http", "Bearer without a key", func(t *testing.T, h *gatewaytest.Gateway) {
		requireJSONError(t, hostilePost(t, h, R, map[string]string{"Authorization": "Bearer "}, strings.NewReader(hostileBatch("", ""))), 401, "API key")
	})
	add("http", "API key of invalid UTF-8", func(t *testing.T, h *gatewaytest.Gateway) {
		a := hostilePost(t, h, R, map[string]string{"Authorization": "", "X-API-Key": "\xff\xfe"}, strings.NewReader(hostileBatch("", "")))
		requireJSONError(t, a, 401, "API key")
	})
	add("http", "unauthenticated body over the limit", func(t *testing.T, h *gatewaytest.Gateway) {
		a := hostilePost(t, h, R, map[string]string{"Authorization": ""}, bytes.NewReader(bytes.Repeat([]byte(" "), 1<<20)))
		requireJSONError(t, a, 401, "API key")
	})
	add("http", "GET on /v1/readings", func(t *testing.T, h *gatewaytest.Gateway) {
		resp, err := http.Get(h.HTTPURL + R)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	})
	add("http", "slowloris: headers one byte at a time", func(t *testing.T, h *gatewaytest.Gateway) {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.HTTPURL, "http://"))
		require.NoError(t, err)
		defer c.Close()
		closed := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, c)
			close(closed)
		}()
		start := time.Now()
		header := "POST /v1/readings HTTP/1.1\r\nHost: gw\r\nX-Slow: " + strings.Repeat("s", 400)
		for i := 0; i < len(header); i++ { // at most 400 × 25 ms = 10 s
			select {
			case <-closed:
				elapsed := time.Since(start)
				require.GreaterOrEqual(t, elapsed, 900*time.Millisecond, "dropped by the header timeout, not at once")
				require.Less(t, elapsed, 4*time.Second, "ReadHeaderTimeout is 1s here")
				return
			case <-time.After(25 * time.Millisecond):
			}
			if _, err := c.Write([]byte{header[i]}); err != nil {
				break
			}
		}
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("the server kept a slowloris client")
		}
	})
	add("http", "slow body: one byte at a time", func(t *testing.T, h *gatewaytest.Gateway) {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.HTTPURL, "http://"))
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, "POST /v1/readings HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+gatewaytest.GoodKey+"\r\nContent-Length: 400\r\n\r\n")
		require.NoError(t, err)
		answered := make(chan []byte, 1)
		go func() {
			out, _ := io.ReadAll(c)
			answered <- out
		}()
		for i := 0; i < 400; i++ { // at most 400 × 25 ms = 10 s
			select {
			case out := <-answered:
				require.True(t, strings.HasPrefix(string(out), "HTTP/1.1 400 "), "%.200s", out)
				require.Contains(t, string(out), "reading the request body")
				return
			case <-time.After(25 * time.Millisecond):
			}
			if _, err := c.Write([]byte(" ")); err != nil {
				break
			}
		}
		select {
		case out := <-answered:
			require.True(t, strings.HasPrefix(string(out), "HTTP/1.1 400 "), "%.200s", out)
		case <-time.After(5 * time.Second):
			t.Fatal("the server kept a slow body")
		}
	})

	// Payloads over MQTT: each is answered on the ack topic (and PUBACKed).
	RK, GK := contract.KindReadings, contract.KindRegister
	add("mqtt-payload", "nested 10000 deep", mqttRejectCase(RK, bv(hostileBatch("x", jsonNested("[", "]", 10000, ""))), contract.ReasonValidation, "nesting deeper"))
	add("mqtt-payload", "NaN literal", mqttRejectCase(RK, bv(hostileBatch("readings", hostileReading(`{"t":NaN}`))), contract.ReasonValidation, "NaN"))
	add("mqtt-payload", "Infinity literal", mqttRejectCase(RK, bv(hostileBatch("readings", hostileReading(`{"t":Infinity}`))), contract.ReasonValidation, "Infinity"))
	add("mqtt-payload", "1e400", mqttRejectCase(RK, bv(hostileBatch("readings", hostileReading(`{"t":1e400}`))), contract.ReasonValidation, "readings[0].sensors.t: must be a finite number that DynamoDB can store"))
	add("mqtt-payload", "duplicate key", mqttRejectCase(RK, bv(hostileBatch("readings", hostileReading(`{"t":1,"t":1}`))), contract.ReasonValidation, "readings[0].sensors.t: duplicate key"))
	add("mqtt-payload", "invalid UTF-8", mqttRejectCase(RK, bv(hostileBatch("firmware_version", "\"\xff\"")), contract.ReasonValidation, "invalid UTF-8"))
	add("mqtt-payload", "empty payload", mqttRejectCase(RK, nil, contract.ReasonValidation, "empty payload"))
	add("mqtt-payload", "200 KiB string", mqttRejectCase(RK, bv(hostileBatch("firmware_version", `"`+strings.Repeat("x", 200<<10)+`"`)), contract.ReasonValidation, "firmware_version: must be 1 to 64 printable ASCII characters"))
	add("mqtt-payload", "multi-batch body on MQTT", mqttRejectCase(RK, bv(`{"batches":[`+hostileBatch("", "")+`]}`), contract.ReasonValidation, "batches: unknown field"))
	add("mqtt-payload", "register: NaN", mqttRejectCase(GK, bv(hostileRegistration("x", "NaN")), contract.ReasonValidation, "NaN"))
	add("mqtt-payload", "register: nested 10000 deep", mqttRejectCase(GK, bv(hostileRegistration("x", jsonNested("{\"a\":", "}", 10000, "1"))), contract.ReasonValidation, "nesting deeper"))

	// MQTT sessions of an authenticated client misbehaving.
	add("mqtt-session", "PUBLISH over mqtt.max_packet_size", func(t *testing.T, h *gatewaytest.Gateway) {
		d, err := gatewaytest.ConnectDevice(t, h, hostileHW, gatewaytest.GoodKey)
		require.NoError(t, err)
		tok := d.Publish(bytes.Repeat([]byte(" "), 300<<10))
		tok.WaitTimeout(5 * time.Second)
		require.Eventually(t, func() bool { return !d.Client.IsConnectionOpen() }, 10*time.Second, 20*time.Millisecond,
			"a packet over 256 KiB ends the connection")
		select {
		case <-tok.Done():
			require.Error(t, tok.Error(), "no PUBACK")
		default:
		}
	})
	add("mqtt-session", "PUBLISH declaring 256 MiB", mqttClosedCase(4, []byte{0x32, 0xFF, 0xFF, 0xFF, 0x7F}))
	// A QoS 1 PUBLISH the ACL refuses ends a 3.1.1 session (there is no
	// negative PUBACK): mochi sends a DISCONNECT (0xE0) first.
	add("mqtt-session", "topic of 60 KiB", func(t *testing.T, h *gatewaytest.Gateway) {
		body := append(gatewaytest.MQTTString("devices/"+hostileHW+"/"+long), 0, 1)
		mqttClosedCase(4, gatewaytest.MQTTPacket(0x32, append(body, hostileBatch("", "")...)), 0xE0)(t, h)
	})
	add("mqtt-session", "topic with a NUL", mqttClosedCase(4, gatewaytest.MQTTPacket(0x32, append(append(gatewaytest.MQTTString("devices/"+hostileHW+"/readings\x00"), 0, 1), '{', '}'))))
	add("mqtt-session", "topic of invalid UTF-8", mqttClosedCase(4, gatewaytest.MQTTPacket(0x32, append(append(gatewaytest.MQTTString("devices/\xff/readings"), 0, 1), '{', '}'))))
	add("mqtt-session", "PUBLISH to another device's readings", mqttClosedCase(4, gatewaytest.MQTTPacket(0x32, append(append(gatewaytest.MQTTString(contract.ReadingsTopic("AA:BB:CC:DD:EE:67")), 0, 1), '{', '}')), 0xE0))
	add("mqtt-session", "PUBLISH to its own ack topic", mqttClosedCase(4, gatewaytest.MQTTPacket(0x32, append(append(gatewaytest.MQTTString(contract.AckTopic(hostileHW)), 0, 1), '{', '}')), 0xE0))
	add("mqtt-session", "PUBLISH to a wildcard topic", func(t *testing.T, h *gatewaytest.Gateway) {
		before := h.Buf.Stats().PendingBatches
		mqttClosedCase(4, gatewaytest.MQTTPacket(0x32, append(append(gatewaytest.MQTTString("devices/+/readings"), 0, 1), hostileBatch("", "")...)))(t, h)
		require.Equal(t, before, h.Buf.Stats().PendingBatches, "nothing stored")
	})
	add("mqtt-session", "QoS 1 PUBLISH with packet id 0", mqttClosedCase(4, gatewaytest.MQTTPacket(0x32, append(append(gatewaytest.MQTTString(contract.ReadingsTopic(hostileHW)), 0, 0), '{', '}'))))
	add("mqtt-session", "SUBSCRIBE to #", func(t *testing.T, h *gatewaytest.Gateway) {
		c := mqttSession(t, h, 4)
		_, err := c.Write(gatewaytest.MQTTPacket(0x82, append(append([]byte{0, 7}, gatewaytest.MQTTString("#")...), 1)))
		require.NoError(t, err)
		first, body, err := gatewaytest.ReadPacket(c, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte(0x90), first, "SUBACK")
		require.Equal(t, []byte{0, 7, 0x80}, body, "failure")
	})
	add("mqtt-session", "SUBSCRIBE to every device's acks", func(t *testing.T, h *gatewaytest.Gateway) {
		c := mqttSession(t, h, 4)
		_, err := c.Write(gatewaytest.MQTTPacket(0x82, append(append([]byte{0, 8}, gatewaytest.MQTTString("devices/+/ack")...), 1)))
		require.NoError(t, err)
		first, body, err := gatewaytest.ReadPacket(c, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, byte(0x90), first, "SUBACK")
		require.Equal(t, []byte{0, 8, 0x80}, body, "failure")
	})
	add("mqtt-session", "SUBSCRIBE without its QoS byte (v3)", mqttClosedCase(4, gatewaytest.MQTTPacket(0x82, append([]byte{0, 1}, ackFilter...))))
	add("mqtt-session", "truncated v5 SUBSCRIBE (mochi issue 501)", mqttClosedCase(5, v5Subscribe(append([]byte{0, 1, 0}, ackFilter...))))
	add("mqtt-session", "v5 SUBSCRIBE with an empty filter and no options (issue 501)", mqttClosedCase(5, v5Subscribe([]byte{0, 1, 0, 0, 0})))
	add("mqtt-session", "v5 SUBSCRIBE with a second filter truncated", mqttClosedCase(5, v5Subscribe(append(append(append([]byte{0, 1, 0}, ackFilter...), 1), ackFilter...))))
	// MQTT 5 packets mochi does not decode are answered with DISCONNECT
	// (0x81, malformed packet) before the close.
	add("mqtt-session", "v5 SUBSCRIBE with properties longer than the packet", mqttClosedCase(5, v5Subscribe([]byte{0, 1, 0x7F, 0x0B}), 0xE0))
	add("mqtt-session", "v5 UNSUBSCRIBE truncated", mqttClosedCase(5, gatewaytest.MQTTPacket(0xA2, []byte{0, 1, 0, 0}), 0xE0))
	add("mqtt-session", "second CONNECT", mqttClosedCase(4, gatewaytest.ConnectPacket(4, hostileHW, hostileHW, gatewaytest.GoodKey)))
	add("mqtt-session", "reserved packet type 15", mqttClosedCase(4, []byte{0xF0, 0}))

	// Connections before and at CONNECT, written as raw bytes.
	connect := gatewaytest.ConnectPacket(4, hostileHW, hostileHW, gatewaytest.GoodKey)
	add("mqtt-connect", "remaining length of 5 bytes", mqttClosedCase(0, []byte{0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}))
	add("mqtt-connect", "endless continuation bytes", mqttClosedCase(0, append([]byte{0x10}, bytes.Repeat([]byte{0x80}, 100)...)))
	add("mqtt-connect", "remaining length beyond the data, then EOF", func(t *testing.T, h *gatewaytest.Gateway) {
		c := dialMQTT(t, h)
		_, err := c.Write(append([]byte{0x10, 0x7F}, connect[2:20]...))
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		require.Empty(t, requireClosed(t, c, 5*time.Second))
	})
	add("mqtt-connect", "empty CONNECT", mqttClosedCase(0, []byte{0x10, 0x00}))
	// mochi refuses these with the MQTT 5 reason code 0x82 (protocol
	// error), even in a 3.1.1 CONNACK: the client sees a refusal either way.
	add("mqtt-connect", "protocol name MQTX", mqttRefusedCase(bytes.Replace(connect, []byte("MQTT"), []byte("MQTX"), 1), 0x82))
	add("mqtt-connect", "protocol level 9", mqttRefusedCase(bytes.Replace(connect, []byte("MQTT\x04"), []byte("MQTT\x09"), 1), 0x82))
	add("mqtt-connect", "reserved connect flag set", mqttRefusedCase(bytes.Replace(connect, []byte("MQTT\x04\xC2"), []byte("MQTT\x04\xC3"), 1), 0x82))
	add("mqtt-connect", "CONNECT with header flags set", mqttClosedCase(0, append([]byte{0x11}, connect[1:]...)))
	add("mqtt-connect", "PUBLISH before CONNECT", mqttClosedCase(0, gatewaytest.MQTTPacket(0x30, append(gatewaytest.MQTTString(contract.ReadingsTopic(hostileHW)), '{', '}'))))
	add("mqtt-connect", "SUBSCRIBE before CONNECT", mqttClosedCase(0, gatewaytest.MQTTPacket(0x82, append(append([]byte{0, 1}, ackFilter...), 1))))
	add("mqtt-connect", "PINGREQ before CONNECT", mqttClosedCase(0, []byte{0xC0, 0}))
	add("mqtt-connect", "CONNACK sent to the broker", mqttClosedCase(0, []byte{0x20, 2, 0, 0}))
	add("mqtt-connect", "CONNECT declaring 200 KiB, header only (mochi issue 502)", mqttClosedCase(0, append([]byte{0x10}, gatewaytest.MQTTVarint(200<<10)...)))
	add("mqtt-connect", "CONNECT declaring 256 MiB", mqttClosedCase(0, []byte{0x10, 0xFF, 0xFF, 0xFF, 0x7F}))
	add("mqtt-connect", "CONNECT just over the CONNECT limit", func(t *testing.T, h *gatewaytest.Gateway) {
		body := append(gatewaytest.MQTTString("MQTT"), 4, 0xC2, 0, 60)
		body = append(body, gatewaytest.MQTTString(hostileHW+"-"+strings.Repeat("c", broker.MaxConnectPacketSize))...)
		mqttClosedCase(0, gatewaytest.MQTTPacket(0x10, append(append(body, gatewaytest.MQTTString(hostileHW)...), gatewaytest.MQTTString(gatewaytest.GoodKey)...)))(t, h)
	})
	add("mqtt-connect", "v5 CONNECT with properties longer than the packet", mqttClosedCase(0, gatewaytest.MQTTPacket(0x10, append(gatewaytest.MQTTString("MQTT"), 5, 0xC2, 0, 60, 0x7F))))
	add("mqtt-connect", "no bytes at all (closed after the connect timeout)", mqttTimeoutCase(nil))
	add("mqtt-connect", "half a CONNECT, then silence", mqttTimeoutCase(connect[:10]))
	add("mqtt-connect", "15 KiB of a CONNECT, then silence", mqttTimeoutCase(
		append([]byte{0x10}, append(gatewaytest.MQTTVarint(broker.MaxConnectPacketSize-10), bytes.Repeat([]byte{'c'}, 15<<10)...)...)))
	add("mqtt-connect", "username not a hardware_id", mqttRefusedCase(gatewaytest.ConnectPacket(4, "device-1", "device-1", gatewaytest.GoodKey), 5))
	add("mqtt-connect", "hardware_id of 60 KiB", mqttClosedCase(0, gatewaytest.ConnectPacket(4, hostileHW, hostileHW+long, gatewaytest.GoodKey)))
	add("mqtt-connect", "password of 10 KiB", mqttRefusedCase(gatewaytest.ConnectPacket(4, hostileHW, hostileHW, strings.Repeat("k", 10<<10)), 5))
	add("mqtt-connect", "will on another device's ack topic", func(t *testing.T, h *gatewaytest.Gateway) {
		victim := "AA:BB:CC:DD:EE:67"
		v, err := gatewaytest.ConnectDevice(t, h, victim, gatewaytest.GoodKey)
		require.NoError(t, err)
		forged := `{"type":"readings","batch_id":"` + victim + `_b1","status":"accepted","reason":null,"message":null}`
		opts := paho.NewClientOptions().AddBroker(h.MQTTAddr).SetClientID(hostileHW).SetUsername(hostileHW).
			SetPassword(gatewaytest.GoodKey).SetAutoReconnect(false).SetWill(contract.AckTopic(victim), forged, 1, false)
		c := paho.NewClient(opts)
		tok := c.Connect()
		require.True(t, tok.WaitTimeout(10*time.Second))
		if tok.Error() == nil {
			// Ungraceful end: a publish the ACL refuses drops the client.
			c.Publish(contract.ReadingsTopic(victim), 1, false, "x").WaitTimeout(time.Second)
		}
		require.ErrorContains(t, tok.Error(), "not Authorized")
		select {
		case a := <-v.Acks:
			t.Fatalf("the victim received a forged ack: %+v", a)
		case <-time.After(300 * time.Millisecond):
		}
		require.GreaterOrEqual(t, refusedCount(t, h, "bad_will"), 1.0)
	})
	// QoS 3 does not exist: refused with the MQTT 5 code 0x82 (protocol
	// error), which mochi sends to 3.1.1 clients too.
	add("mqtt-connect", "will with QoS 3", mqttRefusedCase(gatewaytest.MQTTPacket(0x10, append(append(append(append(append(
		gatewaytest.MQTTString("MQTT"), 4, 0xDE, 0, 60), gatewaytest.MQTTString(hostileHW)...), gatewaytest.MQTTString(contract.ReadingsTopic(hostileHW))...),
		gatewaytest.MQTTString("{}")...), append(gatewaytest.MQTTString(hostileHW), gatewaytest.MQTTString(gatewaytest.GoodKey)...)...)), 0x82))
	return cs
}

// refusedCount returns gateway_mqtt_connections_refused_total{reason}.
func refusedCount(t testing.TB, h *gatewaytest.Gateway, reason string) float64 {
	t.Helper()
	mfs, err := h.Reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "gateway_mqtt_connections_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestShortestBatchIsLongerThanMinBatchBytes backs the HTTP limit of
// batches per request (max_body_bytes / MinBatchBytes): the shortest valid
// batch (the shortest batch_id, one reading of the earliest timestamp, no
// sensors) is longer than MinBatchBytes, so no valid request reaches it.
func TestShortestBatchIsLongerThanMinBatchBytes(t *testing.T) {
	shortest := `{"batch_id":"AA:BB:CC:DD:EE:FF_x","hardware_id":"AA:BB:CC:DD:EE:FF",` +
		`"boot_id":"7c9e6679-7425-40de-944b-e07fc1f90ae7","firmware_version":"1","readings":[{"timestamp_ms":946684800000}]}`
	_, err := contract.DecodeBatch([]byte(shortest), "", contract.DefaultLimits(), time.Now())
	require.NoError(t, err)
	require.Greater(t, len(shortest), contract.MinBatchBytes)
}

// TestHostileInputs runs the catalogue of hostile inputs through the real
// transports (net/http, paho, raw TCP), each answered with its clear error
// or a closed connection, and checks after each one that a well-behaved
// device is still served.
func TestHostileInputs(t *testing.T) {
	h := startHostile(t, hostileOptions{})
	cases := hostileCatalogue()
	require.GreaterOrEqual(t, len(cases), 50)
	byCategory := map[string]int{}
	for _, c := range cases {
		byCategory[c.category]++
		t.Run(c.category+"/"+c.name, func(t *testing.T) {
			c.run(t, h)
			requireServes(t, h)
		})
	}
	t.Logf("%d hostile inputs: %v", len(cases), byCategory)
}

// heapInUse returns the live heap after two collections.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// openConns opens n connections to addr and writes data on each (nil: a
// first byte, 0x10, and no more).
func openConns(t *testing.T, addr string, n int, data []byte) []net.Conn {
	t.Helper()
	return openConnsFrom(t, "", addr, n, data)
}

// openConnsFrom is openConns from the loopback address src ("127.0.0.2",
// say; "" is the default source).
func openConnsFrom(t *testing.T, src, addr string, n int, data []byte) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	d := net.Dialer{Timeout: 5 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	if data == nil {
		// A socket that sends nothing at all stays in the kernel's SYN
		// queue (TCP_DEFER_ACCEPT, listen.go) and never reaches the
		// gateway; one that stalls after its first byte (of an MQTT
		// CONNECT, an HTTP request line) is what the gateway holds.
		data = []byte{0x10}
	}
	for range n {
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
		if len(data) > 0 {
			_, err = c.Write(data)
			require.NoError(t, err)
		}
	}
	return conns
}

// TestHostileFloods floods the gateway with connections that never
// authenticate, and checks that it closes them (at once, or after its
// timeouts), serves a well-behaved device meanwhile, and that its heap
// stays bounded.
func TestHostileFloods(t *testing.T) {
	const n = 400
	h := startHostile(t, hostileOptions{})
	requireServes(t, h) // warm up: first connections, first commits
	mqttAddr := strings.TrimPrefix(h.MQTTAddr, "tcp://")
	httpAddr := strings.TrimPrefix(h.HTTPURL, "http://")
	base := heapInUse()
	peak := int64(0)
	measure := func(what string) {
		grown := heapInUse() - base
		peak = max(peak, grown)
		t.Logf("heap %+d KiB %s", grown>>10, what)
	}

	t.Run("MQTT connections that never send CONNECT", func(t *testing.T) {
		timeouts := refusedCount(t, h, "connect_timeout")
		opened := time.Now()
		conns := openConns(t, mqttAddr, n, nil)
		measure(fmt.Sprintf("with %d idle MQTT connections", n))
		requireServes(t, h)
		early := gatewaytest.ClosedWithin(t, conns, opened.Add(900*time.Millisecond), 5*time.Second)
		require.Zero(t, early, "kept until the connect timeout (1s)")
		require.Equal(t, timeouts+n, refusedCount(t, h, "connect_timeout"))
	})
	t.Run("CONNECT headers declaring 200 KiB (mochi issue 502)", func(t *testing.T) {
		timeouts, malformed := refusedCount(t, h, "connect_timeout"), refusedCount(t, h, "malformed")
		conns := openConns(t, mqttAddr, n, append([]byte{0x10}, gatewaytest.MQTTVarint(200<<10)...))
		measure(fmt.Sprintf("with %d connections declaring 200 KiB", n))
		gatewaytest.ClosedWithin(t, conns, time.Time{}, 5*time.Second)
		require.Equal(t, malformed+n, refusedCount(t, h, "malformed"), "closed at the header, for its size")
		require.Equal(t, timeouts, refusedCount(t, h, "connect_timeout"))
		requireServes(t, h)
	})
	t.Run("CONNECTs of 15 KiB that never end", func(t *testing.T) {
		data := append([]byte{0x10}, append(gatewaytest.MQTTVarint(broker.MaxConnectPacketSize-10), bytes.Repeat([]byte{'c'}, 15<<10)...)...)
		timeouts := refusedCount(t, h, "connect_timeout")
		conns := openConns(t, mqttAddr, n, data)
		measure(fmt.Sprintf("with %d connections holding 15 KiB of a CONNECT", n))
		requireServes(t, h)
		gatewaytest.ClosedWithin(t, conns, time.Time{}, 5*time.Second)
		require.Equal(t, timeouts+n, refusedCount(t, h, "connect_timeout"))
	})
	t.Run("HTTP connections that never send a request", func(t *testing.T) {
		conns := openConns(t, httpAddr, n, nil)
		measure(fmt.Sprintf("with %d idle HTTP connections", n))
		requireServes(t, h)
		gatewaytest.ClosedWithin(t, conns, time.Time{}, 5*time.Second)
	})
	t.Run("HTTP headers that never end", func(t *testing.T) {
		conns := openConns(t, httpAddr, n, []byte("POST /v1/readings HTTP/1.1\r\nHost: gw\r\nX-A: "+strings.Repeat("a", 8<<10)))
		measure(fmt.Sprintf("with %d unfinished HTTP headers of 8 KiB", n))
		requireServes(t, h)
		gatewaytest.ClosedWithin(t, conns, time.Time{}, 5*time.Second)
	})

	measure("after the floods")
	require.Less(t, peak, int64(64<<20), "heap growth during the floods")
	requireServes(t, h)
}

// TestHostileConnectionCaps checks the caps on connections: beyond the cap
// on unauthenticated connections the oldest are shed at once, the newest
// are kept until their connect timeout, and mqtt.max_clients caps
// authenticated clients.
func TestHostileConnectionCaps(t *testing.T) {
	h := startHostile(t, hostileOptions{maxPending: 64, connectTimeout: 3 * time.Second,
		mqtt: broker.MQTTConfig{MaxClients: 3, MaxClientsPerKeyPercent: 100}})
	mqttAddr := strings.TrimPrefix(h.MQTTAddr, "tcp://")

	t.Run("connections over the unauthenticated cap", func(t *testing.T) {
		opened := time.Now()
		conns := openConns(t, mqttAddr, 300, nil)
		require.Equal(t, 300-64, gatewaytest.ClosedWithin(t, conns[:300-64], opened.Add(2500*time.Millisecond), 10*time.Second),
			"the oldest are shed as newer ones arrive")
		require.Zero(t, gatewaytest.ClosedWithin(t, conns[300-64:], opened.Add(2500*time.Millisecond), 10*time.Second),
			"the 64 newest are kept until the connect timeout (3s)")
		// The cap per address is the total cap here: both shed reasons
		// are possible, the address cap first.
		require.Equal(t, 300.0-64, refusedCount(t, h, "shed_address_cap")+refusedCount(t, h, "shed_total_cap"))
		require.Equal(t, 64.0, refusedCount(t, h, "connect_timeout"))
		requireServes(t, h)
	})

	t.Run("authenticated clients over mqtt.max_clients", func(t *testing.T) {
		var ok, busy int
		for i := range 10 {
			c := dialMQTT(t, h)
			id := fmt.Sprintf("%s-%d", hostileHW, i)
			_, err := c.Write(gatewaytest.ConnectPacket(4, id, hostileHW, gatewaytest.GoodKey))
			require.NoError(t, err)
			first, body, err := gatewaytest.ReadPacket(c, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, byte(0x20), first)
			switch body[1] {
			case 0:
				ok++
			case 3: // server unavailable
				busy++
				requireClosed(t, c, 5*time.Second)
			default:
				t.Fatalf("CONNACK % x", body)
			}
		}
		require.Equal(t, 3, ok, "mqtt.max_clients is 3")
		require.Equal(t, 7, busy)
		require.Equal(t, 7.0, refusedCount(t, h, "max_clients"))
		// A takeover on a full broker keeps its client ID's slot.
		c := dialMQTT(t, h)
		_, err := c.Write(gatewaytest.ConnectPacket(5, hostileHW+"-0", hostileHW, gatewaytest.GoodKey))
		require.NoError(t, err)
		first, body, err := gatewaytest.ReadPacket(c, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, []byte{0x20, 0}, []byte{first, body[1]}, "CONNACK success")
		_, err = gatewaytest.ConnectDevice(t, h, "AA:BB:CC:DD:EE:68", gatewaytest.GoodKey)
		require.ErrorContains(t, err, "server Unavailable", "a fourth device waits for a free slot")
	})
}

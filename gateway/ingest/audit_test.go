package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/audit"
)

const hwA = "AA:BB:CC:DD:EE:01"

func TestAuditRecordsMQTTRefusals(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	payload := gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 0, 2)
	publish := func(p []byte) contract.Ack {
		require.True(t, d.Publish(p).WaitTimeout(20*time.Second))
		return d.NextAck(t)
	}
	require.Equal(t, contract.StatusAccepted, publish(payload).Status)
	code, out := gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, "")
	require.Equal(t, http.StatusOK, code)
	require.Zero(t, out.Count, "a stored batch is not audited")

	require.Equal(t, contract.StatusDuplicate, publish(payload).Status)
	recs := gatewaytest.AuditOf(t, h, hwA, audit.ReasonDuplicate)
	require.Len(t, recs, 1)
	id := recs[0].BatchID
	require.True(t, strings.HasPrefix(id, hwA+"_"), id)
	require.Equal(t, contract.TransportMQTT, recs[0].Transport)
	require.Equal(t, "readings", recs[0].Kind)
	require.True(t, strings.HasPrefix(recs[0].RemoteAddr, "127.0.0.1:"), recs[0].RemoteAddr)
	require.WithinDuration(t, time.Now(), recs[0].Time, time.Hour)

	conflict := []byte(strings.Replace(string(payload), "45.2", "45.3", 1))
	require.Equal(t, contract.ReasonConflict, *publish(conflict).Reason)
	recs = gatewaytest.AuditOf(t, h, hwA, audit.ReasonConflict)
	require.Len(t, recs, 1)
	require.Equal(t, id, recs[0].BatchID)
	require.Contains(t, recs[0].Message, "different payload")

	invalid := []byte(strings.Replace(string(gatewaytest.BatchJSON(hwA, gatewaytest.NewBoot(), 1, 2)), "45.2", `"high"`, 1))
	require.Equal(t, contract.ReasonValidation, *publish(invalid).Reason)
	recs = gatewaytest.AuditOf(t, h, hwA, audit.ReasonValidation)
	require.Len(t, recs, 1)
	require.Equal(t, "readings[0].sensors.humidity_pct", recs[0].Field)
	require.NotEmpty(t, recs[0].BatchID)
	require.NotEmpty(t, recs[0].Message)

	// A publish on another device's topic: ACL denial, then disconnection.
	other := "AA:BB:CC:DD:EE:02"
	d.Client.Publish(contract.ReadingsTopic(other), 1, false, gatewaytest.BatchJSON(other, gatewaytest.NewBoot(), 0, 1)).WaitTimeout(5 * time.Second)
	require.Eventually(t, func() bool { return !d.Client.IsConnectionOpen() }, 20*time.Second, 50*time.Millisecond)
	recs = gatewaytest.AuditOf(t, h, hwA, audit.ReasonACLDenied)
	require.Len(t, recs, 1)
	require.Equal(t, "publish", recs[0].Kind)
	require.Equal(t, contract.ReadingsTopic(other), recs[0].Topic)
	require.Empty(t, gatewaytest.AuditOf(t, h, other, audit.ReasonACLDenied), "recorded under the sender, not the topic's device")

	// Subscribing to another device's acks.
	d2, err := gatewaytest.ConnectDevice(t, h, "AA:BB:CC:DD:EE:04", gatewaytest.GoodKey)
	require.NoError(t, err)
	sub := d2.Client.Subscribe(contract.AckTopic(hwA), 1, nil)
	require.True(t, sub.WaitTimeout(20*time.Second))
	recs = gatewaytest.AuditOf(t, h, "AA:BB:CC:DD:EE:04", audit.ReasonACLDenied)
	require.Len(t, recs, 1)
	require.Equal(t, "subscribe", recs[0].Kind)
	require.Equal(t, contract.AckTopic(hwA), recs[0].Topic)
}

func TestAuditRecordsMQTTConnectRefusals(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	tests := []struct {
		name          string
		user, key, id string
		reason        string
	}{
		{"bad key", "AA:BB:CC:DD:EE:21", gatewaytest.OtherKey, "AA:BB:CC:DD:EE:21", audit.ReasonUnauthorized},
		{"user name not a hardware_id", "device-1", gatewaytest.GoodKey, "device-1", audit.ReasonBadIdentity},
		{"client ID of another device", "AA:BB:CC:DD:EE:22", gatewaytest.GoodKey, "AA:BB:CC:DD:EE:23", audit.ReasonClientIDRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Protocol 4 alone: paho otherwise retries a refused 3.1.1
			// CONNECT as 3.1, a second attempt with its own record.
			c := paho.NewClient(paho.NewClientOptions().AddBroker(h.MQTTAddr).SetClientID(tt.id).SetProtocolVersion(4).
				SetUsername(tt.user).SetPassword(tt.key).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second))
			tok := c.Connect()
			require.True(t, tok.WaitTimeout(20*time.Second))
			require.Error(t, tok.Error())
			recs := gatewaytest.AuditOf(t, h, tt.user, tt.reason)
			require.Len(t, recs, 1)
			require.Equal(t, "connect", recs[0].Kind)
			require.Equal(t, contract.TransportMQTT, recs[0].Transport)
			require.True(t, strings.HasPrefix(recs[0].RemoteAddr, "127.0.0.1:"))
		})
	}
	gatewaytest.RequireNoKeysOnDisk(t, h)
}

func TestAuditRecordsOversizeMQTTPacket(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	d, err := gatewaytest.ConnectDevice(t, h, hwA, gatewaytest.GoodKey)
	require.NoError(t, err)
	d.Publish(bytes.Repeat([]byte("x"), 300<<10)).WaitTimeout(5 * time.Second) // over the 256 KiB default
	// The broker records it as it disconnects the client, after the
	// connection ends: wait for the record itself.
	var recs []audit.Record
	require.Eventually(t, func() bool {
		recs = gatewaytest.AuditOf(t, h, hwA, audit.ReasonOversize)
		return len(recs) == 1
	}, 20*time.Second, 50*time.Millisecond)
	require.Contains(t, recs[0].Message, "mqtt.max_packet_size")
}

func TestAuditRecordsHTTPRefusals(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	url := h.HTTPURL + "/v1/readings"
	hw := "AA:BB:CC:DD:EE:30"
	payload := gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 2)

	resp, _ := gatewaytest.PostJSON(t, url, gatewaytest.OtherKey, payload)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	recs := gatewaytest.AuditOf(t, h, "", audit.ReasonUnauthorized)
	require.Len(t, recs, 1)
	require.Equal(t, contract.TransportHTTP, recs[0].Transport)
	require.Contains(t, recs[0].Message, "POST /v1/readings")
	require.True(t, strings.HasPrefix(recs[0].RemoteAddr, "127.0.0.1:"))

	resp, _ = gatewaytest.PostJSON(t, url, gatewaytest.GoodKey, payload)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = gatewaytest.PostJSON(t, url, gatewaytest.GoodKey, payload)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	recs = gatewaytest.AuditOf(t, h, hw, audit.ReasonDuplicate)
	require.Len(t, recs, 1)
	require.Equal(t, contract.TransportHTTP, recs[0].Transport)

	// A batch that does not decode still names the device it claims.
	broken := []byte(strings.Replace(string(gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 1, 1)), `"readings":`, `"readings":7,"x":`, 1))
	resp, _ = gatewaytest.PostJSON(t, url, gatewaytest.GoodKey, broken)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	recs = gatewaytest.AuditOf(t, h, hw, audit.ReasonValidation)
	require.Len(t, recs, 1)

	resp, _ = gatewaytest.PostJSON(t, url, gatewaytest.GoodKey, bytes.Repeat([]byte(" "), 65<<10))
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.Len(t, gatewaytest.AuditOf(t, h, "", audit.ReasonOversize), 1)

	resp, _ = gatewaytest.PostJSON(t, url, gatewaytest.GoodKey, []byte("readings please"))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Len(t, gatewaytest.AuditOf(t, h, "", audit.ReasonBadRequest), 1)

	resp, _ = gatewaytest.PostJSON(t, h.HTTPURL+"/v1/register", gatewaytest.GoodKey, []byte(`{"hardware_id":"`+hw+`","boot_id":"nope"}`))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	recs = gatewaytest.AuditOf(t, h, hw, audit.ReasonValidation)
	require.Len(t, recs, 2)
	require.Equal(t, "register", recs[0].Kind)
	require.NotEmpty(t, recs[0].Field)

	code, out := gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, "transport=http")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 6, out.Count, "one record per refusal, nothing for the stored batch")
	gatewaytest.RequireNoKeysOnDisk(t, h)
}

func TestAuditQueryParameters(t *testing.T) {
	h := gatewaytest.Start(t, nil)
	url := h.HTTPURL + "/v1/readings"
	hw := "AA:BB:CC:DD:EE:31"
	start := time.Now().UTC()
	for i := range 5 {
		resp, _ := gatewaytest.PostJSON(t, url, gatewaytest.GoodKey, []byte(fmt.Sprintf(`{"batch_id":"%s_%d","hardware_id":"%s"}`, hw, i, hw)))
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	}

	code, out := gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, "hardware_id="+hw+"&limit=2")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 2, out.Count)
	require.True(t, out.More)
	require.Equal(t, []string{hw + "_4", hw + "_3"}, []string{out.Records[0].BatchID, out.Records[1].BatchID}, "newest first")
	// The next page ends where this one did.
	code, out = gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, "hardware_id="+hw+"&limit=10&until="+out.NextUntil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 3, out.Count)
	require.False(t, out.More)
	require.Equal(t, hw+"_0", out.Records[2].BatchID)

	sinceMS := fmt.Sprint(start.Add(-time.Minute).UnixMilli())
	for _, q := range []string{"since=" + sinceMS, "since=" + start.Add(-time.Minute).Format(time.RFC3339),
		"until=" + time.Now().Add(time.Minute).Format(time.RFC3339Nano) + "&reason=validation_error&transport=http"} {
		code, out = gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, "hardware_id="+hw+"&"+q)
		require.Equal(t, http.StatusOK, code, q)
		require.Equal(t, 5, out.Count, q)
	}
	code, out = gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, "since="+fmt.Sprint(time.Now().Add(time.Hour).UnixMilli()))
	require.Equal(t, http.StatusOK, code)
	require.Zero(t, out.Count)
	require.NotNil(t, out.Records)

	tests := []struct {
		name, query, want string
	}{
		{"limit zero", "limit=0", "limit:"},
		{"limit not a number", "limit=ten", "limit:"},
		{"limit over the max", "limit=1001", "between 1 and 1000"},
		{"since not a time", "since=yesterday", "since:"},
		{"until not a time", "until=2026-13-01", "until:"},
		{"since after until", "since=2000&until=1000", "since: must be before until"},
		{"unknown reason", "reason=angry", "reason:"},
		{"unknown transport", "transport=coap", "transport:"},
		{"unknown parameter", "device=1", "device: unknown parameter"},
		{"parameter twice", "reason=conflict&reason=duplicate", "reason: give it once"},
		{"empty hardware_id", "hardware_id=", "hardware_id:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := gatewaytest.GetAudit(t, h, gatewaytest.AdminToken, tt.query)
			require.Equal(t, http.StatusBadRequest, code)
			require.Contains(t, out.Message, tt.want)
		})
	}

	code, _ = gatewaytest.GetAudit(t, h, "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = gatewaytest.GetAudit(t, h, gatewaytest.GoodKey, "")
	require.Equal(t, http.StatusUnauthorized, code, "a device key is not the admin token")
}

// TestAuditFloodNeverBlocksIngest fills the audit queue while its writer
// is not running: ingest goes on answering, the overflow is counted.
func TestAuditFloodNeverBlocksIngest(t *testing.T) {
	reg := prometheus.NewRegistry()
	log, err := audit.Open(t.TempDir(), audit.Config{QueueRecords: 8}, nil, nil, reg)
	require.NoError(t, err)
	in, err := ingest.New(ingest.Config{}, ingest.Deps{Store: gatewaytest.FailingStore{}, Audit: log, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	payloads := make([][]byte, 200)
	for i := range payloads {
		payloads[i] = []byte(fmt.Sprintf(`{"batch_id":"AA:BB:CC:DD:EE:50_%d","hardware_id":"AA:BB:CC:DD:EE:50"}`, i))
	}
	results, err := in.Readings(context.Background(), ingest.Sender{}, payloads)
	require.NoError(t, err)
	require.Len(t, results, 200)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	dropped := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "gateway_audit_dropped_records_total" {
			for _, m := range mf.GetMetric() {
				dropped += m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, 192.0, dropped)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- log.Run(ctx) }()
	res, err := log.Query(context.Background(), audit.Filter{Limit: 1000})
	require.NoError(t, err)
	require.Len(t, res.Records, 8)
	require.Equal(t, "AA:BB:CC:DD:EE:50_7", res.Records[0].BatchID)
	require.Equal(t, "AA:BB:CC:DD:EE:50", res.Records[0].HardwareID, "claimed in the payload")
	cancel()
	require.NoError(t, <-done)
}

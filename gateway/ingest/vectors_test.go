package ingest_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
)

// vectorsDir holds the test vectors shared with firmware authors.
const vectorsDir = "../../firmware-contract/testdata"

type vector struct {
	File            string  `json:"file"`
	Description     string  `json:"description"`
	Sender          string  `json:"sender"`
	NowMS           int64   `json:"now_ms"`
	Valid           bool    `json:"valid"`
	Reason          *string `json:"reason"`
	Field           *string `json:"field"`
	MessageContains *string `json:"message_contains"`
	NeedsRepair     *bool   `json:"needs_clock_repair"`
}

// fixedClock is a gateway clock stopped at a vector's "now".
type fixedClock time.Time

func (c fixedClock) Now() time.Time  { return time.Time(c) }
func (c fixedClock) Plausible() bool { return true }

// TestEveryVectorThroughTheGateway sends every payload of
// firmware-contract/testdata through a real client to a fresh gateway whose
// clock reads the vector's now_ms: over MQTT on the sender's topic (the ack
// topic carries the answer), or over HTTP when the vector has no sender.
func TestEveryVectorThroughTheGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway per vector")
	}
	raw, err := os.ReadFile(filepath.Join(vectorsDir, "vectors.json"))
	require.NoError(t, err)
	var vectors []vector
	require.NoError(t, json.Unmarshal(raw, &vectors))
	require.GreaterOrEqual(t, len(vectors), 100)
	for _, v := range vectors {
		t.Run(v.File, func(t *testing.T) {
			payload, err := os.ReadFile(filepath.Join(vectorsDir, v.File))
			require.NoError(t, err)
			h := gatewaytest.Start(t, nil, func(o *gatewaytest.Options) { o.Clock = fixedClock(time.UnixMilli(v.NowMS)) })
			register := strings.HasPrefix(v.File, "register/")
			var ack contract.Ack
			if v.Sender != "" {
				d, err := gatewaytest.ConnectDevice(t, h, v.Sender, gatewaytest.GoodKey)
				require.NoError(t, err)
				topic := contract.ReadingsTopic(v.Sender)
				if register {
					topic = contract.RegisterTopic(v.Sender)
				}
				tok := d.Client.Publish(topic, 1, false, payload)
				require.True(t, tok.WaitTimeout(20*time.Second))
				require.NoError(t, tok.Error())
				ack = d.NextAck(t)
			} else {
				ack = postVector(t, h, register, payload)
			}
			if v.Valid {
				want := contract.StatusAccepted
				if register {
					want = contract.StatusRegistered
				}
				require.Equal(t, want, ack.Status, "%s: %v", v.Description, ack.Message)
				return
			}
			require.Equal(t, contract.StatusRejected, ack.Status, v.Description)
			require.Equal(t, *v.Reason, string(*ack.Reason), "%s: %s", v.Description, *ack.Message)
			if v.Field != nil && *v.Field != "" {
				require.Contains(t, *ack.Message, *v.Field)
			}
			if v.MessageContains != nil {
				require.Contains(t, *ack.Message, *v.MessageContains)
			}
			if !register {
				require.Zero(t, h.Buf.Stats().PendingBatches, "a rejected batch is not stored")
			}
		})
	}
}

// postVector sends a payload over HTTP and returns its result as an ack.
func postVector(t *testing.T, h *gatewaytest.Gateway, register bool, payload []byte) contract.Ack {
	t.Helper()
	if !register {
		resp, out := gatewaytest.PostJSON(t, h.HTTPURL+"/v1/readings", gatewaytest.GoodKey, payload)
		require.Len(t, out.Results, 1, "HTTP %d", resp.StatusCode)
		r := out.Results[0]
		return contract.Ack{Type: contract.AckTypeReadings, BatchID: r.BatchID, Status: r.Status, Reason: r.Reason, Message: r.Message}
	}
	req, err := http.NewRequest(http.MethodPost, h.HTTPURL+"/v1/register", strings.NewReader(string(payload)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+gatewaytest.GoodKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var ack contract.Ack
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ack))
	return ack
}

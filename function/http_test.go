package function_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

func TestReadingsRouteUnderTheEmulator(t *testing.T) {
	r := newRig(t, map[string]string{"MAX_BODY_BYTES": "8192"})
	hw := "AA:BB:CC:00:15:01"
	b := batch(hw, base(), 0, 3, 22.5)

	code, resp := r.readings(t, nil, jsonOf(t, b))
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	require.Equal(t, contract.StatusAccepted, resp.Results[0].Status)
	require.Len(t, resp.Results[0].Quality, 3, "one quality score per reading")

	code, resp = r.readings(t, nil, jsonOf(t, b))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, contract.StatusDuplicate, resp.Results[0].Status)

	code, resp = r.readings(t, nil, jsonOf(t, batch(hw, base(), 0, 3, 30)))
	require.Equal(t, http.StatusConflict, code)
	require.Equal(t, contract.ReasonConflict, *resp.Results[0].Reason)

	bad := jsonOf(t, batch(hw, base(), 5, 1, 20))
	bad = strings.Replace(bad, `"humidity_pct"`, `"Humidity"`, 1)
	code, resp = r.readings(t, nil, fmt.Sprintf(`{"batches":[%s,%s]}`, jsonOf(t, batch(hw, base(), 10, 1, 20)), bad))
	require.Equal(t, http.StatusMultiStatus, code)
	require.Equal(t, contract.StatusAccepted, resp.Results[0].Status)
	require.Equal(t, contract.ReasonValidation, *resp.Results[1].Reason)
	require.Contains(t, *resp.Results[1].Message, "readings[0].sensors", "the error names the field")

	code, resp = r.readings(t, nil, bad)
	require.Equal(t, http.StatusBadRequest, code)

	code, _ = r.post(t, "/v1/readings", "", nil, jsonOf(t, b))
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = r.post(t, "/v1/readings", strings.Repeat("ab", 32), nil, jsonOf(t, b))
	require.Equal(t, http.StatusUnauthorized, code, "an unknown key")

	code, _ = r.post(t, "/v1/readings", r.key, nil, strings.Repeat(" ", 8193))
	require.Equal(t, http.StatusRequestEntityTooLarge, code)

	// The writes are the locked schema's items.
	items := r.items(t, hw)
	require.Len(t, items, 4)
	first := items[0]
	require.Equal(t, tablewrite.TSBatch(b.Readings[0].TimestampMS, b.BatchID), str(first, "ts_batch"))
	for _, name := range []string{"hardware_id", "batch_id", "boot_id", "firmware_version"} {
		require.NotEmpty(t, str(first, name), name)
	}
	for _, name := range []string{"timestamp_ms", "expiration_time", tablewrite.AttrQualityScore} {
		require.NotEmpty(t, num(first, name), name)
	}
	m := r.marker(t, b.BatchID)
	require.Equal(t, hw, str(m, "hardware_id"))
	require.NotEmpty(t, str(m, "received_at"))
	require.NotEmpty(t, num(m, "expiration_time"))
	h := b.IdentityHash()
	require.Equal(t, fmt.Sprintf("%x", h[:]), str(m, tablewrite.AttrPayloadHash))
}

func TestRegisterRouteUnderTheEmulator(t *testing.T) {
	r := newRig(t, nil)
	reg := `{"hardware_id":"AA:BB:CC:00:15:02","boot_id":"` + testBoot + `","firmware_version":"1.0.16",
		"friendly_name":"greenhouse-sensor-02","capabilities":{"sensors":["bme280"],"features":{"tft_display":true}}}`
	code, body := r.post(t, "/v1/register", r.key, nil, reg)
	require.Equal(t, http.StatusCreated, code, body)
	var ack contract.Ack
	require.NoError(t, json.Unmarshal([]byte(body), &ack))
	require.Equal(t, contract.StatusRegistered, ack.Status)
	require.NoError(t, contract.ValidUUIDv4(ack.ConfirmationID))

	code, body = r.post(t, "/v1/register", r.key, nil, reg)
	require.Equal(t, http.StatusOK, code, body)
	var again contract.Ack
	require.NoError(t, json.Unmarshal([]byte(body), &again))
	require.Equal(t, ack.ConfirmationID, again.ConfirmationID, "the confirmation_id is stable")

	code, body = r.post(t, "/v1/register", r.key, nil, strings.Replace(reg, "AA:BB:CC:00:15:02", "aa:bb:cc:00:15:02", 1))
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "hardware_id")

	code, _ = r.post(t, "/v1/register", "", nil, reg)
	require.Equal(t, http.StatusUnauthorized, code)

	// A device key acts for its own device only.
	bound, _, err := cloud.NewKeys(r.db, r.tables.APIKeys, testPepper).CreateBound(context.Background(), "device key", "AA:BB:CC:00:15:09")
	require.NoError(t, err)
	code, body = r.post(t, "/v1/register", bound, nil, reg)
	require.Equal(t, http.StatusForbidden, code, body)
	code, body = r.post(t, "/v1/readings", bound, nil, jsonOf(t, batch("AA:BB:CC:00:15:02", base(), 0, 1, 20)))
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, `"forbidden"`)
	code, body = r.post(t, "/v1/readings", bound, nil, jsonOf(t, batch("AA:BB:CC:00:15:09", base(), 0, 1, 20)))
	require.Equal(t, http.StatusOK, code, body)
}

func TestIdempotencyKeyReplaysTheAnswer(t *testing.T) {
	r := newRig(t, nil)
	hw := "AA:BB:CC:00:15:03"
	body := jsonOf(t, batch(hw, base(), 0, 2, 21))
	key := map[string]string{"Idempotency-Key": "req-42"}
	code, first := r.readings(t, key, body)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, contract.StatusAccepted, first.Results[0].Status)

	code, replay := r.readings(t, key, body)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, first, replay, "a replayed request gets the same answer, not duplicate")

	code, _ = r.readings(t, key, jsonOf(t, batch(hw, base(), 5, 2, 21)))
	require.Equal(t, http.StatusConflict, code, "the key with another body")

	// Without the key, the same body is a duplicate.
	_, plain := r.readings(t, nil, body)
	require.Equal(t, contract.StatusDuplicate, plain.Results[0].Status)

	// The body's request_id works the same.
	withID := fmt.Sprintf(`{"request_id":"r-7","batches":[%s]}`, jsonOf(t, batch(hw, base(), 10, 1, 21)))
	_, a := r.readings(t, nil, withID)
	_, b := r.readings(t, nil, withID)
	require.Equal(t, contract.StatusAccepted, a.Results[0].Status)
	require.Equal(t, a, b)
}

func TestTimestampConflictPastTheGrace(t *testing.T) {
	r := newRig(t, map[string]string{"ORDERING": "reject_older", "ORDERING_GRACE": "5m"})
	hw := "AA:BB:CC:00:15:04"
	code, _ := r.readings(t, nil, jsonOf(t, batch(hw, base(), 30, 2, 21)))
	require.Equal(t, http.StatusOK, code)
	code, resp := r.readings(t, nil, jsonOf(t, batch(hw, base(), 27, 1, 21)))
	require.Equal(t, http.StatusOK, code, "within the grace: accepted")
	code, resp = r.readings(t, nil, jsonOf(t, batch(hw, base(), 0, 2, 21)))
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, contract.ReasonTimestampConflict, *resp.Results[0].Reason)
	require.Contains(t, *resp.Results[0].Message, "readings")
}

package contract

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAckExamples checks that the ack examples given to firmware authors are
// exactly what Ack marshals to.
func TestAckExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(vectorsDir, "ack", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			require.NoError(t, err)
			var a Ack
			dec := json.NewDecoder(strings.NewReader(string(data)))
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&a))
			require.Equal(t, string(data), string(mustMarshal(t, a)))
			require.Equal(t, string(data), string(EncodeAck(a)), "the MQTT encoder writes the same bytes")

			// The constructors give the same ack.
			var rebuilt Ack
			switch {
			case a.Type == AckTypeRegister && a.Status == StatusRegistered:
				rebuilt = RegisterAck(a.ConfirmationID, nil)
				if a.DeviceKey != "" || a.DeviceKeyID != "" {
					// The enrolling answer: both fields, in their form.
					require.Regexp(t, `^[0-9a-f]{64}$`, a.DeviceKey)
					require.NoError(t, ValidUUIDv4(a.DeviceKeyID))
					require.Equal(t, strings.ToLower(a.DeviceKeyID), a.DeviceKeyID)
					rebuilt.DeviceKey, rebuilt.DeviceKeyID = a.DeviceKey, a.DeviceKeyID
				}
			case a.Type == AckTypeRegister:
				rebuilt = RegisterAck("", &Error{Reason: *a.Reason, Rule: *a.Message})
			case a.Status == StatusRejected:
				rebuilt = ReadingsAck(a.BatchID, "", &Error{Reason: *a.Reason, Rule: *a.Message})
			default:
				rebuilt = ReadingsAck(a.BatchID, a.Status, nil)
			}
			require.Equal(t, a, rebuilt)
		})
	}
}

// TestResponseExamples checks the POST /v1/readings examples: exact bytes,
// and the HTTP status in the file name for those decided by the results.
func TestResponseExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(vectorsDir, "responses", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			require.NoError(t, err)
			var r ReadingsResponse
			dec := json.NewDecoder(strings.NewReader(string(data)))
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&r))
			require.Equal(t, string(data), string(mustMarshal(t, r)))
			code, err := strconv.Atoi(strings.SplitN(filepath.Base(file), "_", 2)[0])
			require.NoError(t, err)
			if r.Message != "" {
				require.Equal(t, RequestErrorResponse(r.Message), r)
				return
			}
			rebuilt := NewReadingsResponse(r.Results)
			require.Equal(t, r, rebuilt)
			require.Equal(t, code, rebuilt.HTTPStatus())
		})
	}
}

// TestAckExampleMessages checks that the decoder's messages quoted in the
// examples are the real ones.
func TestAckExampleMessages(t *testing.T) {
	tests := []struct{ example, vector string }{
		{"ack/readings_rejected_clock_not_synced.json", "readings/reject_clock_not_synced.json"},
		{"ack/register_rejected.json", "register/reject_hardware_id_lower_case.json"},
	}
	for _, tt := range tests {
		data, err := os.ReadFile(filepath.Join(vectorsDir, tt.example))
		require.NoError(t, err)
		var a Ack
		require.NoError(t, json.Unmarshal(data, &a))
		payload, err := os.ReadFile(filepath.Join(vectorsDir, tt.vector))
		require.NoError(t, err)
		if a.Type == AckTypeRegister {
			_, err = DecodeRegistration(payload, testHW)
		} else {
			_, err = DecodeBatch(payload, testHW, DefaultLimits(), testNow)
		}
		require.Error(t, err)
		require.Equal(t, *a.Message, err.Error(), tt.example)
	}
}

package function_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function"
	"greenhouse-gateway/function/event"
)

// TestCompressedEventsUnderTheEmulator invokes the function with the same
// batches as zstd and gzip events: each is stored once, and a resend in
// the other encoding (or plain) is a duplicate.
func TestCompressedEventsUnderTheEmulator(t *testing.T) {
	r := newRig(t, nil)
	hw := "AA:BB:CC:00:16:01"
	batches := map[string]*contract.Batch{"c-1": batch(hw, base(), 0, 10, 21), "c-2": batch(hw, base(), 10, 10, 22)}
	ev := nativeEvent(t, batches, []string{"c-1", "c-2"})
	for i, enc := range []string{event.EncodingZstd, event.EncodingGzip, event.EncodingNone} {
		raw, err := event.Marshal(&ev, enc)
		require.NoError(t, err)
		var resp function.BatchResponse
		r.invoke(t, json.RawMessage(raw), &resp)
		want := function.StatusDuplicate
		if i == 0 {
			want = function.StatusDelivered
		}
		got := byID(resp.Results)
		require.Len(t, resp.Results, 2, enc)
		for _, id := range []string{"c-1", "c-2"} {
			require.Equal(t, want, got[id].Status, "%s %s: %+v", enc, id, got[id])
		}
		require.Len(t, r.items(t, hw), 20, "%s: nothing written twice", enc)
	}
	require.Contains(t, r.em.Output(), `"encoding":"zstd"`, "the invocation's log line names its encoding")
}

// TestUnreadableCompressedEventFailsTheInvocation: an event whose data
// does not decode is a function error (the gateway retries it), never a
// batch's rejection. The emulator answers a function error without
// X-Amz-Function-Error, as its errorType and errorMessage.
func TestUnreadableCompressedEventFailsTheInvocation(t *testing.T) {
	r := newRig(t, nil)
	out, err := r.em.Invoke(t.Context(), []byte(`{"v":1,"kind":"gateway_batches","encoding":"zstd","data":"AAAAAAAA"}`))
	if err == nil {
		var answer struct {
			ErrorType    string `json:"errorType"`
			ErrorMessage string `json:"errorMessage"`
			Results      []function.ItemResult
		}
		require.NoError(t, json.Unmarshal(out, &answer), "%s", out)
		require.Empty(t, answer.Results)
		require.NotEmpty(t, answer.ErrorType, "%s", out)
		err = errors.New(answer.ErrorMessage)
	}
	require.ErrorContains(t, err, "data: not zstd")
}

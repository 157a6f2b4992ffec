package function_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

// requireFirstPayload asserts that every reading of hw in the table holds
// temp, the first payload's value.
func requireFirstPayload(t *testing.T, r *rig, hw, temp string) {
	t.Helper()
	items := r.items(t, hw)
	require.NotEmpty(t, items)
	for _, item := range items {
		got := item["sensors"].(*types.AttributeValueMemberM).Value["bme280_temp_c"]
		require.Equal(t, &types.AttributeValueMemberN{Value: temp}, got, "the cloud keeps the first payload")
	}
}

func TestABatchIDRepeatedInOneRequestIsWrittenOnce(t *testing.T) {
	r := newRig(t, nil)
	x, y := "AA:BB:CC:00:19:01", "AA:BB:CC:00:19:02"
	a := batch(x, base(), 0, 3, 22.5)
	other := batch(x, base(), 0, 3, 30) // the same batch_id, another payload
	require.Equal(t, a.BatchID, other.BatchID)
	body := fmt.Sprintf(`{"batches":[%s,%s,%s,%s,%s]}`, jsonOf(t, a), jsonOf(t, batch(y, base(), 0, 2, 20)),
		jsonOf(t, other), jsonOf(t, batch(y, base(), 5, 2, 20)), jsonOf(t, a))
	_, resp := r.readings(t, nil, body)
	require.Len(t, resp.Results, 5)
	require.Equal(t, contract.StatusAccepted, resp.Results[0].Status)
	require.Equal(t, contract.StatusRejected, resp.Results[2].Status, "another payload under the batch_id: a conflict")
	require.Equal(t, contract.ReasonConflict, *resp.Results[2].Reason)
	require.Equal(t, contract.StatusDuplicate, resp.Results[4].Status, "the same payload again")
	requireFirstPayload(t, r, x, "22.5")
}

// The two payloads 100 batches apart: in different marker lookups.
func TestABatchIDRepeatedFarApartInOneRequestKeepsTheFirstPayload(t *testing.T) {
	r := newRig(t, nil)
	x := "AA:BB:CC:00:19:11"
	a := batch(x, base(), 0, 3, 22.5)
	other := batch(x, base(), 0, 3, 30)
	parts := []string{jsonOf(t, a), jsonOf(t, batch("AA:BB:CC:00:1A:00", base(), 0, 1, 20))}
	for i := 1; i <= 97; i++ {
		parts = append(parts, jsonOf(t, batch(fmt.Sprintf("AA:BB:CC:00:1A:%02X", i), base(), 0, 1, 20)))
	}
	parts = append(parts, jsonOf(t, batch("AA:BB:CC:00:1A:00", base(), 5, 1, 20)), jsonOf(t, other))
	_, resp := r.readings(t, nil, `{"batches":[`+strings.Join(parts, ",")+`]}`)
	require.Len(t, resp.Results, 101)
	require.Equal(t, contract.StatusAccepted, resp.Results[0].Status)
	require.Equal(t, contract.StatusRejected, resp.Results[100].Status)
	require.Equal(t, contract.ReasonConflict, *resp.Results[100].Reason)
	requireFirstPayload(t, r, x, "22.5")
}

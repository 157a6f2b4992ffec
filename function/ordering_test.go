package function_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function"
)

// Under reject_older, a retry of a batch whose readings were written but
// not its marker (a timeout between the two) is stored, not refused
// against its own readings: over HTTP and in a gateway's event.
func TestRejectOlderRetryOfAPartlyWrittenBatchIsStored(t *testing.T) {
	r := newRig(t, map[string]string{"ORDERING": "reject_older", "ORDERING_GRACE": "1s"})
	dropMarker := func(b *contract.Batch) {
		t.Helper()
		_, err := r.db.DeleteItem(context.Background(), &dynamodb.DeleteItemInput{TableName: aws.String(r.tables.ProcessedBatches),
			Key: map[string]types.AttributeValue{"batch_id": &types.AttributeValueMemberS{Value: b.BatchID}}})
		require.NoError(t, err)
		require.Nil(t, r.marker(t, b.BatchID))
	}

	hw := "AA:BB:CC:00:15:41"
	b := batch(hw, base(), 0, 10, 21) // 9 s from its first reading to its last: more than the grace
	code, resp := r.readings(t, nil, jsonOf(t, b))
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	dropMarker(b)
	code, resp = r.readings(t, nil, jsonOf(t, b))
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	require.Equal(t, contract.StatusAccepted, resp.Results[0].Status)
	require.NotNil(t, r.marker(t, b.BatchID))
	require.Len(t, r.items(t, hw), 10)

	dropMarker(b)
	var out function.BatchResponse
	r.invoke(t, nativeEvent(t, map[string]*contract.Batch{"c-1": b}, []string{"c-1"}), &out)
	require.Equal(t, function.StatusDelivered, out.Results[0].Status, "%+v", out.Results[0])
	require.NotNil(t, r.marker(t, b.BatchID))

	// The rule still holds for a batch that is not in the table.
	code, resp = r.readings(t, nil, jsonOf(t, batch(hw, base(), -5, 2, 21)))
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, contract.ReasonTimestampConflict, *resp.Results[0].Reason)
}

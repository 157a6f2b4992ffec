package ingest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	contract "greenhouse-gateway/firmware-contract"
)

func TestALimitedBatchIsBufferFullAndA429(t *testing.T) {
	limited := outcomeResult("b1", buffer.Limited)
	require.Equal(t, contract.ReasonBufferFull, *limited.Reason, "firmware keeps it and resends later")
	full := outcomeResult("b2", buffer.Full)
	invalid := rejected("b3", contract.NewError(contract.ReasonValidation, "", "bad"))
	for _, tc := range []struct {
		name    string
		results []contract.Result
		want    bool
		code    int
	}{
		{"limited alone", []contract.Result{limited}, true, http.StatusInsufficientStorage},
		{"limited and invalid", []contract.Result{invalid, limited}, true, http.StatusInsufficientStorage},
		{"limited and full", []contract.Result{limited, full}, false, http.StatusInsufficientStorage},
		{"full", []contract.Result{full}, false, http.StatusInsufficientStorage},
		{"invalid", []contract.Result{invalid}, false, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, OnlyLimited(tc.results))
			require.Equal(t, tc.code, contract.NewReadingsResponse(tc.results).HTTPStatus())
		})
	}
}

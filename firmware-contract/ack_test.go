package contract

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAckJSON(t *testing.T) {
	rejectErr := &Error{Reason: ReasonValidation, Field: "readings[0].sensors.x", Rule: "must be a finite number"}
	tests := []struct {
		name string
		ack  Ack
		want string
	}{
		{"readings accepted", ReadingsAck("b1", StatusAccepted, nil),
			`{"type":"readings","batch_id":"b1","status":"accepted","reason":null,"message":null}`},
		{"readings duplicate", ReadingsAck("b1", StatusDuplicate, nil),
			`{"type":"readings","batch_id":"b1","status":"duplicate","reason":null,"message":null}`},
		{"readings rejected", ReadingsAck("b1", StatusAccepted, rejectErr),
			`{"type":"readings","batch_id":"b1","status":"rejected","reason":"validation_error","message":"readings[0].sensors.x: must be a finite number"}`},
		{"readings rejected, batch_id from the error", ReadingsAck("", "", &Error{Reason: ReasonClockNotSynced, Rule: "r", BatchID: "b2"}),
			`{"type":"readings","batch_id":"b2","status":"rejected","reason":"clock_not_synced","message":"r"}`},
		{"readings rejected, no batch_id", ReadingsAck("", "", errors.New("boom")),
			`{"type":"readings","batch_id":"","status":"rejected","reason":"validation_error","message":"boom"}`},
		{"readings buffer full", ReadingsAck("b1", "", NewError(ReasonBufferFull, "", "buffer full; retry later")),
			`{"type":"readings","batch_id":"b1","status":"rejected","reason":"buffer_full","message":"buffer full; retry later"}`},
		{"register, as in the contract", RegisterAck("550e8400-e29b-41d4-a716-446655440000", nil),
			`{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000"}`},
		{"register rejected", RegisterAck("", &Error{Reason: ReasonValidation, Field: "hardware_id", Rule: "must be upper case"}),
			`{"type":"register","status":"rejected","reason":"validation_error","message":"hardware_id: must be upper case"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.ack)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(got))
			var back Ack
			require.NoError(t, json.Unmarshal(got, &back))
			require.Equal(t, tt.ack, back)
		})
	}
}

func TestReadingsResponse(t *testing.T) {
	acc := NewResult("a", StatusAccepted, nil)
	dup := NewResult("d", StatusDuplicate, nil)
	inv := NewResult("i", "", NewError(ReasonValidation, "x", "bad"))
	clk := NewResult("c", "", NewError(ReasonClockNotSynced, "x", "unsynced"))
	con := NewResult("k", "", NewError(ReasonConflict, "", "batch_id reused"))
	full := NewResult("f", "", NewError(ReasonBufferFull, "", "full"))
	forb := NewResult("o", "", NewError(ReasonForbidden, "hardware_id", "bound elsewhere"))
	dkr := NewResult("r", "", NewError(ReasonDeviceKeyRequired, "hardware_id", "device key required"))
	tests := []struct {
		name    string
		results []Result
		status  string
		code    int
		summary Summary
	}{
		{"all accepted", []Result{acc, dup}, ResponseOK, http.StatusOK, Summary{2, 1, 1, 0}},
		{"mixed", []Result{acc, inv}, ResponsePartial, http.StatusMultiStatus, Summary{2, 1, 0, 1}},
		{"mixed with buffer full", []Result{dup, full}, ResponsePartial, http.StatusMultiStatus, Summary{2, 0, 1, 1}},
		{"all invalid", []Result{inv, clk}, ResponseError, http.StatusBadRequest, Summary{2, 0, 0, 2}},
		{"single conflict", []Result{con}, ResponseError, http.StatusConflict, Summary{1, 0, 0, 1}},
		{"conflict and invalid", []Result{con, inv}, ResponseError, http.StatusBadRequest, Summary{2, 0, 0, 2}},
		{"buffer full", []Result{full}, ResponseError, http.StatusInsufficientStorage, Summary{1, 0, 0, 1}},
		{"buffer full and invalid", []Result{inv, full}, ResponseError, http.StatusInsufficientStorage, Summary{2, 0, 0, 2}},
		{"forbidden", []Result{forb}, ResponseError, http.StatusForbidden, Summary{1, 0, 0, 1}},
		{"device key required and invalid", []Result{inv, dkr}, ResponseError, http.StatusForbidden, Summary{2, 0, 0, 2}},
		{"forbidden and stored", []Result{acc, forb}, ResponsePartial, http.StatusMultiStatus, Summary{2, 1, 0, 1}},
		{"forbidden and buffer full", []Result{forb, full}, ResponseError, http.StatusInsufficientStorage, Summary{2, 0, 0, 2}},
		{"nothing", nil, ResponseError, http.StatusBadRequest, Summary{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := NewReadingsResponse(tt.results)
			require.Equal(t, tt.status, resp.Status)
			require.Equal(t, tt.code, resp.HTTPStatus())
			require.Equal(t, tt.summary, resp.Summary)
		})
	}

	got, err := json.Marshal(NewReadingsResponse([]Result{acc, inv}))
	require.NoError(t, err)
	require.JSONEq(t, `{"status":"partial","summary":{"received":2,"accepted":1,"duplicates":0,"rejected":1},
		"results":[{"batch_id":"a","status":"accepted","reason":null,"message":null},
		           {"batch_id":"i","status":"rejected","reason":"validation_error","message":"x: bad"}]}`, string(got))
	got, err = json.Marshal(ReadingsResponse{Status: ResponseError})
	require.NoError(t, err)
	require.Equal(t, `{"status":"error","summary":{"received":0,"accepted":0,"duplicates":0,"rejected":0},"results":[]}`, string(got))
	got, err = json.Marshal(RequestErrorResponse("body over 1048576 bytes"))
	require.NoError(t, err)
	require.Equal(t, `{"status":"error","summary":{"received":0,"accepted":0,"duplicates":0,"rejected":0},"results":[],"message":"body over 1048576 bytes"}`, string(got))
}

func TestSplitBatches(t *testing.T) {
	one := batchJSON()
	tests := []struct {
		name     string
		body     string
		want     []string
		field    string
		contains string
	}{
		{name: "one batch", body: " \n" + one + "\n", want: []string{one}},
		{name: "batches", body: `{"batches":[` + one + `, ` + one + `]}`, want: []string{one, one}},
		{name: "batches with whitespace", body: "{ \"batches\" : [\n" + one + "\n] }", want: []string{one}},
		{name: "elements of any type", body: `{"batches":[1,"x",null,{}]}`, want: []string{"1", `"x"`, "null", "{}"}},
		{name: "escaped batches key", body: `{"b\u0061tches":[{}]}`, want: []string{"{}"}},
		{name: "batches beside other keys is a batch", body: `{"batches":[],"batch_id":"x"}`, want: []string{`{"batches":[],"batch_id":"x"}`}},
		{name: "empty object is a batch", body: `{}`, want: []string{`{}`}},
		{name: "empty batches", body: `{"batches":[]}`, field: "batches", contains: "must contain at least 1 batch"},
		{name: "batches not an array", body: `{"batches":{}}`, field: "batches", contains: "must be an array of batch objects, not an object"},
		{name: "array body", body: `[` + one + `]`, contains: `must be a batch object or {"batches":[...]}, not an array`},
		{name: "invalid JSON", body: `{"batches":[{]}`, contains: "invalid JSON at byte offset 13"},
		{name: "empty body", body: ``, contains: "empty payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raws, err := SplitBatches([]byte(tt.body))
			if tt.contains != "" {
				require.Nil(t, raws)
				var e *Error
				require.ErrorAs(t, err, &e)
				require.Equal(t, tt.field, e.Field)
				require.Contains(t, e.Error(), tt.contains)
				return
			}
			require.NoError(t, err)
			var got []string
			for _, r := range raws {
				got = append(got, string(r))
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestSplitBatchesAppendDoesNotClobber(t *testing.T) {
	body := []byte(`{"batches":[{"a":1},{"b":2}]}`)
	raws, err := SplitBatches(body)
	require.NoError(t, err)
	_ = append(raws[0], 'X')
	require.Equal(t, `{"b":2}`, string(raws[1]))
	require.Equal(t, `{"batches":[{"a":1},{"b":2}]}`, string(body))
}

package contract

import (
	"encoding/json"
	"net/http"
)

// Status is the outcome of one message: the "status" of an ack or of a
// POST /v1/readings result.
type Status string

// Statuses, as in the contract.
const (
	// StatusAccepted: the batch is durably stored; firmware drops it.
	StatusAccepted Status = "accepted"
	// StatusDuplicate: the same batch (same batch_id, same content) was
	// already stored; firmware drops it.
	StatusDuplicate Status = "duplicate"
	// StatusRejected: see the Reason.
	StatusRejected Status = "rejected"
	// StatusRegistered: the registration is stored.
	StatusRegistered Status = "registered"
)

// Ack types: the "type" of an ack, which says what it answers.
const (
	AckTypeReadings = "readings"
	AckTypeRegister = "register"
)

// Ack is the payload the gateway publishes on devices/{hardware_id}/ack, one
// per register or readings message received.
//
// A readings ack always has the batch_id, reason and message keys, reason and
// message being null unless the batch was rejected:
//
//	{"type":"readings","batch_id":"...","status":"accepted","reason":null,"message":null}
//
// A register ack has confirmation_id when registered, and reason and message
// only when rejected:
//
//	{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000"}
//
// The register ack that enrolls a device also carries its device key, once:
//
//	{"type":"register","status":"registered","confirmation_id":"...","device_key":"<64 hex>","device_key_id":"<uuid>"}
type Ack struct {
	// Type is AckTypeReadings or AckTypeRegister.
	Type string `json:"type"`
	// BatchID is the batch_id of the batch this ack answers (readings
	// only); empty when the payload had none.
	BatchID string `json:"batch_id,omitempty"`
	// Status is the outcome.
	Status Status `json:"status"`
	// Reason is set when Status is StatusRejected, nil otherwise.
	Reason *Reason `json:"reason"`
	// Message says what is wrong in words when Status is StatusRejected,
	// nil otherwise.
	Message *string `json:"message"`
	// ConfirmationID is the device's UUID v4 confirmation_id (register
	// only, when registered).
	ConfirmationID string `json:"confirmation_id,omitempty"`
	// DeviceKey is the device's own API key, bound to its hardware_id, and
	// DeviceKeyID its key_id: in the register ack that enrolls the device
	// (its first registration with a fleet key), once; omitted otherwise.
	DeviceKey   string `json:"device_key,omitempty"`
	DeviceKeyID string `json:"device_key_id,omitempty"`
}

// MarshalJSON writes the ack in the shape of its type (see [Ack]).
func (a Ack) MarshalJSON() ([]byte, error) {
	if a.Type == AckTypeRegister {
		return json.Marshal(struct {
			Type           string  `json:"type"`
			Status         Status  `json:"status"`
			Reason         *Reason `json:"reason,omitempty"`
			Message        *string `json:"message,omitempty"`
			ConfirmationID string  `json:"confirmation_id,omitempty"`
			DeviceKey      string  `json:"device_key,omitempty"`
			DeviceKeyID    string  `json:"device_key_id,omitempty"`
		}{a.Type, a.Status, a.Reason, a.Message, a.ConfirmationID, a.DeviceKey, a.DeviceKeyID})
	}
	return json.Marshal(struct {
		Type    string  `json:"type"`
		BatchID string  `json:"batch_id"`
		Status  Status  `json:"status"`
		Reason  *Reason `json:"reason"`
		Message *string `json:"message"`
	}{a.Type, a.BatchID, a.Status, a.Reason, a.Message})
}

// ReadingsAck returns the ack for a readings message: accepted or duplicate
// when err is nil, rejected with err's reason and text otherwise. A non-nil
// err that is not an *Error counts as a validation_error.
func ReadingsAck(batchID string, status Status, err error) Ack {
	r := NewResult(batchID, status, err)
	return Ack{Type: AckTypeReadings, BatchID: r.BatchID, Status: r.Status, Reason: r.Reason, Message: r.Message}
}

// RegisterAck returns the ack for a registration: registered with the
// confirmation ID when err is nil, rejected otherwise.
func RegisterAck(confirmationID string, err error) Ack {
	if err != nil {
		e := AsError(err)
		reason, msg := e.Reason, e.Error()
		return Ack{Type: AckTypeRegister, Status: StatusRejected, Reason: &reason, Message: &msg}
	}
	return Ack{Type: AckTypeRegister, Status: StatusRegistered, ConfirmationID: confirmationID}
}

// Result is the outcome of one batch of a POST /v1/readings request.
type Result struct {
	BatchID string  `json:"batch_id"`
	Status  Status  `json:"status"`
	Reason  *Reason `json:"reason"`
	Message *string `json:"message"`
	// Quality holds the quality score of each reading, in reading order,
	// when the cloud readings function stored the batch; omitted
	// otherwise (and always by the gateway).
	Quality []float64 `json:"quality,omitempty"`
}

// NewResult returns the result for a batch: status (accepted or duplicate)
// when err is nil, rejected with err's reason and text otherwise.
func NewResult(batchID string, status Status, err error) Result {
	if err != nil {
		e := AsError(err)
		if batchID == "" {
			batchID = e.BatchID
		}
		reason, msg := e.Reason, e.Error()
		return Result{BatchID: batchID, Status: StatusRejected, Reason: &reason, Message: &msg}
	}
	return Result{BatchID: batchID, Status: status}
}

// Summary counts the results of a POST /v1/readings request.
type Summary struct {
	Received   int `json:"received"`
	Accepted   int `json:"accepted"`
	Duplicates int `json:"duplicates"`
	Rejected   int `json:"rejected"`
}

// Response statuses of POST /v1/readings.
const (
	ResponseOK      = "ok"      // every batch accepted or duplicate
	ResponsePartial = "partial" // some stored, some rejected
	ResponseError   = "error"   // nothing stored
)

// ReadingsResponse is the body of every POST /v1/readings answer.
type ReadingsResponse struct {
	// Status is ResponseOK, ResponsePartial or ResponseError.
	Status string `json:"status"`
	// Summary counts Results.
	Summary Summary `json:"summary"`
	// Results holds one result per batch, in request order; empty (never
	// null) when the request could not be split into batches.
	Results []Result `json:"results"`
	// Message says what is wrong with the request as a whole (unreadable
	// body, bad key, body too large, rate limited, shutting down); omitted
	// when Results tell the story.
	Message string `json:"message,omitempty"`
}

// MarshalJSON writes Results as [] when it is nil.
func (r ReadingsResponse) MarshalJSON() ([]byte, error) {
	type plain ReadingsResponse
	if r.Results == nil {
		r.Results = []Result{}
	}
	return json.Marshal(plain(r))
}

// NewReadingsResponse summarises per-batch results, given in request order.
func NewReadingsResponse(results []Result) ReadingsResponse {
	resp := ReadingsResponse{Results: results}
	resp.Summary.Received = len(results)
	for _, r := range results {
		switch r.Status {
		case StatusAccepted:
			resp.Summary.Accepted++
		case StatusDuplicate:
			resp.Summary.Duplicates++
		default:
			resp.Summary.Rejected++
		}
	}
	switch {
	case len(results) > 0 && resp.Summary.Rejected == 0:
		resp.Status = ResponseOK
	case resp.Summary.Rejected < len(results):
		resp.Status = ResponsePartial
	default:
		resp.Status = ResponseError
	}
	return resp
}

// RequestErrorResponse returns the body of an answer that concerns the
// request as a whole (400 unreadable body, 401, 413, 429, 503).
func RequestErrorResponse(message string) ReadingsResponse {
	return ReadingsResponse{Status: ResponseError, Results: []Result{}, Message: message}
}

// HTTPStatus returns the HTTP status code for the response's results:
//
//   - 200 when every batch was accepted or a duplicate;
//   - 207 when some were stored and some rejected;
//   - when none was stored: 507 if any was rejected with buffer_full (so
//     firmware keeps and resends it; the other results say which batches
//     are invalid), else 403 if any was refused for its identity
//     (forbidden, device_key_required), 409 if all were conflicts, 400
//     otherwise (also for a request with no results).
//
// 401, 413, 429 and 503 concern the request as a whole and are decided by
// the HTTP handler before any batch is looked at.
func (r ReadingsResponse) HTTPStatus() int {
	s := r.Summary
	switch {
	case s.Received > 0 && s.Rejected == 0:
		return http.StatusOK
	case s.Rejected < s.Received:
		return http.StatusMultiStatus
	}
	conflicts, identity := 0, false
	for _, res := range r.Results {
		if res.Reason == nil {
			continue
		}
		switch *res.Reason {
		case ReasonBufferFull:
			return http.StatusInsufficientStorage
		case ReasonConflict:
			conflicts++
		case ReasonForbidden, ReasonDeviceKeyRequired:
			identity = true
		}
	}
	if identity {
		return http.StatusForbidden
	}
	if conflicts > 0 && conflicts == len(r.Results) {
		return http.StatusConflict
	}
	return http.StatusBadRequest
}

// SplitBatches splits a POST /v1/readings body into its batch documents. The
// body is either one batch object, returned whole, or an object whose only
// key is "batches", holding an array of at least one batch. The returned
// documents alias body. Elements of "batches" are returned whatever their
// type, so that [DecodeBatch] rejects each bad one with its own result.
//
// The whole body must be valid JSON; duplicate keys and unknown fields inside
// a batch are left to DecodeBatch. The error is always an *Error.
func SplitBatches(body []byte) ([]json.RawMessage, error) {
	raws, e := splitBatches(body)
	if e != nil {
		return nil, e
	}
	return raws, nil
}

func splitBatches(body []byte) ([]json.RawMessage, *Error) {
	s := string(body) // one copy, to share the string-based scanner
	if _, e := checkSyntax(s); e != nil {
		return nil, e
	}
	i := skipWS(s, 0)
	if s[i] != '{' {
		return nil, validationErr("", `the body must be a batch object or {"batches":[...]}, not `+kindName(s, i))
	}
	key, v, more := nextMember(s, i)
	if !more || key != "batches" {
		return []json.RawMessage{trimWS(body)}, nil
	}
	if _, _, more := nextMember(s, skipValue(s, v)); more {
		return []json.RawMessage{trimWS(body)}, nil // a batch (with an unknown "batches" field)
	}
	if s[v] != '[' {
		return nil, validationErr("batches", "must be an array of batch objects, not "+kindName(s, v))
	}
	var raws []json.RawMessage
	for i := v; ; {
		e, more := nextElem(s, i)
		if !more {
			break
		}
		end := skipValue(s, e)
		raws = append(raws, json.RawMessage(body[e:end:end]))
		i = end
	}
	if len(raws) == 0 {
		return nil, validationErr("batches", "must contain at least 1 batch")
	}
	return raws, nil
}

func trimWS(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isWS(b[i]) {
		i++
	}
	for j > i && isWS(b[j-1]) {
		j--
	}
	return b[i:j:j]
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

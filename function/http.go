package function

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/httpapi"
	"greenhouse-gateway/internal/tablewrite"
)

// Routes are the API Gateway routes the function serves (route keys): the
// device routes, then ReadRoutes.
var Routes = append([]string{"POST /v1/readings", "POST /v1/register"}, ReadRoutes...)

// retryAfterSeconds is the Retry-After of 429 and 503 answers.
const retryAfterSeconds = 2

// answer is an HTTP answer before it is encoded.
type answer struct {
	code int
	body any
	// retryAfter sets Retry-After on an answer that is neither 429 nor 503.
	retryAfter bool
	// unfinished is set when some batch was answered buffer_full (the
	// cloud's trouble): the answer is not a request's final one.
	unfinished bool
}

func jsonAnswer(code int, body any) answer { return answer{code: code, body: body} }

func requestError(code int, msg string) answer {
	return jsonAnswer(code, contract.RequestErrorResponse(msg))
}

// response encodes an answer as API Gateway's payload 2.0 response.
func (a answer) response() (events.APIGatewayV2HTTPResponse, error) {
	body, err := json.Marshal(a.body)
	if err != nil {
		return events.APIGatewayV2HTTPResponse{}, fmt.Errorf("encoding the answer: %w", err)
	}
	h := map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}
	if a.code == http.StatusTooManyRequests || a.code == http.StatusServiceUnavailable || a.retryAfter {
		h["Retry-After"] = strconv.Itoa(retryAfterSeconds)
	}
	return events.APIGatewayV2HTTPResponse{StatusCode: a.code, Headers: h, Body: string(body)}, nil
}

// handleHTTPEvent answers an API Gateway HTTP API request.
func (f *Function) handleHTTPEvent(ctx context.Context, raw json.RawMessage) (events.APIGatewayV2HTTPResponse, error) {
	var req events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return requestError(http.StatusBadRequest, "reading the API Gateway event: "+err.Error()).response()
	}
	observed(ctx).httpRequest(req)
	return f.serveHTTP(ctx, req).response()
}

// serveHTTP routes, authenticates and reads the body of a request.
func (f *Function) serveHTTP(ctx context.Context, req events.APIGatewayV2HTTPRequest) answer {
	method, path := req.RequestContext.HTTP.Method, req.RawPath
	if method == http.MethodGet {
		return f.serveRead(ctx, req)
	}
	route := method + " " + path
	if !slices.Contains(Routes, route) {
		return requestError(http.StatusNotFound, fmt.Sprintf("no route %s; the routes are %s", route, strings.Join(Routes, ", ")))
	}
	headers := http.Header{}
	for k, v := range req.Headers {
		headers.Set(k, v)
	}
	key, denied := f.authenticate(ctx, httpapi.APIKeyOf(headers))
	if denied != nil {
		return *denied
	}
	body := []byte(req.Body)
	if req.IsBase64Encoded {
		var err error
		if body, err = base64.StdEncoding.DecodeString(req.Body); err != nil {
			return requestError(http.StatusBadRequest, "the body is marked base64 but does not decode: "+err.Error())
		}
	}
	if int64(len(body)) > f.cfg.MaxBodyBytes {
		return requestError(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", f.cfg.MaxBodyBytes))
	}
	if path == "/v1/register" {
		return f.register(ctx, key, body)
	}
	return f.idempotent(ctx, key, headers.Get("Idempotency-Key"), body)
}

// readings answers POST /v1/readings as the gateway does: one result per
// batch, in request order.
func (f *Function) readings(ctx context.Context, key cloud.KeyInfo, body []byte) answer {
	raws, err := contract.SplitBatches(body)
	if err == nil {
		err = contract.CheckBatchCount(len(raws), f.cfg.MaxBodyBytes)
	}
	if err != nil {
		return requestError(http.StatusBadRequest, err.Error())
	}
	now := f.now()
	jobs := make([]*job, len(raws))
	for i, raw := range raws {
		b, err := contract.DecodeBatch(raw, "", f.cfg.Limits, now)
		if err == nil {
			err = boundTo(key, b.HardwareID)
		}
		jobs[i] = newJob(b, err)
	}
	f.store(ctx, jobs, nil)
	observed(ctx).jobs(jobs)
	results := make([]contract.Result, len(jobs))
	throttled, unfinished := false, false
	for i, j := range jobs {
		results[i] = httpResult(j)
		throttled = throttled || j.outcome == tablewrite.Throttled
		unfinished = unfinished || results[i].Reason != nil && *results[i].Reason == contract.ReasonBufferFull
	}
	resp := contract.NewReadingsResponse(results)
	code := resp.HTTPStatus()
	if code == http.StatusInsufficientStorage { // nothing stored, the cloud's fault
		code = http.StatusServiceUnavailable
		if throttled {
			code = http.StatusTooManyRequests
		}
	}
	a := jsonAnswer(code, resp)
	a.unfinished = unfinished
	return a
}

// boundTo refuses a batch or registration of another device than the one
// a device key is bound to.
func boundTo(key cloud.KeyInfo, hw string) error {
	if key.HardwareID != "" && key.HardwareID != hw {
		return contract.NewError(contract.ReasonForbidden, "hardware_id",
			fmt.Sprintf("the API key is bound to %s and may not act for %s", key.HardwareID, hw))
	}
	return nil
}

// httpResult is a batch's result in a POST /v1/readings answer.
func httpResult(j *job) contract.Result {
	id := ""
	if j.batch != nil {
		id = j.batch.BatchID
	}
	switch j.outcome {
	case tablewrite.Delivered:
		r := contract.NewResult(id, contract.StatusAccepted, nil)
		r.Quality = j.quality
		return r
	case tablewrite.Duplicate:
		return contract.NewResult(id, contract.StatusDuplicate, nil)
	case tablewrite.Conflict, tablewrite.Rejected:
		return contract.NewResult(id, "", j.err)
	}
	return contract.NewResult(id, "", contract.NewError(contract.ReasonBufferFull, "",
		"the cloud could not store the batch now ("+j.err.Error()+"); nothing was stored for it, retry later"))
}

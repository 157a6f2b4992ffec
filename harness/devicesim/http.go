package devicesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"greenhouse-gateway/firmware-contract"
)

// HTTP paths of the device API.
const (
	pathReadings = "/v1/readings"
	pathRegister = "/v1/register"
)

// maxResponseBody bounds the part of a response body the simulator reads.
const maxResponseBody = 1 << 20

// errUnauthorized is the failure of a request the gateway refused for its API key.
var errUnauthorized = errors.New("devicesim: gateway refused the api key")

// httpClient is the HTTP client all devices of a simulator share.
type httpClient struct {
	client      *http.Client
	readingsURL string
	registerURL string
	userAgent   string
}

func (c *httpClient) closeIdle() { c.client.CloseIdleConnections() }

// httpDialer returns the dialFunc of the HTTP transport, which posts one batch per request.
// Each request is bounded by the ack timeout.
func httpDialer(cfg *Config, logger *slog.Logger) (*httpClient, dialFunc) {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = min(cfg.Devices*cfg.MaxInflight, 256)
	base := strings.TrimRight(cfg.HTTPURL, "/")
	c := &httpClient{
		client:      &http.Client{Transport: transport, Timeout: cfg.AckTimeout},
		readingsURL: base + pathReadings,
		registerURL: base + pathRegister,
		userAgent:   "greenhouse-devicesim/" + cfg.FirmwareVersion,
	}
	dial := func(ctx context.Context, hardwareID, apiKey string, events chan<- event) (link, error) {
		lctx, cancel := context.WithCancel(ctx)
		l := &httpLink{c: c, apiKey: apiKey, events: events, ctx: lctx, cancel: cancel,
			log: logger.With("hardware_id", hardwareID)}
		deliver(lctx, events, event{kind: evConnected}) // HTTP needs no session
		return l, nil
	}
	return c, dial
}

// httpLink is the HTTP link of one device: every Send and Register is one request on a
// goroutine of its own, which reports the answer as an event.
type httpLink struct {
	c      *httpClient
	apiKey string
	events chan<- event
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (l *httpLink) start(f func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errNotConnected
	}
	l.wg.Go(f)
	return nil
}

func (l *httpLink) Register(payload []byte) error {
	return l.start(func() {
		if ev, ok := l.register(payload); ok {
			deliver(l.ctx, l.events, ev)
		}
	})
}

func (l *httpLink) Send(batchID string, payload []byte) error {
	return l.start(func() {
		if ev, ok := l.send(batchID, payload); ok {
			deliver(l.ctx, l.events, ev)
		}
	})
}

// Drop abandons the requests in flight, as a reboot does; over HTTP it is Close.
func (l *httpLink) Drop() error { return l.Close() }

// Close cancels the requests in flight and waits for them. It is idempotent.
func (l *httpLink) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
	return nil
}

// post sends payload to url and returns the response with its body read.
func (l *httpLink) post(url string, payload []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(l.ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+l.apiKey)
	req.Header.Set("User-Agent", l.c.userAgent)
	resp, err := l.c.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the answer: %w", err)
	}
	return resp, body, nil
}

// send posts one batch and turns the answer into an event. It reports false when the link
// was closed meanwhile.
func (l *httpLink) send(batchID string, payload []byte) (event, bool) {
	resp, body, err := l.post(l.c.readingsURL, payload)
	if err != nil {
		if l.ctx.Err() != nil {
			return event{}, false
		}
		return event{kind: evSendFailed, batchID: batchID, err: err}, true
	}
	return readingsEvent(batchID, resp.StatusCode, resp.Header.Get("Retry-After"), body, time.Now()), true
}

// readingsEvent maps the gateway's answer to POST /v1/readings for one batch. A result for the
// batch decides, whatever the status code; without one, 429, 408 and 5xx (503 shutting down,
// 507 buffer full) are retried, honouring Retry-After; a refused key is retried too, since
// firmware keeps its data until someone fixes the key; other client errors reject the batch.
func readingsEvent(batchID string, code int, retryAfterHeader string, body []byte, now time.Time) event {
	retryAfter := parseRetryAfter(retryAfterHeader, now)
	var rr contract.ReadingsResponse
	if json.Unmarshal(body, &rr) == nil {
		for _, r := range rr.Results {
			if r.BatchID != batchID {
				continue
			}
			return event{kind: evAck, retryAfter: retryAfter, ack: contract.Ack{
				Type:    contract.AckTypeReadings,
				BatchID: batchID,
				Status:  r.Status,
				Reason:  r.Reason,
				Message: r.Message,
			}}
		}
	}
	status := fmt.Sprintf("%d %s", code, http.StatusText(code))
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return event{kind: evSendFailed, batchID: batchID, retryAfter: retryAfter,
			err: fmt.Errorf("%w (%s)", errUnauthorized, status)}
	case code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500:
		return event{kind: evSendFailed, batchID: batchID, retryAfter: retryAfter,
			err: fmt.Errorf("gateway answered %s", status)}
	case code >= 400:
		reason := contract.Reason(fmt.Sprintf("http_%d", code))
		switch code {
		case http.StatusBadRequest:
			reason = contract.ReasonValidation
		case http.StatusConflict:
			reason = contract.ReasonConflict
		}
		msg := fmt.Sprintf("gateway answered %s: %s", status, snippet(body))
		return event{kind: evAck, ack: contract.Ack{Type: contract.AckTypeReadings, BatchID: batchID,
			Status: contract.StatusRejected, Reason: &reason, Message: &msg}}
	default:
		return event{kind: evSendFailed, batchID: batchID, retryAfter: retryAfter,
			err: fmt.Errorf("gateway answered %s without a result for the batch", status)}
	}
}

// register posts the registration and turns the answer into an event.
func (l *httpLink) register(payload []byte) (event, bool) {
	resp, body, err := l.post(l.c.registerURL, payload)
	if err != nil {
		if l.ctx.Err() != nil {
			return event{}, false
		}
		return event{kind: evRegisterFailed, err: err}, true
	}
	return registerEvent(resp.StatusCode, resp.Header.Get("Retry-After"), body, time.Now()), true
}

// registerEvent maps the gateway's answer to POST /v1/register. 201 (first registration)
// and 200 (again) confirm it, with the register ack as body and its confirmation_id. A
// rejected register ack in the body (400 invalid, 507 not saved) is passed on with its reason
// and message; 400 without one is a validation_error. 401/403 and other answers mean the
// registration was not delivered.
func registerEvent(code int, retryAfterHeader string, body []byte, now time.Time) event {
	status := fmt.Sprintf("%d %s", code, http.StatusText(code))
	var a contract.Ack
	decoded := json.Unmarshal(body, &a) == nil
	switch {
	case code == http.StatusOK || code == http.StatusCreated:
		if !decoded {
			a = contract.Ack{} // the confirmation id is informative only
		}
		a.Type, a.Status = contract.AckTypeRegister, contract.StatusRegistered
		return event{kind: evAck, ack: a, httpStatus: code}
	case decoded && a.Status == contract.StatusRejected && a.Reason != nil:
		a.Type = contract.AckTypeRegister
		if a.Message == nil {
			msg := "gateway answered " + status
			a.Message = &msg
		}
		return event{kind: evAck, ack: a, httpStatus: code, retryAfter: parseRetryAfter(retryAfterHeader, now)}
	case code == http.StatusBadRequest:
		reason := contract.ReasonValidation
		msg := fmt.Sprintf("gateway answered %s: %s", status, snippet(body))
		return event{kind: evAck, httpStatus: code, ack: contract.Ack{Type: contract.AckTypeRegister,
			Status: contract.StatusRejected, Reason: &reason, Message: &msg}}
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return event{kind: evRegisterFailed, err: fmt.Errorf("%w (%s)", errUnauthorized, status)}
	default:
		return event{kind: evRegisterFailed, err: fmt.Errorf("gateway answered %s", status)}
	}
}

// snippet returns the start of a response body for a log message.
func snippet(body []byte) string {
	const n = 200
	s := strings.TrimSpace(string(body))
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

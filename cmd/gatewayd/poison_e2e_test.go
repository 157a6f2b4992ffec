package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/function/event"
)

// poisonFront sits between gatewayd and the readings function under the
// emulator, and makes one batch poison: an invocation that carries it
// fails as the function crashing on it would (crash), or the batch alone
// is answered error, with its device's later batches of the event
// not_attempted, as the function answers a batch it cannot write
// (itemError). Every other invocation, and every other batch, goes to the
// real function.
type poisonFront struct {
	upstream  *url.URL
	url       string // where gatewayd invokes the function
	hw        string // the poison batch's device
	seq       int    // and its seq
	itemError bool

	mu          sync.Mutex
	carried     int            // invocations that carried the poison batch
	encodings   map[string]int // of the events that carried batches
	poisonBatch string
}

type itemHead struct {
	BatchID    string `json:"batch_id"`
	HardwareID string `json:"hardware_id"`
	Seq        int    `json:"seq"`
}

func startPoisonFront(t *testing.T, functionURL, hw string, seq int, itemError bool) *poisonFront {
	t.Helper()
	u, err := url.Parse(functionURL)
	require.NoError(t, err)
	p := &poisonFront{upstream: u, hw: hw, seq: seq, itemError: itemError, encodings: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

func (p *poisonFront) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	ev, encoding, err := event.Unmarshal(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	poison, later := -1, map[string]bool{}
	for i, it := range ev.Items {
		var h itemHead
		_ = json.Unmarshal(it.Batch, &h)
		if h.HardwareID == p.hw && h.Seq == p.seq {
			poison = i
			p.mu.Lock()
			p.poisonBatch = h.BatchID
			p.mu.Unlock()
		} else if poison >= 0 && h.HardwareID == p.hw {
			later[it.ID] = true
		}
	}
	p.mu.Lock()
	if len(ev.Items) > 0 { // an empty event does not shrink and goes plain
		p.encodings[encoding]++
	}
	if poison >= 0 {
		p.carried++
	}
	p.mu.Unlock()
	if poison < 0 {
		p.forward(w, r, body, nil)
		return
	}
	if !p.itemError {
		w.Header().Set("X-Amz-Function-Error", "Unhandled")
		_, _ = io.WriteString(w, `{"errorMessage":"RequestId: x Error: Runtime exited with error: exit status 2","errorType":"Runtime.ExitError"}`)
		return
	}
	// The poison batch and its device's later batches stay out of the
	// function; the rest of the event goes to it.
	answered := []event.ItemResult{{ID: ev.Items[poison].ID, Status: event.StatusError, Reason: "dynamodb",
		Message: "injected: the function cannot write this batch"}}
	rest := ev
	rest.Items = nil
	for i, it := range ev.Items {
		switch {
		case i == poison:
		case later[it.ID]:
			answered = append(answered, event.ItemResult{ID: it.ID, Status: event.StatusError, Reason: "not_attempted",
				Message: "an earlier batch of its device failed"})
		default:
			rest.Items = append(rest.Items, it)
		}
	}
	plain, err := json.Marshal(&rest)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	p.forward(w, r, plain, answered)
}

// forward sends body to the function and answers its answer, with the
// results of extra added.
func (p *poisonFront) forward(w http.ResponseWriter, r *http.Request, body []byte, extra []event.ItemResult) {
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, p.upstream.String()+r.URL.Path, bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if extra != nil {
		var a event.BatchResponse
		if json.Unmarshal(out, &a) == nil && a.V != 0 {
			a.Results = append(a.Results, extra...)
			out, _ = json.Marshal(a)
		}
	}
	for k, vs := range resp.Header {
		if k != "Content-Length" {
			w.Header()[k] = vs
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

func (p *poisonFront) stats() (carried int, encodings map[string]int, batchID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int{}
	for k, v := range p.encodings {
		m[k] = v
	}
	return p.carried, m, p.poisonBatch
}

// TestLambdaPoisonBatchIsDeadLetteredAndOthersFlow runs gatewayd with the
// lambda target in front of the real readings function, with one batch
// that the function crashes on (or answers error for) every time: every
// other batch, its own device's later ones included, is delivered once,
// and the poison batch alone is dead-lettered, within the poison
// settings.
func TestLambdaPoisonBatchIsDeadLetteredAndOthersFlow(t *testing.T) {
	for _, tc := range []struct {
		name      string
		itemError bool
	}{{"crash", false}, {"item error", true}} {
		t.Run(tc.name, func(t *testing.T) {
			local, view, key, prefix := setup(t)
			fn := startFunction(t, local.Endpoint, prefix)
			poisonHW := "02:00:00:B7:01:00"
			front := startPoisonFront(t, fn.url, poisonHW, 2, tc.itemError)
			d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, lambdaEnv(front.url,
				"GATEWAY_UPLINK_LAMBDA_POISON_FAILURES=3", "GATEWAY_UPLINK_LAMBDA_POISON_TIME=2s")...)

			l := &ackedLoad{acked: map[string]int{}}
			var hws []string
			var wg sync.WaitGroup
			for i := range 4 {
				hw := fmt.Sprintf("02:00:00:B7:01:%02X", i)
				hws = append(hws, hw)
				dev := connect(t, d.mqttAddr, hw, key)
				boot := uuid.NewString()
				wg.Go(func() {
					for k := range 6 {
						a := dev.send(t, batch(hw, boot, k, 3))
						require.Equal(t, contract.StatusAccepted, a.Status)
						if hw != poisonHW || k != 2 {
							l.add(a.BatchID, 3)
						}
					}
				})
			}
			wg.Wait()
			start := time.Now()
			require.Eventually(t, func() bool { return d.metric(t, "gateway_buffer_pending_batches") == "0" },
				90*time.Second, 200*time.Millisecond, "logs:\n%s", d.logs.String())
			t.Logf("%s: backlog settled in %s", tc.name, time.Since(start).Round(time.Millisecond))

			require.Equal(t, 1.0, metricFloat(t, d, `gateway_uplink_batches_total{result="dead_lettered"}`),
				"the poison batch alone is dead-lettered; logs:\n%s", d.logs.String())
			checkExactlyOnce(t, view, hws, l)
			carried, encodings, poison := front.stats()
			require.NotEmpty(t, poison)
			require.NotContains(t, view.markers(t), poison, "the poison batch never reached the tables")
			require.GreaterOrEqual(t, carried, 3, "it was tried poison_failures times")
			require.Zero(t, encodings[event.EncodingNone], "gatewayd sends its events compressed: %v", encodings)
			require.Positive(t, encodings[event.EncodingZstd], "gatewayd sends its events compressed: %v", encodings)
			require.NotContains(t, strings.ToLower(d.logs.String()), "uplink down", "one batch is no outage")
		})
	}
}

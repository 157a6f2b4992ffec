// Package gateway is the device-facing side of the gateway: the embedded
// MQTT broker and the HTTP API, both feeding one ingest path that decodes,
// validates, deduplicates and durably commits reading batches before any
// acknowledgement leaves.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/contract"
)

// Transports, as metric labels.
const (
	TransportMQTT = "mqtt"
	TransportHTTP = "http"
)

// ErrShuttingDown is returned while the gateway stops: nothing new is
// committed or acknowledged.
var ErrShuttingDown = errors.New("gateway: shutting down")

// Committer stores batches durably (the buffer).
type Committer interface {
	Commit(ctx context.Context, entries []buffer.Entry) ([]buffer.Outcome, error)
}

// Ingest is the one ingest path behind both transports.
type Ingest struct {
	limits  contract.Limits
	store   Committer
	logger  *slog.Logger
	now     func() time.Time
	results *prometheus.CounterVec
	stop    chan struct{}
}

// NewIngest returns the ingest path. reg may be nil.
func NewIngest(limits contract.Limits, store Committer, logger *slog.Logger, reg prometheus.Registerer) *Ingest {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	in := &Ingest{
		limits: limits,
		store:  store,
		logger: logger.With("component", "ingest"),
		now:    time.Now,
		stop:   make(chan struct{}),
		results: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "ingest", Name: "batches_total",
			Help: "Reading batches received, by transport and result (accepted, duplicate, or the rejection reason).",
		}, []string{"transport", "result"}),
	}
	for _, t := range []string{TransportMQTT, TransportHTTP} {
		for _, r := range []string{"accepted", "duplicate", string(contract.ReasonValidation),
			string(contract.ReasonClockNotSynced), string(contract.ReasonConflict), string(contract.ReasonBufferFull)} {
			in.results.WithLabelValues(t, r)
		}
	}
	return in
}

// Stop makes every later Readings call fail with ErrShuttingDown. Calls
// already committing finish.
func (in *Ingest) Stop() {
	select {
	case <-in.stop:
	default:
		close(in.stop)
	}
}

func (in *Ingest) stopping() bool {
	select {
	case <-in.stop:
		return true
	default:
		return false
	}
}

// Readings decodes, validates and commits reading batches, all from one
// sender: the MQTT topic's hardware_id, or "" over HTTP (where each batch
// names its own device). It returns one result per payload, in order.
//
// A batch is acknowledged (accepted or duplicate) only after it is on disk.
// When the commit itself fails, every batch that needed it is reported
// rejected with reason buffer_full and the returned error is non-nil, so
// the transport withholds its acknowledgement.
func (in *Ingest) Readings(ctx context.Context, transport, sender string, payloads [][]byte) ([]contract.Result, error) {
	if in.stopping() {
		return nil, ErrShuttingDown
	}
	now := in.now()
	results := make([]contract.Result, len(payloads))
	var entries []buffer.Entry
	var idx []int
	for i, p := range payloads {
		b, err := contract.DecodeBatch(p, sender, in.limits, now)
		if err == nil && b.NeedsClockRepair() {
			err = &contract.Error{Reason: contract.ReasonClockNotSynced, Field: "readings",
				Rule: "timestamps before 2000-01-01: the device clock is not synced; resend after NTP sync"}
		}
		if err != nil {
			results[i] = rejected(batchIDOf(b, p), err)
			continue
		}
		canon := b.Canonical()
		entries = append(entries, buffer.Entry{
			BatchID: b.BatchID, HardwareID: b.HardwareID,
			Hash: b.IdentityHash(), Payload: canon, ReceivedAt: now,
		})
		idx = append(idx, i)
		results[i].BatchID = b.BatchID
	}
	var commitErr error
	if len(entries) > 0 {
		outcomes, err := in.store.Commit(ctx, entries)
		if err != nil {
			commitErr = fmt.Errorf("committing %d batches: %w", len(entries), err)
			for _, i := range idx {
				results[i] = fullResult(results[i].BatchID, "the gateway could not store the batch; nothing was stored, retry later")
			}
		} else {
			for k, i := range idx {
				results[i] = outcomeResult(results[i].BatchID, outcomes[k])
			}
		}
	}
	for _, r := range results {
		in.results.WithLabelValues(transport, resultLabel(r)).Inc()
		if r.Status == contract.StatusRejected {
			in.logger.Debug("batch rejected", "transport", transport, "batch_id", r.BatchID,
				"reason", *r.Reason, "message", *r.Message)
		}
	}
	return results, commitErr
}

func resultLabel(r contract.Result) string {
	if r.Status == contract.StatusRejected && r.Reason != nil {
		return string(*r.Reason)
	}
	return string(r.Status)
}

func outcomeResult(batchID string, o buffer.Outcome) contract.Result {
	switch o {
	case buffer.Stored:
		return contract.Result{BatchID: batchID, Status: contract.StatusAccepted}
	case buffer.Duplicate:
		return contract.Result{BatchID: batchID, Status: contract.StatusDuplicate}
	case buffer.Conflict:
		reason := contract.ReasonConflict
		msg := "batch_id was already received with a different payload"
		return contract.Result{BatchID: batchID, Status: contract.StatusRejected, Reason: &reason, Message: &msg}
	default:
		return fullResult(batchID, "the gateway's buffer is full; nothing was stored, retry later")
	}
}

func fullResult(batchID, msg string) contract.Result {
	reason := contract.ReasonBufferFull
	return contract.Result{BatchID: batchID, Status: contract.StatusRejected, Reason: &reason, Message: &msg}
}

func rejected(batchID string, err error) contract.Result {
	reason := contract.ReasonValidation
	var ce *contract.Error
	if errors.As(err, &ce) {
		reason = ce.Reason
	}
	msg := err.Error()
	return contract.Result{BatchID: batchID, Status: contract.StatusRejected, Reason: &reason, Message: &msg}
}

// batchIDOf names a rejected batch as well as it can: the decoded batch_id,
// else the raw field if the payload is an object that has a usable one.
func batchIDOf(b *contract.Batch, payload []byte) string {
	if b != nil {
		return b.BatchID
	}
	var peek struct {
		BatchID string `json:"batch_id"`
	}
	if json.Unmarshal(payload, &peek) != nil || len(peek.BatchID) > 256 {
		return ""
	}
	return peek.BatchID
}

package operator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/httpapi"
	"greenhouse-gateway/internal/readquery"
)

// History is what the operator's reading queries read: a device's batches
// held locally, pending or delivered and kept (*buffer.Buffer).
type History interface {
	DeviceBatches(hardwareID string, fromMS, toMS int64, fn func(buffer.DeviceBatch) error) error
}

// The answers of the reading queries, which the cloud's read API answers
// too (package readquery).
type (
	LocalReading = readquery.LocalReading
	ReadingsPage = readquery.ReadingsPage
	Summary      = readquery.Summary
)

// device answers 400 or 404 unless the path names a known device.
func (h *API) queryDevice(w http.ResponseWriter, r *http.Request) (string, bool) {
	hw := r.PathValue("hardware_id")
	if err := contract.ValidHardwareID(hw); err != nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": err.Error()})
		return "", false
	}
	if _, ok := h.deps.Devices.Device(hw); !ok {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "no device " + hw})
		return "", false
	}
	if h.deps.History == nil {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "this gateway keeps no readings"})
		return "", false
	}
	return hw, true
}

func (h *API) queryFailed(w http.ResponseWriter, err error) {
	var pe *readquery.ParamError
	if errors.As(err, &pe) {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": pe.Error()})
		return
	}
	h.logger.Error("reading local history", "err", err)
	httpapi.WriteJSON(w, http.StatusInternalServerError, map[string]string{"status": "error", "message": "reading the buffer failed"})
}

// eachReading calls fn with every reading of hw in [from, to), with the
// batch it belongs to.
func (h *API) eachReading(hw string, from, to time.Time, fn func(buffer.DeviceBatch, *contract.Reading, time.Time)) error {
	fromMS, toMS := readquery.WindowMS(from, to)
	return h.deps.History.DeviceBatches(hw, fromMS, toMS, func(d buffer.DeviceBatch) error {
		var b contract.Batch
		if err := json.Unmarshal(d.Payload, &b); err != nil {
			return fmt.Errorf("decoding batch %s: %w", d.BatchID, err)
		}
		for i := range b.Readings {
			t := time.UnixMilli(b.Readings[i].TimestampMS)
			if t.Before(from) || !t.Before(to) {
				continue
			}
			fn(d, &b.Readings[i], t)
		}
		return nil
	})
}

func (h *API) deviceReadings(w http.ResponseWriter, r *http.Request) {
	serveQuery(h, w, r, readquery.ParseReadingsQuery, func(hw string, q readquery.ReadingsQuery) (any, error) {
		p := q.Pager()
		err := h.eachReading(hw, q.From, q.To, func(d buffer.DeviceBatch, rd *contract.Reading, _ time.Time) {
			state := readquery.StatePending
			if d.Delivered {
				state = readquery.StateDelivered
			}
			p.Add(d.BatchID, rd, state, nil)
		})
		if err != nil {
			return nil, err
		}
		return p.Page(hw), nil
	})
}

func (h *API) deviceSummary(w http.ResponseWriter, r *http.Request) {
	serveQuery(h, w, r, readquery.ParseSummaryQuery, func(hw string, q readquery.SummaryQuery) (any, error) {
		s := q.Summarizer()
		err := h.eachReading(hw, q.From, q.To, func(_ buffer.DeviceBatch, rd *contract.Reading, t time.Time) {
			s.Add(t, rd.Sensors)
		})
		if err != nil {
			return nil, err
		}
		return s.Result(hw), nil
	})
}

// serveQuery answers a query of a known device's local readings: parse
// reads it from the request, answer runs it.
func serveQuery[Q any](h *API, w http.ResponseWriter, r *http.Request, parse func(url.Values, time.Time) (Q, error), answer func(hw string, q Q) (any, error)) {
	hw, ok := h.queryDevice(w, r)
	if !ok {
		return
	}
	q, err := parse(r.URL.Query(), time.Now())
	if err != nil {
		h.queryFailed(w, err)
		return
	}
	a, err := answer(hw, q)
	if err != nil {
		h.queryFailed(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, a)
}

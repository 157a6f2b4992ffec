package operator

import (
	"errors"
	"net/http"
	"strconv"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/httpapi"
)

// DeadLetterStore is the buffer's dead-letter area (*buffer.Buffer).
type DeadLetterStore interface {
	DeadLetters(limit int) ([]buffer.DeadLetter, int, error)
	Reforward(batchID string) (buffer.Pending, error)
}

// maxDeadLetterList bounds one GET /v1/dead-letters answer.
const maxDeadLetterList = 1000

// listDeadLetters answers GET /v1/dead-letters[?limit=N]: the dead letters
// by batch_id (100 by default, at most 1000) and how many there are.
func (h *API) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	if h.deps.DeadLetters == nil {
		adminError(w, http.StatusNotFound, "this gateway has no dead-letter store")
		return
	}
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxDeadLetterList {
			adminError(w, http.StatusBadRequest, "limit: must be a whole number from 1 to "+strconv.Itoa(maxDeadLetterList))
			return
		}
		limit = n
	}
	list, total, err := h.deps.DeadLetters.DeadLetters(limit)
	if err != nil {
		h.storeError(w, err)
		return
	}
	if list == nil {
		list = []buffer.DeadLetter{}
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"count": total, "dead_letters": list})
}

// reforwardDeadLetter answers POST /v1/dead-letters/{batch_id}/reforward:
// 200 when the batch is queued again, 404 for an unknown batch_id, 409 for
// a batch that is pending or delivered.
func (h *API) reforwardDeadLetter(w http.ResponseWriter, r *http.Request) {
	if h.deps.DeadLetters == nil {
		adminError(w, http.StatusNotFound, "this gateway has no dead-letter store")
		return
	}
	id := r.PathValue("batch_id")
	p, err := h.deps.DeadLetters.Reforward(id)
	switch {
	case errors.Is(err, buffer.ErrNotFound):
		adminError(w, http.StatusNotFound, "no batch "+id+" in the buffer")
	case errors.Is(err, buffer.ErrNotDeadLettered):
		adminError(w, http.StatusConflict, err.Error())
	case err != nil:
		h.storeError(w, err)
	default:
		h.logger.Info("dead letter re-forwarded by an operator", "batch_id", id, "hardware_id", p.HardwareID)
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"status": "reforwarded", "batch_id": p.BatchID,
			"hardware_id": p.HardwareID, "seq": p.Seq})
	}
}

func (h *API) storeError(w http.ResponseWriter, err error) {
	if errors.Is(err, buffer.ErrClosed) {
		adminError(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	h.logger.Error("dead-letter request failed", "err", err)
	adminError(w, http.StatusInternalServerError, err.Error())
}

func adminError(w http.ResponseWriter, code int, msg string) {
	httpapi.WriteJSON(w, code, map[string]string{"status": "error", "message": msg})
}

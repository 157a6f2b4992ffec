package operator

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/httpapi"
)

// Bounds of GET /v1/audit.
const (
	auditDefaultLimit = 100
	auditMaxLimit     = 1000
)

// auditQuery parses GET /v1/audit's parameters.
func auditQuery(q map[string][]string) (audit.Filter, error) {
	f := audit.Filter{Limit: auditDefaultLimit}
	for name, vs := range q {
		if len(vs) != 1 {
			return f, fmt.Errorf("%s: give it once", name)
		}
		v := vs[0]
		var err error
		switch name {
		case "hardware_id":
			if v == "" || len(v) > 128 {
				err = fmt.Errorf("hardware_id: must be 1 to 128 characters")
			}
			f.HardwareID = v
		case "reason":
			if !slices.Contains(audit.Reasons, v) {
				err = fmt.Errorf("reason: %q is not one of %s", v, strings.Join(audit.Reasons, ", "))
			}
			f.Reason = v
		case "transport":
			if v != contract.TransportMQTT && v != contract.TransportHTTP {
				err = fmt.Errorf("transport: %q is not one of mqtt, http", v)
			}
			f.Transport = v
		case "since":
			f.Since, err = parseAuditTime(name, v)
		case "until":
			f.Until, err = parseAuditTime(name, v)
		case "limit":
			n, perr := strconv.Atoi(v)
			if perr != nil || n < 1 || n > auditMaxLimit {
				err = fmt.Errorf("limit: %q is not an integer between 1 and %d", v, auditMaxLimit)
			}
			f.Limit = n
		default:
			err = fmt.Errorf("%s: unknown parameter; use hardware_id, reason, transport, since, until, limit", name)
		}
		if err != nil {
			return f, err
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, fmt.Errorf("since: must be before until")
	}
	return f, nil
}

// parseAuditTime reads RFC 3339 or milliseconds since the epoch.
func parseAuditTime(name, v string) (time.Time, error) {
	if v != "" && strings.Trim(v, "0123456789") == "" && len(v) <= 15 {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err == nil {
			return time.UnixMilli(ms).UTC(), nil
		}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %q is neither RFC 3339 (2026-01-02T15:04:05Z) nor milliseconds since the epoch", name, v)
	}
	return t, nil
}

// auditResponse is GET /v1/audit's answer.
type auditResponse struct {
	Count   int            `json:"count"`
	Records []audit.Record `json:"records"`
	// More is true when older records match too; NextUntil is then the
	// until of the next page.
	More      bool   `json:"more"`
	NextUntil string `json:"next_until,omitempty"`
	// SkippedLines counts lines of the segments read that were not whole
	// records (torn by a crash).
	SkippedLines int `json:"skipped_lines"`
}

// queryAudit answers GET /v1/audit: the audit records that match, newest
// first.
func (h *API) queryAudit(w http.ResponseWriter, r *http.Request) {
	if h.deps.Audit == nil {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "this gateway keeps no audit trail"})
		return
	}
	f, err := auditQuery(r.URL.Query())
	if err != nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": err.Error()})
		return
	}
	res, err := h.deps.Audit.Query(r.Context(), f)
	if err != nil {
		h.logger.Error("reading the audit trail", "err", err)
		httpapi.WriteJSON(w, http.StatusInternalServerError, map[string]string{"status": "error", "message": err.Error()})
		return
	}
	out := auditResponse{Count: len(res.Records), Records: res.Records, More: res.More, SkippedLines: res.Skipped}
	if out.Records == nil {
		out.Records = []audit.Record{}
	}
	if res.More {
		out.NextUntil = res.Records[len(res.Records)-1].Time.Format(time.RFC3339Nano)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

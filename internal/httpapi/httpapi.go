// Package httpapi holds the small HTTP helpers shared by the device API
// (ingest) and the operator API (operator), which are served on one
// listener. It imports only the standard library and the device contract.
package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"greenhouse-gateway/firmware-contract"
)

// WriteJSON answers code with v encoded as JSON.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// APIKey returns the key of "Authorization: Bearer KEY" or "X-API-Key: KEY".
func APIKey(r *http.Request) string { return APIKeyOf(r.Header) }

// APIKeyOf is APIKey for request headers h.
func APIKeyOf(h http.Header) string {
	if auth := h.Get("Authorization"); auth != "" {
		scheme, key, ok := strings.Cut(auth, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(key)
		}
		return ""
	}
	return h.Get("X-API-Key")
}

// Unavailable answers 503 with Retry-After and the contract's request
// error body saying msg.
func Unavailable(w http.ResponseWriter, retryAfter time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(int(retryAfter.Seconds())))
	WriteJSON(w, http.StatusServiceUnavailable, contract.RequestErrorResponse(msg))
}

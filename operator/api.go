package operator

import (
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/delivery"
	"greenhouse-gateway/internal/httpapi"
	"greenhouse-gateway/registry"
)

// Deps are what the operator API serves.
type Deps struct {
	// Devices backs the operator endpoints; nil disables them.
	Devices *registry.Registry
	// DeviceKeys shows each device's keys and backs the operator's key
	// reset; nil: no device keys (the reset answers 404).
	DeviceKeys DeviceKeys
	// History backs the reading queries; nil answers them 404.
	History History
	// DeadLetters backs /v1/dead-letters (the buffer).
	DeadLetters DeadLetterStore
	// AdminToken guards the operator endpoints (Authorization: Bearer, or
	// Basic with the token as password); empty disables them.
	AdminToken string
	// Status feeds the status page (GET /) and GET /v1/status.
	Status StatusSources
	// Uplink reports the uplink's state for GET /v1/uplink; nil answers
	// 404.
	Uplink func() delivery.Report
	// Ready reports whether the gateway can take batches (the status
	// page shows it); nil: always ready.
	Ready func() error
	// Audit backs GET /v1/audit and the status page's recent rejects; nil
	// answers 404 and leaves them out.
	Audit *audit.Log
	// RetryAfter is the Retry-After of 503 answers. Default 30s.
	RetryAfter time.Duration
}

// DeviceKeys is the device keys as operators see and reset them
// (*auth.DeviceKeys).
type DeviceKeys interface {
	// State returns hw's device key state; ok is false when it has none.
	State(hw string) (s registry.KeyState, ok bool)
	// Reset revokes hw's keys so that it can enroll again, and returns
	// the key IDs revoked.
	Reset(hw string) ([]string, error)
}

// API serves the operator routes: the status page, the device list, key
// resets, reading queries and summaries, dead letters, the uplink report
// and audit queries, all behind the admin token.
type API struct {
	deps   Deps
	logger *slog.Logger
	// crossOrigin refuses browsers' cross-site state-changing requests.
	crossOrigin *http.CrossOriginProtection
}

// New returns the operator API; Routes mounts it on a mux.
func New(deps Deps, logger *slog.Logger) *API {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if deps.RetryAfter == 0 {
		deps.RetryAfter = 30 * time.Second
	}
	return &API{deps: deps, logger: logger.With("component", "operator"), crossOrigin: http.NewCrossOriginProtection()}
}

// Routes mounts the operator routes on mux.
func (h *API) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/devices", h.admin(h.listDevices))
	mux.HandleFunc("GET /v1/devices/{hardware_id}", h.admin(h.getDevice))
	mux.HandleFunc("GET /v1/devices/{hardware_id}/readings", h.admin(h.deviceReadings))
	mux.HandleFunc("GET /v1/devices/{hardware_id}/summary", h.admin(h.deviceSummary))
	mux.HandleFunc("POST /v1/devices/{hardware_id}/reset-key", h.admin(h.resetKey))
	mux.HandleFunc("GET /v1/status", h.admin(h.statusJSON))
	mux.HandleFunc("GET /{$}", h.statusPage)
	mux.HandleFunc("GET /v1/dead-letters", h.admin(h.listDeadLetters))
	mux.HandleFunc("POST /v1/dead-letters/{batch_id}/reforward", h.admin(h.reforwardDeadLetter))
	mux.HandleFunc("GET /v1/uplink", h.admin(h.uplinkReport))
	mux.HandleFunc("GET /v1/audit", h.admin(h.queryAudit))
}

func (h *API) unavailable(w http.ResponseWriter, msg string) {
	httpapi.Unavailable(w, h.deps.RetryAfter, msg)
}

// errNoDeviceKeys answers a key reset when the gateway keeps no device
// keys.
var errNoDeviceKeys = errors.New("this gateway keeps no device keys")

// admin guards an operator endpoint with the admin token. A
// state-changing request (any method but GET and HEAD) must also be
// same-origin or from a non-browser client (http.CrossOriginProtection:
// Sec-Fetch-Site, else Origin against Host), and must present the token in
// a header a browser never adds by itself (Authorization: Bearer or
// X-API-Key): Basic credentials, which a browser resends on its own to any
// page's form posts, are refused for it.
func (h *API) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if h.deps.AdminToken == "" || h.deps.Devices == nil {
			httpapi.WriteJSON(w, http.StatusForbidden, map[string]string{"status": "error",
				"message": "the operator API is disabled: set GATEWAY_ADMIN_TOKEN"})
			return
		}
		changing := r.Method != http.MethodGet && r.Method != http.MethodHead
		if changing && !h.sameOriginBearer(w, r) {
			return
		}
		if subtle.ConstantTimeCompare([]byte(adminCredential(r)), []byte(h.deps.AdminToken)) != 1 {
			if changing {
				w.Header().Set("WWW-Authenticate", `Bearer realm="greenhouse-gateway"`)
			} else {
				w.Header().Set("WWW-Authenticate", `Basic realm="greenhouse-gateway"`)
			}
			httpapi.WriteJSON(w, http.StatusUnauthorized, map[string]string{"status": "error",
				"message": "missing or wrong admin token (Authorization: Bearer TOKEN, or Basic with any user name and the token as password)"})
			return
		}
		next(w, r)
	}
}

// sameOriginBearer answers 403 to a state-changing operator request that
// is cross-site or carries Basic credentials, and reports whether it may
// go on.
func (h *API) sameOriginBearer(w http.ResponseWriter, r *http.Request) bool {
	if err := h.crossOrigin.Check(r); err != nil {
		adminError(w, http.StatusForbidden, "cross-site request refused: state-changing operator requests must come "+
			"from this gateway's own pages or from a non-browser client ("+err.Error()+")")
		return false
	}
	if _, _, basic := r.BasicAuth(); basic {
		adminError(w, http.StatusForbidden, "Basic credentials refused: state-changing operator requests take "+
			"the admin token as Authorization: Bearer TOKEN")
		return false
	}
	return true
}

// adminCredential returns the admin token a request presents: the
// password of Basic auth (browsers), else the Bearer token or X-API-Key.
func adminCredential(r *http.Request) string {
	if _, password, ok := r.BasicAuth(); ok {
		return password
	}
	return httpapi.APIKey(r)
}

// deviceView is a device as operators see it: the registry's record and
// its device keys.
type deviceView struct {
	registry.Device
	DeviceKey *registry.KeyState `json:"device_key,omitempty"`
}

func (h *API) view(d registry.Device) deviceView {
	v := deviceView{Device: d}
	if h.deps.DeviceKeys != nil {
		if s, ok := h.deps.DeviceKeys.State(d.HardwareID); ok {
			v.DeviceKey = &s
		}
	}
	return v
}

func (h *API) listDevices(w http.ResponseWriter, r *http.Request) {
	devices := h.deps.Devices.Devices()
	views := make([]deviceView, len(devices))
	for i, d := range devices {
		views[i] = h.view(d)
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"count": len(views), "devices": views})
}

func (h *API) getDevice(w http.ResponseWriter, r *http.Request) {
	hw := r.PathValue("hardware_id")
	if err := contract.ValidHardwareID(hw); err != nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": err.Error()})
		return
	}
	d, ok := h.deps.Devices.Device(hw)
	if !ok {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "no device " + hw})
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, h.view(d))
}

// resetKeyAnswer is the answer of POST /v1/devices/{hardware_id}/reset-key.
type resetKeyAnswer struct {
	HardwareID string `json:"hardware_id"`
	Status     string `json:"status"`
	// RevokedKeyID is the device key revoked (null when the device had
	// none); RevokedKeyIDs lists them all when it had several (a key an
	// operator created for it besides the one it enrolled with).
	RevokedKeyID  *string  `json:"revoked_key_id"`
	RevokedKeyIDs []string `json:"revoked_key_ids"`
}

// resetKey revokes a device's keys so that it can enroll again: the
// operator's answer to a device that lost its key.
func (h *API) resetKey(w http.ResponseWriter, r *http.Request) {
	hw := r.PathValue("hardware_id")
	if err := contract.ValidHardwareID(hw); err != nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"status": "error", "message": err.Error()})
		return
	}
	if h.deps.DeviceKeys == nil {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": errNoDeviceKeys.Error()})
		return
	}
	ids, err := h.deps.DeviceKeys.Reset(hw)
	if err != nil {
		h.logger.Error("device key reset not saved", "hardware_id", hw, "err", err)
		h.unavailable(w, "the reset could not be saved; retry later")
		return
	}
	a := resetKeyAnswer{HardwareID: hw, Status: "reset", RevokedKeyIDs: ids}
	if a.RevokedKeyIDs == nil {
		a.RevokedKeyIDs = []string{}
	}
	if len(ids) > 0 {
		a.RevokedKeyID = &ids[0]
	}
	httpapi.WriteJSON(w, http.StatusOK, a)
}

func (h *API) uplinkReport(w http.ResponseWriter, r *http.Request) {
	if h.deps.Uplink == nil {
		httpapi.WriteJSON(w, http.StatusNotFound, map[string]string{"status": "error", "message": "no uplink runs in this gateway"})
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, h.deps.Uplink())
}

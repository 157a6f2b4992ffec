package auth

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/registry"
)

// Device key policies (auth.device_keys).
const (
	// DeviceKeysOff: no enrollment; fleet keys act for any device. Keys
	// bound to a device (api_keys hardware_id) still act for it only.
	DeviceKeysOff = "off"
	// DeviceKeysPreferred: a device registering with a fleet key is issued
	// its own key; once it has used it, the fleet key no longer acts for
	// it. Devices that never take their key keep working with the fleet
	// key.
	DeviceKeysPreferred = "preferred"
	// DeviceKeysRequired: a fleet key only enrolls; data needs the
	// device's own key.
	DeviceKeysRequired = "required"
)

// Principal is who a device request authenticated as: the API key, and the
// device it is bound to ("" for a fleet key).
type Principal struct {
	KeyID      string
	HardwareID string
}

// Bound reports whether the key is a device key.
func (p Principal) Bound() bool { return p.HardwareID != "" }

// Kind names the key's kind for logs and audit records: "device" or "fleet".
func (p Principal) Kind() string {
	if p.Bound() {
		return "device"
	}
	return "fleet"
}

// Actions a principal is authorized for.
const (
	ActConnect  = "connect"  // an MQTT connection as the device
	ActRegister = "register" // a registration
	ActReadings = "readings" // a readings batch
)

// deviceKeyPrefix names the state records of device keys, by key_id.
const deviceKeyPrefix = "devkey/"

// deviceKey is what the gateway keeps of a key bound to a device.
type deviceKey struct {
	KeyID      string    `json:"key_id"`
	HardwareID string    `json:"hardware_id"`
	Hash       string    `json:"hash"` // peppered, as in api_keys
	CreatedAt  time.Time `json:"created_at"`
	// Minted is set for a key this gateway issued at enrollment: its
	// api_keys item is written through the uplink (Written).
	Minted    bool      `json:"minted,omitempty"`
	Written   bool      `json:"written,omitempty"`
	WrittenAt time.Time `json:"written_at,omitzero"`
	// Used is set once the device authenticated with the key: from then
	// on a fleet key no longer acts for the device (preferred).
	Used bool `json:"used,omitempty"`
	// Reset is set when an operator reset the device's key: refused here
	// at once, and marked inactive in api_keys through the uplink
	// (ResetWritten).
	Reset        bool      `json:"reset,omitempty"`
	ResetAt      time.Time `json:"reset_at,omitzero"`
	ResetWritten bool      `json:"reset_written,omitempty"`
}

func (k *deviceKey) info() cloud.KeyInfo {
	return cloud.KeyInfo{KeyID: k.KeyID, Hash: k.Hash, CreatedAt: k.CreatedAt, Active: true,
		HardwareID: k.HardwareID, Description: "enrolled by the gateway"}
}

// DeviceKeys keeps the device keys this gateway issued or saw, decides
// what a key may act for (auth.device_keys) and enrolls devices. Its
// records are durable (the buffer's state records); the keys it issues
// and revokes reach api_keys through the uplink (the uplink's KeySource).
type DeviceKeys struct {
	policy  string
	peppers Peppers
	state   keyStore
	logger  *slog.Logger
	now     func() time.Time

	mu     sync.Mutex
	byID   map[string]*deviceKey
	byHash map[string]*deviceKey
	byHW   map[string][]*deviceKey // keys not reset

	refusals *prometheus.CounterVec
	enrolled prometheus.Counter
}

// keyStore keeps device key records (the buffer's state records).
type keyStore interface {
	StateStore
	LoadStates(prefix string) (map[string][]byte, error)
}

// NewDeviceKeys returns the device keys of policy with none known; it
// reads nothing (Load reads the keys kept in state).
func NewDeviceKeys(policy string, peppers Peppers, state keyStore, logger *slog.Logger, reg prometheus.Registerer) (*DeviceKeys, error) {
	if policy == "" {
		policy = DeviceKeysPreferred
	}
	if err := validDeviceKeyPolicy(policy); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	k := &DeviceKeys{policy: policy, peppers: peppers, state: state, logger: logger.With("component", "device_keys"),
		now: time.Now, byID: map[string]*deviceKey{}, byHash: map[string]*deviceKey{}, byHW: map[string][]*deviceKey{}}
	f := promauto.With(reg)
	k.refusals = f.NewCounterVec(prometheus.CounterOpts{
		Namespace: "gateway", Subsystem: "auth", Name: "identity_refusals_total",
		Help: "Device requests refused for their identity, by transport and reason: forbidden (a device key used " +
			"for another hardware_id), device_key_required (a fleet key used for a device holding its own key, " +
			"or for data under auth.device_keys required).",
	}, []string{"transport", "reason"})
	for _, t := range []string{contract.TransportMQTT, contract.TransportHTTP} {
		for _, r := range []contract.Reason{contract.ReasonForbidden, contract.ReasonDeviceKeyRequired} {
			k.refusals.WithLabelValues(t, string(r))
		}
	}
	k.enrolled = f.NewCounter(prometheus.CounterOpts{Namespace: "gateway", Subsystem: "auth", Name: "enrollments_total",
		Help: "Device keys issued to devices registering with a fleet key."})
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "gateway", Subsystem: "auth", Name: "device_keys_cloud_pending",
		Help: "Device keys issued or reset here whose api_keys item is still to be written by the uplink."},
		func() float64 { return float64(len(k.PendingKeyWrites(0))) })
	return k, nil
}

// Load reads the device keys kept in the state store. Call it once, before
// the keys are used.
func (k *DeviceKeys) Load() error {
	recs, err := k.state.LoadStates(deviceKeyPrefix)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, raw := range recs {
		var dk deviceKey
		if err := json.Unmarshal(raw, &dk); err != nil {
			return fmt.Errorf("device key record %s is unreadable: %w", name, err)
		}
		k.index(&dk)
	}
	return nil
}

func validDeviceKeyPolicy(p string) error {
	switch p {
	case DeviceKeysOff, DeviceKeysPreferred, DeviceKeysRequired:
		return nil
	}
	return fmt.Errorf("auth.device_keys: %q is not one of off, preferred, required", p)
}

// index adds dk to the maps. Callers hold k.mu (or own k).
func (k *DeviceKeys) index(dk *deviceKey) {
	k.byID[dk.KeyID] = dk
	if dk.Hash != "" {
		k.byHash[dk.Hash] = dk
	}
	if !dk.Reset {
		k.byHW[dk.HardwareID] = append(k.byHW[dk.HardwareID], dk)
	}
}

// save writes dk durably. Callers hold k.mu.
func (k *DeviceKeys) save(dk *deviceKey) error {
	raw, err := json.Marshal(dk)
	if err != nil {
		return err
	}
	return k.state.SaveState(deviceKeyPrefix+dk.KeyID, raw)
}

// localKey is what the gateway knows of a key it issued.
type localKey struct {
	p Principal
	// reset: an operator reset it; refused whatever api_keys says.
	reset bool
	// pending: not in api_keys yet; accepted without asking.
	pending bool
	// fresh: written to api_keys within writtenGrace, which its index may
	// not show yet.
	fresh bool
}

// writtenGrace is how long after its write a key issued here is trusted
// when api_keys' hash index does not find it yet (the index is eventually
// consistent).
const writtenGrace = time.Minute

// local returns what the gateway knows of the key with one of hashes.
func (k *DeviceKeys) local(hashes ...string) (localKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, h := range hashes {
		if h == "" {
			continue
		}
		if dk, ok := k.byHash[h]; ok {
			return localKey{p: Principal{KeyID: dk.KeyID, HardwareID: dk.HardwareID}, reset: dk.Reset,
				pending: dk.Minted && !dk.Written, fresh: dk.Written && k.now().Sub(dk.WrittenAt) < writtenGrace}, true
		}
	}
	return localKey{}, false
}

// isReset reports whether an operator reset the key.
func (k *DeviceKeys) isReset(keyID string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	dk, ok := k.byID[keyID]
	return ok && dk.Reset
}

// IdentityError is a refusal for the principal's identity.
func IdentityError(reason contract.Reason, rule string) *contract.Error {
	return contract.NewError(reason, "hardware_id", rule)
}

// Authorize decides whether p may act for hw (ActConnect, ActRegister or
// ActReadings) and counts a refusal under transport. A device key acting
// for its own device is recorded as used.
func (k *DeviceKeys) Authorize(p Principal, hw, action, transport string) *contract.Error {
	err := k.authorize(p, hw, action)
	if err != nil {
		k.refusals.WithLabelValues(transport, string(err.Reason)).Inc()
	}
	return err
}

func (k *DeviceKeys) authorize(p Principal, hw, action string) *contract.Error {
	if p.Bound() {
		if p.HardwareID != hw {
			return IdentityError(contract.ReasonForbidden,
				fmt.Sprintf("the API key is bound to %s; it cannot act for %s", p.HardwareID, hw))
		}
		k.used(p)
		return nil
	}
	if k.policy == DeviceKeysOff {
		return nil
	}
	k.mu.Lock()
	held, issued := false, false
	for _, dk := range k.byHW[hw] {
		issued = true
		held = held || dk.Used
	}
	k.mu.Unlock()
	switch {
	case held:
		return IdentityError(contract.ReasonDeviceKeyRequired,
			fmt.Sprintf("%s holds its own device key; a fleet key cannot act for it", hw))
	case k.policy == DeviceKeysRequired && action == ActReadings:
		return IdentityError(contract.ReasonDeviceKeyRequired,
			"auth.device_keys is required: a fleet key only registers; send readings with the device key "+
				"from the registration answer")
	case k.policy == DeviceKeysRequired && issued:
		return IdentityError(contract.ReasonDeviceKeyRequired, fmt.Sprintf(
			"%s was issued its device key already (auth.device_keys is required); a lost key is reset by an operator "+
				"(gatewayctl devices reset-key)", hw))
	}
	return nil
}

// used records that p's device authenticated with its key: the binding
// is in force from now on. A bound key created in api_keys by an operator
// is learned here.
func (k *DeviceKeys) used(p Principal) {
	k.mu.Lock()
	defer k.mu.Unlock()
	dk, ok := k.byID[p.KeyID]
	if ok && (dk.Used || dk.Reset) {
		return
	}
	if !ok {
		dk = &deviceKey{KeyID: p.KeyID, HardwareID: strings.Clone(p.HardwareID), CreatedAt: k.now().UTC()}
		k.index(dk)
	}
	dk.Used = true
	if err := k.save(dk); err != nil {
		k.logger.Warn("recording a device key's first use", "hardware_id", dk.HardwareID, "key_id", dk.KeyID, "err", err)
	}
}

// Enroll issues hw its device key when the policy enrolls and hw holds
// none: the raw key (to be shown once, in the registration answer) and its
// key_id. It returns "" when hw gets no key. The key's hash is on disk
// when it returns.
func (k *DeviceKeys) Enroll(hw string) (raw, keyID string, err error) {
	if k.policy == DeviceKeysOff {
		return "", "", nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.byHW[hw]) > 0 {
		return "", "", nil
	}
	raw, info, err := cloud.NewKey(k.peppers.Current, k.now())
	if err != nil {
		return "", "", err
	}
	dk := &deviceKey{KeyID: info.KeyID, HardwareID: strings.Clone(hw), Hash: info.Hash, CreatedAt: info.CreatedAt,
		Minted: true}
	if err := k.save(dk); err != nil {
		return "", "", fmt.Errorf("saving the device key of %s: %w", hw, err)
	}
	k.index(dk)
	k.enrolled.Inc()
	k.logger.Info("device enrolled: device key issued", "hardware_id", hw, "key_id", dk.KeyID)
	return raw, dk.KeyID, nil
}

// Reset revokes hw's device keys (at once here; in api_keys through the
// uplink) so that the device can enroll again. It returns the key_ids
// revoked, none when hw held no key.
func (k *DeviceKeys) Reset(hw string) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ids []string
	now := k.now().UTC()
	for _, dk := range k.byHW[hw] {
		dk.Reset, dk.ResetAt = true, now
		if err := k.save(dk); err != nil {
			dk.Reset, dk.ResetAt = false, time.Time{}
			return ids, fmt.Errorf("saving the reset of %s's device key %s: %w", hw, dk.KeyID, err)
		}
		ids = append(ids, dk.KeyID)
	}
	delete(k.byHW, hw)
	if len(ids) > 0 {
		k.logger.Info("device key reset by an operator: the device may enroll again", "hardware_id", hw, "key_ids", ids)
	}
	return ids, nil
}

// lost records that api_keys no longer holds a key issued here: it is
// written again by the uplink.
func (k *DeviceKeys) lost(keyID string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	dk, ok := k.byID[keyID]
	if !ok || !dk.Minted || !dk.Written || dk.Reset {
		return
	}
	dk.Written = false
	k.logger.Warn("a device key issued here is missing from api_keys; writing it again", "hardware_id", dk.HardwareID,
		"key_id", dk.KeyID)
	if err := k.save(dk); err != nil {
		k.logger.Warn("recording a device key to write again", "key_id", dk.KeyID, "err", err)
	}
}

// State returns hw's device key state; ok is false when it has no key.
func (k *DeviceKeys) State(hw string) (s registry.KeyState, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, dk := range k.byHW[hw] {
		s.KeyIDs = append(s.KeyIDs, dk.KeyID)
		s.Used = s.Used || dk.Used
		s.CloudPending = s.CloudPending || (dk.Minted && !dk.Written)
	}
	sort.Strings(s.KeyIDs)
	return s, len(s.KeyIDs) > 0
}

// PendingKeyWrites returns the keys to write to api_keys: issued here and
// not written, or reset and not yet revoked there (the uplink's KeySource).
// limit 0 means all.
func (k *DeviceKeys) PendingKeyWrites(limit int) []cloud.KeyWrite {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []cloud.KeyWrite
	for _, dk := range k.byID {
		switch {
		case dk.Reset && !dk.ResetWritten:
			out = append(out, cloud.KeyWrite{Key: dk.info(), Revoked: true})
		case dk.Minted && !dk.Written && !dk.Reset:
			out = append(out, cloud.KeyWrite{Key: dk.info()})
		default:
			continue
		}
		if len(out) == limit {
			break
		}
	}
	return out
}

// KeyWritten records that w is in api_keys (the uplink's KeySource).
func (k *DeviceKeys) KeyWritten(w cloud.KeyWrite) {
	k.mu.Lock()
	defer k.mu.Unlock()
	dk, ok := k.byID[w.Key.KeyID]
	if !ok {
		return
	}
	if w.Revoked {
		dk.ResetWritten = true
	} else {
		dk.Written, dk.WrittenAt = true, k.now()
	}
	if err := k.save(dk); err != nil {
		// Written again next round: both writes are idempotent.
		k.logger.Warn("recording a device key written to api_keys", "key_id", dk.KeyID, "err", err)
	}
}

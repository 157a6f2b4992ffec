package auth

import (
	"container/list"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"greenhouse-gateway/internal/cloud"
)

// Authentication errors.
var (
	// ErrUnauthorized means the key is unknown or revoked.
	ErrUnauthorized = errors.New("gateway: unknown or revoked API key")
	// ErrAuthUnavailable means the key is not cached and the api_keys table
	// cannot be reached to check it.
	ErrAuthUnavailable = errors.New("gateway: API key cannot be verified now")
)

// KeyStore is the api_keys table (cloud.Keys).
type KeyStore interface {
	// LookupHash finds the key stored with a peppered hash.
	LookupHash(ctx context.Context, hash string) (cloud.KeyInfo, bool, error)
	// TouchLastUsed records a use of the key.
	TouchLastUsed(ctx context.Context, keyID string, t time.Time) error
	// Rehash replaces the key's hash after a pepper rotation.
	Rehash(ctx context.Context, keyID, oldHash, newHash string) error
}

// Peppers are the secrets mixed into API key hashes. Previous, when set,
// is the pepper being rotated out: a key still stored under it is
// accepted and rehashed under Current at its first use.
type Peppers struct {
	Current  string
	Previous string
}

// StateStore keeps small durable records (the buffer).
type StateStore interface {
	LoadState(name string) ([]byte, error)
	SaveState(name string, value []byte) error
	// SubmitStates queues records and returns the wait for them to be on
	// disk; saves are written in the order they were submitted.
	SubmitStates(records map[string][]byte) (wait func() error, err error)
}

// AuthConfig configures API key verification.
type AuthConfig struct {
	// RefreshInterval is how long a verified key is trusted before it is
	// checked against api_keys again (so revocations take effect). While
	// the table cannot be reached, cached keys stay valid. Default 60s.
	RefreshInterval time.Duration `yaml:"refresh_interval"`
	// NegativeTTL is how long an unknown key is remembered as unknown,
	// sparing the table from repeated lookups. Default 30s.
	NegativeTTL time.Duration `yaml:"negative_ttl"`
	// LookupTimeout bounds one api_keys lookup. Default 5s.
	LookupTimeout time.Duration `yaml:"lookup_timeout"`
	// LastUsedInterval is the most often a key's last_used_at is written.
	// Default 5m.
	LastUsedInterval time.Duration `yaml:"last_used_interval"`
	// MaxLookupsPerSecond caps the api_keys lookups of keys the gateway
	// does not know yet (a burst of twice as many is allowed); beyond it
	// such keys are answered "unavailable" (MQTT server unavailable, HTTP
	// 503) and the device retries. Known keys are never held back. Bounds
	// what a flood of made-up keys costs the table. Default 20.
	MaxLookupsPerSecond int `yaml:"max_lookups_per_second"`
	// DeviceKeys is the device key policy: off, preferred or required
	// (see DeviceKeysOff and the others). Default preferred: devices that
	// register with a fleet key are issued their own key, and once they
	// use it nobody else's fleet key acts for them, while firmware that
	// ignores the key keeps working with the fleet key.
	DeviceKeys string `yaml:"device_keys"`
}

func (c AuthConfig) withDefaults() AuthConfig {
	if c.RefreshInterval == 0 {
		c.RefreshInterval = time.Minute
	}
	if c.NegativeTTL == 0 {
		c.NegativeTTL = 30 * time.Second
	}
	if c.LookupTimeout == 0 {
		c.LookupTimeout = 5 * time.Second
	}
	if c.LastUsedInterval == 0 {
		c.LastUsedInterval = 5 * time.Minute
	}
	if c.MaxLookupsPerSecond == 0 {
		c.MaxLookupsPerSecond = defaultMaxLookupsPerSecond
	}
	if c.DeviceKeys == "" {
		c.DeviceKeys = DeviceKeysPreferred
	}
	return c
}

// Validate reports the first invalid field.
func (c AuthConfig) Validate() error {
	for _, d := range []struct {
		setting string
		value   time.Duration
	}{
		{"auth.refresh_interval", c.RefreshInterval}, {"auth.negative_ttl", c.NegativeTTL},
		{"auth.lookup_timeout", c.LookupTimeout}, {"auth.last_used_interval", c.LastUsedInterval},
	} {
		if d.value < 0 {
			return fmt.Errorf("%s: must not be negative", d.setting)
		}
	}
	if c.MaxLookupsPerSecond < 0 {
		return errors.New("auth.max_lookups_per_second: must not be negative")
	}
	if c.DeviceKeys != "" {
		return validDeviceKeyPolicy(c.DeviceKeys)
	}
	return nil
}

const (
	// defaultMaxLookupsPerSecond is AuthConfig.MaxLookupsPerSecond's
	// default.
	defaultMaxLookupsPerSecond = 20
	// maxUnknownKeys caps the unknown keys remembered; beyond it the
	// oldest is forgotten (and looked up again if it comes back).
	maxUnknownKeys = 16384
)

// authStateName is the state record holding the key cache.
const authStateName = "api_key_cache"

// unknownKey is a key hash that api_keys does not hold, remembered until
// until; elem is its place in Authenticator.unknownQ.
type unknownKey struct {
	until time.Time
	elem  *list.Element
}

type cachedKey struct {
	KeyID      string    `json:"key_id"`
	HardwareID string    `json:"hardware_id,omitempty"` // a device key's binding
	Active     bool      `json:"active"`
	CheckedAt  time.Time `json:"checked_at"`
}

// Authenticator verifies device API keys against api_keys, through a cache
// that is kept on disk so that known devices keep working while the cloud
// is unreachable, across restarts too. Keys are held by their peppered
// hash only, and never logged.
type Authenticator struct {
	cfg     AuthConfig
	peppers Peppers
	keys    KeyStore
	state   StateStore
	logger  *slog.Logger
	now     func() time.Time

	mu       sync.Mutex
	cache    map[string]cachedKey  // by hash
	unknown  map[string]unknownKey // by hash
	unknownQ list.List             // the hashes of unknown, oldest first (one TTL: also soonest to expire)
	lookups  *tokenBucket          // lookups of keys not cached
	inflight map[string]chan struct{}
	touched  map[string]time.Time // key_id → last_used_at written
	// touches queues the last_used_at writes for Run.
	touches chan keyUse
	// local knows the device keys issued here, before api_keys does, and
	// those an operator reset (nil: none).
	local *DeviceKeys

	outcomes *prometheus.CounterVec
}

// NewAuthenticator returns an authenticator with an empty cache; it reads
// nothing (Load reads the saved cache). local makes it accept the device
// keys issued here before they reach api_keys, and refuse those reset; nil:
// none.
func NewAuthenticator(cfg AuthConfig, peppers Peppers, keys KeyStore, state StateStore, local *DeviceKeys,
	logger *slog.Logger, reg prometheus.Registerer) (*Authenticator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if peppers.Current == "" {
		return nil, errors.New("auth: the API key pepper is empty")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	a := &Authenticator{
		cfg: cfg.withDefaults(), peppers: peppers, keys: keys, state: state, local: local,
		logger: logger.With("component", "auth"), now: time.Now,
		cache: map[string]cachedKey{}, unknown: map[string]unknownKey{}, inflight: map[string]chan struct{}{},
		touched: map[string]time.Time{}, touches: make(chan keyUse, maxQueuedTouches),
		lookups: newTokenBucket(float64(cfg.withDefaults().MaxLookupsPerSecond)),
		outcomes: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "auth", Name: "verifications_total",
			Help: "API key verifications, by result (ok, ok_cached_offline, unauthorized, unavailable, throttled: a lookup of an unknown key over auth.max_lookups_per_second).",
		}, []string{"result"}),
	}
	for _, r := range []string{"ok", "ok_cached_offline", "unauthorized", "unavailable", "throttled"} {
		a.outcomes.WithLabelValues(r) // every series from the start
	}
	return a, nil
}

// Load reads the cache of verified keys saved in the state store. Call it
// once, before the authenticator is used.
func (a *Authenticator) Load() error {
	raw, err := a.state.LoadState(authStateName)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if raw != nil {
		if err := json.Unmarshal(raw, &a.cache); err != nil {
			a.logger.Warn("discarding unreadable API key cache", "err", err)
			a.cache = map[string]cachedKey{}
		}
	}
	return nil
}

// Verify checks a raw API key. It returns nil for an active key,
// ErrUnauthorized for an unknown or revoked one, and ErrAuthUnavailable
// when the key is not cached and the table cannot be reached.
func (a *Authenticator) Verify(ctx context.Context, rawKey string) error {
	_, err := a.Identify(ctx, rawKey)
	return err
}

// Identify is Verify, returning who the key is when it is active: its ID
// (the api_keys key_id, which names a key without revealing it) and, for
// a device key, the hardware_id it is bound to.
func (a *Authenticator) Identify(ctx context.Context, rawKey string) (Principal, error) {
	if rawKey == "" {
		a.outcomes.WithLabelValues("unauthorized").Inc()
		return Principal{}, ErrUnauthorized
	}
	hash := cloud.HashKey(a.peppers.Current, rawKey)
	var local localKey
	var known bool
	if a.local != nil {
		prev := ""
		if a.peppers.Previous != "" {
			prev = cloud.HashKey(a.peppers.Previous, rawKey)
		}
		local, known = a.local.local(hash, prev)
		switch {
		case known && local.reset:
			a.outcomes.WithLabelValues("unauthorized").Inc()
			return Principal{}, ErrUnauthorized
		case known && local.pending:
			// Issued here and not in api_keys yet: nothing to ask.
			a.outcomes.WithLabelValues("ok").Inc()
			return local.p, nil
		}
	}
	for {
		a.mu.Lock()
		now := a.now()
		k, cached := a.cache[hash]
		if cached && now.Sub(k.CheckedAt) < a.cfg.RefreshInterval {
			a.mu.Unlock()
			return a.result(k, "ok")
		}
		if u, ok := a.unknown[hash]; ok && now.Before(u.until) && !known {
			a.mu.Unlock()
			a.outcomes.WithLabelValues("unauthorized").Inc()
			return Principal{}, ErrUnauthorized
		}
		if wait, busy := a.inflight[hash]; busy {
			// Another connection is looking this key up: use its answer,
			// which costs the table nothing and so takes no lookup token: a
			// fleet sharing one key connecting at once waits for one lookup.
			a.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return Principal{}, ctx.Err()
			}
		}
		if !cached && !known && !a.lookups.take(now) {
			a.mu.Unlock()
			a.outcomes.WithLabelValues("throttled").Inc()
			return Principal{}, fmt.Errorf("%w: more than auth.max_lookups_per_second (%d) lookups of unknown keys",
				ErrAuthUnavailable, a.cfg.MaxLookupsPerSecond)
		}
		done := make(chan struct{})
		a.inflight[hash] = done
		a.mu.Unlock()

		var fallback *localKey
		if known {
			fallback = &local
		}
		p, err := a.refresh(ctx, hash, rawKey, k, cached, fallback)

		a.mu.Lock()
		delete(a.inflight, hash)
		close(done)
		a.mu.Unlock()
		return p, err
	}
}

// lookup finds a key by its hash under the current pepper, else under the
// previous one (rehashing it then).
func (a *Authenticator) lookup(ctx context.Context, hash, rawKey string) (cloud.KeyInfo, bool, error) {
	lctx, cancel := context.WithTimeout(ctx, a.cfg.LookupTimeout)
	defer cancel()
	info, found, err := a.keys.LookupHash(lctx, hash)
	if err != nil || found || a.peppers.Previous == "" {
		return info, found && sameHash(info.Hash, hash), err
	}
	old := cloud.HashKey(a.peppers.Previous, rawKey)
	info, found, err = a.keys.LookupHash(lctx, old)
	if err != nil || !found || !sameHash(info.Hash, old) {
		return info, false, err
	}
	if info.Active {
		if err := a.keys.Rehash(lctx, info.KeyID, old, hash); err != nil {
			a.logger.Warn("API key kept its previous-pepper hash; rehashing failed", "key_id", info.KeyID, "err", err)
		} else {
			a.logger.Info("API key rehashed under the current pepper", "key_id", info.KeyID)
		}
	}
	return info, true, nil
}

// rememberUnknown records hash as unknown until NegativeTTL from now,
// forgetting the expired ones and, at maxUnknownKeys, the oldest. The
// caller holds a.mu.
func (a *Authenticator) rememberUnknown(hash string, now time.Time) {
	if k, ok := a.unknown[hash]; ok {
		a.unknownQ.Remove(k.elem)
	}
	for e := a.unknownQ.Front(); e != nil; e = a.unknownQ.Front() {
		h := e.Value.(string)
		if now.Before(a.unknown[h].until) && a.unknownQ.Len() < maxUnknownKeys {
			break
		}
		a.unknownQ.Remove(e)
		delete(a.unknown, h)
	}
	a.unknown[hash] = unknownKey{until: now.Add(a.cfg.NegativeTTL), elem: a.unknownQ.PushBack(hash)}
}

// sameHash compares hashes in constant time.
func sameHash(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// refresh looks the key up in api_keys and caches the answer. local, when
// not nil, is what the gateway knows of a key it issued and wrote there:
// it stands in when the table cannot be reached, and shortly after the
// write, when the table's index may not show the key yet.
func (a *Authenticator) refresh(ctx context.Context, hash, rawKey string, old cachedKey, cached bool, local *localKey) (Principal, error) {
	info, found, err := a.lookup(ctx, hash, rawKey)
	now := a.now()
	if err != nil {
		if cached {
			// The cloud is unreachable: trust what we knew, and ask again
			// only after another refresh interval, so that devices
			// reconnecting during an outage do not each wait for a lookup.
			a.mu.Lock()
			if k, ok := a.cache[hash]; ok {
				k.CheckedAt = now
				a.cache[hash] = k
			}
			a.mu.Unlock()
			return a.result(old, "ok_cached_offline")
		}
		if local != nil {
			return a.result(cachedKey{KeyID: local.p.KeyID, HardwareID: local.p.HardwareID, Active: true}, "ok_cached_offline")
		}
		a.logger.Warn("API key cannot be verified: not cached and the api_keys table is unreachable", "err", err)
		a.outcomes.WithLabelValues("unavailable").Inc()
		return Principal{}, fmt.Errorf("%w: %v", ErrAuthUnavailable, err)
	}
	if !found && local != nil {
		// Issued here, and api_keys does not hold it: just written (its
		// index may lag), or the item is gone (a table recreated, or
		// restored from a backup older than the key). This gateway is the
		// key's source: it writes it again. Revocation is is_active=false
		// (gatewayctl keys revoke, or a reset), never a missing item.
		if !local.fresh {
			a.local.lost(local.p.KeyID)
		}
		return a.result(cachedKey{KeyID: local.p.KeyID, HardwareID: local.p.HardwareID, Active: true}, "ok")
	}
	a.mu.Lock()
	changed := found || cached // a key unknown before and now adds nothing to save
	if !found {
		delete(a.cache, hash)
		a.rememberUnknown(hash, now)
	} else {
		a.cache[hash] = cachedKey{KeyID: info.KeyID, HardwareID: info.HardwareID, Active: info.Active, CheckedAt: now}
	}
	// The snapshot is submitted under the lock, so that snapshots are
	// written in the order they were taken, and waited for outside it.
	wait := func() error { return nil }
	var serr error
	if changed {
		var snapshot []byte
		if snapshot, serr = json.Marshal(a.cache); serr == nil {
			wait, serr = a.state.SubmitStates(map[string][]byte{authStateName: snapshot})
		}
	}
	a.mu.Unlock()
	if serr == nil {
		serr = wait()
	}
	if serr != nil {
		a.logger.Warn("saving the API key cache", "err", serr)
	}
	if cached && old.Active && (!found || !info.Active) {
		a.logger.Info("API key revoked; refusing it from now on", "key_id", old.KeyID)
	}
	return a.result(cachedKey{KeyID: info.KeyID, HardwareID: info.HardwareID, Active: found && info.Active}, "ok")
}

func (a *Authenticator) result(k cachedKey, okLabel string) (Principal, error) {
	if !k.Active || (a.local != nil && a.local.isReset(k.KeyID)) {
		a.outcomes.WithLabelValues("unauthorized").Inc()
		return Principal{}, ErrUnauthorized
	}
	a.outcomes.WithLabelValues(okLabel).Inc()
	a.touch(k.KeyID)
	return Principal{KeyID: k.KeyID, HardwareID: k.HardwareID}, nil
}

// keyUse is a key's use to record as its last_used_at.
type keyUse struct {
	keyID string
	at    time.Time
}

// maxQueuedTouches bounds the last_used_at writes waiting for Run; a use
// beyond it is written at the key's next use.
const maxQueuedTouches = 1024

// touch queues the write of the key's last_used_at, at most once per
// LastUsedInterval: a device's connection does not wait for it, and a
// failure only means the next use writes it.
func (a *Authenticator) touch(keyID string) {
	if keyID == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if last, ok := a.touched[keyID]; ok && now.Sub(last) < a.cfg.LastUsedInterval {
		return
	}
	select {
	case a.touches <- keyUse{keyID: keyID, at: now}:
		a.touched[keyID] = now
	default:
	}
}

// Run writes the last_used_at of the keys used, each in its own goroutine
// (bounded by auth.lookup_timeout), until ctx is done; it then waits for
// the writes in progress. Without Run, uses are verified but not recorded
// in api_keys.
func (a *Authenticator) Run(ctx context.Context) error {
	var writes sync.WaitGroup
	defer writes.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-a.touches:
			writes.Go(func() { a.writeLastUsed(u) })
		}
	}
}

// writeLastUsed writes u to api_keys; after a failure the key's next use
// tries again.
func (a *Authenticator) writeLastUsed(u keyUse) {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.LookupTimeout)
	defer cancel()
	if err := a.keys.TouchLastUsed(ctx, u.keyID, u.at); err != nil {
		a.logger.Debug("recording an API key's last use", "key_id", u.keyID, "err", err)
		a.mu.Lock()
		delete(a.touched, u.keyID)
		a.mu.Unlock()
	}
}

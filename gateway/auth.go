package gateway

import (
	"context"
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

// KeyLookup finds an API key in the api_keys table (cloud.Keys).
type KeyLookup interface {
	Lookup(ctx context.Context, rawKey string) (cloud.KeyInfo, bool, error)
}

// StateStore keeps small durable records (the buffer).
type StateStore interface {
	LoadState(name string) ([]byte, error)
	SaveState(name string, value []byte) error
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
	return c
}

// Validate reports the first invalid field.
func (c AuthConfig) Validate() error {
	if c.RefreshInterval < 0 || c.NegativeTTL < 0 || c.LookupTimeout < 0 {
		return errors.New("auth: durations must not be negative")
	}
	return nil
}

// authStateName is the state record holding the key cache.
const authStateName = "api_key_cache"

type cachedKey struct {
	KeyID     string    `json:"key_id"`
	Active    bool      `json:"active"`
	CheckedAt time.Time `json:"checked_at"`
}

// Authenticator verifies device API keys against api_keys, through a cache
// that is kept on disk so that known devices keep working while the cloud
// is unreachable, across restarts too. Keys are held by their peppered
// hash only.
type Authenticator struct {
	cfg    AuthConfig
	pepper string
	lookup KeyLookup
	state  StateStore
	logger *slog.Logger
	now    func() time.Time

	mu       sync.Mutex
	keys     map[string]cachedKey // by hash
	unknown  map[string]time.Time // hash → until
	inflight map[string]chan struct{}

	outcomes *prometheus.CounterVec
}

// NewAuthenticator returns an authenticator and loads its saved cache.
func NewAuthenticator(cfg AuthConfig, pepper string, lookup KeyLookup, state StateStore, logger *slog.Logger, reg prometheus.Registerer) (*Authenticator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pepper == "" {
		return nil, errors.New("auth: the API key pepper is empty")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	a := &Authenticator{
		cfg: cfg.withDefaults(), pepper: pepper, lookup: lookup, state: state,
		logger: logger.With("component", "auth"), now: time.Now,
		keys: map[string]cachedKey{}, unknown: map[string]time.Time{}, inflight: map[string]chan struct{}{},
		outcomes: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "gateway", Subsystem: "auth", Name: "verifications_total",
			Help: "API key verifications, by result (ok, ok_cached_offline, unauthorized, unavailable).",
		}, []string{"result"}),
	}
	raw, err := state.LoadState(authStateName)
	if err != nil {
		return nil, err
	}
	if raw != nil {
		if err := json.Unmarshal(raw, &a.keys); err != nil {
			a.logger.Warn("discarding unreadable API key cache", "err", err)
			a.keys = map[string]cachedKey{}
		}
	}
	return a, nil
}

// Verify checks a raw API key. It returns nil for an active key,
// ErrUnauthorized for an unknown or revoked one, and ErrAuthUnavailable
// when the key is not cached and the table cannot be reached.
func (a *Authenticator) Verify(ctx context.Context, rawKey string) error {
	if rawKey == "" {
		a.outcomes.WithLabelValues("unauthorized").Inc()
		return ErrUnauthorized
	}
	hash := cloud.HashKey(a.pepper, rawKey)
	for {
		a.mu.Lock()
		now := a.now()
		k, cached := a.keys[hash]
		if cached && now.Sub(k.CheckedAt) < a.cfg.RefreshInterval {
			a.mu.Unlock()
			return a.result(k.Active, "ok")
		}
		if until, ok := a.unknown[hash]; ok && now.Before(until) {
			a.mu.Unlock()
			a.outcomes.WithLabelValues("unauthorized").Inc()
			return ErrUnauthorized
		}
		if wait, busy := a.inflight[hash]; busy {
			// Another connection is looking this key up: use its answer.
			a.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		done := make(chan struct{})
		a.inflight[hash] = done
		a.mu.Unlock()

		err := a.refresh(ctx, hash, rawKey, k, cached)

		a.mu.Lock()
		delete(a.inflight, hash)
		close(done)
		a.mu.Unlock()
		return err
	}
}

func (a *Authenticator) refresh(ctx context.Context, hash, rawKey string, old cachedKey, cached bool) error {
	lctx, cancel := context.WithTimeout(ctx, a.cfg.LookupTimeout)
	info, found, err := a.lookup.Lookup(lctx, rawKey)
	cancel()
	now := a.now()
	if err != nil {
		if cached {
			// The cloud is unreachable: trust what we knew.
			return a.result(old.Active, "ok_cached_offline")
		}
		a.logger.Warn("API key cannot be verified: not cached and the api_keys table is unreachable", "err", err)
		a.outcomes.WithLabelValues("unavailable").Inc()
		return fmt.Errorf("%w: %v", ErrAuthUnavailable, err)
	}
	a.mu.Lock()
	if !found {
		delete(a.keys, hash)
		a.unknown[hash] = now.Add(a.cfg.NegativeTTL)
		for h, until := range a.unknown {
			if now.After(until) {
				delete(a.unknown, h)
			}
		}
	} else {
		a.keys[hash] = cachedKey{KeyID: info.KeyID, Active: info.Active, CheckedAt: now}
	}
	snapshot, merr := json.Marshal(a.keys)
	a.mu.Unlock()
	if merr == nil {
		if err := a.state.SaveState(authStateName, snapshot); err != nil {
			a.logger.Warn("saving the API key cache", "err", err)
		}
	}
	if cached && old.Active && (!found || !info.Active) {
		a.logger.Info("API key revoked; refusing it from now on", "key_id", old.KeyID)
	}
	return a.result(found && info.Active, "ok")
}

func (a *Authenticator) result(active bool, okLabel string) error {
	if !active {
		a.outcomes.WithLabelValues("unauthorized").Inc()
		return ErrUnauthorized
	}
	a.outcomes.WithLabelValues(okLabel).Inc()
	return nil
}

package function

import (
	"context"
	"net/http"
	"time"

	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// lastUsedInterval is the least time between two last_used_at writes of a
// key (schema 002).
const lastUsedInterval = 5 * time.Minute

// maxTouched bounds the keys whose last_used_at writes an environment
// remembers.
const maxTouched = 10000

// authenticate finds the active key of raw in api_keys (peppered SHA-256
// through api_key_hash_index) and records its use, at most once per
// lastUsedInterval; the answer is set when the request is refused.
func (f *Function) authenticate(ctx context.Context, raw string) (cloud.KeyInfo, *answer) {
	unauthorized := requestError(http.StatusUnauthorized, "missing, unknown or revoked API key (Authorization: Bearer KEY)")
	if raw == "" {
		return cloud.KeyInfo{}, &unauthorized
	}
	info, found, err := f.keys.Lookup(ctx, raw)
	if err != nil {
		f.logger.Warn("an API key could not be verified", "err", err)
		code := http.StatusServiceUnavailable
		if tablewrite.Throttling(err) {
			code = http.StatusTooManyRequests
		}
		a := requestError(code, "the API key cannot be verified now; retry later")
		return cloud.KeyInfo{}, &a
	}
	if !found || !info.Active {
		return cloud.KeyInfo{}, &unauthorized
	}
	f.touch(ctx, info)
	return info, nil
}

// touch writes the key's last_used_at when the stored one, and this
// environment's last write, are lastUsedInterval old. A failed write is
// logged; the request goes on.
func (f *Function) touch(ctx context.Context, info cloud.KeyInfo) {
	now := f.now()
	f.mu.Lock()
	last := info.LastUsedAt
	if t := f.touched[info.KeyID]; t.After(last) {
		last = t
	}
	if now.Sub(last) < lastUsedInterval {
		f.mu.Unlock()
		return
	}
	if len(f.touched) >= maxTouched {
		clear(f.touched)
	}
	f.touched[info.KeyID] = now
	f.mu.Unlock()
	if err := f.keys.TouchLastUsed(ctx, info.KeyID, now); err != nil {
		f.logger.Warn("last_used_at not written", "key_id", info.KeyID, "err", err)
	}
}

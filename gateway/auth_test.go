package gateway_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway"
	"greenhouse-gateway/internal/cloud"
)

func TestAuthenticatorRevocationOutageAndRestart(t *testing.T) {
	dir := t.TempDir()
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	keys := newFakeKeys()
	// Refresh on every verification, so revocation shows at once.
	cfg := gateway.AuthConfig{RefreshInterval: time.Nanosecond, NegativeTTL: time.Hour}
	auth, err := gateway.NewAuthenticator(cfg, gateway.Peppers{Current: pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	ctx := context.Background()

	require.NoError(t, auth.Verify(ctx, goodKey))
	require.ErrorIs(t, auth.Verify(ctx, otherKey), gateway.ErrUnauthorized)
	hits := keys.hits
	require.ErrorIs(t, auth.Verify(ctx, otherKey), gateway.ErrUnauthorized)
	require.Equal(t, hits, keys.hits, "an unknown key is remembered, not looked up again")

	// The table is unreachable: the known key keeps working, even after a
	// restart of the gateway (the cache is on disk).
	keys.set(func(f *fakeKeys) { f.down = true })
	require.NoError(t, auth.Verify(ctx, goodKey))
	require.NoError(t, buf.Close())
	buf, err = buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	auth, err = gateway.NewAuthenticator(cfg, gateway.Peppers{Current: pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	require.NoError(t, auth.Verify(ctx, goodKey))
	require.ErrorIs(t, auth.Verify(ctx, otherKey), gateway.ErrAuthUnavailable)

	// Back online, the key is revoked: refused from the next refresh on.
	keys.set(func(f *fakeKeys) {
		f.down = false
		k := f.keys["k1"]
		k.Active = false
		f.keys["k1"] = k
	})
	require.ErrorIs(t, auth.Verify(ctx, goodKey), gateway.ErrUnauthorized)
	keys.set(func(f *fakeKeys) { f.down = true })
	require.ErrorIs(t, auth.Verify(ctx, goodKey), gateway.ErrUnauthorized, "revocation is remembered offline")
}

func TestAuthenticatorSharesConcurrentLookups(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	slow := &slowKeys{release: make(chan struct{})}
	auth, err := gateway.NewAuthenticator(gateway.AuthConfig{}, gateway.Peppers{Current: pepper}, slow, buf, nil, nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := auth.Verify(context.Background(), goodKey); err != nil {
				t.Error(err)
			}
		}()
	}
	require.Eventually(t, func() bool { return slow.calls.Load() >= 1 }, 10*time.Second, time.Millisecond)
	close(slow.release)
	wg.Wait()
	require.EqualValues(t, 1, slow.calls.Load(), "twenty devices reconnecting with one key cost one lookup")
}

type slowKeys struct {
	release chan struct{}
	calls   atomic.Int64
}

func (s *slowKeys) LookupHash(ctx context.Context, hash string) (cloud.KeyInfo, bool, error) {
	s.calls.Add(1)
	<-s.release
	return cloud.KeyInfo{KeyID: "k", Hash: hash, Active: true}, true, nil
}

func (s *slowKeys) TouchLastUsed(context.Context, string, time.Time) error { return nil }
func (s *slowKeys) Rehash(context.Context, string, string, string) error   { return nil }

func TestPepperRotationRehashesOnUse(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	keys := newFakeKeys() // goodKey stored under "test-pepper"
	auth, err := gateway.NewAuthenticator(gateway.AuthConfig{}, gateway.Peppers{Current: "new-pepper", Previous: pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	require.NoError(t, auth.Verify(context.Background(), goodKey))
	keys.mu.Lock()
	require.Equal(t, cloud.HashKey("new-pepper", goodKey), keys.keys["k1"].Hash, "rehashed under the new pepper")
	keys.mu.Unlock()

	// Once every key is rehashed the previous pepper can go.
	auth, err = gateway.NewAuthenticator(gateway.AuthConfig{}, gateway.Peppers{Current: "new-pepper"}, keys, buf, nil, nil)
	require.NoError(t, err)
	require.NoError(t, auth.Verify(context.Background(), goodKey))
	require.ErrorIs(t, auth.Verify(context.Background(), otherKey), gateway.ErrUnauthorized)
}

func TestLastUsedIsWrittenAtMostOncePerInterval(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	keys := newFakeKeys()
	auth, err := gateway.NewAuthenticator(gateway.AuthConfig{RefreshInterval: time.Nanosecond}, gateway.Peppers{Current: pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	for range 50 {
		require.NoError(t, auth.Verify(context.Background(), goodKey))
	}
	require.Eventually(t, func() bool {
		keys.mu.Lock()
		defer keys.mu.Unlock()
		return keys.touched["k1"] == 1
	}, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	keys.mu.Lock()
	defer keys.mu.Unlock()
	require.Equal(t, 1, keys.touched["k1"], "fifty uses within five minutes write last_used_at once")
}

// TestAuthenticatorIdentify checks that Identify names the key by its ID,
// fresh, cached and while the table is unreachable, and names no key it
// refuses.
func TestAuthenticatorIdentify(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	keys := newFakeKeys()
	auth, err := gateway.NewAuthenticator(gateway.AuthConfig{RefreshInterval: time.Nanosecond}, gateway.Peppers{Current: pepper},
		keys, buf, nil, nil)
	require.NoError(t, err)
	ctx := context.Background()
	for _, down := range []bool{false, true} {
		keys.mu.Lock()
		keys.down = down
		keys.mu.Unlock()
		p, err := auth.Identify(ctx, goodKey)
		require.NoError(t, err)
		require.Equal(t, gateway.Principal{KeyID: "k1"}, p, "table down: %v", down)
		p, err = auth.Identify(ctx, boundKey)
		require.NoError(t, err)
		require.Equal(t, gateway.Principal{KeyID: "kB", HardwareID: hwBound}, p, "a device key is bound; table down: %v", down)
	}
	id, err := auth.Identify(ctx, otherKey)
	require.ErrorIs(t, err, gateway.ErrAuthUnavailable)
	require.Zero(t, id)
	keys.mu.Lock()
	keys.down = false
	keys.mu.Unlock()
	id, err = auth.Identify(ctx, otherKey)
	require.ErrorIs(t, err, gateway.ErrUnauthorized)
	require.Zero(t, id)
}

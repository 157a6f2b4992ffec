package auth_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/internal/cloud"
)

func TestAuthenticatorRevocationOutageAndRestart(t *testing.T) {
	dir := t.TempDir()
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	keys := gatewaytest.NewFakeKeys()
	// Refresh on every verification, so revocation shows at once.
	cfg := auth.AuthConfig{RefreshInterval: time.Nanosecond, NegativeTTL: time.Hour}
	authn, err := auth.NewAuthenticator(cfg, auth.Peppers{Current: gatewaytest.Pepper}, keys, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	ctx := context.Background()

	require.NoError(t, authn.Verify(ctx, gatewaytest.GoodKey))
	require.ErrorIs(t, authn.Verify(ctx, gatewaytest.OtherKey), auth.ErrUnauthorized)
	hits := keys.Hits
	require.ErrorIs(t, authn.Verify(ctx, gatewaytest.OtherKey), auth.ErrUnauthorized)
	require.Equal(t, hits, keys.Hits, "an unknown key is remembered, not looked up again")

	// The table is unreachable: the known key keeps working, even after a
	// restart of the gateway (the cache is on disk).
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Down = true })
	require.NoError(t, authn.Verify(ctx, gatewaytest.GoodKey))
	require.NoError(t, buf.Close())
	buf, err = buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	authn, err = auth.NewAuthenticator(cfg, auth.Peppers{Current: gatewaytest.Pepper}, keys, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	require.NoError(t, authn.Verify(ctx, gatewaytest.GoodKey))
	require.ErrorIs(t, authn.Verify(ctx, gatewaytest.OtherKey), auth.ErrAuthUnavailable)

	// Back online, the key is revoked: refused from the next refresh on.
	keys.Set(func(f *gatewaytest.FakeKeys) {
		f.Down = false
		k := f.Keys["k1"]
		k.Active = false
		f.Keys["k1"] = k
	})
	require.ErrorIs(t, authn.Verify(ctx, gatewaytest.GoodKey), auth.ErrUnauthorized)
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Down = true })
	require.ErrorIs(t, authn.Verify(ctx, gatewaytest.GoodKey), auth.ErrUnauthorized, "revocation is remembered offline")
}

func TestAuthenticatorSharesConcurrentLookups(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	slow := &slowKeys{release: make(chan struct{})}
	authn, err := auth.NewAuthenticator(auth.AuthConfig{}, auth.Peppers{Current: gatewaytest.Pepper}, slow, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := authn.Verify(context.Background(), gatewaytest.GoodKey); err != nil {
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
	keys := gatewaytest.NewFakeKeys() // gatewaytest.GoodKey stored under "test-pepper"
	authn, err := auth.NewAuthenticator(auth.AuthConfig{}, auth.Peppers{Current: "new-pepper", Previous: gatewaytest.Pepper}, keys, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	require.NoError(t, authn.Verify(context.Background(), gatewaytest.GoodKey))
	keys.Mu.Lock()
	require.Equal(t, cloud.HashKey("new-pepper", gatewaytest.GoodKey), keys.Keys["k1"].Hash, "rehashed under the new pepper")
	keys.Mu.Unlock()

	// Once every key is rehashed the previous pepper can go.
	authn, err = auth.NewAuthenticator(auth.AuthConfig{}, auth.Peppers{Current: "new-pepper"}, keys, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	require.NoError(t, authn.Verify(context.Background(), gatewaytest.GoodKey))
	require.ErrorIs(t, authn.Verify(context.Background(), gatewaytest.OtherKey), auth.ErrUnauthorized)
}

func TestLastUsedIsWrittenAtMostOncePerInterval(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	keys := gatewaytest.NewFakeKeys()
	authn, err := auth.NewAuthenticator(auth.AuthConfig{RefreshInterval: time.Nanosecond}, auth.Peppers{Current: gatewaytest.Pepper}, keys, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- authn.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-ran) }()
	for range 50 {
		require.NoError(t, authn.Verify(context.Background(), gatewaytest.GoodKey))
	}
	require.Eventually(t, func() bool {
		keys.Mu.Lock()
		defer keys.Mu.Unlock()
		return keys.Touched["k1"] == 1
	}, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	keys.Mu.Lock()
	defer keys.Mu.Unlock()
	require.Equal(t, 1, keys.Touched["k1"], "fifty uses within five minutes write last_used_at once")
}

// TestAuthenticatorIdentify checks that Identify names the key by its ID,
// fresh, cached and while the table is unreachable, and names no key it
// refuses.
func TestAuthenticatorIdentify(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	keys := gatewaytest.NewFakeKeys()
	authn, err := auth.NewAuthenticator(auth.AuthConfig{RefreshInterval: time.Nanosecond}, auth.Peppers{Current: gatewaytest.Pepper},
		keys, buf, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	ctx := context.Background()
	for _, down := range []bool{false, true} {
		keys.Mu.Lock()
		keys.Down = down
		keys.Mu.Unlock()
		p, err := authn.Identify(ctx, gatewaytest.GoodKey)
		require.NoError(t, err)
		require.Equal(t, auth.Principal{KeyID: "k1"}, p, "table down: %v", down)
		p, err = authn.Identify(ctx, gatewaytest.BoundKey)
		require.NoError(t, err)
		require.Equal(t, auth.Principal{KeyID: "kB", HardwareID: gatewaytest.HWBound}, p, "a device key is bound; table down: %v", down)
	}
	id, err := authn.Identify(ctx, gatewaytest.OtherKey)
	require.ErrorIs(t, err, auth.ErrAuthUnavailable)
	require.Zero(t, id)
	keys.Mu.Lock()
	keys.Down = false
	keys.Mu.Unlock()
	id, err = authn.Identify(ctx, gatewaytest.OtherKey)
	require.ErrorIs(t, err, auth.ErrUnauthorized)
	require.Zero(t, id)
}

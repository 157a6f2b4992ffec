package ingest_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/ingest"
	"greenhouse-gateway/internal/cloud"
)

func TestAuthenticatorRevocationOutageAndRestart(t *testing.T) {
	dir := t.TempDir()
	buf, err := buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	keys := gatewaytest.NewFakeKeys()
	// Refresh on every verification, so revocation shows at once.
	cfg := ingest.AuthConfig{RefreshInterval: time.Nanosecond, NegativeTTL: time.Hour}
	auth, err := ingest.NewAuthenticator(cfg, ingest.Peppers{Current: gatewaytest.Pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	ctx := context.Background()

	require.NoError(t, auth.Verify(ctx, gatewaytest.GoodKey))
	require.ErrorIs(t, auth.Verify(ctx, gatewaytest.OtherKey), ingest.ErrUnauthorized)
	hits := keys.Hits
	require.ErrorIs(t, auth.Verify(ctx, gatewaytest.OtherKey), ingest.ErrUnauthorized)
	require.Equal(t, hits, keys.Hits, "an unknown key is remembered, not looked up again")

	// The table is unreachable: the known key keeps working, even after a
	// restart of the gateway (the cache is on disk).
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Down = true })
	require.NoError(t, auth.Verify(ctx, gatewaytest.GoodKey))
	require.NoError(t, buf.Close())
	buf, err = buffer.Open(dir, buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	auth, err = ingest.NewAuthenticator(cfg, ingest.Peppers{Current: gatewaytest.Pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	require.NoError(t, auth.Verify(ctx, gatewaytest.GoodKey))
	require.ErrorIs(t, auth.Verify(ctx, gatewaytest.OtherKey), ingest.ErrAuthUnavailable)

	// Back online, the key is revoked: refused from the next refresh on.
	keys.Set(func(f *gatewaytest.FakeKeys) {
		f.Down = false
		k := f.Keys["k1"]
		k.Active = false
		f.Keys["k1"] = k
	})
	require.ErrorIs(t, auth.Verify(ctx, gatewaytest.GoodKey), ingest.ErrUnauthorized)
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Down = true })
	require.ErrorIs(t, auth.Verify(ctx, gatewaytest.GoodKey), ingest.ErrUnauthorized, "revocation is remembered offline")
}

func TestAuthenticatorSharesConcurrentLookups(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	slow := &slowKeys{release: make(chan struct{})}
	auth, err := ingest.NewAuthenticator(ingest.AuthConfig{}, ingest.Peppers{Current: gatewaytest.Pepper}, slow, buf, nil, nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := auth.Verify(context.Background(), gatewaytest.GoodKey); err != nil {
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
	auth, err := ingest.NewAuthenticator(ingest.AuthConfig{}, ingest.Peppers{Current: "new-pepper", Previous: gatewaytest.Pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	require.NoError(t, auth.Verify(context.Background(), gatewaytest.GoodKey))
	keys.Mu.Lock()
	require.Equal(t, cloud.HashKey("new-pepper", gatewaytest.GoodKey), keys.Keys["k1"].Hash, "rehashed under the new pepper")
	keys.Mu.Unlock()

	// Once every key is rehashed the previous pepper can go.
	auth, err = ingest.NewAuthenticator(ingest.AuthConfig{}, ingest.Peppers{Current: "new-pepper"}, keys, buf, nil, nil)
	require.NoError(t, err)
	require.NoError(t, auth.Verify(context.Background(), gatewaytest.GoodKey))
	require.ErrorIs(t, auth.Verify(context.Background(), gatewaytest.OtherKey), ingest.ErrUnauthorized)
}

func TestLastUsedIsWrittenAtMostOncePerInterval(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	keys := gatewaytest.NewFakeKeys()
	auth, err := ingest.NewAuthenticator(ingest.AuthConfig{RefreshInterval: time.Nanosecond}, ingest.Peppers{Current: gatewaytest.Pepper}, keys, buf, nil, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- auth.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-ran) }()
	for range 50 {
		require.NoError(t, auth.Verify(context.Background(), gatewaytest.GoodKey))
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
	auth, err := ingest.NewAuthenticator(ingest.AuthConfig{RefreshInterval: time.Nanosecond}, ingest.Peppers{Current: gatewaytest.Pepper},
		keys, buf, nil, nil)
	require.NoError(t, err)
	ctx := context.Background()
	for _, down := range []bool{false, true} {
		keys.Mu.Lock()
		keys.Down = down
		keys.Mu.Unlock()
		p, err := auth.Identify(ctx, gatewaytest.GoodKey)
		require.NoError(t, err)
		require.Equal(t, ingest.Principal{KeyID: "k1"}, p, "table down: %v", down)
		p, err = auth.Identify(ctx, gatewaytest.BoundKey)
		require.NoError(t, err)
		require.Equal(t, ingest.Principal{KeyID: "kB", HardwareID: gatewaytest.HWBound}, p, "a device key is bound; table down: %v", down)
	}
	id, err := auth.Identify(ctx, gatewaytest.OtherKey)
	require.ErrorIs(t, err, ingest.ErrAuthUnavailable)
	require.Zero(t, id)
	keys.Mu.Lock()
	keys.Down = false
	keys.Mu.Unlock()
	id, err = auth.Identify(ctx, gatewaytest.OtherKey)
	require.ErrorIs(t, err, ingest.ErrUnauthorized)
	require.Zero(t, id)
}

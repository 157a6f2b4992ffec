package auth_test

import (
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/harness/gatewaytest"
)

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countingState is a StateStore that counts saves.
type countingState struct {
	mu    sync.Mutex
	saves int
	data  map[string][]byte
}

func (s *countingState) LoadState(name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[name], nil
}

func (s *countingState) SaveState(name string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saves++
	s.data[name] = value
	return nil
}

func (s *countingState) SubmitStates(records map[string][]byte) (func() error, error) {
	for name, value := range records {
		if err := s.SaveState(name, value); err != nil {
			return nil, err
		}
	}
	return func() error { return nil }, nil
}

func (s *countingState) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saves
}

// TestUnknownKeyFloodIsBounded sends made-up keys as fast as a host on the
// LAN can: api_keys is asked at most auth.max_lookups_per_second (plus the
// burst), nothing is written to disk for them, and a known key keeps
// working throughout.
func TestUnknownKeyFloodIsBounded(t *testing.T) {
	keys := gatewaytest.NewFakeKeys()
	state := &countingState{data: map[string][]byte{}}
	authn, err := auth.NewAuthenticator(auth.AuthConfig{MaxLookupsPerSecond: 5}, auth.Peppers{Current: gatewaytest.Pepper},
		keys, state, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	now := time.Unix(1_700_000_000, 0)
	auth.SetAuthClock(authn, func() time.Time { return now })
	ctx := context.Background()
	require.NoError(t, authn.Verify(ctx, gatewaytest.GoodKey))
	saves, hits := state.count(), keys.Hits

	var unauthorized, unavailable int
	for i := range 200 {
		switch err := authn.Verify(ctx, fmt.Sprintf("made-up-key-%d", i)); {
		case errors.Is(err, auth.ErrUnauthorized):
			unauthorized++
		case errors.Is(err, auth.ErrAuthUnavailable):
			unavailable++
			require.ErrorContains(t, err, "auth.max_lookups_per_second")
		default:
			t.Fatalf("made-up key %d: %v", i, err)
		}
		require.NoError(t, authn.Verify(ctx, gatewaytest.GoodKey), "the known key keeps working")
	}
	require.Equal(t, 9, unauthorized, "the burst (twice the rate) less the known key's lookup")
	require.Equal(t, 191, unavailable)
	require.Equal(t, hits+9, keys.Hits, "api_keys asked only within the rate")
	require.Equal(t, saves, state.count(), "an unknown key writes nothing to disk")

	now = now.Add(time.Second) // five more tokens
	for i := range 5 {
		require.ErrorIs(t, authn.Verify(ctx, fmt.Sprintf("later-key-%d", i)), auth.ErrUnauthorized)
	}
	require.ErrorIs(t, authn.Verify(ctx, "later-key-5"), auth.ErrAuthUnavailable)
}

// TestUnknownKeysRememberedAreBounded checks that the unknown keys
// remembered expire, and never exceed their cap however many arrive.
func TestUnknownKeysRememberedAreBounded(t *testing.T) {
	keys := gatewaytest.NewFakeKeys()
	authn, err := auth.NewAuthenticator(auth.AuthConfig{MaxLookupsPerSecond: 1 << 30, NegativeTTL: time.Minute},
		auth.Peppers{Current: gatewaytest.Pepper}, keys, &countingState{data: map[string][]byte{}}, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	now := time.Unix(1_700_000_000, 0)
	auth.SetAuthClock(authn, func() time.Time { return now })
	ctx := context.Background()

	for i := range 100 {
		require.ErrorIs(t, authn.Verify(ctx, fmt.Sprintf("k-%d", i)), auth.ErrUnauthorized)
	}
	require.Equal(t, 100, auth.UnknownKeys(authn))
	hits := keys.Hits
	require.ErrorIs(t, authn.Verify(ctx, "k-7"), auth.ErrUnauthorized)
	require.Equal(t, hits, keys.Hits, "remembered, not looked up again")

	now = now.Add(time.Minute + time.Second)
	require.ErrorIs(t, authn.Verify(ctx, "k-7"), auth.ErrUnauthorized)
	require.Equal(t, hits+1, keys.Hits, "expired: looked up again")
	require.Equal(t, 1, auth.UnknownKeys(authn), "the expired ones are forgotten")

	for i := range auth.MaxUnknownKeys + 500 {
		require.ErrorIs(t, authn.Verify(ctx, fmt.Sprintf("flood-%d", i)), auth.ErrUnauthorized)
	}
	require.Equal(t, auth.MaxUnknownKeys, auth.UnknownKeys(authn), "capped, the oldest forgotten")
	hits = keys.Hits
	require.ErrorIs(t, authn.Verify(ctx, fmt.Sprintf("flood-%d", auth.MaxUnknownKeys+499)), auth.ErrUnauthorized)
	require.Equal(t, hits, keys.Hits, "the newest is still remembered")
	require.ErrorIs(t, authn.Verify(ctx, "flood-0"), auth.ErrUnauthorized)
	require.Equal(t, hits+1, keys.Hits, "the oldest was forgotten")
}

// TestConnectsWaitingForOneLookupAreNotThrottled has a fleet sharing one
// key the gateway has not cached verify it at once while the key's lookup
// is under way: they wait for that one lookup and take none of
// auth.max_lookups_per_second, so every one is accepted.
func TestConnectsWaitingForOneLookupAreNotThrottled(t *testing.T) {
	keys := gatewaytest.NewFakeKeys()
	authn, err := auth.NewAuthenticator(auth.AuthConfig{MaxLookupsPerSecond: 5}, auth.Peppers{Current: gatewaytest.Pepper},
		keys, &countingState{data: map[string][]byte{}}, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	now := time.Unix(1_700_000_000, 0)
	auth.SetAuthClock(authn, func() time.Time { return now })
	release := make(chan struct{})
	keys.Set(func(f *gatewaytest.FakeKeys) { f.Wait = release })
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- authn.Verify(ctx, gatewaytest.GoodKey) }()
	gatewaytest.WaitFor(t, 10*time.Second, "the first lookup under way", func() bool {
		keys.Mu.Lock()
		defer keys.Mu.Unlock()
		return keys.Waiting == 1
	})
	const fleet = 100 // over the burst of 10
	errs := make(chan error, fleet)
	var started sync.WaitGroup
	started.Add(fleet)
	for range fleet {
		go func() {
			started.Done()
			errs <- authn.Verify(ctx, gatewaytest.GoodKey)
		}()
	}
	started.Wait()
	close(release)
	require.NoError(t, <-first)
	for range fleet {
		require.NoError(t, <-errs)
	}
	keys.Mu.Lock()
	defer keys.Mu.Unlock()
	require.Equal(t, 1, keys.Hits, "lookups of the shared key")
}

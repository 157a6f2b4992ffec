package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/gateway"
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
	keys := newFakeKeys()
	state := &countingState{data: map[string][]byte{}}
	auth, err := gateway.NewAuthenticator(gateway.AuthConfig{MaxLookupsPerSecond: 5}, gateway.Peppers{Current: pepper},
		keys, state, nil, nil)
	require.NoError(t, err)
	now := time.Unix(1_700_000_000, 0)
	gateway.SetAuthClock(auth, func() time.Time { return now })
	ctx := context.Background()
	require.NoError(t, auth.Verify(ctx, goodKey))
	saves, hits := state.count(), keys.hits

	var unauthorized, unavailable int
	for i := range 200 {
		switch err := auth.Verify(ctx, fmt.Sprintf("made-up-key-%d", i)); {
		case errors.Is(err, gateway.ErrUnauthorized):
			unauthorized++
		case errors.Is(err, gateway.ErrAuthUnavailable):
			unavailable++
			require.ErrorContains(t, err, "auth.max_lookups_per_second")
		default:
			t.Fatalf("made-up key %d: %v", i, err)
		}
		require.NoError(t, auth.Verify(ctx, goodKey), "the known key keeps working")
	}
	require.Equal(t, 9, unauthorized, "the burst (twice the rate) less the known key's lookup")
	require.Equal(t, 191, unavailable)
	require.Equal(t, hits+9, keys.hits, "api_keys asked only within the rate")
	require.Equal(t, saves, state.count(), "an unknown key writes nothing to disk")

	now = now.Add(time.Second) // five more tokens
	for i := range 5 {
		require.ErrorIs(t, auth.Verify(ctx, fmt.Sprintf("later-key-%d", i)), gateway.ErrUnauthorized)
	}
	require.ErrorIs(t, auth.Verify(ctx, "later-key-5"), gateway.ErrAuthUnavailable)
}

// TestUnknownKeysRememberedAreBounded checks that the unknown keys
// remembered expire, and never exceed their cap however many arrive.
func TestUnknownKeysRememberedAreBounded(t *testing.T) {
	keys := newFakeKeys()
	auth, err := gateway.NewAuthenticator(gateway.AuthConfig{MaxLookupsPerSecond: 1 << 30, NegativeTTL: time.Minute},
		gateway.Peppers{Current: pepper}, keys, &countingState{data: map[string][]byte{}}, nil, nil)
	require.NoError(t, err)
	now := time.Unix(1_700_000_000, 0)
	gateway.SetAuthClock(auth, func() time.Time { return now })
	ctx := context.Background()

	for i := range 100 {
		require.ErrorIs(t, auth.Verify(ctx, fmt.Sprintf("k-%d", i)), gateway.ErrUnauthorized)
	}
	require.Equal(t, 100, gateway.UnknownKeys(auth))
	hits := keys.hits
	require.ErrorIs(t, auth.Verify(ctx, "k-7"), gateway.ErrUnauthorized)
	require.Equal(t, hits, keys.hits, "remembered, not looked up again")

	now = now.Add(time.Minute + time.Second)
	require.ErrorIs(t, auth.Verify(ctx, "k-7"), gateway.ErrUnauthorized)
	require.Equal(t, hits+1, keys.hits, "expired: looked up again")
	require.Equal(t, 1, gateway.UnknownKeys(auth), "the expired ones are forgotten")

	for i := range gateway.MaxUnknownKeys + 500 {
		require.ErrorIs(t, auth.Verify(ctx, fmt.Sprintf("flood-%d", i)), gateway.ErrUnauthorized)
	}
	require.Equal(t, gateway.MaxUnknownKeys, gateway.UnknownKeys(auth), "capped, the oldest forgotten")
	hits = keys.hits
	require.ErrorIs(t, auth.Verify(ctx, fmt.Sprintf("flood-%d", gateway.MaxUnknownKeys+499)), gateway.ErrUnauthorized)
	require.Equal(t, hits, keys.hits, "the newest is still remembered")
	require.ErrorIs(t, auth.Verify(ctx, "flood-0"), gateway.ErrUnauthorized)
	require.Equal(t, hits+1, keys.hits, "the oldest was forgotten")
}

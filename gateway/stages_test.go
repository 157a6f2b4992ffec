package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStagesStopInOrder checks that each shutdown step starts once the
// one before it returned, whatever order the parts return in.
func TestStagesStopInOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	st := newStages(ctx)
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	st.then(func() error { note("first"); return nil })
	second := st.stage()
	quick := make(chan struct{})
	// The slow part ends after the quick one, and lingers: the third stage
	// must wait for it.
	second.run(func(ctx context.Context) error {
		<-ctx.Done()
		<-quick
		time.Sleep(50 * time.Millisecond)
		note("second-slow")
		return nil
	})
	second.run(func(ctx context.Context) error {
		<-ctx.Done()
		note("second-quick")
		close(quick)
		return nil
	})
	st.stage().run(func(ctx context.Context) error {
		<-ctx.Done()
		note("third")
		return nil
	})
	require.False(t, st.stopping())
	cancel()
	st.wait()
	require.True(t, st.stopping())
	require.NoError(t, st.stop())
	require.Equal(t, []string{"first", "second-quick", "second-slow", "third"}, order)
}

// TestStagesFailureStartsTheShutdown checks that a part's error starts
// the shutdown and is returned by stop.
func TestStagesFailureStartsTheShutdown(t *testing.T) {
	st := newStages(context.Background())
	boom := errors.New("disk gone")
	st.stage().run(func(context.Context) error { return boom })
	other := st.stage()
	other.run(func(ctx context.Context) error { <-ctx.Done(); return nil })
	select {
	case <-st.tripped.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a failed part did not start the shutdown")
	}
	require.ErrorIs(t, st.stop(), boom)
}

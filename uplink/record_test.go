package uplink

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
)

// groupStore records MarkDelivered calls; the first one waits until
// release is closed, so that the others queue behind it.
type groupStore struct {
	Store
	mu      sync.Mutex
	calls   [][]buffer.Pending
	entered chan struct{}
	release chan struct{}
	fail    error
}

func (s *groupStore) MarkDelivered(ps []buffer.Pending) error {
	s.mu.Lock()
	s.calls = append(s.calls, ps)
	first := len(s.calls) == 1
	s.mu.Unlock()
	if first {
		close(s.entered)
		<-s.release
	}
	return s.fail
}

func TestDeliveriesWaitingTogetherShareOneMarkDelivered(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error
	}{{"recorded", nil}, {"failed", errors.New("disk gone")}} {
		t.Run(tc.name, func(t *testing.T) {
			store := &groupStore{entered: make(chan struct{}), release: make(chan struct{}), fail: tc.fail}
			var g deliveryGroup
			const callers = 8
			errs := make(chan error, callers+1)
			go func() { errs <- g.record(store, []buffer.Pending{{BatchID: "first"}}) }()
			<-store.entered
			for i := range callers {
				go func() { errs <- g.record(store, []buffer.Pending{{BatchID: fmt.Sprint(i)}}) }()
			}
			// Every caller is queued once the group holds its batch.
			require.Eventually(t, func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				return len(g.queued) == callers
			}, 10*time.Second, time.Millisecond)
			close(store.release)
			for range callers + 1 {
				require.Equal(t, tc.fail, <-errs)
			}
			store.mu.Lock()
			defer store.mu.Unlock()
			require.Len(t, store.calls, 2, "the first call, then one for everything queued meanwhile")
			require.Len(t, store.calls[1], callers)
		})
	}
}

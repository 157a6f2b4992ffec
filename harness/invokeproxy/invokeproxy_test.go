package invokeproxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/invokeproxy"
)

// The upstream stands for the emulator: it records whether two requests
// were ever at it at once.
func TestOneInvocationAtATimeEvenWhenCallersGoAway(t *testing.T) {
	var inside, overlaps, served atomic.Int32
	entered := make(chan struct{}, 8) // one per invocation the emulator starts
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer inside.Add(-1)
		body, _ := io.ReadAll(r.Body)
		time.Sleep(20 * time.Millisecond)
		served.Add(1)
		w.Header().Set("X-Amz-Function-Error", "Unhandled")
		w.WriteHeader(http.StatusOK)
		_, _ = fmt.Fprintf(w, "%s|%s", r.URL.Path, body)
	}))
	defer up.Close()
	p, err := invokeproxy.New([]string{up.URL}, time.Minute, nil)
	require.NoError(t, err)
	require.NoError(t, p.Listen("127.0.0.1:0"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	path := "/2015-03-31/functions/function/invocations"
	invoke := func(rctx context.Context, i int) (*http.Response, error) {
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, p.URL()+path, strings.NewReader(fmt.Sprint(i)))
		require.NoError(t, err)
		return http.DefaultClient.Do(req)
	}
	// The first caller gives up once the emulator runs its invocation;
	// the next one must wait for that invocation all the same.
	first, giveUp := context.WithCancel(context.Background())
	go func() {
		<-entered
		giveUp()
	}()
	_, err = invoke(first, 0)
	require.ErrorIs(t, err, context.Canceled)
	var wg sync.WaitGroup
	for i := 1; i < 8; i++ {
		wg.Go(func() {
			rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer rcancel()
			resp, err := invoke(rctx, i)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("%s|%d", path, i), string(body), "each caller gets its own answer")
			require.Equal(t, "Unhandled", resp.Header.Get("X-Amz-Function-Error"), "headers are passed on")
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return served.Load() == 8 }, 10*time.Second, 5*time.Millisecond,
		"abandoned invocations still run at the emulator")
	require.Zero(t, overlaps.Load(), "two invocations reached the emulator at once")
	cancel()
	require.NoError(t, <-done)
}

func TestUnreachableEmulatorIsA502(t *testing.T) {
	up := httptest.NewServer(http.NotFoundHandler())
	url := up.URL
	up.Close()
	p, err := invokeproxy.New([]string{url}, time.Minute, nil)
	require.NoError(t, err)
	require.NoError(t, p.Listen("127.0.0.1:0"))
	go func() { _ = p.Run(context.Background()) }()
	defer p.Close()
	resp, err := http.Post(p.URL()+"/2015-03-31/functions/function/invocations", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
}

// With several emulators, invokes run side by side, one at a time at each.
func TestSeveralEmulatorsRunInvocationsSideBySide(t *testing.T) {
	var total, most atomic.Int32
	var ups []string
	var overlaps atomic.Int32
	for range 3 {
		var inside atomic.Int32
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if inside.Add(1) > 1 {
				overlaps.Add(1)
			}
			n := total.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(30 * time.Millisecond)
			total.Add(-1)
			inside.Add(-1)
			_, _ = io.WriteString(w, "{}")
		}))
		t.Cleanup(up.Close)
		ups = append(ups, up.URL)
	}
	p, err := invokeproxy.New(ups, time.Minute, nil)
	require.NoError(t, err)
	require.NoError(t, p.Listen("127.0.0.1:0"))
	go func() { _ = p.Run(context.Background()) }()
	t.Cleanup(func() { _ = p.Close() })
	var wg sync.WaitGroup
	for range 9 {
		wg.Go(func() {
			resp, err := http.Post(p.URL()+"/2015-03-31/functions/function/invocations", "application/json", strings.NewReader("{}"))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
		})
	}
	wg.Wait()
	require.Zero(t, overlaps.Load(), "two invocations reached one emulator at once")
	require.Greater(t, most.Load(), int32(1), "invocations ran side by side on several emulators")
	require.LessOrEqual(t, most.Load(), int32(3))
}

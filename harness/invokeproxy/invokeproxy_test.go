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
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	p, err := invokeproxy.New(up.URL, time.Minute, nil)
	require.NoError(t, err)
	require.NoError(t, p.Listen("127.0.0.1:0"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			// Every other caller gives up before its answer.
			rctx, rcancel := context.WithTimeout(context.Background(), map[bool]time.Duration{true: 5 * time.Millisecond, false: 30 * time.Second}[i%2 == 1])
			defer rcancel()
			path := "/2015-03-31/functions/function/invocations"
			req, err := http.NewRequestWithContext(rctx, http.MethodPost, p.URL()+path, strings.NewReader(fmt.Sprint(i)))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			if i%2 == 1 {
				if err == nil {
					resp.Body.Close()
				}
				return
			}
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
	p, err := invokeproxy.New(url, time.Minute, nil)
	require.NoError(t, err)
	require.NoError(t, p.Listen("127.0.0.1:0"))
	go func() { _ = p.Run(context.Background()) }()
	defer p.Close()
	resp, err := http.Post(p.URL()+"/2015-03-31/functions/function/invocations", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
}

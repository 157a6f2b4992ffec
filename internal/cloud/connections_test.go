package cloud_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/cloud"
)

// TestWithConnectionsReusesConnections sends five bursts of 16 concurrent
// requests, each burst ending with all 16 idle at once, to an endpoint that
// counts the connections it accepts: the SDK's default keeps 10 idle
// connections, so every later burst opens 6 more; with WithConnections(16)
// the first burst's 16 connections serve them all.
func TestWithConnectionsReusesConnections(t *testing.T) {
	const inFlight, bursts = 16, 5
	count := func(opts ...func(*dynamodb.Options)) int64 {
		var conns atomic.Int64
		var mu sync.Mutex
		arrived := 0
		release := make(chan struct{})
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			if arrived++; arrived == inFlight {
				close(release)
			}
			ch := release
			mu.Unlock()
			<-ch // every request of the burst is in flight
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			_, _ = w.Write([]byte(`{"TableNames":[]}`))
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
		srv.Start()
		defer srv.Close()
		client, err := cloud.NewClient(context.Background(), cloud.Config{Endpoint: srv.URL, Region: "us-east-1"}, opts...)
		require.NoError(t, err)
		for range bursts {
			mu.Lock()
			arrived, release = 0, make(chan struct{})
			mu.Unlock()
			var wg sync.WaitGroup
			for range inFlight {
				wg.Go(func() {
					if _, err := client.ListTables(context.Background(), &dynamodb.ListTablesInput{}); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			// The transport puts a connection back in its idle pool on
			// its own goroutine after the answer is read; rounds have a
			// gap between them too.
			time.Sleep(100 * time.Millisecond)
		}
		return conns.Load()
	}
	def := count()
	pooled := count(cloud.WithConnections(inFlight))
	t.Logf("connections opened for %d bursts of %d requests: SDK default %d, WithConnections(%d) %d",
		bursts, inFlight, def, inFlight, pooled)
	require.Greater(t, def, int64(inFlight), "the default closes connections between bursts")
	require.Equal(t, int64(inFlight), pooled)
}

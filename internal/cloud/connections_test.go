package cloud_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
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
// the first burst's 16 connections serve them all (but for one offered
// back to the pool too late, now and then, under load).
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
		// The transport offers a connection back to its idle pool on its
		// own goroutine after the answer is read (kept, or closed when
		// the pool is full): the next burst starts once all were offered,
		// or after a second (a connection offered late is replaced by a
		// new one, which the bounds below allow once a burst).
		var offered atomic.Int64
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			PutIdleConn: func(error) { offered.Add(1) },
		})
		for burst := range bursts {
			mu.Lock()
			arrived, release = 0, make(chan struct{})
			mu.Unlock()
			var wg sync.WaitGroup
			for range inFlight {
				wg.Go(func() {
					if _, err := client.ListTables(ctx, &dynamodb.ListTablesInput{}); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for wait := time.Now().Add(time.Second); offered.Load() < int64((burst+1)*inFlight) && time.Now().Before(wait); {
				time.Sleep(time.Millisecond)
			}
		}
		return conns.Load()
	}
	def := count()
	pooled := count(cloud.WithConnections(inFlight))
	t.Logf("connections opened for %d bursts of %d requests: SDK default %d, WithConnections(%d) %d",
		bursts, inFlight, def, inFlight, pooled)
	// The SDK's default keeps 10 idle connections: each later burst opens
	// 6 more.
	require.GreaterOrEqual(t, def, int64(inFlight+(bursts-1)*(inFlight-10)), "the default closes connections between bursts")
	require.LessOrEqual(t, pooled, int64(inFlight+bursts-1), "WithConnections keeps the first burst's connections")
}

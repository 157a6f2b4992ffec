package faultproxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"greenhouse-gateway/harness/faultproxy"
)

// upstream is a fake DynamoDB that counts the requests it answers.
type upstream struct {
	srv   *httptest.Server
	calls atomic.Int64
	mu    sync.Mutex
	hosts []string
	body  string
}

func newUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{body: `{"ConsumedCapacity":null,"note":"` + strings.Repeat("x", 100) + `"}`}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		u.calls.Add(1)
		u.mu.Lock()
		u.hosts = append(u.hosts, r.Host)
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("X-Upstream", "yes")
		_, _ = io.WriteString(w, u.body)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// start serves a proxy to u on a loopback port.
func start(t testing.TB, u *upstream, seed uint64) (*faultproxy.Proxy, string) {
	t.Helper()
	p, err := faultproxy.New(faultproxy.Config{Target: u.srv.URL, Seed: seed}, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.URL
}

// post sends one request on a fresh connection.
func post(t testing.TB, url string, timeout time.Duration) (*http.Response, []byte, error) {
	t.Helper()
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Post(url+"/", "application/x-amz-json-1.0", strings.NewReader(`{"TableName":"t"}`))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func TestModes(t *testing.T) {
	tests := []struct {
		name       string
		fault      faultproxy.Fault
		upstreamed int64 // requests the upstream answers
		check      func(t *testing.T, resp *http.Response, body []byte, err error)
	}{
		{"pass", faultproxy.Fault{Mode: faultproxy.Pass}, 1, func(t *testing.T, resp *http.Response, body []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "yes", resp.Header.Get("X-Upstream"))
			require.Contains(t, string(body), `"note"`)
		}},
		{"zero value passes", faultproxy.Fault{}, 1, func(t *testing.T, resp *http.Response, body []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
		}},
		{"reset before forwarding", faultproxy.Fault{Mode: faultproxy.Reset}, 0, func(t *testing.T, resp *http.Response, body []byte, err error) {
			require.Error(t, err)
		}},
		{"lost response after forwarding", faultproxy.Fault{Mode: faultproxy.LostResponse}, 1, func(t *testing.T, resp *http.Response, body []byte, err error) {
			require.Error(t, err)
		}},
		{"truncated body", faultproxy.Fault{Mode: faultproxy.Truncate}, 1, func(t *testing.T, resp *http.Response, body []byte, err error) {
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Greater(t, resp.ContentLength, int64(len(body)))
		}},
		{"throttle", faultproxy.Fault{Mode: faultproxy.Throttle, Code: faultproxy.CodeThrottling}, 0, func(t *testing.T, resp *http.Response, body []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode)
			require.Contains(t, string(body), `#ThrottlingException"`)
		}},
		{"error 503", faultproxy.Fault{Mode: faultproxy.Error5xx, Code: faultproxy.CodeServiceUnavailable}, 0, func(t *testing.T, resp *http.Response, body []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			require.Contains(t, string(body), `#ServiceUnavailable"`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t)
			p, url := start(t, u, 1)
			require.NoError(t, p.Set(tt.fault))
			resp, body, err := post(t, url, 10*time.Second)
			tt.check(t, resp, body, err)
			require.Equal(t, tt.upstreamed, u.calls.Load())
			mode := tt.fault.Mode
			if mode == "" {
				mode = faultproxy.Pass
			}
			require.Equal(t, uint64(1), p.Stats().Requests[mode])
		})
	}
}

func TestLatencyDelaysTheAnswer(t *testing.T) {
	u := newUpstream(t)
	p, url := start(t, u, 1)
	require.NoError(t, p.Set(faultproxy.Fault{Mode: faultproxy.Latency, Delay: 150 * time.Millisecond}))
	begin := time.Now()
	resp, _, err := post(t, url, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.GreaterOrEqual(t, time.Since(begin), 150*time.Millisecond)
	require.Equal(t, int64(1), u.calls.Load())
}

func TestLostResponseAndTruncateCountLostAnswers(t *testing.T) {
	u := newUpstream(t)
	p, url := start(t, u, 1)
	require.NoError(t, p.Set(faultproxy.Fault{Mode: faultproxy.LostResponse}))
	_, _, err := post(t, url, 10*time.Second)
	require.Error(t, err)
	require.NoError(t, p.Set(faultproxy.Fault{Mode: faultproxy.Truncate}))
	_, _, err = post(t, url, 10*time.Second)
	require.Error(t, err)
	s := p.Stats()
	require.Equal(t, uint64(2), s.Forwarded)
	require.Equal(t, uint64(2), s.AnswersLost)
}

func TestBlackholeHoldsUntilTheClientGivesUp(t *testing.T) {
	u := newUpstream(t)
	p, url := start(t, u, 1)
	require.NoError(t, p.Set(faultproxy.Fault{Mode: faultproxy.Blackhole}))
	begin := time.Now()
	_, _, err := post(t, url, 300*time.Millisecond)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(begin), 300*time.Millisecond)
	require.Zero(t, u.calls.Load())
	require.Eventually(t, func() bool { return p.Stats().Abandoned == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, uint64(1), p.Stats().Requests[faultproxy.Blackhole])
	require.Zero(t, p.Stats().Released)
}

func TestBlackholeReleasedWhenThePlanChanges(t *testing.T) {
	u := newUpstream(t)
	p, url := start(t, u, 1)
	require.NoError(t, p.Set(faultproxy.Fault{Mode: faultproxy.Blackhole}))
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(t, url, 30*time.Second)
		errc <- err
	}()
	require.Eventually(t, func() bool { return p.Stats().Requests[faultproxy.Blackhole] == 1 }, 5*time.Second, 5*time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("answered while blackholed: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, p.Set(faultproxy.Fault{Mode: faultproxy.Pass}))
	select {
	case err := <-errc:
		require.Error(t, err, "a released request is reset, not answered")
	case <-time.After(10 * time.Second):
		t.Fatal("blackholed request not released")
	}
	require.Equal(t, uint64(1), p.Stats().Released)
	require.Zero(t, u.calls.Load())
}

func TestErrorModesAlternateTheirCodes(t *testing.T) {
	tests := []struct {
		mode   faultproxy.Mode
		status []int
		codes  []string
	}{
		{faultproxy.Throttle, []int{400, 400},
			[]string{faultproxy.CodeProvisionedThroughputExceeded, faultproxy.CodeThrottling}},
		{faultproxy.Error5xx, []int{500, 503},
			[]string{faultproxy.CodeInternalServerError, faultproxy.CodeServiceUnavailable}},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			u := newUpstream(t)
			p, url := start(t, u, 1)
			require.NoError(t, p.Set(faultproxy.Fault{Mode: tt.mode}))
			for round := range 2 {
				for i := range 2 {
					resp, body, err := post(t, url, 10*time.Second)
					require.NoError(t, err)
					require.Equal(t, tt.status[i], resp.StatusCode, "round %d", round)
					require.Contains(t, string(body), "#"+tt.codes[i]+`"`)
					require.Equal(t, "application/x-amz-json-1.0", resp.Header.Get("Content-Type"))
				}
			}
			s := p.Stats()
			require.Equal(t, uint64(4), s.Requests[tt.mode])
			require.Equal(t, uint64(2), s.Errors[tt.codes[0]])
			require.Equal(t, uint64(2), s.Errors[tt.codes[1]])
			require.Zero(t, u.calls.Load())
		})
	}
}

// TestTheSDKSeesDynamoDBErrors checks that the canned answers parse, in the
// AWS SDK, as the DynamoDB errors they imitate.
func TestTheSDKSeesDynamoDBErrors(t *testing.T) {
	u := newUpstream(t)
	p, url := start(t, u, 1)
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(url), Region: "us-east-1", RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	put := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String("t"),
			Item: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: "v"}}})
		return err
	}
	for _, code := range []string{faultproxy.CodeProvisionedThroughputExceeded, faultproxy.CodeThrottling,
		faultproxy.CodeInternalServerError, faultproxy.CodeServiceUnavailable} {
		mode := faultproxy.Throttle
		if strings.Contains(code, "Server") || strings.Contains(code, "Unavailable") {
			mode = faultproxy.Error5xx
		}
		require.NoError(t, p.Set(faultproxy.Fault{Mode: mode, Code: code}))
		var ae smithy.APIError
		require.ErrorAs(t, put(), &ae, code)
		require.Equal(t, code, ae.ErrorCode())
	}
	for _, mode := range []faultproxy.Mode{faultproxy.Reset, faultproxy.LostResponse, faultproxy.Truncate} {
		require.NoError(t, p.Set(faultproxy.Fault{Mode: mode}))
		err := put()
		require.Error(t, err, mode)
		var ae smithy.APIError
		require.False(t, errors.As(err, &ae), "%s is a transport failure, not an API error: %v", mode, err)
	}
	require.NoError(t, p.Set(faultproxy.Fault{}))
	require.NoError(t, put())
}

func TestMixIsSeededAndProportional(t *testing.T) {
	draws := func(seed uint64) (map[faultproxy.Mode]uint64, []int) {
		u := newUpstream(t)
		p, url := start(t, u, seed)
		require.NoError(t, p.Mix(
			faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.Throttle}, P: 0.3},
			faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.Error5xx}, P: 0.2},
		))
		var statuses []int
		for range 400 {
			resp, _, err := post(t, url, 10*time.Second)
			require.NoError(t, err)
			statuses = append(statuses, resp.StatusCode)
		}
		return p.Stats().Requests, statuses
	}
	counts, first := draws(42)
	_, again := draws(42)
	require.Equal(t, first, again, "same seed, same sequence")
	_, other := draws(43)
	require.NotEqual(t, first, other)
	// 400 draws: 120 ± 40 throttled, 80 ± 40 errors, 200 ± 50 passed.
	require.InDelta(t, 120, counts[faultproxy.Throttle], 40)
	require.InDelta(t, 80, counts[faultproxy.Error5xx], 40)
	require.InDelta(t, 200, counts[faultproxy.Pass], 50)
	require.Equal(t, uint64(400), faultproxy.Stats{Requests: counts}.Total())
}

func TestInvalidPlansAreRefused(t *testing.T) {
	p, err := faultproxy.New(faultproxy.Config{Target: "http://127.0.0.1:1"}, nil)
	require.NoError(t, err)
	require.Error(t, p.Set(faultproxy.Fault{Mode: "flood"}))
	require.Error(t, p.Set(faultproxy.Fault{Mode: faultproxy.Latency, Delay: -time.Second}))
	require.Error(t, p.Set(faultproxy.Fault{Mode: faultproxy.Reset, Delay: time.Second}))
	require.Error(t, p.Set(faultproxy.Fault{Mode: faultproxy.Throttle, Code: faultproxy.CodeInternalServerError}))
	require.Error(t, p.Mix(faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.Reset}, P: 0}))
	require.Error(t, p.Mix(
		faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.Reset}, P: 0.6},
		faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.Truncate}, P: 0.6}))
	require.Equal(t, "pass", p.Plan())
	require.NoError(t, p.Mix(faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.LostResponse}, P: 0.5}))
	require.Equal(t, "lost_response 50%", p.Plan())

	_, err = faultproxy.New(faultproxy.Config{Target: "127.0.0.1:8000"}, nil)
	require.Error(t, err, "a target needs a scheme")
}

func TestUnreachableUpstreamResetsTheClient(t *testing.T) {
	u := newUpstream(t)
	u.srv.Close() // nothing listens there any more
	p, url := start(t, u, 1)
	_, _, err := post(t, url, 10*time.Second)
	require.Error(t, err)
	require.Equal(t, uint64(1), p.Stats().UpstreamErrors)
}

// TestConcurrentRequestsWhileThePlanChanges runs requests from many
// goroutines while another changes the plan (run it with -race), and checks
// that every request is counted once.
func TestConcurrentRequestsWhileThePlanChanges(t *testing.T) {
	u := newUpstream(t)
	p, url := start(t, u, 7)
	const workers, each = 8, 25
	stop := make(chan struct{})
	var changer sync.WaitGroup
	changer.Go(func() {
		plans := []faultproxy.Fault{{Mode: faultproxy.Pass}, {Mode: faultproxy.Reset}, {Mode: faultproxy.Throttle},
			{Mode: faultproxy.Blackhole}, {Mode: faultproxy.LostResponse}, {Mode: faultproxy.Truncate},
			{Mode: faultproxy.Latency, Delay: time.Millisecond}, {Mode: faultproxy.Error5xx}}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if i%3 == 0 {
				_ = p.Mix(faultproxy.Chance{Fault: plans[i%len(plans)], P: 0.5})
			} else {
				_ = p.Set(plans[i%len(plans)])
			}
			_ = p.Plan()
			_ = p.Stats()
		}
	})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				_, _, _ = post(t, url, 2*time.Second)
			}
		})
	}
	wg.Wait()
	close(stop)
	changer.Wait()
	require.Equal(t, uint64(workers*each), p.Stats().Total())
}

func TestRunServesOnLoopbackAndStops(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.WriteString(w, "{}")
	}))
	defer up.Close()
	p, err := faultproxy.New(faultproxy.Config{Target: up.URL}, nil)
	require.NoError(t, err)
	require.NoError(t, p.Listen())
	require.True(t, strings.HasPrefix(p.Addr(), "127.0.0.1:"), p.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	resp, body, err := post(t, p.URL(), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "{}", string(body))

	// A blackholed request in flight does not hold Run up.
	require.NoError(t, p.Set(faultproxy.Fault{Mode: faultproxy.Blackhole}))
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(t, p.URL(), 30*time.Second)
		errc <- err
	}()
	require.Eventually(t, func() bool { return p.Stats().Requests[faultproxy.Blackhole] == 1 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	require.Error(t, <-errc)
	require.Equal(t, int64(1), calls.Load())
	up.CloseClientConnections()
}

func ExampleProxy_Mix() {
	p, err := faultproxy.New(faultproxy.Config{Target: "http://127.0.0.1:8000", Seed: 1}, nil)
	if err != nil {
		panic(err)
	}
	// Half of the requests reach DynamoDB but lose their answer; a tenth are throttled.
	_ = p.Mix(
		faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.LostResponse}, P: 0.5},
		faultproxy.Chance{Fault: faultproxy.Fault{Mode: faultproxy.Throttle, Code: faultproxy.CodeThrottling}, P: 0.1},
	)
	fmt.Println(p.Plan())
	// Output: lost_response 50%, throttle(ThrottlingException) 10%
}

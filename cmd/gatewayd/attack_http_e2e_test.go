package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// raiseFDLimit raises this process's soft limit on open files to its hard
// limit (gatewayd, started afterwards, inherits it) and requires room for
// need descriptors.
func raiseFDLimit(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	lim.Cur = lim.Max
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	require.GreaterOrEqual(t, lim.Max, need, "the hard limit on open files (ulimit -Hn) is too low for this attack")
}

// halfRequest is what each attacking connection sends before it waits:
// a request line and some headers, never the blank line that ends them.
const halfRequest = "POST /v1/readings HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"

// idleAttack opens n connections to addr from sources loopback addresses
// (127.0.0.2 up; one heavy host, 127.0.0.2, opens half of them), each
// sending half a request and waiting. Once all are open it goes on until
// stop is called (at most 20n times), closing its oldest connection and
// opening a new one, rate a second in all (as clients whose connections
// the gateway closed reconnect); close closes what it holds.
type idleAttack struct {
	addr           string
	n, sources     int
	opened, failed atomic.Int64
	mu             sync.Mutex
	conns          []net.Conn // oldest first
	full           chan struct{}
	took           time.Duration // to open the first n, once full is closed
	stop, done     chan struct{}
}

func startIdleAttack(addr string, n, sources, workers, rate int) *idleAttack {
	a := &idleAttack{addr: addr, n: n, sources: sources, conns: make([]net.Conn, 0, n),
		full: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	var next atomic.Int64
	var flood, all sync.WaitGroup
	start := time.Now()
	for range workers {
		flood.Add(1)
		all.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				a.open(i)
			}
			flood.Done()
			<-a.full
			pause := time.Duration(workers) * time.Second / time.Duration(rate)
			for i := next.Add(1) - 1; i < int64(20*n); i = next.Add(1) - 1 {
				select {
				case <-a.stop:
					return
				case <-time.After(pause):
				}
				a.mu.Lock()
				oldest := a.conns[0]
				a.conns = a.conns[1:]
				a.mu.Unlock()
				_ = oldest.Close()
				a.open(i)
			}
		})
	}
	go func() {
		flood.Wait()
		a.took = time.Since(start)
		close(a.full)
		all.Wait()
		close(a.done)
	}()
	return a
}

// open opens the attack's connection number i.
func (a *idleAttack) open(i int64) {
	src := 2 // the heavy host
	if i%2 == 1 {
		src = 3 + int(i/2)%(a.sources-1)
	}
	c, err := dialFrom(fmt.Sprintf("127.0.0.%d", src), a.addr, 5*time.Second)
	if err != nil {
		a.failed.Add(1)
		return
	}
	_, _ = io.WriteString(c, halfRequest) // a shed connection may refuse it; it is counted as opened
	a.opened.Add(1)
	a.mu.Lock()
	a.conns = append(a.conns, c)
	a.mu.Unlock()
}

func (a *idleAttack) close() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.conns {
		_ = c.Close()
	}
}

// deviceTry is one POST of a device: its status and how long it took.
type deviceTry struct {
	code int
	took time.Duration
	err  error
}

// postReadings sends one valid batch of hw from 127.0.0.1 on a new
// connection.
func postReadings(url, key, hw, boot string, i int) deviceTry {
	body := `{"batches":[` + string(batch(hw, boot, i, 2)) + `]}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return deviceTry{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return deviceTry{took: time.Since(start), err: err}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return deviceTry{code: resp.StatusCode, took: time.Since(start)}
}

// TestAttackIdleHTTP: hosts on the LAN open N connections that each send
// half a request and wait (the full size is the 19,000), while a
// device from another address posts a batch 10 times on new connections:
// each is answered 200 within 2 s, the gateway's resident set stays under
// 128 MB, and the attacker's connections are shed and counted.
func TestAttackIdleHTTP(t *testing.T) {
	n := attackSize(600, 19000)
	sources := attackSize(15, 38) // 40 or 500 connections a source
	// make test uses smaller caps so that 600 sockets reach both.
	maxConns, perAddr := attackSize(256, 1024), attackSize(32, 64)
	raiseFDLimit(t, uint64(n)+1000)
	local, _, key, prefix := setup(t)
	d := startPlainDaemon(t, t.TempDir(), local.Endpoint, prefix,
		"GATEWAY_HTTP_MAX_CONNS="+strconv.Itoa(maxConns), "GATEWAY_HTTP_MAX_CONNS_PER_ADDR="+strconv.Itoa(perAddr))
	pid := d.cmd.Process.Pid
	url := "http://" + d.httpAddr + "/v1/readings"
	hw, boot := "02:00:00:00:AB:01", uuid.NewString()
	warm := postReadings(url, key, hw, boot, 0)
	require.NoError(t, warm.err)
	require.Equal(t, http.StatusOK, warm.code)
	before := rssBytes(t, pid)

	attack := startIdleAttack(d.httpAddr, n, sources, 32, attackSize(2000, 5000))
	defer attack.close()
	tries := make(chan deviceTry, 10)
	go func() {
		defer close(tries)
		// Once all n are open, every 200 ms while the attack goes on.
		select {
		case <-attack.full:
		case <-time.After(2 * time.Minute):
		}
		for i := range 10 {
			tries <- postReadings(url, key, hw, boot, 1+i)
			time.Sleep(200 * time.Millisecond)
		}
	}()

	var peak int64
	var got []deviceTry
	for sampling := true; sampling; {
		select {
		case try, ok := <-tries:
			if !ok {
				sampling = false
				break
			}
			got = append(got, try)
		case <-time.After(50 * time.Millisecond):
		}
		peak = max(peak, rssBytes(t, pid))
	}
	peak = max(peak, rssBytes(t, pid))
	open := metricFloat(t, d, "gateway_http_connections_open")
	shedTotal := metricFloat(t, d, `gateway_http_connections_shed_total{reason="total_cap"}`)
	shedAddr := metricFloat(t, d, `gateway_http_connections_shed_total{reason="address_cap"}`)
	refused := metricFloat(t, d, `gateway_http_connections_refused_total{reason="total_cap"}`) +
		metricFloat(t, d, `gateway_http_connections_refused_total{reason="address_cap"}`)
	attack.close()

	var worst time.Duration
	for _, try := range got {
		worst = max(worst, try.took)
	}
	t.Logf("%d half-request connections from %d addresses in %v, then reopened while the device posts: %d opened, %d failed; caps %d total, %d per address",
		n, sources, attack.took.Round(time.Millisecond), attack.opened.Load(), attack.failed.Load(), maxConns, perAddr)
	t.Logf("RSS before %.1f MB, peak %.1f MB; open %v; shed total_cap %v, address_cap %v; refused %v; device worst %v",
		float64(before)/1e6, float64(peak)/1e6, open, shedTotal, shedAddr, refused, worst.Round(time.Millisecond))

	require.Len(t, got, 10)
	for i, try := range got {
		require.NoError(t, try.err, "device try %d", i)
		require.Equal(t, http.StatusOK, try.code, "device try %d", i)
		require.Less(t, try.took, 2*time.Second, "device try %d", i)
	}
	require.Less(t, peak, int64(128<<20), "gatewayd's resident set under the attack")
	require.LessOrEqual(t, open, float64(maxConns))
	require.Greater(t, shedTotal, 0.0, "the total cap sheds attackers")
	require.Greater(t, shedAddr, 0.0, "the per-address cap sheds attackers")
	require.GreaterOrEqual(t, shedTotal+shedAddr, float64(attack.opened.Load()-int64(maxConns))/2,
		"the attacker's connections beyond the cap are shed and counted")
	require.Contains(t, d.logs.String(), "HTTP connection caps reached", "the operator sees it in the log")
}

// TestAttackCrossSiteOperatorPost: a page on another site that makes the
// operator's browser post to the operator API (with the Basic credentials
// the browser has cached) is refused; the operator's own tools, with the
// token as Bearer, are served.
func TestAttackCrossSiteOperatorPost(t *testing.T) {
	const token = "attack-admin-token"
	local, _, _, prefix := setup(t)
	d := startDaemon(t, t.TempDir(), local.Endpoint, prefix, envAdminToken+"="+token)
	url := "http://" + d.httpAddr + "/v1/dead-letters/unknown-batch/reforward"
	post := func(set func(*http.Request)) (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("confirm=1"))
		require.NoError(t, err)
		set(req)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(raw), resp.Header
	}

	code, body, h := post(func(r *http.Request) { // what the browser sends for the hostile page's form
		r.SetBasicAuth("operator", token)
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", "http://attacker.example")
		r.Header.Set("Sec-Fetch-Site", "cross-site")
	})
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "cross-site request refused")
	require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))

	code, body, _ = post(func(r *http.Request) { // an old browser: no Sec-Fetch-Site
		r.SetBasicAuth("operator", token)
		r.Header.Set("Origin", "http://attacker.example")
	})
	require.Equal(t, http.StatusForbidden, code, body)

	code, body, _ = post(func(r *http.Request) { r.SetBasicAuth("operator", token) })
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "Basic credentials refused")

	code, body, h = post(func(r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+token)
		r.Header.Set("Sec-Fetch-Site", "same-origin")
	})
	require.Equal(t, http.StatusNotFound, code, "past the guard, to the handler: %s", body)
	require.Contains(t, body, "no batch unknown-batch")
	require.Equal(t, "no-store", h.Get("Cache-Control"))
	require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
}

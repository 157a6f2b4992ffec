//go:build linux

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"greenhouse-gateway/harness/fleetgen"
	"greenhouse-gateway/harness/proc"
)

// DiscardCommand is the hidden subcommand of cmd/bench that runs the HTTP
// baseline server (ServeDiscard) as a process of its own, as gatewayd is.
const DiscardCommand = "discard-server"

// discardAnswer is what the baseline server answers: the size of a
// one-batch answer of the gateway.
var discardAnswer = []byte(`{"results":[{"batch_id":"02:BE:00:00:00:00_00000000-0000-4000-8000-000000000000_0_0","status":"accepted"}]}`)

// ServeDiscard serves, on addr, a trivial HTTP handler that reads and
// discards the request body and answers 200 with a small JSON body, until
// ctx is done.
func ServeDiscard(ctx context.Context, addr string) error {
	srv := &http.Server{
		Addr:              addr,
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(discardAnswer)
		}),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// discardServer is the baseline server, run as `bench discard-server`.
type discardServer struct {
	addr string
	proc *proc.Process
}

func startDiscardServer(logPath string) (*discardServer, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the benchmark's executable: %w", err)
	}
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(self, DiscardCommand, "--addr", addr)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	s := &discardServer{addr: addr}
	if s.proc, err = proc.Start("discard-server", cmd); err != nil {
		return nil, err
	}
	if err := s.proc.WaitTCP(addr, 10*time.Second); err != nil {
		s.proc.Kill()
		return nil, fmt.Errorf("%w\n%s", err, tailFile(logPath, 2048))
	}
	return s, nil
}

func (s *discardServer) stop() error { return s.proc.Stop(stopTimeout) }

// httpResult is what an HTTP load measured.
type httpResult struct {
	Clients       int              `json:"clients"`
	WindowSeconds float64          `json:"window_s"`
	Completed     int64            `json:"completed"`
	BatchesPerSec float64          `json:"batches_per_s"`
	Latency       summary          `json:"latency"`
	Codes         map[string]int64 `json:"codes"`
	Errors        int64            `json:"errors"`
	ServerCPU     float64          `json:"server_cpu_s"`
}

// httpLoad posts one batch of readings per request to url from clients
// keep-alive connections, each client a device of its own, in a closed
// loop; it warms up for warmup, then measures for window.
func httpLoad(ctx context.Context, url, key string, fleetID byte, clients, readings int, warmup, window time.Duration, hooks loadHooks) (httpResult, error) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        clients,
		MaxIdleConnsPerHost: clients,
		MaxConnsPerHost:     clients,
		DisableCompression:  true,
		IdleConnTimeout:     time.Minute,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: answerTimeout}
	t0 := time.Now().Add(warmup)
	t1 := t0.Add(window)
	var (
		lat    latencies
		done   atomic.Int64
		errs   atomic.Int64
		mu     sync.Mutex
		codes  = map[string]int64{}
		wg     sync.WaitGroup
		start  = time.Now().Add(-48 * time.Hour)
		fatal  error
		fatalM sync.Mutex
	)
	for i := range clients {
		dev := fleetgen.NewDevice(fleetgen.HardwareID(fleetID, i), start, uint64(i))
		wg.Go(func() {
			for ctx.Err() == nil {
				sent := time.Now()
				if !sent.Before(t1) {
					return
				}
				_, payload, err := dev.Next(readings)
				if err != nil {
					fatalM.Lock()
					fatal = err
					fatalM.Unlock()
					return
				}
				code, err := post(ctx, client, url, key, payload)
				now := time.Now()
				label := strconv.Itoa(code)
				if err != nil {
					errs.Add(1)
					label = "error"
					time.Sleep(10 * time.Millisecond) // no hot loop on a refused connection
				}
				if !sent.Before(t0) {
					lat.add(now.Sub(sent))
					mu.Lock()
					codes[label]++
					mu.Unlock()
				}
				if code == http.StatusOK && !now.Before(t0) && now.Before(t1) {
					done.Add(1)
				}
			}
		})
	}
	sleepUntil(ctx, t0)
	if hooks.start != nil {
		hooks.start()
	}
	sleepUntil(ctx, t1)
	if hooks.end != nil {
		hooks.end()
	}
	wg.Wait()
	if err := errors.Join(ctx.Err(), fatal); err != nil {
		return httpResult{}, err
	}
	res := httpResult{
		Clients: clients, WindowSeconds: window.Seconds(), Completed: done.Load(),
		Latency: lat.summary(), Codes: codes, Errors: errs.Load(),
	}
	res.BatchesPerSec = float64(res.Completed) / res.WindowSeconds
	return res, nil
}

func post(ctx context.Context, client *http.Client, url, key string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, nil
}

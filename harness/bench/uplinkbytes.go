//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"greenhouse-gateway/harness/byterelay"
	"greenhouse-gateway/harness/fleetgen"
	"greenhouse-gateway/harness/lambdatest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/uplink"
)

// bytesInterval is how often each simulated device of the live rate sends a
// batch: a greenhouse device's minute.
const bytesInterval = time.Minute

// Uplink targets the uplink-bytes scenario measures, in the order run.
const (
	bytesDirect = "dynamodb"
	bytesLambda = "lambda"
)

// plainLiveGoroutines is the plain same-items writer's goroutines on the
// live batches: at the live rate a writer has one request at a time to
// send. On a backlog it runs the SDK loop's concurrency
// (UplinkConcurrency).
const plainLiveGoroutines = 1

// The TLS and session token estimate: what an uplink to AWS adds to the
// bytes counted on the benchmark's plain-HTTP sockets, per request and per
// connection. They are estimates, not measurements.
const (
	// tlsRecordBytes is the overhead of one TLS record with AES-GCM: a
	// 5-byte header and a 16-byte tag, plus the content type byte (TLS 1.3,
	// 22 bytes in all) or the 8-byte explicit nonce (TLS 1.2, 29 bytes):
	// the larger is taken.
	tlsRecordBytes = 29
	// tlsRecordPayload is the most a TLS record carries: a request or
	// answer takes one record per 16 KiB started.
	tlsRecordPayload = 16 << 10
	// tlsHandshakeUp and tlsHandshakeDown are a full TLS handshake without
	// resumption: the client's ClientHello with a key share and its
	// Finished; the server's hello, certificate chain (about 4.5 KB for
	// AWS's endpoints), CertificateVerify, Finished and session tickets.
	// 5.6 KB in all.
	tlsHandshakeUp   = 600
	tlsHandshakeDown = 5000
	// sessionTokenBytes is the X-Amz-Security-Token header a request
	// signed with temporary credentials (an IAM role, IoT credentials
	// provider) carries, name included: about 1 KB.
	sessionTokenBytes = 1024
)

// bytesRun is what crossed the relays in front of an uplink's endpoints
// while it delivered some readings.
type bytesRun struct {
	Target   string `json:"target"`
	Phase    string `json:"phase"`
	Readings int64  `json:"readings"`
	Batches  int64  `json:"batches"`
	// Total is every endpoint's relay added up; ByEndpoint each relay's:
	// dynamodb (the DynamoDB endpoint: the uplink's writes, API key
	// lookups) and lambda (the Invoke API).
	Total      byterelay.Counts            `json:"total"`
	ByEndpoint map[string]byterelay.Counts `json:"by_endpoint"`
	// Operations is each relay's requests and bytes up by operation
	// (X-Amz-Target; "" for the Invoke API).
	Operations map[string]byterelay.Operations `json:"operations_by_endpoint"`
	Seconds    float64                         `json:"seconds"`
	// GatewaySent and GatewayReceived are gatewayd's own count over the
	// same window (gateway_uplink_bytes_total, every client); Goroutines
	// is the plain writer's.
	GatewaySent     float64 `json:"gateway_counted_sent,omitempty"`
	GatewayReceived float64 `json:"gateway_counted_received,omitempty"`
	Goroutines      int     `json:"goroutines,omitempty"`
	// ReadingsStored and MarkersStored are what the tables hold afterwards.
	ReadingsStored int64 `json:"readings_in_table"`
	MarkersStored  int64 `json:"markers_in_table"`
	// Drain is gatewayd's drain, when the run is one.
	Drain *gatewayDrain `json:"drain,omitempty"`
}

func (b bytesRun) perReading(n int64) float64 {
	if b.Readings == 0 {
		return 0
	}
	return float64(n) / float64(b.Readings)
}

func (b bytesRun) per1000(n int64) float64 { return 1000 * b.perReading(n) }

// tlsEstimate is the bytes per reading up and down with TLS on every
// connection and, up, a session token on every request, from the counts.
func (b bytesRun) tlsEstimate() (up, down float64) {
	c := b.Total
	upRecords := records(c.Up, c.Requests)
	downRecords := records(c.Down, c.Requests)
	up = float64(c.Up + upRecords*tlsRecordBytes + c.Connections*tlsHandshakeUp + c.Requests*sessionTokenBytes)
	down = float64(c.Down + downRecords*tlsRecordBytes + c.Connections*tlsHandshakeDown)
	if b.Readings == 0 {
		return 0, 0
	}
	return up / float64(b.Readings), down / float64(b.Readings)
}

// records estimates the TLS records of n bytes in messages messages: at
// least one a message, one per 16 KiB started of an average message.
func records(n, messages int64) int64 {
	if messages == 0 {
		return int64(math.Ceil(float64(n) / tlsRecordPayload))
	}
	per := math.Ceil(float64(n) / float64(messages) / tlsRecordPayload)
	return messages * int64(max(per, 1))
}

// uplinkBytesResult is the scenario's detail in the results.
type uplinkBytesResult struct {
	Runs       []bytesRun     `json:"runs"`
	PlainLive  bytesRun       `json:"plain_live"`
	PlainDrain bytesRun       `json:"plain_draining"`
	Estimate   map[string]int `json:"estimate_bytes"`
}

// uplinkBytes measures the bytes, requests and connections an uplink puts
// on its link per reading, counted at the socket by a relay in front of
// each endpoint, for each target (DynamoDB directly, then the readings
// function under the Runtime Interface Emulator): at a live greenhouse
// rate, then draining a backlog; against the plain same-items writer
// through the same kind of relay.
func (r *runner) uplinkBytes(ctx context.Context) error {
	if err := r.probeTxLimit(ctx); err != nil {
		return err
	}
	rie, bootstrap, err := functionBinaries()
	if err != nil {
		return err
	}
	res := uplinkBytesResult{Estimate: map[string]int{"tls_record": tlsRecordBytes, "tls_record_payload": tlsRecordPayload,
		"tls_handshake_up": tlsHandshakeUp, "tls_handshake_down": tlsHandshakeDown, "session_token_per_request": sessionTokenBytes}}
	phases := []struct {
		name  string
		run   func(ctx context.Context, target, rie, bootstrap string) (bytesRun, []*itemBatch, error)
		g     int
		plain *bytesRun
	}{
		{"live", r.bytesLive, plainLiveGoroutines, &res.PlainLive},
		{"draining", r.bytesDrain, r.cfg.UplinkConcurrency, &res.PlainDrain},
	}
	for _, ph := range phases {
		// The plain writer writes the direct run's batches.
		var items []*itemBatch
		for _, target := range []string{bytesDirect, bytesLambda} {
			run, its, err := ph.run(ctx, target, rie, bootstrap)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", target, ph.name, err)
			}
			res.Runs = append(res.Runs, run)
			if items == nil {
				items = its
			}
		}
		r.log.Info("uplink bytes: the plain same-items writer", "phase", ph.name, "batches", len(items), "goroutines", ph.g)
		plain, err := r.plainSameItems(ctx, items, ph.g)
		if err != nil {
			return fmt.Errorf("plain writer, %s: %w", ph.name, err)
		}
		plain.Phase = ph.name
		*ph.plain = plain
	}
	r.res.Details["uplink bytes"] = res
	r.reportUplinkBytes(res)
	return nil
}

// probeTxLimit probes the endpoint's per-transaction action limit, which
// the readings function is given, unless a scenario before did.
func (r *runner) probeTxLimit(ctx context.Context) error {
	if r.txLimit != 0 {
		return nil
	}
	_, tables, err := newTables(ctx, r.dynamo.client, false)
	if err != nil {
		return err
	}
	r.txLimit, err = cloud.ProbeTransactionLimit(ctx, r.dynamo.client, tables.ProcessedBatches)
	return errors.Join(err, dropTables(ctx, r.dynamo.client, tables))
}

// relays are the relays in front of one uplink's endpoints.
type relays map[string]*byterelay.Relay

// dynamoRelay starts a relay in front of DynamoDB Local.
func (r *runner) dynamoRelay() (relays, error) {
	rl, err := byterelay.Start(strings.TrimPrefix(r.dynamo.endpoint, "http://"))
	return relays{bytesDirect: rl}, err
}

func (rs relays) counts() (byterelay.Counts, map[string]byterelay.Counts) {
	var total byterelay.Counts
	by := map[string]byterelay.Counts{}
	for name, rl := range rs {
		c := rl.Counts()
		by[name] = c
		total = total.Add(c)
	}
	return total, by
}

func (rs relays) operations() map[string]byterelay.Operations {
	out := map[string]byterelay.Operations{}
	for name, rl := range rs {
		out[name] = rl.Operations()
	}
	return out
}

func subOps(after, before map[string]byterelay.Operations) map[string]byterelay.Operations {
	out := map[string]byterelay.Operations{}
	for k, v := range after {
		out[k] = v.Sub(before[k])
	}
	return out
}

func (rs relays) close() {
	for _, rl := range rs {
		_ = rl.Close()
	}
}

// settle waits until the relays' counts stand still for half a second
// (the request counter reads behind the bytes), at most 10 s, and returns
// them.
func (rs relays) settle(ctx context.Context) (byterelay.Counts, map[string]byterelay.Counts) {
	total, by := rs.counts()
	for range 20 {
		sleepCtx(ctx, 500*time.Millisecond)
		t, b := rs.counts()
		if t == total {
			break
		}
		total, by = t, b
	}
	return total, by
}

func sub(after, before map[string]byterelay.Counts) map[string]byterelay.Counts {
	out := map[string]byterelay.Counts{}
	for k, v := range after {
		out[k] = v.Sub(before[k])
	}
	return out
}

// lambdaTargetEnv is gatewayd's settings for invoking the readings
// function at the Invoke API url.
func lambdaTargetEnv(url string) []string {
	return []string{"GATEWAY_UPLINK_TARGET=lambda", "GATEWAY_UPLINK_LAMBDA_FUNCTION=" + lambdatest.FunctionName,
		"GATEWAY_UPLINK_LAMBDA_ENDPOINT=" + url}
}

// relayedFunction starts the readings function for the tables of prefix
// with a relay in front of its Invoke API, and returns gatewayd's settings
// for it.
func (r *runner) relayedFunction(rie, bootstrap, prefix string, rs relays) ([]string, func(), error) {
	url, stop, err := r.startFunctions(rie, bootstrap, prefix, nil)
	if err != nil {
		return nil, nil, err
	}
	rl, err := byterelay.Start(strings.TrimPrefix(url, "http://"))
	if err != nil {
		stop()
		return nil, nil, err
	}
	rs[bytesLambda] = rl
	return lambdaTargetEnv(rl.URL()), func() { _ = rl.Close(); stop() }, nil
}

// bytesLive runs gatewayd with the uplink to target behind relays while
// BytesDevices devices send it a batch of Readings readings each
// bytesInterval for BytesLive, each device at its own point of the
// interval, and counts what crossed the relays from the first batch to
// the uplink idle after the last delivery. It returns the items of the
// batches sent.
func (r *runner) bytesLive(ctx context.Context, target, rie, bootstrap string) (bytesRun, []*itemBatch, error) {
	run := bytesRun{Target: target, Phase: "live", ByEndpoint: map[string]byterelay.Counts{}}
	prefix, tables, err := newTables(ctx, r.dynamo.client, true)
	if err != nil {
		return run, nil, err
	}
	defer func() { _ = dropTables(ctx, r.dynamo.client, tables) }()
	key, _, err := cloud.NewKeys(r.dynamo.client, tables.APIKeys, pepper).Create(ctx, "bench")
	if err != nil {
		return run, nil, err
	}
	rs, err := r.dynamoRelay()
	if err != nil {
		return run, nil, err
	}
	defer rs.close()
	var env []string
	if target == bytesLambda {
		extra, stop, err := r.relayedFunction(rie, bootstrap, prefix, rs)
		if err != nil {
			return run, nil, err
		}
		defer stop()
		env = extra
	}
	name := "bytes-live-" + target
	g, err := startGatewayd(ctx, gatewaydSpec{bin: r.bin, dataDir: filepath.Join(r.work, name), endpoint: rs[bytesDirect].URL(),
		prefix: prefix, logPath: filepath.Join(r.work, "gatewayd-"+name+".log"), env: r.env(env...)})
	if err != nil {
		return run, nil, err
	}
	defer g.proc.Kill()
	url := "http://" + g.httpAddr + "/v1/readings"
	tr := &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: answerTimeout}
	// The key is looked up once, as on a gateway's first device request;
	// the window starts after that.
	if code, err := post(ctx, client, url, key, []byte(`{"batches":[]}`)); err != nil || code == http.StatusUnauthorized ||
		code == http.StatusServiceUnavailable {
		return run, nil, fmt.Errorf("verifying the key: %d %v", code, err)
	}
	_, before := rs.settle(ctx)
	ops0 := rs.operations()
	m0, err := g.metrics(ctx)
	if err != nil {
		return run, nil, err
	}
	r.log.Info("uplink bytes: live rate", "target", target, "devices", r.cfg.BytesDevices, "for", r.cfg.BytesLive)
	t0 := time.Now()
	sent, err := liveLoad(ctx, client, url, key, r.nextFleet(), r.cfg.BytesDevices, r.cfg.Readings, r.cfg.BytesLive)
	if err != nil {
		return run, nil, err
	}
	if err := waitDelivered(ctx, g, r.cfg.DrainTimeout); err != nil {
		return run, nil, err
	}
	_, after := rs.settle(ctx)
	run.Operations = subOps(rs.operations(), ops0)
	run.Seconds = time.Since(t0).Seconds()
	m1, err := g.metrics(ctx)
	if err != nil {
		return run, nil, err
	}
	run.ByEndpoint = sub(after, before)
	for _, c := range run.ByEndpoint {
		run.Total = run.Total.Add(c)
	}
	run.Batches = int64(len(sent))
	run.Readings = int64(len(sent) * r.cfg.Readings)
	run.GatewaySent = delta(m0, m1, "gateway_uplink_bytes_total", `direction="sent"`)
	run.GatewayReceived = delta(m0, m1, "gateway_uplink_bytes_total", `direction="received"`)
	if n := delta(m0, m1, "gateway_uplink_readings_total"); int64(n) != run.Readings {
		r.res.note("uplink bytes, %s, live: gatewayd forwarded %.0f readings in the window, the devices sent %d", target, n, run.Readings)
	}
	if err := g.stop(); err != nil {
		return run, nil, err
	}
	if run.ReadingsStored, err = countItems(ctx, r.dynamo.client, tables.Readings); err != nil {
		return run, nil, err
	}
	if run.MarkersStored, err = countItems(ctx, r.dynamo.client, tables.ProcessedBatches); err != nil {
		return run, nil, err
	}
	items, err := r.itemsOf(ctx, filepath.Join(r.work, name+"-items"), sent)
	return run, items, err
}

// liveLoad has devices devices post a batch of readings readings each
// interval for window, device i first at i/devices of the interval plus a
// random part of its share, so that they never send in lockstep. It
// returns the batches sent, each answered 200.
func liveLoad(ctx context.Context, client *http.Client, url, key string, fleet byte, devices, readings int, window time.Duration) ([]deviceBatch, error) {
	t0 := time.Now()
	end := t0.Add(window)
	share := bytesInterval / time.Duration(devices)
	start := t0.Add(-10 * time.Minute)
	var (
		mu    sync.Mutex
		sent  []deviceBatch
		fails atomic.Int64
		first error
		wg    sync.WaitGroup
	)
	for i := range devices {
		dev := fleetgen.NewDevice(fleetgen.HardwareID(fleet, i), start, uint64(i))
		offset := time.Duration(i)*share + rand.N(share)
		wg.Go(func() {
			for at := t0.Add(offset); at.Before(end) && ctx.Err() == nil; at = at.Add(bytesInterval) {
				sleepUntil(ctx, at)
				_, payload, err := dev.Next(readings)
				var code int
				if err == nil {
					code, err = post(ctx, client, url, key, payload)
				}
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("device %s: answered %d", dev.HardwareID(), code)
				}
				mu.Lock()
				if err != nil {
					fails.Add(1)
					if first == nil {
						first = err
					}
				} else {
					sent = append(sent, deviceBatch{hardwareID: dev.HardwareID(), payload: payload})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if first != nil {
		return nil, fmt.Errorf("%d batches not accepted, the first: %w", fails.Load(), first)
	}
	return sent, nil
}

// waitDelivered waits until gatewayd has nothing pending, at most timeout.
func waitDelivered(ctx context.Context, g *gatewayd, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		m, err := g.metrics(ctx)
		if err != nil {
			return err
		}
		if m.sum("gateway_buffer_pending_batches") == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%.0f batches still pending after %s", m.sum("gateway_buffer_pending_batches"), timeout)
		}
		sleepCtx(ctx, 250*time.Millisecond)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// bytesDrain writes a backlog of BytesBacklog readings from BytesDevices
// devices and has gatewayd deliver it to target behind relays, counting
// everything that crossed them from gatewayd's start to its stop. It
// returns the backlog's items.
func (r *runner) bytesDrain(ctx context.Context, target, rie, bootstrap string) (bytesRun, []*itemBatch, error) {
	run := bytesRun{Target: target, Phase: "draining"}
	dir := filepath.Join(r.work, "bytes-drain-"+target)
	batches := r.cfg.BytesBacklog / r.cfg.Readings
	r.log.Info("uplink bytes: writing the backlog", "target", target, "batches", batches)
	f, err := r.writeBacklog(ctx, dir, r.cfg.BytesDevices, batches)
	if err != nil {
		return run, nil, err
	}
	rs, err := r.dynamoRelay()
	if err != nil {
		return run, nil, err
	}
	defer rs.close()
	var via drainTarget
	if target == bytesLambda {
		via = func(ctx context.Context, prefix string) ([]string, func(), error) {
			return r.relayedFunction(rie, bootstrap, prefix, rs)
		}
	}
	gd, err := r.gatewayDrain(ctx, r.dynamo.client, dir, uplink.DefaultConfig().WriteMode, rs[bytesDirect].URL(), via)
	if err != nil {
		return run, nil, err
	}
	run.Total, run.ByEndpoint = rs.settle(ctx)
	run.Operations = rs.operations()
	run.Drain = &gd
	run.Seconds = gd.Seconds
	run.Batches, run.Readings = int64(f.info.Batches), int64(f.info.Readings)
	run.ReadingsStored, run.MarkersStored = gd.ReadingsStored, gd.MarkersStored
	return run, f.items, nil
}

// itemsOf stores batches in a buffer in dir and returns their items, as
// the uplink builds them.
func (r *runner) itemsOf(ctx context.Context, dir string, batches []deviceBatch) ([]*itemBatch, error) {
	if _, err := storeBatches(ctx, dir, len(batches), func(i int) (string, []byte, error) {
		return batches[i].hardwareID, batches[i].payload, nil
	}); err != nil {
		return nil, err
	}
	pend, err := readBacklog(dir)
	if err != nil {
		return nil, err
	}
	return allItems(pend)
}

// plainSameItems writes the items gatewayd writes for batches, readings
// and a processed_batches marker each, unconditionally, 25 to a
// BatchWriteItem, from g goroutines through a relay in front of DynamoDB
// Local, into fresh tables, and counts what crossed the relay.
func (r *runner) plainSameItems(ctx context.Context, items []*itemBatch, g int) (bytesRun, error) {
	run := bytesRun{Target: "plain", Goroutines: g, Batches: int64(len(items))}
	for _, ib := range items {
		run.Readings += int64(len(ib.readings))
	}
	rs, err := r.dynamoRelay()
	if err != nil {
		return run, err
	}
	defer rs.close()
	client, err := cloud.NewClient(ctx, cloud.Config{Endpoint: rs[bytesDirect].URL(), Region: awsRegion}, cloud.WithConnections(g))
	if err != nil {
		return run, err
	}
	_, tables, err := newTables(ctx, r.dynamo.client, false)
	if err != nil {
		return run, err
	}
	defer func() { _ = dropTables(ctx, r.dynamo.client, tables) }()
	w, err := r.plainWrite(ctx, client, plainRequests(items, tables, true, false), g, r.consumedCapacity())
	if err != nil {
		return run, err
	}
	run.Seconds = w.Seconds
	run.Total, run.ByEndpoint = rs.settle(ctx)
	run.Operations = rs.operations()
	if run.ReadingsStored, err = countItems(ctx, r.dynamo.client, tables.Readings); err != nil {
		return run, err
	}
	if run.MarkersStored, err = countItems(ctx, r.dynamo.client, tables.ProcessedBatches); err != nil {
		return run, err
	}
	if run.ReadingsStored != run.Readings || run.MarkersStored != run.Batches {
		return run, fmt.Errorf("plain same-items writer: wrote %d readings and %d markers, the tables hold %d and %d",
			run.Readings, run.Batches, run.ReadingsStored, run.MarkersStored)
	}
	return run, nil
}

// bytesTarget is the targets on bytes up per reading: gatewayd writing
// DynamoDB at the live rate sends no more than the plain writer of the
// same items; through the function, at most 60 bytes a reading live and
// 30 draining.
func bytesTarget(target, phase string) *target {
	switch {
	case target == bytesDirect && phase == "live":
		return ratioAtMost(1.0)
	case target == bytesLambda && phase == "live":
		return atMost(60, "B")
	case target == bytesLambda && phase == "draining":
		return atMost(30, "B")
	}
	return nil
}

// reportUplinkBytes adds the scenario's figures: for each target and
// phase, per reading against the plain same-items writer of the phase.
func (r *runner) reportUplinkBytes(res uplinkBytesResult) {
	for _, run := range res.Runs {
		plain := res.PlainLive
		if run.Phase == "draining" {
			plain = res.PlainDrain
		}
		section := "uplink bytes, " + run.Target + ", " + run.Phase
		base := fmt.Sprintf("plain same-items writer, %d goroutines", plain.Goroutines)
		if plain.Goroutines == 1 {
			base = "plain same-items writer, 1 goroutine"
		}
		r.res.add(section, "bytes up per reading (at the socket, headers included)", "B",
			run.perReading(run.Total.Up), plain.perReading(plain.Total.Up), base, bytesTarget(run.Target, run.Phase))
		r.res.add(section, "bytes down per reading", "B", run.perReading(run.Total.Down), plain.perReading(plain.Total.Down), base, nil)
		r.res.add(section, "requests per 1,000 readings", "req", run.per1000(run.Total.Requests), plain.per1000(plain.Total.Requests), base, nil)
		r.res.add(section, "connections per 1,000 readings", "conn", run.per1000(run.Total.Connections),
			plain.per1000(plain.Total.Connections), base, nil)
		up, down := run.tlsEstimate()
		pUp, pDown := plain.tlsEstimate()
		r.res.add(section, "ESTIMATE: bytes up per reading with TLS and a session token", "B", up, pUp, base+", same estimate", nil)
		r.res.add(section, "ESTIMATE: bytes down per reading with TLS", "B", down, pDown, base+", same estimate", nil)
		var parts []string
		for _, name := range []string{bytesDirect, bytesLambda} {
			if c, ok := run.ByEndpoint[name]; ok {
				parts = append(parts, fmt.Sprintf("%s endpoint %d B up, %d B down, %d requests, %d connections",
					name, c.Up, c.Down, c.Requests, c.Connections))
			}
		}
		for _, name := range []string{bytesDirect, bytesLambda} {
			if ops := run.Operations[name]; len(ops) > 0 {
				r.res.note("%s: %s endpoint by operation: %s", section, name, opsText(ops))
			}
		}
		window := "from the first device batch to the uplink idle after the last delivery (the key's first lookup before it left out)"
		if run.Phase == "draining" {
			window = "from gatewayd's start to its stop, start-up included"
		}
		r.res.note("%s: %d readings in %d batches in %.0f s, counted %s: %s", section, run.Readings, run.Batches, run.Seconds,
			window, strings.Join(parts, "; "))
		if run.GatewaySent > 0 && (int64(run.GatewaySent) != run.Total.Up || int64(run.GatewayReceived) != run.Total.Down) {
			r.res.note("%s: gatewayd's own count (gateway_uplink_bytes_total) %.0f B up, %.0f B down; the relays %d and %d",
				section, run.GatewaySent, run.GatewayReceived, run.Total.Up, run.Total.Down)
		}
		if run.ReadingsStored != run.Readings || run.MarkersStored != run.Batches {
			r.res.note("%s: counts differ: %d readings in %d batches sent, the tables hold %d readings, %d markers",
				section, run.Readings, run.Batches, run.ReadingsStored, run.MarkersStored)
		}
		if run.Total.Unparsed > 0 {
			r.res.note("%s: %d connections stopped parsing as HTTP/1.x: their later requests are not counted", section, run.Total.Unparsed)
		}
		if d := run.Drain; d != nil && d.Invocations > 0 {
			r.res.note("%s: %.0f invocations carried %.0f batches (%.1f an invocation)", section, d.Invocations, d.InvokedBatches,
				d.InvokedBatches/d.Invocations)
		}
	}
	for _, plain := range []bytesRun{res.PlainLive, res.PlainDrain} {
		if ops := plain.Operations[bytesDirect]; len(ops) > 0 {
			r.res.note("uplink bytes, plain same-items writer, %s: by operation: %s", plain.Phase, opsText(ops))
		}
	}
	r.res.note("uplink bytes: live rate %d devices, a batch of %d readings each %s for %s, each device at its own point of the minute; "+
		"draining a backlog of %d readings from %d devices; the lambda target's function is the readings function under the Runtime Interface "+
		"Emulator (its own writes to DynamoDB are the cloud's, not counted). The plain same-items writer writes the items gatewayd writes "+
		"(readings, a processed_batches marker a batch), unconditionally, 25 to a BatchWriteItem: live, the direct run's batches with one goroutine; "+
		"draining, the direct drain's backlog with %d goroutines",
		r.cfg.BytesDevices, r.cfg.Readings, bytesInterval, r.cfg.BytesLive, r.cfg.BytesBacklog, r.cfg.BytesDevices,
		r.cfg.UplinkConcurrency)
	r.res.note("uplink bytes: ESTIMATE, not measured (the benchmark's sockets carry plain HTTP): TLS adds %d B a record (AES-GCM; one record "+
		"per request or answer, one more per 16 KiB) and a full handshake of %d B up and %d B down a connection (certificate chain, no "+
		"resumption); temporary credentials add an X-Amz-Security-Token of about %d B to every request; from the counted requests and connections",
		tlsRecordBytes, tlsHandshakeUp, tlsHandshakeDown, sessionTokenBytes)
}

// opsText is a relay's operations, most requests first: each one's
// requests and bytes up, in all and per request.
func opsText(ops byterelay.Operations) string {
	names := make([]string, 0, len(ops))
	for name := range ops {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if ops[names[i]].Requests != ops[names[j]].Requests {
			return ops[names[i]].Requests > ops[names[j]].Requests
		}
		return names[i] < names[j]
	})
	parts := make([]string, 0, len(names))
	for _, name := range names {
		o := ops[name]
		label := strings.TrimPrefix(name, "DynamoDB_20120810.")
		if label == "" {
			label = "(no X-Amz-Target)"
		}
		per := int64(0)
		if o.Requests > 0 {
			per = o.Up / o.Requests
		}
		parts = append(parts, fmt.Sprintf("%s %d requests, %d B up (%d B each)", label, o.Requests, o.Up, per))
	}
	return strings.Join(parts, "; ")
}

//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"greenhouse-gateway/harness/faultproxy"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/uplink"
)

// slowLinkRun is the batch-mode drain with every DynamoDB request delayed
// by a proxy, as a gateway's requests are by its uplink to AWS, against
// the plain writer through the same proxy.
type slowLinkRun struct {
	Delay   string       `json:"delay"`
	Backlog backlog      `json:"backlog"`
	Gateway gatewayDrain `json:"gatewayd"`
	// Before and After are the plain writer with as many goroutines as
	// gatewayd may have requests in flight (uplink.max_concurrency),
	// just before and just after the drain.
	Before plainRun `json:"plain_before"`
	After  plainRun `json:"plain_after"`
	// Proxied is how many requests the proxy delayed.
	Proxied uint64 `json:"requests_delayed"`
}

// drainSlowLink runs the slow-link drain (--link-delay): a backlog of the
// drains' size and shape, the plain writer, gatewayd in batch mode and the
// plain writer again, all through a fault proxy in latency mode in front
// of DynamoDB Local.
func (r *runner) drainSlowLink(ctx context.Context) (slowLinkRun, error) {
	run := slowLinkRun{Delay: r.cfg.LinkDelay.String()}
	px, err := faultproxy.New(faultproxy.Config{Target: r.dynamo.endpoint}, nil)
	if err != nil {
		return run, err
	}
	if err := px.Listen(); err != nil {
		return run, err
	}
	pctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- px.Run(pctx) }()
	defer func() {
		stop()
		<-served
	}()
	if err := px.Set(faultproxy.Fault{Mode: faultproxy.Latency, Delay: r.cfg.LinkDelay}); err != nil {
		return run, err
	}
	client, err := cloud.NewClient(ctx, cloud.Config{Endpoint: px.URL(), Region: awsRegion}, cloud.WithConnections(256))
	if err != nil {
		return run, err
	}

	dir := filepath.Join(r.work, "drain-slow-link")
	batches := r.cfg.DrainReadings / r.cfg.Readings
	r.log.Info("drain over a slow link: writing the backlog", "delay", r.cfg.LinkDelay, "batches", batches)
	f, err := r.writeBacklog(ctx, dir, r.cfg.maxDevices(), batches)
	if err != nil {
		return run, err
	}
	run.Backlog = f.info
	pricing := priceItems(f.items)
	reqs := plainRequests(f.items)
	g := uplink.Config{}.MaxInFlight()
	if run.Before, err = r.plainAt(ctx, client, reqs, pricing, g); err != nil {
		return run, err
	}
	if run.Gateway, err = r.gatewayDrain(ctx, r.dynamo.client, dir, "batch", px.URL(), nil); err != nil {
		return run, err
	}
	if run.After, err = r.plainAt(ctx, client, reqs, pricing, g); err != nil {
		return run, err
	}
	run.Proxied = px.Stats().Requests[faultproxy.Latency]
	gw := run.Gateway
	if int64(gw.Readings) != int64(run.Backlog.Readings) || gw.ReadingsStored != int64(run.Backlog.Readings) ||
		gw.MarkersStored != int64(run.Backlog.Batches) {
		return run, fmt.Errorf("backlog %d readings in %d batches; gatewayd forwarded %.0f readings; tables hold %d readings, %d markers",
			run.Backlog.Readings, run.Backlog.Batches, gw.Readings, gw.ReadingsStored, gw.MarkersStored)
	}
	if run.Proxied == 0 {
		return run, errors.New("the proxy delayed no request")
	}
	return run, nil
}

// reportSlowLink adds the slow-link drain's figures.
func (r *runner) reportSlowLink(run slowLinkRun) {
	section := "drain batch, slow link"
	gw := run.Gateway
	best := bestPlain([]plainRun{run.Before, run.After})
	base := fmt.Sprintf("plain BatchWriteItem, %d goroutines (uplink.max_concurrency), same link, faster of the runs just before and after",
		best.Goroutines)
	r.res.add(section, "readings/s until pending is 0", "readings/s", gw.Readings/gw.Seconds, best.rate(), base, nil)
	r.res.add(section, "gatewayd CPU per 1,000 readings forwarded", "CPU s", 1000*gw.CPUSeconds/gw.Readings,
		1000*best.ClientCPU/float64(best.Readings), base+", its process", nil)
	r.res.note("%s: every DynamoDB request %s later, by a proxy in front of DynamoDB Local (%d requests delayed); "+
		"%d readings from %d devices; plain writer %.0f readings/s just before gatewayd's drain and %.0f just after; "+
		"gatewayd: requests in flight allowed %s, on average in flight %.1f, CPU %.1fs",
		section, run.Delay, run.Proxied, run.Backlog.Readings, run.Backlog.Devices, run.Before.rate(), run.After.rate(),
		spread(gw.Concurrency), gw.RequestSeconds/gw.Seconds, gw.CPUSeconds)
	r.noteBracketSpread(section, run.Before, run.After, gw)
}

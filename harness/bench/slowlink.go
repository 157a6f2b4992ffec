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
// the plain writer through the same proxy with as many goroutines as
// gatewayd may have requests in flight (uplink.max_concurrency).
type slowLinkRun struct {
	bracketedDrain
	Delay string `json:"delay"`
	// Proxied is how many requests the proxy delayed.
	Proxied uint64 `json:"requests_delayed"`
}

// drainSlowLink runs the slow-link drain (--link-delay): a bracketed
// batch-mode drain, gatewayd and the plain writer both through a fault
// proxy in latency mode in front of DynamoDB Local.
func (r *runner) drainSlowLink(ctx context.Context) (slowLinkRun, error) {
	run := slowLinkRun{Delay: r.cfg.LinkDelay.String()}
	px, stop, err := faultproxy.Launch(faultproxy.Config{Target: r.dynamo.endpoint})
	if err != nil {
		return run, err
	}
	defer func() { _ = stop() }()
	if err := px.Set(faultproxy.Fault{Mode: faultproxy.Latency, Delay: r.cfg.LinkDelay}); err != nil {
		return run, err
	}
	client, err := cloud.NewClient(ctx, cloud.Config{Endpoint: px.URL(), Region: awsRegion}, cloud.WithConnections(256))
	if err != nil {
		return run, err
	}
	r.log.Info("drain over a slow link", "delay", r.cfg.LinkDelay)
	if run.bracketedDrain, _, err = r.bracket(ctx, filepath.Join(r.work, "drain-slow-link"), "batch", px.URL(), client,
		uplink.Config{}.MaxInFlight()); err != nil {
		return run, err
	}
	if run.Proxied = px.Stats().Requests[faultproxy.Latency]; run.Proxied == 0 {
		return run, errors.New("the proxy delayed no request")
	}
	return run, nil
}

// reportSlowLink adds the slow-link drain's figures.
func (r *runner) reportSlowLink(run slowLinkRun) {
	section := "drain batch, slow link"
	gw := run.Gateway
	best := run.ceiling()
	base := fmt.Sprintf("plain same-items BatchWriteItem, %d goroutines (uplink.max_concurrency), same link, faster of the runs just before and after",
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
	if differ := run.countsDiffer(); differ != "" {
		r.res.note("%s: counts differ: %s", section, differ)
	}
}

// Package pushmetrics pushes the gateway's metrics to a Prometheus Pushgateway, for gateways
// that Prometheus cannot scrape: behind NAT, on a mobile link, without an inbound port.
//
// Every Config.Interval the whole registry is gathered and pushed with HTTP PUT under the
// grouping key {job, instance}, replacing the previous push of the same gateway; the first
// push happens at once, and a last one when Run's context ends, so that the Pushgateway holds
// the gateway's final counters and its push_time_seconds says when the gateway stopped. The
// Pushgateway keeps a group until it is deleted: a gateway that stops pushing shows up as a
// stale push_time_seconds (alert GatewayPushStale in deploy/monitoring/alerts.yaml), and a
// decommissioned gateway's group is deleted by hand.
//
// Failures are logged once when pushing starts to fail and once when it recovers (with the
// number of failed pushes and the time it took), not at every attempt; pushing goes on at the
// same interval meanwhile. Nothing is buffered: a push that fails is simply replaced by the
// next one, which carries the current values.
package pushmetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
)

const (
	// DefaultInterval is the push interval when Config.Interval is zero.
	DefaultInterval = 30 * time.Second
	// DefaultJob is the job label when Config.Job is empty.
	DefaultJob = "greenhouse_gateway"
	// minInterval guards against a unit-less interval ("interval: 30" is 30 ns).
	minInterval = time.Second
	// maxPushTimeout bounds one push; shorter intervals bound it to the interval.
	maxPushTimeout = 10 * time.Second
	// finalPushTimeout bounds the push on shutdown, which runs within the gateway's
	// shutdown_timeout.
	finalPushTimeout = 5 * time.Second
)

// Config configures pushing. The zero value of a field means its default; an empty URL
// turns pushing off.
type Config struct {
	// URL is the Pushgateway's base URL, without the /metrics/job/... part: for example
	// http://pushgateway.example:9091, or https://host/pushgateway behind a reverse proxy.
	// Credentials in it (https://user:password@host) are sent as HTTP basic auth and never
	// logged. Empty (the default) means no pushing.
	URL string `yaml:"url"`
	// Interval is the time between pushes, at least 1s. Default 30s.
	Interval time.Duration `yaml:"interval"`
	// Job is the job label of the pushed group. Default greenhouse_gateway.
	Job string `yaml:"job"`
	// Instance is the instance label of the pushed group, which tells gateways apart: it
	// must be unique per gateway. Default: the host name.
	Instance string `yaml:"instance"`
}

// DefaultConfig returns the defaults documented on Config (the instance stays empty: it is
// the host name, looked up by New).
func DefaultConfig() Config {
	return Config{Interval: DefaultInterval, Job: DefaultJob}
}

// Enabled reports whether c pushes at all.
func (c Config) Enabled() bool { return c.URL != "" }

// Validate reports the first invalid field. A configuration without a URL is valid (off).
func (c Config) Validate() error {
	if c.Interval < 0 || (c.Interval > 0 && c.Interval < minInterval) {
		return fmt.Errorf("push.interval: %s is too short: at least %s (write units: 30s)", c.Interval, minInterval)
	}
	if c.URL == "" {
		return nil
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("push.url: want an http or https URL: %w", redactErr(err, c.URL))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("push.url %q: want an absolute http or https URL", u.Redacted())
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("push.url %q: no query or fragment, only the Pushgateway's base URL", u.Redacted())
	}
	return nil
}

// redactErr keeps a URL's password out of a url.Parse error.
func redactErr(err error, raw string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return fmt.Errorf("unparsable URL (%d characters)", len(raw))
}

// Pusher pushes a registry to a Pushgateway. A Pusher made from a configuration without URL
// does nothing.
type Pusher struct {
	pusher    *push.Pusher
	transport *http.Transport
	interval  time.Duration
	timeout   time.Duration
	where     string // the URL without credentials, for logs
	job       string
	instance  string
	logger    *slog.Logger

	// Failure state, owned by Run's goroutine.
	failing  bool
	failures int
	since    time.Time
}

// New validates cfg and returns a Pusher for gatherer (the gateway's registry). It does no
// network I/O; an empty cfg.Instance is replaced by the host name. A nil logger discards
// the log.
func New(cfg Config, gatherer prometheus.Gatherer, logger *slog.Logger) (*Pusher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Pusher{logger: logger.With("component", "pushmetrics")}
	if !cfg.Enabled() {
		return p, nil
	}
	if gatherer == nil {
		return nil, errors.New("pushmetrics: a gatherer is required")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Job == "" {
		cfg.Job = DefaultJob
	}
	if cfg.Instance == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			return nil, fmt.Errorf("push.instance: not set and no host name to use instead: %v", err)
		}
		cfg.Instance = host
	}
	u, _ := url.Parse(cfg.URL) // validated above
	user := u.User
	u.User = nil
	p.where = u.String()

	p.transport = http.DefaultTransport.(*http.Transport).Clone() // proxies from the environment
	p.interval = cfg.Interval
	p.timeout = min(cfg.Interval, maxPushTimeout)
	p.job, p.instance = cfg.Job, cfg.Instance
	p.pusher = push.New(p.where, cfg.Job).
		Gatherer(gatherer).
		Grouping("instance", cfg.Instance).
		Client(&http.Client{Transport: p.transport})
	if user != nil {
		password, _ := user.Password()
		p.pusher.BasicAuth(user.Username(), password)
	}
	return p, nil
}

// Run pushes until ctx is done, then pushes once more and returns nil. It returns at once
// when pushing is off. Failed pushes are logged, not returned: metrics must never stop the
// gateway.
func (p *Pusher) Run(ctx context.Context) error {
	if p.pusher == nil {
		return nil
	}
	defer p.transport.CloseIdleConnections()
	p.logger.Info("pushing metrics", "url", p.where, "job", p.job, "instance", p.instance, "interval", p.interval.String())
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	p.pushOnce(ctx, p.timeout)
	for {
		select {
		case <-ctx.Done():
			p.pushOnce(context.WithoutCancel(ctx), min(p.timeout, finalPushTimeout))
			return nil
		case <-tick.C:
			p.pushOnce(ctx, p.timeout)
		}
	}
}

// pushOnce pushes within timeout and logs state changes.
func (p *Pusher) pushOnce(ctx context.Context, timeout time.Duration) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := p.pusher.PushContext(pctx)
	if err != nil && ctx.Err() != nil {
		return // interrupted by shutdown; the final push follows
	}
	p.record(err)
}

// record updates the failure state after one push.
func (p *Pusher) record(err error) {
	now := time.Now()
	switch {
	case err != nil && !p.failing:
		p.failing, p.failures, p.since = true, 1, now
		p.logger.Warn("pushing metrics failed; retrying every interval", "url", p.where,
			"interval", p.interval.String(), "err", err)
	case err != nil:
		p.failures++
		p.logger.Debug("pushing metrics failed again", "failed_pushes", p.failures, "err", err)
	case p.failing:
		p.logger.Info("pushing metrics recovered", "url", p.where, "failed_pushes", p.failures,
			"down_for", now.Sub(p.since).Round(time.Millisecond).String())
		p.failing, p.failures = false, 0
	}
}

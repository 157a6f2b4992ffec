package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/delivery"
)

// Environment variables of the operator API commands.
const (
	envAdminToken     = "GATEWAY_ADMIN_TOKEN"
	envAdminTokenFile = "GATEWAY_ADMIN_TOKEN_FILE"
)

const defaultURL = "http://127.0.0.1:8080"

// apiFlags are the flags of commands that ask a running gatewayd.
type apiFlags struct {
	url       *string
	tokenFile *string
}

func registerAPIFlags(fs *flag.FlagSet, getenv func(string) string, defURL string) apiFlags {
	return apiFlags{
		url: fs.String("url", defURL, "base URL of the running gatewayd's HTTP API"),
		tokenFile: fs.String("admin-token-file", getenv(envAdminTokenFile),
			"file holding the gateway's admin token (env "+envAdminTokenFile+"; or the token itself in "+envAdminToken+")"),
	}
}

// apiClient asks a running gatewayd's operator API.
type apiClient struct {
	base  string
	token string
	http  *http.Client
}

func (f apiFlags) client(env *cmdEnv) (*apiClient, error) {
	u, err := url.Parse(*f.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{msg: fmt.Sprintf("--url: %q is not an http:// or https:// URL", *f.url)}
	}
	token := env.getenv(envAdminToken)
	if *f.tokenFile != "" {
		raw, err := os.ReadFile(*f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("reading the admin token: %w", err)
		}
		token = strings.TrimRight(string(raw), "\r\n")
	}
	// A gateway answers its operator API from memory or one Badger read;
	// a minute bounds a hung one (--timeout bounds the whole command).
	return &apiClient{base: strings.TrimRight(*f.url, "/"), token: token, http: &http.Client{Timeout: time.Minute}}, nil
}

// errNotAvailable is a 404 from an endpoint: an older gatewayd.
var errNotAvailable = errors.New("not available on this gateway")

// apiError is an answer other than 2xx.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d: %s", e.code, e.msg) }

// do sends a request and decodes a 2xx JSON answer into out. A 404 of a
// route the gateway does not have is errNotAvailable.
func (c *apiClient) do(ctx context.Context, method, path string, admin bool, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return fmt.Errorf("building the request: %w", err)
	}
	if admin {
		if c.token == "" {
			return fmt.Errorf("%s needs the admin token: --admin-token-file FILE or %s", path, envAdminToken)
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("gatewayd is not answering on %s (connection refused): is it running, and is --url its http.addr?", c.base)
	}
	if err != nil {
		return fmt.Errorf("gatewayd is not answering on %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading the answer of %s: %w", path, err)
	}
	var msg struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(body, &msg)
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("admin token rejected by gatewayd at %s: give the token of its admin_token_file "+
			"(--admin-token-file FILE or %s)", c.base, envAdminToken)
	case resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("the operator API of gatewayd at %s is disabled: %s", c.base, msg.Message)
	case resp.StatusCode == http.StatusNotFound && msg.Message == "":
		return fmt.Errorf("%s %s: %w", method, path, errNotAvailable)
	case resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusServiceUnavailable:
		if msg.Message == "" {
			msg.Message = strings.TrimSpace(string(body))
		}
		return &apiError{code: resp.StatusCode, msg: msg.Message}
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("decoding the answer of %s: %w", path, err)
		}
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		return &apiError{code: resp.StatusCode, msg: msg.Message}
	}
	return nil
}

// metric reads one unlabelled sample from the gateway's /metrics.
func (c *apiClient) metrics(ctx context.Context, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics answered %d", resp.StatusCode)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// statusReport is what gatewayctl status prints (--json: as is).
type statusReport struct {
	URL          string           `json:"url"`
	Ready        bool             `json:"ready"`
	ReadyMessage string           `json:"ready_message,omitempty"`
	Uplink       *delivery.Report `json:"uplink"`
	// Backlog is read from /metrics when the gateway has no /v1/uplink.
	Backlog     *metricsBacklog `json:"backlog_from_metrics,omitempty"`
	Devices     *deviceSummary  `json:"devices,omitempty"`
	DeadLetters *int            `json:"dead_letters,omitempty"`
	Missing     []string        `json:"not_available,omitempty"`
	Problems    []string        `json:"problems,omitempty"`
	deadList    []buffer.DeadLetter
}

type metricsBacklog struct {
	// UplinkUp is nil when the gateway exports no gateway_uplink_up.
	UplinkUp         *bool   `json:"uplink_up,omitempty"`
	PendingBatches   int64   `json:"pending_batches"`
	PendingBytes     int64   `json:"pending_bytes"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

type deviceSummary struct {
	Known        int        `json:"known"`
	Registered   int        `json:"registered"`
	RebootLoops  int        `json:"reboot_loops"`
	CloudPending int        `json:"cloud_pending"`
	LastSeenAt   *time.Time `json:"last_seen_at,omitempty"`
}

// deviceView is the part of GET /v1/devices the summary needs.
type deviceView struct {
	Registered   bool      `json:"registered"`
	RebootLoop   bool      `json:"reboot_loop"`
	LastSeenAt   time.Time `json:"last_seen_at"`
	Version      uint64    `json:"version"`
	CloudVersion uint64    `json:"cloud_version"`
}

func setupStatus(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	api := registerAPIFlags(fs, getenv, defaultURL)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		c, err := api.client(env)
		if err != nil {
			return err
		}
		r, err := gatherStatus(ctx, c)
		if err != nil {
			return err
		}
		if *asJSON {
			return printIndentedJSON(env.stdout, r)
		}
		printStatus(env.stdout, r)
		return nil
	}
}

// gatherStatus asks /readyz, /v1/uplink, /v1/devices and /v1/dead-letters.
// Only an unreachable gateway or a rejected token is an error; what a
// gateway does not offer is listed in Missing.
func gatherStatus(ctx context.Context, c *apiClient) (*statusReport, error) {
	r := &statusReport{URL: c.base}
	var ready struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	}
	var aerr *apiError
	switch err := c.do(ctx, http.MethodGet, "/readyz", false, &ready); {
	case err == nil:
		r.Ready = true
	case errors.As(err, &aerr):
		r.ReadyMessage = aerr.msg
	default:
		return nil, err
	}
	if c.token == "" {
		r.Problems = append(r.Problems, "no admin token given (--admin-token-file FILE or "+envAdminToken+
			"): uplink, devices and dead letters are not shown")
		return r, nil
	}
	for _, gather := range []func(context.Context, *apiClient, *statusReport) error{gatherUplink, gatherDevices, gatherDeadLetters} {
		if err := gather(ctx, c, r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// gatherUplink asks /v1/uplink, or reads the backlog from /metrics where
// the gateway offers no such route.
func gatherUplink(ctx context.Context, c *apiClient, r *statusReport) error {
	var aerr *apiError
	var rep delivery.Report
	var noUplink *apiError
	switch err := c.do(ctx, http.MethodGet, "/v1/uplink", true, &rep); {
	case err == nil:
		r.Uplink = &rep
	case errors.Is(err, errNotAvailable), errors.As(err, &noUplink) && noUplink.code == http.StatusNotFound:
		// An older gatewayd has no such route; one without an uplink
		// says so. Either way the backlog is in /metrics.
		if noUplink != nil {
			r.Problems = append(r.Problems, "/v1/uplink: "+noUplink.Error())
		} else {
			r.Missing = append(r.Missing, "/v1/uplink")
		}
		m, merr := c.metrics(ctx, "gateway_uplink_up", "gateway_buffer_pending_batches",
			"gateway_buffer_pending_bytes", "gateway_buffer_oldest_pending_age_seconds")
		if merr != nil {
			r.Problems = append(r.Problems, "reading /metrics: "+merr.Error())
			break
		}
		r.Backlog = &metricsBacklog{PendingBatches: int64(m["gateway_buffer_pending_batches"]), PendingBytes: int64(m["gateway_buffer_pending_bytes"]),
			OldestAgeSeconds: m["gateway_buffer_oldest_pending_age_seconds"]}
		if v, ok := m["gateway_uplink_up"]; ok {
			up := v == 1
			r.Backlog.UplinkUp = &up
		}
	case errors.As(err, &aerr):
		r.Problems = append(r.Problems, "/v1/uplink: "+aerr.Error())
	default:
		return err
	}
	return nil
}

// gatherDevices summarizes /v1/devices.
func gatherDevices(ctx context.Context, c *apiClient, r *statusReport) error {
	var devices struct {
		Devices []deviceView `json:"devices"`
	}
	if ok, err := getReported(ctx, c, r, "/v1/devices", "/v1/devices", &devices); !ok {
		return err
	}
	s := &deviceSummary{Known: len(devices.Devices)}
	for _, d := range devices.Devices {
		if d.Registered {
			s.Registered++
		}
		if d.RebootLoop {
			s.RebootLoops++
		}
		if d.Registered && d.CloudVersion < d.Version {
			s.CloudPending++
		}
		if s.LastSeenAt == nil || d.LastSeenAt.After(*s.LastSeenAt) {
			s.LastSeenAt = &d.LastSeenAt
		}
	}
	r.Devices = s
	return nil
}

// gatherDeadLetters asks /v1/dead-letters for the count and the newest five.
func gatherDeadLetters(ctx context.Context, c *apiClient, r *statusReport) error {
	var dead struct {
		Count       int                 `json:"count"`
		DeadLetters []buffer.DeadLetter `json:"dead_letters"`
	}
	if ok, err := getReported(ctx, c, r, "/v1/dead-letters?limit=5", "/v1/dead-letters", &dead); !ok {
		return err
	}
	r.DeadLetters, r.deadList = &dead.Count, dead.DeadLetters
	return nil
}

// getReported GETs path, with the admin token, into v; ok reports whether
// v holds the answer. When it does not, a route the gateway does not serve
// is listed in r.Missing and an error it answered in r.Problems, both by
// route; err is any other error.
func getReported(ctx context.Context, c *apiClient, r *statusReport, path, route string, v any) (ok bool, err error) {
	var aerr *apiError
	switch err := c.do(ctx, http.MethodGet, path, true, v); {
	case err == nil:
		return true, nil
	case errors.Is(err, errNotAvailable):
		r.Missing = append(r.Missing, route)
	case errors.As(err, &aerr):
		r.Problems = append(r.Problems, route+": "+aerr.Error())
	default:
		return false, err
	}
	return false, nil
}

func printStatus(w io.Writer, r *statusReport) {
	if r.Ready {
		fmt.Fprintf(w, "gatewayd at %s: ready\n", r.URL)
	} else {
		fmt.Fprintf(w, "gatewayd at %s: NOT READY (%s)\n", r.URL, r.ReadyMessage)
	}
	if u := r.Uplink; u != nil {
		fmt.Fprintf(w, "uplink: %s since %s\n", u.State, fmtTime(u.Since))
		fmt.Fprintf(w, "backlog: %d batches, %s", u.BacklogBatches, fmtBytes(u.BacklogBytes))
		if u.BacklogBatches > 0 {
			fmt.Fprintf(w, ", oldest %s old", fmtSeconds(u.OldestAgeSeconds))
		}
		fmt.Fprintln(w)
		if u.DrainRateBatches > 0 || u.ETASeconds != nil {
			fmt.Fprintf(w, "draining: %.1f batches/s", u.DrainRateBatches)
			if u.ETASeconds != nil {
				fmt.Fprintf(w, ", empty in about %s", fmtSeconds(*u.ETASeconds))
			}
			fmt.Fprintln(w)
		}
		if u.LastDeliveryAt != nil {
			fmt.Fprintf(w, "last delivery: %s\n", fmtTime(*u.LastDeliveryAt))
		}
		if u.LastError != "" {
			at := ""
			if u.LastErrorAt != nil {
				at = " at " + fmtTime(*u.LastErrorAt)
			}
			fmt.Fprintf(w, "last error%s: %s (failed rounds: %d)\n", at, u.LastError, u.FailedRounds)
		}
	}
	if b := r.Backlog; b != nil {
		state := "unknown"
		if b.UplinkUp != nil {
			state = map[bool]string{true: "up", false: "down"}[*b.UplinkUp]
		}
		fmt.Fprintf(w, "uplink: %s (from /metrics)\n", state)
		fmt.Fprintf(w, "backlog: %d batches, %s", b.PendingBatches, fmtBytes(b.PendingBytes))
		if b.PendingBatches > 0 {
			fmt.Fprintf(w, ", oldest %s old", fmtSeconds(b.OldestAgeSeconds))
		}
		fmt.Fprintln(w)
	}
	if d := r.Devices; d != nil {
		fmt.Fprintf(w, "devices: %d known, %d registered, %d in a reboot loop, %d waiting for the devices table",
			d.Known, d.Registered, d.RebootLoops, d.CloudPending)
		if d.LastSeenAt != nil {
			fmt.Fprintf(w, "; last heard from %s", fmtTime(*d.LastSeenAt))
		}
		fmt.Fprintln(w)
	}
	if r.DeadLetters != nil {
		fmt.Fprintf(w, "dead letters: %d\n", *r.DeadLetters)
		for _, d := range r.deadList {
			fmt.Fprintf(w, "  %s  %s  %s\n", d.BatchID, d.HardwareID, oneLine(d.Reason))
		}
		if *r.DeadLetters > len(r.deadList) {
			fmt.Fprintf(w, "  ... (gatewayctl buffer dead-letters --url %s)\n", r.URL)
		}
	}
	if len(r.Missing) > 0 {
		fmt.Fprintf(w, "not available on this gateway (older gatewayd): %s\n", strings.Join(r.Missing, ", "))
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "note: %s\n", p)
	}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func fmtSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second)).Round(time.Second)
	if d >= 48*time.Hour {
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	}
	return d.String()
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

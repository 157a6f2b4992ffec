package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/harness/proc"
	"greenhouse-gateway/harness/syncbuf"
	"greenhouse-gateway/internal/cloud"
)

const (
	alertsPath     = "monitoring/alerts.yaml"
	alertTestsPath = "monitoring/alerts_test.yaml"
	dashboardPath  = "monitoring/grafana-dashboard.json"
)

// proposedMetrics are metrics the alerts and the dashboard use that gatewayd does not export
// yet; each is a request to its maintainers.
var proposedMetrics = map[string]string{
	"gateway_buffer_budget_bytes": "gauge: buffer.max_pending_bytes, the disk budget of undelivered batches",
}

// externalMetrics come from Prometheus or the Pushgateway, not from gatewayd.
var externalMetrics = map[string]string{
	"up":                "Prometheus: 1 when the scrape succeeded",
	"push_time_seconds": "Pushgateway: time of a group's last successful push",
}

func promtool(t *testing.T) string {
	t.Helper()
	return ensureTool(t, "promtool", "prometheus")
}

func runTool(t *testing.T, stdin []byte, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", filepath.Base(name), strings.Join(args, " "), out)
	return string(out)
}

func TestAlertRulesPassPromtool(t *testing.T) {
	pt := promtool(t)
	runTool(t, nil, pt, "check", "rules", alertsPath)
	out := runTool(t, nil, pt, "test", "rules", alertTestsPath)
	require.Contains(t, out, "SUCCESS")
}

type ruleFile struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert  string
			Record string
			Expr   string
		}
	}
}

func loadRules(t testing.TB) ruleFile {
	t.Helper()
	var rf ruleFile
	require.NoError(t, yaml.Unmarshal(readFile(t, alertsPath), &rf))
	return rf
}

// TestEveryAlertIsTestedFiringAndNot checks that alerts_test.yaml has, for every alert, a case
// where it fires and one where it must not.
func TestEveryAlertIsTestedFiringAndNot(t *testing.T) {
	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		}
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, alertTestsPath), &tests))
	require.Equal(t, []string{filepath.Base(alertsPath)}, tests.RuleFiles)
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			require.True(t, firing[r.Alert], "alert %s has no test case where it fires", r.Alert)
			require.True(t, silent[r.Alert], "alert %s has no test case where it must not fire", r.Alert)
		}
	}
	require.Positive(t, n)
}

type dashboard struct {
	UID        string
	Title      string
	Templating struct {
		List []struct {
			Name       string
			Type       string
			Query      any
			Datasource *datasourceRef
		}
	}
	Panels []panel
}

type datasourceRef struct {
	Type string
	UID  string
}

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource *datasourceRef
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr       string
		RefID      string
		Datasource *datasourceRef
	}
	Panels []panel // a collapsed row's panels
}

func loadDashboard(t testing.TB) dashboard {
	t.Helper()
	var d dashboard
	require.NoError(t, json.Unmarshal(readFile(t, dashboardPath), &d))
	return d
}

func (d dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// exprs returns every PromQL expression of the dashboard: panel targets and the metric
// selectors of label_values() variables.
func (d dashboard) exprs() []string {
	var out []string
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := ""
		switch x := v.Query.(type) {
		case string:
			q = x
		case map[string]any:
			q, _ = x["query"].(string)
		}
		if m := labelValues.FindStringSubmatch(q); m != nil {
			q = m[1]
		}
		out = append(out, q)
	}
	return out
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)

const dsVariable = "${DS_PROMETHEUS}"

// TestDashboardIsWellFormed checks the dashboard's structure: one Prometheus datasource
// variable used by every panel and query, unique panel IDs, and panels inside the 24-column
// grid and not overlapping.
func TestDashboardIsWellFormed(t *testing.T) {
	d := loadDashboard(t)
	require.NotEmpty(t, d.UID)
	require.NotEmpty(t, d.Title)
	var dsVars int
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "DS_PROMETHEUS" {
			dsVars++
			require.Equal(t, "prometheus", v.Query)
		}
		if v.Datasource != nil {
			require.Equal(t, datasourceRef{"prometheus", dsVariable}, *v.Datasource, "variable %s", v.Name)
		}
	}
	require.Equal(t, 1, dsVars, "one datasource variable DS_PROMETHEUS")

	ids := map[int]string{}
	type cell struct{ x, y int }
	occupied := map[cell]string{}
	for _, p := range d.allPanels() {
		require.NotZero(t, p.ID, "panel %q has no id", p.Title)
		require.NotContains(t, ids, p.ID, "panel id %d used twice", p.ID)
		ids[p.ID] = p.Title
		g := p.GridPos
		require.True(t, g.W > 0 && g.H > 0 && g.X >= 0 && g.X+g.W <= 24, "panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				other, taken := occupied[cell{x, y}]
				require.False(t, taken, "panels %q and %q overlap", p.Title, other)
				occupied[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		require.NotNil(t, p.Datasource, "panel %q has no datasource", p.Title)
		require.Equal(t, datasourceRef{"prometheus", dsVariable}, *p.Datasource, "panel %q", p.Title)
		require.NotEmpty(t, p.Targets, "panel %q has no queries", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q query %s", p.Title, tg.RefID)
			require.NotNil(t, tg.Datasource, "panel %q query %s has no datasource", p.Title, tg.RefID)
			require.Equal(t, datasourceRef{"prometheus", dsVariable}, *tg.Datasource, "panel %q query %s", p.Title, tg.RefID)
		}
	}
}

// TestDashboardQueriesParse checks that Prometheus parses every query of the dashboard:
// promtool check rules on the queries as recording rules, Grafana's variables filled in.
func TestDashboardQueriesParse(t *testing.T) {
	pt := promtool(t)
	d := loadDashboard(t)
	fill := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$job", ".+", "$instance", ".+")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range d.exprs() {
		require.NotContains(t, fill.Replace(e), "$", "unknown variable in %q", e)
		q, err := json.Marshal(fill.Replace(e))
		require.NoError(t, err)
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	require.NoError(t, os.WriteFile(file, []byte(rules.String()), 0o644))
	out := runTool(t, nil, pt, "check", "rules", file)
	require.Contains(t, out, fmt.Sprintf("SUCCESS: %d rules found", len(d.exprs())))
}

// metricNames returns the metric names in a PromQL expression: identifiers outside label
// matchers, durations and strings that are neither functions, keywords, aggregation
// operators, nor the label lists of by/without/on/ignoring/group_left/group_right.
func metricNames(expr string) []string {
	keywords := map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
		// Aggregation operators, which may be followed by a by/without clause before "(".
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
	labelLists := map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	var names []string
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || (c|0x20) >= 'a' && (c|0x20) <= 'z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n' || expr[i] == '\r') {
			i++
		}
		return i
	}
	skipTo := func(i int, close byte) int {
		for i < len(expr) && expr[i] != close {
			if expr[i] == '"' || expr[i] == '\'' || expr[i] == '`' {
				q := expr[i]
				for i++; i < len(expr) && expr[i] != q; i++ {
					if expr[i] == '\\' && q != '`' {
						i++
					}
				}
			}
			i++
		}
		return i + 1
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '{':
			i = skipTo(i+1, '}')
		case c == '[':
			i = skipTo(i+1, ']')
		case c == '"' || c == '\'' || c == '`':
			i = skipTo(i+1, c)
		case c == '$': // a Grafana variable
			i++
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '{' || expr[i] == '}') {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			next := skipSpace(i)
			switch {
			case labelLists[strings.ToLower(word)]:
				if next < len(expr) && expr[next] == '(' {
					i = skipTo(next+1, ')')
				}
			case keywords[strings.ToLower(word)]:
			case next < len(expr) && expr[next] == '(':
				// a function
			default:
				names = append(names, word)
			}
		default:
			i++
		}
	}
	return names
}

func TestMetricNamesParser(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`gateway_uplink_up == 0`, []string{"gateway_uplink_up"}},
		{`sum without (transport) (rate(gateway_ingest_batches_total{result!~"accepted|duplicate"}[10m]))` +
			` / ignoring (result) group_left sum without (transport, result) (rate(gateway_ingest_batches_total[10m])) > 0.1`,
			[]string{"gateway_ingest_batches_total", "gateway_ingest_batches_total"}},
		{`histogram_quantile(0.99, sum by (le, operation) (rate(x_bucket{job=~"$job",instance=~"$instance"}[$__rate_interval])))`,
			[]string{"x_bucket"}},
		{`time() - push_time_seconds{job="a"} > 300 and on (instance) up == 1 offset 5m`, []string{"push_time_seconds", "up"}},
		{`abs(gateway_clock_offset_seconds) > 6e1`, []string{"gateway_clock_offset_seconds"}},
		{`sum(rate(a_sum[5m])) / sum(rate(a_count[5m]))`, []string{"a_sum", "a_count"}},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, metricNames(tc.expr), tc.expr)
	}
}

// TestMetricsOfARunningGateway builds and starts gatewayd against DynamoDB Local, sends it a
// registration and two batches (one whose cloud marker already exists, so that the request
// error metrics appear too), and then lints its real /metrics output with promtool check
// metrics, and checks that every metric the alerts and the dashboard use is in it (or is a
// proposed or external metric).
func TestMetricsOfARunningGateway(t *testing.T) {
	pt := promtool(t)
	root := moduleRoot(t)
	bin := filepath.Join(t.TempDir(), "gatewayd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gatewayd")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)

	local := dynamotest.Shared(t)
	tables := local.NewTables(t)
	client := local.Client(t)
	const pepper = "metrics-test-pepper"
	key, _, err := cloud.NewKeys(client, tables.APIKeys, pepper).Create(context.Background(), "metrics test")
	require.NoError(t, err)
	prefix := strings.TrimSuffix(tables.Devices, cloud.DevicesTable)

	g := startGatewayd(t, bin, local.Endpoint, prefix, pepper)
	hw := "02:00:00:00:BB:01"
	boot := uuid.NewString()
	g.post(t, "/v1/register", key, fmt.Sprintf(`{"hardware_id":%q,"boot_id":%q,"firmware_version":"1.0.16",`+
		`"capabilities":{"sensors":["bme280"],"features":{"offline_buffering":true}}}`, hw, boot), http.StatusCreated)
	first, firstID := readingsBatch(hw, boot, 0)
	g.post(t, "/v1/readings", key, first, http.StatusOK)
	// Delivered first: the first lease after a start is checked against
	// the markers before any write, and the second batch must come later.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(string(g.scrape(t)),
		`gateway_uplink_batches_total{result="delivered"} 1`+"\n"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first batch was not delivered within 30s")
		}
	}
	// The second batch's marker is already in processed_batches: the uplink's transaction is
	// cancelled (a request error) and the batch counts as already delivered.
	second, secondID := readingsBatch(hw, boot, 1)
	_, err = client.PutItem(context.Background(), &dynamodb.PutItemInput{
		TableName: aws.String(tables.ProcessedBatches),
		Item: map[string]types.AttributeValue{
			"batch_id":        &types.AttributeValueMemberS{Value: secondID},
			"hardware_id":     &types.AttributeValueMemberS{Value: hw},
			"received_at":     &types.AttributeValueMemberS{Value: cloud.FormatTime(time.Now())},
			"expiration_time": &types.AttributeValueMemberN{Value: fmt.Sprint(time.Now().Add(24 * time.Hour).Unix())},
		},
	})
	require.NoError(t, err)
	g.post(t, "/v1/readings", key, second, http.StatusOK)
	require.NotEqual(t, firstID, secondID)

	var exposition []byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		exposition = g.scrape(t)
		s := string(exposition)
		if strings.Contains(s, `gateway_uplink_batches_total{result="delivered"} 1`+"\n") &&
			strings.Contains(s, `gateway_uplink_batches_total{result="already_delivered"} 1`+"\n") &&
			!strings.Contains(s, "gateway_uplink_device_upserts_total 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not forward both batches and the device within 30s; metrics:\n%s", s)
		}
	}

	// promtool check metrics exits non-zero and prints the problems when the lint finds any.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lint := exec.CommandContext(ctx, pt, "check", "metrics")
	lint.Stdin = bytes.NewReader(exposition)
	lintOut, err := lint.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", lintOut)
	require.Empty(t, strings.TrimSpace(string(lintOut)), "promtool check metrics found problems")

	exported := exposedNames(exposition)
	t.Logf("scraped %d bytes, %d metric names", len(exposition), len(exported))
	var used []string
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			used = append(used, metricNames(r.Expr)...)
		}
	}
	for _, e := range loadDashboard(t).exprs() {
		used = append(used, metricNames(e)...)
	}
	sort.Strings(used)
	used = slices.Compact(used)
	var missing []string
	for _, name := range used {
		if !exported[name] && proposedMetrics[name] == "" && externalMetrics[name] == "" {
			missing = append(missing, name)
		}
	}
	require.Empty(t, missing, "metrics used by alerts.yaml or the dashboard that gatewayd does not export")
	for name := range proposedMetrics {
		if exported[name] {
			t.Logf("%s is exported now: remove it from proposedMetrics", name)
		}
	}
}

// exposedNames returns the metric family and sample names of a text exposition.
func exposedNames(text []byte) map[string]bool {
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			names[strings.Fields(rest)[0]] = true
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

func readingsBatch(hw, boot string, i int) (payload, batchID string) {
	end := time.Now().Add(-time.Hour).UnixMilli() + int64(i)*60_000
	batchID = fmt.Sprintf("%s_%s_%d_%d", hw, boot, end-60_000, end)
	payload = fmt.Sprintf(`{"batch_id":%q,"hardware_id":%q,"boot_id":%q,"firmware_version":"1.0.16","readings":[`+
		`{"timestamp_ms":%d,"sensors":{"bme280_temp_c":21.5,"humidity_pct":45.2},"sensor_status":{"bme280":"ok"}}]}`,
		batchID, hw, boot, end-1000)
	return payload, batchID
}

// gatewayd is one running gatewayd process.
type gatewayd struct {
	httpAddr string
	logs     *syncbuf.Buffer
}

func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := proc.FreeAddr()
	require.NoError(t, err)
	return addr
}

// startGatewayd runs bin on loopback ports, stops it with SIGTERM at cleanup, and waits
// for /readyz.
func startGatewayd(t *testing.T, bin, endpoint, prefix, pepper string) *gatewayd {
	t.Helper()
	g := &gatewayd{httpAddr: freeAddr(t), logs: &syncbuf.Buffer{}}
	cmd := exec.Command(bin, "--data-dir", t.TempDir(), "--dynamodb-endpoint", endpoint, "--table-prefix", prefix,
		"--mqtt-addr", freeAddr(t), "--http-addr", g.httpAddr)
	cmd.Env = append(os.Environ(), "GATEWAY_API_KEY_PEPPER="+pepper, "AWS_ACCESS_KEY_ID=local",
		"AWS_SECRET_ACCESS_KEY=local", "AWS_REGION=us-east-1",
		"GATEWAY_UPLINK_MAX_BACKOFF=500ms", "GATEWAY_UPLINK_POLL_INTERVAL=200ms")
	cmd.Stdout, cmd.Stderr = g.logs, g.logs
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("gatewayd logs:\n%s", g.logs)
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + g.httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "gatewayd did not become ready; logs:\n%s", g.logs)
	return g
}

func (g *gatewayd) post(t *testing.T, path, key, body string, want int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+g.httpAddr+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	require.Equal(t, want, resp.StatusCode, "POST %s: %s", path, raw)
}

func (g *gatewayd) scrape(t *testing.T) []byte {
	t.Helper()
	resp, err := http.Get("http://" + g.httpAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

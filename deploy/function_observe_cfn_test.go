package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"greenhouse-gateway/function"
)

// lambdaMetrics are the AWS/Lambda metrics the template may watch: Lambda
// emits them for the function (dimension FunctionName).
var lambdaMetrics = []string{"Invocations", "Errors", "Throttles", "Duration", "ConcurrentExecutions"}

// metricRef is a metric an alarm or a dashboard widget names: fixed
// dimension values, or (a Metrics Insights query) a schema of dimension
// names with the values its WHERE fixes.
type metricRef struct {
	where      string // the resource and widget, for errors
	namespace  string
	name       string
	dims       map[string]string // dimension → value; "" for a dimension a query groups by
	stat       string
	fromSchema bool
}

// insightsQuery is the Metrics Insights queries the template uses:
// SELECT FUNC(Metric) FROM SCHEMA("Namespace", Dim, ...) [WHERE Dim = 'v'] [GROUP BY Dim] [ORDER BY ...] [LIMIT n].
var insightsQuery = regexp.MustCompile(`^SELECT (\w+)\((\w+)\) FROM SCHEMA\("([^"]+)"((?:, *\w+)*)\)` +
	`(?: WHERE (\w+) = '([^']*)')?(?: GROUP BY (\w+))?(?: ORDER BY \w+\(\) (?:ASC|DESC))?(?: LIMIT \d+)?$`)

func parseInsights(where, q string) (metricRef, error) {
	m := insightsQuery.FindStringSubmatch(q)
	if m == nil {
		return metricRef{}, fmt.Errorf("%s: query %q is not of the form this test reads", where, q)
	}
	r := metricRef{where: where, stat: m[1], name: m[2], namespace: m[3], dims: map[string]string{}, fromSchema: true}
	for _, d := range strings.Split(m[4], ",") {
		if d = strings.TrimSpace(d); d != "" {
			r.dims[d] = ""
		}
	}
	if m[5] != "" {
		if _, ok := r.dims[m[5]]; !ok {
			return r, fmt.Errorf("%s: WHERE %s is not a dimension of the schema", where, m[5])
		}
		r.dims[m[5]] = m[6]
	}
	if m[7] != "" {
		if _, ok := r.dims[m[7]]; !ok {
			return r, fmt.Errorf("%s: GROUP BY %s is not a dimension of the schema", where, m[7])
		}
	}
	return r, nil
}

// alarmMetrics returns the metrics of the template's alarms by alarm.
func alarmMetrics(tmpl *template) (map[string][]metricRef, error) {
	out := map[string][]metricRef{}
	var errs []error
	for _, id := range tmpl.resourcesOfType("AWS::CloudWatch::Alarm") {
		props, err := tmpl.properties(id)
		if err != nil {
			return nil, err
		}
		dimsOf := func(v any) map[string]string {
			dims := map[string]string{}
			list, _ := v.([]any)
			for _, d := range list {
				dm, _ := d.(map[string]any)
				dims[fmt.Sprint(dm["Name"])] = fmt.Sprint(dm["Value"])
			}
			return dims
		}
		if name, ok := props["MetricName"]; ok {
			stat := fmt.Sprint(props["Statistic"])
			if es, ok := props["ExtendedStatistic"]; ok {
				stat = fmt.Sprint(es)
			}
			out[id] = append(out[id], metricRef{where: "alarm " + id, namespace: fmt.Sprint(props["Namespace"]),
				name: fmt.Sprint(name), dims: dimsOf(props["Dimensions"]), stat: stat})
		}
		metrics, _ := props["Metrics"].([]any)
		for _, q := range metrics {
			qm, _ := q.(map[string]any)
			switch {
			case qm["Expression"] != nil:
				r, err := parseInsights("alarm "+id, fmt.Sprint(qm["Expression"]))
				if err != nil {
					errs = append(errs, err)
					continue
				}
				out[id] = append(out[id], r)
			case qm["MetricStat"] != nil:
				ms, _ := qm["MetricStat"].(map[string]any)
				mm, _ := ms["Metric"].(map[string]any)
				out[id] = append(out[id], metricRef{where: "alarm " + id, namespace: fmt.Sprint(mm["Namespace"]),
					name: fmt.Sprint(mm["MetricName"]), dims: dimsOf(mm["Dimensions"]), stat: fmt.Sprint(ms["Stat"])})
			}
		}
		if len(out[id]) == 0 {
			errs = append(errs, fmt.Errorf("alarm %s names no metric this test reads", id))
		}
	}
	return out, errors.Join(errs...)
}

// dashboardMetrics returns the metrics of the dashboard's metric widgets
// (CloudWatch's shorthand "." and "..." expanded) and the alarm ARNs of
// its alarm widgets.
func dashboardMetrics(tmpl *template) ([]metricRef, []string, error) {
	props, err := tmpl.properties("Dashboard")
	if err != nil {
		return nil, nil, err
	}
	var body struct {
		Widgets []struct {
			Type       string `json:"type"`
			Properties struct {
				Title   string  `json:"title"`
				Stat    string  `json:"stat"`
				Metrics [][]any `json:"metrics"`
				Alarms  []string
			} `json:"properties"`
		} `json:"widgets"`
	}
	if err := json.Unmarshal([]byte(fmt.Sprint(props["DashboardBody"])), &body); err != nil {
		return nil, nil, fmt.Errorf("Dashboard: DashboardBody is not JSON: %w", err)
	}
	var refs []metricRef
	var alarms []string
	var errs []error
	for _, w := range body.Widgets {
		where := fmt.Sprintf("dashboard widget %q", w.Properties.Title)
		if w.Type == "alarm" {
			alarms = append(alarms, w.Properties.Alarms...)
			continue
		}
		if w.Type != "metric" || len(w.Properties.Metrics) == 0 {
			errs = append(errs, fmt.Errorf("%s: a %s widget without metrics", where, w.Type))
			continue
		}
		var prev []string
		for _, entry := range w.Properties.Metrics {
			var parts []string
			stat := w.Properties.Stat
			for _, e := range entry {
				switch x := e.(type) {
				case string:
					parts = append(parts, x)
				case map[string]any:
					if q, ok := x["expression"].(string); ok {
						r, err := parseInsights(where, q)
						if err != nil {
							errs = append(errs, err)
						} else {
							refs = append(refs, r)
						}
					}
					if s, ok := x["stat"].(string); ok {
						stat = s
					}
				}
			}
			if len(parts) == 0 {
				continue
			}
			if parts[0] == "..." {
				keep := len(prev) - (len(parts) - 1)
				if keep < 0 {
					errs = append(errs, fmt.Errorf("%s: \"...\" after a shorter entry", where))
					continue
				}
				parts = append(slices.Clone(prev[:keep]), parts[1:]...)
			}
			for i, p := range parts {
				if p == "." && i < len(prev) {
					parts[i] = prev[i]
				}
			}
			prev = parts
			if len(parts) < 2 || len(parts)%2 != 0 {
				errs = append(errs, fmt.Errorf("%s: entry %v is not [namespace, name, dimension, value, ...]", where, parts))
				continue
			}
			r := metricRef{where: where, namespace: parts[0], name: parts[1], dims: map[string]string{}, stat: stat}
			for i := 2; i+1 < len(parts); i += 2 {
				r.dims[parts[i]] = parts[i+1]
			}
			refs = append(refs, r)
		}
	}
	return refs, alarms, errors.Join(errs...)
}

// checkMetric checks that the function emits r (function.Metrics: its
// namespace, name and dimension set, FunctionName the template's
// function, Status one of its statuses), or that Lambda does.
func checkMetric(r metricRef) error {
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range r.dims {
			if !yield(k) {
				return
			}
		}
	})
	switch r.namespace {
	case "AWS/Lambda":
		if !slices.Contains(lambdaMetrics, r.name) || !reflect.DeepEqual(r.dims, map[string]string{"FunctionName": functionPlaceholder}) {
			return fmt.Errorf("%s: AWS/Lambda %s %v is not a Lambda metric of the function", r.where, r.name, r.dims)
		}
		return nil
	case function.MetricNamespace:
	default:
		return fmt.Errorf("%s: namespace %q is neither the function's (%s) nor AWS/Lambda", r.where, r.namespace, function.MetricNamespace)
	}
	_, dims, ok := function.MetricOf(r.name)
	if !ok {
		return fmt.Errorf("%s: %s is not a metric the function emits", r.where, r.name)
	}
	if want := slices.Sorted(slices.Values(dims)); !slices.Equal(names, want) {
		return fmt.Errorf("%s: %s with dimensions %v; the function emits it with %v", r.where, r.name, names, want)
	}
	var errs []error
	for k, v := range r.dims {
		switch {
		case k == function.DimFunctionName && v != functionPlaceholder:
			errs = append(errs, fmt.Errorf("%s: %s of FunctionName %q, not the template's function", r.where, r.name, v))
		case k == function.DimStatus && !slices.Contains(function.BatchStatuses, v):
			errs = append(errs, fmt.Errorf("%s: %s of Status %q, which the function does not emit", r.where, r.name, v))
		case k == function.DimGatewayID && (!r.fromSchema || v != ""):
			errs = append(errs, fmt.Errorf("%s: %s of one GatewayId: watch every gateway with a query grouped by GatewayId", r.where, r.name))
		}
	}
	return errors.Join(errs...)
}

// compareObservability checks the template's alarms and dashboard
// against the metrics the function emits: every metric they name is one
// it emits, the dashboard shows each of them and every alarm, and the
// alarms the operators rely on are there.
func compareObservability(src []byte) error {
	tmpl, err := parseFunctionTemplate(src)
	if err != nil {
		return err
	}
	alarms, err := alarmMetrics(tmpl)
	if err != nil {
		return err
	}
	widgets, dashAlarms, err := dashboardMetrics(tmpl)
	if err != nil {
		return err
	}
	var errs []error
	shown := map[string]bool{}
	for _, r := range widgets {
		errs = append(errs, checkMetric(r))
		if r.namespace == function.MetricNamespace {
			shown[r.name] = true
		}
	}
	for _, m := range function.Metrics {
		if !shown[m.Name] {
			errs = append(errs, fmt.Errorf("the dashboard does not show %s", m.Name))
		}
	}
	watched := map[string]bool{}
	for id, refs := range alarms {
		for _, r := range refs {
			errs = append(errs, checkMetric(r))
			watched[r.namespace+" "+r.name+" "+r.stat] = true
		}
		arn, err := tmpl.getAtt(id, "Arn", 0)
		if err != nil {
			return err
		}
		if !slices.Contains(dashAlarms, fmt.Sprint(arn)) {
			errs = append(errs, fmt.Errorf("the dashboard's alarm widget lacks alarm %s", id))
		}
	}
	for _, want := range []string{"AWS/Lambda Errors Sum", "AWS/Lambda Throttles Sum", "AWS/Lambda Duration p99",
		function.MetricNamespace + " GatewayOldestPendingAge MAX", function.MetricNamespace + " GatewayReports SUM"} {
		if !watched[want] {
			errs = append(errs, fmt.Errorf("no alarm watches %s", want))
		}
	}
	return errors.Join(errs...)
}

func TestFunctionTemplateAlarmsAndDashboardNameEmittedMetrics(t *testing.T) {
	require.NoError(t, compareObservability(readFile(t, functionTemplatePath)))
}

// TestFunctionTemplateObservabilityDriftIsCaught changes copies of the
// template, one difference each, and checks that the comparison reports it.
func TestFunctionTemplateObservabilityDriftIsCaught(t *testing.T) {
	src := readFile(t, functionTemplatePath)
	body := func(t *testing.T, r *yaml.Node, old, new string) {
		n := at(t, r, "Resources", "Dashboard", "Properties", "DashboardBody")
		require.Contains(t, n.Value, old)
		n.Value = strings.Replace(n.Value, old, new, 1)
	}
	tests := []struct {
		name   string
		mutate func(t *testing.T, root *yaml.Node)
		want   string
	}{
		{"an alarm on a renamed metric", func(t *testing.T, r *yaml.Node) {
			n := at(t, r, "Resources", "GatewayBacklogAgeAlarm", "Properties", "Metrics", 0, "Expression")
			require.Contains(t, n.Value, "GatewayOldestPendingAge")
			n.Value = strings.Replace(n.Value, "GatewayOldestPendingAge", "OldestPendingAge", 1)
		}, "OldestPendingAge is not a metric the function emits"},
		{"an alarm's query without FunctionName", func(t *testing.T, r *yaml.Node) {
			n := at(t, r, "Resources", "GatewaySilentAlarm", "Properties", "Metrics", 0, "Expression")
			old := `SCHEMA("GreenhouseGateway", FunctionName, GatewayId) WHERE FunctionName = '${FunctionName}'`
			require.Contains(t, n.Value, old)
			n.Value = strings.Replace(n.Value, old, `SCHEMA("GreenhouseGateway", GatewayId)`, 1)
		}, "GatewayReports with dimensions [GatewayId]"},
		{"an alarm in another namespace", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "TableThrottlesAlarm", "Properties", "Namespace").Value = "Greenhouse"
		}, `namespace "Greenhouse"`},
		{"an alarm without its dimension", func(t *testing.T, r *yaml.Node) {
			n := at(t, r, "Resources", "TableThrottlesAlarm", "Properties", "Dimensions")
			n.Content = nil
		}, "Throttles with dimensions []"},
		{"the p99 alarm on the average", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "DurationP99Alarm", "Properties", "ExtendedStatistic").Value = "p50"
		}, "no alarm watches AWS/Lambda Duration p99"},
		{"a widget on a metric the function does not emit", func(t *testing.T, r *yaml.Node) {
			body(t, r, `"Batches","FunctionName"`, `"BatchCount","FunctionName"`)
		}, "BatchCount is not a metric the function emits"},
		{"a widget on a status the function does not emit", func(t *testing.T, r *yaml.Node) {
			body(t, r, `["...","duplicate"]`, `["...","accepted"]`)
		}, `Status "accepted"`},
		{"a widget on one gateway", func(t *testing.T, r *yaml.Node) {
			body(t, r, `[".","Conflicts",".","."]`, `["GreenhouseGateway","GatewayPendingBatches","FunctionName","${FunctionName}","GatewayId","gw-1"]`)
		}, "watch every gateway with a query grouped by GatewayId"},
		{"an alarm off the dashboard", func(t *testing.T, r *yaml.Node) {
			body(t, r, `,"${GatewaySilentAlarm.Arn}"`, ``)
		}, "lacks alarm GatewaySilentAlarm"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := compareObservability(mutateTemplate(t, src, tc.mutate))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestFunctionTemplateTracing checks that X-Ray tracing is the Tracing
// parameter, and that the role may write traces only when it is Active.
func TestFunctionTemplateTracing(t *testing.T) {
	src := readFile(t, functionTemplatePath)
	for mode, granted := range map[string]bool{"Active": true, "PassThrough": false} {
		tmpl, err := parseTemplate(src, map[string]any{"TablePrefix": tablePlaceholder, "FunctionName": functionPlaceholder,
			"CodeBucket": "bucket", "ApiKeyPepper": "pepper", "Tracing": mode})
		require.NoError(t, err)
		props, err := tmpl.properties("ReadingsFunction")
		require.NoError(t, err)
		require.Equal(t, map[string]any{"Mode": mode}, props["TracingConfig"])
		c, err := tmpl.condition(fmt.Sprint(tmpl.Resources["TracingPolicy"]["Condition"]), 0)
		require.NoError(t, err)
		require.Equal(t, granted, c, "the X-Ray policy exists with Tracing %s", mode)
		policy, err := tmpl.properties("TracingPolicy")
		require.NoError(t, err)
		require.Equal(t, []any{map[string]any{"Ref": "FunctionRole"}}, tmpl.Resources["TracingPolicy"]["Properties"].(map[string]any)["Roles"])
		require.Contains(t, fmt.Sprint(policy["PolicyDocument"]), "xray:PutTraceSegments")
	}
	tmpl, err := parseFunctionTemplate(src)
	require.NoError(t, err)
	require.Equal(t, "PassThrough", tmpl.Parameters["Tracing"], "tracing is off by default")
}

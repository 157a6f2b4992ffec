package emftest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/harness/emftest"
)

func TestParse(t *testing.T) {
	const good = `{"_aws":{"Timestamp":1764547200000,"CloudWatchMetrics":[{"Namespace":"NS","Dimensions":[["Fn","Gw"]],` +
		`"Metrics":[{"Name":"Pending","Unit":"Count"}]}]},"Fn":"f","Gw":"g","Pending":3,"Note":"x"}`
	docs, err := emftest.Parse("START RequestId: 1\n" + good + "\n{\"msg\":\"invocation\"}\n")
	require.NoError(t, err)
	require.Len(t, docs, 1, "only EMF lines")
	require.Equal(t, []emftest.Metric{{Namespace: "NS", Dimensions: []string{"Fn", "Gw"}, Name: "Pending", Unit: "Count", Value: 3}}, docs[0].Metrics)
	require.Equal(t, "g", docs[0].Dimension("Gw"))
	require.Len(t, emftest.Select(docs, map[string]string{"Gw": "g"}), 1)
	require.Empty(t, emftest.Select(docs, map[string]string{"Gw": "h"}))
	lookup := func(name string) (string, []string, bool) { return "Count", []string{"Fn", "Gw"}, name == "Pending" }
	require.NoError(t, emftest.Conform(docs, "NS", lookup))
	require.ErrorContains(t, emftest.Conform(docs, "Other", lookup), `namespace "NS"`)
	require.ErrorContains(t, emftest.Conform(docs, "NS", func(string) (string, []string, bool) { return "Seconds", []string{"Fn", "Gw"}, true }), "unit Count")

	for name, bad := range map[string]string{
		"no timestamp":         `{"_aws":{"CloudWatchMetrics":[{"Namespace":"NS","Dimensions":[["Fn"]],"Metrics":[{"Name":"M","Unit":"Count"}]}]},"Fn":"f","M":1}`,
		"a dimension missing":  `{"_aws":{"Timestamp":1,"CloudWatchMetrics":[{"Namespace":"NS","Dimensions":[["Fn"]],"Metrics":[{"Name":"M","Unit":"Count"}]}]},"M":1}`,
		"a value not a number": `{"_aws":{"Timestamp":1,"CloudWatchMetrics":[{"Namespace":"NS","Dimensions":[["Fn"]],"Metrics":[{"Name":"M","Unit":"Count"}]}]},"Fn":"f","M":"1"}`,
		"an unknown unit":      `{"_aws":{"Timestamp":1,"CloudWatchMetrics":[{"Namespace":"NS","Dimensions":[["Fn"]],"Metrics":[{"Name":"M","Unit":"Things"}]}]},"Fn":"f","M":1}`,
		"an AWS namespace":     `{"_aws":{"Timestamp":1,"CloudWatchMetrics":[{"Namespace":"AWS/Lambda","Dimensions":[["Fn"]],"Metrics":[{"Name":"M","Unit":"Count"}]}]},"Fn":"f","M":1}`,
	} {
		_, err := emftest.Parse(bad)
		require.Error(t, err, name)
	}
}

package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"greenhouse-gateway/function"
)

// functionTemplatePath is the readings function's template, relative to deploy/.
const functionTemplatePath = "cloudformation/function.yaml"

// functionPlaceholder stands for the function's name in the gateway's lambda policy.
const functionPlaceholder = "${FunctionName}"

func parseFunctionTemplate(src []byte) (*template, error) {
	return parseTemplate(src, map[string]any{"TablePrefix": tablePlaceholder, "FunctionName": functionPlaceholder,
		"CodeBucket": "bucket", "ApiKeyPepper": "pepper"})
}

// policyOf decodes an evaluated PolicyDocument.
func policyOf(doc any) (policy, error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return policy{}, err
	}
	return decodePolicy(b)
}

var lambdaARN = regexp.MustCompile(`^(arn:[^:]+:lambda):[^:]*:[^:]*:`)

// splitLambda returns p's DynamoDB statements and its Lambda statements,
// the latter with ARNs normalized as normalizePolicy does DynamoDB's.
func splitLambda(p policy) (dynamo, lambda policy) {
	dynamo, lambda = policy{Version: p.Version}, policy{Version: p.Version}
	for _, s := range p.Statement {
		if len(s.Action) > 0 && strings.HasPrefix(s.Action[0], "lambda:") {
			res := make(stringList, len(s.Resource))
			for i, r := range s.Resource {
				res[i] = lambdaARN.ReplaceAllString(r, "$1:*:*:")
			}
			s.Resource = res
			lambda.Statement = append(lambda.Statement, s)
			continue
		}
		dynamo.Statement = append(dynamo.Statement, s)
	}
	return normalizePolicy(dynamo), lambda
}

// compareFunctionTemplate checks the function template against the code and
// deploy/iam: the role's table policy is function-policy.json, the
// gateways' policy is gateway-lambda-policy.json, the function is arm64
// provided.al2023 with reserved concurrency from its parameter and only
// environment variables the function reads, and the HTTP API routes
// exactly function.Routes to it with payload format 2.0.
func compareFunctionTemplate(t *testing.T, src []byte) error {
	tmpl, err := parseFunctionTemplate(src)
	if err != nil {
		return err
	}
	errs := []error{compareFunctionRole(t, tmpl), compareGatewayLambdaPolicy(t, tmpl), compareFunction(tmpl), compareRoutes(tmpl)}
	return errors.Join(errs...)
}

func compareFunctionRole(t *testing.T, tmpl *template) error {
	props, err := tmpl.properties("FunctionRole")
	if err != nil {
		return err
	}
	policies, _ := props["Policies"].([]any)
	if len(policies) != 1 {
		return fmt.Errorf("FunctionRole: want one inline policy, the tables', got %d", len(policies))
	}
	p, err := policyOf(policies[0].(map[string]any)["PolicyDocument"])
	if err != nil {
		return fmt.Errorf("FunctionRole: %w", err)
	}
	if !reflect.DeepEqual(normalizePolicy(loadPolicy(t, "iam/function-policy.json")), normalizePolicy(p)) {
		return errors.New("FunctionRole's table policy differs from iam/function-policy.json")
	}
	return nil
}

func compareGatewayLambdaPolicy(t *testing.T, tmpl *template) error {
	props, err := tmpl.properties("GatewayInvokePolicy")
	if err != nil {
		return err
	}
	p, err := policyOf(props["PolicyDocument"])
	if err != nil {
		return fmt.Errorf("GatewayInvokePolicy: %w", err)
	}
	wantD, wantL := splitLambda(loadPolicy(t, "iam/gateway-lambda-policy.json"))
	gotD, gotL := splitLambda(p)
	if !reflect.DeepEqual(wantD, gotD) || !reflect.DeepEqual(wantL, gotL) {
		return errors.New("GatewayInvokePolicy differs from iam/gateway-lambda-policy.json")
	}
	return nil
}

func compareFunction(tmpl *template) error {
	raw, _ := tmpl.Resources["ReadingsFunction"]["Properties"].(map[string]any)
	props, err := tmpl.properties("ReadingsFunction")
	if err != nil {
		return err
	}
	var errs []error
	for k, want := range map[string]any{"Runtime": "provided.al2023", "Handler": "bootstrap", "Architectures": []any{"arm64"}} {
		if !reflect.DeepEqual(props[k], want) {
			errs = append(errs, fmt.Errorf("ReadingsFunction: %s is %v, want %v", k, props[k], want))
		}
	}
	if !reflect.DeepEqual(raw["ReservedConcurrentExecutions"], map[string]any{"Ref": "ReservedConcurrency"}) {
		errs = append(errs, errors.New("ReadingsFunction: ReservedConcurrentExecutions must be the ReservedConcurrency parameter"))
	}
	read := map[string]bool{}
	_, err = function.ConfigFromEnv(func(name string) string {
		read[name] = true
		if name == "API_KEY_PEPPER" {
			return "pepper" // the one required variable
		}
		return ""
	})
	if err != nil {
		errs = append(errs, err)
	}
	if _, err := function.LogLevelFromEnv(func(name string) string { read[name] = true; return "" }); err != nil {
		errs = append(errs, err)
	}
	vars, _ := props["Environment"].(map[string]any)["Variables"].(map[string]any)
	for name := range vars {
		if !read[name] {
			errs = append(errs, fmt.Errorf("ReadingsFunction: environment variable %s is not one the function reads", name))
		}
	}
	if vars["TABLE_PREFIX"] != tablePlaceholder || vars["API_KEY_PEPPER"] == nil {
		errs = append(errs, errors.New("ReadingsFunction: TABLE_PREFIX must be the TablePrefix parameter, and API_KEY_PEPPER set"))
	}
	return errors.Join(errs...)
}

func compareRoutes(tmpl *template) error {
	var errs []error
	integ, err := tmpl.properties("ReadingsIntegration")
	if err != nil {
		return err
	}
	// Through the alias the function serves HTTP events from (HTTP_ALIAS).
	wantURI := "arn:aws:lambda:" + cfnRegion + ":" + cfnAccount + ":function:" + functionPlaceholder + ":api"
	if integ["IntegrationType"] != "AWS_PROXY" || integ["PayloadFormatVersion"] != "2.0" || integ["IntegrationUri"] != wantURI {
		errs = append(errs, fmt.Errorf("ReadingsIntegration: want AWS_PROXY to the function with payload format 2.0, got %v", integ))
	}
	var routes []string
	for _, id := range tmpl.resourcesOfType("AWS::ApiGatewayV2::Route") {
		props, err := tmpl.properties(id)
		if err != nil {
			return err
		}
		routes = append(routes, fmt.Sprint(props["RouteKey"]))
		if props["Target"] != "integrations/ReadingsIntegration" {
			errs = append(errs, fmt.Errorf("route %s: target %v, want the function's integration", id, props["Target"]))
		}
	}
	sort.Strings(routes)
	if want := slices.Sorted(slices.Values(function.Routes)); !slices.Equal(routes, want) {
		errs = append(errs, fmt.Errorf("the HTTP API routes %v, the function serves %v", routes, want))
	}
	return errors.Join(errs...)
}

func TestFunctionTemplateMatchesTheCode(t *testing.T) {
	require.NoError(t, compareFunctionTemplate(t, readFile(t, functionTemplatePath)))
}

// TestFunctionTemplateDriftIsCaught mutates copies of the template, one
// difference each, and checks that the comparison reports it.
func TestFunctionTemplateDriftIsCaught(t *testing.T) {
	src := readFile(t, functionTemplatePath)
	role := []any{"Resources", "FunctionRole", "Properties", "Policies", 0, "PolicyDocument", "Statement"}
	tests := []struct {
		name   string
		mutate func(t *testing.T, root *yaml.Node)
		want   string
	}{
		{"a route dropped", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "RegisterRoute", "Properties", "RouteKey").Value = "POST /v1/other"
		}, "the HTTP API routes"},
		{"x86_64", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "ReadingsFunction", "Properties", "Architectures", 0).Value = "x86_64"
		}, "Architectures"},
		{"payload format 1.0", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "ReadingsIntegration", "Properties", "PayloadFormatVersion").Value = "1.0"
		}, "payload format 2.0"},
		{"an extra action in the role", func(t *testing.T, r *yaml.Node) {
			acts := at(t, r, append(role, 0, "Action")...)
			acts.Content = append(acts.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "dynamodb:DeleteItem"})
		}, "differs from iam/function-policy.json"},
		{"a gateway allowed to write readings", func(t *testing.T, r *yaml.Node) {
			acts := at(t, r, "Resources", "GatewayInvokePolicy", "Properties", "PolicyDocument", "Statement", 2, "Action")
			acts.Content = append(acts.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "dynamodb:PutItem"})
		}, "GatewayInvokePolicy differs"},
		{"a fixed concurrency", func(t *testing.T, r *yaml.Node) {
			n := at(t, r, "Resources", "ReadingsFunction", "Properties", "ReservedConcurrentExecutions")
			*n = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: "5"}
		}, "ReservedConcurrency parameter"},
		{"an environment variable the function ignores", func(t *testing.T, r *yaml.Node) {
			vars := at(t, r, "Resources", "ReadingsFunction", "Properties", "Environment", "Variables")
			vars.Content = append(vars.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "TABLE_NAME"},
				&yaml.Node{Kind: yaml.ScalarNode, Value: "readings"})
		}, "TABLE_NAME is not one the function reads"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := compareFunctionTemplate(t, mutateTemplate(t, src, tc.mutate))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// Package deploy_test checks the files of deploy/ against the code they
// serve: the CloudFormation templates against the tables and the function,
// the IAM policies against the calls gatewayd, gatewayctl and the function
// make, and the alert rules and dashboard against the metrics.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"greenhouse-gateway/internal/cloud"
)

// templatePath is the CloudFormation template of the tables and policies, relative to deploy/.
const templatePath = "cloudformation/tables.yaml"

// Placeholders the template evaluator gives CloudFormation's pseudo parameters.
const (
	cfnRegion    = "REGION"
	cfnAccount   = "ACCOUNT"
	cfnPartition = "aws"
	cfnStack     = "STACK"
)

// cfnValue turns a YAML node of a CloudFormation template into plain values (map[string]any,
// []any, string, bool, int, float64, nil), rewriting the short forms of intrinsic functions
// into their long JSON forms: !Ref X is {"Ref": X}, !Sub X is {"Fn::Sub": X}, !GetAtt A.B is
// {"Fn::GetAtt": [A, B]}, !Foo X is {"Fn::Foo": X}.
func cfnValue(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return nil, fmt.Errorf("line %d: want one YAML document", n.Line)
		}
		return cfnValue(n.Content[0])
	case yaml.AliasNode:
		return cfnValue(n.Alias)
	}
	var plain any
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: mapping key is not a scalar", k.Line)
			}
			if _, dup := m[k.Value]; dup {
				return nil, fmt.Errorf("line %d: duplicate key %q", k.Line, k.Value)
			}
			v, err := cfnValue(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[k.Value] = v
		}
		plain = m
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := cfnValue(c)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		plain = s
	case yaml.ScalarNode:
		if strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") {
			plain = n.Value // the argument of a short-form function is a string
		} else if err := n.Decode(&plain); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
	default:
		return nil, fmt.Errorf("line %d: unexpected YAML node kind %v", n.Line, n.Kind)
	}
	if !strings.HasPrefix(n.Tag, "!") || strings.HasPrefix(n.Tag, "!!") {
		return plain, nil
	}
	name := strings.TrimPrefix(n.Tag, "!")
	switch name {
	case "Ref", "Condition":
		return map[string]any{name: plain}, nil
	case "GetAtt":
		if s, ok := plain.(string); ok {
			res, attr, ok := strings.Cut(s, ".")
			if !ok {
				return nil, fmt.Errorf("line %d: !GetAtt %q: want Resource.Attribute", n.Line, s)
			}
			plain = []any{res, attr}
		}
	}
	return map[string]any{"Fn::" + name: plain}, nil
}

// template is a parsed CloudFormation template with an evaluator for the intrinsic functions
// the project's templates use (Ref, Fn::Sub, Fn::GetAtt; Fn::If on Conditions made of
// Fn::Equals and Fn::Not, with AWS::NoValue). Anything else is an error, so a template that
// starts using more fails these tests instead of being half-understood.
type template struct {
	Resources  map[string]map[string]any
	Parameters map[string]any // parameter values
	Conditions map[string]any
}

// noValue is AWS::NoValue: the property or list element holding it is dropped.
type noValue struct{}

func parseTemplate(src []byte, params map[string]any) (*template, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(src, &root); err != nil {
		return nil, fmt.Errorf("parsing template: %w", err)
	}
	v, err := cfnValue(&root)
	if err != nil {
		return nil, fmt.Errorf("parsing template: %w", err)
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("template is not a mapping")
	}
	t := &template{Resources: map[string]map[string]any{}, Parameters: map[string]any{}}
	t.Conditions, _ = doc["Conditions"].(map[string]any)
	declared, _ := doc["Parameters"].(map[string]any)
	for name, p := range declared {
		if v, ok := params[name]; ok {
			t.Parameters[name] = v
		} else if pm, ok := p.(map[string]any); ok {
			if d, ok := pm["Default"]; ok {
				t.Parameters[name] = d
			}
		}
	}
	for name := range params {
		if _, ok := declared[name]; !ok {
			return nil, fmt.Errorf("template declares no parameter %s", name)
		}
	}
	resources, ok := doc["Resources"].(map[string]any)
	if !ok {
		return nil, errors.New("template has no Resources")
	}
	for name, r := range resources {
		rm, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("resource %s is not a mapping", name)
		}
		t.Resources[name] = rm
	}
	return t, nil
}

// resourcesOfType returns the logical IDs of the resources of type typ, sorted.
func (t *template) resourcesOfType(typ string) []string {
	var ids []string
	for id, r := range t.Resources {
		if r["Type"] == typ {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// properties returns the evaluated Properties of resource id.
func (t *template) properties(id string) (map[string]any, error) {
	v, err := t.eval(t.Resources[id]["Properties"], 0)
	if err != nil {
		return nil, fmt.Errorf("resource %s: %w", id, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("resource %s: Properties is not a mapping", id)
	}
	return m, nil
}

var subVar = regexp.MustCompile(`\$\{([^}]*)\}`)

func (t *template) eval(v any, depth int) (any, error) {
	if depth > 20 {
		return nil, errors.New("intrinsic functions nested too deep (a cycle?)")
	}
	switch x := v.(type) {
	case []any:
		out := make([]any, 0, len(x))
		for _, e := range x {
			ev, err := t.eval(e, depth+1)
			if err != nil {
				return nil, err
			}
			if _, drop := ev.(noValue); !drop {
				out = append(out, ev)
			}
		}
		return out, nil
	case map[string]any:
		if len(x) == 1 {
			for k, arg := range x {
				if k == "Ref" || strings.HasPrefix(k, "Fn::") {
					return t.intrinsic(k, arg, depth)
				}
			}
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			ev, err := t.eval(e, depth+1)
			if err != nil {
				return nil, err
			}
			if _, drop := ev.(noValue); !drop {
				out[k] = ev
			}
		}
		return out, nil
	}
	return v, nil
}

func (t *template) intrinsic(fn string, arg any, depth int) (any, error) {
	switch fn {
	case "Ref":
		name, ok := arg.(string)
		if !ok {
			return nil, fmt.Errorf("Ref of a %T", arg)
		}
		return t.ref(name, depth)
	case "Fn::GetAtt":
		parts, ok := arg.([]any)
		if !ok || len(parts) != 2 {
			return nil, fmt.Errorf("Fn::GetAtt %v: want [Resource, Attribute]", arg)
		}
		res, _ := parts[0].(string)
		attr, _ := parts[1].(string)
		return t.getAtt(res, attr, depth)
	case "Fn::Sub":
		var s string
		vars := map[string]any{}
		switch a := arg.(type) {
		case string:
			s = a
		case []any:
			if len(a) != 2 {
				return nil, fmt.Errorf("Fn::Sub %v: want [String, {Var: Value}]", arg)
			}
			s, _ = a[0].(string)
			m, _ := a[1].(map[string]any)
			for k, e := range m {
				ev, err := t.eval(e, depth+1)
				if err != nil {
					return nil, err
				}
				vars[k] = ev
			}
		default:
			return nil, fmt.Errorf("Fn::Sub of a %T", arg)
		}
		var firstErr error
		out := subVar.ReplaceAllStringFunc(s, func(m string) string {
			name := m[2 : len(m)-1]
			if strings.HasPrefix(name, "!") {
				return "${" + name[1:] + "}" // ${!Literal} is the literal ${Literal}
			}
			var v any
			var err error
			if vv, ok := vars[name]; ok {
				v = vv
			} else if res, attr, ok := strings.Cut(name, "."); ok {
				v, err = t.getAtt(res, attr, depth)
			} else {
				v, err = t.ref(name, depth)
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
			return fmt.Sprint(v)
		})
		return out, firstErr
	case "Fn::If":
		a, ok := arg.([]any)
		if !ok || len(a) != 3 {
			return nil, fmt.Errorf("Fn::If %v: want [Condition, IfTrue, IfFalse]", arg)
		}
		name, _ := a[0].(string)
		c, err := t.condition(name, depth)
		if err != nil {
			return nil, err
		}
		if c {
			return t.eval(a[1], depth+1)
		}
		return t.eval(a[2], depth+1)
	case "Fn::Equals":
		a, ok := arg.([]any)
		if !ok || len(a) != 2 {
			return nil, fmt.Errorf("Fn::Equals %v: want [A, B]", arg)
		}
		x, err := t.eval(a[0], depth+1)
		if err != nil {
			return nil, err
		}
		y, err := t.eval(a[1], depth+1)
		if err != nil {
			return nil, err
		}
		return fmt.Sprint(x) == fmt.Sprint(y), nil
	case "Fn::Not":
		a, ok := arg.([]any)
		if !ok || len(a) != 1 {
			return nil, fmt.Errorf("Fn::Not %v: want [Condition]", arg)
		}
		v, err := t.eval(a[0], depth+1)
		b, ok := v.(bool)
		if err != nil || !ok {
			return nil, fmt.Errorf("Fn::Not %v: not a condition (%v)", arg, err)
		}
		return !b, nil
	}
	return nil, fmt.Errorf("intrinsic function %s is not understood by this test's evaluator", fn)
}

// condition evaluates the template's condition name.
func (t *template) condition(name string, depth int) (bool, error) {
	c, ok := t.Conditions[name]
	if !ok {
		return false, fmt.Errorf("condition %s: not declared", name)
	}
	v, err := t.eval(c, depth+1)
	if err != nil {
		return false, fmt.Errorf("condition %s: %w", name, err)
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("condition %s: not a boolean", name)
	}
	return b, nil
}

func (t *template) ref(name string, depth int) (any, error) {
	switch name {
	case "AWS::Region":
		return cfnRegion, nil
	case "AWS::AccountId":
		return cfnAccount, nil
	case "AWS::Partition":
		return cfnPartition, nil
	case "AWS::StackName":
		return cfnStack, nil
	case "AWS::NoValue":
		return noValue{}, nil
	}
	if v, ok := t.Parameters[name]; ok {
		return v, nil
	}
	r, ok := t.Resources[name]
	if !ok {
		return nil, fmt.Errorf("Ref %s: no such parameter or resource", name)
	}
	switch r["Type"] {
	case "AWS::DynamoDB::Table":
		return t.tableName(name, depth)
	case "AWS::IAM::ManagedPolicy":
		return "arn:" + cfnPartition + ":iam::" + cfnAccount + ":policy/" + name, nil
	case "AWS::Lambda::Function":
		return t.functionName(name, depth)
	case "AWS::Lambda::Alias": // its ARN: the function's, qualified by the alias
		props, _ := r["Properties"].(map[string]any)
		fn, err := t.eval(props["FunctionName"], depth+1)
		if err != nil {
			return nil, err
		}
		return fmt.Sprintf("arn:%s:lambda:%s:%s:function:%v:%v", cfnPartition, cfnRegion, cfnAccount, fn, props["Name"]), nil
	case "AWS::ApiGatewayV2::Api", "AWS::ApiGatewayV2::Integration", "AWS::IAM::Role":
		return name, nil // the physical ID, which CloudFormation makes up
	}
	return nil, fmt.Errorf("Ref %s: resource type %v not understood", name, r["Type"])
}

func (t *template) getAtt(res, attr string, depth int) (any, error) {
	r, ok := t.Resources[res]
	if !ok {
		return nil, fmt.Errorf("Fn::GetAtt %s.%s: no such resource", res, attr)
	}
	switch {
	case r["Type"] == "AWS::Lambda::Function" && attr == "Arn":
		name, err := t.functionName(res, depth)
		if err != nil {
			return nil, err
		}
		return fmt.Sprintf("arn:%s:lambda:%s:%s:function:%s", cfnPartition, cfnRegion, cfnAccount, name), nil
	case r["Type"] == "AWS::IAM::Role" && attr == "Arn":
		return fmt.Sprintf("arn:%s:iam::%s:role/%s", cfnPartition, cfnAccount, res), nil
	case r["Type"] == "AWS::CloudWatch::Alarm" && attr == "Arn":
		props, _ := r["Properties"].(map[string]any)
		name, err := t.eval(props["AlarmName"], depth+1)
		if err != nil {
			return nil, err
		}
		return fmt.Sprintf("arn:%s:cloudwatch:%s:%s:alarm:%v", cfnPartition, cfnRegion, cfnAccount, name), nil
	case r["Type"] == "AWS::ApiGatewayV2::Api" && attr == "ApiEndpoint":
		return fmt.Sprintf("https://%s.execute-api.%s.amazonaws.com", res, cfnRegion), nil
	}
	if r["Type"] == "AWS::DynamoDB::Table" && attr == "Arn" {
		name, err := t.tableName(res, depth)
		if err != nil {
			return nil, err
		}
		return fmt.Sprintf("arn:%s:dynamodb:%s:%s:table/%s", cfnPartition, cfnRegion, cfnAccount, name), nil
	}
	return nil, fmt.Errorf("Fn::GetAtt %s.%s: not understood", res, attr)
}

// functionName is a Lambda function's FunctionName.
func (t *template) functionName(id string, depth int) (string, error) {
	props, _ := t.Resources[id]["Properties"].(map[string]any)
	v, err := t.eval(props["FunctionName"], depth+1)
	if err != nil {
		return "", err
	}
	name, ok := v.(string)
	if !ok || name == "" {
		return "", fmt.Errorf("function %s: FunctionName is not a string", id)
	}
	return name, nil
}

func (t *template) tableName(id string, depth int) (string, error) {
	props, _ := t.Resources[id]["Properties"].(map[string]any)
	v, err := t.eval(props["TableName"], depth+1)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok || s == "" {
		return "", fmt.Errorf("table %s has no TableName (the gateway needs fixed names)", id)
	}
	return s, nil
}

// cfnTable is the part of AWS::DynamoDB::Table's properties that the gateway's tables use.
// It is decoded strictly: a property not listed here (a local secondary index, streams,
// provisioned throughput, ...) is an error, since the comparison would not see it.
type cfnTable struct {
	TableName                        string
	BillingMode                      types.BillingMode
	AttributeDefinitions             []types.AttributeDefinition
	KeySchema                        []types.KeySchemaElement
	GlobalSecondaryIndexes           []types.GlobalSecondaryIndex
	TimeToLiveSpecification          *cfnTTL
	PointInTimeRecoverySpecification *cfnPITR
}

type cfnTTL struct {
	AttributeName string
	Enabled       bool
}

type cfnPITR struct {
	PointInTimeRecoveryEnabled bool
}

// templateTables returns the template's tables as CreateTable requests, with the TTL
// attribute of each table that enables TTL.
func templateTables(src []byte, prefix string) ([]*dynamodb.CreateTableInput, map[string]string, error) {
	t, err := parseTemplate(src, map[string]any{"TablePrefix": prefix})
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	var defs []*dynamodb.CreateTableInput
	ttl := map[string]string{}
	for _, id := range t.resourcesOfType("AWS::DynamoDB::Table") {
		r := t.Resources[id]
		for _, policy := range []string{"DeletionPolicy", "UpdateReplacePolicy"} {
			if r[policy] != "Retain" {
				errs = append(errs, fmt.Errorf("table %s: %s is %v, want Retain", id, policy, r[policy]))
			}
		}
		props, err := t.properties(id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		raw, err := json.Marshal(props)
		if err != nil {
			return nil, nil, err
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var ct cfnTable
		if err := dec.Decode(&ct); err != nil {
			errs = append(errs, fmt.Errorf("table %s: properties the comparison does not cover: %w", id, err))
			continue
		}
		if p := ct.PointInTimeRecoverySpecification; p == nil || !p.PointInTimeRecoveryEnabled {
			errs = append(errs, fmt.Errorf("table %s: point-in-time recovery is not enabled", id))
		}
		if s := ct.TimeToLiveSpecification; s != nil && s.Enabled {
			ttl[ct.TableName] = s.AttributeName
		}
		defs = append(defs, &dynamodb.CreateTableInput{
			TableName:              aws.String(ct.TableName),
			BillingMode:            ct.BillingMode,
			AttributeDefinitions:   ct.AttributeDefinitions,
			KeySchema:              ct.KeySchema,
			GlobalSecondaryIndexes: ct.GlobalSecondaryIndexes,
		})
	}
	return defs, ttl, errors.Join(errs...)
}

// normalize sorts the parts of def whose order means nothing (attribute definitions, indexes,
// and key schemas: HASH before RANGE) so that two definitions compare with reflect.DeepEqual.
func normalize(def *dynamodb.CreateTableInput) *dynamodb.CreateTableInput {
	d := *def
	d.AttributeDefinitions = slices.Clone(d.AttributeDefinitions)
	sort.Slice(d.AttributeDefinitions, func(i, j int) bool {
		return aws.ToString(d.AttributeDefinitions[i].AttributeName) < aws.ToString(d.AttributeDefinitions[j].AttributeName)
	})
	sortKeys := func(ks []types.KeySchemaElement) []types.KeySchemaElement {
		ks = slices.Clone(ks)
		sort.SliceStable(ks, func(i, j int) bool { return ks[i].KeyType == types.KeyTypeHash && ks[j].KeyType != types.KeyTypeHash })
		return ks
	}
	d.KeySchema = sortKeys(d.KeySchema)
	d.GlobalSecondaryIndexes = slices.Clone(d.GlobalSecondaryIndexes)
	for i := range d.GlobalSecondaryIndexes {
		d.GlobalSecondaryIndexes[i].KeySchema = sortKeys(d.GlobalSecondaryIndexes[i].KeySchema)
	}
	sort.Slice(d.GlobalSecondaryIndexes, func(i, j int) bool {
		return aws.ToString(d.GlobalSecondaryIndexes[i].IndexName) < aws.ToString(d.GlobalSecondaryIndexes[j].IndexName)
	})
	if len(d.GlobalSecondaryIndexes) == 0 {
		d.GlobalSecondaryIndexes = nil
	}
	return &d
}

// compareTemplate reports every difference between the template's tables (with TablePrefix
// set to prefix) and the code's: cloud.TableDefinitions and cloud.TTLAttributes for
// cloud.TableNames(prefix). It compares whole CreateTable requests, so a field the code starts
// setting (streams, say) is a difference too until the template sets it.
func compareTemplate(src []byte, prefix string) error {
	names := cloud.TableNames(prefix)
	got, gotTTL, err := templateTables(src, prefix)
	errs := []error{err}
	byName := map[string]*dynamodb.CreateTableInput{}
	for _, d := range got {
		byName[aws.ToString(d.TableName)] = d
	}
	for _, want := range cloud.TableDefinitions(names) {
		name := aws.ToString(want.TableName)
		have, ok := byName[name]
		if !ok {
			errs = append(errs, fmt.Errorf("table %s: missing from the template", name))
			continue
		}
		delete(byName, name)
		w, h := normalize(want), normalize(have)
		if !reflect.DeepEqual(w, h) {
			wj, _ := json.Marshal(w)
			hj, _ := json.Marshal(h)
			errs = append(errs, fmt.Errorf("table %s differs:\n code:     %s\n template: %s", name, wj, hj))
		}
	}
	for name := range byName {
		errs = append(errs, fmt.Errorf("table %s: in the template but not in cloud.TableDefinitions", name))
	}
	if wantTTL := cloud.TTLAttributes(names); !reflect.DeepEqual(wantTTL, gotTTL) {
		errs = append(errs, fmt.Errorf("ttl differs: code %v, template %v", wantTTL, gotTTL))
	}
	return errors.Join(errs...)
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(path))
	require.NoError(t, err)
	return b
}

func TestTemplateTablesMatchTheCode(t *testing.T) {
	src := readFile(t, templatePath)
	for _, prefix := range []string{"", "prod_", "site-3.test_"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			require.NoError(t, compareTemplate(src, prefix))
		})
	}
}

// TestTemplateDriftIsCaught mutates copies of the template, one difference each, and checks
// that compareTemplate reports it: the comparison above is only worth something if it fails.
func TestTemplateDriftIsCaught(t *testing.T) {
	src := readFile(t, templatePath)
	const prefix = "prod_"
	tests := []struct {
		name   string
		mutate func(t *testing.T, root *yaml.Node)
		want   string // in the error
	}{
		{"hash key renamed", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "DevicesTable", "Properties", "KeySchema", 0, "AttributeName").Value = "device_id"
		}, "table prod_devices differs"},
		{"sort key dropped", func(t *testing.T, r *yaml.Node) {
			removeAt(t, at(t, r, "Resources", "DeviceReadingsTable", "Properties", "KeySchema"), 1)
		}, "table prod_device_readings differs"},
		{"key types swapped", func(t *testing.T, r *yaml.Node) {
			ks := at(t, r, "Resources", "DeviceReadingsTable", "Properties", "KeySchema")
			at(t, ks, 0, "KeyType").Value, at(t, ks, 1, "KeyType").Value = "RANGE", "HASH"
		}, "table prod_device_readings differs"},
		{"attribute type number", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "ApiKeysTable", "Properties", "AttributeDefinitions", 1, "AttributeType").Value = "N"
		}, "table prod_api_keys differs"},
		{"extra attribute definition", func(t *testing.T, r *yaml.Node) {
			defs := at(t, r, "Resources", "ProcessedBatchesTable", "Properties", "AttributeDefinitions")
			extra := cloneNode(defs.Content[0])
			at(t, extra, "AttributeName").Value = "hardware_id"
			defs.Content = append(defs.Content, extra)
		}, "table prod_processed_batches differs"},
		{"api_key_hash_index missing", func(t *testing.T, r *yaml.Node) {
			removeAt(t, at(t, r, "Resources", "ApiKeysTable", "Properties", "GlobalSecondaryIndexes"), 0)
		}, "table prod_api_keys differs"},
		{"gsi1 renamed", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "DevicesTable", "Properties", "GlobalSecondaryIndexes", 0, "IndexName").Value = "gsi_1"
		}, "table prod_devices differs"},
		{"gsi1 sort key changed", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "ApiKeysTable", "Properties", "GlobalSecondaryIndexes", 1, "KeySchema", 1, "AttributeName").Value = "created_at"
		}, "table prod_api_keys differs"},
		{"projection keys only", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "DevicesTable", "Properties", "GlobalSecondaryIndexes", 0, "Projection", "ProjectionType").Value = "KEYS_ONLY"
		}, "table prod_devices differs"},
		{"provisioned billing", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "DeviceReadingsTable", "Properties", "BillingMode").Value = "PROVISIONED"
		}, "table prod_device_readings differs"},
		{"ttl attribute renamed", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "DeviceReadingsTable", "Properties", "TimeToLiveSpecification", "AttributeName").Value = "ttl"
		}, "ttl differs"},
		{"ttl disabled", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "ProcessedBatchesTable", "Properties", "TimeToLiveSpecification", "Enabled").Value = "false"
		}, "ttl differs"},
		{"ttl on devices", func(t *testing.T, r *yaml.Node) {
			props := at(t, r, "Resources", "DevicesTable", "Properties")
			ttl := at(t, r, "Resources", "DeviceReadingsTable", "Properties", "TimeToLiveSpecification")
			props.Content = append(props.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "TimeToLiveSpecification"}, cloneNode(ttl))
		}, "ttl differs"},
		{"table name without the prefix", func(t *testing.T, r *yaml.Node) {
			name := at(t, r, "Resources", "DevicesTable", "Properties", "TableName")
			name.Tag, name.Value, name.Style = "!!str", "devices", 0
		}, "table prod_devices: missing from the template"},
		{"table removed", func(t *testing.T, r *yaml.Node) {
			res := at(t, r, "Resources")
			for i := 0; i < len(res.Content); i += 2 {
				if res.Content[i].Value == "ApiKeysTable" {
					res.Content = slices.Delete(res.Content, i, i+2)
					break
				}
			}
		}, "table prod_api_keys: missing from the template"},
		{"point-in-time recovery off", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "ApiKeysTable", "Properties", "PointInTimeRecoverySpecification", "PointInTimeRecoveryEnabled").Value = "false"
		}, "point-in-time recovery is not enabled"},
		{"deletion policy delete", func(t *testing.T, r *yaml.Node) {
			at(t, r, "Resources", "DeviceReadingsTable", "DeletionPolicy").Value = "Delete"
		}, "DeletionPolicy is Delete, want Retain"},
		{"update replace policy missing", func(t *testing.T, r *yaml.Node) {
			tbl := at(t, r, "Resources", "DevicesTable")
			for i := 0; i < len(tbl.Content); i += 2 {
				if tbl.Content[i].Value == "UpdateReplacePolicy" {
					tbl.Content = slices.Delete(tbl.Content, i, i+2)
					break
				}
			}
		}, "UpdateReplacePolicy is <nil>, want Retain"},
		{"property the comparison does not cover", func(t *testing.T, r *yaml.Node) {
			props := at(t, r, "Resources", "DevicesTable", "Properties")
			props.Content = append(props.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Value: "StreamSpecification"},
				&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
					{Kind: yaml.ScalarNode, Value: "StreamViewType"}, {Kind: yaml.ScalarNode, Value: "NEW_IMAGE"},
				}})
		}, "properties the comparison does not cover"},
	}

	var pristine yaml.Node
	require.NoError(t, yaml.Unmarshal(src, &pristine))
	roundTrip, err := yaml.Marshal(&pristine)
	require.NoError(t, err)
	require.NoError(t, compareTemplate(roundTrip, prefix), "an unmodified copy must pass, or the cases below prove nothing")

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var root yaml.Node
			require.NoError(t, yaml.Unmarshal(src, &root))
			tc.mutate(t, &root)
			mutated, err := yaml.Marshal(&root)
			require.NoError(t, err)
			require.NotEqual(t, string(roundTrip), string(mutated), "the mutation changed nothing")
			err = compareTemplate(mutated, prefix)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// at walks a YAML node tree by mapping keys (string) and sequence indexes (int).
// mutateTemplate returns the template src changed by change, encoded again.
func mutateTemplate(t *testing.T, src []byte, change func(*testing.T, *yaml.Node)) []byte {
	t.Helper()
	var root yaml.Node
	require.NoError(t, yaml.Unmarshal(src, &root))
	change(t, &root)
	out, err := yaml.Marshal(&root)
	require.NoError(t, err)
	return out
}

func at(t *testing.T, n *yaml.Node, path ...any) *yaml.Node {
	t.Helper()
	if n.Kind == yaml.DocumentNode {
		n = n.Content[0]
	}
	for _, p := range path {
		switch k := p.(type) {
		case string:
			require.Equal(t, yaml.MappingNode, n.Kind, "at %v: not a mapping", p)
			var next *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == k {
					next = n.Content[i+1]
				}
			}
			require.NotNil(t, next, "no key %q", k)
			n = next
		case int:
			require.Equal(t, yaml.SequenceNode, n.Kind, "at %v: not a sequence", p)
			require.Less(t, k, len(n.Content))
			n = n.Content[k]
		}
	}
	return n
}

func removeAt(t *testing.T, seq *yaml.Node, i int) {
	t.Helper()
	require.Equal(t, yaml.SequenceNode, seq.Kind)
	seq.Content = slices.Delete(seq.Content, i, i+1)
}

func cloneNode(n *yaml.Node) *yaml.Node {
	c := *n
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, k := range n.Content {
		c.Content[i] = cloneNode(k)
	}
	return &c
}

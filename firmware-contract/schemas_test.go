package contract

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// schemasDir holds the JSON Schemas given to firmware authors.
const schemasDir = "schemas"

// validateScript checks documents against the schemas with Python's jsonschema (Draft
// 2020-12): it reads [{"name","schema","doc"}] on stdin and writes {"name": [errors]}.
const validateScript = `
import json, sys
from jsonschema import Draft202012Validator
validators, out = {}, {}
for c in json.load(sys.stdin):
    if c["schema"] not in validators:
        with open(c["schema"]) as f:
            schema = json.load(f)
        Draft202012Validator.check_schema(schema)
        validators[c["schema"]] = Draft202012Validator(schema)
    out[c["name"]] = [e.message for e in validators[c["schema"]].iter_errors(json.loads(c["doc"]))]
json.dump(out, sys.stdout)
`

type schemaCase struct {
	Name   string `json:"name"`
	Schema string `json:"schema"`
	Doc    string `json:"doc"`
	valid  bool
}

// pythonWithJSONSchema returns a python3 that imports jsonschema: the one on PATH, else
// Debian's (where make test-deps installs python3-jsonschema); "" when there is none.
func pythonWithJSONSchema() string {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import jsonschema").Run() == nil {
			return py
		}
	}
	return ""
}

// TestExamplesMatchSchemas checks with a real JSON Schema validator that the schemas accept
// every example of testdata/ack and testdata/responses and every valid vector, and refuse
// what they must (an enrolling ack with half of its key, a key of the wrong form, a key in a
// rejection). It needs python3 with the jsonschema package, and is skipped without it.
func TestExamplesMatchSchemas(t *testing.T) {
	python := pythonWithJSONSchema()
	if python == "" {
		t.Skip("no python3 with jsonschema (make test-deps installs Debian's python3-jsonschema)")
	}
	var cases []schemaCase
	add := func(schema, pattern string) {
		files, err := filepath.Glob(filepath.Join(vectorsDir, pattern))
		require.NoError(t, err)
		require.NotEmpty(t, files, pattern)
		for _, f := range files {
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			cases = append(cases, schemaCase{Name: strings.TrimPrefix(f, vectorsDir+"/"), Schema: schema, Doc: string(data), valid: true})
		}
	}
	add("ack.schema.json", "ack/*.json")
	add("readings-response.schema.json", "responses/*.json")
	add("readings-batch.schema.json", "readings/valid_*.json")
	add("registration.schema.json", "register/valid_*.json")

	const key = `"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"`
	const keyID = `"3f2504e0-4f89-41d3-9a0c-0305e82c3301"`
	const registered = `{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000"`
	const rejected = `{"type":"register","status":"rejected","reason":"device_key_required","message":"m"`
	for name, doc := range map[string]string{
		"device_key without device_key_id": registered + `,"device_key":` + key + `}`,
		"device_key_id without device_key": registered + `,"device_key_id":` + keyID + `}`,
		"device_key in upper case":         registered + `,"device_key":` + strings.ToUpper(key) + `,"device_key_id":` + keyID + `}`,
		"device_key of 63 digits":          registered + `,"device_key":"` + strings.Repeat("a", 63) + `","device_key_id":` + keyID + `}`,
		"device_key_id not a uuid v4":      registered + `,"device_key":` + key + `,"device_key_id":"3f2504e0-4f89-11d3-9a0c-0305e82c3301"}`,
		"device key in a rejection":        rejected + `,"device_key":` + key + `,"device_key_id":` + keyID + `}`,
		"unknown reason":                   `{"type":"register","status":"rejected","reason":"stolen_key","message":"m"}`,
	} {
		cases = append(cases, schemaCase{Name: "refused: " + name, Schema: "ack.schema.json", Doc: doc})
	}
	for i := range cases {
		cases[i].Schema = filepath.Join(schemasDir, cases[i].Schema)
	}

	in, err := json.Marshal(cases)
	require.NoError(t, err)
	cmd := exec.Command(python, "-c", validateScript)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "validator: %s", stderr.String())
	var errs map[string][]string
	require.NoError(t, json.Unmarshal(out, &errs))
	require.Len(t, errs, len(cases))
	for _, c := range cases {
		if c.valid {
			require.Empty(t, errs[c.Name], "%s must match %s", c.Name, filepath.Base(c.Schema))
		} else {
			require.NotEmpty(t, errs[c.Name], "%s must not match %s", c.Name, filepath.Base(c.Schema))
		}
	}
}

// Package config loads layered configuration into a struct: a YAML file
// decoded strictly (unknown keys are errors), then environment variables
// named after the YAML keys. Flags, applied last, are the caller's.
//
// The environment variable of a setting is the prefix followed by its YAML
// path in upper case, joined with underscores: with the prefix "GATEWAY",
// mqtt.addr is GATEWAY_MQTT_ADDR and buffer.max_pending_bytes is
// GATEWAY_BUFFER_MAX_PENDING_BYTES.
package config

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// LoadFile decodes the YAML file at path into dst, which holds the
// defaults. Unknown keys are errors.
func LoadFile(path string, dst any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading config %s: %w", path, err)
	}
	if err := Decode(data, dst); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// Decode decodes YAML into dst strictly.
func Decode(data []byte, dst any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// Encode prints v (a pointer to, or a struct of settings) as YAML that
// Decode reads back to the same settings. Strings holding a line break are
// printed double-quoted: yaml.v3 prints some of them (a lone "\n") as block
// scalars that read back as "". Strings that are not UTF-8 are left to
// yaml.v3, which prints them as !!binary.
func Encode(v any) ([]byte, error) {
	n, err := encodeNode(reflect.ValueOf(v))
	if err != nil {
		return nil, err
	}
	return yaml.Marshal(n)
}

// encodeNode builds the YAML of v: structs field by field (by their yaml
// names, "-" left out), strings with a line break double-quoted, anything
// else as yaml.v3 encodes it.
func encodeNode(v reflect.Value) (*yaml.Node, error) {
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		return encodeNode(v.Elem())
	}
	_, custom := v.Interface().(yaml.Marshaler)
	_, text := v.Interface().(encoding.TextMarshaler)
	if !custom && !text {
		switch {
		case v.Kind() == reflect.String && strings.ContainsAny(v.String(), "\r\n") && utf8.ValidString(v.String()):
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v.String(), Style: yaml.DoubleQuotedStyle}, nil
		case v.Kind() == reflect.Struct:
			return encodeStruct(v)
		case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String && !v.IsNil():
			seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			for i := range v.Len() {
				item, err := encodeNode(v.Index(i))
				if err != nil {
					return nil, err
				}
				seq.Content = append(seq.Content, item)
			}
			return seq, nil
		}
	}
	var n yaml.Node
	if err := n.Encode(v.Interface()); err != nil {
		return nil, err
	}
	return &n, nil
}

func encodeStruct(v reflect.Value) (*yaml.Node, error) {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		val, err := encodeNode(v.Field(i))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name}, val)
	}
	return m, nil
}

// Var is one setting's environment variable.
type Var struct {
	Name  string // e.g. GATEWAY_MQTT_ADDR
	Path  string // e.g. mqtt.addr
	Type  string // string, integer, boolean, number, duration
	field reflect.Value
}

// Vars lists the environment variables of dst's settings, sorted by name.
func Vars(prefix string, dst any) []Var {
	var out []Var
	walk(reflect.ValueOf(dst).Elem(), prefix, "", &out)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

var durationType = reflect.TypeOf(time.Duration(0))

func walk(v reflect.Value, envPrefix, pathPrefix string, out *[]Var) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		env := envPrefix + "_" + strings.ToUpper(name)
		path := name
		if pathPrefix != "" {
			path = pathPrefix + "." + name
		}
		fv := v.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != durationType {
			walk(fv, env, path, out)
			continue
		}
		typ := ""
		switch {
		case f.Type == durationType:
			typ = "duration"
		case f.Type.Kind() == reflect.String:
			typ = "string"
		case f.Type.Kind() == reflect.Bool:
			typ = "boolean"
		case f.Type.Kind() >= reflect.Int && f.Type.Kind() <= reflect.Uint64:
			typ = "integer"
		case f.Type.Kind() == reflect.Float64 || f.Type.Kind() == reflect.Float32:
			typ = "number"
		default:
			continue // lists and maps come from the file only
		}
		*out = append(*out, Var{Name: env, Path: path, Type: typ, field: fv})
	}
}

// ApplyEnv sets every setting of dst whose environment variable is present
// in environ (os.Environ's form). It returns the names of variables with
// the prefix that match no setting, for the caller to warn about, except
// those listed in known.
func ApplyEnv(prefix string, environ []string, dst any, known ...string) (unknown []string, err error) {
	vars := map[string]Var{}
	for _, v := range Vars(prefix, dst) {
		vars[v.Name] = v
	}
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, prefix+"_") {
			continue
		}
		v, found := vars[name]
		if !found {
			if !contains(known, name) {
				unknown = append(unknown, name)
			}
			continue
		}
		if err := set(v.field, value); err != nil {
			return unknown, fmt.Errorf("environment variable %s (%s): %w", name, v.Path, err)
		}
	}
	return unknown, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func set(f reflect.Value, s string) error {
	s = strings.TrimSpace(s)
	switch {
	case f.Type() == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("must be a duration such as 30s or 5m: %w", err)
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.String:
		f.SetString(s)
	case f.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return errors.New("must be true or false")
		}
		f.SetBool(b)
	case f.Kind() >= reflect.Int && f.Kind() <= reflect.Int64:
		n, err := strconv.ParseInt(s, 10, f.Type().Bits())
		if err != nil {
			return fmt.Errorf("must be an integer that fits %d bits", f.Type().Bits())
		}
		f.SetInt(n)
	case f.Kind() >= reflect.Uint && f.Kind() <= reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, f.Type().Bits())
		if err != nil {
			return fmt.Errorf("must be a non-negative integer that fits %d bits", f.Type().Bits())
		}
		f.SetUint(n)
	case f.Kind() == reflect.Float64 || f.Kind() == reflect.Float32:
		n, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return errors.New("must be a number")
		}
		f.SetFloat(n)
	default:
		return fmt.Errorf("type %s cannot be set from the environment", f.Type())
	}
	return nil
}

package config

import (
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fuzzSection and fuzzConfig have a setting of every kind Vars knows, and
// a list, which comes from the file only.
type fuzzSection struct {
	Addr    string        `yaml:"addr"`
	Wait    time.Duration `yaml:"wait"`
	Size    uint32        `yaml:"size"`
	Count   int64         `yaml:"count"`
	Small   int8          `yaml:"small"`
	Enabled bool          `yaml:"enabled"`
	Ratio   float64       `yaml:"ratio"`
	Tags    []string      `yaml:"tags"`
}

type fuzzConfig struct {
	Name    string        `yaml:"name"`
	Level   int           `yaml:"level"`
	Timeout time.Duration `yaml:"timeout"`
	Inner   fuzzSection   `yaml:"inner"`
}

func fuzzDefaults() fuzzConfig {
	return fuzzConfig{Name: "default", Level: 3, Timeout: 20 * time.Second,
		Inner: fuzzSection{Addr: ":1883", Wait: time.Minute, Size: 262144, Count: 10000, Enabled: true, Ratio: 0.5}}
}

// yamlTypeError is an entry of yaml.v3's unmarshal errors: it names its
// line (and the key or the expected type).
var yamlTypeError = regexp.MustCompile(`^  line \d+: \S`)

func FuzzDecode(f *testing.F) {
	def := fuzzDefaults()
	printed, err := Encode(def)
	require.NoError(f, err)
	for _, s := range []string{
		string(printed), "", "---\n", "inner:\n  wait: 2m\n  tags: [a, b]\n", "inner:\n  wiat: 2m\n",
		"level: lots\n", "inner: {size: -1}\n", "inner: {size: 99999999999}\n", "timeout: 5\n", "timeout: 1e400h\n",
		"inner: {ratio: .nan}\n", "name: &a [*a]\n", "a: &a [*a, *a]\nb: *a\n", "name: !!binary aGVsbG8=\n",
		"inner:\n  <<: {addr: x}\n", "name: \"\\xff\"\n", "? [a]\n: b\n", "inner: [1, 2]\n", "name: 1\nname: 2\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := fuzzDefaults()
		err := Decode(data, &cfg)
		if err != nil {
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, "yaml: "), "%q", msg)
			if rest, ok := strings.CutPrefix(msg, "yaml: unmarshal errors:\n"); ok {
				// (an entry quotes the value, which may hold newlines)
				require.Regexp(t, yamlTypeError, rest, "a setting's error names its line")
			}
			return
		}
		// What decodes prints back (as gatewayd --print-config does) to a
		// file that decodes to the same settings.
		out, err := Encode(cfg)
		require.NoError(t, err)
		again := fuzzDefaults()
		require.NoError(t, Decode(out, &again), "printed:\n%s", out)
		if math.IsNaN(cfg.Inner.Ratio) {
			require.True(t, math.IsNaN(again.Inner.Ratio))
			cfg.Inner.Ratio, again.Inner.Ratio = 0, 0
		}
		if len(cfg.Inner.Tags) == 0 { // a nil list prints as []
			require.Empty(t, again.Inner.Tags)
			cfg.Inner.Tags, again.Inner.Tags = nil, nil
		}
		require.Equal(t, cfg, again, "printed:\n%s", out)
	})
}

func FuzzApplyEnv(f *testing.F) {
	def := fuzzDefaults()
	for _, v := range Vars("APP", &def) {
		for _, value := range []string{"", " 7 ", "-1", "90s", "true", "0.5", "NaN", "1e400", "99999999999999999999", "\xff", "x=y"} {
			f.Add(v.Name, value)
		}
	}
	f.Add("APP_SECRET", "s")
	f.Add("APP_TYPO", "1")
	f.Add("PATH", "/bin")
	f.Add("APP_INNER_TAGS", "a,b")
	f.Fuzz(func(t *testing.T, name, value string) {
		cfg := fuzzDefaults()
		kv := name + "=" + value
		unknown, err := ApplyEnv("APP", []string{kv}, &cfg, "APP_SECRET")
		name, value, _ = strings.Cut(kv, "=") // as the environment reads it
		vars := map[string]Var{}
		for _, v := range Vars("APP", &cfg) {
			vars[v.Name] = v
		}
		v, isSetting := vars[name]
		switch {
		case !strings.HasPrefix(name, "APP_"):
			require.NoError(t, err)
			require.Empty(t, unknown)
			require.Equal(t, fuzzDefaults(), cfg)
		case !isSetting:
			require.NoError(t, err)
			if name == "APP_SECRET" {
				require.Empty(t, unknown)
			} else {
				require.Equal(t, []string{name}, unknown)
			}
			require.Equal(t, fuzzDefaults(), cfg)
		case err != nil:
			require.True(t, strings.HasPrefix(err.Error(), "environment variable "+name+" ("+v.Path+"): "),
				"the error names the variable and the setting: %q", err)
		default:
			// The value, printed back, sets the same value.
			printed := formatSetting(v.field)
			again := fuzzDefaults()
			_, err := ApplyEnv("APP", []string{name + "=" + printed}, &again)
			require.NoError(t, err, "%s=%q (from %q)", name, printed, value)
			if f, ok := v.field.Interface().(float64); ok && math.IsNaN(f) {
				require.True(t, math.IsNaN(again.Inner.Ratio))
				return
			}
			require.Equal(t, cfg, again)
		}
	})
}

// formatSetting prints a setting's value as an environment variable would
// hold it.
func formatSetting(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Kind() == reflect.String:
		return v.String()
	case v.Kind() == reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case v.Kind() >= reflect.Int && v.Kind() <= reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case v.Kind() >= reflect.Uint && v.Kind() <= reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10)
	default:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	}
}

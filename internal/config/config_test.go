package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

type inner struct {
	Addr    string        `yaml:"addr"`
	Wait    time.Duration `yaml:"wait"`
	Size    uint32        `yaml:"size"`
	Enabled bool          `yaml:"enabled"`
	Ratio   float64       `yaml:"ratio"`
	Tags    []string      `yaml:"tags"`
	hidden  int
}

type outer struct {
	Name  string `yaml:"name"`
	Count int64  `yaml:"count"`
	Inner inner  `yaml:"inner"`
	Skip  string `yaml:"-"`
}

func TestVarsNamesFollowYAMLPaths(t *testing.T) {
	var o outer
	var names []string
	for _, v := range Vars("APP", &o) {
		names = append(names, v.Name+"="+v.Path+":"+v.Type)
	}
	require.Equal(t, []string{
		"APP_COUNT=count:integer",
		"APP_INNER_ADDR=inner.addr:string",
		"APP_INNER_ENABLED=inner.enabled:boolean",
		"APP_INNER_RATIO=inner.ratio:number",
		"APP_INNER_SIZE=inner.size:integer",
		"APP_INNER_WAIT=inner.wait:duration",
		"APP_NAME=name:string",
	}, names)
}

func TestApplyEnv(t *testing.T) {
	o := outer{Name: "default"}
	unknown, err := ApplyEnv("APP", []string{
		"APP_INNER_WAIT=90s", "APP_INNER_SIZE=7", "APP_INNER_ENABLED=true", "APP_INNER_RATIO=0.5",
		"APP_COUNT=-3", "APP_TYPO=1", "APP_SECRET=x", "PATH=/bin",
	}, &o, "APP_SECRET")
	require.NoError(t, err)
	require.Equal(t, []string{"APP_TYPO"}, unknown)
	require.Equal(t, "default", o.Name)
	require.Equal(t, 90*time.Second, o.Inner.Wait)
	require.EqualValues(t, 7, o.Inner.Size)
	require.True(t, o.Inner.Enabled)
	require.Equal(t, 0.5, o.Inner.Ratio)
	require.EqualValues(t, -3, o.Count)

	for env, want := range map[string]string{
		"APP_INNER_SIZE=-1":          "APP_INNER_SIZE (inner.size): must be a non-negative integer",
		"APP_INNER_SIZE=99999999999": "fits 32 bits",
		"APP_INNER_WAIT=5":           "must be a duration",
		"APP_INNER_ENABLED=maybe":    "must be true or false",
	} {
		_, err := ApplyEnv("APP", []string{env}, &o)
		require.ErrorContains(t, err, want, env)
	}
}

func TestDecodeIsStrict(t *testing.T) {
	o := outer{Name: "default"}
	require.NoError(t, Decode([]byte("inner:\n  wait: 2m\n  tags: [a, b]\n"), &o))
	require.Equal(t, 2*time.Minute, o.Inner.Wait)
	require.Equal(t, []string{"a", "b"}, o.Inner.Tags)
	require.Equal(t, "default", o.Name, "absent keys keep their defaults")
	require.ErrorContains(t, Decode([]byte("inner:\n  wiat: 2m\n"), &o), "field wiat not found")
	require.NoError(t, Decode(nil, &o), "an empty file is allowed")
}

func TestEncodePrintsWhatYAMLPrintsAndReadsBack(t *testing.T) {
	o := outer{Name: "gw", Count: 3, Skip: "not printed",
		Inner: inner{Addr: ":1883", Wait: 90 * time.Second, Size: 7, Enabled: true, Ratio: 0.5, Tags: []string{"a", "b"}}}
	plain, err := yaml.Marshal(&o)
	require.NoError(t, err)
	out, err := Encode(&o)
	require.NoError(t, err)
	require.Equal(t, string(plain), string(out), "without line breaks, yaml.v3's own output")
	require.NotContains(t, string(out), "not printed")

	for _, s := range []string{"\n", "\n\n", "a\n", "\na", "a\r\nb", " \n ", "\xff\n", "\n\xfe"} {
		o.Name, o.Inner.Tags = s, []string{s}
		out, err := Encode(&o)
		require.NoError(t, err)
		var again outer
		require.NoError(t, Decode(out, &again), "%s", out)
		require.Equal(t, s, again.Name, "printed:\n%s", out)
		require.Equal(t, []string{s}, again.Inner.Tags, "printed:\n%s", out)
	}
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"time"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/bridge"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/internal/audit"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/config"
	"greenhouse-gateway/internal/pushmetrics"
	"greenhouse-gateway/registry"
	"greenhouse-gateway/uplink"
)

// envPrefix prefixes every setting's environment variable.
const envPrefix = "GATEWAY"

// Environment variables that are not settings of the file.
const (
	envPepper         = "GATEWAY_API_KEY_PEPPER"
	envPepperPrevious = "GATEWAY_API_KEY_PEPPER_PREVIOUS"
	envAdminToken     = "GATEWAY_ADMIN_TOKEN"
)

// Config is gatewayd's whole configuration.
type Config struct {
	// DataDir holds the buffer. Default /var/lib/greenhouse-gateway.
	DataDir string `yaml:"data_dir"`
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`
	// LogFormat is text or json. Default text.
	LogFormat string `yaml:"log_format"`
	// ShutdownTimeout bounds a graceful stop. Default 20s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`

	// DynamoDBEndpoint is the DynamoDB URL; empty means AWS itself.
	DynamoDBEndpoint string `yaml:"dynamodb_endpoint"`
	// AWSRegion overrides the SDK's region chain when set.
	AWSRegion string `yaml:"aws_region"`
	// TablePrefix prefixes the four table names. Default empty.
	TablePrefix string `yaml:"table_prefix"`
	// APIKeyPepperFile holds the API key pepper (e.g. a systemd
	// credential); otherwise GATEWAY_API_KEY_PEPPER is used.
	APIKeyPepperFile string `yaml:"api_key_pepper_file"`
	// APIKeyPepperPreviousFile holds the pepper being rotated out, if any;
	// otherwise GATEWAY_API_KEY_PEPPER_PREVIOUS is used.
	APIKeyPepperPreviousFile string `yaml:"api_key_pepper_previous_file"`
	// AdminTokenFile holds the operator API's token; otherwise
	// GATEWAY_ADMIN_TOKEN is used. Without one the operator API is off.
	AdminTokenFile string `yaml:"admin_token_file"`
	// MemoryLimit is the Go runtime's soft memory limit in bytes, applied
	// when the environment sets no GOMEMLIMIT; 0 turns it off. Default
	// 201326592 (192 MiB).
	MemoryLimit int64 `yaml:"memory_limit"`
	// MemoryReleaseInterval is how often an idle gateway returns free
	// memory to the system (see memoryReleaser); 0 turns it off. Default
	// 30s.
	MemoryReleaseInterval time.Duration `yaml:"memory_release_interval"`
	// Debug configures the diagnostics endpoints.
	Debug DebugConfig `yaml:"debug"`

	MQTT    broker.MQTTConfig    `yaml:"mqtt"`
	HTTP    httpserve.HTTPConfig `yaml:"http"`
	Auth    auth.AuthConfig      `yaml:"auth"`
	Ingest  ingest.Config        `yaml:"ingest"`
	Devices registry.Config      `yaml:"devices"`
	Buffer  buffer.Options       `yaml:"buffer"`
	Uplink  uplink.Config        `yaml:"uplink"`
	Push    pushmetrics.Config   `yaml:"push"`
	Audit   audit.Config         `yaml:"audit"`
}

// defaultConfig returns every default, so a printed config documents them.
func defaultConfig() Config {
	return Config{
		DataDir:         "/var/lib/greenhouse-gateway",
		LogLevel:        "info",
		LogFormat:       "text",
		ShutdownTimeout: 20 * time.Second,
		MemoryLimit:     defaultMemoryLimit,

		MemoryReleaseInterval: defaultMemoryReleaseInterval,
		MQTT: broker.MQTTConfig{Mode: "embedded", External: bridge.DefaultExternalConfig(), Addr: ":1883",
			MaxPacketSize: 256 << 10, MaxClients: 10000, ConnectTimeout: 10 * time.Second, MaxUnauthenticated: 1024,
			MaxUnauthenticatedPerAddress: 64, MaxSessionsPerDevice: 8, MaxClientsPerKeyPercent: 90,
			SessionExpiry: time.Hour, MaxQueuedPerClient: 100, MaxOfflineSessions: 1000, MaxOfflineSessionsPerDevice: 4},
		HTTP: httpserve.DefaultHTTPConfig(),
		Auth: auth.AuthConfig{RefreshInterval: time.Minute, NegativeTTL: 30 * time.Second, LookupTimeout: 5 * time.Second,
			MaxLookupsPerSecond: 20, DeviceKeys: auth.DeviceKeysPreferred},
		Ingest: ingest.DefaultConfig(),
		Devices: registry.Config{UnknownDevices: "accept", RebootLoopBoots: 5, SeenWriteInterval: 5 * time.Minute,
			FlushInterval: 5 * time.Second, TakeoverFlagCount: 5},
		Buffer: buffer.DefaultOptions(),
		Uplink: uplink.DefaultConfig(),
		Push:   pushmetrics.DefaultConfig(),
		Audit:  audit.DefaultConfig(),
	}
}

// sessionMemoryShare is the part of the memory limit that mqtt.session_memory
// defaults to: a sixteenth (12 MiB of the default 192 MiB). The garbage
// collector lets the heap grow to about twice what is live, and mochi
// copies each queued message again for every fan-out and every second's
// expiry scan, so the state costs about three times its size in RSS.
const sessionMemoryShare = 16

// sessionMemory returns mqtt.session_memory when set, else its share of the
// memory limit in force (0, the broker's own default, without one).
func sessionMemory(set, limit int64) int64 {
	if set != 0 || limit <= 0 || limit == math.MaxInt64 {
		return set
	}
	return max(limit/sessionMemoryShare, 1<<20)
}

func (c Config) cloud() cloud.Config {
	return cloud.Config{Endpoint: c.DynamoDBEndpoint, Region: c.AWSRegion, TablePrefix: c.TablePrefix}
}

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	if c.DataDir == "" {
		return errors.New("data_dir: must be set")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level: %q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("log_format: %q is not one of text, json", c.LogFormat)
	}
	if c.ShutdownTimeout <= 0 {
		return errors.New("shutdown_timeout: must be positive")
	}
	if err := validateMemoryLimit(c.MemoryLimit); err != nil {
		return err
	}
	if err := validateMemoryReleaseInterval(c.MemoryReleaseInterval); err != nil {
		return err
	}
	var fe *cloud.FieldError
	if err := c.cloud().Validate(); errors.As(err, &fe) {
		// cloud.Config names its fields as gatewayctl's do; here they are
		// dynamodb_endpoint and aws_region.
		if name, ok := map[string]string{"endpoint": "dynamodb_endpoint", "region": "aws_region"}[fe.Field]; ok {
			fe.Field = name
		}
		return err
	}
	for _, v := range []interface{ Validate() error }{c.Debug, c.cloud(), c.MQTT, c.HTTP, c.Auth, c.Ingest, c.Devices, c.Buffer, c.Uplink, c.Push} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if err := c.Audit.Validate(); err != nil {
		return err
	}
	return nil
}

// flags are the command-line overrides; set ones win over file and
// environment.
type flags struct {
	configFile  string
	version     bool
	printConfig bool
	overrides   map[string]*string
}

// flagSettings maps flag names to the settings they override.
var flagSettings = []struct {
	name, usage string
	field       func(*Config) *string
}{
	{"data-dir", "directory of the durable buffer (data_dir)", func(c *Config) *string { return &c.DataDir }},
	{"mqtt-addr", "MQTT listen address (mqtt.addr, default :1883)", func(c *Config) *string { return &c.MQTT.Addr }},
	{"mqtt-mode", "embedded (the gateway is the broker) or external (mqtt.mode)", func(c *Config) *string { return &c.MQTT.Mode }},
	{"mqtt-external-url", "broker URL in external mode, e.g. tcp://host:1883 (mqtt.external.url)", func(c *Config) *string { return &c.MQTT.External.URL }},
	{"http-addr", "HTTP listen address (http.addr, default :8080)", func(c *Config) *string { return &c.HTTP.Addr }},
	{"dynamodb-endpoint", "DynamoDB endpoint URL; empty means AWS itself (dynamodb_endpoint)", func(c *Config) *string { return &c.DynamoDBEndpoint }},
	{"aws-region", "AWS region (aws_region); default from the SDK chain", func(c *Config) *string { return &c.AWSRegion }},
	{"table-prefix", "prefix of the four table names (table_prefix)", func(c *Config) *string { return &c.TablePrefix }},
	{"uplink-target", "dynamodb (write the tables) or lambda (invoke the readings function) (uplink.target)", func(c *Config) *string { return &c.Uplink.Target }},
	{"lambda-function", "the readings function's name or ARN, for uplink.target lambda (uplink.lambda.function)", func(c *Config) *string { return &c.Uplink.Lambda.Function }},
	{"lambda-endpoint", "Lambda API URL for local runs, e.g. http://127.0.0.1:9001; empty means AWS itself (uplink.lambda.endpoint)", func(c *Config) *string { return &c.Uplink.Lambda.Endpoint }},
	{"log-level", "debug, info, warn or error (log_level)", func(c *Config) *string { return &c.LogLevel }},
	{"pprof-addr", "serve Go profiles on this address, e.g. 127.0.0.1:6060 (debug.pprof_addr; default off)", func(c *Config) *string { return &c.Debug.PprofAddr }},
}

func newFlagSet(f *flags) *flag.FlagSet {
	fs := flag.NewFlagSet("gatewayd", flag.ContinueOnError)
	fs.StringVar(&f.configFile, "config", "", "YAML config `file` (unknown keys are errors)")
	fs.BoolVar(&f.version, "version", false, "print the version and exit")
	fs.BoolVar(&f.printConfig, "print-config", false, "print the effective configuration as YAML and exit")
	f.overrides = map[string]*string{}
	for _, s := range flagSettings {
		f.overrides[s.name] = fs.String(s.name, "", s.usage)
	}
	return fs
}

// loadConfig layers defaults, the file, the environment and the flags.
func loadConfig(args, environ []string) (Config, *flags, []string, error) {
	f := &flags{}
	fs := newFlagSet(f)
	if err := fs.Parse(args); err != nil {
		return Config{}, nil, nil, err
	}
	if fs.NArg() > 0 {
		return Config{}, nil, nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := defaultConfig()
	if f.version {
		return cfg, f, nil, nil
	}
	if f.configFile != "" {
		if err := config.LoadFile(f.configFile, &cfg); err != nil {
			return Config{}, nil, nil, err
		}
	}
	unknown, err := config.ApplyEnv(envPrefix, environ, &cfg, envPepper, envPepperPrevious, envAdminToken)
	if err != nil {
		return Config{}, nil, nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	for _, s := range flagSettings {
		if set[s.name] {
			*s.field(&cfg) = *f.overrides[s.name]
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, nil, nil, fmt.Errorf("invalid configuration: %w", err)
	}
	return cfg, f, unknown, nil
}

package devicesim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	valid := func() Config {
		c := DefaultConfig()
		c.MQTTURL = "tcp://127.0.0.1:1883"
		c.APIKey = "k"
		return c
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{name: "defaults with mqtt", mutate: func(*Config) {}},
		{name: "http", mutate: func(c *Config) { c.MQTTURL, c.HTTPURL = "", "http://127.0.0.1:8080" }},
		{name: "no transport", mutate: func(c *Config) { c.MQTTURL = "" }, wantErr: "one of the MQTT URL and the HTTP URL"},
		{name: "two transports", mutate: func(c *Config) { c.HTTPURL = "http://127.0.0.1:8080" }, wantErr: "only one"},
		{name: "http scheme for mqtt", mutate: func(c *Config) { c.MQTTURL = "http://127.0.0.1:1883" }, wantErr: "scheme"},
		{name: "mqtt without host", mutate: func(c *Config) { c.MQTTURL = "tcp://" }, wantErr: "no host"},
		{name: "no key", mutate: func(c *Config) { c.APIKey = "" }, wantErr: "api key"},
		{name: "no devices", mutate: func(c *Config) { c.Devices = 0 }, wantErr: "devices"},
		{name: "bad mac", mutate: func(c *Config) { c.FirstMAC = "02:00:00:00:01" }, wantErr: "first mac"},
		{name: "mac space", mutate: func(c *Config) { c.FirstMAC = "FF:FF:FF:FF:FF:FE"; c.Devices = 3 }, wantErr: "no room"},
		{name: "too many readings", mutate: func(c *Config) { c.Readings = 101 }, wantErr: "readings"},
		{name: "interval too short", mutate: func(c *Config) { c.Interval = 4 * time.Millisecond }, wantErr: "too short"},
		{name: "qos 2", mutate: func(c *Config) { c.QoS = 2 }, wantErr: "qos"},
		{name: "negative batches", mutate: func(c *Config) { c.Batches = -1 }, wantErr: "batches"},
		{name: "inflight over buffer", mutate: func(c *Config) { c.BufferSize = 2; c.MaxInflight = 3 }, wantErr: "max inflight"},
		{name: "retry bounds", mutate: func(c *Config) { c.RetryMax = c.RetryMin / 2 }, wantErr: "retry"},
		{name: "reboots", mutate: func(c *Config) { c.RebootEvery = time.Minute; c.Reboots = 3 }},
		{name: "unbounded reboots", mutate: func(c *Config) { c.RebootEvery = time.Minute }},
		{name: "negative reboot interval", mutate: func(c *Config) { c.RebootEvery = -time.Second }, wantErr: "reboot interval"},
		{name: "reboot interval too short", mutate: func(c *Config) { c.RebootEvery = time.Millisecond }, wantErr: "at least 10ms"},
		{name: "negative reboots", mutate: func(c *Config) { c.RebootEvery = time.Minute; c.Reboots = -1 }, wantErr: "reboots"},
		{name: "reboots without interval", mutate: func(c *Config) { c.Reboots = 2 }, wantErr: "needs a reboot interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

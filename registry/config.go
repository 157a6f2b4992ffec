package registry

import (
	"errors"
	"fmt"
	"time"
)

// Config configures the device registry.
type Config struct {
	// UnknownDevices decides what happens to readings from a device that
	// never registered: "accept" (default) stores them, "reject" answers
	// unknown_device.
	UnknownDevices string `yaml:"unknown_devices"`
	// RebootLoopBoots flags a reboot loop when a device boots more than
	// this many times within an hour. Default 5.
	RebootLoopBoots int `yaml:"reboot_loop_boots"`
	// SeenWriteInterval is the most often last_seen_at alone is written to
	// the devices table per device. Default 5m.
	SeenWriteInterval time.Duration `yaml:"seen_write_interval"`
	// FlushInterval is how often last-seen times and sequence counters are
	// saved locally. Registrations, boots and clock anchors are saved at
	// once. Default 5s.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// TakeoverFlagCount flags a device whose MQTT session is taken over
	// (another connection with its client ID) more than this many times
	// within an hour: someone may be impersonating it. Default 5.
	TakeoverFlagCount int `yaml:"takeover_flag_count"`
}

func (c Config) withDefaults() Config {
	if c.UnknownDevices == "" {
		c.UnknownDevices = "accept"
	}
	if c.RebootLoopBoots == 0 {
		c.RebootLoopBoots = 5
	}
	if c.SeenWriteInterval == 0 {
		c.SeenWriteInterval = 5 * time.Minute
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = 5 * time.Second
	}
	if c.TakeoverFlagCount == 0 {
		c.TakeoverFlagCount = 5
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch c.UnknownDevices {
	case "", "accept", "reject":
	default:
		return fmt.Errorf("devices.unknown_devices: %q is not one of accept, reject", c.UnknownDevices)
	}
	if c.RebootLoopBoots < 0 {
		return errors.New("devices.reboot_loop_boots: must not be negative")
	}
	if c.SeenWriteInterval < 0 {
		return errors.New("devices.seen_write_interval: must not be negative")
	}
	if c.FlushInterval < 0 {
		return errors.New("devices.flush_interval: must not be negative")
	}
	if c.TakeoverFlagCount < 0 {
		return errors.New("devices.takeover_flag_count: must not be negative")
	}
	return nil
}

package devicesim

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Limits on the configuration, so that every loop and every buffer of the simulator is bounded.
const (
	// MaxDevices is the largest number of devices one simulator runs.
	MaxDevices = 10_000
	// MaxReadingsPerBatch is the contract's default maximum number of readings in one batch.
	MaxReadingsPerBatch = 100
	// MaxBufferSize is the largest offline buffer a device may have, in batches.
	MaxBufferSize = 100_000
	// MinRebootEvery is the shortest RebootEvery, so that a rebooting device cannot spin.
	MinRebootEvery = 10 * time.Millisecond
	// RebootJitter is the spread of a device's time between reboots: each boot lasts
	// RebootEvery ± 20%.
	RebootJitter = 0.2
)

// Config configures a simulator. The zero value is not valid: start from [DefaultConfig].
type Config struct {
	// MQTTURL is the broker URL, for example "tcp://127.0.0.1:1883". Exactly one of MQTTURL and
	// HTTPURL is set.
	MQTTURL string
	// HTTPURL is the gateway's HTTP base URL, for example "http://127.0.0.1:8080". Batches are
	// posted to HTTPURL + "/v1/readings" and registrations to HTTPURL + "/v1/register".
	HTTPURL string
	// APIKey is the raw fleet key: the MQTT password, or the HTTP bearer token, of every
	// device that has no device key yet (one it was issued when it enrolled, kept in the key
	// store). Required.
	APIKey string

	// Devices is the number of simulated devices, 1..MaxDevices. Default 3.
	Devices int
	// FirstMAC is the hardware_id of the first device; the others get the following MAC
	// addresses. Any case is accepted; hardware ids are sent in upper case.
	// Default "02:00:00:00:00:01".
	FirstMAC string
	// FirmwareVersion is sent in registrations and batches. Default "1.0.16".
	FirmwareVersion string

	// Interval is the time between two batches of one device, and the time window one batch
	// covers. It must leave at least 1 ms between two readings. Default 5s.
	Interval time.Duration
	// Readings is the number of readings per batch, 1..MaxReadingsPerBatch. Default 5.
	Readings int
	// Batches is the number of batches each device builds before it stops producing and drains
	// its buffer. Zero means no limit.
	Batches int
	// Duration is how long devices produce batches before they stop producing and drain their
	// buffers. Zero means no limit.
	Duration time.Duration
	// DrainTimeout bounds the time a device keeps retrying its unconfirmed batches after it
	// stopped producing (Batches or Duration reached). Zero stops at once. Default 30s.
	// A cancelled context (SIGINT, SIGTERM) stops at once, without draining.
	DrainTimeout time.Duration

	// QoS is the MQTT QoS of registrations and readings: 0 or 1. Default 1. The ack topic is
	// always subscribed at QoS 1.
	QoS int
	// MaxInflight is the number of batches a device sends before it waits for their answers,
	// 1..BufferSize. Default 1: the oldest unconfirmed batch first, one at a time.
	MaxInflight int
	// BufferSize is the capacity of a device's offline buffer, in batches. When it is full the
	// oldest batch is dropped and counted. Default 1000.
	BufferSize int
	// AckTimeout is how long a device waits for the answer to a batch or a registration before
	// it counts the attempt as failed and retries later. Default 10s.
	AckTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between retries: the n-th consecutive failure
	// waits a random time in [d/2, d] with d = min(RetryMax, RetryMin * 2^(n-1)), or the
	// server's Retry-After if that is longer. Defaults 500ms and 30s.
	RetryMin time.Duration
	RetryMax time.Duration

	// ClockSyncAfter simulates an ESP32 that has no NTP time yet: during the first
	// ClockSyncAfter of a boot, timestamps are counted from 1970-01-01 (timestamp_ms equals
	// uptime_ms), which the gateway answers with clock_not_synced or repairs from uptime_ms.
	// Zero means the clock is synced from boot. It applies to every boot, reboots included.
	ClockSyncAfter time.Duration

	// RebootEvery makes devices reboot: each boot of a device lasts RebootEvery ± 20%
	// (RebootJitter), drawn per device and per boot from the seed. A reboot drops the
	// connection without a clean MQTT DISCONNECT (as a power cut or a watchdog reset would),
	// draws a new boot_id, restarts seq and the uptime clock at 0, loses the answers it was
	// waiting for, keeps the offline buffer (flash) and registers again. Zero means never;
	// otherwise at least MinRebootEvery.
	RebootEvery time.Duration
	// Reboots caps the number of reboots of each device; zero means no cap. It needs
	// RebootEvery.
	Reboots int

	// Seed makes sensor values, backoff jitter and reboot times reproducible. Zero picks a
	// random seed, which is logged so that a run can be repeated. Boot ids are always random.
	Seed uint64
	// ReportPath, if set, is a file that receives one JSON line (a [ReportLine]) per batch that
	// received a final answer. It is created (truncated) when Run starts.
	ReportPath string
	// KeyStorePath, if set, is the JSON file that keeps the device keys the devices were
	// issued when they enrolled ({"<hardware_id>":"<device key>",...}), written atomically
	// with mode 0600 before a device uses its key, and read when Run starts: a device found
	// there uses its device key instead of APIKey. Empty keeps the keys in memory, for one
	// run.
	KeyStorePath string
	// SummaryInterval is the time between two per-device summary log lines. Zero disables them;
	// the final summary is always logged. Default 30s.
	SummaryInterval time.Duration
}

// DefaultConfig returns the defaults that the devicesim command's flags start from.
func DefaultConfig() Config {
	return Config{
		Devices:         3,
		FirstMAC:        "02:00:00:00:00:01",
		FirmwareVersion: "1.0.16",
		Interval:        5 * time.Second,
		Readings:        5,
		DrainTimeout:    30 * time.Second,
		QoS:             1,
		MaxInflight:     1,
		BufferSize:      1000,
		AckTimeout:      10 * time.Second,
		RetryMin:        500 * time.Millisecond,
		RetryMax:        30 * time.Second,
		SummaryInterval: 30 * time.Second,
	}
}

// Validate reports every problem of the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	switch {
	case c.MQTTURL == "" && c.HTTPURL == "":
		add("one of the MQTT URL and the HTTP URL is required")
	case c.MQTTURL != "" && c.HTTPURL != "":
		add("only one of the MQTT URL and the HTTP URL may be set")
	case c.MQTTURL != "":
		if err := checkURL(c.MQTTURL, "tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss"); err != nil {
			add("mqtt url: %w", err)
		}
	default:
		if err := checkURL(c.HTTPURL, "http", "https"); err != nil {
			add("http url: %w", err)
		}
	}
	if c.APIKey == "" {
		add("api key is required")
	}
	if c.Devices < 1 || c.Devices > MaxDevices {
		add("devices must be between 1 and %d, got %d", MaxDevices, c.Devices)
	}
	if first, err := parseMAC(c.FirstMAC); err != nil {
		add("first mac: %w", err)
	} else if c.Devices >= 1 && first > maxMAC-uint64(c.Devices-1) {
		add("first mac %s leaves no room for %d devices", c.FirstMAC, c.Devices)
	}
	if c.FirmwareVersion == "" {
		add("firmware version is required")
	}
	if c.Readings < 1 || c.Readings > MaxReadingsPerBatch {
		add("readings must be between 1 and %d, got %d", MaxReadingsPerBatch, c.Readings)
	}
	if c.Interval <= 0 {
		add("interval must be positive, got %s", c.Interval)
	} else if c.Readings >= 1 && c.Interval < time.Duration(c.Readings)*time.Millisecond {
		add("interval %s is too short for %d readings with distinct milliseconds", c.Interval, c.Readings)
	}
	if c.Batches < 0 {
		add("batches must not be negative, got %d", c.Batches)
	}
	if c.Duration < 0 {
		add("duration must not be negative, got %s", c.Duration)
	}
	if c.DrainTimeout < 0 {
		add("drain timeout must not be negative, got %s", c.DrainTimeout)
	}
	if c.QoS != 0 && c.QoS != 1 {
		add("qos must be 0 or 1, got %d", c.QoS)
	}
	if c.BufferSize < 1 || c.BufferSize > MaxBufferSize {
		add("buffer size must be between 1 and %d, got %d", MaxBufferSize, c.BufferSize)
	}
	if c.MaxInflight < 1 || (c.BufferSize >= 1 && c.MaxInflight > c.BufferSize) {
		add("max inflight must be between 1 and the buffer size, got %d", c.MaxInflight)
	}
	if c.AckTimeout <= 0 {
		add("ack timeout must be positive, got %s", c.AckTimeout)
	}
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin {
		add("retry backoff needs 0 < min <= max, got %s and %s", c.RetryMin, c.RetryMax)
	}
	if c.ClockSyncAfter < 0 {
		add("clock sync delay must not be negative, got %s", c.ClockSyncAfter)
	}
	switch {
	case c.RebootEvery < 0:
		add("reboot interval must not be negative, got %s", c.RebootEvery)
	case c.RebootEvery > 0 && c.RebootEvery < MinRebootEvery:
		add("reboot interval must be at least %s, got %s", MinRebootEvery, c.RebootEvery)
	}
	if c.Reboots < 0 {
		add("reboots must not be negative, got %d", c.Reboots)
	} else if c.Reboots > 0 && c.RebootEvery == 0 {
		add("reboots (%d) needs a reboot interval", c.Reboots)
	}
	if c.SummaryInterval < 0 {
		add("summary interval must not be negative, got %s", c.SummaryInterval)
	}
	if len(errs) > 0 {
		return fmt.Errorf("devicesim: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

func checkURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return nil
		}
	}
	return fmt.Errorf("%q: scheme must be one of %v", raw, schemes)
}

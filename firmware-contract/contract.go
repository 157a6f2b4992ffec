package contract

import "time"

// Batch is one reading batch, the payload of devices/{hardware_id}/readings
// and one element of POST /v1/readings.
//
// A Batch returned by [DecodeBatch] has non-nil Sensors and SensorStatus maps
// in every reading, and its strings are exactly what the device sent (after
// JSON unescaping).
type Batch struct {
	// BatchID identifies the batch: 1..256 characters of [A-Za-z0-9_:.-],
	// starting with HardwareID + "_". Firmware builds it as
	// {hardware_id}_{boot_id}_{window_start_ms}_{window_end_ms}.
	BatchID string `json:"batch_id"`
	// HardwareID is the device's MAC address in upper case, AA:BB:CC:DD:EE:FF.
	HardwareID string `json:"hardware_id"`
	// BootID is a UUID v4 the device draws at every boot.
	BootID string `json:"boot_id"`
	// FirmwareVersion is 1..64 printable ASCII characters.
	FirmwareVersion string `json:"firmware_version"`
	// Seq is the optional sequence number of the batch within its boot,
	// from 0, +1 per batch. Nil when the device does not send it.
	Seq *uint64 `json:"seq,omitempty"`
	// SentUptimeMS is the optional device uptime in milliseconds when the
	// batch was sent. Nil when the device does not send it.
	SentUptimeMS *int64 `json:"sent_uptime_ms,omitempty"`
	// Readings holds 1..Limits.MaxReadings readings with unique timestamps.
	Readings []Reading `json:"readings"`
}

// Reading is one set of sensor values taken at one instant.
type Reading struct {
	// TimestampMS is the time of the reading in milliseconds since the Unix
	// epoch, in [2000-01-01, 2100-01-01).
	TimestampMS int64 `json:"timestamp_ms"`
	// UptimeMS is the optional device uptime in milliseconds when the reading
	// was taken. Nil when the device does not send it.
	UptimeMS *int64 `json:"uptime_ms,omitempty"`
	// Sensors maps sensor names (^[a-z0-9_]{1,64}$) to finite values.
	Sensors map[string]float64 `json:"sensors"`
	// SensorStatus maps sensor names to "ok" or "error".
	SensorStatus map[string]string `json:"sensor_status"`
	// TimeSource is TimeSourceGateway when the gateway repaired TimestampMS
	// (see [Batch.RepairClock]), and empty otherwise. Devices never send it.
	TimeSource string `json:"time_source,omitempty"`
}

// TimeSourceGateway marks a reading whose timestamp the gateway computed from
// the device's uptime because the device clock was not synced.
const TimeSourceGateway = "gateway"

// Sensor status values.
const (
	SensorOK    = "ok"
	SensorError = "error"
)

// Registration is the payload of devices/{hardware_id}/register and
// POST /v1/register.
type Registration struct {
	// HardwareID is the device's MAC address in upper case.
	HardwareID string `json:"hardware_id"`
	// BootID is the UUID v4 of the current boot.
	BootID string `json:"boot_id"`
	// FirmwareVersion is 1..64 printable ASCII characters.
	FirmwareVersion string `json:"firmware_version"`
	// FriendlyName is an optional name of 1..64 printable Unicode
	// characters; empty when the device does not send one.
	FriendlyName string `json:"friendly_name,omitempty"`
	// Capabilities lists what the device has.
	Capabilities Capabilities `json:"capabilities"`
}

// Capabilities is the capabilities object of a registration, stored as is in
// the devices table.
type Capabilities struct {
	// Sensors lists up to 64 distinct sensor names (^[a-z0-9_]{1,64}$).
	// Never nil after DecodeRegistration.
	Sensors []string `json:"sensors"`
	// Features maps up to 64 feature names (^[a-z0-9_]{1,64}$) to whether
	// the device has them. Never nil after DecodeRegistration.
	Features map[string]bool `json:"features"`
}

// Size limits of the transports. The gateway enforces them before decoding.
const (
	// MaxHTTPBodyBytes is the largest POST /v1/readings or /v1/register body
	// (1 MiB); larger bodies get 413.
	MaxHTTPBodyBytes = 1 << 20
	// MaxMQTTPacketBytes is the largest MQTT packet the broker accepts
	// (256 KiB).
	MaxMQTTPacketBytes = 256 << 10
)

// Fixed limits of the contract.
const (
	// MaxBatchIDLen is the maximum length of a batch_id in bytes.
	MaxBatchIDLen = 256
	// MaxFirmwareVersionLen is the maximum length of firmware_version.
	MaxFirmwareVersionLen = 64
	// MaxFriendlyNameLen is the maximum length of friendly_name in
	// characters (Unicode code points).
	MaxFriendlyNameLen = 64
	// MaxNameLen is the maximum length of a sensor or feature name.
	MaxNameLen = 64
	// MaxCapabilities is the maximum number of entries in
	// capabilities.sensors and in capabilities.features.
	MaxCapabilities = 64
	// MinTimestampMS is 2000-01-01T00:00:00Z, the earliest valid timestamp.
	// Earlier timestamps mean the device clock is not synced.
	MinTimestampMS int64 = 946684800000
	// EndTimestampMS is 2100-01-01T00:00:00Z; timestamps must be earlier.
	EndTimestampMS int64 = 4102444800000
)

// DynamoDB's number range, as float64 bounds. A value is storable when it is
// zero or when MinNumberMagnitude <= |v| < NumberMagnitudeLimit: the float64
// nearest to 1E+126 prints as 1e+126, which DynamoDB rejects, and every
// smaller float64 prints below 9.9999999999999999999999999999999999999E+125.
const (
	NumberMagnitudeLimit = 1e126
	MinNumberMagnitude   = 1e-130
)

// Limits are the configurable limits of a batch. A zero field takes its
// default.
type Limits struct {
	// MaxReadings is the maximum number of readings in a batch; default 100.
	MaxReadings int
	// MaxSensors is the maximum number of entries in a reading's sensors
	// and, separately, in its sensor_status; default 64.
	MaxSensors int
	// MaxClockSkew is how far past the gateway's clock a timestamp may be;
	// later timestamps are rejected. Default 5m.
	MaxClockSkew time.Duration
}

// Default limits.
const (
	DefaultMaxReadings  = 100
	DefaultMaxSensors   = 64
	DefaultMaxClockSkew = 5 * time.Minute
)

// DefaultLimits returns the contract's default limits.
func DefaultLimits() Limits {
	return Limits{
		MaxReadings:  DefaultMaxReadings,
		MaxSensors:   DefaultMaxSensors,
		MaxClockSkew: DefaultMaxClockSkew,
	}
}

// withDefaults returns lim with zero or negative fields set to their default.
func (lim Limits) withDefaults() Limits {
	if lim.MaxReadings <= 0 {
		lim.MaxReadings = DefaultMaxReadings
	}
	if lim.MaxSensors <= 0 {
		lim.MaxSensors = DefaultMaxSensors
	}
	if lim.MaxClockSkew <= 0 {
		lim.MaxClockSkew = DefaultMaxClockSkew
	}
	return lim
}

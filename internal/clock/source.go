package clock

import "time"

// Source tells the gateway's time: a *Clock in gatewayd, System or a fixed
// clock in tests. The ingest path, the device registry and the uplink read
// the time through it.
type Source interface {
	Now() time.Time
	// Plausible is false while the time cannot be trusted (a Pi without
	// RTC before NTP, or before the build's release date).
	Plausible() bool
}

// System is the system clock, always plausible.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }

// Plausible returns true.
func (System) Plausible() bool { return true }

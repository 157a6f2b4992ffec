package cloud

import (
	"time"

	"greenhouse-gateway/firmware-contract"
)

// DeviceUpsert is one version of a device's record in the devices table:
// the device registry produces it, the uplink writes it.
type DeviceUpsert struct {
	HardwareID        string
	ConfirmationID    string
	FriendlyName      string
	FirmwareVersion   string
	LastBootID        string
	Capabilities      contract.Capabilities
	FirstRegisteredAt time.Time
	LastSeenAt        time.Time
	// Version identifies this state; the source is told it was written.
	Version uint64
}

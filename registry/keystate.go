package registry

// KeyState is what operators see of a device's keys; the device keys
// (ingest) fill it, the operator API shows it beside the device's record.
type KeyState struct {
	// KeyIDs are the device's keys not reset, and Used whether the
	// device has authenticated with one (a fleet key no longer acts for
	// it then, unless auth.device_keys is off).
	KeyIDs []string `json:"key_ids"`
	Used   bool     `json:"used"`
	// CloudPending is set while a key issued or reset here is still to be
	// written to api_keys.
	CloudPending bool `json:"cloud_pending"`
}

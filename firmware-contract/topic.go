package contract

import "strings"

// MQTT topic kinds: the last level of devices/{hardware_id}/{kind}.
const (
	KindReadings = "readings"
	KindRegister = "register"
	KindAck      = "ack"
)

// Transports a device sends over, as the gateway names them in metric
// labels and audit records.
const (
	TransportMQTT = "mqtt"
	TransportHTTP = "http"
)

// TopicPrefix is the first level of every device topic.
const TopicPrefix = "devices/"

// ReadingsTopic returns devices/{hw}/readings, where devices publish batches.
func ReadingsTopic(hw string) string { return TopicPrefix + hw + "/" + KindReadings }

// RegisterTopic returns devices/{hw}/register, where devices publish their
// registration.
func RegisterTopic(hw string) string { return TopicPrefix + hw + "/" + KindRegister }

// AckTopic returns devices/{hw}/ack, where the gateway publishes one ack per
// message received from the device.
func AckTopic(hw string) string { return TopicPrefix + hw + "/" + KindAck }

// ParseTopic splits a device topic devices/{hardware_id}/{kind}. ok is false
// unless the topic has exactly these three levels, hardware_id is valid (upper
// case, see [ValidHardwareID]) and kind is readings, register or ack.
func ParseTopic(topic string) (hardwareID string, kind string, ok bool) {
	rest, found := strings.CutPrefix(topic, TopicPrefix)
	if !found {
		return "", "", false
	}
	hw, kind, found := strings.Cut(rest, "/")
	if !found || hardwareIDRule(hw) != "" {
		return "", "", false
	}
	switch kind {
	case KindReadings, KindRegister, KindAck:
		return hw, kind, true
	}
	return "", "", false
}

// ClientIDAllowed reports whether an MQTT client ID is allowed for the device
// hardwareID: the hardware_id itself, or the hardware_id followed by '-' and
// a non-empty suffix (a second connection, for example one that only listens
// for acks).
func ClientIDAllowed(clientID, hardwareID string) bool {
	rest, ok := strings.CutPrefix(clientID, hardwareID)
	return ok && (rest == "" || len(rest) > 1 && rest[0] == '-')
}

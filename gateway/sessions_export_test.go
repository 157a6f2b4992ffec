package gateway

import "github.com/mochi-mqtt/server/v2/packets"

// OfflineSessionBytes is what the session accounting charges for one
// offline session without queued messages.
func OfflineSessionBytes(b *Broker) int64 { return b.sessions.offlineBytes() }

// QueuedMessageBytes is what the session accounting charges for one queued
// message of that topic and payload.
func QueuedMessageBytes(topic string, payload []byte) int64 {
	return messageBytes(packets.Packet{TopicName: topic, Payload: payload})
}

package ingest

import (
	"github.com/mochi-mqtt/server/v2/packets"
)

// OfflineSessionBytes is what the session accounting charges for one
// offline session without queued messages.
func OfflineSessionBytes(b *Broker) int64 { return b.sessions.offlineBytes() }

// QueuedMessageBytes is what the session accounting charges for one queued
// message of that topic and payload.
func QueuedMessageBytes(topic string, payload []byte) int64 {
	return messageBytes(packets.Packet{TopicName: topic, Payload: payload})
}

// TopicSubscribers returns the client IDs the broker's topic index holds a
// subscription of topic for.
func TopicSubscribers(b *Broker, topic string) []string {
	var ids []string
	for id := range b.server.Topics.Subscribers(topic).Subscriptions {
		ids = append(ids, id)
	}
	return ids
}

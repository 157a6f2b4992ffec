package broker

import (
	"fmt"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// The broker's client slots: at most mqtt.max_clients client IDs are
// connected at once, one hardware_id holds at most max_sessions_per_device
// of them (HW, HW-1, HW-x... all count for HW), and one API key at most
// max_clients_per_key_percent of max_clients. The unit is the client ID: a
// connection that takes over the session of a client ID already connected
// (a device reconnecting before the broker noticed its previous connection
// was gone) holds the slot of that client ID, and is never refused for it.
// (mochi's own cap, Capabilities.MaximumClients, is checked before
// authentication and would refuse such a takeover on a full broker, and
// without a word: it is left unlimited.)

// Defaults of the fair shares.
const (
	// defaultMaxSessionsPerDevice leaves a device a few client IDs (a
	// second task with its own suffix) and room for predecessors of a
	// reconnecting device that have not timed out yet.
	defaultMaxSessionsPerDevice = 8
	// defaultMaxClientsPerKeyPercent lets one key (a greenhouse's fleet
	// key) hold 90% of max_clients, so that the other keys always find the
	// rest.
	defaultMaxClientsPerKeyPercent = 90
)

// Reasons a connection is refused a slot, label values of
// gateway_mqtt_connections_refused_total.
const (
	reasonMaxClients     = "max_clients"
	reasonDeviceSessions = "device_sessions"
	reasonKeyShare       = "key_share"
)

// slotRefusal says why a connection gets no slot.
type slotRefusal struct {
	reason  string // metric label
	setting string // the setting whose limit was reached
	limit   int
}

// code is the CONNACK reason code of the refusal (MQTT 5).
func (r *slotRefusal) code() packets.Code {
	if r.reason == reasonMaxClients {
		return packets.ErrServerBusy
	}
	return packets.ErrQuotaExceeded
}

func (r *slotRefusal) Error() string {
	return fmt.Sprintf("%s: limit of %d connected client IDs reached", r.setting, r.limit)
}

// refusalLogInterval is the least time between two log lines of one
// refusal reason: a device reconnecting in a loop is logged, not the loop.
const refusalLogInterval = 10 * time.Second

// sessionSlots counts the client IDs connected per hardware_id and per API
// key, and the connections holding each client ID.
type sessionSlots struct {
	maxClients        int64
	perDevice, perKey int // 0: no limit

	mu      sync.Mutex
	clients int64                     // client IDs connected
	devices map[string]map[string]int // hardware_id → client ID → connections
	keys    map[string]map[string]int // key ID → client ID → connections
	logged  map[string]refusalLog     // by reason
}

// refusalLog is when a refusal reason was last logged, and how many
// refusals were not logged since.
type refusalLog struct {
	at         time.Time
	suppressed int
}

// newSessionSlots returns the slots for maxClients client IDs, perDevice
// per hardware_id and keyPercent of maxClients per key (at least one).
func newSessionSlots(perDevice int, maxClients int64, keyPercent int) *sessionSlots {
	perKey := 0
	if keyPercent > 0 && keyPercent < 100 {
		perKey = int(max(1, maxClients*int64(keyPercent)/100))
	}
	return &sessionSlots{maxClients: maxClients, perDevice: perDevice, perKey: perKey,
		devices: map[string]map[string]int{}, keys: map[string]map[string]int{}, logged: map[string]refusalLog{}}
}

// logRefusal reports whether a refusal for reason at now is to be logged,
// at most once per refusalLogInterval, and how many were not since.
func (s *sessionSlots) logRefusal(reason string, now time.Time) (log bool, suppressed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logged[reason]
	if !l.at.IsZero() && now.Sub(l.at) < refusalLogInterval {
		l.suppressed++
		s.logged[reason] = l
		return false, 0
	}
	s.logged[reason] = refusalLog{at: now}
	return true, l.suppressed
}

// acquire gives the connection of clientID, for hw under keyID, its slots,
// and returns the function releasing them. An empty keyID is not counted
// per key.
func (s *sessionSlots) acquire(hw, clientID, keyID string) (func(), *slotRefusal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := s.devices[hw]
	takeover := ids[clientID] > 0
	if s.perDevice > 0 && !takeover && len(ids) >= s.perDevice {
		return nil, &slotRefusal{reasonDeviceSessions, "mqtt.max_sessions_per_device", s.perDevice}
	}
	if ids := s.keys[keyID]; keyID != "" && s.perKey > 0 && ids[clientID] == 0 && len(ids) >= s.perKey {
		return nil, &slotRefusal{reasonKeyShare, "mqtt.max_clients_per_key_percent", s.perKey}
	}
	if s.maxClients > 0 && !takeover && s.clients >= s.maxClients {
		return nil, &slotRefusal{reasonMaxClients, "mqtt.max_clients", int(s.maxClients)}
	}
	if hold(s.devices, hw, clientID) {
		s.clients++
	}
	if keyID != "" {
		hold(s.keys, keyID, clientID)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if drop(s.devices, hw, clientID) {
				s.clients--
			}
			if keyID != "" {
				drop(s.keys, keyID, clientID)
			}
		})
	}, nil
}

// counts returns the client IDs connected, and the hardware_ids and keys
// holding them.
func (s *sessionSlots) counts() (clients int64, devices, keys int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clients, len(s.devices), len(s.keys)
}

// hold adds a connection of clientID to owner's, reporting whether the
// client ID is new there.
func hold(m map[string]map[string]int, owner, clientID string) bool {
	ids := m[owner]
	if ids == nil {
		ids = map[string]int{}
		m[owner] = ids
	}
	ids[clientID]++
	return ids[clientID] == 1
}

// drop removes a connection of clientID from owner's, reporting whether it
// was the client ID's last.
func drop(m map[string]map[string]int, owner, clientID string) bool {
	ids := m[owner]
	ids[clientID]--
	last := ids[clientID] <= 0
	if last {
		delete(ids, clientID)
	}
	if len(ids) == 0 {
		delete(m, owner)
	}
	return last
}

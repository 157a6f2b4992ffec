package broker

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The broker keeps a persistent session (MQTT 3.1.1 clean session false, or
// MQTT 5 with a Session Expiry Interval) after its client disconnects, with
// its subscription and every QoS 1 message published to it since: mochi
// holds each one as an in-flight packet until the client comes back and
// acknowledges it, or the session expires. The gateway publishes one ack
// per batch to the device's ack topic, so a device that connects under many
// client IDs and leaves each with a persistent session multiplies its acks
// by the number of sessions. sessions bounds that state:
//
//   - mochi expires an offline session after mqtt.session_expiry (its
//     MaximumSessionExpiryInterval; an MQTT 5 client's interval is capped
//     by it in the CONNACK and in DISCONNECT);
//   - at most mqtt.max_offline_sessions_per_device offline sessions per
//     hardware_id and mqtt.max_offline_sessions in all; beyond them the
//     session offline longest ends first;
//   - at most mqtt.max_queued_per_client messages wait for one client; a
//     new one sheds the oldest (acks are advisory: a device that missed one
//     resends its batch and is answered duplicate);
//   - the queued messages and offline sessions together stay within
//     mqtt.session_memory bytes: beyond it the oldest messages queued for
//     offline clients are shed first, then the sessions offline longest.
//
// The accounting follows mochi's hooks (OnQosPublish, OnQosComplete,
// OnQosDropped, OnDisconnect, OnSessionEstablished, OnClientExpired) and is
// reconciled against mochi's own state every sweepInterval, because mochi
// removes some in-flight packets without a hook (a full write queue, MQTT 5
// flow control).
type sessions struct {
	mqtt.HookBase
	server *mqtt.Server
	limits sessionLimits
	logger *slog.Logger

	mu       sync.Mutex
	byID     map[string]*session // sessions with queued messages or offline, by client ID
	queue    list.List           // every queued message (*queued), oldest first
	offline  list.List           // offline sessions (*session), offline longest first
	byDevice map[string]int      // offline sessions by hardware_id
	messages int                 // len(queue)
	msgBytes int64               // the bytes of the queued messages
	stBytes  int64               // msgBytes plus the offline sessions' bytes

	shed    *prometheus.CounterVec
	expired *prometheus.CounterVec
}

// sessionLimits are the bounds sessions enforces.
type sessionLimits struct {
	maxQueued           int   // messages waiting for one client
	maxOffline          int   // offline sessions in all
	maxOfflinePerDevice int   // offline sessions of one hardware_id
	budget              int64 // bytes of queued messages and offline sessions
}

// session is one client ID's session as sessions tracks it.
type session struct {
	id, hw  string
	cl      *mqtt.Client       // the client holding the session now
	byPID   map[uint16]*queued // queued messages by packet ID
	bytes   int64              // the bytes of the queued messages
	order   list.List          // the session's queued messages, oldest first
	offElem *list.Element      // in sessions.offline while offline
	ending  bool               // picked to end (see pick)
}

// queued is one message waiting for its client's PUBACK.
type queued struct {
	s      *session
	pid    uint16
	bytes  int64
	global *list.Element // in sessions.queue
	local  *list.Element // in session.order
}

// Defaults of the session bounds (see sessions.go).
const (
	defaultSessionExpiry               = time.Hour
	defaultMaxQueuedPerClient          = 100
	defaultMaxOfflineSessions          = 1000
	defaultMaxOfflineSessionsPerDevice = 4
	DefaultSessionMemory               = 12 << 20
	// maxQueuedPerClientLimit keeps the cap, plus inflightSlack, within
	// MQTT's 16-bit packet identifiers.
	maxQueuedPerClientLimit = 65000
	// inflightSlack is the room above MaxQueuedPerClient left in mochi's
	// own cap (which drops the newest message), for messages published to
	// one client concurrently before sessions sheds the oldest.
	inflightSlack = 64
)

// validateSessions reports the first invalid session bound.
func (c MQTTConfig) validateSessions() error {
	switch {
	case c.SessionExpiry < 0:
		return errors.New("mqtt.session_expiry: must not be negative")
	case c.SessionExpiry/time.Second > math.MaxUint32:
		return fmt.Errorf("mqtt.session_expiry: %s is over MQTT's limit of %d seconds", c.SessionExpiry, uint32(math.MaxUint32))
	case c.SessionExpiry != 0 && (c.SessionExpiry < time.Second || c.SessionExpiry%time.Second != 0):
		return fmt.Errorf("mqtt.session_expiry: %s is not a whole number of seconds, at least 1s", c.SessionExpiry)
	case c.MaxQueuedPerClient < 0 || c.MaxQueuedPerClient > maxQueuedPerClientLimit:
		return fmt.Errorf("mqtt.max_queued_per_client: must be between 1 and %d (0 means the default)", maxQueuedPerClientLimit)
	case c.MaxOfflineSessions < 0:
		return errors.New("mqtt.max_offline_sessions: must not be negative")
	case c.MaxOfflineSessionsPerDevice < 0:
		return errors.New("mqtt.max_offline_sessions_per_device: must not be negative")
	case c.SessionMemory < 0 || c.SessionMemory != 0 && c.SessionMemory < 1<<20:
		return errors.New("mqtt.session_memory: must be at least 1 MiB (0 means the default)")
	}
	return nil
}

// Reasons for shedding a queued message or ending a session early.
const (
	shedClientCap     = "client_cap"
	shedBudget        = "budget"
	expiredExpiry     = "expiry"
	expiredDeviceCap  = "device_cap"
	expiredSessionCap = "session_cap"
	expiredBudget     = "budget"
)

// sweepInterval is how often sessions reconciles with mochi's state.
const sweepInterval = time.Second

var (
	// messageOverhead is what mochi and sessions hold per queued message
	// besides its payload and topic: the packet struct, rounded up to the
	// allocator's size class, plus its in-flight map slot and the tracking
	// here (queued, two list elements, a map slot), about 450 bytes in
	// all. TestOfflineSessionOverhead checks it against the heap.
	messageOverhead = int64(reflect.TypeFor[packets.Packet]().Size()) + 448
	// sessionOverhead is what an offline session holds besides its queued
	// messages and its write queue (added per broker, see offlineBytes):
	// mochi's client with its in-flight map, subscriptions, topic aliases,
	// read buffer, closed connection and topic-index entry, and the
	// tracking here. TestOfflineSessionOverhead checks it against the heap.
	sessionOverhead = int64(reflect.TypeFor[mqtt.Client]().Size()+reflect.TypeFor[session]().Size()) + 5632
)

func newSessions(server *mqtt.Server, limits sessionLimits, logger *slog.Logger, reg prometheus.Registerer) *sessions {
	s := &sessions{server: server, limits: limits, logger: logger,
		byID: map[string]*session{}, byDevice: map[string]int{}}
	f := promauto.With(reg)
	s.shed = f.NewCounterVec(prometheus.CounterOpts{
		Namespace: "gateway", Subsystem: "mqtt", Name: "messages_shed_total",
		Help: "Queued MQTT messages (acks) dropped before their client acknowledged them, by reason " +
			"(client_cap: mqtt.max_queued_per_client; budget: mqtt.session_memory).",
	}, []string{"reason"})
	s.expired = f.NewCounterVec(prometheus.CounterOpts{
		Namespace: "gateway", Subsystem: "mqtt", Name: "sessions_expired_total",
		Help: "Offline persistent MQTT sessions ended, by reason (expiry: mqtt.session_expiry; " +
			"device_cap: mqtt.max_offline_sessions_per_device; session_cap: mqtt.max_offline_sessions; " +
			"budget: mqtt.session_memory).",
	}, []string{"reason"})
	for _, r := range []string{shedClientCap, shedBudget} {
		s.shed.WithLabelValues(r)
	}
	for _, r := range []string{expiredExpiry, expiredDeviceCap, expiredSessionCap, expiredBudget} {
		s.expired.WithLabelValues(r)
	}
	gauge := func(name, help string, v func() float64) {
		f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "gateway", Subsystem: "mqtt", Name: name, Help: help}, v)
	}
	gauge("offline_sessions", "Persistent MQTT sessions held for clients that are not connected.",
		s.locked(func() float64 { return float64(s.offline.Len()) }))
	gauge("queued_messages", "MQTT messages (acks) waiting for their client's PUBACK, offline clients included.",
		s.locked(func() float64 { return float64(s.messages) }))
	gauge("queued_bytes", "Bytes held by the queued MQTT messages: payload, topic and per-message structures.",
		s.locked(func() float64 { return float64(s.msgBytes) }))
	gauge("session_state_bytes", "Bytes of queued MQTT messages and offline sessions, held within mqtt.session_memory.",
		s.locked(func() float64 { return float64(s.stBytes) }))
	gauge("session_state_budget_bytes", "mqtt.session_memory: the bound on gateway_mqtt_session_state_bytes.",
		func() float64 { return float64(limits.budget) })
	return s
}

// locked returns f run under the lock.
func (s *sessions) locked(f func() float64) func() float64 {
	return func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return f()
	}
}

func (s *sessions) ID() string { return "sessions" }

func (s *sessions) Provides(b byte) bool {
	switch b {
	case mqtt.OnQosPublish, mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.OnSessionEstablished,
		mqtt.OnDisconnect, mqtt.OnClientExpired, mqtt.OnPacketRead:
		return true
	}
	return false
}

// OnPacketRead caps the Session Expiry Interval an MQTT 5 DISCONNECT sets
// (mochi caps only the CONNECT's, in the CONNACK).
func (s *sessions) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Disconnect && pk.Properties.SessionExpiryIntervalFlag {
		pk.Properties.SessionExpiryInterval = min(pk.Properties.SessionExpiryInterval,
			s.server.Options.Capabilities.MaximumSessionExpiryInterval)
	}
	return pk, nil
}

// OnQosPublish counts a message mochi queued for cl and sheds what exceeds
// the bounds. mochi calls it again for each message it resends to a
// reconnected client; those are already counted.
func (s *sessions) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if cl.Net.Inline || pk.FixedHeader.Type != packets.Publish {
		return
	}
	s.mu.Lock()
	ss := s.sessionOf(cl)
	if _, ok := ss.byPID[pk.PacketID]; !ok {
		s.add(ss, pk.PacketID, messageBytes(pk))
	}
	for ss.order.Len() > s.limits.maxQueued {
		s.shedMessage(ss.order.Front().Value.(*queued), shedClientCap)
	}
	victims := s.overBudget()
	s.mu.Unlock()
	s.end(victims, expiredBudget)
}

// OnQosComplete forgets a message its client acknowledged.
func (s *sessions) OnQosComplete(cl *mqtt.Client, pk packets.Packet) { s.forget(cl, pk.PacketID) }

// OnQosDropped forgets a message mochi dropped. mochi drops the messages of
// a session taken over by a new connection (the successor inherits them)
// after marking the old client taken over; those stay counted.
func (s *sessions) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		return
	}
	s.forget(cl, pk.PacketID)
}

// forget removes cl's message pid unless mochi still holds one under that
// ID (a new message reusing it).
func (s *sessions) forget(cl *mqtt.Client, pid uint16) {
	if cl.Net.Inline {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byID[cl.ID]
	if ss == nil {
		return
	}
	q := ss.byPID[pid]
	if q == nil {
		return
	}
	if pk, ok := cl.State.Inflight.Get(pid); ok && pk.FixedHeader.Type == packets.Publish {
		return
	}
	s.remove(q)
	s.dropIfIdle(ss)
}

// OnSessionEstablished marks a session online again.
func (s *sessions) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.byID[cl.ID]; ss != nil {
		ss.cl = cl
		s.setOnline(ss)
		s.dropIfIdle(ss)
	}
}

// OnDisconnect marks a persistent session offline (and forgets one that
// ends with its connection), then ends the sessions over the caps.
func (s *sessions) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if cl.Net.Inline {
		return
	}
	s.mu.Lock()
	// Checked under s.mu: a takeover marks cl before its successor's
	// OnSessionEstablished takes s.mu.
	if cl.IsTakenOver() {
		s.mu.Unlock()
		return
	}
	if expire {
		if ss := s.byID[cl.ID]; ss != nil && ss.cl == cl {
			s.drop(ss)
		}
		s.mu.Unlock()
		return
	}
	s.setOffline(s.sessionOf(cl))
	byDevice, total, budget := s.overCaps()
	s.mu.Unlock()
	s.end(byDevice, expiredDeviceCap)
	s.end(total, expiredSessionCap)
	s.end(budget, expiredBudget)
}

// OnClientExpired forgets a session mochi expired (mqtt.session_expiry)
// and ended (Server.EndSession: its subscription and messages released).
func (s *sessions) OnClientExpired(cl *mqtt.Client) {
	s.mu.Lock()
	if ss := s.byID[cl.ID]; ss != nil && ss.cl == cl {
		s.drop(ss)
	}
	s.mu.Unlock()
	s.expired.WithLabelValues(expiredExpiry).Inc()
}

// end ends offline sessions picked early: removes each from mochi's
// clients if it is still there and offline, then frees its state.
func (s *sessions) end(victims []*mqtt.Client, reason string) {
	for _, cl := range victims {
		// EndSession leaves a session a new connection took over.
		ended := cl.Closed() && s.server.EndSession(cl)
		s.mu.Lock()
		if ss := s.byID[cl.ID]; ss != nil && ended && ss.cl == cl {
			s.drop(ss)
		} else if ss != nil {
			ss.ending = false // it came back; the next sweep counts it again if offline
		}
		s.mu.Unlock()
		if ended {
			s.expired.WithLabelValues(reason).Inc()
			s.logger.Debug("ended an offline MQTT session", "client", cl.ID, "reason", reason)
		}
	}
}

// sessionOf returns cl's session, tracking it from now on. Called with the
// lock held.
func (s *sessions) sessionOf(cl *mqtt.Client) *session {
	ss := s.byID[cl.ID]
	if ss == nil {
		ss = &session{id: cl.ID, hw: string(cl.Properties.Username), byPID: map[uint16]*queued{}}
		s.byID[cl.ID] = ss
	}
	ss.cl = cl
	return ss
}

// add counts a queued message. Called with the lock held.
func (s *sessions) add(ss *session, pid uint16, bytes int64) {
	q := &queued{s: ss, pid: pid, bytes: bytes}
	q.global = s.queue.PushBack(q)
	q.local = ss.order.PushBack(q)
	ss.byPID[pid] = q
	ss.bytes += bytes
	s.messages++
	s.msgBytes += bytes
	s.stBytes += bytes
}

// remove uncounts a queued message. Called with the lock held.
func (s *sessions) remove(q *queued) {
	s.queue.Remove(q.global)
	q.s.order.Remove(q.local)
	delete(q.s.byPID, q.pid)
	q.s.bytes -= q.bytes
	s.messages--
	s.msgBytes -= q.bytes
	s.stBytes -= q.bytes
}

// shedMessage drops a queued message from mochi and from the count. mochi
// calls no hook while it holds an in-flight lock, so taking that lock under
// ours cannot deadlock. Called with the lock held.
func (s *sessions) shedMessage(q *queued, reason string) {
	cl := q.s.cl
	if cl.State.Inflight.Delete(q.pid) {
		atomic.AddInt64(&s.server.Info.Inflight, -1)
		cl.State.Inflight.IncreaseSendQuota()
	}
	s.remove(q)
	s.shed.WithLabelValues(reason).Inc()
}

// setOffline marks a session offline. Called with the lock held.
func (s *sessions) setOffline(ss *session) {
	if ss.offElem != nil || ss.ending {
		return
	}
	ss.offElem = s.offline.PushBack(ss)
	s.byDevice[ss.hw]++
	s.stBytes += s.offlineBytes()
}

// setOnline marks a session online. Called with the lock held.
func (s *sessions) setOnline(ss *session) {
	if ss.offElem == nil {
		return
	}
	s.offline.Remove(ss.offElem)
	ss.offElem = nil
	if s.byDevice[ss.hw]--; s.byDevice[ss.hw] == 0 {
		delete(s.byDevice, ss.hw)
	}
	s.stBytes -= s.offlineBytes()
}

// offlineBytes is what an offline session holds besides its queued
// messages: sessionOverhead and its write queue's buffer (a channel of
// packet pointers), which mochi keeps for offline sessions too.
func (s *sessions) offlineBytes() int64 {
	return sessionOverhead + 8*int64(s.server.Options.Capabilities.MaximumClientWritesPending)
}

// drop forgets a session and its messages. Called with the lock held.
func (s *sessions) drop(ss *session) {
	for ss.order.Len() > 0 {
		s.remove(ss.order.Front().Value.(*queued))
	}
	s.setOnline(ss)
	delete(s.byID, ss.id)
}

// dropIfIdle forgets an online session without queued messages. Called
// with the lock held.
func (s *sessions) dropIfIdle(ss *session) {
	if ss.offElem == nil && ss.order.Len() == 0 {
		delete(s.byID, ss.id)
	}
}

// overBudget sheds the oldest messages queued for offline clients until the
// state is within the budget, then picks the sessions offline longest to
// end (returned, to be ended without the lock). Called with the lock held.
func (s *sessions) overBudget() []*mqtt.Client {
	if s.stBytes <= s.limits.budget {
		return nil
	}
	// Shed down to 15/16 of the budget so that a full state does not pay a
	// scan per message.
	low := s.limits.budget - s.limits.budget/16
	for e := s.queue.Front(); e != nil && s.stBytes > low; {
		q := e.Value.(*queued)
		e = e.Next()
		if q.s.offElem != nil {
			s.shedMessage(q, shedBudget)
		}
	}
	var victims []*mqtt.Client
	for over := s.stBytes - s.limits.budget; over > 0 && s.offline.Len() > 0; {
		ss := s.offline.Front().Value.(*session)
		over -= ss.bytes + s.offlineBytes()
		victims = append(victims, s.pick(ss))
	}
	return victims
}

// overCaps picks the offline sessions to end for the per-device and total
// caps and for the budget, the ones offline longest first. Called with the
// lock held.
func (s *sessions) overCaps() (byDevice, total, budget []*mqtt.Client) {
	for e := s.offline.Front(); e != nil; {
		ss := e.Value.(*session)
		e = e.Next()
		switch {
		case s.byDevice[ss.hw] > s.limits.maxOfflinePerDevice:
			byDevice = append(byDevice, s.pick(ss))
		case s.offline.Len() > s.limits.maxOffline:
			total = append(total, s.pick(ss))
		}
	}
	return byDevice, total, s.overBudget()
}

// pick takes an offline session out of the count as it is about to be
// ended, so that no one else picks it. Called with the lock held.
func (s *sessions) pick(ss *session) *mqtt.Client {
	s.setOnline(ss)
	ss.ending = true
	return ss.cl
}

// run reconciles with mochi's state every interval until ctx is done.
func (s *sessions) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep makes the accounting match mochi's clients and in-flight messages
// exactly, then ends the sessions over the caps.
func (s *sessions) sweep() {
	clients := s.server.Clients.GetAll()
	s.mu.Lock()
	for id, ss := range s.byID {
		if cl, ok := clients[id]; !ok || cl.IsTakenOver() {
			s.drop(ss)
		}
	}
	for id, cl := range clients {
		if cl.Net.Inline || cl.IsTakenOver() {
			continue
		}
		ss := s.byID[id]
		if ss == nil && !cl.Closed() && cl.State.Inflight.Len() == 0 {
			continue
		}
		if ss == nil {
			ss = s.sessionOf(cl)
		}
		ss.cl = cl
		s.reconcile(ss)
		for ss.order.Len() > s.limits.maxQueued {
			s.shedMessage(ss.order.Front().Value.(*queued), shedClientCap)
		}
		if cl.Closed() {
			s.setOffline(ss)
		} else {
			s.setOnline(ss)
		}
		s.dropIfIdle(ss)
	}
	byDevice, total, budget := s.overCaps()
	s.mu.Unlock()
	s.end(byDevice, expiredDeviceCap)
	s.end(total, expiredSessionCap)
	s.end(budget, expiredBudget)
}

// reconcile makes a session's queued messages those mochi holds for its
// client. Mochi's in-flight map also holds the client's own QoS 1 flows (a
// PUBACK being sent), so a count that matches means nothing to add; only
// then is the whole map copied (GetAll copies every packet). Called with
// the lock held.
func (s *sessions) reconcile(ss *session) {
	for pid, q := range ss.byPID {
		if pk, ok := ss.cl.State.Inflight.Get(pid); !ok || pk.FixedHeader.Type != packets.Publish {
			s.remove(q)
		}
	}
	if ss.cl.State.Inflight.Len() == len(ss.byPID) {
		return
	}
	for _, pk := range ss.cl.State.Inflight.GetAll(false) {
		if _, ok := ss.byPID[pk.PacketID]; !ok && pk.FixedHeader.Type == packets.Publish {
			s.add(ss, pk.PacketID, messageBytes(pk))
		}
	}
}

// messageBytes is what one queued message holds.
func messageBytes(pk packets.Packet) int64 {
	return int64(len(pk.Payload)+len(pk.TopicName)) + messageOverhead
}

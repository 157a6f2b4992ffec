package broker

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
	"greenhouse-gateway/gateway/internal/listen"
)

// entries returns n admission entries from addr.
func entries(addr string, n int) []*admEntry {
	out := make([]*admEntry, n)
	for i := range out {
		out[i] = &admEntry{addr: netip.MustParseAddr(addr)}
	}
	return out
}

// requireShed checks that add(e) displaced exactly want, in order.
func requireShed(t *testing.T, a *mqttAdmission, e *admEntry, want ...displaced) {
	t.Helper()
	got := a.add(e)
	require.Len(t, got, len(want))
	for i := range want {
		require.Same(t, want[i].entry, got[i].entry, "shed #%d", i)
		require.Equal(t, want[i].reason, got[i].reason, "shed #%d", i)
		require.Nil(t, got[i].entry.group, "a shed entry is out of the admission")
	}
}

func TestMQTTAdmissionShedsTheOldestOverTheTotalCap(t *testing.T) {
	a := newMQTTAdmission(3, 0)
	e := append(append(entries("10.0.0.1", 2), entries("10.0.0.2", 2)...), entries("10.0.0.3", 2)...)
	for _, x := range e[:3] {
		requireShed(t, a, x)
	}
	requireShed(t, a, e[3], displaced{e[0], reasonShedTotal})
	requireShed(t, a, e[4], displaced{e[1], reasonShedTotal})
	require.True(t, a.remove(e[2]), "closed")
	requireShed(t, a, e[5]) // room again
	conns, addrs := a.counts()
	require.Equal(t, 3, conns)
	require.Equal(t, 2, addrs)
}

func TestMQTTAdmissionShedsSilentConnectionsBeforeConnectingOnes(t *testing.T) {
	a := newMQTTAdmission(3, 0)
	e := entries("10.0.0.1", 5)
	for _, x := range e[:3] {
		requireShed(t, a, x)
	}
	a.connecting(e[0]) // its CONNECT is being checked
	requireShed(t, a, e[3], displaced{e[1], reasonShedTotal})
	requireShed(t, a, e[4], displaced{e[2], reasonShedTotal})
	a.connecting(e[3])
	a.connecting(e[4])
	// Only connecting ones are left: the oldest of them goes.
	requireShed(t, a, &admEntry{addr: netip.MustParseAddr("10.0.0.1")}, displaced{e[0], reasonShedTotal})
}

func TestMQTTAdmissionShedsTheOldestOfTheAddressOverItsCap(t *testing.T) {
	a := newMQTTAdmission(100, 2)
	x, y := entries("10.0.0.1", 4), entries("10.0.0.2", 2)
	requireShed(t, a, x[0])
	requireShed(t, a, y[0])
	requireShed(t, a, x[1])
	requireShed(t, a, y[1])
	requireShed(t, a, x[2], displaced{x[0], reasonShedAddress})
	requireShed(t, a, x[3], displaced{x[1], reasonShedAddress})
	require.NotNil(t, y[0].group, "another address keeps its connections")
	conns, _ := a.counts()
	require.Equal(t, 4, conns)
}

func TestMQTTAdmissionAddressThenTotalCap(t *testing.T) {
	a := newMQTTAdmission(3, 2)
	x, y := entries("10.0.0.1", 3), entries("10.0.0.2", 2)
	requireShed(t, a, x[0])
	requireShed(t, a, x[1])
	requireShed(t, a, y[0])
	// Over the address cap: x's oldest goes, which also makes room overall.
	requireShed(t, a, x[2], displaced{x[0], reasonShedAddress})
	// Under y's cap, over the total: the oldest of all goes.
	requireShed(t, a, y[1], displaced{x[1], reasonShedTotal})
	// An address cap of one still admits the newcomer.
	b := newMQTTAdmission(1, 1)
	z := entries("10.0.0.3", 2)
	requireShed(t, b, z[0])
	requireShed(t, b, z[1], displaced{z[0], reasonShedAddress})
	conns, addrs := b.counts()
	require.Equal(t, 1, conns)
	require.Equal(t, 1, addrs)
}

// TestMQTTAdmissionGroupsIPv6By64 checks that the connections of one IPv6
// /64 (listen.SourceOf) share the cap of one address.
func TestMQTTAdmissionGroupsIPv6By64(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	a := newMQTTAdmission(100, 2)
	e := []*admEntry{
		{addr: listen.SourceOf(tcp("[2001:db8:1:2::1]:1"))},
		{addr: listen.SourceOf(tcp("[2001:db8:1:2::2]:1"))},
		{addr: listen.SourceOf(tcp("[2001:db8:1:3::1]:1"))},
		{addr: listen.SourceOf(tcp("[2001:db8:1:2:ffff::3]:1"))},
	}
	requireShed(t, a, e[0])
	requireShed(t, a, e[1])
	requireShed(t, a, e[2])
	requireShed(t, a, e[3], displaced{e[0], reasonShedAddress})
}

// TestMQTTAdmissionKeepsNothingOfClosedConnections adds, promotes, sheds and
// removes many connections of many addresses in random order and checks
// that the admission holds nothing afterwards.
func TestMQTTAdmissionKeepsNothingOfClosedConnections(t *testing.T) {
	a := newMQTTAdmission(500, 20)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []*admEntry
	shedCount := 0
	for i := range 20000 {
		e := &admEntry{addr: netip.MustParseAddr(fmt.Sprintf("10.0.%d.%d", rng.IntN(4), rng.IntN(50)))}
		shedCount += len(a.add(e))
		live = append(live, e)
		switch rng.IntN(4) {
		case 0:
			a.connecting(live[rng.IntN(len(live))])
		case 1:
			j := rng.IntN(len(live))
			a.remove(live[j])
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		if i%1000 == 0 {
			conns, _ := a.counts()
			require.LessOrEqual(t, conns, 500)
		}
	}
	require.Positive(t, shedCount)
	for _, e := range live {
		a.remove(e)
		require.False(t, a.remove(e), "removed once")
	}
	conns, addrs := a.counts()
	require.Zero(t, conns)
	require.Zero(t, addrs)
	require.Empty(t, a.groups)
	for k := range tierCount {
		require.Nil(t, a.all[k].head)
		require.Nil(t, a.all[k].tail)
	}
}

func TestSessionSlotsPerDevice(t *testing.T) {
	s := newSessionSlots(2, 100, 100)
	r1, over := s.acquire("HW", "HW", "k1")
	require.Nil(t, over)
	r2, over := s.acquire("HW", "HW-1", "k1")
	require.Nil(t, over)
	_, over = s.acquire("HW", "HW-2", "k1")
	require.Equal(t, &slotRefusal{reasonDeviceSessions, "mqtt.max_sessions_per_device", 2}, over)
	_, over = s.acquire("HW2", "HW2", "k1")
	require.Nil(t, over, "another device has its own slots")

	// A takeover of HW-1 holds the same slot: never refused, not counted
	// twice.
	r3, over := s.acquire("HW", "HW-1", "k1")
	require.Nil(t, over)
	r2() // the connection taken over closes
	r2() // releasing twice releases once
	_, over = s.acquire("HW", "HW-2", "k1")
	require.NotNil(t, over, "HW-1 is still connected")
	r3()
	r4, over := s.acquire("HW", "HW-2", "k1")
	require.Nil(t, over)
	r1()
	r4()
	clients, devices, _ := s.counts()
	require.Equal(t, 1, devices, "HW2 only")
	require.EqualValues(t, 1, clients)
}

func TestSessionSlotsMaxClients(t *testing.T) {
	s := newSessionSlots(0, 2, 100)
	ra, over := s.acquire("A", "A", "k1")
	require.Nil(t, over)
	rb, over := s.acquire("B", "B", "k2")
	require.Nil(t, over)
	_, over = s.acquire("C", "C", "k3")
	require.Equal(t, &slotRefusal{reasonMaxClients, "mqtt.max_clients", 2}, over)
	require.Equal(t, packets.ErrServerBusy, over.code())
	rb2, over := s.acquire("B", "B", "k2")
	require.Nil(t, over, "a takeover on a full broker")
	clients, _, _ := s.counts()
	require.EqualValues(t, 2, clients, "not counted twice")
	rb()
	_, over = s.acquire("C", "C", "k3")
	require.NotNil(t, over, "B is still connected")
	rb2()
	rc, over := s.acquire("C", "C", "k3")
	require.Nil(t, over)
	ra()
	rc()
	clients, devices, keys := s.counts()
	require.Zero(t, clients)
	require.Zero(t, devices)
	require.Zero(t, keys)
}

func TestSessionSlotsPerKey(t *testing.T) {
	s := newSessionSlots(0, 10, 50) // 5 per key
	var release []func()
	for i := range 5 {
		r, over := s.acquire(fmt.Sprintf("HW%d", i), fmt.Sprintf("HW%d", i), "k1")
		require.Nil(t, over)
		release = append(release, r)
	}
	_, over := s.acquire("HW5", "HW5", "k1")
	require.Equal(t, &slotRefusal{reasonKeyShare, "mqtt.max_clients_per_key_percent", 5}, over)
	require.Equal(t, packets.ErrQuotaExceeded, over.code())
	r, over := s.acquire("HW5", "HW5", "k2")
	require.Nil(t, over, "another key has its own share")
	release = append(release, r)
	r, over = s.acquire("HW0", "HW0", "k1")
	require.Nil(t, over, "a takeover within the key's share")
	release = append(release, r)
	r, over = s.acquire("HW6", "HW6", "")
	require.Nil(t, over, "a key without an ID is not counted per key")
	release = append(release, r)
	for _, r := range release {
		r()
	}
	clients, devices, keys := s.counts()
	require.Zero(t, clients)
	require.Zero(t, devices)
	require.Zero(t, keys)

	require.Equal(t, 1, newSessionSlots(0, 1, 90).perKey, "at least one")
	require.Zero(t, newSessionSlots(0, 10, 100).perKey, "100%: max_clients alone")
}

func TestSessionSlotsLogRefusalsAtMostOncePerInterval(t *testing.T) {
	s := newSessionSlots(1, 10, 100)
	t0 := time.Now()
	log, suppressed := s.logRefusal(reasonDeviceSessions, t0)
	require.True(t, log)
	require.Zero(t, suppressed)
	for i := range 3 {
		log, _ = s.logRefusal(reasonDeviceSessions, t0.Add(time.Duration(i+1)*time.Second))
		require.False(t, log)
	}
	log, _ = s.logRefusal(reasonKeyShare, t0.Add(time.Second))
	require.True(t, log, "each reason has its own interval")
	log, suppressed = s.logRefusal(reasonDeviceSessions, t0.Add(refusalLogInterval))
	require.True(t, log)
	require.Equal(t, 3, suppressed)
}

package broker

import (
	"net"
	"net/netip"
	"sync"
)

// Admission of MQTT connections before they authenticate.
//
// A connection is unauthenticated from accept until OnConnect accepts its
// credentials. Unauthenticated connections are capped in total and per
// source address (an IPv4 address, an IPv6 /64). A new connection over a
// cap does not wait and is not refused: the oldest unauthenticated
// connection of the address (for the address cap) or of all (for the
// total cap) is shed instead, so that sockets that send nothing cannot
// starve a device that sends its CONNECT at once. Connections that have
// not delivered a whole CONNECT are shed before those whose CONNECT is
// being checked, oldest first within each.

// Admission tiers, in the order they are shed.
const (
	tierSilent     = iota // no whole CONNECT yet
	tierConnecting        // CONNECT received, credentials being checked
	tierCount
)

// Which list of an entry a link belongs to.
const (
	linkAll  = iota // every unauthenticated connection
	linkAddr        // the connections of one source address
	linkCount
)

// Reasons a connection is shed, label values of
// gateway_mqtt_connections_refused_total.
const (
	reasonShedTotal   = "shed_total_cap"
	reasonShedAddress = "shed_address_cap"
)

// admEntry is one unauthenticated connection, linked in two lists.
type admEntry struct {
	conn  net.Conn // closed when the connection is shed
	addr  netip.Addr
	tier  int
	group *admGroup // nil once the entry left the admission
	links [linkCount]struct{ prev, next *admEntry }
}

// admList is an intrusive doubly linked list, oldest first, over one of
// the links of its entries.
type admList struct {
	head, tail *admEntry
	n          int
}

func (l *admList) push(e *admEntry, k int) {
	e.links[k].prev, e.links[k].next = l.tail, nil
	if l.tail != nil {
		l.tail.links[k].next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.n++
}

func (l *admList) remove(e *admEntry, k int) {
	prev, next := e.links[k].prev, e.links[k].next
	if prev != nil {
		prev.links[k].next = next
	} else {
		l.head = next
	}
	if next != nil {
		next.links[k].prev = prev
	} else {
		l.tail = prev
	}
	e.links[k].prev, e.links[k].next = nil, nil
	l.n--
}

// admTiers holds one scope's entries by tier.
type admTiers [tierCount]admList

func (t *admTiers) len() int { return t[tierSilent].n + t[tierConnecting].n }

// oldest returns the entry to shed first, or nil.
func (t *admTiers) oldest() *admEntry {
	if t[tierSilent].head != nil {
		return t[tierSilent].head
	}
	return t[tierConnecting].head
}

// admGroup is the unauthenticated connections of one source address.
type admGroup struct{ tiers admTiers }

// mqttAdmission tracks unauthenticated MQTT connections. Every operation is O(1):
// a map lookup and list links.
type mqttAdmission struct {
	maxTotal, maxPerAddr int

	mu     sync.Mutex
	all    admTiers
	groups map[netip.Addr]*admGroup
}

func newMQTTAdmission(maxTotal, maxPerAddr int) *mqttAdmission {
	return &mqttAdmission{maxTotal: maxTotal, maxPerAddr: maxPerAddr, groups: map[netip.Addr]*admGroup{}}
}

// displaced is a connection taken out of the admission to make room, and why.
type displaced struct {
	entry  *admEntry
	reason string
}

// add admits e and returns the entries it displaces (at most two: one for
// the address cap, one for the total cap), already out of the admission;
// the caller closes their connections.
func (a *mqttAdmission) add(e *admEntry) []displaced {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []displaced
	g := a.groups[e.addr]
	if g == nil {
		g = &admGroup{}
		a.groups[e.addr] = g
	}
	if a.maxPerAddr > 0 && g.tiers.len() >= a.maxPerAddr {
		v := g.tiers.oldest()
		a.removeLocked(v)
		out = append(out, displaced{v, reasonShedAddress})
	}
	if a.maxTotal > 0 && a.all.len() >= a.maxTotal {
		v := a.all.oldest()
		a.removeLocked(v)
		out = append(out, displaced{v, reasonShedTotal})
	}
	a.groups[e.addr] = g // a shed above may have emptied and dropped it
	e.tier, e.group = tierSilent, g
	a.all[tierSilent].push(e, linkAll)
	g.tiers[tierSilent].push(e, linkAddr)
	return out
}

// connecting moves e behind the connections that have sent nothing whole:
// its CONNECT was received.
func (a *mqttAdmission) connecting(e *admEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e.group == nil || e.tier == tierConnecting {
		return
	}
	a.all[e.tier].remove(e, linkAll)
	e.group.tiers[e.tier].remove(e, linkAddr)
	e.tier = tierConnecting
	a.all[e.tier].push(e, linkAll)
	e.group.tiers[e.tier].push(e, linkAddr)
}

// remove takes e out of the admission (it authenticated or closed) and
// reports whether it was still in (false: it was shed, or removed before).
func (a *mqttAdmission) remove(e *admEntry) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e.group == nil {
		return false
	}
	a.removeLocked(e)
	return true
}

func (a *mqttAdmission) removeLocked(e *admEntry) {
	a.all[e.tier].remove(e, linkAll)
	e.group.tiers[e.tier].remove(e, linkAddr)
	if e.group.tiers.len() == 0 {
		delete(a.groups, e.addr)
	}
	e.group = nil
}

// counts returns the unauthenticated connections and the source addresses
// they come from.
func (a *mqttAdmission) counts() (conns, addrs int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.all.len(), len(a.groups)
}

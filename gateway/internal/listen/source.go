package listen

import (
	"net"
	"net/netip"
)

// SourceOf groups a remote address: an IPv4 address is its own group, an
// IPv6 address belongs to its /64 (one host, or one LAN, usually holds a
// whole /64).
func SourceOf(addr net.Addr) netip.Addr {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip := tcp.AddrPort().Addr().Unmap()
	if ip.Is6() {
		return netip.PrefixFrom(ip.WithZone(""), 64).Masked().Addr()
	}
	return ip
}

package listen

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSourceOfGroupsIPv6By64(t *testing.T) {
	src := func(s string) netip.Addr {
		return SourceOf(net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)))
	}
	require.Equal(t, src("[2001:db8:1:2::1]:1"), src("[2001:db8:1:2:ffff:ee:dd:9]:2"), "one /64")
	require.NotEqual(t, src("[2001:db8:1:2::1]:1"), src("[2001:db8:1:3::1]:1"), "another /64")
	require.Equal(t, netip.MustParseAddr("2001:db8:1:2::"), src("[2001:db8:1:2::1%eth0]:1"))
	require.Equal(t, netip.MustParseAddr("10.0.0.1"), src("[::ffff:10.0.0.1]:1"), "IPv4-mapped is IPv4")
	require.NotEqual(t, src("10.0.0.1:1"), src("10.0.0.2:1"), "each IPv4 address is its own source")
}

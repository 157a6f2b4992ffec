package devicesim

import (
	"fmt"
	"strconv"
	"strings"
)

// maxMAC is FF:FF:FF:FF:FF:FF as a number.
const maxMAC = 1<<48 - 1

// parseMAC parses a MAC address written as six colon-separated pairs of hex digits, in either
// case, into its 48-bit value.
func parseMAC(s string) (uint64, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 6 {
		return 0, fmt.Errorf("%q is not a MAC address like 02:00:00:00:00:01", s)
	}
	var v uint64
	for _, p := range parts {
		if len(p) != 2 {
			return 0, fmt.Errorf("%q is not a MAC address like 02:00:00:00:00:01", s)
		}
		b, err := strconv.ParseUint(p, 16, 8)
		if err != nil {
			return 0, fmt.Errorf("%q is not a MAC address like 02:00:00:00:00:01", s)
		}
		v = v<<8 | b
	}
	return v, nil
}

// formatMAC writes a 48-bit value as an upper-case hardware_id.
func formatMAC(v uint64) string {
	var b strings.Builder
	for i := 5; i >= 0; i-- {
		fmt.Fprintf(&b, "%02X", (v>>(8*i))&0xFF)
		if i > 0 {
			b.WriteByte(':')
		}
	}
	return b.String()
}

// hardwareIDs returns n consecutive upper-case hardware ids starting at first.
func hardwareIDs(first string, n int) ([]string, error) {
	v, err := parseMAC(first)
	if err != nil {
		return nil, err
	}
	if n < 0 || uint64(n) > maxMAC-v+1 {
		return nil, fmt.Errorf("%d devices from %s overflow the MAC address space", n, first)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = formatMAC(v + uint64(i))
	}
	return ids, nil
}

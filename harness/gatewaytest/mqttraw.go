package gatewaytest

import (
	"encoding/binary"
	"io"
	"net"
	"time"
)

// Raw MQTT packets, for the tests that write to the broker's socket what
// no client library sends.

// MQTTString encodes s as an MQTT string: its length, then its bytes.
func MQTTString(s string) []byte {
	b := make([]byte, 2, 2+len(s))
	binary.BigEndian.PutUint16(b, uint16(len(s)))
	return append(b, s...)
}

// MQTTVarint encodes n as an MQTT variable byte integer.
func MQTTVarint(n int) []byte {
	var out []byte
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		out = append(out, d)
		if n == 0 {
			return out
		}
	}
}

// MQTTPacket frames a packet: the first header byte, the remaining length
// and the body.
func MQTTPacket(first byte, body []byte) []byte {
	return append(append([]byte{first}, MQTTVarint(len(body))...), body...)
}

// ConnectPacket is a CONNECT with username, password and clean session,
// keepalive 60s, of protocol version 4 (MQTT 3.1.1) or 5.
func ConnectPacket(version byte, clientID, user, pass string) []byte {
	body := append(MQTTString("MQTT"), version, 0xC2, 0, 60)
	if version == 5 {
		body = append(body, 0) // no properties
	}
	body = append(body, MQTTString(clientID)...)
	body = append(body, MQTTString(user)...)
	body = append(body, MQTTString(pass)...)
	return MQTTPacket(0x10, body)
}

// ReadPacket reads one packet the broker sent.
func ReadPacket(c net.Conn, within time.Duration) (byte, []byte, error) {
	if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
		return 0, nil, err
	}
	var one [1]byte
	if _, err := io.ReadFull(c, one[:]); err != nil {
		return 0, nil, err
	}
	first := one[0]
	n, shift := 0, 0
	for i := 0; i < 4; i++ {
		if _, err := io.ReadFull(c, one[:]); err != nil {
			return 0, nil, err
		}
		n |= int(one[0]&0x7f) << shift
		shift += 7
		if one[0]&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	_, err := io.ReadFull(c, body)
	return first, body, err
}

package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// receiveMaximum is the broker's MQTT 5 Receive Maximum: the QoS 1 and 2
// messages a client may have unanswered at once. A QoS 1 message holds a
// slot until its commit answers it (at most maxDeferredPerConn of them
// wait, mqttpipe.go); a QoS 2 message holds its slot (a packet of about
// 800 bytes in mochi's in-flight map) from its PUBREC until the client's
// PUBREL. 16 slots bound the QoS 2 state of one client to about 13 KiB (a
// resumed session does not keep it: conformHook.OnSessionEstablish). A
// client that exceeds them is disconnected (DISCONNECT 0x93 in MQTT 5),
// resends after reconnecting and is answered duplicate.
const receiveMaximum = 16

// Reasons in gateway_mqtt_connections_refused_total for the rules of this
// file.
const (
	refusedMalformed     = "malformed"
	refusedProtocolError = "protocol_error"
	refusedAuthMethod    = "bad_auth_method"
)

// MQTT 5 property identifiers checked in CONNECT.
const (
	propPayloadFormat       = 0x01
	propResponseTopic       = 0x08
	propAuthMethod          = 0x15
	propAuthData            = 0x16
	propRequestProblemInfo  = 0x17
	propRequestResponseInfo = 0x19
	propReceiveMaximum      = 0x21
	propUser                = 0x26
	propMaximumPacketSize   = 0x27
)

// errAuthWithoutMethod answers an AUTH packet: the gateway does no enhanced
// authentication, so no CONNECT it accepted carried an Authentication
// Method, and an AUTH packet is a protocol error (MQTT 5, 4.12).
var errAuthWithoutMethod = packets.Code{Code: packets.ErrProtocolViolation.Code,
	Reason: "protocol violation: AUTH without an authentication method in CONNECT"}

// violation is a rule of MQTT that a CONNECT packet breaks and that mochi
// does not check: code is the CONNACK reason code (MQTT 5) and rule says
// which rule, for the log.
type violation struct {
	code packets.Code
	rule string
}

// protocolError is a violation answered with 0x82 (protocol error); the
// rule is the CONNACK's reason string too.
func protocolError(format string, args ...any) *violation {
	rule := fmt.Sprintf(format, args...)
	return &violation{code: packets.Code{Code: packets.ErrProtocolViolation.Code, Reason: "protocol violation: " + rule},
		rule: rule}
}

// checkConnect checks the body of a CONNECT packet (after its fixed header)
// for the rules mochi's decoder skips: in MQTT 5, properties given twice,
// Receive Maximum or Maximum Packet Size of 0, request flags other than 0
// and 1, Authentication Data without a method, a will's Payload Format
// Indicator other than 0 and 1, a will declared UTF-8 that is not, a will's
// Response Topic with wildcards, and an Authentication Method (enhanced
// authentication, which the gateway does not offer: 0x8C); in every
// version, a Will QoS without the Will Flag. It reads the raw bytes because
// mochi's decoded packet keeps neither repeated properties nor whether a
// property of value 0 was present. A packet it cannot parse is left to
// mochi's decoder, which refuses it.
func checkConnect(body []byte) *violation {
	r := &rawReader{b: body}
	r.bytes() // protocol name
	version := r.byte()
	flags := r.byte()
	r.uint16() // keepalive
	if r.failed {
		return nil
	}
	willFlag := flags&0x04 != 0
	if !willFlag && flags&0x18 != 0 {
		return protocolError("Will QoS %d without the Will Flag", flags>>3&3)
	}
	if version != 5 {
		return nil
	}
	props, ok := r.properties()
	if !ok {
		return nil
	}
	if v := props.connectRules(); v != nil {
		return v
	}
	r.bytes() // client identifier
	if willFlag {
		if v := r.will(); v != nil {
			return v
		}
	}
	if props.seen(propAuthMethod) {
		return &violation{code: packets.ErrBadAuthenticationMethod,
			rule: "Authentication Method in CONNECT: the gateway does no enhanced authentication"}
	}
	return nil
}

// will checks a CONNECT's will properties, topic and payload.
func (r *rawReader) will() *violation {
	props, ok := r.properties()
	if !ok {
		return nil
	}
	if v := props.repeated(); v != nil {
		return v
	}
	format, hasFormat := props.values[propPayloadFormat]
	if hasFormat && format > 1 {
		return protocolError("will Payload Format Indicator %d (only 0 and 1 exist)", format)
	}
	if props.responseTopicWildcard {
		return protocolError("will Response Topic with a wildcard")
	}
	r.bytes() // will topic
	payload := r.bytes()
	if !r.failed && format == 1 && !utf8.Valid(payload) {
		return &violation{code: packets.ErrPayloadFormatInvalid, rule: "will payload declared UTF-8 is not"}
	}
	return nil
}

// rawProperties records what the properties of one packet held.
type rawProperties struct {
	count                 [256]uint16
	values                map[byte]uint32 // numeric properties, the last value
	responseTopicWildcard bool
}

func (p *rawProperties) seen(id byte) bool { return p.count[id] > 0 }

// repeated reports a property other than User Property given twice
// (MQTT 5, 3.1.2.11 and 3.1.3.2).
func (p *rawProperties) repeated() *violation {
	for id, n := range p.count {
		if n > 1 && id != propUser {
			return protocolError("property 0x%02X given %d times", id, n)
		}
	}
	return nil
}

// connectRules checks the CONNECT properties (MQTT 5, 3.1.2.11).
func (p *rawProperties) connectRules() *violation {
	if v := p.repeated(); v != nil {
		return v
	}
	if v, ok := p.values[propReceiveMaximum]; ok && v == 0 {
		return protocolError("Receive Maximum of 0")
	}
	if v, ok := p.values[propMaximumPacketSize]; ok && v == 0 {
		return protocolError("Maximum Packet Size of 0")
	}
	for _, id := range []byte{propRequestProblemInfo, propRequestResponseInfo} {
		if v, ok := p.values[id]; ok && v > 1 {
			return protocolError("property 0x%02X of %d (only 0 and 1 exist)", id, v)
		}
	}
	if p.seen(propAuthData) && !p.seen(propAuthMethod) {
		return protocolError("Authentication Data without an Authentication Method")
	}
	return nil
}

// rawReader reads MQTT data types from a packet body; after the first
// short read every read returns zero values and failed is set.
type rawReader struct {
	b      []byte
	failed bool
}

func (r *rawReader) take(n int) []byte {
	if r.failed || n < 0 || len(r.b) < n {
		r.failed = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *rawReader) byte() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *rawReader) uint16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *rawReader) uint32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

// bytes reads binary data or a string: a 2-byte length, then the bytes.
func (r *rawReader) bytes() []byte { return r.take(int(r.uint16())) }

func (r *rawReader) varint() int {
	n := 0
	for i := range 4 {
		b := r.byte()
		n |= int(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			return n
		}
	}
	r.failed = true
	return 0
}

// properties reads a property list. ok is false when it does not parse
// (an unknown identifier, a short read).
func (r *rawReader) properties() (p *rawProperties, ok bool) {
	n := r.varint()
	list := &rawReader{b: r.take(n)}
	if r.failed {
		return nil, false
	}
	p = &rawProperties{values: map[byte]uint32{}}
	for len(list.b) > 0 {
		id := list.byte()
		p.count[id]++
		switch id {
		case 0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A:
			p.values[id] = uint32(list.byte())
		case 0x13, 0x21, 0x22, 0x23:
			p.values[id] = uint32(list.uint16())
		case 0x02, 0x11, 0x18, 0x27:
			p.values[id] = list.uint32()
		case 0x0B:
			list.varint()
		case 0x03, 0x12, 0x15, 0x1A, 0x1C, 0x1F, 0x09, 0x16:
			list.bytes()
		case propResponseTopic:
			p.responseTopicWildcard = p.responseTopicWildcard || strings.ContainsAny(string(list.bytes()), "+#")
		case propUser:
			list.bytes()
			list.bytes()
		default:
			return nil, false
		}
		if list.failed {
			return nil, false
		}
	}
	return p, true
}

// anAuth is an MQTT 5 AUTH packet: reason code 0x00, no properties.
var anAuth = []byte{packets.Auth << 4, 2, packets.CodeSuccess.Code, 0}

// conform returns what the guard hands mochi in place of a packet, of type
// typ, of an MQTT 5 connection after CONNECT, or nil for the packet itself.
// It replaces two kinds of packets with anAuth, which mochi decodes and
// conformHook.OnAuthPacket answers with a DISCONNECT before mochi closes
// the connection (MQTT 5, 4.13):
//
//   - an AUTH packet, whatever its content (mochi's decoder refuses some
//     valid ones, such as the AUTH of remaining length 0): the DISCONNECT
//     carries 0x82, since no CONNECT the gateway accepts starts enhanced
//     authentication;
//   - another packet mochi does not decode (decodeErr, from its fixed
//     header or body): mochi would close the connection without a word;
//     the DISCONNECT carries decodeErr's reason code (0x81 malformed
//     packet, 0x82 protocol error).
//
// MQTT 3.1.1 has no DISCONNECT from the server: there mochi closes the
// connection.
func (c *guardConn) conform(typ byte, decodeErr error) []byte {
	if c.version != 5 {
		return nil
	}
	if typ == packets.Auth {
		return anAuth
	}
	var code packets.Code
	if errors.As(decodeErr, &code) && code.Code >= packets.ErrUnspecifiedError.Code {
		code.Reason = truncateString(decodeErr.Error(), 128)
		c.disconnect = &code
		return anAuth
	}
	return nil
}

// takeDisconnect returns the reason code conform noted for the packet it
// replaced, if any.
func (c *guardConn) takeDisconnect() *packets.Code {
	code := c.disconnect
	c.disconnect = nil
	return code
}

// noteConnect checks the connection's CONNECT packet (fh and body): it
// records the rule checkConnect finds, for conformHook.OnConnect to
// answer, and counts and logs a CONNECT that mochi refuses itself before
// any hook runs (one it does not decode: malformed; one that fails its
// validation, answered with CONNACK 0x82: protocol_error).
func (c *guardConn) noteConnect(fh packets.FixedHeader, body []byte) {
	pk := packets.Packet{FixedHeader: fh}
	reason, rule := "", ""
	if err := pk.ConnectDecode(body); err != nil {
		reason, rule = refusedMalformed, err.Error()
	} else if code := pk.ConnectValidate(); code != packets.CodeSuccess {
		reason, rule = refusedProtocolError, code.Reason
	} else {
		c.connectRule = checkConnect(body)
		return
	}
	c.l.refused(reason)
	c.l.logger.Warn("MQTT CONNECT refused", "reason", reason, "rule", rule, "remote", c.RemoteAddr().String(),
		"protocol_version", pk.ProtocolVersion)
}

// connectViolation is the rule the connection's CONNECT broke, if any.
func (c *guardConn) connectViolation() *violation { return c.connectRule }

// conformHook answers the protocol errors mochi lets pass with the reason
// codes MQTT specifies, and counts them.
type conformHook struct {
	mqtt.HookBase
	b *Broker
}

func (h *conformHook) ID() string { return "conformance" }

func (h *conformHook) Provides(b byte) bool {
	switch b {
	case mqtt.OnConnect, mqtt.OnSessionEstablish, mqtt.OnAuthPacket, mqtt.OnPacketEncode, mqtt.OnDisconnect:
		return true
	}
	return false
}

// OnConnect refuses a CONNECT that broke a rule checkConnect found: in
// MQTT 5 with a CONNACK of the rule's reason code, in 3.1.1 by closing the
// connection without a CONNACK (MQTT 3.1.1, [MQTT-3.1.4-1]). It runs before
// the gateway's authentication.
func (h *conformHook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	gc, ok := cl.Net.Conn.(interface{ connectViolation() *violation })
	if !ok {
		return nil
	}
	v := gc.connectViolation()
	if v == nil {
		return nil
	}
	reason := refusedProtocolError
	if v.code.Code == packets.ErrBadAuthenticationMethod.Code {
		reason = refusedAuthMethod
	}
	h.b.refused.WithLabelValues(reason).Inc()
	h.b.logger.Warn("MQTT CONNECT refused", "reason", reason, "rule", v.rule, "code", fmt.Sprintf("0x%02X", v.code.Code),
		"remote", cl.Net.Remote, "client_id", truncateString(cl.ID, 128), "protocol_version", cl.Properties.ProtocolVersion)
	if cl.Properties.ProtocolVersion < 5 {
		return v.code
	}
	if err := h.b.server.SendConnack(cl, v.code, false, nil); err != nil {
		return fmt.Errorf("refusing %s: %w", cl.ID, err)
	}
	return v.code
}

// OnSessionEstablish drops the QoS 2 messages awaiting their PUBREL from
// the session a client resumes (clean session 0), before mochi hands them
// to the new connection. mochi gives each connection a full Receive Maximum
// of its own besides the states it inherits, so a client that reconnects
// without sending PUBREL could pile up one state (about 800 bytes) per
// packet identifier. Nothing is lost: the batch of such a message is
// stored already; a PUBREL for it is answered with PUBCOMP (MQTT 5: reason
// 0x92, packet identifier not found), and a retransmitted PUBLISH is
// handled again and answered duplicate, with its PUBREC.
func (h *conformHook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	existing, ok := h.b.server.Clients.Get(cl.ID)
	if !ok {
		return
	}
	for _, p := range existing.State.Inflight.GetAll(false) {
		if p.FixedHeader.Type == packets.Pubrec && existing.State.Inflight.Delete(p.PacketID) {
			atomic.AddInt64(&h.b.server.Info.Inflight, -1) // as mochi counts its in-flight messages
		}
	}
}

// OnAuthPacket ends the connection of a client that sends AUTH, or a
// packet the guard replaced with one (guardConn.conform): mochi then sends
// an MQTT 5 client DISCONNECT with the code (0x82 for an AUTH), and closes
// a 3.1.1 connection, where the packet type is reserved.
func (h *conformHook) OnAuthPacket(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if gc, ok := cl.Net.Conn.(interface{ takeDisconnect() *packets.Code }); ok {
		if code := gc.takeDisconnect(); code != nil {
			return pk, *code
		}
	}
	return pk, errAuthWithoutMethod
}

// OnPacketEncode answers a PUBLISH that repeats the packet identifier of a
// QoS 2 message awaiting its PUBREL with a PUBREC of success, as MQTT
// requires ([MQTT-4.3.3-10]; MQTT 5, 4.3.3): the message is not handled
// again. mochi sends that PUBREC, and only that one, with 0x91 (packet
// identifier in use), which an MQTT 5 client takes for a refusal of a
// message that was stored.
func (h *conformHook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Pubrec && pk.ReasonCode == packets.ErrPacketIdentifierInUse.Code {
		pk.ReasonCode = packets.CodeSuccess.Code
		pk.Properties.ReasonString = ""
	}
	return pk
}

// OnDisconnect counts and logs a connection mochi ended for a protocol
// error after CONNECT: a malformed packet (malformed), a protocol error (an
// AUTH packet, a second CONNECT, ...), more unanswered QoS messages than
// the Receive Maximum, an invalid topic alias (protocol_error).
func (h *conformHook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	var code packets.Code
	if !errors.As(err, &code) {
		return
	}
	reason := refusedProtocolError
	switch code.Code {
	case packets.ErrMalformedPacket.Code:
		reason = refusedMalformed
	case packets.ErrProtocolViolation.Code, packets.ErrReceiveMaximum.Code, packets.ErrTopicAliasInvalid.Code:
	default:
		return
	}
	h.b.refused.WithLabelValues(reason).Inc()
	h.b.logger.Warn("MQTT client disconnected for a protocol error", "reason", reason,
		"rule", code.Reason, "code", fmt.Sprintf("0x%02X", code.Code), "remote", cl.Net.Remote,
		"client_id", truncateString(cl.ID, 128), "protocol_version", cl.Properties.ProtocolVersion)
}

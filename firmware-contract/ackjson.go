package contract

// AppendAck appends the JSON encoding of a to dst: the same bytes as
// encoding/json.Marshal(a) (see [Ack.MarshalJSON]), written without
// reflection, for the one ack the gateway publishes per message.
func AppendAck(dst []byte, a Ack) []byte {
	dst = append(dst, `{"type":`...)
	dst = AppendJSONString(dst, a.Type)
	if a.Type == AckTypeRegister {
		dst = append(dst, `,"status":`...)
		dst = AppendJSONString(dst, string(a.Status))
		if a.Reason != nil {
			dst = append(dst, `,"reason":`...)
			dst = AppendJSONString(dst, string(*a.Reason))
		}
		if a.Message != nil {
			dst = append(dst, `,"message":`...)
			dst = AppendJSONString(dst, *a.Message)
		}
		if a.ConfirmationID != "" {
			dst = append(dst, `,"confirmation_id":`...)
			dst = AppendJSONString(dst, a.ConfirmationID)
		}
		if a.DeviceKey != "" {
			dst = append(dst, `,"device_key":`...)
			dst = AppendJSONString(dst, a.DeviceKey)
		}
		if a.DeviceKeyID != "" {
			dst = append(dst, `,"device_key_id":`...)
			dst = AppendJSONString(dst, a.DeviceKeyID)
		}
		return append(dst, '}')
	}
	dst = append(dst, `,"batch_id":`...)
	dst = AppendJSONString(dst, a.BatchID)
	dst = append(dst, `,"status":`...)
	dst = AppendJSONString(dst, string(a.Status))
	dst = append(dst, `,"reason":`...)
	if a.Reason != nil {
		dst = AppendJSONString(dst, string(*a.Reason))
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"message":`...)
	if a.Message != nil {
		dst = AppendJSONString(dst, *a.Message)
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, '}')
}

// ackSize is the length of a readings ack without its strings.
const ackSize = len(`{"type":"","batch_id":"","status":"","reason":null,"message":null}`)

// EncodeAck returns AppendAck(nil, a) in a buffer of the right size.
func EncodeAck(a Ack) []byte {
	n := ackSize + len(a.Type) + len(a.BatchID) + len(a.Status) + len(a.ConfirmationID) + len(`,"confirmation_id":""`) +
		len(a.DeviceKey) + len(a.DeviceKeyID) + len(`,"device_key":"","device_key_id":""`)
	if a.Reason != nil {
		n += len(*a.Reason)
	}
	if a.Message != nil {
		n += len(*a.Message) + 16 // a few escapes
	}
	return AppendAck(make([]byte, 0, n), a)
}

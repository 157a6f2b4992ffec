package contract

import (
	"errors"
	"strconv"
)

// Reason says why the gateway rejected a message. It is the "reason" of an
// ack or of a POST /v1/readings result.
type Reason string

// Reasons, as in the contract.
const (
	// ReasonValidation: the payload breaks a rule. Firmware must fix it and
	// not resend it as is.
	ReasonValidation Reason = "validation_error"
	// ReasonClockNotSynced: timestamps before 2000-01-01 that the gateway
	// cannot repair. Firmware resends after NTP sync or with uptime fields.
	ReasonClockNotSynced Reason = "clock_not_synced"
	// ReasonConflict: the batch_id was already stored with other content.
	ReasonConflict Reason = "conflict"
	// ReasonTimestampConflict: under the reject_older ordering rule
	// (ingest.ordering), a batch that starts before the newest reading
	// already accepted from the device.
	ReasonTimestampConflict Reason = "timestamp_conflict"
	// ReasonUnknownDevice: readings before any registration, when the
	// gateway requires registration.
	ReasonUnknownDevice Reason = "unknown_device"
	// ReasonBufferFull: nothing was stored; retry later.
	ReasonBufferFull Reason = "buffer_full"
	// ReasonForbidden: the API key may not act for this hardware_id (a
	// device key bound to another device).
	ReasonForbidden Reason = "forbidden"
	// ReasonDeviceKeyRequired: the device holds its own device key, or the
	// gateway requires one (auth.device_keys), and the message came with a
	// fleet key. Firmware sends it with its device key.
	ReasonDeviceKeyRequired Reason = "device_key_required"
)

// Retryable reports whether a message rejected for r may succeed when resent
// unchanged later.
func (r Reason) Retryable() bool {
	return r == ReasonBufferFull || r == ReasonUnknownDevice
}

// Error is a rejection: the reason for the ack, the JSON path of the
// offending value, and the rule it breaks.
type Error struct {
	// Reason is the ack reason, ReasonValidation unless stated otherwise.
	Reason Reason
	// Field is the JSON path of the offending value, such as
	// "readings[2].sensors.temp_c", or empty when the error is about the
	// payload as a whole (invalid JSON, not an object).
	Field string
	// Rule says what is wrong, as a sentence fragment that follows the
	// field: "must be a finite number".
	Rule string
	// BatchID is the batch_id of the rejected batch when the payload had a
	// string batch_id, so the ack can name it; empty otherwise.
	BatchID string
}

// NewError returns an *Error; the ingest path uses it for the reasons it
// decides itself (conflict, unknown_device, buffer_full).
func NewError(reason Reason, field, rule string) *Error {
	return &Error{Reason: reason, Field: field, Rule: rule}
}

// Error returns "field: rule", or the rule alone when Field is empty.
func (e *Error) Error() string {
	if e.Field == "" {
		return e.Rule
	}
	return e.Field + ": " + e.Rule
}

// AsError returns err as an *Error. Errors that are not an *Error become a
// validation_error with err's text as the rule; nil stays nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Reason: ReasonValidation, Rule: err.Error()}
}

func validationErr(field, rule string) *Error {
	return &Error{Reason: ReasonValidation, Field: field, Rule: rule}
}

// JSON paths are built only when an error is reported, from the parent path
// and the member name or array index.

// joinKey appends a member name to a JSON path: names made of [A-Za-z0-9_]
// use dot notation ("readings[2].sensors.temp_c"); others are written as
// ["..."] with JSON quoting so the path stays unambiguous.
func joinKey(prefix, key string) string {
	if simpleName(key) {
		if prefix == "" {
			return key
		}
		return prefix + "." + key
	}
	return prefix + "[" + quoteForPath(key) + "]"
}

// joinIndex appends an array index to a JSON path.
func joinIndex(prefix string, i int) string {
	return prefix + "[" + strconv.Itoa(i) + "]"
}

func simpleName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// quoteForPath quotes a member name for a path, shortened to keep messages
// readable.
func quoteForPath(s string) string {
	const maxShown = 80
	if len(s) > maxShown {
		cut := maxShown
		for cut > 0 && !isRuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "..."
	}
	return strconv.Quote(s)
}

func isRuneStart(c byte) bool { return c&0xC0 != 0x80 }

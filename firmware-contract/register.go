package contract

import (
	"fmt"
	"strings"
)

// DecodeRegistration decodes and validates a registration payload with the
// same strictness as [DecodeBatch]. When sender is not empty the
// registration's hardware_id must equal it. The error is always an *Error.
func DecodeRegistration(data []byte, sender string) (*Registration, error) {
	r, e := decodeRegistration(data, sender)
	if e != nil {
		return nil, e
	}
	return r, nil
}

func decodeRegistration(data []byte, sender string) (*Registration, *Error) {
	s := string(data)
	if _, e := checkSyntax(s); e != nil {
		return nil, e
	}
	i := skipWS(s, 0)
	if s[i] != '{' {
		return nil, validationErr("", "a registration must be a JSON object, not "+kindName(s, i))
	}
	d := decoder{s: s}
	reg := new(Registration)
	if e := d.registration(i, reg); e != nil {
		return nil, e
	}
	if e := reg.validate(sender); e != nil {
		return nil, e
	}
	return reg, nil
}

// Validate checks the value rules of a registration. The error is always an
// *Error.
func (r *Registration) Validate() error {
	if e := r.validate(""); e != nil {
		return e
	}
	return nil
}

func (r *Registration) validate(sender string) *Error {
	if e := identityErr(r.HardwareID, r.BootID, sender); e != nil {
		return e
	}
	if rule := firmwareVersionRule(r.FirmwareVersion); rule != "" {
		return validationErr("firmware_version", rule)
	}
	if r.FriendlyName != "" {
		if rule := friendlyNameRule(r.FriendlyName); rule != "" {
			return validationErr("friendly_name", rule)
		}
	}
	c := &r.Capabilities
	if len(c.Sensors) > MaxCapabilities {
		return validationErr("capabilities.sensors", fmt.Sprintf("must have at most %d entries", MaxCapabilities))
	}
	for k, name := range c.Sensors {
		if rule := nameRule(name, "sensor name"); rule != "" {
			return validationErr(joinIndex("capabilities.sensors", k), rule)
		}
		for j := 0; j < k; j++ { // at most 64 entries
			if c.Sensors[j] == name {
				return validationErr(joinIndex("capabilities.sensors", k), fmt.Sprintf("repeats capabilities.sensors[%d] (%s); sensor names must be unique", j, name))
			}
		}
	}
	if len(c.Features) > MaxCapabilities {
		return validationErr("capabilities.features", fmt.Sprintf("must have at most %d entries", MaxCapabilities))
	}
	var badKey, badRule string
	for name := range c.Features {
		if rule := nameRule(name, "feature name"); rule != "" && (badRule == "" || name < badKey) {
			badKey, badRule = name, rule
		}
	}
	if badRule != "" {
		return validationErr(joinKey("capabilities.features", badKey), badRule)
	}
	return nil
}

// Members of a registration, in the order they are decoded and checked.
const (
	gfHardwareID = iota
	gfBootID
	gfFirmwareVersion
	gfFriendlyName
	gfCapabilities
	numRegFields
)

var regFieldNames = [numRegFields]string{"hardware_id", "boot_id", "firmware_version", "friendly_name", "capabilities"}

func regField(k string) int {
	for f, name := range regFieldNames {
		if k == name {
			return f
		}
	}
	return -1
}

func (d *decoder) registration(i int, reg *Registration) *Error {
	s := d.s
	var at [numRegFields]int
	for {
		key, v, more := nextMember(s, i)
		if !more {
			break
		}
		f := regField(key)
		if f < 0 {
			return validationErr(joinKey("", key), "unknown field: a registration has only "+
				strings.Join(regFieldNames[:], ", ")+" (unknown fields are rejected so that nothing is silently dropped)")
		}
		if at[f] != 0 {
			return validationErr(joinKey("", key), "duplicate key")
		}
		at[f] = v + 1
		i = skipValue(s, v)
	}
	for f, a := range at {
		name := regFieldNames[f]
		if a == 0 {
			if f == gfFriendlyName {
				continue
			}
			return validationErr(name, "is required")
		}
		v := a - 1
		var e *Error
		switch f {
		case gfHardwareID:
			reg.HardwareID, e = d.str(v, name)
		case gfBootID:
			reg.BootID, e = d.str(v, name)
		case gfFirmwareVersion:
			reg.FirmwareVersion, e = d.str(v, name)
		case gfFriendlyName:
			if s[v] == 'n' {
				e = validationErr(name, nullRule)
			} else {
				reg.FriendlyName, e = d.str(v, name)
				if e == nil && reg.FriendlyName == "" {
					e = validationErr(name, friendlyNameRule(""))
				}
			}
		case gfCapabilities:
			e = d.capabilities(v, &reg.Capabilities)
		}
		if e != nil {
			return e
		}
	}
	return nil
}

func (d *decoder) capabilities(v int, c *Capabilities) *Error {
	s := d.s
	if s[v] != '{' {
		return validationErr("capabilities", `must be an object with "sensors" and "features", not `+kindName(s, v))
	}
	var sensorsAt, featuresAt int
	for i := v; ; {
		key, vv, more := nextMember(s, i)
		if !more {
			break
		}
		var slot *int
		switch key {
		case "sensors":
			slot = &sensorsAt
		case "features":
			slot = &featuresAt
		default:
			return validationErr(joinKey("capabilities", key), "unknown field: capabilities has only sensors, features")
		}
		if *slot != 0 {
			return validationErr(joinKey("capabilities", key), "duplicate key")
		}
		*slot = vv + 1
		i = skipValue(s, vv)
	}
	c.Sensors = []string{}
	c.Features = map[string]bool{}
	if sensorsAt != 0 {
		if err := d.capabilitySensors(sensorsAt-1, c); err != nil {
			return err
		}
	}
	if featuresAt != 0 {
		return d.capabilityFeatures(featuresAt-1, c)
	}
	return nil
}

// capabilitySensors decodes capabilities.sensors, the array at s[v].
func (d *decoder) capabilitySensors(v int, c *Capabilities) *Error {
	s := d.s
	if e := notOpenedBy(s, v, '[', "capabilities.sensors", "must be an array of sensor names"); e != nil {
		return e
	}
	for i, k := v, 0; ; k++ {
		e, more := nextElem(s, i)
		if !more {
			break
		}
		if k == MaxCapabilities {
			return tooManyCapabilities("capabilities.sensors")
		}
		if s[e] != '"' {
			return validationErr(joinIndex("capabilities.sensors", k), "must be a string (a sensor name), not "+kindName(s, e))
		}
		c.Sensors = append(c.Sensors, d.stringAt(e))
		i = skipValue(s, e)
	}
	return nil
}

// capabilityFeatures decodes capabilities.features, the object at s[v].
func (d *decoder) capabilityFeatures(v int, c *Capabilities) *Error {
	s := d.s
	if e := notOpenedBy(s, v, '{', "capabilities.features", "must be an object mapping feature names to true or false"); e != nil {
		return e
	}
	for i, k := v, 0; ; k++ {
		key, vv, more := nextMember(s, i)
		if !more {
			break
		}
		if k == MaxCapabilities {
			return tooManyCapabilities("capabilities.features")
		}
		if _, dup := c.Features[key]; dup {
			return validationErr(joinKey("capabilities.features", key), "duplicate key")
		}
		switch s[vv] {
		case 't':
			c.Features[key] = true
		case 'f':
			c.Features[key] = false
		default:
			rule := "must be true or false, not " + kindName(s, vv)
			if s[vv] == '{' || s[vv] == '[' {
				rule += " (features is a flat map)"
			}
			return validationErr(joinKey("capabilities.features", key), rule)
		}
		i = skipValue(s, vv)
	}
	return nil
}

// notOpenedBy returns the error for field when the value at s[v] is not
// the array or object that open ('[' or '{') starts, nil when it is; want
// is the rule for any other value but null.
func notOpenedBy(s string, v int, open byte, field, want string) *Error {
	if s[v] == open {
		return nil
	}
	rule := want + ", not " + kindName(s, v)
	if s[v] == 'n' {
		rule = nullRule
	}
	return validationErr(field, rule)
}

// tooManyCapabilities is the error for a capabilities list, field, longer
// than MaxCapabilities.
func tooManyCapabilities(field string) *Error {
	return validationErr(field, fmt.Sprintf("must have at most %d entries", MaxCapabilities))
}

package contract

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func registrationJSON(members ...string) string {
	return object([]string{
		"hardware_id", q(testHW),
		"boot_id", q(testBoot),
		"firmware_version", q("1.0.16"),
		"friendly_name", q("greenhouse-sensor-01"),
		"capabilities", `{"sensors":["bme280","ds18b20","soil_moisture"],"features":{"tft_display":true,"offline_buffering":false}}`,
	}, members)
}

func TestDecodeRegistration(t *testing.T) {
	r, err := DecodeRegistration([]byte(registrationJSON()), testHW)
	require.NoError(t, err)
	require.Equal(t, &Registration{
		HardwareID: testHW, BootID: testBoot, FirmwareVersion: "1.0.16", FriendlyName: "greenhouse-sensor-01",
		Capabilities: Capabilities{
			Sensors:  []string{"bme280", "ds18b20", "soil_moisture"},
			Features: map[string]bool{"tft_display": true, "offline_buffering": false},
		},
	}, r)
	require.NoError(t, r.Validate())

	r, err = DecodeRegistration([]byte(registrationJSON("friendly_name", "-", "capabilities", "{}")), "")
	require.NoError(t, err)
	require.NotNil(t, r.Capabilities.Sensors, "sensors defaults to an empty list")
	require.NotNil(t, r.Capabilities.Features, "features defaults to an empty map")
	require.Empty(t, r.FriendlyName)
}

func TestDecodeRegistrationRejects(t *testing.T) {
	caps := func(c string) string { return registrationJSON("capabilities", c) }
	tests := []struct {
		name, payload, sender, field, contains string
	}{
		{"invalid JSON", `{"hardware_id":`, "", "", "byte offset 15: unexpected end of input"},
		{"array", `[]`, "", "", "a registration must be a JSON object, not an array"},
		{"hardware_id lower case", registrationJSON("hardware_id", q("aa:bb:cc:dd:ee:ff")), "", "hardware_id", "must be upper case"},
		{"hardware_id not the sender", registrationJSON(), "11:22:33:44:55:66", "hardware_id", "must be the sender's hardware_id"},
		{"hardware_id missing", registrationJSON("hardware_id", "-"), "", "hardware_id", "is required"},
		{"boot_id variant", registrationJSON("boot_id", q("7c9e6679-7425-40de-144b-e07fc1f90ae7")), "", "boot_id", "variant"},
		{"boot_id number", registrationJSON("boot_id", "4"), "", "boot_id", "must be a string, not a number"},
		{"firmware_version too long", registrationJSON("firmware_version", q(strings.Repeat("1", 65))), "", "firmware_version", "got 65 bytes"},
		{"friendly_name null", registrationJSON("friendly_name", "null"), "", "friendly_name", "must not be null"},
		{"friendly_name empty", registrationJSON("friendly_name", q("")), "", "friendly_name", "got 0"},
		{"friendly_name 65 runes", registrationJSON("friendly_name", q(strings.Repeat("🌱", 65))), "", "friendly_name", "got 65"},
		{"friendly_name newline", registrationJSON("friendly_name", q("a\nb")), "", "friendly_name", "must be printable"},
		{"unknown field", registrationJSON("api_key", q("secret")), "", "api_key", "unknown field"},
		{"duplicate key", strings.Replace(registrationJSON(), `"boot_id"`, `"friendly_name":"x","boot_id"`, 1), "", "friendly_name", "duplicate key"},
		{"capabilities missing", registrationJSON("capabilities", "-"), "", "capabilities", "is required"},
		{"capabilities null", registrationJSON("capabilities", "null"), "", "capabilities", "not null"},
		{"capabilities array", caps(`["bme280"]`), "", "capabilities", "must be an object"},
		{"capabilities unknown", caps(`{"sensors":[],"version":2}`), "", "capabilities.version", "unknown field"},
		{"capabilities duplicate", caps(`{"sensors":[],"sensors":[]}`), "", "capabilities.sensors", "duplicate key"},
		{"sensors null", caps(`{"sensors":null}`), "", "capabilities.sensors", "must not be null"},
		{"sensors object", caps(`{"sensors":{"bme280":true}}`), "", "capabilities.sensors", "must be an array of sensor names, not an object"},
		{"sensor number", caps(`{"sensors":["a",1]}`), "", "capabilities.sensors[1]", "must be a string"},
		{"sensor empty", caps(`{"sensors":[""]}`), "", "capabilities.sensors[0]", "must be 1 to 64"},
		{"sensor repeated", caps(`{"sensors":["a","b","a"]}`), "", "capabilities.sensors[2]", "repeats capabilities.sensors[0] (a)"},
		{"features null", caps(`{"features":null}`), "", "capabilities.features", "must not be null"},
		{"features array", caps(`{"features":["tft"]}`), "", "capabilities.features", "must be an object mapping feature names"},
		{"feature null", caps(`{"features":{"tft":null}}`), "", "capabilities.features.tft", "must be true or false, not null"},
		{"feature number", caps(`{"features":{"tft":1}}`), "", "capabilities.features.tft", "must be true or false, not a number"},
		{"feature duplicate", caps(`{"features":{"tft":true,"tft":false}}`), "", "capabilities.features.tft", "duplicate key"},
		{"feature upper case", caps(`{"features":{"TFT":true}}`), "", "capabilities.features.TFT", "feature name may only have"},
		{"too many features", caps(`{"features":{` + manyMembers(65, "true") + `}}`), "", "capabilities.features", "at most 64 entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := DecodeRegistration([]byte(tt.payload), tt.sender)
			require.Nil(t, r)
			var e *Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, ReasonValidation, e.Reason)
			require.Equal(t, tt.field, e.Field, "error: %v", err)
			require.Contains(t, e.Error(), tt.contains)
		})
	}
}

func manyMembers(n int, value string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = q("f"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26))) + ":" + value
	}
	return strings.Join(parts, ",")
}

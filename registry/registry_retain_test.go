package registry_test

import (
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/registry"
)

// TestRegistryKeepsNoPayload checks that the strings the registry keeps of
// a batch are copies: decoded strings are substrings of the whole payload,
// and a device record holding one would keep its last payload in memory
// as long as the gateway runs.
func TestRegistryKeepsNoPayload(t *testing.T) {
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, buf.Close()) })
	devices, err := registry.New(registry.Config{}, buf, nil, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	require.NoError(t, devices.Load())
	const hw = "AA:BB:CC:DD:EE:01"
	b, err := contract.DecodeBatch(gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 3), hw, contract.Limits{}, time.Now())
	require.NoError(t, err)
	devices.Observe(b, false, true)
	_, err = devices.Anchor(b.HardwareID, b.BootID, time.Now().UnixMilli(), 1000)
	require.NoError(t, err)

	d, ok := devices.Device(hw)
	require.True(t, ok)
	tests := []struct{ name, kept, decoded string }{
		{"hardware_id", d.HardwareID, b.HardwareID},
		{"boot_id", d.BootID, b.BootID},
		{"firmware_version", d.FirmwareVersion, b.FirmwareVersion},
		{"anchor boot_id", d.Anchors[0].BootID, b.BootID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.decoded, tt.kept)
			require.NotSame(t, unsafe.StringData(tt.decoded), unsafe.StringData(tt.kept), "shares the payload's memory")
		})
	}
}

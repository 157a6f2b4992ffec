package devicesim

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHardwareIDs(t *testing.T) {
	tests := []struct {
		name    string
		first   string
		n       int
		want    []string
		wantErr bool
	}{
		{name: "consecutive", first: "02:00:00:00:00:01", n: 3,
			want: []string{"02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03"}},
		{name: "lower case input gives upper case ids", first: "aa:bb:cc:dd:ee:fe", n: 2,
			want: []string{"AA:BB:CC:DD:EE:FE", "AA:BB:CC:DD:EE:FF"}},
		{name: "carry across bytes", first: "02:00:00:00:FF:FF", n: 2,
			want: []string{"02:00:00:00:FF:FF", "02:00:00:01:00:00"}},
		{name: "last address", first: "FF:FF:FF:FF:FF:FF", n: 1, want: []string{"FF:FF:FF:FF:FF:FF"}},
		{name: "overflow", first: "FF:FF:FF:FF:FF:FF", n: 2, wantErr: true},
		{name: "dashes", first: "02-00-00-00-00-01", n: 1, wantErr: true},
		{name: "short", first: "02:00:00:00:00", n: 1, wantErr: true},
		{name: "single digit", first: "2:00:00:00:00:01", n: 1, wantErr: true},
		{name: "not hex", first: "02:00:00:00:00:0G", n: 1, wantErr: true},
		{name: "sign", first: "+2:00:00:00:00:01", n: 1, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := hardwareIDs(tt.first, tt.n)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			for _, id := range got {
				require.Regexp(t, `^[0-9A-F]{2}(:[0-9A-F]{2}){5}$`, id)
			}
		})
	}
}

package contract

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAppendAckMatchesEncodingJSON(t *testing.T) {
	reason := ReasonValidation
	full := ReasonBufferFull
	msg := `readings[0].sensors."Temp": sensor name may only have a-z 0-9 _ (^[a-z0-9_]{1,64}$), has 'T' at byte 0`
	odd := "ctrl \x01\t\n, html <&>, quote \", backslash \\, unicode é ✓ \u2028 \u2029, invalid \xff"
	empty := ""
	tests := []struct {
		name string
		ack  Ack
	}{
		{"accepted", Ack{Type: AckTypeReadings, BatchID: testBID, Status: StatusAccepted}},
		{"duplicate", Ack{Type: AckTypeReadings, BatchID: testBID, Status: StatusDuplicate}},
		{"rejected", Ack{Type: AckTypeReadings, BatchID: testBID, Status: StatusRejected, Reason: &reason, Message: &msg}},
		{"rejected without batch_id", Ack{Type: AckTypeReadings, Status: StatusRejected, Reason: &full, Message: &odd}},
		{"empty message", Ack{Type: AckTypeReadings, BatchID: "x", Status: StatusRejected, Reason: &reason, Message: &empty}},
		{"odd batch_id", Ack{Type: AckTypeReadings, BatchID: odd, Status: StatusAccepted}},
		{"registered", Ack{Type: AckTypeRegister, Status: StatusRegistered, ConfirmationID: "550e8400-e29b-41d4-a716-446655440000"}},
		{"enrolled", Ack{Type: AckTypeRegister, Status: StatusRegistered, ConfirmationID: "550e8400-e29b-41d4-a716-446655440000",
			DeviceKey: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", DeviceKeyID: "7c9e6679-7425-40de-944b-e07fc1f90ae7"}},
		{"register rejected", Ack{Type: AckTypeRegister, Status: StatusRejected, Reason: &reason, Message: &odd}},
		{"register with stray batch_id", Ack{Type: AckTypeRegister, BatchID: "ignored", Status: StatusRegistered}},
		{"zero", Ack{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := json.Marshal(tt.ack)
			require.NoError(t, err)
			require.Equal(t, string(want), string(AppendAck(nil, tt.ack)))
			require.Equal(t, string(want), string(EncodeAck(tt.ack)))
			require.Equal(t, "prefix"+string(want), string(AppendAck([]byte("prefix"), tt.ack)))
		})
	}
}

func TestAppendAckRandomStrings(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune{'a', 'Z', '0', '_', ':', '"', '\\', '<', '>', '&', '\n', 0x01, 0x7f, 'é', '✓', 0x2028, 0x2029, 0xfffd}
	str := func() string {
		r := make([]rune, rng.IntN(12))
		for i := range r {
			r[i] = alphabet[rng.IntN(len(alphabet))]
		}
		s := string(r)
		if rng.IntN(8) == 0 {
			s += "\xc3" // a cut UTF-8 sequence
		}
		return s
	}
	for range 2000 {
		reason, msg := Reason(str()), str()
		a := Ack{Type: []string{AckTypeReadings, AckTypeRegister, str()}[rng.IntN(3)], BatchID: str(),
			Status: Status(str()), ConfirmationID: str(), DeviceKey: str(), DeviceKeyID: str()}
		if rng.IntN(2) == 0 {
			a.Reason, a.Message = &reason, &msg
		}
		want, err := json.Marshal(a)
		require.NoError(t, err)
		require.Equal(t, string(want), string(EncodeAck(a)), "%#v", a)
	}
}

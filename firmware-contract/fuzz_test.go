package contract

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// seedVectors adds every payload of firmware-contract/testdata/<dir> to the
// corpus through add.
func seedVectors(f *testing.F, dir string, add func(data []byte, v vector)) {
	f.Helper()
	for _, v := range loadVectors(f) {
		if !strings.HasPrefix(v.File, dir+"/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(vectorsDir, v.File))
		require.NoError(f, err)
		add(data, v)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	seedVectors(f, "readings", func(data []byte, v vector) {
		f.Add(data, v.Sender, v.NowMS, uint8(0))
	})
	f.Fuzz(func(t *testing.T, data []byte, sender string, nowMS int64, limSel uint8) {
		lim := DefaultLimits()
		if limSel&1 != 0 {
			lim = Limits{MaxReadings: 2, MaxSensors: 2, MaxClockSkew: time.Second}
		}
		var now time.Time
		if limSel&2 == 0 {
			now = time.UnixMilli(nowMS)
		}
		// The syntax check agrees with encoding/json, except where it is
		// deliberately stricter.
		if _, synErr := checkSyntax(string(data)); synErr == nil {
			require.True(t, json.Valid(data), "accepted invalid JSON")
		} else if json.Valid(data) {
			require.Regexp(t, "UTF-8|surrogate|nesting deeper", synErr.Rule)
		}

		if stored, err := DecodeStored(data); err != nil {
			_, ok := err.(*Error)
			require.True(t, ok, "DecodeStored's error is an *Error: %T", err)
		} else {
			// What DecodeStored accepts means the same to encoding/json.
			var std Batch
			require.NoError(t, json.Unmarshal(data, &std))
			require.Equal(t, withEmptyMaps(&std), stored)
		}

		b, err := DecodeBatch(data, sender, lim, now)
		if err != nil {
			require.Nil(t, b)
			e, ok := err.(*Error)
			require.True(t, ok, "error is an *Error: %T", err)
			require.NotEmpty(t, e.Rule)
			require.Contains(t, []Reason{ReasonValidation, ReasonClockNotSynced}, e.Reason)
			return
		}
		require.NoError(t, b.Validate(lim, now))

		// What is accepted means the same to encoding/json.
		var std Batch
		require.NoError(t, json.Unmarshal(data, &std))
		require.Equal(t, withEmptyMaps(&std), b)

		c := b.Canonical()
		again, err := DecodeBatch(c, sender, lim, now)
		require.NoError(t, err, "canonical form %s", c)
		require.Equal(t, b, again)
		require.Equal(t, c, again.Canonical())
		require.Equal(t, b.IdentityHash(), again.IdentityHash())
		stored, err := DecodeStored(c)
		require.NoError(t, err, "stored form %s", c)
		require.Equal(t, b, stored, "a stored batch decodes as it was received")
		one, id := b.CanonicalIdentity()
		require.Equal(t, c, one)
		require.Equal(t, b.IdentityHash(), id)
		want, err := json.Marshal(b)
		require.NoError(t, err)
		require.Equal(t, string(want), string(c))

		if b.NeedsClockRepair() {
			require.NotNil(t, b.SentUptimeMS)
			b.RepairClock(ClockAnchor(nowMS, *b.SentUptimeMS))
			require.False(t, b.NeedsClockRepair())
			stored, err := DecodeStored(b.Canonical())
			require.NoError(t, err, "stored form %s", b.Canonical())
			require.Equal(t, b, stored, "a repaired batch decodes as it was stored")
			_ = b.Validate(lim, now) // may fail (collisions, range); must not panic
		}
	})
}

// withEmptyMaps gives b's readings empty maps where encoding/json left
// them nil, as the contract's decoder does.
func withEmptyMaps(b *Batch) *Batch {
	for k := range b.Readings {
		r := &b.Readings[k]
		if r.Sensors == nil {
			r.Sensors = map[string]float64{}
		}
		if r.SensorStatus == nil {
			r.SensorStatus = map[string]string{}
		}
	}
	return b
}

func FuzzDecodeRegistration(f *testing.F) {
	seedVectors(f, "register", func(data []byte, v vector) {
		f.Add(data, v.Sender)
	})
	f.Fuzz(func(t *testing.T, data []byte, sender string) {
		r, err := DecodeRegistration(data, sender)
		if err != nil {
			require.Nil(t, r)
			_, ok := err.(*Error)
			require.True(t, ok, "error is an *Error: %T", err)
			return
		}
		require.True(t, json.Valid(data), "accepted invalid JSON")
		require.NoError(t, r.Validate())
		var std Registration
		require.NoError(t, json.Unmarshal(data, &std))
		if std.Capabilities.Sensors == nil {
			std.Capabilities.Sensors = []string{}
		}
		if std.Capabilities.Features == nil {
			std.Capabilities.Features = map[string]bool{}
		}
		require.Equal(t, &std, r, "encoding/json reads it the same")
		enc, err := json.Marshal(r)
		require.NoError(t, err)
		again, err := DecodeRegistration(enc, sender)
		require.NoError(t, err, "re-encoded %s", enc)
		require.Equal(t, r, again)
	})
}

func FuzzSplitBatches(f *testing.F) {
	seedVectors(f, "readings", func(data []byte, _ vector) {
		f.Add(data)
		var multi bytes.Buffer
		multi.WriteString(`{"batches":[`)
		multi.Write(data)
		multi.WriteString(`,`)
		multi.Write(data)
		multi.WriteString(`]}`)
		f.Add(multi.Bytes())
	})
	f.Add([]byte(`{"batches":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		raws, err := SplitBatches(body)
		if err != nil {
			require.Nil(t, raws)
			_, ok := err.(*Error)
			require.True(t, ok, "error is an *Error: %T", err)
			return
		}
		require.True(t, json.Valid(body))
		require.NotEmpty(t, raws)
		for _, r := range raws {
			require.True(t, json.Valid(r), "document %q", r)
			require.True(t, bytes.Contains(body, r))
		}
	})
}

func FuzzParseTopic(f *testing.F) {
	seedVectors(f, "register", func(_ []byte, v vector) {
		for _, hw := range []string{v.Sender, testHW} {
			f.Add(ReadingsTopic(hw))
			f.Add(RegisterTopic(hw))
			f.Add(AckTopic(hw))
		}
	})
	for _, s := range []string{"", "devices/", "devices//readings", "devices/+/ack", "devices/#", "devices/AA:BB:CC:DD:EE:FF/readings/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		hw, kind, ok := ParseTopic(topic)
		if !ok {
			require.Empty(t, hw)
			require.Empty(t, kind)
			return
		}
		require.NoError(t, ValidHardwareID(hw))
		switch kind {
		case KindReadings:
			require.Equal(t, topic, ReadingsTopic(hw))
		case KindRegister:
			require.Equal(t, topic, RegisterTopic(hw))
		case KindAck:
			require.Equal(t, topic, AckTopic(hw))
		default:
			t.Fatalf("unexpected kind %q", kind)
		}
	})
}

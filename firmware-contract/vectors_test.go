package contract

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// vectorsDir is the language-neutral test vectors shared with firmware
// authors, relative to this package's directory.
const vectorsDir = "testdata"

// vector is one entry of firmware-contract/testdata/vectors.json.
type vector struct {
	File             string  `json:"file"`
	Description      string  `json:"description"`
	Sender           string  `json:"sender"`
	NowMS            int64   `json:"now_ms"`
	Valid            bool    `json:"valid"`
	Reason           *string `json:"reason"`
	Field            *string `json:"field"`
	MessageContains  *string `json:"message_contains"`
	NeedsClockRepair *bool   `json:"needs_clock_repair"`
}

func loadVectors(tb testing.TB) []vector {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(vectorsDir, "vectors.json"))
	require.NoError(tb, err)
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	var vs []vector
	require.NoError(tb, dec.Decode(&vs))
	return vs
}

func TestVectors(t *testing.T) {
	vs := loadVectors(t)
	var nReadings, nRegister int
	for _, v := range vs {
		t.Run(v.File, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(vectorsDir, v.File))
			require.NoError(t, err)
			now := time.UnixMilli(v.NowMS)
			switch {
			case strings.HasPrefix(v.File, "readings/"):
				nReadings++
				b, err := DecodeBatch(data, v.Sender, DefaultLimits(), now)
				checkOutcome(t, v, err)
				if err != nil {
					return
				}
				require.NotNil(t, v.NeedsClockRepair, "valid readings vectors say whether the batch needs clock repair")
				require.Equal(t, *v.NeedsClockRepair, b.NeedsClockRepair())
				requireRoundTrip(t, b, v.Sender, now)
			case strings.HasPrefix(v.File, "register/"):
				nRegister++
				r, err := DecodeRegistration(data, v.Sender)
				checkOutcome(t, v, err)
				if err != nil {
					return
				}
				again, err := DecodeRegistration(mustMarshal(t, r), v.Sender)
				require.NoError(t, err)
				require.Equal(t, r, again)
			default:
				t.Fatalf("vector file %s is neither under readings/ nor register/", v.File)
			}
		})
	}
	require.GreaterOrEqual(t, nReadings, 40)
	require.GreaterOrEqual(t, nRegister, 10)
}

func checkOutcome(t testing.TB, v vector, err error) {
	t.Helper()
	if v.Valid {
		require.NoError(t, err, v.Description)
		require.Nil(t, v.Reason, "valid vectors have a null reason")
		require.Nil(t, v.Field, "valid vectors have a null field")
		return
	}
	require.Error(t, err, v.Description)
	var e *Error
	require.ErrorAs(t, err, &e)
	require.NotNil(t, v.Reason)
	require.NotNil(t, v.Field)
	require.NotNil(t, v.MessageContains)
	require.Equal(t, Reason(*v.Reason), e.Reason, "reason; error: %v", err)
	require.Equal(t, *v.Field, e.Field, "field; error: %v", err)
	require.Contains(t, e.Error(), *v.MessageContains)
}

// TestVectorFilesListed checks that vectors.json and the payload folders list
// the same files, so no vector is forgotten on either side.
func TestVectorFilesListed(t *testing.T) {
	listed := map[string]bool{}
	for _, v := range loadVectors(t) {
		require.False(t, listed[v.File], "%s listed twice", v.File)
		listed[v.File] = true
	}
	var onDisk []string
	for _, dir := range []string{"readings", "register"} {
		entries, err := os.ReadDir(filepath.Join(vectorsDir, dir))
		require.NoError(t, err)
		for _, e := range entries {
			onDisk = append(onDisk, dir+"/"+e.Name())
		}
	}
	for _, f := range onDisk {
		require.True(t, listed[f], "%s is not listed in vectors.json", f)
		delete(listed, f)
	}
	require.Empty(t, listed, "listed in vectors.json but missing on disk")
}

// TestSchemasAreJSON checks that the JSON Schemas at least parse and declare
// draft 2020-12. The vectors are checked against them with a real validator
// outside the Go tests (see firmware-contract/README.md).
func TestSchemasAreJSON(t *testing.T) {
	entries, err := os.ReadDir("schemas")
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		data, err := os.ReadFile(filepath.Join("schemas", e.Name()))
		require.NoError(t, err)
		var schema map[string]any
		require.NoError(t, json.Unmarshal(data, &schema), e.Name())
		require.Equal(t, "https://json-schema.org/draft/2020-12/schema", schema["$schema"], e.Name())
	}
	for _, want := range []string{"registration.schema.json", "readings-batch.schema.json", "ack.schema.json", "readings-response.schema.json"} {
		require.True(t, slices.Contains(names, want), "missing schema %s", want)
	}
}

func mustMarshal(tb testing.TB, v any) []byte {
	tb.Helper()
	data, err := json.Marshal(v)
	require.NoError(tb, err)
	return data
}

// requireRoundTrip checks that b's canonical form decodes to an equal batch,
// matches encoding/json, and is stable.
func requireRoundTrip(tb testing.TB, b *Batch, sender string, now time.Time) {
	tb.Helper()
	c := b.Canonical()
	again, err := DecodeBatch(c, sender, DefaultLimits(), now)
	require.NoError(tb, err, "canonical form %s", c)
	require.Equal(tb, b, again)
	require.Equal(tb, string(c), string(again.Canonical()))
	require.Equal(tb, string(mustMarshal(tb, b)), string(c), "canonical form is encoding/json's")
	require.Equal(tb, b.IdentityHash(), again.IdentityHash())
	one, id := b.CanonicalIdentity()
	require.Equal(tb, string(c), string(one), "CanonicalIdentity's bytes are Canonical's")
	require.Equal(tb, b.IdentityHash(), id, "CanonicalIdentity's hash is IdentityHash")
}

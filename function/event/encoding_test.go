package event_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/function/event"
)

func sample() *event.BatchEvent {
	ev := &event.BatchEvent{V: event.EventVersion, Kind: event.KindGatewayBatches, GatewayID: "gw-1",
		Report: &event.UplinkReport{PendingBatches: 3}}
	for i := 0; i < 40; i++ {
		ev.Items = append(ev.Items, event.BatchItem{ID: "c-" + strings.Repeat("x", i%3),
			Batch: json.RawMessage(`{"batch_id":"AA:BB:CC:00:00:01-1f2e-000042","readings":[{"sensor":"temp","value":21.5}]}`)})
	}
	return ev
}

func TestEncodingsRoundTrip(t *testing.T) {
	want := sample()
	plain, err := json.Marshal(want)
	require.NoError(t, err)
	for _, enc := range event.Encodings {
		raw, err := event.Marshal(want, enc)
		require.NoError(t, err, enc)
		got, gotEnc, err := event.Unmarshal(raw)
		require.NoError(t, err, enc)
		require.Equal(t, enc, gotEnc)
		require.Equal(t, *want, got, enc)
		if enc != event.EncodingNone {
			require.Less(t, len(raw), len(plain)/3, "%s: %d bytes against %d plain", enc, len(raw), len(plain))
			var env map[string]any
			require.NoError(t, json.Unmarshal(raw, &env))
			require.Equal(t, event.KindGatewayBatches, env["kind"], "a compressed event still says its kind")
			require.Equal(t, enc, env["encoding"])
		}
	}
	raw, err := event.Marshal(want, "")
	require.NoError(t, err)
	require.JSONEq(t, string(plain), string(raw), "no encoding is the plain event")
}

func TestUnknownEncodingIsNamed(t *testing.T) {
	_, err := event.Marshal(sample(), "brotli")
	require.ErrorContains(t, err, `"brotli"`)
	_, _, err = event.Unmarshal([]byte(`{"v":1,"kind":"gateway_batches","encoding":"brotli","data":"AAAA"}`))
	require.ErrorContains(t, err, `encoding "brotli": must be one of`)
}

func TestBadDataIsRefused(t *testing.T) {
	for name, raw := range map[string]string{
		"not base64": `{"v":1,"kind":"gateway_batches","encoding":"zstd","data":"!!!"}`,
		"not zstd":   `{"v":1,"kind":"gateway_batches","encoding":"zstd","data":"AAAAAAAA"}`,
		"not gzip":   `{"v":1,"kind":"gateway_batches","encoding":"gzip","data":"AAAAAAAA"}`,
		"other kind": `{"v":1,"kind":"other","encoding":"gzip","data":"AAAAAAAA"}`,
	} {
		_, _, err := event.Unmarshal([]byte(raw))
		require.Error(t, err, name)
	}
	// The decoded event must be the envelope's.
	inner, err := json.Marshal(map[string]any{"v": 2, "kind": event.KindGatewayBatches})
	require.NoError(t, err)
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write(inner)
	require.NoError(t, w.Close())
	env, err := json.Marshal(map[string]any{"v": 1, "kind": event.KindGatewayBatches, "encoding": "gzip", "data": b.Bytes()})
	require.NoError(t, err)
	_, _, err = event.Unmarshal(env)
	require.ErrorContains(t, err, "must have the envelope's kind and v")
}

// zeros writes n zero bytes through w in 1 MiB pieces.
func zeros(t *testing.T, w io.WriteCloser, n int) {
	block := make([]byte, 1<<20)
	for ; n > 0; n -= len(block) {
		_, err := w.Write(block[:min(n, len(block))])
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
}

func TestDecompressionBombsAreRefused(t *testing.T) {
	var gz, zs bytes.Buffer
	zeros(t, gzip.NewWriter(&gz), event.MaxDecodedBytes+1)
	zw, err := zstd.NewWriter(&zs)
	require.NoError(t, err)
	zeros(t, zw, event.MaxDecodedBytes+1)
	for enc, data := range map[string][]byte{"gzip": gz.Bytes(), "zstd": zs.Bytes()} {
		env, err := json.Marshal(map[string]any{"v": 1, "kind": event.KindGatewayBatches, "encoding": enc, "data": data})
		require.NoError(t, err)
		_, _, err = event.Unmarshal(env)
		require.ErrorContains(t, err, "expands to more than", enc)
	}
}

func TestAnEventThatDoesNotShrinkGoesPlain(t *testing.T) {
	ev := &event.BatchEvent{V: event.EventVersion, Kind: event.KindGatewayBatches}
	plain, err := json.Marshal(ev)
	require.NoError(t, err)
	for _, enc := range event.Encodings {
		raw, err := event.Marshal(ev, enc)
		require.NoError(t, err)
		require.JSONEq(t, string(plain), string(raw), enc)
	}
}

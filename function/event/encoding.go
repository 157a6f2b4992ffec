package event

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Encodings of a compressed event (the "encoding" member): the plain
// event's JSON compressed, then base64 (standard alphabet, padded) in
// "data", since a Lambda payload must be JSON:
//
//	{"v":1,"kind":"gateway_batches","encoding":"zstd","data":"KLUv/..."}
//
// The function takes plain and compressed events alike; a gateway
// compresses as uplink.lambda.encoding says.
const (
	EncodingNone = "none"
	EncodingGzip = "gzip"
	EncodingZstd = "zstd"
)

// Encodings are the values uplink.lambda.encoding may take.
var Encodings = []string{EncodingZstd, EncodingGzip, EncodingNone}

// MaxDecodedBytes bounds what a compressed event may expand to: Lambda
// takes at most 6 MB of payload for a synchronous invocation, and a
// batch's JSON compresses about 14 times, so a real event stays far
// below it; a payload that expands beyond is refused, not decoded.
const MaxDecodedBytes = 128 << 20

// envelope is the compressed event's outer JSON.
type envelope struct {
	V        int    `json:"v"`
	Kind     string `json:"kind"`
	Encoding string `json:"encoding,omitempty"`
	Data     []byte `json:"data,omitempty"`
}

// The zstd codecs are made at first use: a gateway only encodes, the
// function only decodes, and a gateway writing DynamoDB needs neither.
var (
	zstdEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
		return e
	})
	zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
		d, _ := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(MaxDecodedBytes), zstd.WithDecoderConcurrency(0))
		return d
	})
)

// Marshal encodes ev as the function reads it: plain JSON for
// EncodingNone (or ""), else the compressed envelope, unless that would
// not be smaller than the plain event (which a sender keeps within
// Lambda's payload limit).
func Marshal(ev *BatchEvent, encoding string) ([]byte, error) {
	plain, err := json.Marshal(ev)
	if err != nil || encoding == "" || encoding == EncodingNone {
		return plain, err
	}
	var packed []byte
	switch encoding {
	case EncodingZstd:
		packed = zstdEncoder().EncodeAll(plain, make([]byte, 0, len(plain)/8))
	case EncodingGzip:
		var b bytes.Buffer
		w, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
		if _, err := w.Write(plain); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		packed = b.Bytes()
	default:
		return nil, fmt.Errorf("event encoding %q: must be one of %v", encoding, Encodings)
	}
	env, err := json.Marshal(envelope{V: ev.V, Kind: ev.Kind, Encoding: encoding, Data: packed})
	if err != nil || len(env) >= len(plain) {
		return plain, err
	}
	return env, nil
}

// Unmarshal decodes a gateway_batches event, plain or compressed, and
// returns the encoding it came in ("none" for a plain one). Members it
// does not know are ignored, as in every version of the event.
func Unmarshal(raw []byte) (BatchEvent, string, error) {
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return BatchEvent{}, "", err
	}
	if env.Encoding == "" || env.Encoding == EncodingNone {
		var ev BatchEvent
		err := json.Unmarshal(raw, &ev)
		return ev, EncodingNone, err
	}
	if env.Kind != KindGatewayBatches {
		return BatchEvent{}, "", fmt.Errorf("encoding: a compressed event must have kind %q, not %q", KindGatewayBatches, env.Kind)
	}
	plain, err := decompress(env.Encoding, env.Data)
	if err != nil {
		return BatchEvent{}, "", err
	}
	var ev BatchEvent
	if err := json.Unmarshal(plain, &ev); err != nil {
		return BatchEvent{}, "", fmt.Errorf("data: the %s-decoded event is not a gateway_batches event: %w", env.Encoding, err)
	}
	if ev.Kind != KindGatewayBatches || ev.V != env.V {
		return BatchEvent{}, "", fmt.Errorf("data: the decoded event must have the envelope's kind and v (%q, %d), not (%q, %d)",
			env.Kind, env.V, ev.Kind, ev.V)
	}
	return ev, env.Encoding, nil
}

// errTooLarge is a compressed event that expands beyond MaxDecodedBytes.
var errTooLarge = fmt.Errorf("data: expands to more than %d bytes", MaxDecodedBytes)

func decompress(encoding string, data []byte) ([]byte, error) {
	switch encoding {
	case EncodingZstd:
		out, err := zstdDecoder().DecodeAll(data, nil)
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return nil, errTooLarge
		}
		if err != nil {
			return nil, fmt.Errorf("data: not zstd: %w", err)
		}
		return out, nil
	case EncodingGzip:
		r, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("data: not gzip: %w", err)
		}
		out, err := io.ReadAll(io.LimitReader(r, MaxDecodedBytes+1))
		if err != nil {
			return nil, fmt.Errorf("data: not gzip: %w", err)
		}
		if len(out) > MaxDecodedBytes {
			return nil, errTooLarge
		}
		return out, nil
	}
	return nil, fmt.Errorf("encoding %q: must be one of %v", encoding, Encodings)
}

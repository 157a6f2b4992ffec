package cloud

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"greenhouse-gateway/firmware-contract"
)

// batchWriteProtocol is the client's protocol (AWS JSON 1.0) with
// BatchWriteItem bodies encoded by appendBatchWriteItem: the uplink's bulk
// request, 25 items of a dozen attributes each, is most of what gatewayd
// sends. The SDK's schema serializer grows its buffer from 1 KB for every
// request and copies it at the end; this encoder writes the same JSON into
// a pooled buffer and copies it out once. Headers still come from the
// SDK's protocol, and an input holding anything the encoder does not know
// (an unknown union member, a nil value) is serialized by the SDK as
// before, unless it also holds items given encoded (EncodedItem), which
// the SDK does not know: such a request fails.
type batchWriteProtocol struct {
	smithyhttp.ClientProtocol
}

// bodyScratch holds the buffers bodies are encoded in before they are
// copied out at their exact size (the request keeps its body until the
// call returns, which the protocol does not see); those grown beyond
// maxBodyScratch are left to the GC.
var bodyScratch = sync.Pool{New: func() any {
	b := make([]byte, 0, 16<<10)
	return &b
}}

const maxBodyScratch = 256 << 10

// withBatchWriteEncoder installs batchWriteProtocol on a client's options.
func withBatchWriteEncoder(o *dynamodb.Options) {
	if _, done := o.Protocol.(batchWriteProtocol); !done && o.Protocol != nil {
		o.Protocol = batchWriteProtocol{ClientProtocol: o.Protocol}
	}
}

func (p batchWriteProtocol) SerializeRequest(ctx context.Context, schema *smithy.OperationSchema, in smithy.Serializable, req *smithyhttp.Request) error {
	bw, ok := in.(*dynamodb.BatchWriteItemInput)
	if !ok {
		return p.ClientProtocol.SerializeRequest(ctx, schema, in, req)
	}
	scratch := bodyScratch.Get().(*[]byte)
	enc, ok := appendBatchWriteItem((*scratch)[:0], bw)
	var body []byte
	if ok {
		body = slices.Clone(enc)
	}
	if cap(enc) <= maxBodyScratch {
		*scratch = enc[:0]
		bodyScratch.Put(scratch)
	}
	if !ok {
		if holdsEncoded(bw) {
			// The SDK cannot serialize an encoded item.
			return errors.New("BatchWriteItem: an item the encoder does not know beside items given encoded")
		}
		return p.ClientProtocol.SerializeRequest(ctx, schema, in, req)
	}
	// The SDK's protocol sets the method, path and headers (and a body of
	// "{}" for the empty input), then the body is replaced.
	if err := p.ClientProtocol.SerializeRequest(ctx, schema, &dynamodb.BatchWriteItemInput{}, req); err != nil {
		return err
	}
	sreq, err := req.SetStream(bytes.NewReader(body))
	if err != nil {
		return err
	}
	*req = *sreq
	return nil
}

// appendBatchWriteItem appends the AWS JSON encoding of in to dst, as the
// SDK's serializer writes it (members in another order, which JSON allows),
// or reports false when in holds something it does not encode.
func appendBatchWriteItem(dst []byte, in *dynamodb.BatchWriteItemInput) ([]byte, bool) {
	dst = append(dst, '{')
	if in.RequestItems != nil {
		dst = append(dst, `"RequestItems":{`...)
		first := true
		for table, reqs := range in.RequestItems {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = contract.AppendJSONString(dst, table)
			dst = append(dst, ':')
			if reqs == nil {
				dst = append(dst, "null"...)
				continue
			}
			var ok bool
			if dst, ok = appendArray(dst, reqs, appendWriteRequest); !ok {
				return dst, false
			}
		}
		dst = append(dst, '}')
	}
	comma := in.RequestItems != nil
	for _, member := range [...]struct{ name, value string }{
		{"ReturnConsumedCapacity", string(in.ReturnConsumedCapacity)},
		{"ReturnItemCollectionMetrics", string(in.ReturnItemCollectionMetrics)},
	} {
		if member.value == "" {
			continue
		}
		if comma {
			dst = append(dst, ',')
		}
		comma = true
		dst = contract.AppendJSONString(dst, member.name)
		dst = append(dst, ':')
		dst = contract.AppendJSONString(dst, member.value)
	}
	return append(dst, '}'), true
}

func appendWriteRequest(dst []byte, r types.WriteRequest) ([]byte, bool) {
	var member string
	var item map[string]types.AttributeValue
	switch {
	case r.PutRequest != nil && r.DeleteRequest != nil:
		return dst, false
	case r.PutRequest != nil:
		member, item = `{"PutRequest":{"Item":`, r.PutRequest.Item
	case r.DeleteRequest != nil:
		member, item = `{"DeleteRequest":{"Key":`, r.DeleteRequest.Key
	default:
		return append(dst, "{}"...), true
	}
	dst, ok := appendItem(append(dst, member...), item)
	return append(dst, "}}"...), ok
}

// encodedTag marks the one attribute of an item given encoded (EncodedItem).
const encodedTag = "greenhouse-gateway/encoded-item"

// EncodedItem is an item given as its AWS JSON encoding, raw: an object of
// attribute values, as DynamoDB's API spells an item. It goes in a
// BatchWriteItem's PutRequest through a client of NewClient (whose encoder
// writes raw as it is) and nowhere else: the SDK's own serializer does not
// know it. raw is not copied and must not change until the request is
// answered.
func EncodedItem(raw []byte) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"": &types.UnknownUnionMember{Tag: encodedTag, Value: raw}}
}

// encodedItem returns the raw encoding of an item made by EncodedItem.
func encodedItem(item map[string]types.AttributeValue) ([]byte, bool) {
	if len(item) != 1 {
		return nil, false
	}
	u, ok := item[""].(*types.UnknownUnionMember)
	if !ok || u.Tag != encodedTag {
		return nil, false
	}
	return u.Value, true
}

// EncodesItems reports whether client's BatchWriteItem requests may hold
// items given encoded (EncodedItem): whether it was made by NewClient.
func EncodesItems(client *dynamodb.Client) bool {
	_, ok := client.Options().Protocol.(batchWriteProtocol)
	return ok
}

// holdsEncoded reports whether in holds an item given encoded.
func holdsEncoded(in *dynamodb.BatchWriteItemInput) bool {
	for _, reqs := range in.RequestItems {
		for _, r := range reqs {
			if r.PutRequest != nil {
				if _, ok := encodedItem(r.PutRequest.Item); ok {
					return true
				}
			}
		}
	}
	return false
}

// appendItem appends item as a JSON object of attribute values, or reports
// false for a nil item or a value appendValue does not encode. An item
// given encoded is appended as it is.
func appendItem(dst []byte, item map[string]types.AttributeValue) ([]byte, bool) {
	if item == nil {
		return dst, false
	}
	if raw, ok := encodedItem(item); ok {
		return append(dst, raw...), true
	}
	dst = append(dst, '{')
	first := true
	for k, v := range item {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = contract.AppendJSONString(dst, k)
		dst = append(dst, ':')
		var ok bool
		if dst, ok = appendValue(dst, v); !ok {
			return dst, false
		}
	}
	return append(dst, '}'), true
}

func appendValue(dst []byte, v types.AttributeValue) ([]byte, bool) {
	ok := true
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		dst = contract.AppendJSONString(append(dst, `{"S":`...), v.Value)
	case *types.AttributeValueMemberN:
		dst = contract.AppendJSONString(append(dst, `{"N":`...), v.Value)
	case *types.AttributeValueMemberB:
		dst, ok = appendBlobElem(append(dst, `{"B":`...), v.Value)
	case *types.AttributeValueMemberBOOL:
		dst = appendBool(append(dst, `{"BOOL":`...), v.Value)
	case *types.AttributeValueMemberNULL:
		dst = appendBool(append(dst, `{"NULL":`...), v.Value)
	case *types.AttributeValueMemberM:
		dst, ok = appendItem(append(dst, `{"M":`...), v.Value)
	case *types.AttributeValueMemberL:
		dst, ok = appendArray(append(dst, `{"L":`...), v.Value, appendValue)
	case *types.AttributeValueMemberSS:
		dst, ok = appendArray(append(dst, `{"SS":`...), v.Value, appendStringElem)
	case *types.AttributeValueMemberNS:
		dst, ok = appendArray(append(dst, `{"NS":`...), v.Value, appendStringElem)
	case *types.AttributeValueMemberBS:
		dst, ok = appendArray(append(dst, `{"BS":`...), v.Value, appendBlobElem)
	default: // nil, or a member this encoder does not know
		return dst, false
	}
	return append(dst, '}'), ok
}

func appendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, "true"...)
	}
	return append(dst, "false"...)
}

// appendArray appends xs as a JSON array, each element by each, or
// reports false for a nil xs or as soon as each does.
func appendArray[T any](dst []byte, xs []T, each func([]byte, T) ([]byte, bool)) ([]byte, bool) {
	if xs == nil {
		return dst, false
	}
	dst = append(dst, '[')
	for i, x := range xs {
		if i > 0 {
			dst = append(dst, ',')
		}
		var ok bool
		if dst, ok = each(dst, x); !ok {
			return dst, false
		}
	}
	return append(dst, ']'), true
}

func appendStringElem(dst []byte, s string) ([]byte, bool) {
	return contract.AppendJSONString(dst, s), true
}

func appendBlobElem(dst []byte, b []byte) ([]byte, bool) {
	if b == nil {
		return dst, false
	}
	return appendBlob(dst, b), true
}

func appendBlob(dst []byte, b []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}

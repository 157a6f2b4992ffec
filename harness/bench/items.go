//go:build linux

package bench

import (
	"math"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/tablewrite"
	"greenhouse-gateway/uplink"
)

// readingsRetention is uplink.readings_retention's default.
var readingsRetention = uplink.DefaultConfig().ReadingsRetention

// itemBatch is the table items the uplink writes for a batch
// (uplink.BatchItems, quality scores included), so that the baselines
// write the same items and their sizes can be priced.
type itemBatch struct {
	readings []map[string]types.AttributeValue
	marker   map[string]types.AttributeValue
	// built is what the uplink writes of the batch (readings and marker
	// above are its items): the bulk writer's input.
	built *tablewrite.Items
}

func batchItems(p buffer.Pending, now time.Time) (*itemBatch, error) {
	it, err := uplink.BatchItems(p, readingsRetention, now)
	if err != nil {
		return nil, err
	}
	return &itemBatch{readings: it.ReadingItems(), marker: it.MarkerItem(), built: it}, nil
}

// itemSize is an item's size by DynamoDB's documented rules ("Item sizes
// and formats", DynamoDB Developer Guide): each attribute's name (UTF-8
// bytes) plus its value; a string its UTF-8 bytes; a number about one byte
// per two significant digits, plus one; a map or list 3 bytes plus its
// elements, each with one byte of overhead; a Boolean or null one byte.
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return numberSize(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += len(k) + valueSize(e) + 1
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += valueSize(e) + 1
		}
		return n
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberNS:
		n := 0
		for _, s := range v.Value {
			n += numberSize(s)
		}
		return n
	}
	return 0
}

// numberSize is 1 byte per two significant digits (leading and trailing
// zeros trimmed), plus 1.
func numberSize(s string) int {
	digits := 0
	lead := true
	trailingZeros := 0
	for _, c := range s {
		if c == 'e' || c == 'E' {
			break
		}
		if c < '0' || c > '9' {
			continue
		}
		if lead && c == '0' {
			continue
		}
		lead = false
		digits++
		if c == '0' {
			trailingZeros++
		} else {
			trailingZeros = 0
		}
	}
	digits -= trailingZeros
	return (digits+1)/2 + 1
}

// writeUnits is the write capacity of one standard write of an item of size
// bytes: one unit per started kilobyte. A transactional write costs twice
// that.
func writeUnits(size int) float64 { return math.Ceil(float64(max(size, 1)) / 1024) }

// itemPricing is the average write capacity of the backlog's items.
type itemPricing struct {
	ReadingBytes float64 `json:"reading_item_bytes_avg"`
	MarkerBytes  float64 `json:"marker_item_bytes_avg"`
	ReadingWCU   float64 `json:"reading_item_wcu_avg"` // per standard write
	MarkerWCU    float64 `json:"marker_item_wcu_avg"`
}

func priceItems(batches []*itemBatch) itemPricing {
	var p itemPricing
	var nr, nm float64
	for _, b := range batches {
		for _, r := range b.readings {
			s := itemSize(r)
			p.ReadingBytes += float64(s)
			p.ReadingWCU += writeUnits(s)
			nr++
		}
		s := itemSize(b.marker)
		p.MarkerBytes += float64(s)
		p.MarkerWCU += writeUnits(s)
		nm++
	}
	if nr > 0 {
		p.ReadingBytes /= nr
		p.ReadingWCU /= nr
	}
	if nm > 0 {
		p.MarkerBytes /= nm
		p.MarkerWCU /= nm
	}
	return p
}

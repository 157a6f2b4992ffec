// Package cloudread reads a device's readings back from device_readings
// (the locked schema's read pattern: a Query on hardware_id with BETWEEN on
// ts_batch) and answers the reading queries and summaries of
// internal/readquery over them, the code the gateway's operator API answers
// them with. The readings function's read API and gatewayctl read through
// it.
package cloudread

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/readquery"
)

// Querier is the DynamoDB call the reader makes (*dynamodb.Client).
type Querier interface {
	Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
}

// Reader reads device_readings.
type Reader struct {
	db     Querier
	tables cloud.Tables
}

// New returns a reader of tables' device_readings; it does no I/O.
func New(db Querier, tables cloud.Tables) *Reader {
	return &Reader{db: db, tables: tables}
}

// Stats are what one read cost: Query requests, items read and the read
// capacity units DynamoDB reported consumed (ReturnConsumedCapacity TOTAL;
// eventually consistent reads).
type Stats struct {
	Requests     int     `json:"requests"`
	Items        int     `json:"items"`
	ReadCapacity float64 `json:"read_capacity_units"`
}

func (s *Stats) add(out *dynamodb.QueryOutput) {
	s.Requests++
	s.Items += len(out.Items)
	if out.ConsumedCapacity != nil && out.ConsumedCapacity.CapacityUnits != nil {
		s.ReadCapacity += *out.ConsumedCapacity.CapacityUnits
	}
}

// SortKeyBound is a ts_batch bound for BETWEEN: the 13-digit zero-padded
// timestamp and '#', followed by batchID when one is given. No sort key
// equals a bound without a batch_id (every batch_id has a character), so
// BETWEEN SortKeyBound(from) AND SortKeyBound(to) is [from, to) in
// milliseconds; with a batch_id it is that reading's own ts_batch.
func SortKeyBound(timestampMS int64, batchID string) string {
	return fmt.Sprintf("%013d#%s", timestampMS, batchID)
}

// Projections of the two reads: a summary needs the time and the values.
const (
	pageAttributes    = "timestamp_ms, batch_id, sensors, time_source, quality_score"
	summaryAttributes = "timestamp_ms, sensors"
)

// each calls fn with every reading item of hw in [fromMS, toMS) from
// (timestampMS, batchID) on when start is set, oldest first, limit items a
// request (0: as many as fit in a response), until fn returns false.
func (r *Reader) each(ctx context.Context, hw string, lower string, toMS int64, limit int, projection string,
	st *Stats, fn func(map[string]types.AttributeValue) bool) error {
	in := &dynamodb.QueryInput{
		TableName:              aws.String(r.tables.Readings),
		KeyConditionExpression: aws.String("hardware_id = :hw AND ts_batch BETWEEN :lo AND :hi"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":hw": &types.AttributeValueMemberS{Value: hw},
			":lo": &types.AttributeValueMemberS{Value: lower},
			":hi": &types.AttributeValueMemberS{Value: SortKeyBound(toMS, "")},
		},
		ProjectionExpression:   aws.String(projection),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	}
	if limit > 0 {
		in.Limit = aws.Int32(int32(limit))
	}
	for {
		out, err := r.db.Query(ctx, in)
		if err != nil {
			return fmt.Errorf("Query of %s's readings in %s: %w", hw, r.tables.Readings, err)
		}
		st.add(out)
		for _, item := range out.Items {
			if !fn(item) {
				return nil
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// Readings answers a readings query of hw: the page q asks for, with each
// reading's stored quality_score (items without one are scored over the
// page's sequence). It reads from the cursor's reading on, at most
// q.Limit+1 items a request, and stops once the page is full.
func (r *Reader) Readings(ctx context.Context, hw string, q readquery.ReadingsQuery) (readquery.ReadingsPage, Stats, error) {
	var st Stats
	fromMS, toMS := readquery.WindowMS(q.From, q.To)
	lower := SortKeyBound(fromMS, "")
	if ms, batch, ok := q.Resume(); ok && ms >= fromMS {
		lower = SortKeyBound(ms, batch)
	}
	p := q.Pager()
	err := r.each(ctx, hw, lower, toMS, q.Limit+1, pageAttributes, &st, func(item map[string]types.AttributeValue) bool {
		rd, t := reading(item)
		if t.Before(q.From) || !t.Before(q.To) {
			return true
		}
		if ts, ok := item["time_source"].(*types.AttributeValueMemberS); ok {
			rd.TimeSource = ts.Value
		}
		var stored *float64
		if n, ok := item["quality_score"].(*types.AttributeValueMemberN); ok {
			if v, err := strconv.ParseFloat(n.Value, 64); err == nil {
				stored = &v
			}
		}
		batch, _ := item["batch_id"].(*types.AttributeValueMemberS)
		if batch == nil {
			batch = &types.AttributeValueMemberS{}
		}
		return !p.Add(batch.Value, &rd, readquery.StateDelivered, stored)
	})
	if err != nil {
		return readquery.ReadingsPage{}, st, err
	}
	return p.Page(hw), st, nil
}

// Summary answers a summary query of hw over every reading of its window
// in the table.
func (r *Reader) Summary(ctx context.Context, hw string, q readquery.SummaryQuery) (readquery.Summary, Stats, error) {
	var st Stats
	fromMS, toMS := readquery.WindowMS(q.From, q.To)
	s := q.Summarizer()
	err := r.each(ctx, hw, SortKeyBound(fromMS, ""), toMS, 0, summaryAttributes, &st, func(item map[string]types.AttributeValue) bool {
		rd, t := reading(item)
		s.Add(t, rd.Sensors)
		return true
	})
	if err != nil {
		return readquery.Summary{}, st, err
	}
	return s.Result(hw), st, nil
}

// ItemReading decodes a device_readings item's timestamp_ms and sensors
// (the attributes a projection of "timestamp_ms, sensors" returns).
func ItemReading(item map[string]types.AttributeValue) contract.Reading {
	rd := contract.Reading{Sensors: map[string]float64{}}
	if n, ok := item["timestamp_ms"].(*types.AttributeValueMemberN); ok {
		rd.TimestampMS, _ = strconv.ParseInt(n.Value, 10, 64)
	}
	if m, ok := item["sensors"].(*types.AttributeValueMemberM); ok {
		for k, v := range m.Value {
			if n, ok := v.(*types.AttributeValueMemberN); ok {
				if x, err := strconv.ParseFloat(n.Value, 64); err == nil {
					rd.Sensors[k] = x
				}
			}
		}
	}
	return rd
}

// reading is ItemReading with the reading's time.
func reading(item map[string]types.AttributeValue) (contract.Reading, time.Time) {
	rd := ItemReading(item)
	return rd, time.UnixMilli(rd.TimestampMS)
}

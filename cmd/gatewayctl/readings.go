package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// scanCap bounds a table-wide scan of "readings latest" without
// --hardware-id: it is meant for development tables.
const scanCap = 100_000

func setupReadingsLatest(fs *flag.FlagSet, _ func(string) string) func(context.Context, *cmdEnv, []string) error {
	hw := fs.String("hardware-id", "", "only this device (a Query, newest first); without it the table is scanned (up to 100,000 items)")
	limit := fs.Int("limit", 10, "how many readings to print")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		if *limit < 1 {
			return usageError{msg: "--limit must be at least 1"}
		}
		client, tables, err := env.client(ctx)
		if err != nil {
			return err
		}
		var items []map[string]types.AttributeValue
		total, devices := 0, map[string]bool{}
		if *hw != "" {
			out, err := client.Query(ctx, &dynamodb.QueryInput{
				TableName:                 aws.String(tables.Readings),
				KeyConditionExpression:    aws.String("hardware_id = :hw"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":hw": &types.AttributeValueMemberS{Value: *hw}},
				ScanIndexForward:          aws.Bool(false),
				Limit:                     aws.Int32(int32(*limit)),
			})
			if err != nil {
				return fmt.Errorf("querying %s: %w", tables.Readings, err)
			}
			items = out.Items
		} else {
			p := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(tables.Readings)})
			for p.HasMorePages() && total < scanCap {
				page, err := p.NextPage(ctx)
				if err != nil {
					return fmt.Errorf("scanning %s: %w", tables.Readings, err)
				}
				for _, it := range page.Items {
					total++
					devices[attrS(it, "hardware_id")] = true
				}
				items = append(items, page.Items...)
			}
			sort.Slice(items, func(i, j int) bool { return attrN(items[i], "timestamp_ms") > attrN(items[j], "timestamp_ms") })
			items = items[:min(len(items), *limit)]
		}
		tw := tabwriter.NewWriter(env.stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "HARDWARE_ID\tTIMESTAMP\tSENSORS\tBATCH_ID")
		for _, it := range items {
			ts := time.UnixMilli(int64(attrN(it, "timestamp_ms"))).UTC().Format("2006-01-02T15:04:05.000Z")
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", attrS(it, "hardware_id"), ts, sensors(it), attrS(it, "batch_id"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if *hw == "" {
			fmt.Fprintf(env.stderr, "%d readings from %d devices in %s\n", total, len(devices), tables.Readings)
		}
		return nil
	}
}

func attrS(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func attrN(item map[string]types.AttributeValue, name string) float64 {
	var f float64
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		fmt.Sscan(v.Value, &f)
	}
	return f
}

func sensors(item map[string]types.AttributeValue) string {
	m, ok := item["sensors"].(*types.AttributeValueMemberM)
	if !ok {
		return "-"
	}
	keys := make([]string, 0, len(m.Value))
	for k := range m.Value {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if n, ok := m.Value[k].(*types.AttributeValueMemberN); ok {
			parts = append(parts, k+"="+n.Value)
		}
	}
	return strings.Join(parts, " ")
}

package tablewrite_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// BenchmarkBulkWrite builds 100 batches of 10 readings and writes them
// with WriteBulk, through a client of cloud.NewClient, to an in-process
// endpoint that finds no marker and processes every item: the writer's
// whole cost of 1,000 readings, the SDK and HTTP included. "encoded" sends
// the readings encoded, as the uplink does; "maps" sends them as
// attribute maps, through the same client.
func BenchmarkBulkWrite(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		if strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".BatchGetItem") {
			_, _ = io.WriteString(w, `{"Responses":{},"UnprocessedKeys":{}}`)
			return
		}
		_, _ = io.WriteString(w, `{"UnprocessedItems":{}}`)
	}))
	defer srv.Close()
	b.Setenv("AWS_ACCESS_KEY_ID", "local")
	b.Setenv("AWS_SECRET_ACCESS_KEY", "local")
	client, err := cloud.NewClient(context.Background(), cloud.Config{Endpoint: srv.URL, Region: "us-east-1"})
	if err != nil {
		b.Fatal(err)
	}
	tables := cloud.TableNames("")
	var batches []tablewrite.Batch
	for d := range 100 {
		bt := testBatch(fmt.Sprintf("02:00:00:00:%02X:%02X", d/256, d%256), d, 10, 21.5)
		batches = append(batches, tablewrite.Batch{Batch: bt, ReceivedAt: time.Now(), Hash: bt.IdentityHash()})
	}
	for _, way := range []struct {
		name string
		db   tablewrite.DB
	}{{"encoded", client}, {"maps", mapsOnly{client}}} {
		b.Run(way.name, func(b *testing.B) {
			w := tablewrite.New(way.db, tables, tablewrite.Options{})
			b.ReportAllocs()
			for b.Loop() {
				items := make([]*tablewrite.Items, len(batches))
				for i, bt := range batches {
					items[i] = tablewrite.Build(bt, 90*24*time.Hour, time.Now())
				}
				for _, r := range w.WriteBulk(context.Background(), items, 4) {
					if r.Outcome != tablewrite.Delivered {
						b.Fatal(r.Err)
					}
				}
			}
		})
	}
}

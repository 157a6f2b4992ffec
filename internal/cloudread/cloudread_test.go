package cloudread_test

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/dynamotest"
	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/cloudread"
	"greenhouse-gateway/internal/readquery"
	"greenhouse-gateway/internal/tablewrite"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

func TestSortKeyBoundIsTheSortKey(t *testing.T) {
	for _, ms := range []int64{0, 946684800000, 1704067800000, 4102444799999} {
		require.Equal(t, tablewrite.TSBatch(ms, "AA:BB_x"), cloudread.SortKeyBound(ms, "AA:BB_x"))
		require.Less(t, cloudread.SortKeyBound(ms, ""), tablewrite.TSBatch(ms, "A"), "a bound is below its millisecond's keys")
		require.Less(t, tablewrite.TSBatch(ms, "zzzz"), cloudread.SortKeyBound(ms+1, ""), "and above the millisecond before")
	}
}

const hw, boot = "AA:BB:CC:00:18:01", "7c9e6679-7425-40de-944b-e07fc1f90ae7"

// write stores one batch of hw, a reading (temp_c = its index) at each
// timestamp, with quality scores when scored.
func write(t *testing.T, db tablewrite.DB, tables cloud.Tables, scored bool, ms ...int64) {
	t.Helper()
	b := &contract.Batch{HardwareID: hw, BootID: boot, FirmwareVersion: "1.0.16",
		BatchID: fmt.Sprintf("%s_%s_%d_%d", hw, boot, ms[0], ms[len(ms)-1])}
	var q []float64
	for i, m := range ms {
		b.Readings = append(b.Readings, contract.Reading{TimestampMS: m, Sensors: map[string]float64{"temp_c": float64(i), "rh_pct": 50},
			SensorStatus: map[string]string{}})
		q = append(q, 0.5)
	}
	if !scored {
		q = nil
	}
	res := tablewrite.New(db, tables, tablewrite.Options{}).Write(context.Background(),
		tablewrite.Build(tablewrite.Batch{Batch: b, ReceivedAt: time.Now(), Hash: b.IdentityHash(), Quality: q}, 90*24*time.Hour, time.Now()), 10)
	require.Equal(t, tablewrite.Delivered, res.Outcome, "%v", res.Err)
}

func TestReadsKeepToTheWindowAndStopAtThePage(t *testing.T) {
	local := dynamotest.Shared(t)
	db, tables := local.Client(t), local.NewTables(t)
	from := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	to := from.Add(time.Hour)
	f, e := from.UnixMilli(), to.UnixMilli()
	write(t, db, tables, true, f-1, f, f+1000, e-1, e)
	var mid []int64
	for i := range 50 {
		mid = append(mid, f+60_000+int64(i)*1000)
	}
	write(t, db, tables, false, mid...)
	r := cloudread.New(db, tables)
	win := url.Values{"from": {strconv.FormatInt(f, 10)}, "to": {strconv.FormatInt(e, 10)}}

	sq, err := readquery.ParseSummaryQuery(url.Values{"from": win["from"], "to": win["to"], "granularity": {"hour"}}, time.Now())
	require.NoError(t, err)
	s, st, err := r.Summary(context.Background(), hw, sq)
	require.NoError(t, err)
	require.EqualValues(t, 53, s.Totals["temp_c"].Count, "from is in the window, to is not")
	require.Equal(t, 53, st.Items, "nothing outside the window is read")
	require.Positive(t, st.ReadCapacity)

	rq, err := readquery.ParseReadingsQuery(url.Values{"from": win["from"], "to": win["to"], "limit": {"5"}}, time.Now())
	require.NoError(t, err)
	page, st, err := r.Readings(context.Background(), hw, rq)
	require.NoError(t, err)
	require.Equal(t, 5, page.Count)
	require.Equal(t, f, page.Readings[0].TimestampMS)
	require.Equal(t, 0.5, page.Readings[0].QualityScore, "the stored score")
	require.Equal(t, 1, st.Requests)
	require.LessOrEqual(t, st.Items, 6, "a page reads at most limit+1 items")

	// Page on: every value once, the stored scores where stored and a
	// computed one elsewhere, and the cursor reads from its own reading on.
	seen := map[string]bool{}
	for page.Truncated {
		for _, row := range page.Readings {
			k := fmt.Sprint(row.TimestampMS, row.Sensor)
			require.False(t, seen[k], k)
			seen[k] = true
			require.GreaterOrEqual(t, row.QualityScore, 0.0)
			require.LessOrEqual(t, row.QualityScore, 1.0)
		}
		v := url.Values{"from": win["from"], "to": win["to"], "limit": {"5"}, "cursor": {page.NextCursor}}
		rq, err = readquery.ParseReadingsQuery(v, time.Now())
		require.NoError(t, err)
		page, st, err = r.Readings(context.Background(), hw, rq)
		require.NoError(t, err)
		require.LessOrEqual(t, st.Items, 7, "from the cursor's reading on")
	}
	for _, row := range page.Readings {
		seen[fmt.Sprint(row.TimestampMS, row.Sensor)] = true
	}
	require.Len(t, seen, 2*53)
}

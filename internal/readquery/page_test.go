package readquery

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

// readingsOf returns n readings of two sensors, a second apart from t0, in
// batches of 4, with their batch_ids.
func readingsOf(t0 int64, n int) ([]contract.Reading, []string) {
	var rs []contract.Reading
	var ids []string
	for i := range n {
		rs = append(rs, contract.Reading{TimestampMS: t0 + int64(i)*1000,
			Sensors: map[string]float64{"temp_c": 20 + float64(i%5), "rh_pct": 50}})
		ids = append(ids, fmt.Sprintf("b%03d", i/4))
	}
	return rs, ids
}

// pages runs the query through every page, adding the readings in the
// order order gives, and returns the rows.
func pages(t *testing.T, v url.Values, rs []contract.Reading, ids []string, order func([]int), stopWhenFull bool) []LocalReading {
	t.Helper()
	var rows []LocalReading
	for n := 0; ; n++ {
		require.Less(t, n, 1000)
		q, err := ParseReadingsQuery(v, time.Now())
		require.NoError(t, err)
		p := q.Pager()
		idx := make([]int, len(rs))
		for i := range idx {
			idx[i] = i
		}
		order(idx)
		for _, i := range idx {
			if p.Add(ids[i], &rs[i], StateDelivered, nil) && stopWhenFull {
				break
			}
		}
		page := p.Page("AA:BB:CC:DD:EE:FF")
		rows = append(rows, page.Readings...)
		if !page.Truncated {
			return rows
		}
		v.Set("cursor", page.NextCursor)
	}
}

func TestPagerGivesTheSamePagesInAnyOrder(t *testing.T) {
	t0 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
	rs, ids := readingsOf(t0, 101)
	win := func() url.Values {
		return url.Values{"from": {fmt.Sprint(t0)}, "to": {fmt.Sprint(t0 + 101_000)}, "limit": {"7"}}
	}
	inOrder := pages(t, win(), rs, ids, func([]int) {}, true)
	require.Len(t, inOrder, 202)
	for i := 1; i < len(inOrder); i++ {
		a, b := inOrder[i-1], inOrder[i]
		require.True(t, a.TimestampMS < b.TimestampMS || (a.TimestampMS == b.TimestampMS && a.Sensor < b.Sensor), "row %d in order", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	shuffled := pages(t, win(), rs, ids, func(idx []int) { rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] }) }, false)
	require.Equal(t, inOrder, shuffled, "a caller that stops when full gets what one that reads everything gets")

	one := url.Values{"from": {fmt.Sprint(t0)}, "to": {fmt.Sprint(t0 + 101_000)}, "limit": {"1000"}}
	whole := pages(t, one, rs, ids, func([]int) {}, true)
	require.Equal(t, whole, inOrder, "pages score as one large page")
}

func TestPagerShowsStoredScores(t *testing.T) {
	rs, ids := readingsOf(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).UnixMilli(), 3)
	q, err := ParseReadingsQuery(url.Values{"from": {fmt.Sprint(rs[0].TimestampMS)}, "to": {fmt.Sprint(rs[2].TimestampMS + 1)}}, time.Now())
	require.NoError(t, err)
	p := q.Pager()
	stored := 0.25
	p.Add(ids[0], &rs[0], StateDelivered, &stored)
	p.Add(ids[1], &rs[1], StatePending, nil)
	page := p.Page("AA:BB:CC:DD:EE:FF")
	require.Equal(t, 4, page.Count)
	require.Equal(t, 0.25, page.Readings[0].QualityScore)
	require.True(t, page.Readings[0].Delivered)
	require.False(t, page.Readings[2].Delivered)
	require.Equal(t, StatePending, page.Readings[2].State)
	require.Equal(t, "%", page.Readings[0].Unit)
}

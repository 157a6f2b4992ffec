package readquery

import (
	"slices"
	"sort"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/firmware-contract/quality"
)

// The readings query shows each reading's quality score (package quality).
// A reading whose score was stored with it (the cloud's quality_score) shows
// that one; any other is scored over the sequence the query returns: the
// readings of the window [from, to) in the query's order (time, then
// batch_id), each against the values of the readings before it in that
// sequence. Pages of one query give the same scores as one large page: a
// page's readings are scored after the values that the readings on earlier
// pages leave in the scorer's history (the last quality.HistoryLen of each
// sensor), which are collected in the same pass over the window, so memory
// stays bounded by the page.

// readingID orders whole readings: time, then batch.
type readingID struct {
	ms    int64
	batch string
}

func (a readingID) compare(b readingID) int {
	return readingKey{ms: a.ms, batch: a.batch}.compare(readingKey{ms: b.ms, batch: b.batch})
}

// scoredReading is a reading with a row on the page; every row of it carries
// its score.
type scoredReading struct {
	id      readingID
	reading contract.Reading
	score   float64
}

// keyedValue is one sensor value of a reading before the page.
type keyedValue struct {
	id readingID
	v  float64
}

// pageScorer scores the readings of one page of a readings query.
type pageScorer struct {
	after *readingKey
	// before holds, per sensor, the last quality.HistoryLen values of the
	// readings wholly before the page, oldest first.
	before map[string][]keyedValue
}

func newPageScorer(after *readingKey) *pageScorer {
	return &pageScorer{after: after, before: map[string][]keyedValue{}}
}

// observe sees one reading of the window. A reading with no row after the
// cursor only feeds the history; any other one is returned for its rows to
// point at (nil for the first kind).
func (s *pageScorer) observe(batch string, rd *contract.Reading) *scoredReading {
	id := readingID{ms: rd.TimestampMS, batch: batch}
	if s.after == nil || !s.whollyBefore(id, rd) {
		return &scoredReading{id: id, reading: *rd}
	}
	for name, v := range rd.Sensors {
		s.remember(name, keyedValue{id: id, v: v})
	}
	return nil
}

// whollyBefore reports whether every row of the reading is at or before the
// cursor.
func (s *pageScorer) whollyBefore(id readingID, rd *contract.Reading) bool {
	for name := range rd.Sensors {
		if (readingKey{ms: id.ms, batch: id.batch, sensor: name}).compare(*s.after) > 0 {
			return false
		}
	}
	return true
}

func (s *pageScorer) remember(name string, kv keyedValue) {
	vs := s.before[name]
	i := sort.Search(len(vs), func(i int) bool { return vs[i].id.compare(kv.id) > 0 })
	if len(vs) == quality.HistoryLen && i == 0 {
		return // older than every value kept
	}
	vs = slices.Insert(vs, i, kv)
	if len(vs) > quality.HistoryLen {
		vs = vs[1:]
	}
	s.before[name] = vs
}

// score sets the score of the page's readings, given in page order (each
// once): the values before the page, as single-sensor readings in query
// order, then the page's readings go through quality.ScoreSequence.
func (s *pageScorer) score(page []*scoredReading) {
	type priorValue struct {
		name string
		kv   keyedValue
	}
	var prior []priorValue
	for name, vs := range s.before {
		for _, kv := range vs {
			prior = append(prior, priorValue{name: name, kv: kv})
		}
	}
	// Values of one sensor never share a reading, so how values of the same
	// reading are ordered among themselves does not matter.
	slices.SortFunc(prior, func(a, b priorValue) int { return a.kv.id.compare(b.kv.id) })
	seq := make([]contract.Reading, 0, len(prior)+len(page))
	for _, p := range prior {
		seq = append(seq, contract.Reading{Sensors: map[string]float64{p.name: p.kv.v}})
	}
	for _, sr := range page {
		seq = append(seq, sr.reading)
	}
	scores := quality.ScoreSequence(seq)[len(prior):]
	for i, sr := range page {
		sr.score = scores[i]
	}
}

package auth

import (
	"time"
)

// tokenBucket allows rate events a second on average and bursts of twice
// as many. It is not safe for concurrent use: its owner serializes take.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func newTokenBucket(rate float64) *tokenBucket {
	return &tokenBucket{rate: rate, burst: 2 * rate, tokens: 2 * rate}
}

// take spends a token at now and reports whether there was one.
func (b *tokenBucket) take(now time.Time) bool {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

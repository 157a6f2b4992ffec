package cloud

import "time"

// SetClock replaces the clock Keys uses for created_at, so tests can order keys.
func SetClock(k *Keys, now func() time.Time) {
	k.now = now
}

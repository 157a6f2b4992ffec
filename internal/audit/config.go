package audit

import (
	"errors"
	"fmt"
	"time"
)

// Config bounds the audit trail.
type Config struct {
	// Retention is how long records are kept. Segments are deleted whole,
	// once the UTC day they cover ended more than Retention ago, so a
	// record is kept between Retention and Retention plus one day.
	// Default 168h (7 days).
	Retention time.Duration `yaml:"retention"`
	// MaxBytes caps the total size of the segments on disk; the oldest
	// segments are deleted first to stay under it. Default 67108864
	// (64 MiB).
	MaxBytes int64 `yaml:"max_bytes"`
	// SegmentBytes is the size at which a segment is closed and the next
	// one started (segments also change with the UTC day). At most half of
	// MaxBytes. Default 4194304 (4 MiB).
	SegmentBytes int64 `yaml:"segment_bytes"`
	// QueueRecords is how many records may wait for the writer; beyond
	// it records are dropped and counted, never waited for. Default 2048.
	QueueRecords int `yaml:"queue_records"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Retention: 7 * 24 * time.Hour, MaxBytes: 64 << 20, SegmentBytes: 4 << 20, QueueRecords: 2048}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Retention == 0 {
		c.Retention = d.Retention
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = d.MaxBytes
	}
	if c.SegmentBytes == 0 {
		c.SegmentBytes = min(d.SegmentBytes, c.MaxBytes/2)
	}
	if c.QueueRecords == 0 {
		c.QueueRecords = d.QueueRecords
	}
	return c
}

// Bounds of the settings.
const (
	minSegmentBytes = 4 << 10
	maxQueueRecords = 1 << 20
)

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	switch {
	case c.Retention < 0:
		return errors.New("audit.retention: must not be negative")
	case c.Retention != 0 && c.Retention < time.Hour:
		return errors.New("audit.retention: must be at least 1h")
	case c.MaxBytes < 0:
		return errors.New("audit.max_bytes: must not be negative")
	case c.MaxBytes != 0 && c.MaxBytes < 2*minSegmentBytes:
		return fmt.Errorf("audit.max_bytes: must be at least %d bytes", 2*minSegmentBytes)
	case c.SegmentBytes < 0:
		return errors.New("audit.segment_bytes: must not be negative")
	case c.SegmentBytes != 0 && c.SegmentBytes < minSegmentBytes:
		return fmt.Errorf("audit.segment_bytes: must be at least %d bytes", minSegmentBytes)
	case c.QueueRecords < 0 || c.QueueRecords > maxQueueRecords:
		return fmt.Errorf("audit.queue_records: must be between 1 and %d", maxQueueRecords)
	}
	if w := c.withDefaults(); w.SegmentBytes > w.MaxBytes/2 {
		return fmt.Errorf("audit.segment_bytes: %d is over half of audit.max_bytes (%d)", w.SegmentBytes, w.MaxBytes)
	}
	return nil
}

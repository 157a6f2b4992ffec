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
	// MaxBytes caps the total size of the segments on disk, the audit
	// trail's share of the data directory; the oldest segments are deleted
	// first to stay under it. Default 16777216 (16 MiB), a sixteenth of
	// the default buffer.min_free_bytes.
	MaxBytes int64 `yaml:"max_bytes"`
	// SegmentBytes is the size at which a segment is closed and the next
	// one started (segments also change with the UTC day). At most half of
	// MaxBytes. Default 4194304 (4 MiB).
	SegmentBytes int64 `yaml:"segment_bytes"`
	// QueueRecords is how many records may wait for the writer; beyond
	// it records are dropped and counted, never waited for. Default 2048.
	QueueRecords int `yaml:"queue_records"`
	// MaxRecordsPerSecond and BurstRecords bound the records written one
	// by one (a token bucket); beyond them attempts are counted per
	// reason, transport, kind, source and hardware_id, and written as
	// aggregates once per AggregateInterval. Defaults 20 and 200.
	MaxRecordsPerSecond int `yaml:"max_records_per_second"`
	BurstRecords        int `yaml:"burst_records"`
	// AggregateInterval is how often aggregates are written. Default 10s.
	AggregateInterval time.Duration `yaml:"aggregate_interval"`
	// MaxAggregateKeys bounds the distinct keys counted in one interval;
	// the attempts of further keys are counted per reason, transport and
	// kind with source "other". Default 256.
	MaxAggregateKeys int `yaml:"max_aggregate_keys"`
	// MinFreeBytes is the free space of the directory's file system under
	// which nothing is written: records are dropped and counted
	// (gateway_audit_dropped_records_total{cause="free_space"}). The gateway
	// sets it with KeepFree; 0 means no floor.
	MinFreeBytes int64 `yaml:"-"`
}

// FreeMargin is what KeepFree adds to the buffer's watermark: far more
// than the audit trail writes between two looks at the free space (its
// 64 KiB write buffer), so the trail never takes the buffer under its
// watermark, and room left for devices' batches once the trail stopped.
const FreeMargin = 4 << 20

// KeepFree returns c with MinFreeBytes set to keep watermark
// (buffer.min_free_bytes, defaults applied) intact: watermark plus
// FreeMargin.
func (c Config) KeepFree(watermark int64) Config {
	c.MinFreeBytes = watermark + FreeMargin
	return c
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Retention: 7 * 24 * time.Hour, MaxBytes: 16 << 20, SegmentBytes: 4 << 20, QueueRecords: 2048,
		MaxRecordsPerSecond: 20, BurstRecords: 200, AggregateInterval: 10 * time.Second, MaxAggregateKeys: 256}
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
	if c.MaxRecordsPerSecond == 0 {
		c.MaxRecordsPerSecond = d.MaxRecordsPerSecond
	}
	if c.BurstRecords == 0 {
		c.BurstRecords = d.BurstRecords
	}
	if c.AggregateInterval == 0 {
		c.AggregateInterval = d.AggregateInterval
	}
	if c.MaxAggregateKeys == 0 {
		c.MaxAggregateKeys = d.MaxAggregateKeys
	}
	return c
}

// Bounds of the settings.
const (
	minSegmentBytes = 4 << 10
	maxQueueRecords = 1 << 20
	maxRate         = 1_000_000
	maxAggKeys      = 65536
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
	case c.MaxRecordsPerSecond < 0 || c.MaxRecordsPerSecond > maxRate:
		return fmt.Errorf("audit.max_records_per_second: must be between 1 and %d", maxRate)
	case c.BurstRecords < 0 || c.BurstRecords > maxRate:
		return fmt.Errorf("audit.burst_records: must be between 1 and %d", maxRate)
	case c.AggregateInterval < 0 || (c.AggregateInterval != 0 && c.AggregateInterval < time.Second) ||
		c.AggregateInterval > time.Hour:
		return errors.New("audit.aggregate_interval: must be between 1s and 1h")
	case c.MaxAggregateKeys < 0 || c.MaxAggregateKeys > maxAggKeys:
		return fmt.Errorf("audit.max_aggregate_keys: must be between 1 and %d", maxAggKeys)
	case c.MinFreeBytes < 0:
		return errors.New("audit: the free-space floor must not be negative")
	}
	if w := c.withDefaults(); w.SegmentBytes > w.MaxBytes/2 {
		return fmt.Errorf("audit.segment_bytes: %d is over half of audit.max_bytes (%d)", w.SegmentBytes, w.MaxBytes)
	}
	return nil
}

package buffer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// cleanRecordName is the file Close leaves after a clean shutdown.
const cleanRecordName = "GATEWAY-CLEAN-SHUTDOWN"

// cleanRecord is what a cleanly closed buffer held. The next Open compares
// it with what it reads: after a clean close nothing may differ, so a
// difference is files lost or damaged while the gateway was stopped.
type cleanRecord struct {
	Seq              uint64 `json:"seq"`
	PendingBatches   int64  `json:"pending_batches"`
	DeliveredMarkers int64  `json:"delivered_markers"`
	DeadBatches      int64  `json:"dead_batches"`
	StateRecords     int64  `json:"state_records"`
	// HistoryBatches is absent (0) in records written before the history
	// existed, when there was none.
	HistoryBatches int64 `json:"history_batches"`
}

func (b *Buffer) cleanRecord() cleanRecord {
	return cleanRecord{
		Seq: b.nextSeq, PendingBatches: b.pendingBatches.Load(),
		DeliveredMarkers: b.usage.deliveredMarkers.Load(), DeadBatches: b.usage.deadBatches.Load(),
		StateRecords: b.usage.stateRecords.Load(), HistoryBatches: b.usage.historyBatches.Load(),
	}
}

func (want cleanRecord) matches(got cleanRecord) error {
	// The sequence counter may run ahead of what is on disk (a failed
	// group consumes numbers), never behind.
	if got.Seq > want.Seq || got.PendingBatches != want.PendingBatches ||
		got.DeliveredMarkers != want.DeliveredMarkers || got.DeadBatches != want.DeadBatches ||
		got.StateRecords != want.StateRecords || got.HistoryBatches != want.HistoryBatches {
		return fmt.Errorf("it was closed cleanly holding %d pending batches, %d delivered markers, %d dead "+
			"letters, %d state records and %d history records, but holds %d, %d, %d, %d and %d: files were "+
			"lost or damaged while the gateway was stopped", want.PendingBatches, want.DeliveredMarkers,
			want.DeadBatches, want.StateRecords, want.HistoryBatches, got.PendingBatches, got.DeliveredMarkers,
			got.DeadBatches, got.StateRecords, got.HistoryBatches)
	}
	return nil
}

func readCleanRecord(dir string) (*cleanRecord, error) {
	raw, err := os.ReadFile(filepath.Join(dir, cleanRecordName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r cleanRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", cleanRecordName, err)
	}
	return &r, nil
}

// writeCleanRecord writes the record durably: temporary file, fsync,
// rename, directory fsync.
func writeCleanRecord(dir string, r cleanRecord) error {
	raw, _ := json.Marshal(r)
	tmp := filepath.Join(dir, cleanRecordName+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("writing the clean-shutdown record: %w", err)
	}
	_, err = f.Write(append(raw, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, cleanRecordName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("writing the clean-shutdown record: %w", err)
	}
	return nil
}

// removeCleanRecord removes the record once the data matched it: a crash
// from now on leaves none.
func removeCleanRecord(dir string) error {
	err := os.Remove(filepath.Join(dir, cleanRecordName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("removing the clean-shutdown record: %w", err)
	}
	return nil
}

package devicesim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// ReportLine is one line of the report file: one batch that received a final answer from the
// gateway. Batches still unconfirmed when the simulator stopped, and batches dropped from a
// full offline buffer, have no line.
type ReportLine struct {
	// BatchID, HardwareID, BootID and Seq identify the batch as sent. BootID is the boot that
	// built the batch, which is not the device's current boot for a batch kept across a
	// reboot.
	BatchID    string `json:"batch_id"`
	HardwareID string `json:"hardware_id"`
	BootID     string `json:"boot_id"`
	Seq        uint64 `json:"seq"`
	// Status is the final answer: "accepted", "duplicate" or "rejected".
	Status string `json:"status"`
	// Reason and Message come with "rejected": the contract's reason ("validation_error",
	// "clock_not_synced", "conflict"), or "http_<code>" for an HTTP error without a result.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Readings is the number of readings in the batch; FirstTimestampMS and LastTimestampMS
	// are the timestamp_ms of its first and last reading.
	Readings         int   `json:"readings"`
	FirstTimestampMS int64 `json:"first_timestamp_ms"`
	LastTimestampMS  int64 `json:"last_timestamp_ms"`
	// Attempts is the number of times the batch was sent.
	Attempts int `json:"attempts"`
}

// ReadReport decodes a report file written by the simulator.
func ReadReport(r io.Reader) ([]ReportLine, error) {
	var lines []ReportLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var l ReportLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("devicesim: report line %d: %w", n, err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("devicesim: reading report: %w", err)
	}
	return lines, nil
}

// reportWriter appends report lines to a file, one write per line, for all devices.
// A nil *reportWriter discards lines.
type reportWriter struct {
	mu   sync.Mutex
	f    *os.File
	enc  *json.Encoder
	err  error // first write error
	done bool
}

func createReport(path string) (*reportWriter, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("devicesim: creating report: %w", err)
	}
	return &reportWriter{f: f, enc: json.NewEncoder(f)}, nil
}

func (r *reportWriter) write(l ReportLine) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || r.err != nil {
		return
	}
	if err := r.enc.Encode(l); err != nil {
		r.err = fmt.Errorf("devicesim: writing report: %w", err)
	}
}

// close syncs and closes the file and returns the first error of the report's life.
// It is idempotent.
func (r *reportWriter) close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return r.err
	}
	r.done = true
	if err := r.f.Sync(); err != nil {
		r.err = errors.Join(r.err, fmt.Errorf("devicesim: syncing report: %w", err))
	}
	if err := r.f.Close(); err != nil {
		r.err = errors.Join(r.err, fmt.Errorf("devicesim: closing report: %w", err))
	}
	return r.err
}

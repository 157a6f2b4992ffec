package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"greenhouse-gateway/buffer"
)

// envDataDir is gatewayd's data_dir setting, read as the default of
// --data-dir.
const envDataDir = "GATEWAY_DATA_DIR"

// inUseMessage is what the offline commands say when a gatewayd holds the
// directory.
const inUseMessage = "the buffer is in use by a running gatewayd; stop it or use gatewayctl status"

func registerDataDir(fs *flag.FlagSet, getenv func(string) string) *string {
	return fs.String("data-dir", getenv(envDataDir),
		"gatewayd's data directory (its data_dir; env "+envDataDir+"); gatewayd must be stopped")
}

// bufferError turns the buffer's open errors into operator advice.
func bufferError(err error, hint string) error {
	if errors.Is(err, buffer.ErrInUse) {
		return errors.New(inUseMessage + hint)
	}
	return err
}

// openSnapshot opens the data directory read-only and reports how.
func openSnapshot(env *cmdEnv, dir string) (*buffer.Snapshot, error) {
	if dir == "" {
		return nil, usageError{msg: "--data-dir: missing (gatewayd's data_dir, e.g. /var/lib/greenhouse-gateway)"}
	}
	s, err := buffer.OpenSnapshot(dir, slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return nil, bufferError(err, "")
	}
	if s.Note != "" {
		fmt.Fprintf(env.stderr, "note: %s\n", s.Note)
	}
	return s, nil
}

func setupBufferInspect(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	dir := registerDataDir(fs, getenv)
	top := fs.Int("top", 10, "how many devices with the most pending batches to list")
	deadLimit := fs.Int("dead-letters", 50, "how many dead letters to list")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		if *top < 1 || *deadLimit < 1 {
			return usageError{msg: "--top and --dead-letters must be at least 1"}
		}
		s, err := openSnapshot(env, *dir)
		if err != nil {
			return err
		}
		in, err := s.Inspect(*top, *deadLimit)
		if cerr := s.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return printIndentedJSON(env.stdout, in)
		}
		return printInspection(env.stdout, in)
	}
}

func printInspection(w io.Writer, in buffer.Inspection) error {
	clean := "no (crashed or killed; the torn tail of a write-ahead log is normal)"
	if in.CleanShutdown {
		clean = "yes"
	}
	fmt.Fprintf(w, "buffer at %s\n", in.Dir)
	fmt.Fprintln(w, "integrity: the checks gatewayd runs at start passed")
	fmt.Fprintf(w, "clean shutdown: %s\n", clean)
	fmt.Fprintf(w, "pending: %d batches, %s", in.PendingBatches, fmtBytes(in.PendingBytes))
	if in.PendingBatches > 0 {
		fmt.Fprintf(w, "; oldest received %s, newest %s", fmtTime(in.OldestPending), fmtTime(in.NewestPending))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if in.DeviceCount > 0 {
		fmt.Fprintf(w, "pending by device (%d devices, top %d):\n", in.DeviceCount, len(in.Devices))
		for _, d := range in.Devices {
			fmt.Fprintf(tw, "  %s\t%d batches\t%s\n", d.HardwareID, d.Batches, fmtBytes(d.Bytes))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "delivered markers kept: %d", in.DeliveredMarkers)
	if !in.OldestDelivery.IsZero() {
		fmt.Fprintf(w, " (oldest delivery %s)", fmtTime(in.OldestDelivery))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "dead letters: %d\n", in.DeadBatches)
	if len(in.DeadLetters) > 0 {
		printDeadLetters(tw, in.DeadLetters)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "state records: %d\n", len(in.StateRecords))
	for _, r := range in.StateRecords {
		fmt.Fprintf(tw, "  %s\t%s\n", r.Name, fmtBytes(int64(r.Bytes)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	u := in.Usage
	fmt.Fprintf(w, "budget use (what buffer.max_pending_bytes counts): %s: pending %s, delivered %s, dead %s, state %s, history %s (%d batches)\n",
		fmtBytes(u.Total()), fmtBytes(u.Pending), fmtBytes(u.Delivered), fmtBytes(u.Dead), fmtBytes(u.State),
		fmtBytes(u.History), u.HistoryBatches)
	var files int64
	for _, n := range in.Files {
		files += n
	}
	fmt.Fprintf(w, "files on disk: %s: tables %s, value log %s, write-ahead logs %s, other %s\n", fmtBytes(files),
		fmtBytes(in.Files["tables"]), fmtBytes(in.Files["value_log"]), fmtBytes(in.Files["write_ahead_log"]), fmtBytes(in.Files["other"]))
	return nil
}

func printDeadLetters(tw *tabwriter.Writer, list []buffer.DeadLetter) {
	fmt.Fprintln(tw, "  BATCH_ID\tHARDWARE_ID\tRECEIVED_AT\tDEAD_LETTERED_AT\tBYTES\tREASON")
	for _, d := range list {
		reason := oneLine(d.Reason)
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\n", d.BatchID, d.HardwareID, fmtTime(d.ReceivedAt),
			fmtTime(d.DeadLetteredAt), d.PayloadBytes, reason)
	}
}

// exportLine is one line of buffer export.
type exportLine struct {
	BatchID        string          `json:"batch_id"`
	HardwareID     string          `json:"hardware_id"`
	ReceivedAt     time.Time       `json:"received_at"`
	State          string          `json:"state"`
	Seq            uint64          `json:"seq,omitempty"`
	DeadLetteredAt time.Time       `json:"dead_lettered_at,omitzero"`
	Reason         string          `json:"reason,omitempty"`
	Payload        json.RawMessage `json:"payload"`
}

func setupBufferExport(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	dir := registerDataDir(fs, getenv)
	what := fs.String("what", buffer.StateAll, "which batches: pending, dead or all")
	hw := fs.String("hardware-id", "", "only this device's batches")
	out := fs.String("out", "", "write to this file (created, not overwritten) instead of stdout")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		switch *what {
		case buffer.StatePending, buffer.StateDead, buffer.StateAll:
		default:
			return usageError{msg: fmt.Sprintf("--what: %q is not one of pending, dead, all", *what)}
		}
		s, err := openSnapshot(env, *dir)
		if err != nil {
			return err
		}
		w, dest := env.stdout, "stdout"
		var f *os.File
		if *out != "" {
			f, err = os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return errors.Join(fmt.Errorf("--out: %w", err), s.Close())
			}
			w, dest = f, *out
		}
		n, err := exportBatches(ctx, s, *what, *hw, w)
		if cerr := s.Close(); err == nil {
			err = cerr
		}
		if f != nil {
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				_ = os.Remove(*out)
			}
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(env.stderr, "exported %d batches to %s\n", n, dest)
		return nil
	}
}

// exportBatches writes one JSON line per batch, streaming: one batch in
// memory at a time.
func exportBatches(ctx context.Context, s *buffer.Snapshot, what, hw string, w io.Writer) (int, error) {
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	n := 0
	err := s.Batches(what, hw, func(b buffer.Batch) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		line := exportLine{BatchID: b.BatchID, HardwareID: b.HardwareID, ReceivedAt: b.ReceivedAt.UTC(),
			State: b.State, Seq: b.Seq, Reason: b.Reason, Payload: b.Payload}
		if !b.DeadLetteredAt.IsZero() {
			line.DeadLetteredAt = b.DeadLetteredAt.UTC()
		}
		if err := enc.Encode(line); err != nil {
			return fmt.Errorf("batch %s: %w", b.BatchID, err)
		}
		n++
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("exporting: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return n, fmt.Errorf("exporting: %w", err)
	}
	return n, nil
}

// target is where a dead-letter command acts: a stopped gateway's data
// directory or a running gateway's operator API.
type target struct {
	dir *string
	api apiFlags
}

func registerTarget(fs *flag.FlagSet, getenv func(string) string) target {
	return target{dir: registerDataDir(fs, getenv), api: registerAPIFlags(fs, getenv, "")}
}

// online reports whether to use the operator API; exactly one of
// --data-dir and --url must be given (GATEWAY_DATA_DIR is ignored when
// --url is).
func (t target) online(fs *flag.FlagSet) (bool, error) {
	dirSet := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "data-dir" {
			dirSet = true
		}
	})
	switch {
	case *t.api.url != "" && dirSet:
		return false, usageError{msg: "give --data-dir (gatewayd stopped) or --url (gatewayd running), not both"}
	case *t.api.url != "":
		return true, nil
	case *t.dir != "":
		return false, nil
	}
	return false, usageError{msg: "give --data-dir DIR (gatewayd stopped) or --url URL (gatewayd running)"}
}

func setupBufferDeadLetters(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	t := registerTarget(fs, getenv)
	limit := fs.Int("limit", 100, "how many dead letters to list (at most 1000 with --url)")
	asJSON := fs.Bool("json", false, "print them as JSON")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		online, err := t.online(fs)
		if err != nil {
			return err
		}
		if *limit < 1 {
			return usageError{msg: "--limit must be at least 1"}
		}
		var list struct {
			Count       int                 `json:"count"`
			DeadLetters []buffer.DeadLetter `json:"dead_letters"`
		}
		if online {
			c, err := t.api.client(env)
			if err != nil {
				return err
			}
			if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/dead-letters?limit=%d", min(*limit, 1000)), true, &list); err != nil {
				return apiAdvice(err, c)
			}
		} else {
			s, err := openSnapshot(env, *t.dir)
			if err != nil {
				return err
			}
			list.DeadLetters, list.Count, err = s.DeadLetters(*limit)
			if cerr := s.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		if list.DeadLetters == nil {
			list.DeadLetters = []buffer.DeadLetter{}
		}
		if *asJSON {
			return printIndentedJSON(env.stdout, list)
		}
		fmt.Fprintf(env.stdout, "dead letters: %d\n", list.Count)
		if len(list.DeadLetters) == 0 {
			return nil
		}
		tw := tabwriter.NewWriter(env.stdout, 0, 8, 2, ' ', 0)
		printDeadLetters(tw, list.DeadLetters)
		return tw.Flush()
	}
}

func setupBufferReforward(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	t := registerTarget(fs, getenv)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		online, err := t.online(fs)
		if err != nil {
			return err
		}
		id := pos[0]
		if online {
			c, err := t.api.client(env)
			if err != nil {
				return err
			}
			var done struct {
				BatchID    string `json:"batch_id"`
				HardwareID string `json:"hardware_id"`
				Seq        uint64 `json:"seq"`
			}
			if err := c.do(ctx, http.MethodPost, "/v1/dead-letters/"+url.PathEscape(id)+"/reforward", true, &done); err != nil {
				return apiAdvice(err, c)
			}
			fmt.Fprintf(env.stdout, "re-forwarded %s (hardware_id %s): queued again at position %d, after every batch already queued; "+
				"the uplink forwards it now\n", done.BatchID, done.HardwareID, done.Seq)
			return nil
		}
		return reforwardOffline(env, *t.dir, id)
	}
}

func reforwardOffline(env *cmdEnv, dir, id string) error {
	if _, err := os.Stat(filepath.Join(dir, "MANIFEST")); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no buffer at %s (no MANIFEST file): check --data-dir", dir)
	}
	logger := slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := buffer.Open(dir, buffer.Options{MemTableSize: buffer.MemTableSizeOf(dir)}, logger, nil)
	if err != nil {
		return bufferError(err, " (or use --url to re-forward through it)")
	}
	p, err := b.Reforward(id)
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, buffer.ErrNotFound):
		return fmt.Errorf("no batch %s in the buffer at %s (unknown, or delivered and its marker collected)", id, dir)
	case errors.Is(err, buffer.ErrNotDeadLettered):
		return fmt.Errorf("refusing: %s", strings.TrimPrefix(err.Error(), buffer.ErrNotDeadLettered.Error()+": "))
	case err != nil:
		return err
	}
	fmt.Fprintf(env.stdout, "re-forwarded %s (hardware_id %s): queued again at position %d, after every batch already queued; "+
		"gatewayd forwards it when it starts\n", p.BatchID, p.HardwareID, p.Seq)
	return nil
}

// apiAdvice rewords the operator API's refusals of dead-letter requests.
func apiAdvice(err error, c *apiClient) error {
	var aerr *apiError
	switch {
	case errors.Is(err, errNotAvailable):
		return fmt.Errorf("gatewayd at %s has no dead-letter API (an older gatewayd): stop it and use --data-dir", c.base)
	case errors.As(err, &aerr) && (aerr.code == http.StatusNotFound || aerr.code == http.StatusConflict):
		return fmt.Errorf("refusing: %s", strings.TrimPrefix(aerr.msg, buffer.ErrNotDeadLettered.Error()+": "))
	}
	return err
}

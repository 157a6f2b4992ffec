package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"greenhouse-gateway/buffer"
)

func setupBufferSalvage(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	dir := registerDataDir(fs, getenv)
	out := fs.String("out", "", "the new buffer's directory (must not exist or be empty)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		if *dir == "" {
			return usageError{msg: "--data-dir: missing (the damaged buffer's directory)"}
		}
		if *out == "" {
			return usageError{msg: "--out: missing (a new directory for the salvaged buffer)"}
		}
		logger := slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		rep, err := buffer.Salvage(ctx, *dir, *out, logger)
		if err != nil {
			return bufferError(err, "")
		}
		if *asJSON {
			return printIndentedJSON(env.stdout, rep)
		}
		printSalvage(env.stdout, rep)
		return nil
	}
}

func printSalvage(w io.Writer, rep buffer.SalvageReport) {
	fmt.Fprintf(w, "salvaged %s into %s (%s was only read)\n", rep.Dir, rep.Out, rep.Dir)
	fmt.Fprintf(w, "read: %d tables (%d blocks), %d write-ahead logs\n", rep.Tables, rep.Blocks, rep.Logs)
	fmt.Fprintf(w, "recovered: %d pending batches, %d dead letters, %d state records\n",
		rep.PendingBatches, rep.DeadLetters, rep.StateRecords)
	if rep.DeliveredSkipped > 0 || rep.Duplicates > 0 {
		fmt.Fprintf(w, "left out: %d queue entries of batches delivered or dead-lettered since, %d older copies of a batch\n",
			rep.DeliveredSkipped, rep.Duplicates)
	}
	if rep.LostCount > 0 {
		fmt.Fprintf(w, "lost: %d pending batches whose marker was read but not their queue entry:", rep.LostCount)
		for _, id := range rep.LostBatches {
			fmt.Fprintf(w, " %s", id)
		}
		fmt.Fprintln(w)
	}
	if len(rep.Skipped) == 0 {
		fmt.Fprintln(w, "skipped: nothing")
	} else {
		fmt.Fprintf(w, "skipped (%d parts; pending batches in them are lost unless another file held them):\n", len(rep.Skipped))
		for _, s := range rep.Skipped {
			switch {
			case s.Block >= 0:
				fmt.Fprintf(w, "  %s block %d: %s\n", s.File, s.Block, s.Reason)
			case s.Bytes > 0:
				fmt.Fprintf(w, "  %s bytes %d-%d: %s\n", s.File, s.Offset, s.Offset+s.Bytes, s.Reason)
			case s.File != "":
				fmt.Fprintf(w, "  %s: %s\n", s.File, s.Reason)
			default:
				fmt.Fprintf(w, "  %s\n", s.Reason)
			}
		}
	}
	fmt.Fprintf(w, "next: stop gatewayd, move %s aside (keep it), move %s to gatewayd's data_dir, start gatewayd\n", rep.Dir, rep.Out)
}

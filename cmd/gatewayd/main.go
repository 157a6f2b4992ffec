// Command gatewayd is the greenhouse gateway daemon: it takes reading
// batches from devices over MQTT and HTTP, stores each durably before
// acknowledging it, and forwards them to the cloud DynamoDB tables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/internal/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Environ()))
}

func run(args, environ []string) int {
	cfg, fl, unknownEnv, err := loadConfig(args, environ)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gatewayd:", err)
		return 2
	}
	if fl.version {
		fmt.Println("gatewayd", version)
		return 0
	}
	if fl.printConfig {
		out, err := config.Encode(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gatewayd: printing the configuration:", err)
			return 1
		}
		os.Stdout.Write(out)
		return 0
	}
	logger := newLogger(cfg)
	for _, name := range unknownEnv {
		logger.Warn("ignoring environment variable that names no setting", "name", name)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, environ, logger); err != nil {
		logger.Error("gatewayd stopped", "err", err)
		if errors.Is(err, buffer.ErrDamaged) {
			return exitDamagedBuffer
		}
		return 1
	}
	return 0
}

// exitDamagedBuffer is gatewayd's exit status when its buffer is damaged
// (EX_DATAERR): starting again cannot help, so the systemd unit does not
// restart on it (RestartPreventExitStatus=); the message logged names the
// salvage command.
const exitDamagedBuffer = 65

func newLogger(cfg Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func lookupEnv(environ []string, name string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if len(environ[i]) > len(name) && environ[i][:len(name)+1] == name+"=" {
			return environ[i][len(name)+1:]
		}
	}
	return ""
}

// secret returns the content of file (trailing newline trimmed) when file
// is set, else value.
func secret(value, file string) (string, error) {
	if file == "" {
		return value, nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading secret: %w", err)
	}
	return strings.TrimRight(string(raw), "\r\n"), nil
}

func endpointName(e string) string {
	if e == "" {
		return "AWS"
	}
	return e
}

// makeDataDir creates dir when it is missing, and syncs its parent so that
// a power cut does not take the new directory, with what gatewayd writes
// and syncs in it, away.
func makeDataDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	parent, err := os.Open(filepath.Dir(filepath.Clean(dir)))
	if err != nil {
		return err
	}
	return errors.Join(parent.Sync(), parent.Close())
}

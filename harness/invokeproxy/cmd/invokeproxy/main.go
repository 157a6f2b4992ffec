// Command invokeproxy serialises Lambda Invoke requests in front of one
// Runtime Interface Emulator (see package invokeproxy): `make run
// UPLINK=lambda` points gatewayd's uplink at it.
//
//	invokeproxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:9001[,http://127.0.0.1:9003...]
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"greenhouse-gateway/harness/invokeproxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve the Invoke API on")
	upstream := flag.String("upstream", "http://127.0.0.1:9001", "the emulators' base URLs, comma-separated (one invoke at a time to each)")
	timeout := flag.Duration("timeout", 0, "bound on one invocation at the emulator (default 5m)")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *upstream, *timeout, logger); err != nil {
		fmt.Fprintln(os.Stderr, "invokeproxy:", err)
		os.Exit(1)
	}
}

func run(listen, upstream string, timeout time.Duration, logger *slog.Logger) error {
	p, err := invokeproxy.New(strings.Split(upstream, ","), timeout, logger)
	if err != nil {
		return err
	}
	if err := p.Listen(listen); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger.Info("serving the Invoke API, one invocation at a time", "url", p.URL(), "upstream", upstream)
	return p.Run(ctx)
}

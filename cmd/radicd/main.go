// Command radicd is the per-node radic daemon: protector, heartbeat ring
// member, critical-data store and metrics endpoint. `radicd --help` lists
// every setting; package internal/radicd holds the implementation.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/radic-project/radic/internal/cluster/proc"
	"github.com/radic-project/radic/internal/radicd"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "nsexec" {
		// The held-at-the-gate helper of the ranks this daemon launches
		// (package proc): never returns.
		proc.HelperMain()
	}
	cfg, err := radicd.ParseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, radicd.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "radicd: %v\n", err)
		os.Exit(2)
	}
	log := radicd.NewLogger(cfg, os.Stderr)
	d, err := radicd.New(cfg, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Run(ctx); err != nil {
		log.Error("radicd failed", "err", err)
		stop()
		os.Exit(1)
	}
}

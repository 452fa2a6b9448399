// Command trainyard-ferretdb runs an embedded FerretDB (SQLite backend) so that
// local stacks and tests get a MongoDB-wire-compatible store without a
// separate database server. The upstream cmd/ferretdb is not used because it
// panics at start in this setup; the embeddable package is stable API.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listenAddr := flag.String("listen-addr", "127.0.0.1:27017", "TCP address to listen on (empty: none)")
	listenUnix := flag.String("listen-unix", "", "Unix socket to listen on (empty: none)")
	sqliteDir := flag.String("sqlite-dir", "data", "directory holding the SQLite database files")
	logLevel := flag.String("log-level", "warn", "log level: debug, info, warn, error")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "invalid -log-level %q: %v\n", *logLevel, err)
		os.Exit(2)
	}

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// FerretDB internals sometimes log via slog.Default(); keep them equally quiet.
	slog.SetDefault(logger)

	if err := run(*listenAddr, *listenUnix, *sqliteDir, logger); err != nil {
		logger.Error("ferretdb failed", "error", err)
		os.Exit(1)
	}
}

func run(listenAddr, listenUnix, sqliteDir string, logger *slog.Logger) error {
	dir, err := filepath.Abs(sqliteDir)
	if err != nil {
		return fmt.Errorf("resolve sqlite dir: %w", err)
	}

	// The SQLite backend refuses to start if the directory does not exist.
	if err = os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create sqlite dir: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// The SQLite URL must name a directory and end with a slash.
	f, err := ferretdb.New(&ferretdb.Config{
		// A Unix socket in a directory only the services' user can enter is how the
		// store stays theirs alone (docs/security.md): no TCP port for anyone on the host.
		Listener:  ferretdb.ListenerConfig{TCP: listenAddr, Unix: listenUnix},
		Logger:    logger,
		Handler:   "sqlite",
		SQLiteURL: "file:" + dir + "/",
	})
	if err != nil {
		return err
	}

	// Run returns once ctx is cancelled and listeners, connections and the
	// backend have been closed, so a signal results in a clean shutdown.
	if err = f.Run(ctx); err != nil {
		return err
	}

	logger.Info("ferretdb stopped")

	return nil
}

// Command capstan is Capstan's one binary: the daemon (`run`) and the
// commands people use next to it (`status`, `events`, `render`, `profiles`,
// `version`).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if err := run(); err != nil {
		// A command that exits with a code of its own (diff: 1 for
		// changes, 2 for errors) says so with an exitError.
		var exit *exitError
		if errors.As(err, &exit) {
			if exit.err != nil {
				fmt.Fprintln(os.Stderr, "capstan:", exit.err)
			}
			os.Exit(exit.code)
		}
		fmt.Fprintln(os.Stderr, "capstan:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return newRootCommand().ExecuteContext(ctx)
}

// Command mig-agent is a node-local NVIDIA MIG geometry manager: it
// converges a node's GPUs to the MIG geometry named in its Node label (or
// given on the command line), disturbing as little as it can.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/migagent/mig-agent/agent"
	"github.com/migagent/mig-agent/geometry"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// Exit codes (CONTRACT §1).
const (
	exitOK       = 0
	exitFailed   = 1
	exitBadInput = 2
	exitReboot   = 3
)

// inputError marks bad usage or bad input (exit 2).
type inputError struct{ err error }

func (e inputError) Error() string { return e.err.Error() }
func (e inputError) Unwrap() error { return e.err }

func badInput(err error) error { return inputError{err} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	root := newRoot()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(os.Stderr, "mig-agent:", err)
	var in inputError
	switch {
	case errors.Is(err, agent.ErrRebootRequired):
		return exitReboot
	case errors.As(err, &in), errors.Is(err, geometry.ErrUnknownConfig), errors.Is(err, agent.ErrBadSettings),
		strings.HasPrefix(err.Error(), "unknown command"), strings.HasPrefix(err.Error(), "unknown flag"),
		strings.HasPrefix(err.Error(), "unknown shorthand"), strings.Contains(err.Error(), "accepts "),
		strings.HasPrefix(err.Error(), "required flag"), strings.HasPrefix(err.Error(), "invalid argument"):
		return exitBadInput
	}
	return exitFailed
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "mig-agent",
		Short:         "Node-local NVIDIA MIG geometry manager",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	addGlobalFlags(root.PersistentFlags())
	root.AddCommand(runCmd(), profilesCmd(), validateCmd(), planCmd(), applyCmd(), assertCmd(), exportCmd(), simCmd(), statusCmd(), versionCmd())
	return root
}

func newLogger(s *agent.Settings) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(s.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "mig-agent %s\ncommit: %s\ngo: %s\n", version, commit, runtime.Version())
			return nil
		},
	}
}

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

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/settings"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// Exit codes (docs/reference.md#exit-codes).
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
	return exitCode(err)
}

// exitCode maps an error of a command to the process's exit code by its
// type: ErrRebootRequired → 3; bad usage (inputError, from the command line
// itself or a command's check), an unknown config and bad settings → 2;
// anything else → 1.
func exitCode(err error) int {
	var in inputError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, gpus.ErrRebootRequired):
		return exitReboot
	case errors.As(err, &in), errors.Is(err, geometry.ErrUnknownConfig), errors.Is(err, settings.ErrBadSettings):
		return exitBadInput
	}
	return exitFailed
}

// typeUsageErrors makes every usage error cobra can return an inputError:
// flags that do not parse (unknown flag or shorthand, invalid argument) via
// the flag error function, positional arguments a command does not take via
// its Args check, and an unknown command via the root's. (Cobra has no
// required flags here: none is marked.)
func typeUsageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return badInput(err) })
	root.SuggestionsMinimumDistance = 2 // cobra's own default for its message
	// The root runs only for no command or an unknown one; without a Run,
	// cobra would answer an unknown command with its help and exit 0.
	root.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return badInput(errors.New(msg))
		}
		return nil
	}
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root && c.Args != nil {
			check := c.Args
			c.Args = func(cmd *cobra.Command, args []string) error {
				if err := check(cmd, args); err != nil {
					return badInput(err)
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
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
	root.AddCommand(runCmd(), profilesCmd(), validateCmd(), planCmd(), applyCmd(), assertCmd(), exportCmd(), simCmd(), statusCmd(), assignmentsCmd(), plannerCmd(), versionCmd())
	typeUsageErrors(root)
	return root
}

func newLogger(s *settings.Settings) *slog.Logger {
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
		Short: "Print version, commit, Go version and platform",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "mig-agent %s\ncommit: %s\ngo: %s\nplatform: %s/%s\n",
				version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}

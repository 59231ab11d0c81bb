//go:build migagent_testhooks

package crashhook

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// saves counts the journal saves of changes in progress.
var saves int

// Saved runs the hook after a journal save of a change in progress whose
// phase and step are where ("draining GPU 1: ...").
func Saved(log *slog.Logger, where string) {
	at := os.Getenv(Env)
	if at == "" {
		return
	}
	saves++
	if n, err := strconv.Atoi(at); err == nil && n != saves || err != nil && !strings.Contains(where, at) {
		return
	}
	log.Warn("test hook: killing the process after a journal save", "env", Env, "save", saves, "where", where)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

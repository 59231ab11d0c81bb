package gpus

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/internal/boundcmd"
)

// NVIDIA's shipped hooks files parse unchanged.
func TestLoadHooksNVIDIA(t *testing.T) {
	for file, points := range map[string][]string{
		"hooks-default.yaml": {HookApplyStart, HookPreApplyMode, HookPreApplyConfig, HookApplyExit},
		"hooks-minimal.yaml": {HookApplyStart},
	} {
		h, err := LoadHooks(filepath.Join("testdata", "hooks", file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, p := range points {
			if len(h[p]) == 0 || h[p][0].Command != "/bin/bash" || h[p][0].Workdir != "/etc/nvidia-mig-manager" {
				t.Errorf("%s: %s = %+v", file, p, h[p])
			}
		}
	}
	if h, _ := LoadHooks(filepath.Join("testdata", "hooks", "hooks-default.yaml")); len(h[HookApplyExit]) != 2 {
		t.Errorf("apply-exit of hooks-default.yaml: %+v", h[HookApplyExit])
	}
}

func TestLoadHooksBad(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ body, want string }{
		{"version: v2\nhooks: {}\n", "version"},
		{"version: v1\nhooks:\n  apply-begin: [{command: /bin/true}]\n", `unknown hook point "apply-begin"`},
		{"version: v1\nhooks:\n  apply-start: [{comand: /bin/true}]\n", "comand"},
		{"version: v1\nhooks:\n  apply-start: [{args: [x]}]\n", "no command"},
	} {
		p := filepath.Join(dir, "h.yaml")
		_ = os.WriteFile(p, []byte(tc.body), 0o600)
		if _, err := LoadHooks(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.body, err, tc.want)
		}
	}
}

// fakeApplier records what ApplyWithHooks asks of it.
type fakeApplier struct {
	modeOK, configOK bool
	failMode         error
	calls            *[]string
}

func (f *fakeApplier) ModeApplied() (bool, error)   { return f.modeOK, nil }
func (f *fakeApplier) ApplyMode() error             { *f.calls = append(*f.calls, "mode"); return f.failMode }
func (f *fakeApplier) ConfigApplied() (bool, error) { return f.configOK, nil }
func (f *fakeApplier) ApplyConfig() error           { *f.calls = append(*f.calls, "config"); return nil }

// The order of ApplyMigConfigWithHooks (cmd/nvidia-mig-parted/apply/apply.go).
func TestApplyWithHooksOrder(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	h := Hooks{}
	for _, p := range []string{HookApplyStart, HookPreApplyMode, HookPreApplyConfig, HookApplyExit} {
		h[p] = []HookSpec{{Command: "/bin/sh", Args: []string{"-c", `echo "$0" >> "$LOG"`, p}, Envs: map[string]string{"LOG": log}}}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name             string
		modeOK, configOK bool
		modeOnly         bool
		failMode         error
		want             string
	}{
		{"both change", false, false, false, nil, "apply-start pre-apply-mode mode pre-apply-config config apply-exit"},
		{"devices only", true, false, false, nil, "apply-start pre-apply-config config apply-exit"},
		{"nothing", true, true, false, nil, "apply-start apply-exit"},
		{"mode only", false, false, true, nil, "apply-start pre-apply-mode mode apply-exit"},
		{"mode fails", false, false, false, errors.New("mode broke"), "apply-start pre-apply-mode mode apply-exit"},
	} {
		os.Remove(log)
		var calls []string
		a := &fakeApplier{modeOK: tc.modeOK, configOK: tc.configOK, failMode: tc.failMode, calls: &calls}
		err := ApplyWithHooks(context.Background(), quiet, h, HookEnv{}, tc.modeOnly, a)
		if !errors.Is(err, tc.failMode) || (tc.failMode == nil) != (err == nil) {
			t.Errorf("%s: err %v", tc.name, err)
		}
		data, _ := os.ReadFile(log)
		ran := strings.Fields(string(data))
		// Interleave: the hook log and the applier calls, in order of the
		// hooks that bracket them.
		var got []string
		for _, r := range ran {
			got = append(got, r)
			if r == HookPreApplyMode && slices.Contains(calls, "mode") {
				got = append(got, "mode")
			}
			if r == HookPreApplyConfig && slices.Contains(calls, "config") {
				got = append(got, "config")
			}
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, strings.Join(got, " "), tc.want)
		}
	}
}

// A hook that hangs is killed at the hook env's Timeout, and the error
// names the hook and says it timed out.
func TestHookTimeout(t *testing.T) {
	h := Hooks{HookApplyStart: {{Command: "sh", Args: []string{"-c", "echo waiting; sleep 60"}}}}
	start := time.Now()
	err := h.Run(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), HookApplyStart, HookEnv{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, boundcmd.ErrTimeout) || !strings.Contains(err.Error(), "apply-start hook 1 (sh)") || !strings.Contains(err.Error(), "waiting") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("returned after %s", d)
	}
}

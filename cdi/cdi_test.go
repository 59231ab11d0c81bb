package cdi

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

// fakeCTK is an nvidia-ctk that records its arguments (one line per call)
// and does what the real one does with --output: generate writes a spec,
// transform root copies its input with the root rewritten.
const fakeCTK = `#!/bin/sh
echo "nvidia-ctk $*" >> "$LOG"
[ "$1 $2" = "system create-device-nodes" ] && [ -n "$FAIL_NODES" ] && { echo "permission denied" >&2; exit 1; }
out=""; in=""; from=""; to=""
for a in "$@"; do
  case "$a" in
    --output=*) out="${a#--output=}" ;;
    --input=*) in="${a#--input=}" ;;
    --from=*) from="${a#--from=}" ;;
    --to=*) to="${a#--to=}" ;;
  esac
done
if [ "$1 $2" = "cdi generate" ]; then echo "kind: management.nvidia.com/gpu" > "$out"; echo "root: $(echo "$@" | sed 's/.*--driver-root=\([^ ]*\).*/\1/')" >> "$out"; fi
if [ "$1 $2" = "cdi transform" ]; then sed "s#$from#$to#" "$in" > "$out"; fi
exit 0
`

const fakeRecorder = `#!/bin/sh
echo "$(basename "$0") $*" >> "$LOG"
`

type fakeUnits struct{ started []string }

func (f *fakeUnits) Start(_ context.Context, names []string) error {
	f.started = append(f.started, names...)
	return nil
}

func script(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
}

type fixture struct {
	r                         *Refresher
	log, mount, specDir, bins string
}

func newFixture(t *testing.T) *fixture {
	dir := t.TempDir()
	f := &fixture{log: filepath.Join(dir, "calls.log"), mount: filepath.Join(dir, "driver-root"),
		specDir: filepath.Join(dir, "cdi"), bins: filepath.Join(dir, "bin")}
	t.Setenv("LOG", f.log)
	toolkit := filepath.Join(dir, "toolkit")
	script(t, filepath.Join(toolkit, "nvidia-ctk"), fakeCTK)
	script(t, filepath.Join(f.mount, "usr/bin/nvidia-smi"), fakeRecorder)
	script(t, filepath.Join(f.bins, "chroot"), fakeRecorder)
	f.r = &Refresher{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Mode: ModeAuto, SpecDir: f.specDir,
		DriverRoot: "/run/nvidia/driver", DriverRootMount: f.mount, ToolkitDirs: []string{toolkit},
		HookPath: "/usr/local/nvidia/toolkit/nvidia-cdi-hook", UnitRoot: dir, Path: f.bins + ":/usr/bin:/bin"}
	return f
}

func (f *fixture) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(f.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// A node whose spec directory holds NVIDIA's spec gets NVIDIA's steps, in
// its order, with the roots as NVIDIA's MIG manager passes them.
func TestRefreshRunsNVIDIAsSteps(t *testing.T) {
	f := newFixture(t)
	script(t, filepath.Join(f.specDir, "nvidia.yaml"), "kind: nvidia.com/gpu\n")
	done, err := f.r.Refresh(context.Background())
	if !done || err != nil {
		t.Fatalf("Refresh = %v, %v", done, err)
	}
	got := f.calls(t)
	m := f.mount
	want := []string{
		"chroot " + m + " nvidia-smi",
		"nvidia-ctk system create-device-nodes --control-devices --dev-root=" + m,
		"nvidia-ctk cdi generate --mode=management --driver-root=" + m + " --dev-root=" + m +
			" --vendor=management.nvidia.com --class=gpu --output=",
		"nvidia-ctk cdi transform root --from=" + m + " --to=/run/nvidia/driver --input=",
	}
	if len(got) != len(want) {
		t.Fatalf("calls:\n%s\nwant %d", strings.Join(got, "\n"), len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("call %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
	if !strings.Contains(got[2], "--nvidia-cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook") {
		t.Errorf("generate lacks the hook path: %q", got[2])
	}
	spec, err := os.ReadFile(filepath.Join(f.specDir, ManagementSpec))
	if err != nil || !strings.Contains(string(spec), "root: /run/nvidia/driver") {
		t.Errorf("management spec = %q, %v; want the host's driver root", spec, err)
	}
	left, _ := filepath.Glob(filepath.Join(f.specDir, ".mig-agent-cdi-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// The driver on the host's own root: nvidia-smi runs directly, no root
// transform.
func TestRefreshHostDriver(t *testing.T) {
	f := newFixture(t)
	f.r.DriverRoot, f.r.DriverRootMount, f.r.Mode = "/", "", ModeOn
	script(t, filepath.Join(f.bins, "nvidia-smi"), fakeRecorder)
	if done, err := f.r.Refresh(context.Background()); !done || err != nil {
		t.Fatalf("Refresh = %v, %v", done, err)
	}
	got := f.calls(t)
	if len(got) != 3 || got[0] != "nvidia-smi " || !strings.Contains(got[1], "--dev-root=/") || slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "transform") }) {
		t.Errorf("calls:\n%s", strings.Join(got, "\n"))
	}
}

// Without CDI (no NVIDIA spec, no refresh unit) or with --cdi=off nothing
// runs.
func TestRefreshLeavesANodeWithoutCDI(t *testing.T) {
	f := newFixture(t)
	if done, err := f.r.Refresh(context.Background()); done || err != nil {
		t.Errorf("auto without CDI: Refresh = %v, %v", done, err)
	}
	script(t, filepath.Join(f.specDir, "nvidia.yaml"), "x")
	f.r.Mode = ModeOff
	if done, err := f.r.Refresh(context.Background()); done || err != nil {
		t.Errorf("off: Refresh = %v, %v", done, err)
	}
	if c := f.calls(t); len(c) != 0 {
		t.Errorf("calls: %v", c)
	}
	if _, err := os.Stat(filepath.Join(f.specDir, ManagementSpec)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a management spec was written: %v", err)
	}
}

// A failing step is named, and nothing after it runs.
func TestRefreshFailureNamesTheStep(t *testing.T) {
	f := newFixture(t)
	f.r.Mode = ModeOn
	t.Setenv("FAIL_NODES", "1")
	_, err := f.r.Refresh(context.Background())
	var se *StepError
	if !errors.As(err, &se) || se.Step != "nvidia-ctk system create-device-nodes" || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("err = %v", err)
	}
	if got := f.calls(t); len(got) != 2 {
		t.Errorf("calls after the failure: %v", got)
	}
	// nvidia-ctk nowhere: named too.
	f.r.ToolkitDirs, f.r.Path = nil, f.bins
	_, err = f.r.Refresh(context.Background())
	if !errors.As(err, &se) || se.Step != "finding nvidia-ctk" || !errors.Is(err, ErrNotFound) {
		t.Errorf("err = %v", err)
	}
}

// Standalone with the toolkit's refresh unit: the unit is started, the
// steps are not run here.
func TestRefreshStartsTheHostUnit(t *testing.T) {
	f := newFixture(t)
	units := &fakeUnits{}
	f.r.Units = units
	if done, _ := f.r.Refresh(context.Background()); done || len(units.started) != 0 {
		t.Fatalf("no unit file: done %v, started %v", done, units.started)
	}
	script(t, filepath.Join(f.r.UnitRoot, "usr/lib/systemd/system", RefreshUnit), "[Service]\n")
	if done, err := f.r.Refresh(context.Background()); !done || err != nil || !slices.Equal(units.started, []string{RefreshUnit}) {
		t.Errorf("Refresh = %v, %v; started %v", done, err, units.started)
	}
	if c := f.calls(t); len(c) != 0 {
		t.Errorf("calls: %v", c)
	}
}

// A hung nvidia-smi (a wedged driver) is killed at Timeout: the step fails
// with its name, and no later step runs.
func TestRefreshCommandTimeout(t *testing.T) {
	f := newFixture(t)
	f.r.Mode = ModeOn
	f.r.Timeout = 300 * time.Millisecond
	script(t, filepath.Join(f.bins, "chroot"), "#!/bin/sh\necho \"$(basename \"$0\") $*\" >> \"$LOG\"\nsleep 60\n")
	start := time.Now()
	done, err := f.r.Refresh(context.Background())
	var step *StepError
	if !done || !errors.As(err, &step) || step.Step != "nvidia-smi" || !errors.Is(err, boundcmd.ErrTimeout) {
		t.Fatalf("Refresh = %v, %v", done, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("returned after %s", d)
	}
	if calls := f.calls(t); len(calls) != 1 {
		t.Errorf("calls after the timeout: %v", calls)
	}
}

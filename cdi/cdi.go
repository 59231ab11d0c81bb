// Package cdi refreshes what containers get of the GPUs through the
// Container Device Interface after a MIG change, as NVIDIA's MIG manager
// does (mig-parted pkg/mig/reconfigure/reconfigure.go, (*Reconfigure).Run:
// runNvidiaSMI, then handleCDI): nvidia-smi once (which creates the
// nvidia-cap device nodes of the new MIG devices), the control device
// nodes (nvidia-ctk system create-device-nodes --control-devices), and the
// management CDI spec (nvidia-ctk cdi generate --mode=management, its
// roots transformed to the host's). Standalone, where the host has the
// container toolkit's nvidia-cdi-refresh.service, that unit is started
// instead, as the host flavour's hooks do (mig-parted
// deployments/systemd/hooks.sh refresh-cdi). A node without CDI is left
// alone. The commands run through exec, found in the toolkit and driver
// roots the agent is given; nothing here links Kubernetes.
package cdi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/migagent/mig-agent/internal/boundcmd"
)

// Modes of --cdi.
const (
	ModeAuto = "auto" // in use where the spec directory holds an NVIDIA spec or the host has the refresh unit
	ModeOn   = "on"
	ModeOff  = "off"
)

// Names NVIDIA's tools use.
const (
	// RefreshUnit is the container toolkit's unit that regenerates the
	// host's CDI spec (nvidia-container-toolkit
	// deployments/systemd/nvidia-cdi-refresh.service).
	RefreshUnit = "nvidia-cdi-refresh.service"
	// ManagementSpec is the file NVIDIA's MIG manager writes the
	// management spec to, in the spec directory.
	ManagementSpec   = "management.nvidia.com-gpu.yaml"
	managementVendor = "management.nvidia.com"
	managementClass  = "gpu"
	ctk              = "nvidia-ctk"
	smi              = "nvidia-smi"
)

// unitDirs are where systemd looks for unit files (systemd.unit(5), the
// system unit search path), for "the host has the unit".
var unitDirs = []string{"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"}

// ErrNotFound: a tool the step needs is in none of the places looked in.
var ErrNotFound = errors.New("not found")

// UnitStarter starts host units (systemd.Units).
type UnitStarter interface {
	Start(ctx context.Context, names []string) error
}

// Refresher runs the CDI steps after a change.
type Refresher struct {
	Log  *slog.Logger
	Mode string
	// SpecDir is the CDI spec directory as the agent sees it (/var/run/cdi).
	SpecDir string
	// DriverRoot is the driver root on the host ("/", or the GPU
	// Operator's /run/nvidia/driver); DriverRootMount where the agent sees
	// it ("" = DriverRoot).
	DriverRoot, DriverRootMount string
	// ToolkitDirs are looked in first for nvidia-ctk (the toolkit the
	// GPU Operator installs: /usr/local/nvidia/toolkit), then the driver
	// root's bin directories, then PATH.
	ToolkitDirs []string
	// HookPath is the host path of nvidia-cdi-hook written into the spec
	// ("" = nvidia-ctk's default).
	HookPath string
	// Units and UnitRoot: standalone, the refresh unit is started through
	// Units where a unit file exists under UnitRoot ("" = "/") + unitDirs.
	Units    UnitStarter
	UnitRoot string
	// Path is the PATH looked in last ("" = the process's).
	Path string
	// Timeout bounds each command and the unit's start
	// (--command-timeout; 0: boundcmd.DefaultTimeout): a step past it
	// fails, its command killed.
	Timeout time.Duration
}

// InUse reports whether CDI is in use on the node and how it is refreshed:
// "unit" (the host's refresh unit), "spec" (the steps run here), or "".
func (r *Refresher) InUse() string {
	switch {
	case r == nil || r.Mode == ModeOff:
		return ""
	case r.Units != nil && r.hasUnit():
		return "unit"
	case r.Mode == ModeOn || r.hasNVIDIASpec():
		return "spec"
	}
	return ""
}

func (r *Refresher) hasUnit() bool {
	for _, d := range unitDirs {
		if _, err := os.Stat(filepath.Join(r.UnitRoot, d, RefreshUnit)); err == nil {
			return true
		}
	}
	return false
}

// hasNVIDIASpec: the spec directory holds a spec NVIDIA's toolkit or MIG
// manager wrote (nvidia.yaml, nvidia.com-gpu.yaml,
// management.nvidia.com-gpu.yaml, k8s.device-plugin.nvidia.com-*.json).
func (r *Refresher) hasNVIDIASpec() bool {
	entries, err := os.ReadDir(r.SpecDir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		n := e.Name()
		if (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".json")) && strings.Contains(n, "nvidia") {
			return true
		}
	}
	return false
}

// StepError names the CDI step that failed.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// Refresh runs the steps where CDI is in use; done is false where it is
// not (nothing was run).
func (r *Refresher) Refresh(ctx context.Context) (done bool, err error) {
	switch r.InUse() {
	case "unit":
		r.Log.Info("starting the container toolkit's CDI refresh unit", "unit", RefreshUnit)
		limit := r.Timeout
		if limit <= 0 {
			limit = boundcmd.DefaultTimeout
		}
		uctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		err := r.Units.Start(uctx, []string{RefreshUnit})
		if err != nil && ctx.Err() == nil && uctx.Err() != nil {
			err = fmt.Errorf("%w after %s: %w", boundcmd.ErrTimeout, limit, err)
		}
		if err != nil {
			return true, &StepError{Step: "starting " + RefreshUnit, Err: err}
		}
		return true, nil
	case "spec":
		return true, r.refreshSpec(ctx)
	}
	return false, nil
}

func (r *Refresher) mount() string {
	if r.DriverRootMount != "" {
		return r.DriverRootMount
	}
	if r.DriverRoot != "" {
		return r.DriverRoot
	}
	return "/"
}

func (r *Refresher) root() string {
	if r.DriverRoot != "" {
		return r.DriverRoot
	}
	return "/"
}

// refreshSpec runs NVIDIA's three steps, in its order.
func (r *Refresher) refreshSpec(ctx context.Context) error {
	mount := r.mount()
	if err := r.nvidiaSMI(ctx, mount); err != nil {
		return err
	}
	tool, err := r.find(ctk, r.ToolkitDirs...)
	if err != nil {
		return &StepError{Step: "finding " + ctk, Err: err}
	}
	if _, err := r.run(ctx, tool, "system", "create-device-nodes", "--control-devices", "--dev-root="+mount); err != nil {
		return &StepError{Step: ctk + " system create-device-nodes", Err: err}
	}
	return r.managementSpec(ctx, tool, mount)
}

// nvidiaSMI runs nvidia-smi once: in the driver root (chroot) where that is
// not the agent's own root, as runNvidiaSMI does.
func (r *Refresher) nvidiaSMI(ctx context.Context, mount string) error {
	var err error
	if filepath.Clean(mount) == "/" {
		var tool string
		if tool, err = r.find(smi); err == nil {
			_, err = r.run(ctx, tool)
		}
	} else {
		var chroot string
		if chroot, err = r.find("chroot"); err == nil {
			_, err = r.run(ctx, chroot, mount, smi)
		}
	}
	if err != nil {
		return &StepError{Step: smi, Err: err}
	}
	return nil
}

// managementSpec generates the management spec (one device, "all") with
// the driver root as the agent sees it, rewrites that root to the host's
// (nvidia-ctk cdi transform root) where they differ, and puts the result
// in place with a rename, so that a runtime never reads half a spec.
func (r *Refresher) managementSpec(ctx context.Context, tool, mount string) error {
	dir := r.SpecDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return &StepError{Step: "CDI spec directory", Err: err}
	}
	tmp, err := os.MkdirTemp(dir, ".mig-agent-cdi-")
	if err != nil {
		return &StepError{Step: "CDI spec directory", Err: err}
	}
	defer os.RemoveAll(tmp)
	gen := filepath.Join(tmp, "generated.yaml")
	args := []string{"cdi", "generate", "--mode=management", "--driver-root=" + mount, "--dev-root=" + mount,
		"--vendor=" + managementVendor, "--class=" + managementClass, "--output=" + gen}
	if r.HookPath != "" {
		args = append(args, "--nvidia-cdi-hook-path="+r.HookPath)
	}
	if _, err := r.run(ctx, tool, args...); err != nil {
		return &StepError{Step: ctk + " cdi generate --mode=management", Err: err}
	}
	out := gen
	if filepath.Clean(mount) != filepath.Clean(r.root()) {
		out = filepath.Join(tmp, "host.yaml")
		_, err := r.run(ctx, tool, "cdi", "transform", "root", "--from="+mount, "--to="+r.root(), "--input="+gen, "--output="+out)
		if err != nil {
			return &StepError{Step: ctk + " cdi transform root", Err: err}
		}
	}
	if err := os.Rename(out, filepath.Join(dir, ManagementSpec)); err != nil {
		return &StepError{Step: "writing " + ManagementSpec, Err: err}
	}
	r.Log.Info("CDI refreshed", "spec", filepath.Join(dir, ManagementSpec), "driverRoot", r.root())
	return nil
}

// find looks for name in dirs, then in the driver root's bin directories,
// then on PATH.
func (r *Refresher) find(name string, dirs ...string) (string, error) {
	m := r.mount()
	dirs = append(append([]string{}, dirs...), filepath.Join(m, "usr/bin"), filepath.Join(m, "usr/sbin"))
	path := r.Path
	if path == "" {
		path = os.Getenv("PATH")
	}
	dirs = append(dirs, filepath.SplitList(path)...)
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w in %s", name, ErrNotFound, strings.Join(dirs, ":"))
}

// run runs one command; the error carries its exit status and output.
func (r *Refresher) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	r.Log.Debug("running", "cmd", name, "args", args)
	if err := boundcmd.Run(ctx, r.Timeout, cmd); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 500 {
			msg = msg[len(msg)-500:]
		}
		return out.Bytes(), fmt.Errorf("%s: %w: %s", filepath.Base(name), err, msg)
	}
	return out.Bytes(), nil
}

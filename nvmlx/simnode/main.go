// Command sim-node runs a command on a simulated GPU node: in a private
// mount namespace that shows what a node with NVIDIA's driver shows for
// the GPUs of a simulator state file, changing nothing on the host.
//
//	sim-node [--state FILE] [--spec SPEC] [--lib DIR] -- COMMAND [ARGS...]
//
// Inside, for the state's GPUs:
//   - libnvidia-ml.so.1 (make simlib's) is first on LD_LIBRARY_PATH, with
//     MIG_AGENT_SIM_STATE and MIG_AGENT_SIM set for it;
//   - /proc/modules lists the nvidia modules, /proc/devices the driver's
//     majors, /proc/driver holds nvidia/version, nvidia/gpus/BUS/information,
//     nvidia/capabilities/mig/{config,monitor} and nvidia-caps/mig-minors;
//   - /sys/bus/pci/devices holds each GPU's device directory (vendor 0x10de,
//     class 3D controller, device id, subsystem, driver nvidia) beside the
//     host's devices;
//   - /dev holds nvidiactl, nvidiaN, nvidia-uvm and /dev/nvidia-caps.
//
// Where the kernel has no /proc/modules (a kernel built without modules),
// /proc itself is replaced by a directory that links every other entry to
// the real proc file system; the links of process ids follow the processes
// (every 100 ms), and /proc/self is the real one.
//
// The device nodes are real character devices with the driver's numbers;
// with no driver loaded, opening one fails (ENXIO), as on a node whose
// module went away: NVIDIA's tools stat them and hand their paths on, they
// never open them when NVML is the simulator.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// childEnv marks the re-executed process that runs in the new namespace.
// stageEnv names the directory its tmpfs is mounted on.
const (
	childEnv = "MIG_AGENT_SIM_NODE_CHILD"
	stageEnv = "MIG_AGENT_SIM_NODE_STAGE"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

type options struct {
	state, spec, lib string
	argv             []string
}

func run(args []string) int {
	o, err := parseArgs(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sim-node:", err)
		return 2
	}
	if os.Getenv(childEnv) == "1" {
		code, err := child(o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sim-node:", err)
			return 1
		}
		return code
	}
	return parent(o)
}

func parseArgs(args []string) (options, error) {
	fs := flag.NewFlagSet("sim-node", flag.ContinueOnError)
	o := options{}
	self, _ := os.Executable()
	fs.StringVar(&o.state, "state", os.Getenv("MIG_AGENT_SIM_STATE"), "simulator state file (mig-agent --sim-state); default $MIG_AGENT_SIM_STATE")
	fs.StringVar(&o.spec, "spec", os.Getenv("MIG_AGENT_SIM"), "GPUs of a new state file (h200x2); default $MIG_AGENT_SIM, or the state file's")
	fs.StringVar(&o.lib, "lib", filepath.Dir(self), "directory holding libnvidia-ml.so.1 (make simlib's)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.argv = fs.Args()
	switch {
	case len(o.argv) == 0:
		return o, errors.New("usage: sim-node [--state FILE] [--spec SPEC] [--lib DIR] -- COMMAND [ARGS...]")
	case o.state == "":
		return o, errors.New("no state file: set --state or MIG_AGENT_SIM_STATE")
	}
	abs, err := filepath.Abs(o.state)
	if err != nil {
		return o, err
	}
	o.state = abs
	if o.lib, err = filepath.Abs(o.lib); err != nil {
		return o, err
	}
	if _, err := os.Stat(filepath.Join(o.lib, "libnvidia-ml.so.1")); err != nil {
		return o, fmt.Errorf("no libnvidia-ml.so.1 in %s (make simlib writes bin/libnvidia-ml.so.1): %w", o.lib, err)
	}
	if o.spec == "" {
		if o.spec, err = nvmlsim.SpecOfState(o.state); err != nil {
			return o, fmt.Errorf("no GPUs named: set --spec or MIG_AGENT_SIM, or give an existing state file: %w", err)
		}
	}
	return o, nil
}

// parent re-executes sim-node in a new mount namespace and passes its exit
// status on.
func parent(o options) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sim-node:", err)
		return 1
	}
	// The namespace's tmpfs is mounted here; on the host it stays an empty
	// directory, removed when the command ends.
	// A container image may have no /tmp.
	if err := os.MkdirAll(os.TempDir(), 0o1777); err != nil {
		fmt.Fprintln(os.Stderr, "sim-node:", err)
		return 1
	}
	stage, err := os.MkdirTemp("", "sim-node-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "sim-node:", err)
		return 1
	}
	defer os.Remove(stage)
	cmd := exec.Command(self, append([]string{"--state", o.state, "--spec", o.spec, "--lib", o.lib, "--"}, o.argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), childEnv+"=1", stageEnv+"="+stage)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	return runForwarding(cmd)
}

// runForwarding runs cmd, passes SIGTERM, SIGINT and SIGHUP on to it, and
// returns its exit code (128+signal when a signal ended it).
func runForwarding(cmd *exec.Cmd) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "sim-node:", err)
		return 127
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exit.ExitCode()
	}
	fmt.Fprintln(os.Stderr, "sim-node:", err)
	return 1
}

// child runs in the new mount namespace: it builds the node's view, then
// runs the command with the library on its loader path.
func child(o options) (int, error) {
	lib, err := nvmlsim.New(o.spec, nvmlsim.Options{StatePath: o.state}, nil)
	if err != nil {
		return 0, err
	}
	gpus, err := readGPUs(lib)
	if err != nil {
		return 0, err
	}
	stage := os.Getenv(stageEnv)
	if stage == "" {
		return 0, errors.New(stageEnv + " is not set")
	}
	if err := buildNode(stage, gpus); err != nil {
		return 0, err
	}
	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	env := []string{"MIG_AGENT_SIM_STATE=" + o.state, "MIG_AGENT_SIM=" + o.spec}
	ld := o.lib
	if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
		ld += ":" + old
	}
	env = append(env, "LD_LIBRARY_PATH="+ld)
	for _, kv := range os.Environ() {
		if !hasKey(kv, childEnv, stageEnv, "MIG_AGENT_SIM_STATE", "MIG_AGENT_SIM", "LD_LIBRARY_PATH") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	if p, err := exec.LookPath(o.argv[0]); err == nil {
		cmd.Path = p
	}
	done := make(chan struct{})
	defer close(done)
	go keepFarm(done, 100*time.Millisecond)
	return runForwarding(cmd), nil
}

func hasKey(kv string, keys ...string) bool {
	for _, k := range keys {
		if len(kv) > len(k) && kv[:len(k)] == k && kv[len(k)] == '=' {
			return true
		}
	}
	return false
}

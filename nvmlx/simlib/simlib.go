// Command simlib is the project's NVML simulator built as the NVML C
// library: `make simlib` links it with -buildmode=c-shared into
// bin/libnvidia-ml.so.1, which NVIDIA's own binaries (k8s-device-plugin,
// GPU Feature Discovery, nvidia-mig-parted, the DRA kubelet plugin, any
// go-nvml or C program) load unmodified in place of the driver's library,
// and which mig-agent loads with --nvml real --nvml-library.
//
// Every call goes to package nvmlsim, the simulator behind --nvml sim:SPEC,
// over the state file MIG_AGENT_SIM_STATE names: one state file is one
// driver, so a change one process makes (mig-agent, mig-parted) is what
// every other process (the device plugin) reads next, under the same file
// lock the simulator already takes. MIG_AGENT_SIM names the GPUs
// ("h200x2"; optional when the state file exists), MIG_AGENT_SIM_FAULTS
// the faults (as --sim-faults). Without MIG_AGENT_SIM_STATE the state
// lives in the process alone.
//
// exports.go holds the NVML functions the simulator answers (CALLS.md
// lists them, generated); stubs_generated.c every other function nvml.h
// declares, each answering NVML_ERROR_NOT_SUPPORTED and naming itself once
// on standard error, so that no caller ever jumps to a missing symbol.
// genstubs writes both lists from go-nvml's nvml.h and exports.go.
package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

//go:generate go run ./genstubs

// main is never run: the package is a library.
func main() {}

// Environment the library reads at the first nvmlInit.
const (
	envSpec   = "MIG_AGENT_SIM"
	envState  = "MIG_AGENT_SIM_STATE"
	envFaults = "MIG_AGENT_SIM_FAULTS"
)

var (
	openOnce sync.Once
	theLib   *nvmlsim.Lib
	errOpen  error
	stderr   = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
)

// library opens the simulator once per process from the environment.
func library() (*nvmlsim.Lib, error) {
	openOnce.Do(func() {
		spec, state := getenv(envSpec), getenv(envState)
		if spec == "" && state != "" {
			spec, errOpen = nvmlsim.SpecOfState(state)
			if errOpen != nil {
				errOpen = fmt.Errorf("%s is not set and %s=%s cannot name the GPUs: %w", envSpec, envState, state, errOpen)
				return
			}
		}
		if spec == "" {
			errOpen = fmt.Errorf("set %s (for example h200x2) and %s (the state file mig-agent --sim-state uses)", envSpec, envState)
			return
		}
		theLib, errOpen = nvmlsim.New(spec, nvmlsim.Options{StatePath: state, Faults: getenv(envFaults)}, stderr)
	})
	return theLib, errOpen
}

// getenv reads the process's environment as it is now, through the C
// library: a Go runtime in a shared library keeps the environment the
// process started with, and a program may set these before its first
// nvmlInit (a Go program's os.Setenv reaches the C library's).
func getenv(key string) string {
	k := C.CString(key)
	defer C.free(unsafe.Pointer(k))
	v := C.getenv(k)
	if v == nil {
		return ""
	}
	return C.GoString(v)
}

// --- handles -------------------------------------------------------------------

// NVML hands out opaque pointers (nvmlDevice_t, nvmlGpuInstance_t,
// nvmlComputeInstance_t) and gives the same pointer for the same object.
// Each handle here is a small block of C memory, so that it is a valid
// pointer that no Go collector follows, kept for the process's life (a node
// has at most a few hundred MIG objects over its life).
var handles = struct {
	sync.Mutex
	byKey map[string]unsafe.Pointer
	byPtr map[unsafe.Pointer]any
}{byKey: map[string]unsafe.Pointer{}, byPtr: map[unsafe.Pointer]any{}}

// handleOf is the C handle for a simulator object.
func handleOf(x any) unsafe.Pointer {
	key, ok := nvmlsim.HandleKey(x)
	if !ok {
		panic(fmt.Sprintf("simlib: no handle key for %T", x))
	}
	handles.Lock()
	defer handles.Unlock()
	if p, ok := handles.byKey[key]; ok {
		handles.byPtr[p] = x
		return p
	}
	p := C.malloc(8)
	handles.byKey[key], handles.byPtr[p] = p, x
	return p
}

// object is what a C handle stands for, nil for a pointer not handed out.
func object(p unsafe.Pointer) any {
	handles.Lock()
	defer handles.Unlock()
	return handles.byPtr[p]
}

func device(p unsafe.Pointer) (nvml.Device, bool) {
	d, ok := object(p).(nvml.Device)
	return d, ok
}

func gpuInstance(p unsafe.Pointer) (nvml.GpuInstance, bool) {
	g, ok := object(p).(nvml.GpuInstance)
	return g, ok
}

func computeInstance(p unsafe.Pointer) (nvml.ComputeInstance, bool) {
	c, ok := object(p).(nvml.ComputeInstance)
	return c, ok
}

// --- calls -------------------------------------------------------------------

// guard runs one NVML call: a panic in the simulator becomes
// NVML_ERROR_UNKNOWN with a log line, never a crash of the caller.
func guard(name string, f func() nvml.Return) (ret C.int) {
	defer func() {
		if r := recover(); r != nil {
			stderr.Error("simulated NVML call panicked", "call", name, "panic", fmt.Sprint(r))
			ret = C.int(nvml.ERROR_UNKNOWN)
		}
	}()
	return C.int(f())
}

// onDevice runs f on the device handle p; an unknown handle is
// INVALID_ARGUMENT, as NVML answers for a handle it did not give.
func onDevice(name string, p unsafe.Pointer, f func(nvml.Device) nvml.Return) C.int {
	return guard(name, func() nvml.Return {
		d, ok := device(p)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return f(d)
	})
}

func onGpuInstance(name string, p unsafe.Pointer, f func(nvml.GpuInstance) nvml.Return) C.int {
	return guard(name, func() nvml.Return {
		g, ok := gpuInstance(p)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return f(g)
	})
}

func onComputeInstance(name string, p unsafe.Pointer, f func(nvml.ComputeInstance) nvml.Return) C.int {
	return guard(name, func() nvml.Return {
		c, ok := computeInstance(p)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return f(c)
	})
}

// putString copies s and its NUL into the caller's buffer of n bytes;
// INSUFFICIENT_SIZE when it does not fit (nvml.h, every string getter).
func putString(dst *C.char, n C.uint, s string) nvml.Return {
	if dst == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if uint64(len(s))+1 > uint64(n) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(dst)), int(n))
	copy(buf, s)
	buf[len(s)] = 0
	return nvml.SUCCESS
}

// putName copies s, cut to fit with its NUL, into a fixed char array.
func putName(dst []int8, s string) {
	n := min(len(s), len(dst)-1)
	for i := range n {
		dst[i] = int8(s[i])
	}
	dst[n] = 0
}

// set writes v through p; a NULL out-pointer is INVALID_ARGUMENT.
func set[T any](p *T, v T) nvml.Return {
	if p == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	*p = v
	return nvml.SUCCESS
}

// then writes v through p only when ret is SUCCESS, and passes ret on.
func then[T any](p *T, v T, ret nvml.Return) nvml.Return {
	if ret != nvml.SUCCESS {
		return ret
	}
	return set(p, v)
}

// missing reports a function of nvml.h the simulator does not answer,
// once per function; the stubs call it.
//
//export simlibMissing
func simlibMissing(name *C.char) {
	n := C.GoString(name)
	missingMu.Lock()
	defer missingMu.Unlock()
	if missingSeen[n] {
		return
	}
	missingSeen[n] = true
	if !strings.HasPrefix(getenv("MIG_AGENT_SIM_QUIET"), "1") {
		fmt.Fprintf(os.Stderr, "mig-agent simulated NVML: %s is not simulated: NVML_ERROR_NOT_SUPPORTED\n", n)
	}
}

var (
	missingMu   sync.Mutex
	missingSeen = map[string]bool{}
)

package nvmlx

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/internal/boundcmd"
	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
)

// LibraryName is the NVML library the real backend loads at run time. It is
// never bundled: it comes with the NVIDIA driver.
const LibraryName = "libnvidia-ml.so.1"

// realLibraryDirs are where a driver root (the host's "/", the GPU Operator's
// "/run/nvidia/driver", "/usr/local/nvidia") keeps libnvidia-ml.so.1.
var realLibraryDirs = [...]string{
	"usr/lib64",
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"lib64",
	"lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu",
	"usr/lib",
	"lib",
	".",
}

// realLibraryError is the one-line error for a host without a usable NVML.
type realLibraryError struct {
	path, reason string
}

func (e *realLibraryError) Error() string {
	return fmt.Sprintf("NVIDIA driver library %s not found: %s "+
		"(install the NVIDIA driver, point --nvml-library at the library or the driver root, or use --nvml sim:SPEC)",
		LibraryName, e.reason)
}

func (e *realLibraryError) Unwrap() error { return ErrLibraryNotFound }

// NewReal opens the driver's NVML through go-nvml. o.Library is the path
// of libnvidia-ml.so.1 or a driver root holding it ("" = the dynamic
// loader's search path). Without a driver the error wraps
// ErrLibraryNotFound and says so in one line. With o.Idle nothing is loaded
// or initialized yet: the library is found and NVML opened when a call or
// Begin needs it, and shut down again when that work ends.
func NewReal(o Options) (GPU, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g, err := newRealBackend(realConfig{
		log:      log,
		library:  o.Library,
		pci:      realSysfs{root: "/sys"},
		lookPath: exec.LookPath,
		run:      realRunCommand,
		load:     func() (nvml.Interface, string, error) { return realLoad(o.Library) },
	}, o.Idle)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// realLoad finds the library the setting names and checks it loads.
// go-nvml's Init reports only LIBRARY_NOT_FOUND; opening it once here says
// why (missing file, wrong architecture, ...).
func realLoad(setting string) (nvml.Interface, string, error) {
	path, err := realResolveLibrary(setting)
	if err != nil {
		return nil, "", err
	}
	probe := dl.New(path, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := probe.Open(); err != nil {
		return nil, "", &realLibraryError{path: path, reason: err.Error()}
	}
	_ = probe.Close()
	return nvml.New(nvml.WithLibraryPath(path)), path, nil
}

// realResolveLibrary turns the --nvml-library setting into a path for dlopen.
func realResolveLibrary(setting string) (string, error) {
	if setting == "" {
		return LibraryName, nil
	}
	fi, err := os.Stat(setting)
	if err != nil {
		return "", &realLibraryError{path: setting, reason: err.Error()}
	}
	if !fi.IsDir() {
		return setting, nil
	}
	for _, d := range realLibraryDirs {
		p := filepath.Join(setting, d, LibraryName)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", &realLibraryError{path: setting, reason: fmt.Sprintf("not under driver root %s (looked in %s)",
		setting, strings.Join(realLibraryDirs[:], ", "))}
}

// realRunCommand runs nvidia-smi (a GPU reset) for at most
// boundcmd.DefaultTimeout: a wedged driver makes it hang.
func realRunCommand(ctx context.Context, name string, args ...string) ([]byte, error) {
	return boundcmd.CombinedOutput(ctx, boundcmd.DefaultTimeout, exec.Command(name, args...))
}

// realConfig holds the real backend's side effects, so tests and the
// simulator can replace them.
type realConfig struct {
	log      *slog.Logger
	library  string // for messages: the library path once loaded
	pci      realPCI
	lookPath func(string) (string, error)
	run      func(ctx context.Context, name string, args ...string) ([]byte, error)
	// load returns the NVML library to initialize and its path; it is
	// called until it succeeds (a driver installed after the agent started).
	load func() (nvml.Interface, string, error)
	// sleep waits between attempts to re-initialize NVML after a reset.
	sleep func(time.Duration)
}

// realGPU is the GPU backend over go-nvml. One mutex serializes every call:
// handles are cached and replaced after mode changes and resets.
//
// NVML sessions: the backend holds at most one nvmlInit reference. Opened
// idle (the daemon), it initializes NVML for a call or between Begin and the
// matching End, and shuts it down afterwards, so an idle agent never keeps
// the driver's device files open (a driver upgrade can unload the module).
// Opened eagerly (the CLI), NVML stays initialized until Close. A failed
// nvmlInit (also the one after a reset) is tried again at the next call.
type realGPU struct {
	lib nvml.Interface // nil until loaded
	cfg realConfig
	log *slog.Logger

	mu       sync.Mutex
	closed   bool // Close was called: permanent
	inited   bool // this backend holds an nvmlInit reference
	idle     bool // shut NVML down when no session is open
	sessions int  // Begin calls not yet ended
	opened   bool // "NVML opened" was logged at Info once
	handles  map[int]realHandle
	noted    map[string]bool // fallbacks already logged, so each is said once
}

// realHandle is a cached device handle and the UUID to re-acquire it by.
type realHandle struct {
	dev  nvml.Device
	uuid string
}

var _ GPU = (*realGPU)(nil)

// newReal initializes NVML through lib (go-nvml's library or a fake).
func newReal(lib nvml.Interface, cfg realConfig) (*realGPU, error) {
	path := cfg.library
	if path == "" {
		path = LibraryName
	}
	cfg.load = func() (nvml.Interface, string, error) { return lib, path, nil }
	return newRealBackend(cfg, false)
}

// newRealBackend builds the backend; unless idle it opens NVML at once.
func newRealBackend(cfg realConfig, idle bool) (*realGPU, error) {
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if cfg.library == "" {
		cfg.library = LibraryName
	}
	if cfg.pci == nil {
		cfg.pci = realSysfs{root: "/sys"}
	}
	if cfg.sleep == nil {
		cfg.sleep = time.Sleep
	}
	g := &realGPU{cfg: cfg, log: cfg.log, idle: idle, handles: map[int]realHandle{}, noted: map[string]bool{}}
	if idle {
		return g, nil
	}
	if err := g.init(); err != nil {
		return nil, err
	}
	return g, nil
}

// init loads the library if needed and takes an nvmlInit reference.
// Callers hold g.mu (or own g exclusively).
func (g *realGPU) init() error {
	if g.lib == nil {
		lib, path, err := g.cfg.load()
		if err != nil {
			return err
		}
		g.lib, g.cfg.library = lib, path
	}
	switch ret := g.lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return &realLibraryError{path: g.cfg.library, reason: "it cannot be loaded"}
	default:
		return fmt.Errorf("initialize NVML from %s: %w", g.cfg.library, realError("Init", -1, ret))
	}
	g.inited = true
	g.handles = map[int]realHandle{}
	if !g.opened {
		g.opened = true
		driver, ret := g.lib.SystemGetDriverVersion()
		g.log.Info("NVML opened", "library", g.cfg.library, "driver", driver, "return", nvmlreturn.Name(ret), "idle", g.idle)
	} else {
		g.log.Debug("NVML session opened")
	}
	return nil
}

// shutdown releases the nvmlInit reference; handles die with it. Callers
// hold g.mu.
func (g *realGPU) shutdown() error {
	if !g.inited {
		return nil
	}
	g.inited = false
	g.handles = map[int]realHandle{}
	if ret := g.lib.Shutdown(); ret != nvml.SUCCESS && ret != nvml.ERROR_UNINITIALIZED {
		return realError("Shutdown", -1, ret)
	}
	g.log.Debug("NVML session closed")
	return nil
}

// Begin opens an NVML session for a pass of work: NVML is initialized
// (if it is not) and stays so until the matching End. Sessions nest.
func (g *realGPU) Begin() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("NVML already closed: %w", realError("Init", -1, nvml.ERROR_UNINITIALIZED))
	}
	if !g.inited {
		if err := g.init(); err != nil {
			return err
		}
	}
	g.sessions++
	return nil
}

// End ends a session Begin opened; a backend opened idle shuts NVML down
// when the last one ends.
func (g *realGPU) End() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sessions > 0 {
		g.sessions--
	}
	if g.sessions == 0 && g.idle {
		if err := g.shutdown(); err != nil {
			g.log.Warn("NVML shutdown failed", "err", err)
		}
	}
}

// firstTime reports whether key is new: a fallback is logged once per
// process and GPU, not at every discovery. Callers hold g.mu.
func (g *realGPU) firstTime(key string, gpu int) bool {
	k := fmt.Sprintf("%s/%d", key, gpu)
	if g.noted[k] {
		return false
	}
	g.noted[k] = true
	return true
}

// hasSymbol reports whether the loaded library has any of the named entry
// points. go-nvml calls a missing one through a lazy binding and the
// process dies, so newer entry points are checked first.
func (g *realGPU) hasSymbol(names ...string) bool {
	ext := g.lib.Extensions()
	if ext == nil {
		return false
	}
	for _, n := range names {
		if ext.LookupSymbol(n) == nil {
			return true
		}
	}
	return false
}

// needSymbol is hasSymbol as an error for operation op.
func (g *realGPU) needSymbol(op string, gpu int, names ...string) error {
	if g.hasSymbol(names...) {
		return nil
	}
	return fmt.Errorf("the driver's NVML has no %s (driver too old): %w",
		names[0], realError(op, gpu, nvml.ERROR_FUNCTION_NOT_FOUND))
}

// open makes sure NVML is initialized for operation op and returns what
// ends the call: outside a session of an idle backend, NVML is shut down
// again. Callers hold g.mu and call done before releasing it.
func (g *realGPU) open(op string) (done func(), err error) {
	if g.closed {
		return nil, fmt.Errorf("NVML already closed: %w", realError(op, -1, nvml.ERROR_UNINITIALIZED))
	}
	if g.inited {
		return func() {}, nil
	}
	if err := g.init(); err != nil {
		return nil, err
	}
	if !g.idle || g.sessions > 0 {
		return func() {}, nil
	}
	return func() {
		if err := g.shutdown(); err != nil {
			g.log.Warn("NVML shutdown failed", "err", err)
		}
	}, nil
}

// device returns the handle of GPU i, cached. Callers hold g.mu.
func (g *realGPU) device(i int) (nvml.Device, error) {
	if h, ok := g.handles[i]; ok {
		return h.dev, nil
	}
	if i < 0 {
		return nil, realError("DeviceGetHandleByIndex", i, nvml.ERROR_INVALID_ARGUMENT)
	}
	d, ret := g.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, realError("DeviceGetHandleByIndex", i, ret)
	}
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		return nil, realError("GetUUID", i, ret)
	}
	g.handles[i] = realHandle{dev: d, uuid: uuid}
	return d, nil
}

// reacquire drops GPU i's handle and gets a fresh one, by UUID where it is
// known (nvml.h: a mode change may unbind the device and change its
// attributes), else by index. Callers hold g.mu.
func (g *realGPU) reacquire(i int) (nvml.Device, error) {
	h, ok := g.handles[i]
	delete(g.handles, i)
	if ok && h.uuid != "" {
		if d, ret := g.lib.DeviceGetHandleByUUID(h.uuid); ret == nvml.SUCCESS {
			g.handles[i] = realHandle{dev: d, uuid: h.uuid}
			return d, nil
		}
	}
	return g.device(i)
}

// DriverVersion is the driver version NVML reports ("580.159.04").
func (g *realGPU) DriverVersion() (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	done, err := g.open("SystemGetDriverVersion")
	if err != nil {
		return "", err
	}
	defer done()
	v, ret := g.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return "", realError("SystemGetDriverVersion", -1, ret)
	}
	return v, nil
}

// Close shuts NVML down; later calls fail with ERROR_UNINITIALIZED.
func (g *realGPU) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return g.shutdown()
}

// realBusID turns NVML's fixed-size C string into a Go string.
func realBusID(b [32]int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

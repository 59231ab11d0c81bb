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

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
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
// ErrLibraryNotFound and says so in one line.
func NewReal(o Options) (GPU, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	path, err := realResolveLibrary(o.Library)
	if err != nil {
		return nil, err
	}
	// go-nvml's Init reports only LIBRARY_NOT_FOUND; open it once ourselves
	// to say why (missing file, wrong architecture, ...).
	probe := dl.New(path, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := probe.Open(); err != nil {
		return nil, &realLibraryError{path: path, reason: err.Error()}
	}
	_ = probe.Close()
	return newReal(nvml.New(nvml.WithLibraryPath(path)), realConfig{
		log:      log,
		library:  path,
		sysfs:    "/sys",
		lookPath: exec.LookPath,
		run:      realRunCommand,
	})
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

func realRunCommand(ctx context.Context, name string, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}

// realConfig holds the real backend's side effects, so tests can replace them.
type realConfig struct {
	log      *slog.Logger
	library  string
	sysfs    string // "/sys"
	lookPath func(string) (string, error)
	run      func(ctx context.Context, name string, args ...string) ([]byte, error)
}

// realGPU is the GPU backend over go-nvml. One mutex serializes every call:
// handles are cached and replaced after mode changes and resets.
type realGPU struct {
	lib nvml.Interface
	cfg realConfig
	log *slog.Logger

	mu      sync.Mutex
	closed  bool
	handles map[int]realHandle
	noted   map[string]bool // fallbacks already logged, so each is said once
}

// realHandle is a cached device handle and the UUID to re-acquire it by.
type realHandle struct {
	dev  nvml.Device
	uuid string
}

var _ GPU = (*realGPU)(nil)

// newReal initializes NVML through lib (go-nvml's library or its mock).
func newReal(lib nvml.Interface, cfg realConfig) (*realGPU, error) {
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if cfg.library == "" {
		cfg.library = LibraryName
	}
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, &realLibraryError{path: cfg.library, reason: "it cannot be loaded"}
	default:
		return nil, fmt.Errorf("initialize NVML from %s: %w", cfg.library, realError("Init", -1, ret))
	}
	g := &realGPU{lib: lib, cfg: cfg, log: cfg.log, handles: map[int]realHandle{}, noted: map[string]bool{}}
	driver, ret := lib.SystemGetDriverVersion()
	cfg.log.Info("NVML opened", "library", cfg.library, "driver", driver, "return", realReturnName(ret))
	return g, nil
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

// open checks the backend is not closed. Callers hold g.mu.
func (g *realGPU) open(op string) error {
	if g.closed {
		return fmt.Errorf("NVML already closed: %w", realError(op, -1, nvml.ERROR_UNINITIALIZED))
	}
	return nil
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
	if err := g.open("SystemGetDriverVersion"); err != nil {
		return "", err
	}
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
	g.handles = map[int]realHandle{}
	if ret := g.lib.Shutdown(); ret != nvml.SUCCESS && ret != nvml.ERROR_UNINITIALIZED {
		return realError("Shutdown", -1, ret)
	}
	return nil
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

package nvmlx

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/internal/backoff"
)

// realResetTimeout bounds one `nvidia-smi -r`.
const realResetTimeout = 2 * time.Minute

// realSysfsBDF turns NVML's bus id ("00000000:00:06.0") into the name of
// the device under /sys/bus/pci/devices ("0000:00:06.0"): the domain with
// four hex digits, lower case.
func realSysfsBDF(nvmlBusID string) (string, error) {
	domain, rest, ok := strings.Cut(strings.ToLower(nvmlBusID), ":")
	if !ok || rest == "" {
		return "", fmt.Errorf("PCI bus id %q: want DOMAIN:BUS:DEVICE.FUNCTION", nvmlBusID)
	}
	d, err := strconv.ParseUint(domain, 16, 32)
	if err != nil {
		return "", fmt.Errorf("PCI bus id %q: bad domain: %w", nvmlBusID, err)
	}
	return fmt.Sprintf("%04x:%s", d, rest), nil
}

// pciBusID reads GPU i's bus id as NVML prints it. Callers hold g.mu.
func (g *realGPU) pciBusID(i int) (string, error) {
	dev, err := g.device(i)
	if err != nil {
		return "", err
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return "", realError("GetPciInfo", i, ret)
	}
	return realBusID(pci.BusId), nil
}

// realPCI is what the backend reads and does through the kernel's PCI
// view (sysfs on a real node, the simulator's node in tests).
type realPCI interface {
	// HasReset reports whether the kernel exposes a function reset for the
	// device (/sys/bus/pci/devices/BDF/reset).
	HasReset(bdf string) (bool, error)
	// Driver names the kernel driver bound to the device ("nvidia"), "" for none.
	Driver(bdf string) (string, error)
	// Reset resets the PCI function through sysfs.
	Reset(bdf string) error
}

// realSysfs is realPCI over /sys.
type realSysfs struct{ root string }

func (s realSysfs) dev(bdf string) string { return filepath.Join(s.root, "bus", "pci", "devices", bdf) }

func (s realSysfs) HasReset(bdf string) (bool, error) {
	_, err := os.Stat(filepath.Join(s.dev(bdf), "reset"))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, err
}

func (s realSysfs) Driver(bdf string) (string, error) {
	link, err := os.Readlink(filepath.Join(s.dev(bdf), "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(link), nil
}

func (s realSysfs) Reset(bdf string) error {
	return os.WriteFile(filepath.Join(s.dev(bdf), "reset"), []byte("1"), 0)
}

// resetPlan says how GPU i would be reset: the sysfs name of its PCI
// function, its bus id as NVML prints it, and whether the nvidia driver is
// bound (then only `nvidia-smi -r` may reset it). Callers hold g.mu.
func (g *realGPU) resetPlan(i int) (bdf, bus, driver string, err error) {
	bus, err = g.pciBusID(i)
	if err != nil {
		return "", "", "", err
	}
	bdf, err = realSysfsBDF(bus)
	if err != nil {
		return "", "", "", err
	}
	driver, err = g.cfg.pci.Driver(bdf)
	if err != nil {
		return "", "", "", fmt.Errorf("driver of GPU %s: %w", bus, err)
	}
	return bdf, bus, driver, nil
}

// CanReset reports whether GPU i can be reset on its own: not inside a
// vGPU guest, the kernel exposes a reset for its PCI function (the check
// NVIDIA's MIG manager makes before it resets instead of rebooting), and,
// while a driver is bound, nvidia-smi is there to do it (NVIDIA's mig-parted
// resets through the PCI function only when the nvidia module is not
// loaded; with it loaded it runs `nvidia-smi -r`). Passthrough alone does
// not rule a reset out (the H200 read for the fixtures is passthrough with
// FLR).
func (g *realGPU) CanReset(i int) (bool, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	done, err := g.open("CanReset")
	if err != nil {
		return false, err.Error()
	}
	defer done()
	dev, err := g.device(i)
	if err != nil {
		return false, err.Error()
	}
	if g.hasSymbol("nvmlDeviceGetVirtualizationMode") {
		if m, ret := dev.GetVirtualizationMode(); ret == nvml.SUCCESS && m == nvml.GPU_VIRTUALIZATION_MODE_VGPU {
			return false, "vGPU guest: the GPU cannot be reset from inside the VM"
		}
	}
	bdf, bus, driver, err := g.resetPlan(i)
	if err != nil {
		return false, err.Error()
	}
	has, err := g.cfg.pci.HasReset(bdf)
	if err != nil {
		return false, fmt.Sprintf("PCI reset of GPU %s: %v", bus, err)
	}
	if !has {
		return false, fmt.Sprintf("no PCI reset for GPU %s (the kernel exposes no reset for %s)", bus, bdf)
	}
	if driver != "" {
		if _, err := g.cfg.lookPath("nvidia-smi"); err != nil {
			return false, fmt.Sprintf("GPU %s is bound to the %s driver and nvidia-smi is not installed: "+
				"a GPU in use by the driver is reset only with nvidia-smi -r", bus, driver)
		}
	}
	return true, ""
}

// realSMIReturn turns a failed `nvidia-smi -r` into the NVML return it
// stands for, from its exit code (nvidia-smi(1) "RETURN VALUE": 3 not
// supported, 4 no permission, 9 driver not loaded, 15 GPU lost) and, for a
// GPU still in use, its message.
func realSMIReturn(err error, out []byte) nvml.Return {
	if strings.Contains(strings.ToLower(string(out)), "in use") {
		return nvml.ERROR_IN_USE
	}
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		switch ec.ExitCode() {
		case 3:
			return nvml.ERROR_NOT_SUPPORTED
		case 4:
			return nvml.ERROR_NO_PERMISSION
		case 9:
			return nvml.ERROR_DRIVER_NOT_LOADED
		case 15:
			return nvml.ERROR_GPU_IS_LOST
		}
	}
	return nvml.ERROR_UNKNOWN
}

// ErrNVMLNotBack: NVML could not be initialized again after a GPU reset.
// The reset itself may well have happened; nothing can be read until NVML
// answers, so the caller neither judges the reset nor reboots for it: it
// waits for NVML (Begin retries the initialization) and reads again.
var ErrNVMLNotBack = errors.New("NVML not back after the GPU reset")

// ResetGPU resets GPU i so a pending MIG mode takes effect: `nvidia-smi -r
// -i BUSID` while the driver is bound (NVIDIA's way: it checks for clients
// first), the sysfs reset only when no driver is bound. NVML is shut down
// around the reset, since an open NVML session counts as a client, and
// initialized again afterwards with a jittered backoff; when that keeps
// failing the error wraps ErrNVMLNotBack, and the next call or Begin
// initializes NVML again.
func (g *realGPU) ResetGPU(i int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	done, err := g.open("ResetGPU")
	if err != nil {
		return err
	}
	defer done()
	bdf, bus, driver, err := g.resetPlan(i)
	if err != nil {
		return err
	}
	smi, smiErr := g.cfg.lookPath("nvidia-smi")
	if driver != "" && smiErr != nil {
		return fmt.Errorf("GPU %s is bound to the %s driver and nvidia-smi is not installed: %w", bus, driver, smiErr)
	}
	if err := g.shutdown(); err != nil {
		return err
	}
	var resetErr error
	if driver != "" {
		g.log.Info("resetting GPU", "gpu", i, "busId", bus, "with", smi)
		ctx, cancel := context.WithTimeout(context.Background(), realResetTimeout)
		out, err := g.cfg.run(ctx, smi, "-r", "-i", bus)
		cancel()
		if err != nil {
			resetErr = fmt.Errorf("nvidia-smi -r -i %s: %v: %s: %w", bus, err, strings.TrimSpace(string(out)),
				realError("ResetGpu", i, realSMIReturn(err, out)))
		}
	} else {
		g.log.Info("resetting GPU", "gpu", i, "busId", bus, "with", "sysfs")
		if err := g.cfg.pci.Reset(bdf); err != nil {
			resetErr = fmt.Errorf("reset GPU %s through sysfs: %w", bus, err)
		}
	}
	var initErr error
	b := backoff.NVMLReinit()
	for try := 1; ; try++ {
		if initErr = g.init(); initErr == nil {
			break
		}
		if b.Steps <= 1 {
			g.log.Error("NVML not back after the reset; giving up for now (the next call tries again)", "gpu", i, "tries", try, "err", initErr)
			break
		}
		wait := b.Step()
		g.log.Warn("NVML not back after the reset; retrying", "gpu", i, "try", try, "wait", wait, "err", initErr)
		g.cfg.sleep(wait)
	}
	if initErr != nil {
		return errors.Join(resetErr, fmt.Errorf("%w: re-initializing it failed (the next call tries again): %w", ErrNVMLNotBack, initErr))
	}
	return resetErr
}

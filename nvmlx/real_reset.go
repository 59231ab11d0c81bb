package nvmlx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
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

// resetPath is the sysfs file that resets GPU i's PCI function.
func (g *realGPU) resetPath(busID string) (string, error) {
	bdf, err := realSysfsBDF(busID)
	if err != nil {
		return "", err
	}
	return filepath.Join(g.cfg.sysfs, "bus", "pci", "devices", bdf, "reset"), nil
}

// CanReset reports whether GPU i can be reset on its own: not inside a
// vGPU guest, and the kernel exposes a reset for its PCI function (the
// check NVIDIA's mig-manager makes). Passthrough alone does not rule a
// reset out (the H200 read for the fixtures is passthrough with FLR).
func (g *realGPU) CanReset(i int) (bool, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open("CanReset"); err != nil {
		return false, err.Error()
	}
	dev, err := g.device(i)
	if err != nil {
		return false, err.Error()
	}
	if g.hasSymbol("nvmlDeviceGetVirtualizationMode") {
		if m, ret := dev.GetVirtualizationMode(); ret == nvml.SUCCESS && m == nvml.GPU_VIRTUALIZATION_MODE_VGPU {
			return false, "vGPU guest: the GPU cannot be reset from inside the VM"
		}
	}
	bus, err := g.pciBusID(i)
	if err != nil {
		return false, err.Error()
	}
	path, err := g.resetPath(bus)
	if err != nil {
		return false, err.Error()
	}
	if _, err := os.Stat(path); err != nil {
		return false, fmt.Sprintf("no PCI reset for GPU %s (%s: %v)", bus, path, errors.Unwrap(err))
	}
	return true, ""
}

// ResetGPU resets GPU i so a pending MIG mode takes effect: with
// `nvidia-smi -r -i BUSID` where nvidia-smi is installed (NVIDIA's way,
// which checks for clients first), else through the sysfs reset file. NVML
// is shut down around the reset, since an open NVML session counts as a
// client, and every handle is re-acquired afterwards.
func (g *realGPU) ResetGPU(i int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open("ResetGPU"); err != nil {
		return err
	}
	bus, err := g.pciBusID(i)
	if err != nil {
		return err
	}
	path, err := g.resetPath(bus)
	if err != nil {
		return err
	}
	smi, smiErr := g.cfg.lookPath("nvidia-smi")
	if ret := g.lib.Shutdown(); ret != nvml.SUCCESS {
		return realError("Shutdown", i, ret)
	}
	g.handles = map[int]realHandle{}
	var resetErr error
	if smiErr == nil {
		g.log.Info("resetting GPU", "gpu", i, "busId", bus, "with", smi)
		ctx, cancel := context.WithTimeout(context.Background(), realResetTimeout)
		out, err := g.cfg.run(ctx, smi, "-r", "-i", bus)
		cancel()
		if err != nil {
			resetErr = fmt.Errorf("nvidia-smi -r -i %s: %w: %s", bus, err, strings.TrimSpace(string(out)))
		}
	} else {
		g.log.Info("resetting GPU", "gpu", i, "busId", bus, "with", path)
		if err := os.WriteFile(path, []byte("1"), 0); err != nil {
			resetErr = fmt.Errorf("reset GPU %s through sysfs: %w", bus, err)
		}
	}
	if ret := g.lib.Init(); ret != nvml.SUCCESS {
		g.closed = true
		return errors.Join(resetErr, fmt.Errorf("re-initialize NVML after the reset: %w", realError("Init", i, ret)))
	}
	return resetErr
}

//go:build realgpu

package nvmlx

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestRealGPUReadOnly reads this machine's GPUs through NVML and through
// the real backend and writes a realCapture as JSON to $REAL_CAPTURE_OUT
// (or the test log). It only reads: no MIG mode change, no instance
// created or destroyed, no reset, no setting changed. Run it on a machine
// with a driver: go test -tags realgpu -run TestRealGPUReadOnly ./nvmlx
// ($MIG_AGENT_NVML_LIBRARY: the library or driver root, optional).
func TestRealGPUReadOnly(t *testing.T) {
	setting := os.Getenv("MIG_AGENT_NVML_LIBRARY")
	path, err := realResolveLibrary(setting)
	if err != nil {
		t.Fatal(err)
	}
	c := realCapture{
		Note: "read-only capture by nvmlx TestRealGPUReadOnly (go test -tags realgpu); " +
			"raw = NVML's answers, gpus = what the real backend reports",
		CapturedAt: time.Now().UTC().Format(time.RFC3339),
		Library:    path,
	}

	lib := nvml.New(nvml.WithLibraryPath(path))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("nvml Init: %s", realReturnName(ret))
	}
	defer lib.Shutdown()
	has := func(s string) bool { return lib.Extensions().LookupSymbol(s) == nil }
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetCount: %s", realReturnName(ret))
	}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByIndex(%d): %s", i, realReturnName(ret))
		}
		r := realRawGPU{Index: i}
		r.Name, _ = d.GetName()
		r.UUID, _ = d.GetUUID()
		pci, _ := d.GetPciInfo()
		r.PCIBusID, r.PCIDeviceID = realBusID(pci.BusId), fmt.Sprintf("0x%08X", pci.PciDeviceId)
		mem, _ := d.GetMemoryInfo()
		r.MemoryTotalBytes = mem.Total
		if has("nvmlDeviceGetArchitecture") {
			a, _ := d.GetArchitecture()
			r.Architecture = uint32(a)
		}
		if has("nvmlDeviceGetMigMode") {
			cur, pend, ret := d.GetMigMode()
			r.MigMode = realRawMigMode{Current: cur, Pending: pend, Return: realReturnName(ret)}
		}
		for idx := range nvml.GPU_INSTANCE_PROFILE_COUNT {
			info, ret := d.GetGpuInstanceProfileInfo(idx)
			p := realRawProfile{Index: idx, Return: realReturnName(ret)}
			if ret == nvml.SUCCESS {
				p.Info = &info
				if has("nvmlDeviceGetGpuInstancePossiblePlacements_v2") || has("nvmlDeviceGetGpuInstancePossiblePlacements") {
					pls, ret := d.GetGpuInstancePossiblePlacements(&info)
					p.Placements, p.PlacementsReturn = pls, realReturnName(ret)
				}
			}
			r.Profiles = append(r.Profiles, p)
		}
		c.Raw = append(c.Raw, r)
	}

	g, err := NewReal(Options{Library: setting, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatalf("NewReal: %v", err)
	}
	defer g.Close()
	if c.DriverVersion, err = g.DriverVersion(); err != nil {
		t.Fatalf("DriverVersion: %v", err)
	}
	devs, err := g.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	for _, d := range devs {
		cg := realCapturedGPU{Device: d, PCIDeviceID: d.PCIDeviceIDString(), Catalogue: d.Catalogue}
		if cg.Instances, err = g.Instances(d.Index); err != nil {
			t.Errorf("Instances(%d): %v", d.Index, err)
		}
		if cg.Processes, err = g.Processes(d.Index); err != nil {
			t.Errorf("Processes(%d): %v", d.Index, err)
		}
		cg.CanReset, cg.ResetReason = g.CanReset(d.Index)
		c.GPUs = append(c.GPUs, cg)
		t.Logf("GPU %d: %s %s %s arch=%s mig=%v/%v profiles=[%s] instances=%d processes=%d canReset=%v %s",
			d.Index, d.Name, d.PCIDeviceIDString(), d.PCIBusID, d.Architecture, d.MigMode.Current, d.MigMode.Pending,
			d.Catalogue.Names(), len(cg.Instances), len(cg.Processes), cg.CanReset, cg.ResetReason)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	if out := os.Getenv("REAL_CAPTURE_OUT"); out != "" {
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Logf("%s", b)
}

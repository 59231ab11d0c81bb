//go:build realgpu

package nvmlx

import (
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
)

// TestRealGPUReadOnly reads this machine's GPUs through NVML and through
// the real backend, compares each GPU field by field with the simulated
// GPU of the same model read through the same nvml.Interface calls, and
// writes a realCapture as JSON to $REAL_CAPTURE_OUT (or the test log). It only reads: no MIG mode change, no instance
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
		t.Fatalf("nvml Init: %s", nvmlreturn.Name(ret))
	}
	defer lib.Shutdown()
	has := func(s string) bool { return lib.Extensions().LookupSymbol(s) == nil }
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetCount: %s", nvmlreturn.Name(ret))
	}
	for i := range n {
		r, err := readRaw(lib, i, has)
		if err != nil {
			t.Fatal(err)
		}
		// The simulated GPU of the same model, through the same calls.
		sim, ok, err := simRawFor(r)
		switch {
		case err != nil:
			t.Errorf("GPU %d: simulator: %v", i, err)
		case !ok:
			t.Logf("GPU %d (%s): the simulator has no such model; not compared", i, r.PCIDeviceID)
		default:
			r.SimDiffs = compareRaw(r, sim)
			for _, d := range r.SimDiffs {
				t.Errorf("GPU %d: the simulator differs from the hardware: %s", i, d)
			}
			if len(r.SimDiffs) == 0 {
				t.Logf("GPU %d: the simulated %s answers every read like the hardware", i, r.Name)
			}
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

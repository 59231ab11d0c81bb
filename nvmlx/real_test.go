package nvmlx

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
)

// syncBuffer is a log sink safe for the backend's logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type testReal struct {
	*realGPU
	fake  *fakeNVML
	logs  *syncBuffer
	sysfs string
	ran   [][]string
}

// newTestReal opens the real backend on a fake NVML. nvidia-smi is absent
// unless a test sets lookPath.
func newTestReal(t *testing.T, f *fakeNVML) *testReal {
	t.Helper()
	tr := &testReal{fake: f, logs: &syncBuffer{}, sysfs: t.TempDir()}
	g, err := newReal(f.lib, realConfig{
		log:      slog.New(slog.NewTextHandler(tr.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		pci:      realSysfs{root: tr.sysfs},
		lookPath: func(string) (string, error) { return "", exec.ErrNotFound },
		run: func(_ context.Context, name string, args ...string) ([]byte, error) {
			tr.ran = append(tr.ran, append([]string{name}, args...))
			return nil, nil
		},
	})
	if err != nil {
		t.Fatalf("newReal: %v", err)
	}
	tr.realGPU = g
	t.Cleanup(func() { _ = g.Close() })
	return tr
}

// wantNVMLError asserts err carries an *Error with op and return name.
func wantNVMLError(t *testing.T, err error, op, ret string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v: want an *nvmlx.Error", err)
	}
	if e.Op != op || e.Return != ret {
		t.Fatalf("error %v: got op %q return %q, want %q %q", err, e.Op, e.Return, op, ret)
	}
}

func simDeviceOf(t *testing.T, key string) Device {
	t.Helper()
	s, err := NewSim(key+"x1", nvmlsim.Options{})
	if err != nil {
		t.Fatalf("NewSim: %v", err)
	}
	ds, err := s.Devices()
	if err != nil || len(ds) != 1 {
		t.Fatalf("sim Devices: %v %v", ds, err)
	}
	return ds[0]
}

// TestRealDevicesMatchSimulator: fed with what NVML reports for each known
// model, discovery computes the same catalogue (names, ids, counts, memory,
// placements, engines, compute profiles, order) the simulator claims.
func TestRealDevicesMatchSimulator(t *testing.T) {
	for _, m := range profiles.Models() {
		t.Run(m.Key, func(t *testing.T) {
			g := newTestReal(t, newFakeNVML(m.Key))
			ds, err := g.Devices()
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			if len(ds) != 1 {
				t.Fatalf("got %d devices", len(ds))
			}
			got, want := ds[0], simDeviceOf(t, m.Key)
			if got.Name != want.Name || got.PCIDeviceID != want.PCIDeviceID || got.MemoryMiB != want.MemoryMiB ||
				got.Architecture != want.Architecture || got.MigCapable != want.MigCapable {
				t.Errorf("device: got %+v\nwant %+v", got, want)
			}
			if got.UUID != "GPU-fake-0" || got.PCIBusID != "00000000:10:00.0" || got.Index != 0 {
				t.Errorf("identity: got %q %q %d", got.UUID, got.PCIBusID, got.Index)
			}
			if !reflect.DeepEqual(got.Catalogue, want.Catalogue) {
				t.Errorf("catalogue:\ngot  %+v\nwant %+v", got.Catalogue, want.Catalogue)
			}
		})
	}
}

// TestRealProfileWalk: the walk goes on past NOT_SUPPORTED and
// INVALID_ARGUMENT wherever they fall, and stops on any other failure.
func TestRealProfileWalk(t *testing.T) {
	tests := []struct {
		name    string
		holes   map[int]nvml.Return
		without []string // profile names that must be gone
		err     string   // return name of the expected error
	}{
		{name: "invalid argument at 17 (driver 580)", holes: map[int]nvml.Return{17: nvml.ERROR_INVALID_ARGUMENT}},
		{name: "invalid argument early, later indices still read",
			holes:   map[int]nvml.Return{1: nvml.ERROR_INVALID_ARGUMENT, 5: nvml.ERROR_INVALID_ARGUMENT, 17: nvml.ERROR_INVALID_ARGUMENT},
			without: []string{"2g.35gb"}},
		{name: "not supported early", holes: map[int]nvml.Return{0: nvml.ERROR_NOT_SUPPORTED}, without: []string{"1g.18gb"}},
		{name: "other failure stops", holes: map[int]nvml.Return{3: nvml.ERROR_GPU_IS_LOST}, err: "ERROR_GPU_IS_LOST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNVML("h200")
			f.gpus[0].infoRet = tc.holes
			g := newTestReal(t, f)
			ds, err := g.Devices()
			if tc.err != "" {
				wantNVMLError(t, err, "GetGpuInstanceProfileInfo", tc.err)
				return
			}
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			var asked []int
			for _, c := range f.gpus[0].dev.GetGpuInstanceProfileInfoCalls() {
				asked = append(asked, c.N)
			}
			if len(asked) != nvml.GPU_INSTANCE_PROFILE_COUNT || asked[len(asked)-1] != nvml.GPU_INSTANCE_PROFILE_COUNT-1 {
				t.Errorf("indices asked: %v, want 0..%d", asked, nvml.GPU_INSTANCE_PROFILE_COUNT-1)
			}
			h200, _ := profiles.ModelByKey("h200")
			for _, p := range h200.Catalogue.Profiles {
				_, have := ds[0].Catalogue.ByID(p.ID)
				gone := false
				for _, w := range tc.without {
					gone = gone || w == p.Name
				}
				if have == gone {
					t.Errorf("profile %s: present %v, want %v", p.Name, have, !gone)
				}
			}
		})
	}
}

// TestRealOldDriver: a MIG-capable GPU whose every profile query says
// NOT_SUPPORTED (driver 535 with MIG disabled) gets the static catalogue of
// its model, said in the log; an unknown model gets an error.
func TestRealOldDriver(t *testing.T) {
	notSupported := map[int]nvml.Return{}
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		notSupported[i] = nvml.ERROR_NOT_SUPPORTED
	}
	t.Run("known model", func(t *testing.T) {
		f := newFakeNVML("h100-80gb")
		f.gpus[0].infoRet = notSupported
		g := newTestReal(t, f)
		ds, err := g.Devices()
		if err != nil {
			t.Fatalf("Devices: %v", err)
		}
		if want := simDeviceOf(t, "h100-80gb").Catalogue; !reflect.DeepEqual(ds[0].Catalogue, want) {
			t.Errorf("catalogue:\ngot  %+v\nwant %+v", ds[0].Catalogue, want)
		}
		if !strings.Contains(g.logs.String(), "using the static catalogue") || !strings.Contains(g.logs.String(), "model=h100-80gb") {
			t.Errorf("log does not say the static catalogue is used:\n%s", g.logs)
		}
		// Listing instances on the fallback still works (MIG on, none yet).
		f.gpus[0].migCur, f.gpus[0].migPend = 1, 1
		if gis, err := g.Instances(0); err != nil || len(gis) != 0 {
			t.Errorf("Instances: %v %v", gis, err)
		}
	})
	t.Run("unknown model", func(t *testing.T) {
		f := newFakeNVML("h200")
		f.gpus[0].infoRet = notSupported
		f.gpus[0].pciID = 0x12345678
		g := newTestReal(t, f)
		_, err := g.Devices()
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "no static catalogue") ||
			!strings.Contains(err.Error(), "0x12345678") {
			t.Fatalf("Devices: %v, want an ERROR_NOT_SUPPORTED naming the model", err)
		}
	})
}

// TestRealA30Counts: the A30's NVML instance counts are wrong; the static
// catalogue's are used and the log says so.
func TestRealA30Counts(t *testing.T) {
	f := newFakeNVML("a30")
	for idx, info := range f.gpus[0].infos {
		info.InstanceCount = 7 // what a buggy driver might say
		f.gpus[0].infos[idx] = info
	}
	g := newTestReal(t, f)
	ds, err := g.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	want := simDeviceOf(t, "a30").Catalogue
	if !reflect.DeepEqual(ds[0].Catalogue, want) {
		t.Errorf("catalogue:\ngot  %+v\nwant %+v", ds[0].Catalogue, want)
	}
	if _, err := g.Devices(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(g.logs.String(), "A30: NVML's instance counts are known to be wrong"); n != 1 {
		t.Errorf("log mentions the A30 correction %d times, want once:\n%s", n, g.logs)
	}
}

// TestRealMissingSymbols: entry points an old driver lacks give errors or
// fallbacks, never a call (the mock would panic on an unset function).
func TestRealMissingSymbols(t *testing.T) {
	t.Run("no CreateGpuInstanceWithPlacement", func(t *testing.T) {
		f := newFakeNVML("h200")
		f.missing["nvmlDeviceCreateGpuInstanceWithPlacement"] = true
		f.gpus[0].migCur, f.gpus[0].migPend = 1, 1
		f.gpus[0].dev.CreateGpuInstanceWithPlacementFunc = nil // a call would panic
		g := newTestReal(t, f)
		_, err := g.CreateGPUInstance(0, 19, profiles.Placement{Start: 0, Size: 1})
		wantNVMLError(t, err, "CreateGpuInstanceWithPlacement", "ERROR_FUNCTION_NOT_FOUND")
	})
	t.Run("no GetMigMode", func(t *testing.T) {
		f := newFakeNVML("h200")
		f.missing["nvmlDeviceGetMigMode"] = true
		f.gpus[0].dev.GetMigModeFunc = nil
		g := newTestReal(t, f)
		ds, err := g.Devices()
		if err != nil || ds[0].MigCapable || len(ds[0].Catalogue.Profiles) != 0 {
			t.Fatalf("Devices: %+v %v, want a GPU without MIG", ds, err)
		}
	})
	t.Run("no placements", func(t *testing.T) {
		f := newFakeNVML("h200")
		f.missing["nvmlDeviceGetGpuInstancePossiblePlacements_v2"] = true
		f.missing["nvmlDeviceGetGpuInstancePossiblePlacements"] = true
		f.gpus[0].dev.GetGpuInstancePossiblePlacementsFunc = nil
		g := newTestReal(t, f)
		ds, err := g.Devices()
		if err != nil {
			t.Fatalf("Devices: %v", err)
		}
		if want := simDeviceOf(t, "h200").Catalogue; !reflect.DeepEqual(ds[0].Catalogue, want) {
			t.Errorf("catalogue:\ngot  %+v\nwant %+v", ds[0].Catalogue, want)
		}
	})
	t.Run("no architecture", func(t *testing.T) {
		f := newFakeNVML("h200")
		f.missing["nvmlDeviceGetArchitecture"] = true
		f.gpus[0].dev.GetArchitectureFunc = nil
		g := newTestReal(t, f)
		ds, err := g.Devices()
		if err != nil || ds[0].Architecture != profiles.ArchHopper {
			t.Fatalf("Devices: %+v %v, want hopper from the model table", ds, err)
		}
	})
	t.Run("no SetMigMode", func(t *testing.T) {
		f := newFakeNVML("h200")
		f.missing["nvmlDeviceSetMigMode"] = true
		f.gpus[0].dev.SetMigModeFunc = nil
		g := newTestReal(t, f)
		_, err := g.SetMigMode(0, true)
		wantNVMLError(t, err, "SetMigMode", "ERROR_FUNCTION_NOT_FOUND")
	})
}

// TestRealSetMigMode: both of go-nvml's returns are checked, in their
// order (activationStatus, ret), and the mode is read back.
func TestRealSetMigMode(t *testing.T) {
	tests := []struct {
		name       string
		activation nvml.Return
		ret        nvml.Return
		after      [2]int // current, pending after the call
		want       MigMode
		sentinel   error
		errOp      string
		msg        string // in the error message
	}{
		{name: "takes effect", after: [2]int{1, 1}, want: MigMode{true, true}},
		{name: "in use", ret: nvml.ERROR_IN_USE, want: MigMode{}, sentinel: ErrInUse, errOp: "SetMigMode",
			msg: "nvml SetMigMode on GPU 0: ERROR_IN_USE"},
		// An activation that did not happen leaves the mode pending: no
		// error, the caller resets or reboots (mig-parted reads pending back).
		{name: "reset required", activation: nvml.ERROR_RESET_REQUIRED, after: [2]int{0, 1},
			want: MigMode{Current: false, Pending: true}},
		{name: "activation in use", activation: nvml.ERROR_IN_USE, after: [2]int{0, 1},
			want: MigMode{Current: false, Pending: true}},
		{name: "activation in use, nothing pending", activation: nvml.ERROR_IN_USE, after: [2]int{0, 0},
			want: MigMode{}, sentinel: ErrInUse, errOp: "SetMigMode",
			msg: "activation of the MIG mode failed and nothing is pending"},
		{name: "no permission", ret: nvml.ERROR_NO_PERMISSION, sentinel: ErrNoPermission, errOp: "SetMigMode",
			msg: "ERROR_NO_PERMISSION"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNVML("h200")
			fg := f.gpus[0]
			fg.setMig = func(mode int) (nvml.Return, nvml.Return) {
				if mode != nvml.DEVICE_MIG_ENABLE {
					t.Errorf("SetMigMode(%d), want enable", mode)
				}
				fg.migCur, fg.migPend = tc.after[0], tc.after[1]
				return tc.activation, tc.ret
			}
			g := newTestReal(t, f)
			if _, err := g.Devices(); err != nil { // caches the handle
				t.Fatal(err)
			}
			byUUID := len(f.lib.DeviceGetHandleByUUIDCalls())
			got, err := g.SetMigMode(0, true)
			if got != tc.want {
				t.Errorf("mode %+v, want %+v", got, tc.want)
			}
			if tc.sentinel == nil {
				if err != nil {
					t.Fatalf("SetMigMode: %v", err)
				}
			} else {
				if !errors.Is(err, tc.sentinel) {
					t.Fatalf("SetMigMode: %v, want %v", err, tc.sentinel)
				}
				wantNVMLError(t, err, tc.errOp, tc.sentinel.(*Error).Return)
				if !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("message %q, want it to contain %q", err, tc.msg)
				}
				if tc.ret != nvml.SUCCESS && strings.Contains(err.Error(), "activation") {
					t.Errorf("message %q blames the activation for a failed call", err)
				}
			}
			if len(f.lib.DeviceGetHandleByUUIDCalls()) != byUUID+1 {
				t.Errorf("handle not re-acquired by UUID after the mode change")
			}
		})
	}
}

// TestRealInstancesLifecycle creates, lists and destroys instances and
// checks the NVML failures on the way.
func TestRealInstancesLifecycle(t *testing.T) {
	f := newFakeNVML("h200")
	fg := f.gpus[0]
	g := newTestReal(t, f)

	if gis, err := g.Instances(0); err != nil || len(gis) != 0 {
		t.Fatalf("Instances with MIG off: %v %v", gis, err)
	}
	if _, err := g.SetMigMode(0, true); err != nil {
		t.Fatal(err)
	}
	gi3, err := g.CreateGPUInstance(0, 9, profiles.Placement{Start: 4, Size: 4})
	if err != nil {
		t.Fatalf("create 3g: %v", err)
	}
	call := fg.dev.CreateGpuInstanceWithPlacementCalls()[0]
	if call.GpuInstanceProfileInfo.Id != 9 || *call.GpuInstancePlacement != (nvml.GpuInstancePlacement{Start: 4, Size: 4}) {
		t.Errorf("NVML asked for profile %d at %+v", call.GpuInstanceProfileInfo.Id, *call.GpuInstancePlacement)
	}
	gi1, err := g.CreateGPUInstance(0, 19, profiles.Placement{Start: 0, Size: 1})
	if err != nil {
		t.Fatalf("create 1g: %v", err)
	}

	// Occupied placement: INSUFFICIENT_RESOURCES.
	_, err = g.CreateGPUInstance(0, 9, profiles.Placement{Start: 4, Size: 4})
	if !errors.Is(err, ErrInsufficientResources) {
		t.Fatalf("create on an occupied placement: %v", err)
	}
	wantNVMLError(t, err, "CreateGpuInstanceWithPlacement", "ERROR_INSUFFICIENT_RESOURCES")
	// Unknown profile id.
	_, err = g.CreateGPUInstance(0, 99, profiles.Placement{Start: 0, Size: 1})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("create of an unknown profile: %v", err)
	}

	ciFull, err := g.CreateComputeInstance(0, gi1, 0)
	if err != nil {
		t.Fatalf("create CI: %v", err)
	}
	if ciFull.Profile != "1g.18gb" || ciFull.UUID == "" || ciFull.ProfileID != 0 {
		t.Errorf("full CI: %+v", ciFull)
	}
	ci1, err := g.CreateComputeInstance(0, gi3, 0)
	if err != nil {
		t.Fatalf("create 1c CI: %v", err)
	}
	if ci1.Profile != "1c.3g.71gb" {
		t.Errorf("1c CI named %q", ci1.Profile)
	}
	fg.fail["CreateComputeInstance"] = nvml.ERROR_INSUFFICIENT_RESOURCES
	_, err = g.CreateComputeInstance(0, gi3, 1)
	wantNVMLError(t, err, "CreateComputeInstance", "ERROR_INSUFFICIENT_RESOURCES")
	_, err = g.CreateComputeInstance(0, gi3, 42)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("create of an unknown CI profile: %v", err)
	}

	gis, err := g.Instances(0)
	if err != nil {
		t.Fatalf("Instances: %v", err)
	}
	want := []GPUInstance{
		{ID: gi1, ProfileID: 19, Profile: "1g.18gb", Placement: profiles.Placement{Start: 0, Size: 1},
			ComputeInstances: []ComputeInstance{{ID: ciFull.ID, ProfileID: 0, Profile: "1g.18gb", UUID: ciFull.UUID}}},
		{ID: gi3, ProfileID: 9, Profile: "3g.71gb", Placement: profiles.Placement{Start: 4, Size: 4},
			ComputeInstances: []ComputeInstance{{ID: ci1.ID, ProfileID: 0, Profile: "1c.3g.71gb", UUID: ci1.UUID}}},
	}
	if !reflect.DeepEqual(gis, want) {
		t.Errorf("Instances:\ngot  %+v\nwant %+v", gis, want)
	}

	// A GI with a CI: IN_USE; a CI with a process: IN_USE.
	err = g.DestroyGPUInstance(0, gi3)
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("destroy GI with a CI: %v", err)
	}
	wantNVMLError(t, err, "GpuInstance.Destroy", "ERROR_IN_USE")
	fg.fail["ComputeInstance.Destroy"] = nvml.ERROR_IN_USE
	err = g.DestroyComputeInstance(0, gi3, ci1.ID)
	wantNVMLError(t, err, "ComputeInstance.Destroy", "ERROR_IN_USE")
	if err := g.DestroyComputeInstance(0, gi3, ci1.ID); err != nil {
		t.Fatalf("destroy CI: %v", err)
	}
	if err := g.DestroyGPUInstance(0, gi3); err != nil {
		t.Fatalf("destroy GI: %v", err)
	}
	err = g.DestroyGPUInstance(0, gi3)
	wantNVMLError(t, err, "GetGpuInstanceById", "ERROR_NOT_FOUND")
	if gis, err := g.Instances(0); err != nil || len(gis) != 1 || gis[0].ID != gi1 {
		t.Fatalf("Instances after destroy: %+v %v", gis, err)
	}
}

// TestRealModeChangeInUse: disabling MIG while instances exist.
func TestRealModeChangeInUse(t *testing.T) {
	f := newFakeNVML("h200")
	fg := f.gpus[0]
	fg.migCur, fg.migPend = 1, 1
	fg.setMig = func(int) (nvml.Return, nvml.Return) { return nvml.SUCCESS, nvml.ERROR_IN_USE }
	g := newTestReal(t, f)
	mode, err := g.SetMigMode(0, false)
	if !errors.Is(err, ErrInUse) || mode != (MigMode{true, true}) {
		t.Fatalf("SetMigMode: %+v %v", mode, err)
	}
	if !strings.Contains(err.Error(), "nvml SetMigMode on GPU 0: ERROR_IN_USE") {
		t.Errorf("message %q", err)
	}
}

func TestRealProcesses(t *testing.T) {
	f := newFakeNVML("h200")
	na := ^uint32(0)
	f.gpus[0].procs = []nvml.ProcessInfo{
		{Pid: 30, GpuInstanceId: 1, ComputeInstanceId: 0},
		{Pid: 10, GpuInstanceId: na, ComputeInstanceId: na},
	}
	f.gpus[0].gprocs = []nvml.ProcessInfo{{Pid: 30, GpuInstanceId: 1, ComputeInstanceId: 0}, {Pid: 20, GpuInstanceId: 2, ComputeInstanceId: 1}}
	g := newTestReal(t, f)
	got, err := g.Processes(0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Process{
		{PID: 10, GIID: -1, CIID: -1, Name: "proc10"},
		{PID: 20, GIID: 2, CIID: 1, Name: "proc20"},
		{PID: 30, GIID: 1, CIID: 0, Name: "proc30"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Processes:\ngot  %+v\nwant %+v", got, want)
	}
	f.gpus[0].dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	_, err = g.Processes(0)
	wantNVMLError(t, err, "GetComputeRunningProcesses", "ERROR_GPU_IS_LOST")
}

func TestRealCanReset(t *testing.T) {
	tests := []struct {
		name   string
		file   bool
		virt   nvml.GpuVirtualizationMode
		want   bool
		reason string
	}{
		{name: "sysfs reset present", file: true, want: true},
		{name: "passthrough with reset", file: true, virt: nvml.GPU_VIRTUALIZATION_MODE_PASSTHROUGH, want: true},
		{name: "no sysfs reset", reason: "no PCI reset for GPU 00000000:10:00.0"},
		{name: "vGPU guest", file: true, virt: nvml.GPU_VIRTUALIZATION_MODE_VGPU, reason: "vGPU guest"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNVML("h200")
			f.gpus[0].virt = tc.virt
			g := newTestReal(t, f)
			if tc.file {
				dir := filepath.Join(g.sysfs, "bus", "pci", "devices", "0000:10:00.0")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "reset"), nil, 0o200); err != nil {
					t.Fatal(err)
				}
			}
			ok, why := g.CanReset(0)
			if ok != tc.want || !strings.Contains(why, tc.reason) {
				t.Errorf("CanReset = %v %q, want %v containing %q", ok, why, tc.want, tc.reason)
			}
		})
	}
}

// bindNVIDIA makes the fake sysfs show the PCI function bdf bound to the
// nvidia driver, with a reset file when reset is set.
func bindNVIDIA(t *testing.T, g *testReal, bdf string, reset bool) string {
	t.Helper()
	dir := filepath.Join(g.sysfs, "bus", "pci", "devices", bdf)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../bus/pci/drivers/nvidia", filepath.Join(dir, "driver")); err != nil {
		t.Fatal(err)
	}
	if reset {
		if err := os.WriteFile(filepath.Join(dir, "reset"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRealResetGPU(t *testing.T) {
	t.Run("nvidia-smi", func(t *testing.T) {
		f := newFakeNVML("h200", "h200")
		g := newTestReal(t, f)
		bindNVIDIA(t, g, "0000:11:00.0", true)
		g.cfg.lookPath = func(string) (string, error) { return "/usr/bin/nvidia-smi", nil }
		if err := g.ResetGPU(1); err != nil {
			t.Fatal(err)
		}
		if want := [][]string{{"/usr/bin/nvidia-smi", "-r", "-i", "00000000:11:00.0"}}; !reflect.DeepEqual(g.ran, want) {
			t.Errorf("ran %v, want %v", g.ran, want)
		}
		if f.downs != 1 || f.inits != 2 {
			t.Errorf("NVML shut down %d times and initialized %d, want 1 and 2", f.downs, f.inits)
		}
		if _, err := g.Devices(); err != nil {
			t.Errorf("Devices after reset: %v", err)
		}
	})
	t.Run("nvidia-smi fails", func(t *testing.T) {
		f := newFakeNVML("h200")
		g := newTestReal(t, f)
		bindNVIDIA(t, g, "0000:10:00.0", true)
		g.cfg.lookPath = func(string) (string, error) { return "/usr/bin/nvidia-smi", nil }
		g.cfg.run = func(context.Context, string, ...string) ([]byte, error) {
			return []byte("GPU 00000000:10:00.0 is currently in use by another process.\n"), errors.New("exit status 255")
		}
		err := g.ResetGPU(0)
		if err == nil || !strings.Contains(err.Error(), "in use by another process") || !errors.Is(err, ErrInUse) {
			t.Fatalf("ResetGPU: %v", err)
		}
	})
	// The driver is bound and nvidia-smi is missing: never a PCI reset under
	// the driver (mig-parted resets through PCI only without the module).
	t.Run("bound without nvidia-smi", func(t *testing.T) {
		g := newTestReal(t, newFakeNVML("h200"))
		dir := bindNVIDIA(t, g, "0000:10:00.0", true)
		if ok, why := g.CanReset(0); ok || !strings.Contains(why, "nvidia-smi is not installed") {
			t.Errorf("CanReset = %v %q", ok, why)
		}
		if err := g.ResetGPU(0); err == nil || !strings.Contains(err.Error(), "nvidia-smi is not installed") {
			t.Fatalf("ResetGPU: %v", err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "reset")); len(b) != 0 {
			t.Errorf("sysfs reset written under the driver: %q", b)
		}
	})
	// Re-initializing NVML after the reset is retried; when it keeps
	// failing the next call tries again.
	t.Run("re-init retried", func(t *testing.T) {
		f := newFakeNVML("h200")
		g := newTestReal(t, f)
		bindNVIDIA(t, g, "0000:10:00.0", true)
		g.cfg.lookPath = func(string) (string, error) { return "/usr/bin/nvidia-smi", nil }
		var slept []time.Duration
		g.cfg.sleep = func(d time.Duration) { slept = append(slept, d) }
		fails := 2
		f.lib.InitFunc = func() nvml.Return {
			f.inits++
			if fails > 0 {
				fails--
				return nvml.ERROR_DRIVER_NOT_LOADED
			}
			return nvml.SUCCESS
		}
		if err := g.ResetGPU(0); err != nil {
			t.Fatalf("ResetGPU: %v", err)
		}
		// 250 ms doubling, each drawn within +50% (internal/backoff's jitter).
		if len(slept) != 2 || slept[0] < 250*time.Millisecond || slept[0] >= 375*time.Millisecond ||
			slept[1] < 500*time.Millisecond || slept[1] >= 750*time.Millisecond {
			t.Errorf("waits %v, want two: 250 ms then 500 ms, jittered", slept)
		}
		fails, slept = 100, nil
		before := f.inits
		err := g.ResetGPU(0)
		if !errors.Is(err, ErrNVMLNotBack) || !strings.Contains(err.Error(), "the next call tries again") {
			t.Fatalf("ResetGPU with NVML not coming back: %v, want ErrNVMLNotBack", err)
		}
		if tries := f.inits - before; tries != 5 || len(slept) != 4 {
			t.Errorf("%d tries with %d waits, want 5 tries and 4 waits", tries, len(slept))
		}
		fails = 0
		if _, err := g.Devices(); err != nil {
			t.Errorf("Devices once NVML is back: %v", err)
		}
	})
	t.Run("sysfs", func(t *testing.T) {
		f := newFakeNVML("h200")
		g := newTestReal(t, f)
		dir := filepath.Join(g.sysfs, "bus", "pci", "devices", "0000:10:00.0")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "reset"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := g.ResetGPU(0); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "reset")); string(b) != "1" {
			t.Errorf("sysfs reset got %q", b)
		}
		if len(g.ran) != 0 {
			t.Errorf("ran %v without nvidia-smi", g.ran)
		}
	})
	t.Run("no reset at all", func(t *testing.T) {
		g := newTestReal(t, newFakeNVML("h200"))
		if err := g.ResetGPU(0); err == nil || !strings.Contains(err.Error(), "sysfs") {
			t.Fatalf("ResetGPU: %v", err)
		}
	})
}

func TestRealInit(t *testing.T) {
	tests := []struct {
		ret      nvml.Return
		sentinel error
		msg      string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, ErrLibraryNotFound, "NVIDIA driver library libnvidia-ml.so.1 not found"},
		{nvml.ERROR_DRIVER_NOT_LOADED, nil, "nvml Init on GPU -1: ERROR_DRIVER_NOT_LOADED"},
		{nvml.ERROR_NO_PERMISSION, ErrNoPermission, "ERROR_NO_PERMISSION"},
	}
	for _, tc := range tests {
		f := newFakeNVML("h200")
		f.lib.InitFunc = func() nvml.Return { return tc.ret }
		_, err := newReal(f.lib, realConfig{})
		if err == nil || !strings.Contains(err.Error(), tc.msg) || (tc.sentinel != nil && !errors.Is(err, tc.sentinel)) {
			t.Errorf("Init %s: %v", nvmlreturn.Name(tc.ret), err)
		}
	}
}

// TestNewRealWithoutDriver: no driver, one clear error, no panic.
func TestNewRealWithoutDriver(t *testing.T) {
	bogus := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	if err := os.WriteFile(bogus, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{t.TempDir(), "/nonexistent/libnvidia-ml.so.1", bogus} {
		g, err := NewReal(Options{Library: lib})
		if g != nil || !errors.Is(err, ErrLibraryNotFound) {
			t.Fatalf("NewReal(%q) = %v, %v; want ErrLibraryNotFound", lib, g, err)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "NVIDIA driver library libnvidia-ml.so.1 not found: ") || strings.Contains(msg, "\n") {
			t.Errorf("NewReal(%q): message %q", lib, msg)
		}
	}
	// The default search path, where this machine has no driver.
	g, err := NewReal(Options{})
	if err == nil {
		_ = g.Close()
		t.Skip("this machine has an NVIDIA driver")
	}
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("NewReal: %v", err)
	}
}

func TestRealResolveLibrary(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "usr", "lib", "x86_64-linux-gnu", LibraryName)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{"": LibraryName, root: lib, lib: lib} {
		if got, err := realResolveLibrary(in); err != nil || got != want {
			t.Errorf("realResolveLibrary(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestRealSysfsBDF(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:00:06.0": "0000:00:06.0",
		"00000001:AB:00.0": "0001:ab:00.0",
		"0000:3B:00.0":     "0000:3b:00.0",
		"00010000:01:00.0": "10000:01:00.0",
	} {
		if got, err := realSysfsBDF(in); err != nil || got != want {
			t.Errorf("realSysfsBDF(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "zz:00:06.0", "nocolon"} {
		if _, err := realSysfsBDF(bad); err == nil {
			t.Errorf("realSysfsBDF(%q): no error", bad)
		}
	}
}

func TestRealReturnNames(t *testing.T) {
	for r, want := range map[nvml.Return]string{
		nvml.SUCCESS:                      "SUCCESS",
		nvml.ERROR_IN_USE:                 "ERROR_IN_USE",
		nvml.ERROR_INSUFFICIENT_RESOURCES: "ERROR_INSUFFICIENT_RESOURCES",
		nvml.ERROR_RESET_REQUIRED:         "ERROR_RESET_REQUIRED",
		nvml.ERROR_FUNCTION_NOT_FOUND:     "ERROR_FUNCTION_NOT_FOUND",
		nvml.ERROR_UNKNOWN:                "ERROR_UNKNOWN",
		nvml.Return(77):                   "ERROR_CODE_77",
	} {
		if got := nvmlreturn.Name(r); got != want {
			t.Errorf("nvmlreturn.Name(%d) = %q, want %q", r, got, want)
		}
	}
	// Every sentinel's name is one realReturnName produces.
	for _, s := range []*Error{ErrInUse, ErrInsufficientResources, ErrNotSupported, ErrResetRequired, ErrNotFound, ErrInvalidArgument, ErrNoPermission, ErrLibraryNotFound} {
		found := false
		for r := nvml.Return(0); r < 1000 && !found; r++ {
			found = nvmlreturn.Name(r) == s.Return
		}
		if !found {
			t.Errorf("no NVML return is named %q", s.Return)
		}
	}
}

func TestRealClosed(t *testing.T) {
	g := newTestReal(t, newFakeNVML("h200"))
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := g.Devices()
	wantNVMLError(t, err, "DeviceGetCount", "ERROR_UNINITIALIZED")
	if v, err := g.DriverVersion(); err == nil {
		t.Errorf("DriverVersion after Close: %q", v)
	}
}

// Compute profile ids are NVML's: the backend creates by the index, reads
// the profile's info (its id) from the GPU instance and passes that on,
// and reports the id NVML gave. The fake's ids differ from their indices
// (nvml.h promises no equality), so a backend that assumed index == id
// would ask for a profile the GPU instance does not offer.
func TestRealComputeProfileIDsFromNVML(t *testing.T) {
	f := newFakeNVML("h200")
	fg := f.gpus[0]
	fg.ciIDBase = 100
	g := newTestReal(t, f)
	if _, err := g.SetMigMode(0, true); err != nil {
		t.Fatal(err)
	}
	gi3, err := g.CreateGPUInstance(0, 9, profiles.Placement{Start: 4, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	ci, err := g.CreateComputeInstance(0, gi3, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	if err != nil {
		t.Fatalf("create 1c by index: %v", err)
	}
	if ci.ProfileID != 100 || ci.Profile != "1c.3g.71gb" {
		t.Errorf("compute instance %+v, want NVML's id 100 and 1c.3g.71gb", ci)
	}
	var gi *fakeGI
	for _, x := range fg.gis {
		if int(x.info.Id) == gi3 {
			gi = x
		}
	}
	if calls := gi.gi.CreateComputeInstanceCalls(); len(calls) != 1 || calls[0].ComputeInstanceProfileInfo.Id != 100 {
		t.Errorf("NVML was asked for compute profile ids %+v, want [100]", calls)
	}
	gis, err := g.Instances(0)
	if err != nil || len(gis) != 1 || len(gis[0].ComputeInstances) != 1 || gis[0].ComputeInstances[0].ProfileID != 100 ||
		gis[0].ComputeInstances[0].Profile != "1c.3g.71gb" {
		t.Fatalf("Instances %+v (%v)", gis, err)
	}
}

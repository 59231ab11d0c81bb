package nvmlx_test

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
	"github.com/migagent/mig-agent/testkit/simlibtest"
)

// TestRealBackendOverSimulatedLibrary loads the simulator built as
// libnvidia-ml.so.1 (make simlib) into this Go process, as go-nvml loads
// the driver's, and runs the real backend on it: the cgo path that runs on
// customers' nodes. What it reads must be what the in-process simulator
// reads from the same state file, a change made through it must be what
// the simulator then holds, and a change made beside it must be what it
// reads next: one state file is one driver. The library reads its
// environment at the first nvmlInit of the process, so everything that
// loads it here shares one state.
func TestRealBackendOverSimulatedLibrary(t *testing.T) {
	lib := simlibtest.Library(t)
	state := filepath.Join(t.TempDir(), "sim.json")
	t.Setenv("MIG_AGENT_SIM", "h200x2")
	t.Setenv("MIG_AGENT_SIM_STATE", state)
	t.Setenv("MIG_AGENT_SIM_QUIET", "1")
	sim, err := nvmlx.NewSim("h200x2", nvmlsim.Options{StatePath: state})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	real, err := nvmlx.Open(nvmlx.Options{Backend: "real", Library: lib})
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()

	t.Run("devices", func(t *testing.T) {
		want, err := sim.Devices()
		if err != nil {
			t.Fatal(err)
		}
		got, err := real.Devices()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("through the library:\n%+v\nin process:\n%+v", got, want)
		}
		if v, err := real.DriverVersion(); err != nil || v != nvmlsim.DriverVersion {
			t.Fatalf("driver version %q, %v", v, err)
		}
	})

	t.Run("a change through the library is the simulator's state", func(t *testing.T) {
		devs, err := real.Devices()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := real.SetMigMode(1, true); err != nil {
			t.Fatal(err)
		}
		name, _ := profiles.Parse("3g.71gb")
		p, ok := devs[1].Catalogue.ByName(name)
		if !ok {
			t.Fatal("no 3g.71gb on the H200")
		}
		gi, err := real.CreateGPUInstance(1, p.ID, profiles.Placement{Start: 4, Size: 4})
		if err != nil {
			t.Fatal(err)
		}
		ci, err := real.CreateComputeInstance(1, gi, p.ComputeProfiles[len(p.ComputeProfiles)-1].Index)
		if err != nil {
			t.Fatal(err)
		}
		want, err := sim.Instances(1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := real.Instances(1)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) || len(got) != 1 || got[0].ComputeInstances[0].UUID != ci.UUID {
			t.Fatalf("through the library %+v, in process %+v", got, want)
		}
	})

	t.Run("a change beside it is read next", func(t *testing.T) {
		ins, err := sim.Instances(1)
		if err != nil || len(ins) != 1 {
			t.Fatalf("instances %+v, %v", ins, err)
		}
		if err := sim.AddProcess(1, nvmlx.Process{PID: 4242, GIID: ins[0].ID, CIID: ins[0].ComputeInstances[0].ID}); err != nil {
			t.Fatal(err)
		}
		ps, err := real.Processes(1)
		if err != nil || len(ps) != 1 || ps[0].PID != 4242 || ps[0].GIID != ins[0].ID {
			t.Fatalf("processes through the library %+v, %v", ps, err)
		}
		if err := real.DestroyComputeInstance(1, ins[0].ID, ins[0].ComputeInstances[0].ID); err == nil {
			t.Fatal("destroying a compute instance with a process on it succeeded")
		}
	})

	t.Run("go-nvml's own calls", func(t *testing.T) { checkGoNVML(t, lib) })
}

// checkGoNVML makes the calls NVIDIA's device plugin and GPU Feature
// Discovery make through go-nvlib to name a MIG device (go-nvlib
// pkg/nvlib/device/mig_device.go GetProfile), and the calls a stub
// answers.
func checkGoNVML(t *testing.T, lib string) {
	l := nvml.New(nvml.WithLibraryPath(lib))
	if ret := l.Init(); ret != nvml.SUCCESS {
		t.Fatalf("nvmlInit: %v", ret)
	}
	defer l.Shutdown()
	d, ret := l.DeviceGetHandleByIndex(1)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	again, _ := l.DeviceGetHandleByIndex(1)
	if d != again {
		t.Error("two handles for one GPU")
	}
	mig, ret := d.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("MIG device 0: %v", ret)
	}
	attrs, ret := mig.GetAttributes()
	if ret != nvml.SUCCESS || attrs.MemorySizeMB == 0 || attrs.GpuInstanceSliceCount != 3 {
		t.Fatalf("attributes %+v, %v", attrs, ret)
	}
	mem, ret := mig.GetMemoryInfo()
	if ret != nvml.SUCCESS || mem.Total != attrs.MemorySizeMB<<20 {
		t.Fatalf("MIG device memory %+v, %v (attributes say %d MiB)", mem, ret, attrs.MemorySizeMB)
	}
	parent, ret := mig.GetDeviceHandleFromMigDeviceHandle()
	if ret != nvml.SUCCESS || parent != d {
		t.Fatalf("parent %v, %v", parent, ret)
	}
	giID, _ := mig.GetGpuInstanceId()
	gi, ret := d.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS || info.Device != d || info.Placement.Start != 4 {
		t.Fatalf("GPU instance info %+v, %v", info, ret)
	}
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		p, ret := d.GetGpuInstanceProfileInfo(i)
		if ret != nvml.SUCCESS || p.Id != info.ProfileId {
			continue
		}
		v2, ret := d.GetGpuInstanceProfileInfoV(i).V2()
		if ret != nvml.SUCCESS || cString(v2.Name[:]) != "MIG 3g.71gb" || v2.MemorySizeMB != p.MemorySizeMB {
			t.Fatalf("profile info v2 %q %+v, %v", cString(v2.Name[:]), v2, ret)
		}
		// Version 3's name stays empty, as driver 580.159.04 leaves it
		// (hack/nvmlprobe's capture).
		v3, ret := d.GetGpuInstanceProfileInfoV(i).V3()
		if ret != nvml.SUCCESS || cString(v3.Name[:]) != "" || v3.MemorySizeMB != p.MemorySizeMB || v3.Id != p.Id {
			t.Fatalf("profile info v3 %q %+v, %v", cString(v3.Name[:]), v3, ret)
		}
	}
	if _, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("a stubbed call answered %v, want NOT_SUPPORTED", ret)
	}
	if s := l.ErrorString(nvml.ERROR_IN_USE); s != "In use by another client" {
		t.Errorf("nvmlErrorString: %q", s)
	}
	if _, ret := l.DeviceGetHandleByUUID("GPU-nonexistent"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("an unknown UUID answered %v", ret)
	}
}

func cString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

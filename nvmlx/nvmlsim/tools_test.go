package nvmlsim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
)

// simMigOn enables MIG on every GPU of l as an operator would: set the
// mode, and on Ampere close NVML, reset the GPU (nvidia-smi -r) and open
// NVML again.
func simMigOn(t *testing.T, l *Lib) {
	t.Helper()
	n, _ := l.DeviceGetCount()
	var reset []string
	for i := range n {
		d := simDev(t, l, i)
		simMig(t, d, true)
		if cur, _, _ := d.GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE {
			reset = append(reset, l.st.GPUs[i].PCIBusID)
		}
	}
	if len(reset) == 0 {
		return
	}
	l.Shutdown()
	for _, bdf := range reset {
		if out, err := l.SMIReset(bdf); err != nil {
			t.Fatalf("reset %s: %s %v", bdf, out, err)
		}
	}
	if ret := l.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %s", nvmlreturn.Name(ret))
	}
}

// simInfoByID is the GPU instance profile info of profile id, found the way
// mig-parted finds it (every profile index until one has that id).
func simInfoByID(t *testing.T, d nvml.Device, id uint32) nvml.GpuInstanceProfileInfo {
	t.Helper()
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		if info, ret := d.GetGpuInstanceProfileInfo(i); ret == nvml.SUCCESS && info.Id == id {
			return info
		}
	}
	t.Fatalf("no GPU instance profile with id %d", id)
	return nvml.GpuInstanceProfileInfo{}
}

// TestSimDriverPlacement: nvmlDeviceCreateGpuInstance (no placement, as
// mig-parted's SetMigConfig calls it) puts each GPU instance where the
// driver does in the MIG user guide's published sequences ("nvidia-smi mig
// -cgi" makes one such call per profile, in order). Each step is
// "GI id@start:size" as the guide's creation lines and -lgi table show it,
// or the NVML error the guide shows.
func TestSimDriverPlacement(t *testing.T) {
	tests := []struct {
		source string
		spec   string
		cgi    []uint32
		want   []string
	}{
		{"MIG user guide, Instance Geometry, Example 1 (4-2-1), A100-SXM4-40GB", "a100-40gbx1",
			[]uint32{19, 14, 5}, []string{"13@6:1", "5@4:2", "1@0:4"}},
		{"MIG user guide, Instance Geometry, Example 2: the order that fails", "a100-40gbx1",
			[]uint32{19, 19, 14, 9}, []string{"13@6:1", "11@4:1", "3@0:2", "ERROR_INSUFFICIENT_RESOURCES"}},
		{"MIG user guide, Instance Geometry, Example 2 (3-2-1-1): 3g first", "a100-40gbx1",
			[]uint32{9, 19, 14, 19}, []string{"2@4:4", "7@0:1", "4@2:2", "8@1:1"}},
		{"MIG user guide, Instance Geometry, Example 3 (2-1-1-1-1-1)", "a100-40gbx1",
			[]uint32{14, 19, 19, 19, 19, 19}, []string{"5@4:2", "13@6:1", "7@0:1", "8@1:1", "9@2:1", "10@3:1"}},
		{"seven 1g then an eighth: the guide's 6, 4 first, then this rule's order; the 8th has no room (1g.5gb: 7 instances, MIG user guide profile table)", "a100-40gbx1",
			[]uint32{19, 19, 19, 19, 19, 19, 19, 19},
			[]string{"13@6:1", "11@4:1", "12@5:1", "7@0:1", "8@1:1", "9@2:1", "10@3:1", "ERROR_INSUFFICIENT_RESOURCES"}},
		{"a user's A30 output (`nvidia-smi mig -cgi 14 -C`: GPU instance ID 3 at 0:1)", "a30x1",
			[]uint32{14}, []string{"3@0:1"}},
		{"the same rule on the H200 (GH100 layout as the A100's; no published sequence)", "h200x1",
			[]uint32{19, 14, 5}, []string{"13@6:1", "5@4:2", "1@0:4"}},
	}
	for _, tc := range tests {
		t.Run(tc.source, func(t *testing.T) {
			l := simNVML(t, tc.spec, Options{})
			simMigOn(t, l)
			d := simDev(t, l, 0)
			var got []string
			for _, id := range tc.cgi {
				info := simInfoByID(t, d, id)
				gi, ret := d.CreateGpuInstance(&info)
				if ret != nvml.SUCCESS {
					got = append(got, nvmlreturn.Name(ret))
					continue
				}
				gii, ret := gi.GetInfo()
				if ret != nvml.SUCCESS {
					t.Fatalf("GetInfo: %s", nvmlreturn.Name(ret))
				}
				got = append(got, fmt.Sprintf("%d@%d:%d", gii.Id, gii.Placement.Start, gii.Placement.Size))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("-cgi %v:\n got %v\nwant %v", tc.cgi, got, tc.want)
			}
			if n := l.muts[OpCreateGpuInstance]; n != len(slices.DeleteFunc(slices.Clone(got), func(s string) bool { return strings.HasPrefix(s, "ERROR") })) {
				t.Errorf("Mutations[%s] = %d", OpCreateGpuInstance, n)
			}
		})
	}
}

// simProbe is the part of the H200 hardware probe the tool calls compare
// with (testdata/h200-nvml-probe.json: the read-only nvmlprobe of an H200,
// driver 580.159.04, go-nvml v0.13.4-1).
type simProbe struct {
	DriverVersion     struct{ Value string } `json:"driver_version"`
	NVMLVersion       struct{ Value string } `json:"nvml_version"`
	CudaDriverVersion struct{ Value int }    `json:"cuda_driver_version"`
	Devices           []struct {
		Name  struct{ Value string } `json:"name"`
		Minor struct{ Value int }    `json:"minor_number"`
		Brand struct{ Value int }    `json:"brand"`
		CC    struct{ Value string } `json:"cuda_compute_capability"`
		Arch  struct{ Value int }    `json:"architecture"`
	} `json:"devices"`
}

// loadProbe reads the H200 probe.
func loadProbe(t *testing.T) simProbe {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "h200-nvml-probe.json"))
	if err != nil {
		t.Fatal(err)
	}
	var p simProbe
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSimToolCalls makes each NVML call NVIDIA's mig-parted and DRA kubelet
// plugin make that the simulator learnt for them, with the arguments and
// handle kinds they use (tools.go's table), and checks the answer
// against the H200 probe where it measured it.
func TestSimToolCalls(t *testing.T) {
	probe := loadProbe(t)
	if len(probe.Devices) != 1 {
		t.Fatalf("probe has %d devices", len(probe.Devices))
	}
	pd := probe.Devices[0]
	type result struct {
		ret nvml.Return
		got any
	}
	tests := []struct {
		call, caller string
		spec         string
		do           func(t *testing.T, l *Lib) result
		want         result
	}{
		{"SystemGetNVMLVersion: the probe's form, major >= 11", "mig-parted util/nvml.go IsNVMLVersionSupported", "h200x1",
			func(t *testing.T, l *Lib) result { v, ret := l.SystemGetNVMLVersion(); return result{ret, v} },
			result{nvml.SUCCESS, probe.NVMLVersion.Value}},
		{"SystemGetNVMLVersion before Init", "nvml.h", "h200x1",
			func(t *testing.T, l *Lib) result {
				l.Shutdown()
				_, ret := l.SystemGetNVMLVersion()
				return result{ret: ret}
			},
			result{ret: nvml.ERROR_UNINITIALIZED}},
		{"SystemGetDriverVersion: the probe's", "dra nvlib.go getGpuInfo", "h200x1",
			func(t *testing.T, l *Lib) result { v, ret := l.SystemGetDriverVersion(); return result{ret, v} },
			result{nvml.SUCCESS, probe.DriverVersion.Value}},
		{"SystemGetCudaDriverVersion: the probe's", "dra nvlib.go getGpuInfo", "h200x1",
			func(t *testing.T, l *Lib) result { v, ret := l.SystemGetCudaDriverVersion(); return result{ret, v} },
			result{nvml.SUCCESS, probe.CudaDriverVersion.Value}},
		{"InitWithFlags(NO_GPUS) opens a second reference", "dra nvlib.go ensureNVML", "h200x1",
			func(t *testing.T, l *Lib) result {
				ret := l.InitWithFlags(nvml.INIT_FLAG_NO_GPUS)
				return result{ret, l.refs}
			}, result{nvml.SUCCESS, 2}},
		{"InitWithFlags with an unknown flag", "nvml.h nvmlInitWithFlags", "h200x1",
			func(t *testing.T, l *Lib) result { return result{ret: l.InitWithFlags(0x80)} },
			result{ret: nvml.ERROR_INVALID_ARGUMENT}},
		{"DeviceGetHandleByPciBusId with go-nvlib nvpci's address (4-digit domain)", "mig-parted util/device.go nvmlGetGPUDeviceIDs", "h200x2",
			func(t *testing.T, l *Lib) result {
				d, ret := l.DeviceGetHandleByPciBusId("0000:11:00.0")
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				return result{ret, d.(*simDevice).index}
			}, result{nvml.SUCCESS, 1}},
		{"DeviceGetHandleByPciBusId with NVML's own form, lower case", "nvml.h nvmlDeviceGetHandleByPciBusId_v2", "h200x2",
			func(t *testing.T, l *Lib) result {
				d, ret := l.DeviceGetHandleByPciBusId("00000000:10:00.0")
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				return result{ret, d.(*simDevice).index}
			}, result{nvml.SUCCESS, 0}},
		{"DeviceGetHandleByPciBusId: no such GPU", "nvml.h", "h200x1",
			func(t *testing.T, l *Lib) result {
				_, ret := l.DeviceGetHandleByPciBusId("0000:99:00.0")
				return result{ret: ret}
			},
			result{ret: nvml.ERROR_NOT_FOUND}},
		{"DeviceGetHandleByPciBusId: malformed", "nvml.h", "h200x1",
			func(t *testing.T, l *Lib) result {
				_, ret := l.DeviceGetHandleByPciBusId("gpu0")
				return result{ret: ret}
			},
			result{ret: nvml.ERROR_INVALID_ARGUMENT}},
		{"GetMinorNumber: the probe's for GPU 0", "dra nvlib.go getGpuInfo", "h200x1",
			func(t *testing.T, l *Lib) result {
				v, ret := simDev(t, l, 0).GetMinorNumber()
				return result{ret, v}
			},
			result{nvml.SUCCESS, pd.Minor.Value}},
		{"GetMinorNumber of GPU 3 is 3", "dra deviceinfo.go (device name gpu-<minor>)", "h200x4",
			func(t *testing.T, l *Lib) result {
				v, ret := simDev(t, l, 3).GetMinorNumber()
				return result{ret, v}
			},
			result{nvml.SUCCESS, 3}},
		{"GetBrand: the probe's", "go-nvlib GetBrandAsString", "h200x1",
			func(t *testing.T, l *Lib) result { v, ret := simDev(t, l, 0).GetBrand(); return result{ret, int(v)} },
			result{nvml.SUCCESS, pd.Brand.Value}},
		{"GetCudaComputeCapability: the probe's", "go-nvlib GetCudaComputeCapabilityAsString", "h200x1",
			func(t *testing.T, l *Lib) result {
				ma, mi, ret := simDev(t, l, 0).GetCudaComputeCapability()
				return result{ret, fmt.Sprintf("%d.%d", ma, mi)}
			}, result{nvml.SUCCESS, pd.CC.Value}},
		{"GetCudaComputeCapability of the A100 and the L40S", "CUDA GPUs list", "a100-40gbx1,l40sx1",
			func(t *testing.T, l *Lib) result {
				var out []string
				for i := range 2 {
					ma, mi, ret := simDev(t, l, i).GetCudaComputeCapability()
					if ret != nvml.SUCCESS {
						return result{ret: ret}
					}
					out = append(out, fmt.Sprintf("%d.%d", ma, mi))
				}
				return result{nvml.SUCCESS, out}
			}, result{nvml.SUCCESS, []string{"8.0", "8.9"}}},
		{"GetArchitecture: the probe's", "go-nvlib GetArchitectureAsString", "h200x1",
			func(t *testing.T, l *Lib) result {
				v, ret := simDev(t, l, 0).GetArchitecture()
				return result{ret, int(v)}
			},
			result{nvml.SUCCESS, pd.Arch.Value}},
		{"GetAddressingMode: NOT_SUPPORTED (no coherent memory)", "go-nvlib GetAddressingModeAsString", "h200x1",
			func(t *testing.T, l *Lib) result {
				_, ret := simDev(t, l, 0).GetAddressingMode()
				return result{ret: ret}
			},
			result{ret: nvml.ERROR_NOT_SUPPORTED}},
		{"GetPciInfo bus id as go-nvlib GetPCIBusID reads it finds the same GPU", "go-nvlib GetPCIBusID; mig-parted DeviceGetHandleByPciBusId", "h200x2",
			func(t *testing.T, l *Lib) result {
				info, ret := simDev(t, l, 1).GetPciInfo()
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				var b []byte
				for _, c := range info.BusId {
					if c == 0 {
						break
					}
					b = append(b, byte(c))
				}
				id := strings.TrimPrefix(strings.ToLower(string(b)), "0000")
				d, ret := l.DeviceGetHandleByPciBusId(id)
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				return result{ret, fmt.Sprintf("%s→%d", id, d.(*simDevice).index)}
			}, result{nvml.SUCCESS, "0000:11:00.0→1"}},
		{"GetIndex of a GPU handle by UUID is its NVML index", "cdi full-gpu-nvml.go newFullGPUDeviceSpecGeneratorFromNVMLDevice", "h200x4",
			func(t *testing.T, l *Lib) result {
				d, ret := l.DeviceGetHandleByUUID(l.st.GPUs[2].UUID)
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				i, ret := d.GetIndex()
				return result{ret, i}
			}, result{nvml.SUCCESS, 2}},
		{"GetIndex of a MIG device: the index GetMigDeviceHandleByIndex takes; gone: INVALID_ARGUMENT", "cdi mig-device-nvml.go; nvml.h nvmlDeviceGetIndex", "h200x1",
			func(t *testing.T, l *Lib) result {
				simMigOn(t, l)
				d := simDev(t, l, 0)
				info := simInfo(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
				for range 2 {
					gi, ret := d.CreateGpuInstance(&info)
					if ret != nvml.SUCCESS {
						return result{ret: ret}
					}
					ciInfo := simCIInfo(t, gi)
					if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
						return result{ret: ret}
					}
				}
				mig, ret := d.GetMigDeviceHandleByIndex(1)
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				i, ret := mig.GetIndex()
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				giID, _ := mig.GetGpuInstanceId()
				ciID, _ := mig.GetComputeInstanceId()
				gi, _ := d.GetGpuInstanceById(giID)
				ci, _ := gi.GetComputeInstanceById(ciID)
				if ret := ci.Destroy(); ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				_, gone := mig.GetIndex()
				return result{ret, []any{i, nvmlreturn.Name(gone)}}
			}, result{nvml.SUCCESS, []any{1, "ERROR_INVALID_ARGUMENT"}}},
		{"GetDeviceHandleFromMigDeviceHandle gives the parent", "nvcdi mig-device-nvml.go; go-nvlib GetProfile", "h200x2",
			func(t *testing.T, l *Lib) result {
				simMigOn(t, l)
				d := simDev(t, l, 1)
				gi, ret := simCreate(d, simInfo(t, d, 0), 3, 1)
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				ciInfo, _ := gi.GetComputeInstanceProfileInfo(0, 0)
				if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				mig, ret := d.GetMigDeviceHandleByIndex(0)
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				parent, ret := mig.GetDeviceHandleFromMigDeviceHandle()
				if ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				u, _ := parent.GetUUID()
				_, retGPU := d.GetDeviceHandleFromMigDeviceHandle()
				return result{ret, []any{u == l.st.GPUs[1].UUID, nvmlreturn.Name(retGPU)}}
			}, result{nvml.SUCCESS, []any{true, "ERROR_INVALID_ARGUMENT"}}},
		{"CreateGpuInstance with MIG disabled", "nvml.h nvmlDeviceCreateGpuInstance", "h200x1",
			func(t *testing.T, l *Lib) result {
				d := simDev(t, l, 0)
				info := simInfo(t, d, 0)
				_, ret := d.CreateGpuInstance(&info)
				return result{ret: ret}
			}, result{ret: nvml.ERROR_NOT_SUPPORTED}},
		{"CreateGpuInstance: a second 1g+me finds the media engines taken", "MIG facts §3.8 (+me profiles own the OFA)", "h200x1",
			func(t *testing.T, l *Lib) result {
				simMigOn(t, l)
				d := simDev(t, l, 0)
				info := simInfoByID(t, d, 20)
				if _, ret := d.CreateGpuInstance(&info); ret != nvml.SUCCESS {
					return result{ret: ret}
				}
				_, ret := d.CreateGpuInstance(&info)
				return result{ret: ret}
			}, result{ret: nvml.ERROR_INSUFFICIENT_RESOURCES}},
		{"CreateGpuInstance: a fault on CreateGpuInstance fails it", "--sim-faults", "h200x1",
			func(t *testing.T, l *Lib) result {
				simMigOn(t, l)
				l.faults = faultPlan{OpCreateGpuInstance: {1: "ERROR_UNKNOWN"}}
				d := simDev(t, l, 0)
				info := simInfo(t, d, 0)
				_, ret := d.CreateGpuInstance(&info)
				return result{ret, len(l.st.GPUs[0].Instances)}
			}, result{nvml.ERROR_UNKNOWN, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.call, func(t *testing.T) {
			l := simNVML(t, tc.spec, Options{})
			got := tc.do(t, l)
			if got.ret != tc.want.ret {
				t.Fatalf("%s: ret %s, want %s", tc.caller, nvmlreturn.Name(got.ret), nvmlreturn.Name(tc.want.ret))
			}
			if tc.want.got != nil && fmt.Sprint(got.got) != fmt.Sprint(tc.want.got) {
				t.Errorf("%s: got %v, want %v", tc.caller, got.got, tc.want.got)
			}
		})
	}
}

// simCIInfo is gi's full compute instance profile info.
func simCIInfo(t *testing.T, gi nvml.GpuInstance) nvml.ComputeInstanceProfileInfo {
	t.Helper()
	info, ret := gi.GetComputeInstanceProfileInfo(0, 0)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeInstanceProfileInfo: %s", nvmlreturn.Name(ret))
	}
	return info
}

package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"math"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// The NVML functions the simulator answers, with the C signatures of
// nvml.h (go-nvml v0.13.4-1's copy): handles and structs arrive as
// pointers, and the structs are written through go-nvml's own Go types,
// which cgo generated from the same header and so share its layout. Where
// nvml.h keeps older versions of a function under other names (nvmlInit,
// nvmlDeviceGetCount, ..._v2) with the same arguments, they answer alike.

// --- library -------------------------------------------------------------------

//export nvmlInit_v2
func nvmlInit_v2() C.int { return initLib("nvmlInit_v2", 0) }

//export nvmlInit
func nvmlInit() C.int { return initLib("nvmlInit", 0) }

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.int { return initLib("nvmlInitWithFlags", uint32(flags)) }

func initLib(name string, flags uint32) C.int {
	return guard(name, func() nvml.Return {
		l, err := library()
		if err != nil {
			stderr.Error("simulated NVML cannot open", "err", err)
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return l.InitWithFlags(flags)
	})
}

//export nvmlShutdown
func nvmlShutdown() C.int {
	return guard("nvmlShutdown", func() nvml.Return {
		l, err := library()
		if err != nil {
			return nvml.ERROR_UNINITIALIZED
		}
		return l.Shutdown()
	})
}

// errorStrings keeps one C string per return code for nvmlErrorString,
// whose result the caller never frees.
var errorStrings = map[C.int]*C.char{}

//export nvmlErrorString
func nvmlErrorString(r C.int) *C.char {
	handles.Lock()
	defer handles.Unlock()
	if s, ok := errorStrings[r]; ok {
		return s
	}
	s := C.CString(nvmlreturn.Prose(nvml.Return(r)))
	errorStrings[r] = s
	return s
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.int {
	return systemString("nvmlSystemGetDriverVersion", version, length, func(l nvml.Interface) (string, nvml.Return) {
		return l.SystemGetDriverVersion()
	})
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.int {
	return systemString("nvmlSystemGetNVMLVersion", version, length, func(l nvml.Interface) (string, nvml.Return) {
		return l.SystemGetNVMLVersion()
	})
}

//export nvmlSystemGetProcessName
func nvmlSystemGetProcessName(pid C.uint, name *C.char, length C.uint) C.int {
	return systemString("nvmlSystemGetProcessName", name, length, func(l nvml.Interface) (string, nvml.Return) {
		return l.SystemGetProcessName(int(pid))
	})
}

func systemString(name string, dst *C.char, n C.uint, f func(nvml.Interface) (string, nvml.Return)) C.int {
	return onLib(name, func(l nvml.Interface) nvml.Return {
		s, ret := f(l)
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(dst, n, s)
	})
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(v *C.int) C.int {
	return cudaVersion("nvmlSystemGetCudaDriverVersion", v)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(v *C.int) C.int {
	return cudaVersion("nvmlSystemGetCudaDriverVersion_v2", v)
}

func cudaVersion(name string, v *C.int) C.int {
	return onLib(name, func(l nvml.Interface) nvml.Return {
		n, ret := l.SystemGetCudaDriverVersion()
		return then(v, C.int(n), ret)
	})
}

// onLib runs f on the opened library; before the first nvmlInit every
// call is UNINITIALIZED, as NVML's.
func onLib(name string, f func(nvml.Interface) nvml.Return) C.int {
	return guard(name, func() nvml.Return {
		l, err := library()
		if err != nil || l == nil {
			return nvml.ERROR_UNINITIALIZED
		}
		return f(l)
	})
}

// --- finding devices -------------------------------------------------------------

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(n *C.uint) C.int { return deviceCount("nvmlDeviceGetCount_v2", n) }

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(n *C.uint) C.int { return deviceCount("nvmlDeviceGetCount", n) }

func deviceCount(name string, n *C.uint) C.int {
	return onLib(name, func(l nvml.Interface) nvml.Return {
		c, ret := l.DeviceGetCount()
		return then(n, C.uint(c), ret)
	})
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(i C.uint, out *unsafe.Pointer) C.int {
	return byIndex("nvmlDeviceGetHandleByIndex_v2", i, out)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(i C.uint, out *unsafe.Pointer) C.int {
	return byIndex("nvmlDeviceGetHandleByIndex", i, out)
}

func byIndex(name string, i C.uint, out *unsafe.Pointer) C.int {
	return onLib(name, func(l nvml.Interface) nvml.Return {
		return putHandle(out)(l.DeviceGetHandleByIndex(int(i)))
	})
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, out *unsafe.Pointer) C.int {
	return onLib("nvmlDeviceGetHandleByUUID", func(l nvml.Interface) nvml.Return {
		if uuid == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return putHandle(out)(l.DeviceGetHandleByUUID(C.GoString(uuid)))
	})
}

//export nvmlDeviceGetHandleByPciBusId_v2
func nvmlDeviceGetHandleByPciBusId_v2(id *C.char, out *unsafe.Pointer) C.int {
	return byPCI("nvmlDeviceGetHandleByPciBusId_v2", id, out)
}

//export nvmlDeviceGetHandleByPciBusId
func nvmlDeviceGetHandleByPciBusId(id *C.char, out *unsafe.Pointer) C.int {
	return byPCI("nvmlDeviceGetHandleByPciBusId", id, out)
}

func byPCI(name string, id *C.char, out *unsafe.Pointer) C.int {
	return onLib(name, func(l nvml.Interface) nvml.Return {
		if id == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return putHandle(out)(l.DeviceGetHandleByPciBusId(C.GoString(id)))
	})
}

// putHandle writes the C handle of a simulator object when the call
// succeeded.
func putHandle(out *unsafe.Pointer) func(x any, ret nvml.Return) nvml.Return {
	return func(x any, ret nvml.Return) nvml.Return {
		if ret != nvml.SUCCESS {
			return ret
		}
		return set(out, handleOf(x))
	}
}

// --- device -------------------------------------------------------------------

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(dev unsafe.Pointer, s *C.char, n C.uint) C.int {
	return deviceString("nvmlDeviceGetUUID", dev, s, n, nvml.Device.GetUUID)
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(dev unsafe.Pointer, s *C.char, n C.uint) C.int {
	return deviceString("nvmlDeviceGetName", dev, s, n, nvml.Device.GetName)
}

func deviceString(name string, dev unsafe.Pointer, dst *C.char, n C.uint, f func(nvml.Device) (string, nvml.Return)) C.int {
	return onDevice(name, dev, func(d nvml.Device) nvml.Return {
		s, ret := f(d)
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(dst, n, s)
	})
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(dev unsafe.Pointer, info unsafe.Pointer) C.int {
	return pciInfo("nvmlDeviceGetPciInfo_v3", dev, info)
}

//export nvmlDeviceGetPciInfo_v2
func nvmlDeviceGetPciInfo_v2(dev unsafe.Pointer, info unsafe.Pointer) C.int {
	return pciInfo("nvmlDeviceGetPciInfo_v2", dev, info)
}

//export nvmlDeviceGetPciInfo
func nvmlDeviceGetPciInfo(dev unsafe.Pointer, info unsafe.Pointer) C.int {
	return pciInfo("nvmlDeviceGetPciInfo", dev, info)
}

func pciInfo(name string, dev, info unsafe.Pointer) C.int {
	return onDevice(name, dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetPciInfo()
		return then((*nvml.PciInfo)(info), v, ret)
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(dev unsafe.Pointer, info unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetMemoryInfo", dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetMemoryInfo()
		return then((*nvml.Memory)(info), v, ret)
	})
}

//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(dev unsafe.Pointer, info unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetMemoryInfo_v2", dev, func(d nvml.Device) nvml.Return {
		out := (*nvml.Memory_v2)(info)
		if out == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if out.Version != nvml.STRUCT_VERSION(*out, 2) {
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		v, ret := d.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		out.Total, out.Reserved, out.Free, out.Used = v.Total, 0, v.Free, v.Used
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(dev unsafe.Pointer, arch *C.uint) C.int {
	return onDevice("nvmlDeviceGetArchitecture", dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetArchitecture()
		return then(arch, C.uint(v), ret)
	})
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(dev unsafe.Pointer, minor *C.uint) C.int {
	return deviceUint("nvmlDeviceGetMinorNumber", dev, minor, nvml.Device.GetMinorNumber)
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(dev unsafe.Pointer, index *C.uint) C.int {
	return deviceUint("nvmlDeviceGetIndex", dev, index, nvml.Device.GetIndex)
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(dev unsafe.Pointer, n *C.uint) C.int {
	return deviceUint("nvmlDeviceGetMaxMigDeviceCount", dev, n, nvml.Device.GetMaxMigDeviceCount)
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(dev unsafe.Pointer, id *C.uint) C.int {
	return deviceUint("nvmlDeviceGetGpuInstanceId", dev, id, nvml.Device.GetGpuInstanceId)
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(dev unsafe.Pointer, id *C.uint) C.int {
	return deviceUint("nvmlDeviceGetComputeInstanceId", dev, id, nvml.Device.GetComputeInstanceId)
}

func deviceUint(name string, dev unsafe.Pointer, out *C.uint, f func(nvml.Device) (int, nvml.Return)) C.int {
	return onDevice(name, dev, func(d nvml.Device) nvml.Return {
		v, ret := f(d)
		return then(out, C.uint(v), ret)
	})
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(dev unsafe.Pointer, brand *C.uint) C.int {
	return onDevice("nvmlDeviceGetBrand", dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetBrand()
		return then(brand, C.uint(v), ret)
	})
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(dev unsafe.Pointer, major, minor *C.int) C.int {
	return onDevice("nvmlDeviceGetCudaComputeCapability", dev, func(d nvml.Device) nvml.Return {
		a, b, ret := d.GetCudaComputeCapability()
		if ret != nvml.SUCCESS {
			return ret
		}
		if major == nil || minor == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*major, *minor = C.int(a), C.int(b)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetAddressingMode
func nvmlDeviceGetAddressingMode(dev unsafe.Pointer, mode unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetAddressingMode", dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetAddressingMode()
		out := (*nvml.DeviceAddressingMode)(mode)
		if ret != nvml.SUCCESS || out == nil {
			return firstError(ret, nvml.ERROR_INVALID_ARGUMENT)
		}
		out.Value = v.Value
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetVirtualizationMode
func nvmlDeviceGetVirtualizationMode(dev unsafe.Pointer, mode *C.uint) C.int {
	return onDevice("nvmlDeviceGetVirtualizationMode", dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetVirtualizationMode()
		return then(mode, C.uint(v), ret)
	})
}

//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(dev unsafe.Pointer, attrs unsafe.Pointer) C.int {
	return attributes("nvmlDeviceGetAttributes_v2", dev, attrs)
}

//export nvmlDeviceGetAttributes
func nvmlDeviceGetAttributes(dev unsafe.Pointer, attrs unsafe.Pointer) C.int {
	return attributes("nvmlDeviceGetAttributes", dev, attrs)
}

func attributes(name string, dev, attrs unsafe.Pointer) C.int {
	return onDevice(name, dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetAttributes()
		return then((*nvml.DeviceAttributes)(attrs), v, ret)
	})
}

//export nvmlDeviceGetTopologyCommonAncestor
func nvmlDeviceGetTopologyCommonAncestor(dev1, dev2 unsafe.Pointer, level *C.uint) C.int {
	return onDevice("nvmlDeviceGetTopologyCommonAncestor", dev1, func(d nvml.Device) nvml.Return {
		other, ok := device(dev2)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		v, ret := d.GetTopologyCommonAncestor(other)
		return then(level, C.uint(v), ret)
	})
}

// firstError is ret when it is an error, else alt.
func firstError(ret, alt nvml.Return) nvml.Return {
	if ret != nvml.SUCCESS {
		return ret
	}
	return alt
}

// --- MIG mode and MIG devices ---------------------------------------------------------

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(dev unsafe.Pointer, current, pending *C.uint) C.int {
	return onDevice("nvmlDeviceGetMigMode", dev, func(d nvml.Device) nvml.Return {
		c, p, ret := d.GetMigMode()
		if ret != nvml.SUCCESS {
			return ret
		}
		if current == nil || pending == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		*current, *pending = C.uint(c), C.uint(p)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(dev unsafe.Pointer, mode C.uint, activation *C.int) C.int {
	return onDevice("nvmlDeviceSetMigMode", dev, func(d nvml.Device) nvml.Return {
		act, ret := d.SetMigMode(int(mode))
		if activation != nil {
			*activation = C.int(act)
		}
		return ret
	})
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(dev unsafe.Pointer, i C.uint, out *unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetMigDeviceHandleByIndex", dev, func(d nvml.Device) nvml.Return {
		return putHandle(out)(d.GetMigDeviceHandleByIndex(int(i)))
	})
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(dev unsafe.Pointer, out *unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", dev, func(d nvml.Device) nvml.Return {
		return putHandle(out)(d.GetDeviceHandleFromMigDeviceHandle())
	})
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(dev unsafe.Pointer, isMig *C.uint) C.int {
	return onDevice("nvmlDeviceIsMigDeviceHandle", dev, func(d nvml.Device) nvml.Return {
		v, ret := d.IsMigDeviceHandle()
		n := C.uint(0)
		if v {
			n = 1
		}
		return then(isMig, n, ret)
	})
}

// --- processes ---------------------------------------------------------------------

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetComputeRunningProcesses_v3", dev, n, infos, nvml.Device.GetComputeRunningProcesses, false)
}

//export nvmlDeviceGetComputeRunningProcesses_v2
func nvmlDeviceGetComputeRunningProcesses_v2(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetComputeRunningProcesses_v2", dev, n, infos, nvml.Device.GetComputeRunningProcesses, false)
}

//export nvmlDeviceGetComputeRunningProcesses
func nvmlDeviceGetComputeRunningProcesses(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetComputeRunningProcesses", dev, n, infos, nvml.Device.GetComputeRunningProcesses, true)
}

//export nvmlDeviceGetGraphicsRunningProcesses_v3
func nvmlDeviceGetGraphicsRunningProcesses_v3(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetGraphicsRunningProcesses_v3", dev, n, infos, nvml.Device.GetGraphicsRunningProcesses, false)
}

//export nvmlDeviceGetGraphicsRunningProcesses_v2
func nvmlDeviceGetGraphicsRunningProcesses_v2(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetGraphicsRunningProcesses_v2", dev, n, infos, nvml.Device.GetGraphicsRunningProcesses, false)
}

//export nvmlDeviceGetGraphicsRunningProcesses
func nvmlDeviceGetGraphicsRunningProcesses(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetGraphicsRunningProcesses", dev, n, infos, nvml.Device.GetGraphicsRunningProcesses, true)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v3
func nvmlDeviceGetMPSComputeRunningProcesses_v3(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetMPSComputeRunningProcesses_v3", dev, n, infos, nvml.Device.GetMPSComputeRunningProcesses, false)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v2
func nvmlDeviceGetMPSComputeRunningProcesses_v2(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetMPSComputeRunningProcesses_v2", dev, n, infos, nvml.Device.GetMPSComputeRunningProcesses, false)
}

//export nvmlDeviceGetMPSComputeRunningProcesses
func nvmlDeviceGetMPSComputeRunningProcesses(dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer) C.int {
	return processes("nvmlDeviceGetMPSComputeRunningProcesses", dev, n, infos, nvml.Device.GetMPSComputeRunningProcesses, true)
}

// processes fills the caller's array as nvml.h's process getters do:
// *n is its room; with too little room, *n becomes the count needed and
// the answer is INSUFFICIENT_SIZE (go-nvml asks with room 0 first). v1 is
// the first version's entry (pid and memory only).
func processes(name string, dev unsafe.Pointer, n *C.uint, infos unsafe.Pointer, f func(nvml.Device) ([]nvml.ProcessInfo, nvml.Return), v1 bool) C.int {
	return onDevice(name, dev, func(d nvml.Device) nvml.Return {
		ps, ret := f(d)
		if ret != nvml.SUCCESS {
			return ret
		}
		if n == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		room := int(*n)
		*n = C.uint(len(ps))
		if len(ps) > room {
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		if len(ps) > 0 && infos == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if v1 {
			out := unsafe.Slice((*nvml.ProcessInfo_v1)(infos), len(ps))
			for i, p := range ps {
				out[i] = nvml.ProcessInfo_v1{Pid: p.Pid, UsedGpuMemory: p.UsedGpuMemory}
			}
			return nvml.SUCCESS
		}
		copy(unsafe.Slice((*nvml.ProcessInfo)(infos), len(ps)), ps)
		return nvml.SUCCESS
	})
}

// --- GPU instances -------------------------------------------------------------------

//export nvmlDeviceGetGpuInstanceProfileInfo
func nvmlDeviceGetGpuInstanceProfileInfo(dev unsafe.Pointer, profile C.uint, info unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetGpuInstanceProfileInfo", dev, func(d nvml.Device) nvml.Return {
		v, ret := d.GetGpuInstanceProfileInfo(int(profile))
		return then((*nvml.GpuInstanceProfileInfo)(info), v, ret)
	})
}

// nvmlDeviceGetGpuInstanceProfileInfoV answers versions 2 and 3 of the
// struct. Version 2 adds the profile's name ("MIG 1g.18gb", as nvidia-smi
// prints it). Version 3 has a name field and capabilities in place of
// isP2pSupported, but driver 580.159.04 leaves both empty (captured on an
// H100 80GB HBM3: hack/nvmlprobe/testdata), and so does this.
//
//export nvmlDeviceGetGpuInstanceProfileInfoV
func nvmlDeviceGetGpuInstanceProfileInfoV(dev unsafe.Pointer, profile C.uint, info unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetGpuInstanceProfileInfoV", dev, func(d nvml.Device) nvml.Return {
		if info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		v, ret := d.GetGpuInstanceProfileInfo(int(profile))
		if ret != nvml.SUCCESS {
			return ret
		}
		gname, _, ok := nvmlsim.ProfileNames(d, int(v.Id), -1)
		if !ok {
			return nvml.ERROR_UNKNOWN
		}
		name := "MIG " + gname
		switch version := *(*uint32)(info); version {
		case nvml.STRUCT_VERSION(nvml.GpuInstanceProfileInfo_v2{}, 2):
			*(*nvml.GpuInstanceProfileInfo_v2)(info) = nvml.GpuInstanceProfileInfo_v2{Version: version, Id: v.Id,
				IsP2pSupported: v.IsP2pSupported, SliceCount: v.SliceCount, InstanceCount: v.InstanceCount,
				MultiprocessorCount: v.MultiprocessorCount, CopyEngineCount: v.CopyEngineCount, DecoderCount: v.DecoderCount,
				EncoderCount: v.EncoderCount, JpegCount: v.JpegCount, OfaCount: v.OfaCount, MemorySizeMB: v.MemorySizeMB}
			putName((*nvml.GpuInstanceProfileInfo_v2)(info).Name[:], name)
		case nvml.STRUCT_VERSION(nvml.GpuInstanceProfileInfo_v3{}, 3):
			*(*nvml.GpuInstanceProfileInfo_v3)(info) = nvml.GpuInstanceProfileInfo_v3{Version: version, Id: v.Id,
				SliceCount: v.SliceCount, InstanceCount: v.InstanceCount,
				MultiprocessorCount: v.MultiprocessorCount, CopyEngineCount: v.CopyEngineCount, DecoderCount: v.DecoderCount,
				EncoderCount: v.EncoderCount, JpegCount: v.JpegCount, OfaCount: v.OfaCount, MemorySizeMB: v.MemorySizeMB}
		default:
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev unsafe.Pointer, profileID C.uint, placements unsafe.Pointer, n *C.uint) C.int {
	return onDevice("nvmlDeviceGetGpuInstancePossiblePlacements_v2", dev, func(d nvml.Device) nvml.Return {
		ps, ret := d.GetGpuInstancePossiblePlacements(&nvml.GpuInstanceProfileInfo{Id: uint32(profileID)})
		if ret != nvml.SUCCESS {
			return ret
		}
		return putArray(n, placements, ps)
	})
}

// putArray answers as nvml.h's list getters with a NULL-able array: with
// a NULL array, *n becomes the count; else *n is the room, and too little
// is INSUFFICIENT_SIZE with the count needed in *n.
func putArray[T any](n *C.uint, arr unsafe.Pointer, xs []T) nvml.Return {
	if n == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	room := int(*n)
	*n = C.uint(len(xs))
	if arr == nil {
		return nvml.SUCCESS
	}
	if len(xs) > room {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	copy(unsafe.Slice((*T)(arr), len(xs)), xs)
	return nvml.SUCCESS
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(dev unsafe.Pointer, profileID C.uint, out unsafe.Pointer, n *C.uint) C.int {
	return onDevice("nvmlDeviceGetGpuInstances", dev, func(d nvml.Device) nvml.Return {
		// nvml.h: the array holds the profile's instanceCount entries; the
		// simulator never lists more than that.
		gis, ret := d.GetGpuInstances(&nvml.GpuInstanceProfileInfo{Id: uint32(profileID), InstanceCount: math.MaxUint16})
		if ret != nvml.SUCCESS {
			return ret
		}
		return putHandles(out, n, gis)
	})
}

// putHandles writes the C handles of xs into out and their count into *n.
func putHandles[T any](out unsafe.Pointer, n *C.uint, xs []T) nvml.Return {
	if n == nil || (out == nil && len(xs) > 0) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	arr := unsafe.Slice((*unsafe.Pointer)(out), len(xs))
	for i, x := range xs {
		arr[i] = handleOf(x)
	}
	*n = C.uint(len(xs))
	return nvml.SUCCESS
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(dev unsafe.Pointer, id C.uint, out *unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetGpuInstanceById", dev, func(d nvml.Device) nvml.Return {
		return putHandle(out)(d.GetGpuInstanceById(int(id)))
	})
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(dev unsafe.Pointer, profileID C.uint, out *unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceCreateGpuInstance", dev, func(d nvml.Device) nvml.Return {
		info, ret := profileByID(d, uint32(profileID))
		if ret != nvml.SUCCESS {
			return ret
		}
		return putHandle(out)(d.CreateGpuInstance(&info))
	})
}

//export nvmlDeviceCreateGpuInstanceWithPlacement
func nvmlDeviceCreateGpuInstanceWithPlacement(dev unsafe.Pointer, profileID C.uint, at unsafe.Pointer, out *unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceCreateGpuInstanceWithPlacement", dev, func(d nvml.Device) nvml.Return {
		if at == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		info, ret := profileByID(d, uint32(profileID))
		if ret != nvml.SUCCESS {
			return ret
		}
		return putHandle(out)(d.CreateGpuInstanceWithPlacement(&info, (*nvml.GpuInstancePlacement)(at)))
	})
}

// profileByID is the GPU instance profile info with NVML id id: the C
// calls name a profile by id, go-nvml's by its info.
func profileByID(d nvml.Device, id uint32) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := d.GetGpuInstanceProfileInfo(i)
		if ret == nvml.SUCCESS && info.Id == id {
			return info, nvml.SUCCESS
		}
		if ret == nvml.ERROR_UNINITIALIZED {
			return info, ret
		}
	}
	return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
}

// C layouts of nvml.h's nvmlGpuInstanceInfo_t and nvmlComputeInstanceInfo_t,
// whose go-nvml types are unexported: the handles are pointers.
type cGpuInstanceInfo struct {
	Device    unsafe.Pointer
	ID        uint32
	ProfileID uint32
	Placement nvml.GpuInstancePlacement
}

type cComputeInstanceInfo struct {
	Device      unsafe.Pointer
	GpuInstance unsafe.Pointer
	ID          uint32
	ProfileID   uint32
	Placement   nvml.ComputeInstancePlacement
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(gi unsafe.Pointer, info unsafe.Pointer) C.int {
	return onGpuInstance("nvmlGpuInstanceGetInfo", gi, func(g nvml.GpuInstance) nvml.Return {
		v, ret := g.GetInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		return set((*cGpuInstanceInfo)(info), cGpuInstanceInfo{Device: handleOf(v.Device), ID: v.Id, ProfileID: v.ProfileId, Placement: v.Placement})
	})
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(gi unsafe.Pointer) C.int {
	return onGpuInstance("nvmlGpuInstanceDestroy", gi, nvml.GpuInstance.Destroy)
}

// --- compute instances ----------------------------------------------------------------

//export nvmlGpuInstanceGetComputeInstanceProfileInfo
func nvmlGpuInstanceGetComputeInstanceProfileInfo(gi unsafe.Pointer, profile, eng C.uint, info unsafe.Pointer) C.int {
	return onGpuInstance("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, func(g nvml.GpuInstance) nvml.Return {
		v, ret := g.GetComputeInstanceProfileInfo(int(profile), int(eng))
		return then((*nvml.ComputeInstanceProfileInfo)(info), v, ret)
	})
}

// nvmlGpuInstanceGetComputeInstanceProfileInfoV answers versions 2 and 3,
// which add the name ("MIG 1c.3g.71gb") and, in 3, capabilities (none).
//
//export nvmlGpuInstanceGetComputeInstanceProfileInfoV
func nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi unsafe.Pointer, profile, eng C.uint, info unsafe.Pointer) C.int {
	return onGpuInstance("nvmlGpuInstanceGetComputeInstanceProfileInfoV", gi, func(g nvml.GpuInstance) nvml.Return {
		if info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		v, ret := g.GetComputeInstanceProfileInfo(int(profile), int(eng))
		if ret != nvml.SUCCESS {
			return ret
		}
		d, giProfile, ok := nvmlsim.GpuInstanceDevice(g)
		if !ok {
			return nvml.ERROR_UNKNOWN
		}
		_, name, ok := nvmlsim.ProfileNames(d, giProfile, int(v.Id))
		if !ok {
			return nvml.ERROR_UNKNOWN
		}
		common := nvml.ComputeInstanceProfileInfo_v2{Id: v.Id, SliceCount: v.SliceCount, InstanceCount: v.InstanceCount,
			MultiprocessorCount: v.MultiprocessorCount, SharedCopyEngineCount: v.SharedCopyEngineCount,
			SharedDecoderCount: v.SharedDecoderCount, SharedEncoderCount: v.SharedEncoderCount,
			SharedJpegCount: v.SharedJpegCount, SharedOfaCount: v.SharedOfaCount}
		switch version := *(*uint32)(info); version {
		case nvml.STRUCT_VERSION(nvml.ComputeInstanceProfileInfo_v2{}, 2):
			common.Version = version
			putName(common.Name[:], "MIG "+name)
			*(*nvml.ComputeInstanceProfileInfo_v2)(info) = common
		case nvml.STRUCT_VERSION(nvml.ComputeInstanceProfileInfo_v3{}, 3):
			out := (nvml.ComputeInstanceProfileInfo_v3{Version: version, Id: common.Id,
				SliceCount: common.SliceCount, InstanceCount: common.InstanceCount,
				MultiprocessorCount: common.MultiprocessorCount, SharedCopyEngineCount: common.SharedCopyEngineCount,
				SharedDecoderCount: common.SharedDecoderCount, SharedEncoderCount: common.SharedEncoderCount,
				SharedJpegCount: common.SharedJpegCount, SharedOfaCount: common.SharedOfaCount})
			putName(out.Name[:], "MIG "+name)
			*(*nvml.ComputeInstanceProfileInfo_v3)(info) = out
		default:
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		return nvml.SUCCESS
	})
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(gi unsafe.Pointer, profileID C.uint, out unsafe.Pointer, n *C.uint) C.int {
	return onGpuInstance("nvmlGpuInstanceGetComputeInstances", gi, func(g nvml.GpuInstance) nvml.Return {
		cis, ret := g.GetComputeInstances(&nvml.ComputeInstanceProfileInfo{Id: uint32(profileID), InstanceCount: math.MaxUint16})
		if ret != nvml.SUCCESS {
			return ret
		}
		return putHandles(out, n, cis)
	})
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(gi unsafe.Pointer, id C.uint, out *unsafe.Pointer) C.int {
	return onGpuInstance("nvmlGpuInstanceGetComputeInstanceById", gi, func(g nvml.GpuInstance) nvml.Return {
		return putHandle(out)(g.GetComputeInstanceById(int(id)))
	})
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(gi unsafe.Pointer, profileID C.uint, out *unsafe.Pointer) C.int {
	return onGpuInstance("nvmlGpuInstanceCreateComputeInstance", gi, func(g nvml.GpuInstance) nvml.Return {
		info, ret := computeProfileByID(g, uint32(profileID))
		if ret != nvml.SUCCESS {
			return ret
		}
		return putHandle(out)(g.CreateComputeInstance(&info))
	})
}

// computeProfileByID is the compute instance profile info with NVML id id
// (shared engines), as the C call names it.
func computeProfileByID(g nvml.GpuInstance, id uint32) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	for i := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := g.GetComputeInstanceProfileInfo(i, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && info.Id == id {
			return info, nvml.SUCCESS
		}
		if ret == nvml.ERROR_UNINITIALIZED {
			return info, ret
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(ci unsafe.Pointer, info unsafe.Pointer) C.int {
	return computeInfo("nvmlComputeInstanceGetInfo_v2", ci, info, true)
}

// nvmlComputeInstanceGetInfo is the first version: its struct ends before
// the placement.
//
//export nvmlComputeInstanceGetInfo
func nvmlComputeInstanceGetInfo(ci unsafe.Pointer, info unsafe.Pointer) C.int {
	return computeInfo("nvmlComputeInstanceGetInfo", ci, info, false)
}

func computeInfo(name string, ci, info unsafe.Pointer, placement bool) C.int {
	return onComputeInstance(name, ci, func(c nvml.ComputeInstance) nvml.Return {
		v, ret := c.GetInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		out := (*cComputeInstanceInfo)(info)
		if out == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		out.Device, out.GpuInstance = handleOf(v.Device), handleOf(v.GpuInstance)
		out.ID, out.ProfileID = v.Id, v.ProfileId
		if placement {
			out.Placement = v.Placement
		}
		return nvml.SUCCESS
	})
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(ci unsafe.Pointer) C.int {
	return onComputeInstance("nvmlComputeInstanceDestroy", ci, nvml.ComputeInstance.Destroy)
}

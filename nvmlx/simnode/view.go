package main

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What a GPU node shows besides NVML, for the simulated GPUs: the files
// NVIDIA's tools read, as a driver 580 node shows them. Pure functions of
// the GPUs, so the test can read them without a mount namespace.

// gpu is what the host files say of one simulated GPU.
type gpu struct {
	Minor    int    // /dev/nvidiaN; the NVML index, as the simulator's GetMinorNumber
	BusID    string // sysfs form, "0000:10:00.0"
	DeviceID uint16 // PCI device id, 0x2335 for the H200
	SubsysID uint32 // PCI subsystem: device << 16 | vendor, 0 when unknown
}

// readGPUs reads the GPUs through the simulator's NVML, as a tool would.
func readGPUs(lib nvml.Interface) ([]gpu, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlInit: %v", ret)
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetCount: %v", ret)
	}
	out := make([]gpu, 0, n)
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: %v", i, ret)
		}
		pci, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: nvmlDeviceGetPciInfo: %v", i, ret)
		}
		out = append(out, gpu{Minor: i, BusID: sysfsBusID(pci), DeviceID: uint16(pci.PciDeviceId >> 16), SubsysID: pci.PciSubSystemId})
	}
	return out, nil
}

// sysfsBusID is the PCI address as /sys/bus/pci/devices names it: a
// 4-digit domain, lower case (NVML's has 8).
func sysfsBusID(p nvml.PciInfo) string {
	return fmt.Sprintf("%04x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
}

// Character device majors of the simulated driver: 195 is the nvidia
// driver's fixed major (nvidia-frontend); the others are dynamic on a
// real node and read from /proc/devices, so any free number serves.
const (
	majorNvidia     = 195
	majorNvidiaCaps = 508
	majorNvidiaUVM  = 509
)

// procModules is /proc/modules with the nvidia modules loaded (what
// nvidia-mig-parted checks before it trusts NVML: util/nvml.go
// IsNvidiaModuleLoaded).
func procModules(host string) string {
	var b strings.Builder
	b.WriteString(host)
	if host != "" && !strings.HasSuffix(host, "\n") {
		b.WriteString("\n")
	}
	b.WriteString("nvidia_uvm 2076672 0 - Live 0x0000000000000000 (POE)\n")
	b.WriteString("nvidia 14376960 1 nvidia_uvm, Live 0x0000000000000000 (POE)\n")
	return b.String()
}

// procDevices is /proc/devices with the driver's character majors.
func procDevices(host string) string {
	lines := strings.Split(strings.TrimRight(host, "\n"), "\n")
	var out []string
	added := false
	for _, l := range lines {
		out = append(out, l)
		if strings.TrimSpace(l) == "Character devices:" && !added {
			out = append(out, fmt.Sprintf("%3d nvidia-frontend", majorNvidia),
				fmt.Sprintf("%3d nvidia-caps", majorNvidiaCaps), fmt.Sprintf("%3d nvidia-uvm", majorNvidiaUVM))
			added = true
		}
	}
	if !added {
		out = append(out, "Character devices:", fmt.Sprintf("%3d nvidia-frontend", majorNvidia),
			fmt.Sprintf("%3d nvidia-caps", majorNvidiaCaps), fmt.Sprintf("%3d nvidia-uvm", majorNvidiaUVM))
	}
	return strings.Join(out, "\n") + "\n"
}

// MIG capability minors as the driver numbers them in
// /proc/driver/nvidia-caps/mig-minors (MIG user guide, "Device Nodes"):
// config 1, monitor 2, then per GPU 15 GPU instance ids, each with its
// access file and 8 compute instances'.
const (
	migGIsPerGPU = 15
	migCIsPerGI  = 8
)

func giMinor(gpu, gi int) int { return 3 + gpu*migGIsPerGPU*(1+migCIsPerGI) + gi*(1+migCIsPerGI) }

func ciMinor(gpu, gi, ci int) int { return giMinor(gpu, gi) + 1 + ci }

// migMinors is /proc/driver/nvidia-caps/mig-minors for n GPUs: the driver
// lists every possible capability at load, whatever exists now; NVIDIA's
// device plugin maps a MIG device to its /dev/nvidia-caps nodes through it
// (internal/mig/mig-dp.go GetMigCapabilityDevicePaths).
func migMinors(n int) string {
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	for g := range n {
		for gi := range migGIsPerGPU {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, giMinor(g, gi))
			for ci := range migCIsPerGI {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, ciMinor(g, gi, ci))
			}
		}
	}
	return b.String()
}

// file is one file of the node's view: its path below a root, its
// content, or a symlink target, or a character device.
type file struct {
	Path    string
	Content string
	Link    string
	Major   int // a character device when Major > 0
	Minor   int
	Dir     bool
}

// procDriverFiles is /proc/driver for the GPUs: the driver's version, one
// information file per GPU, the MIG capability files and minors.
func procDriverFiles(gpus []gpu, driverVersion string) []file {
	out := []file{
		{Path: "nvidia/version", Content: fmt.Sprintf("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (mig-agent simulated node)\nGCC version:  gcc version 12.2.0\n", driverVersion)},
		{Path: "nvidia/capabilities/mig/config", Content: "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"},
		{Path: "nvidia/capabilities/mig/monitor", Content: "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n"},
		{Path: "nvidia-caps/mig-minors", Content: migMinors(len(gpus))},
	}
	for _, g := range gpus {
		out = append(out, file{Path: "nvidia/gpus/" + g.BusID + "/information",
			Content: fmt.Sprintf("Model: \t\t (simulated)\nIRQ:   \t\t 0\nGPU UUID: \t (see NVML)\nDevice Minor: \t %d\nBus Location: \t %s\n", g.Minor, g.BusID)})
	}
	return out
}

// pciFiles is one GPU's directory in /sys/bus/pci/devices, with what
// go-nvlib's nvpci reads (vendor, class, device, subsystem ids, the
// driver link, numa_node, resource); driverDir is the nvidia driver's
// directory the link points at.
func pciFiles(g gpu, driverDir string) []file {
	dir := g.BusID + "/"
	return []file{
		{Path: g.BusID, Dir: true},
		{Path: dir + "vendor", Content: "0x10de\n"},
		{Path: dir + "device", Content: fmt.Sprintf("0x%04x\n", g.DeviceID)},
		{Path: dir + "class", Content: "0x030200\n"}, // 3D controller, as data-center GPUs
		{Path: dir + "subsystem_vendor", Content: fmt.Sprintf("0x%04x\n", g.SubsysID&0xffff)},
		{Path: dir + "subsystem_device", Content: fmt.Sprintf("0x%04x\n", g.SubsysID>>16)},
		{Path: dir + "numa_node", Content: "-1\n"},
		{Path: dir + "resource", Content: "0x0000000000000000 0x0000000000ffffff 0x0000000000040200\n" +
			"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"},
		{Path: dir + "reset", Content: ""},
		{Path: dir + "config", Content: configSpace(g)},
		{Path: dir + "driver", Link: driverDir},
	}
}

// configSpace is the GPU's 256-byte PCI configuration header: ids and
// class, and no capability list (status bit 4 clear), so that go-nvlib's
// nvpci, which GPU Feature Discovery asks whether the GPU is a vGPU, finds
// no NVIDIA vendor capability: a bare-metal GPU's answer.
func configSpace(g gpu) string {
	b := make([]byte, 256)
	le16 := func(at int, v uint16) { b[at], b[at+1] = byte(v), byte(v>>8) }
	le16(0x00, 0x10de)
	le16(0x02, g.DeviceID)
	b[0x0a], b[0x0b] = 0x02, 0x03 // sub-class 3D controller, class display
	le16(0x2c, uint16(g.SubsysID&0xffff))
	le16(0x2e, uint16(g.SubsysID>>16))
	return string(b)
}

// devFiles are the driver's device nodes for the GPUs: /dev/nvidiactl,
// /dev/nvidiaN, /dev/nvidia-uvm(-tools) and every MIG capability node in
// /dev/nvidia-caps (nvidia-modprobe makes them on a real node).
func devFiles(gpus []gpu) []file {
	out := []file{
		{Path: "nvidiactl", Major: majorNvidia, Minor: 255},
		{Path: "nvidia-uvm", Major: majorNvidiaUVM, Minor: 0},
		{Path: "nvidia-uvm-tools", Major: majorNvidiaUVM, Minor: 1},
		{Path: "nvidia-caps", Dir: true},
		{Path: "nvidia-caps/nvidia-cap1", Major: majorNvidiaCaps, Minor: 1},
		{Path: "nvidia-caps/nvidia-cap2", Major: majorNvidiaCaps, Minor: 2},
	}
	for _, g := range gpus {
		out = append(out, file{Path: fmt.Sprintf("nvidia%d", g.Minor), Major: majorNvidia, Minor: g.Minor})
		for gi := range migGIsPerGPU {
			m := giMinor(g.Minor, gi)
			out = append(out, file{Path: fmt.Sprintf("nvidia-caps/nvidia-cap%d", m), Major: majorNvidiaCaps, Minor: m})
			for ci := range migCIsPerGI {
				m := ciMinor(g.Minor, gi, ci)
				out = append(out, file{Path: fmt.Sprintf("nvidia-caps/nvidia-cap%d", m), Major: majorNvidiaCaps, Minor: m})
			}
		}
	}
	return out
}

package gpus

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/profiles"
)

// Inventory is one read of this host's GPUs: what NVML reports, converted
// for the planner, with the MIG device UUIDs of every GPU instance. (The
// Kubernetes Node is corev1.Node; an Inventory is not about it.)
type Inventory struct {
	Devices   []nvmlx.Device
	Instances [][]nvmlx.GPUInstance // by position in Devices
	GPUs      []geometry.GPU        // by position in Devices
	Driver    string
	// Unusable are the GPUs NVML counts but cannot open (NO_PERMISSION, a
	// lost GPU): they are not in Devices, nothing is asked of them, and a
	// config that names them fails with that reason (UnusableNamed).
	Unusable []nvmlx.UnusableGPU
}

// Discover reads every GPU, its MIG mode and its instances. It is the one
// place that turns nvmlx state into planner input. GPUs NVML cannot open
// are listed in Unusable, not an error.
func Discover(g nvmlx.GPU) (*Inventory, error) {
	devs, unusable, err := nvmlx.SplitUnusable(g.Devices())
	if err != nil {
		return nil, fmt.Errorf("discovering GPUs: %w", err)
	}
	drv, err := g.DriverVersion()
	if err != nil {
		return nil, fmt.Errorf("reading the driver version: %w", err)
	}
	n := &Inventory{Devices: devs, Driver: drv, Unusable: unusable, Instances: make([][]nvmlx.GPUInstance, len(devs)), GPUs: make([]geometry.GPU, len(devs))}
	for i, d := range devs {
		var insts []nvmlx.GPUInstance
		if d.MigCapable && d.MigMode.Current {
			if insts, err = g.Instances(d.Index); err != nil {
				return nil, fmt.Errorf("listing MIG instances of GPU %d: %w", d.Index, err)
			}
		}
		n.Instances[i] = insts
		ok, _ := g.CanReset(d.Index)
		n.GPUs[i] = geometry.GPU{
			Index: d.Index, UUID: d.UUID, Name: d.Name, PCIDeviceID: d.PCIDeviceID, PCISubsystemID: d.PCISubsystemID,
			Architecture: d.Architecture, MigCapable: d.MigCapable,
			ModeCurrent: d.MigMode.Current, ModePending: d.MigMode.Pending,
			CanReset: ok, Catalogue: d.Catalogue, Instances: toGeometry(insts),
		}
	}
	return n, nil
}

func toGeometry(insts []nvmlx.GPUInstance) []geometry.Instance {
	out := make([]geometry.Instance, 0, len(insts))
	for _, gi := range insts {
		// Every compute instance by its profile name; none at all (a GPU
		// instance that exposes no MIG device) is an empty list, which no
		// config holds, so the plan fills or replaces it.
		cis := make([]string, 0, len(gi.ComputeInstances))
		for _, ci := range gi.ComputeInstances {
			cis = append(cis, ci.Profile)
		}
		out = append(out, geometry.Instance{Profile: gi.Profile, Start: gi.Placement.Start, Size: gi.Placement.Size, ProfileID: gi.ProfileID, Compute: cis})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Start < out[b].Start })
	return out
}

// Device returns the device with NVML index idx.
func (n *Inventory) Device(idx int) (*nvmlx.Device, []nvmlx.GPUInstance, bool) {
	for i := range n.Devices {
		if n.Devices[i].Index == idx {
			return &n.Devices[i], n.Instances[i], true
		}
	}
	return nil, nil, false
}

// GeometryOf renders each GPU's instances as "profile@start" strings, keyed
// by GPU index, for audit records and the status command.
func (n *Inventory) GeometryOf() map[string][]string {
	out := make(map[string][]string, len(n.GPUs))
	for _, g := range n.GPUs {
		key := fmt.Sprint(g.Index)
		switch {
		case !g.MigCapable:
			out[key] = []string{"no-mig"}
		case !g.ModeCurrent:
			out[key] = []string{"mig-disabled"}
		default:
			list := []string{}
			for _, in := range g.Instances {
				list = append(list, fmt.Sprintf("%s@%d", in.Name(), in.Start))
			}
			out[key] = list
		}
	}
	for _, u := range n.Unusable {
		out[fmt.Sprint(u.Index)] = []string{"unusable:" + u.Return}
	}
	return out
}

// UnusableNamed lists the GPUs of unusable that config name of spec names:
// by index, or by "devices: all" (also with a device-filter: the PCI id of
// a GPU NVML cannot open is unknown, so it may match).
func UnusableNamed(spec *geometry.Spec, name string, unusable []nvmlx.UnusableGPU) []nvmlx.UnusableGPU {
	if spec == nil || len(unusable) == 0 {
		return nil
	}
	var out []nvmlx.UnusableGPU
	for _, u := range unusable {
		for _, e := range spec.Configs[name] {
			if e.Devices.All || slices.Contains(e.Devices.Indices, u.Index) {
				out = append(out, u)
				break
			}
		}
	}
	return out
}

// UnusableError is the error of a one-shot apply of config name, which
// names GPUs NVML cannot open (the other GPUs got the config).
func UnusableError(name string, named []nvmlx.UnusableGPU) error {
	return errors.New(UnusableReason(name, named, true))
}

// UnusableReason is the failure reason of config name, which names GPUs
// NVML cannot open; others says whether the other GPUs hold the config.
func UnusableReason(name string, named []nvmlx.UnusableGPU, others bool) string {
	parts := make([]string, len(named))
	for k, u := range named {
		parts[k] = fmt.Sprintf("GPU %d (%s)", u.Index, u.Reason)
	}
	msg := fmt.Sprintf("config %q names GPUs that NVML cannot open, left alone: %s", name, strings.Join(parts, "; "))
	if others {
		msg += "; the other GPUs hold the config"
	}
	return msg
}

// MIGDevices maps each MIG device UUID on the node to its GPU UUID and the
// placement of its GPU instance.
func (n *Inventory) MIGDevices() map[string]MIGDevice {
	out := map[string]MIGDevice{}
	for i, d := range n.Devices {
		for _, gi := range n.Instances[i] {
			for _, ci := range gi.ComputeInstances {
				out[ci.UUID] = MIGDevice{GPU: d.Index, GPUUUID: d.UUID, Profile: gi.Profile, Start: gi.Placement.Start}
			}
		}
	}
	return out
}

// Exposed is what the GPUs expose, as reconcile's Disruptor.WaitResources
// takes it: each GPU's MIG mode by UUID (true: on), and the MIG devices
// (one per compute instance) of the GPUs whose MIG mode is on, by UUID with
// the compute instance's profile.
func (n *Inventory) Exposed() (migMode map[string]bool, migDevices map[string]string) {
	migMode, migDevices = map[string]bool{}, map[string]string{}
	for i, dev := range n.Devices {
		on := dev.MigCapable && dev.MigMode.Current
		migMode[dev.UUID] = on
		if !on {
			continue
		}
		for _, gi := range n.Instances[i] {
			for _, ci := range gi.ComputeInstances {
				migDevices[ci.UUID] = ci.Profile
			}
		}
	}
	return migMode, migDevices
}

// MIGDevice locates one MIG device.
type MIGDevice struct {
	GPU     int
	GPUUUID string
	Profile string
	Start   int
}

// findGI returns the driver id of the GPU instance of profile id at start.
func findGI(insts []nvmlx.GPUInstance, profileID, start int) (nvmlx.GPUInstance, bool) {
	for _, gi := range insts {
		if gi.ProfileID == profileID && gi.Placement.Start == start {
			return gi, true
		}
	}
	return nvmlx.GPUInstance{}, false
}

// placement of an instance, with the size from the catalogue when missing.
func placementOf(cat *profiles.Catalogue, in geometry.Instance) profiles.Placement {
	size := in.Size
	if size == 0 {
		if p, ok := cat.ByID(in.ProfileID); ok && len(p.Placements) > 0 {
			size = p.Placements[0].Size
		}
	}
	return profiles.Placement{Start: in.Start, Size: size}
}

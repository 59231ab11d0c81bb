package nvmlsim

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What the simulator's C library (nvmlx/simlib, bin/libnvidia-ml.so.1)
// needs beyond nvml.Interface: a stable name per handle, since NVML hands
// out one pointer per device or instance and callers may compare them, and
// the spec of an existing state file, so that a process given only the
// state file opens the same GPUs.

// HandleKey names the device, MIG device, GPU instance or compute instance
// h stands for: two handles of this library for the same object have the
// same key. ok is false for a value this package did not make.
func HandleKey(h any) (key string, ok bool) {
	switch x := h.(type) {
	case *simDevice:
		if x.mig != nil {
			return fmt.Sprintf("mig/%d/%d/%d", x.index, x.mig.gi, x.mig.ci), true
		}
		return fmt.Sprintf("gpu/%d", x.index), true
	case *simGpuInstance:
		return fmt.Sprintf("gi/%d/%d/%d/%d", x.gpu, x.id, x.profileID, x.start), true
	case *simComputeInstance:
		g := x.gi
		return fmt.Sprintf("ci/%d/%d/%d/%d/%d/%d", g.gpu, g.id, g.profileID, g.start, x.id, x.profileID), true
	}
	return "", false
}

// SpecOfState is the spec of the GPUs a --sim-state file holds ("h200x2"),
// so that a process given only the file opens the same GPUs;
// fs.ErrNotExist passes through.
func SpecOfState(path string) (string, error) {
	st, err := readSimState(path)
	if err != nil {
		return "", err
	}
	if len(st.GPUs) == 0 {
		return "", fmt.Errorf("%w: %s holds no GPUs", ErrState, path)
	}
	keys := make([]string, len(st.GPUs))
	for i, g := range st.GPUs {
		keys[i] = g.Model
	}
	return specOf(keys), nil
}

// ProfileNames names the GPU instance profile with NVML id giProfile of
// device d ("1g.18gb") and, with ciProfile >= 0, that compute instance
// profile within it ("1c.2g.35gb"; the GI's name for the full one), as the
// versioned profile info structs of nvml.h carry them. ok is false for a
// handle or profile this package does not know.
func ProfileNames(d nvml.Device, giProfile, ciProfile int) (gi, ci string, ok bool) {
	x, isSim := d.(*simDevice)
	if !isSim {
		return "", "", false
	}
	p, found := x.lib.models[x.index].Catalogue.ByID(giProfile)
	if !found {
		return "", "", false
	}
	if ciProfile < 0 {
		return p.Name, "", true
	}
	cp, found := computeByID(p, ciProfile)
	if !found {
		return p.Name, "", false
	}
	return p.Name, cp.Name, true
}

// GpuInstanceDevice is the GPU a GPU instance handle of this package
// belongs to.
func GpuInstanceDevice(g nvml.GpuInstance) (nvml.Device, int, bool) {
	x, ok := g.(*simGpuInstance)
	if !ok {
		return nil, 0, false
	}
	return &simDevice{lib: x.lib, index: x.gpu}, x.profileID, true
}

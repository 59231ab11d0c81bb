package geometry

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Errors of Resolve.
var (
	// ErrUnknownConfig: the spec has no config of that name.
	ErrUnknownConfig = errors.New("unknown MIG config")
	// ErrNoMatchingGPU: the config has no entry for any GPU of the node (a
	// config meant for other hardware).
	ErrNoMatchingGPU = errors.New("MIG config has no entry for any GPU of this node")
	// ErrNotMigCapable: an entry or request asks for MIG on a GPU without MIG.
	ErrNotMigCapable = errors.New("GPU cannot do MIG")
)

// Resolve turns config name into one Request per GPU it touches, sorted by
// GPU index, with the meaning nvidia-mig-parted gives it:
//
//   - An entry applies to a GPU when its device-filter (if any) holds the
//     GPU's PCI device id and its devices are "all" or list the GPU's index.
//   - When several entries apply to one GPU, the last one wins (mig-parted
//     applies them in file order, so the last one is what stays).
//   - "devices: all" skips GPUs that cannot do MIG; an entry naming such a
//     GPU by index and asking for MIG is an error wrapping ErrNotMigCapable
//     (asking for mig-enabled false leaves it alone).
//   - An index the node does not have gives a warning, not an error.
//   - A GPU no entry applies to gets no Request: it is left untouched.
//   - When no entry applies to any GPU, the error wraps ErrNoMatchingGPU
//     and names the node's GPU models.
func (s *Spec) Resolve(name string, gpus []GPU) ([]Request, []string, error) {
	entries, ok := s.Configs[name]
	if !ok {
		return nil, nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownConfig, name, shortList(s.Names, 12))
	}
	present := make([]int, 0, len(gpus))
	for _, g := range gpus {
		present = append(present, g.Index)
	}
	sort.Ints(present)
	var warnings []string
	warn := func(w string) {
		if !slices.Contains(warnings, w) {
			warnings = append(warnings, w)
		}
	}
	chosen := map[int]*Entry{}
	for i := range entries {
		e := &entries[i]
		ctx := fmt.Sprintf("config %q entry %d", name, i+1)
		for _, idx := range e.Devices.Indices {
			if _, found := slices.BinarySearch(present, idx); !found {
				warn(fmt.Sprintf("%s: this node has no GPU %d (it has %s); ignored", ctx, idx, indexList(present)))
			}
		}
		for j := range gpus {
			g := &gpus[j]
			if !e.Devices.All && !slices.Contains(e.Devices.Indices, g.Index) {
				continue
			}
			match, why := e.matchesFilter(g)
			if why != "" {
				warn(ctx + ": " + why)
			}
			if !match {
				continue
			}
			if !g.MigCapable {
				if e.Devices.All || !e.MigEnabled {
					continue
				}
				return nil, warnings, fmt.Errorf("%s: %w: GPU %d (%s, %s) is named by index with mig-enabled true",
					ctx, ErrNotMigCapable, g.Index, g.Name, pciID(g.PCIDeviceID))
			}
			chosen[g.Index] = e
		}
	}
	if len(chosen) == 0 {
		return nil, warnings, fmt.Errorf("%w: config %q selects none of %s", ErrNoMatchingGPU, name, describeGPUs(gpus))
	}
	reqs := make([]Request, 0, len(chosen))
	for idx, e := range chosen {
		reqs = append(reqs, Request{GPU: idx, MigEnabled: e.MigEnabled, Devices: slices.Clone(e.MigDevices)})
	}
	sort.Slice(reqs, func(a, b int) bool { return reqs[a].GPU < reqs[b].GPU })
	return reqs, warnings, nil
}

// matchesFilter reports whether e's device-filter admits g, and why not
// when the answer needs a PCI subsystem id that g does not know.
func (e *Entry) matchesFilter(g *GPU) (bool, string) {
	if len(e.DeviceFilter) == 0 {
		return true, ""
	}
	id := pciID(g.PCIDeviceID)
	why := ""
	for _, f := range e.DeviceFilter {
		dev, sub, hasSub := strings.Cut(f, ":")
		if !strings.EqualFold(dev, id) {
			continue
		}
		if !hasSub {
			return true, ""
		}
		if g.PCISubsystemID == 0 {
			why = fmt.Sprintf("device-filter %s needs the PCI subsystem id of GPU %d, which is unknown; not applied to it", f, g.Index)
			continue
		}
		if strings.EqualFold(sub, pciID(g.PCISubsystemID)) {
			return true, ""
		}
	}
	return false, why
}

func pciID(id uint32) string { return fmt.Sprintf("0x%08X", id) }

// describeGPUs names the node's GPU models: "this node's 8× NVIDIA H200
// (0x233510DE) and 1× NVIDIA L40S (0x26B910DE, no MIG)".
func describeGPUs(gpus []GPU) string {
	var models []string
	count := map[string]int{}
	for _, g := range gpus {
		m := fmt.Sprintf("%s (%s)", g.Name, pciID(g.PCIDeviceID))
		if !g.MigCapable {
			m = fmt.Sprintf("%s (%s, no MIG)", g.Name, pciID(g.PCIDeviceID))
		}
		if count[m]++; count[m] == 1 {
			models = append(models, m)
		}
	}
	if len(models) == 0 {
		return "this node's GPUs: it has none"
	}
	for i, m := range models {
		models[i] = fmt.Sprintf("%d× %s", count[m], m)
	}
	return "this node's " + strings.Join(models, " and ")
}

// indexList prints sorted indices compactly: "0-7", "0, 2, 5".
func indexList(idx []int) string {
	switch len(idx) {
	case 0:
		return "no GPU"
	case 1:
		return fmt.Sprintf("GPU %d", idx[0])
	}
	if idx[len(idx)-1]-idx[0] == len(idx)-1 && len(idx) > 2 {
		return fmt.Sprintf("GPUs %d-%d", idx[0], idx[len(idx)-1])
	}
	s := make([]string, len(idx))
	for i, v := range idx {
		s[i] = fmt.Sprint(v)
	}
	return "GPUs " + strings.Join(s, ", ")
}

func shortList(names []string, max int) string {
	if len(names) == 0 {
		return "none"
	}
	if len(names) <= max {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:max], ", "), len(names)-max)
}

package geometry

import (
	"slices"
	"sort"

	"github.com/migagent/mig-agent/profiles"
)

// Generate builds the named configs mig-agent offers for a node's GPUs
// (docs/reference.md#config-file), from what each GPU's catalogue reports:
//
//   - all-disabled: MIG off on every MIG-capable GPU;
//   - all-enabled: MIG on, no devices;
//   - all-balanced: 2× the 1-slice, 1× the 2-slice and 1× the 3-slice
//     profile on 7-slice GPUs; 2× 1-slice and 1× 2-slice on 4-slice GPUs (A30);
//   - all-<profile> for every GPU instance profile, '+' written as '.'
//     (all-1g.18gb.me), with the largest count that fits.
//
// With one GPU model on the node, entries select "devices: all"; with
// several (GPUs without MIG count: a node of H100s and L40Ss holds two),
// each MIG-capable model gets its own entry with a device-filter holding
// its PCI device id (all-disabled stays one "devices: all" entry), so the
// text also means the same to nvidia-mig-parted. GPUs without MIG get no
// entry. Names and counts equal those of NVIDIA's
// config-default.yaml for the same GPU.
func Generate(gpus []GPU) *Spec {
	sorted := slices.Clone(gpus)
	sort.SliceStable(sorted, func(a, b int) bool { return sorted[a].Index < sorted[b].Index })
	var models []*GPU
	ids := map[uint32]bool{}
	for i := range sorted {
		g := &sorted[i]
		ids[g.PCIDeviceID] = true
		if g.MigCapable && !slices.ContainsFunc(models, func(m *GPU) bool { return m.PCIDeviceID == g.PCIDeviceID }) {
			models = append(models, g)
		}
	}
	s := &Spec{Version: ConfigVersion, Configs: map[string][]Entry{}}
	add := func(name string, m *GPU, mig bool, devices []DeviceCount) {
		e := Entry{Devices: DeviceSelector{All: true}, MigEnabled: mig, MigDevices: devices}
		if m != nil && len(ids) > 1 {
			e.DeviceFilter = []string{pciID(m.PCIDeviceID)}
		}
		if _, ok := s.Configs[name]; !ok {
			s.Names = append(s.Names, name)
		}
		s.Configs[name] = append(s.Configs[name], e)
	}
	add("all-disabled", nil, false, nil)
	if len(models) == 0 {
		add("all-enabled", nil, true, nil)
	}
	for _, m := range models {
		add("all-enabled", m, true, nil)
	}
	for _, m := range models {
		if b := balanced(&m.Catalogue); b != nil {
			add("all-balanced", m, true, b)
		}
	}
	for _, m := range models {
		for i := range m.Catalogue.Profiles {
			p := &m.Catalogue.Profiles[i]
			n, err := profiles.Parse(p.Name)
			if err != nil || n.IsCompute() {
				continue
			}
			if c := maxFit(&m.Catalogue, p); c > 0 {
				add("all-"+n.ConfigSuffix(), m, true, []DeviceCount{{Profile: p.Name, Count: c}})
			}
		}
	}
	return s
}

// balanced is the all-balanced geometry of a catalogue, nil if it has none.
func balanced(cat *profiles.Catalogue) []DeviceCount {
	var want []DeviceCount
	add := func(index, count int) {
		if p, ok := cat.ByIndex(index); ok {
			want = append(want, DeviceCount{Profile: p.Name, Count: count})
		}
	}
	switch ComputeSlices(cat) {
	case 7:
		add(profiles.Index1Slice, 2)
		add(profiles.Index2Slice, 1)
		add(profiles.Index3Slice, 1)
		if len(want) != 3 {
			return nil
		}
	case 4:
		add(profiles.Index1Slice, 2)
		add(profiles.Index2Slice, 1)
		if len(want) != 2 {
			return nil
		}
	default:
		return nil
	}
	if _, err := Fit(cat, want); err != nil {
		return nil
	}
	return want
}

// maxFit is the largest count of p that fits on an otherwise empty GPU.
func maxFit(cat *profiles.Catalogue, p *profiles.Profile) int {
	for n := min(p.MaxCount, MaxCount); n > 0; n-- {
		if _, err := Fit(cat, []DeviceCount{{Profile: p.Name, Count: n}}); err == nil {
			return n
		}
	}
	return 0
}

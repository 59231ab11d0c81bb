package profiles

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestModelsProfileNames(t *testing.T) {
	want := map[string][]string{
		"h200":        {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
		"h100-80gb":   {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		"a100-40gb":   {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
		"a100-80gb":   {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		"a30":         {"1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"},
		"b200":        {"1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"},
		"gh200":       {"1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"},
		"gh200-144gb": {"1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"},
		"gb200":       {"1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"},
		"l40s":        nil,
	}
	if len(Models()) != len(want) {
		t.Errorf("Models() has %d models, the test knows %d", len(Models()), len(want))
	}
	for _, m := range Models() {
		t.Run(m.Key, func(t *testing.T) {
			w, ok := want[m.Key]
			if !ok {
				t.Fatalf("model %q not in the test table", m.Key)
			}
			var got []string
			for _, p := range m.Catalogue.Profiles {
				got = append(got, p.Name)
				computed := ProfileName(p.Index, p.MemoryMiB, m.MemoryBytes)
				if p.Name != computed {
					t.Errorf("profile %s (index %d, %d MiB): ProfileName gives %q", p.Name, p.Index, p.MemoryMiB, computed)
				}
				if s := SlicesForIndex(p.Index); p.Slices != s {
					t.Errorf("profile %s: Slices %d, index %d has %d", p.Name, p.Slices, p.Index, s)
				}
			}
			if !slices.Equal(got, w) {
				t.Errorf("names %v, want %v", got, w)
			}
		})
	}
}

func TestModelsCatalogueConsistent(t *testing.T) {
	keys := map[string]bool{}
	pciIDs := map[uint32]bool{}
	for _, m := range Models() {
		t.Run(m.Key, func(t *testing.T) {
			if keys[m.Key] || pciIDs[m.PCIDeviceID] {
				t.Errorf("duplicate key %q or PCI id 0x%08X", m.Key, m.PCIDeviceID)
			}
			keys[m.Key], pciIDs[m.PCIDeviceID] = true, true
			if got, ok := ModelByKey(m.Key); !ok || got.PCIDeviceID != m.PCIDeviceID {
				t.Errorf("ModelByKey(%q) = %v, %v", m.Key, got, ok)
			}
			if got, ok := ModelByPCIID(m.PCIDeviceID); !ok || got.Key != m.Key {
				t.Errorf("ModelByPCIID(0x%08X) = %v, %v", m.PCIDeviceID, got, ok)
			}
			if m.Name == "" || m.MemoryBytes == 0 || m.Architecture == "" {
				t.Errorf("incomplete model %+v", m)
			}
			if !m.MigCapable {
				if len(m.Catalogue.Profiles) != 0 || m.Catalogue.MemorySlices != 0 {
					t.Errorf("non-MIG model has a catalogue: %+v", m.Catalogue)
				}
				return
			}
			if len(m.Catalogue.Profiles) == 0 {
				t.Fatal("MIG model without profiles")
			}
			ids, idxs := map[int]bool{}, map[int]bool{}
			for _, p := range m.Catalogue.Profiles {
				if ids[p.ID] || idxs[p.Index] {
					t.Errorf("profile %s: duplicate id %d or index %d", p.Name, p.ID, p.Index)
				}
				ids[p.ID], idxs[p.Index] = true, true
				if p.MaxCount < 1 || p.MaxCount > len(p.Placements) {
					t.Errorf("profile %s: MaxCount %d with %d placements", p.Name, p.MaxCount, len(p.Placements))
				}
				if p.MemoryMiB == 0 || p.MemoryMiB > m.MemoryMiB() {
					t.Errorf("profile %s: memory %d MiB of %d", p.Name, p.MemoryMiB, m.MemoryMiB())
				}
				for i, pl := range p.Placements {
					if pl.Start < 0 || pl.Size < 1 || pl.End() > m.Catalogue.MemorySlices {
						t.Errorf("profile %s: placement %v outside %d memory slices", p.Name, pl, m.Catalogue.MemorySlices)
					}
					if pl.Size != p.Placements[0].Size {
						t.Errorf("profile %s: placement sizes differ", p.Name)
					}
					if i > 0 && pl.Start <= p.Placements[i-1].Start {
						t.Errorf("profile %s: placements not ascending", p.Name)
					}
				}
				// MaxCount instances must fit side by side in distinct placements.
				if disjoint := countDisjoint(p.Placements); disjoint < p.MaxCount {
					t.Errorf("profile %s: MaxCount %d but only %d disjoint placements", p.Name, p.MaxCount, disjoint)
				}
			}
		})
	}
}

func countDisjoint(ps []Placement) int {
	n, end := 0, -1
	for _, p := range ps {
		if p.Start >= end {
			n, end = n+1, p.End()
		}
	}
	return n
}

func TestModelsComputeProfiles(t *testing.T) {
	wantIndex := map[int]int{1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
	wantSizes := map[int][]int{1: {1}, 2: {1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 7: {1, 2, 3, 4, 7}}
	for _, m := range Models() {
		for _, p := range m.Catalogue.Profiles {
			gi, err := Parse(p.Name)
			if err != nil {
				t.Fatalf("%s %s: %v", m.Key, p.Name, err)
			}
			var sizes []int
			for _, cp := range p.ComputeProfiles {
				sizes = append(sizes, cp.Slices)
				if cp.Index != wantIndex[cp.Slices] || cp.ID != cp.Index {
					t.Errorf("%s %s: %s has index %d id %d", m.Key, p.Name, cp.Name, cp.Index, cp.ID)
				}
				if cp.MaxCount != p.Slices/cp.Slices {
					t.Errorf("%s %s: %s MaxCount %d", m.Key, p.Name, cp.Name, cp.MaxCount)
				}
				n, err := Parse(cp.Name)
				if err != nil {
					t.Errorf("%s %s: compute name: %v", m.Key, p.Name, err)
					continue
				}
				if !n.GI().Equal(gi) || n.C != cp.Slices {
					t.Errorf("%s %s: compute profile %q does not name %d slices of it", m.Key, p.Name, cp.Name, cp.Slices)
				}
				if cp.Slices == p.Slices && cp.Name != p.Name {
					t.Errorf("%s %s: full compute profile named %q", m.Key, p.Name, cp.Name)
				}
			}
			if !slices.Equal(sizes, wantSizes[p.Slices]) {
				t.Errorf("%s %s: compute sizes %v, want %v", m.Key, p.Name, sizes, wantSizes[p.Slices])
			}
		}
	}
	// Spot checks of names and lookups.
	h200, _ := ModelByKey("h200")
	for _, tc := range []struct {
		gi, name string
		id, max  int
		ciExists bool
	}{
		{"3g.71gb", "1c.3g.71gb", 0, 3, true},
		{"3g.71gb", "2c.3g.71gb", 1, 1, true},
		{"3g.71gb", "3g.71gb", 2, 1, true},
		{"4g.71gb", "3c.4g.71gb", 0, 0, false},
		{"4g.71gb", "4g.71gb", 3, 1, true},
		{"7g.141gb", "2c.7g.141gb", 1, 3, true},
		{"7g.141gb", "7g.141gb", 4, 1, true},
		{"1g.18gb+me", "1g.18gb+me", 0, 1, true},
	} {
		gi, err := Parse(tc.gi)
		if err != nil {
			t.Fatal(err)
		}
		p, ok := h200.Catalogue.ByName(gi)
		if !ok {
			t.Fatalf("h200 %s missing", tc.gi)
		}
		n, err := Parse(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		cp, ok := p.Compute(n)
		if ok != tc.ciExists || (ok && (cp.Name != tc.name || cp.ID != tc.id || cp.MaxCount != tc.max)) {
			t.Errorf("Compute(%s) in %s = %+v, %v", tc.name, tc.gi, cp, ok)
		}
	}
}

// probe is the part of shared/fixtures/h200-nvml-probe.json the test reads.
type probe struct {
	Devices []struct {
		Name struct{ Value string }
		PCI  struct {
			Value struct {
				PCIDeviceID string `json:"pci_device_id"`
			}
		} `json:"pci"`
		Memory struct {
			Value struct {
				TotalBytes uint64 `json:"total_bytes"`
			}
		}
		ArchitectureName string `json:"architecture_name"`
		MigCapable       bool   `json:"mig_capable"`
		Profiles         []struct {
			Index int `json:"profile_index"`
			Info  struct {
				Ok    bool
				Value struct {
					ID            int    `json:"id"`
					SliceCount    int    `json:"slice_count"`
					InstanceCount int    `json:"instance_count"`
					SMs           int    `json:"multiprocessor_count"`
					CE            int    `json:"copy_engine_count"`
					DEC           int    `json:"decoder_count"`
					ENC           int    `json:"encoder_count"`
					JPG           int    `json:"jpeg_count"`
					OFA           int    `json:"ofa_count"`
					MemoryMB      uint64 `json:"memory_size_mb"`
				}
			}
			Placements struct {
				Value []Placement
			} `json:"possible_placements"`
		} `json:"gpu_instance_profiles"`
	}
}

func TestH200MatchesProbe(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "h200-nvml-probe.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pr probe
	if err := json.Unmarshal(raw, &pr); err != nil {
		t.Fatal(err)
	}
	if len(pr.Devices) != 1 {
		t.Fatalf("probe has %d devices", len(pr.Devices))
	}
	d := pr.Devices[0]
	m, ok := ModelByKey("h200")
	if !ok {
		t.Fatal("no h200 model")
	}
	if m.Name != d.Name.Value || fmt.Sprintf("0x%08X", m.PCIDeviceID) != d.PCI.Value.PCIDeviceID ||
		m.MemoryBytes != d.Memory.Value.TotalBytes || m.MigCapable != d.MigCapable || m.Architecture != "hopper" ||
		d.ArchitectureName != "Hopper" {
		t.Errorf("model %s 0x%08X %d %v, probe %s %s %d %v", m.Name, m.PCIDeviceID, m.MemoryBytes, m.MigCapable,
			d.Name.Value, d.PCI.Value.PCIDeviceID, d.Memory.Value.TotalBytes, d.MigCapable)
	}
	var seen int
	for _, pp := range d.Profiles {
		p, inModel := m.Catalogue.ByIndex(pp.Index)
		if !pp.Info.Ok {
			if inModel {
				t.Errorf("index %d: NVML does not offer it, the model does (%s)", pp.Index, p.Name)
			}
			continue
		}
		if !inModel {
			t.Errorf("index %d (id %d): NVML offers it, the model does not", pp.Index, pp.Info.Value.ID)
			continue
		}
		seen++
		v := pp.Info.Value
		got := []int{p.ID, p.Slices, p.MaxCount, int(p.MemoryMiB), p.Multiprocessors, p.CopyEngines, p.Decoders, p.Encoders, p.JPEGs, p.OFAs}
		want := []int{v.ID, v.SliceCount, v.InstanceCount, int(v.MemoryMB), v.SMs, v.CE, v.DEC, v.ENC, v.JPG, v.OFA}
		if !slices.Equal(got, want) {
			t.Errorf("index %d %s: id/slices/max/mem/SM/CE/DEC/ENC/JPG/OFA %v, probe %v", pp.Index, p.Name, got, want)
		}
		if !slices.Equal(p.Placements, pp.Placements.Value) {
			t.Errorf("index %d %s: placements %v, probe %v", pp.Index, p.Name, p.Placements, pp.Placements.Value)
		}
	}
	if seen != len(m.Catalogue.Profiles) || seen != 7 {
		t.Errorf("compared %d profiles, model has %d", seen, len(m.Catalogue.Profiles))
	}
}

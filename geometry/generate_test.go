package geometry

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/migagent/mig-agent/profiles"
)

// counts turns requests into comparable per-GPU maps of canonical profile
// names to counts (zero counts dropped).
func counts(reqs []Request) map[int]string {
	out := map[int]string{}
	for _, r := range reqs {
		m := map[string]int{}
		for _, d := range r.Devices {
			if d.Count > 0 {
				m[canonical(d.Profile)] += d.Count
			}
		}
		out[r.GPU] = fmt.Sprint(r.MigEnabled, m)
	}
	return out
}

// TestGenerateMatchesNVIDIA checks, for every MIG model, that each
// generated config exists in NVIDIA's config-default.yaml and gives the
// model's GPUs the same geometry, and that each NVIDIA config that fits the
// model is generated.
func TestGenerateMatchesNVIDIA(t *testing.T) {
	d := readSpec(t, "config-default.yaml")
	models := migModels()
	if len(models) == 0 {
		t.Fatal("no MIG model")
	}
	for _, m := range models {
		t.Run(m.Key, func(t *testing.T) {
			gpus := node(t, m.Key, 8)
			gen := Generate(gpus)
			if len(gen.Names) < 4 || gen.Names[0] != "all-disabled" || gen.Names[1] != "all-enabled" || gen.Names[2] != "all-balanced" {
				t.Fatalf("names %v", gen.Names)
			}
			for _, name := range gen.Names {
				got, _, err := gen.Resolve(name, gpus)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				want, _, err := d.Resolve(name, gpus)
				if err != nil {
					t.Fatalf("%s: not in config-default.yaml for this model: %v", name, err)
				}
				if g, w := counts(got), counts(want); !reflect.DeepEqual(g, w) {
					t.Fatalf("%s: generated %v; NVIDIA %v", name, g[0], w[0])
				}
				for _, r := range got {
					if err := Validate(gpus[r.GPU], r); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
				}
				for _, e := range gen.Configs[name] {
					if len(e.DeviceFilter) != 0 {
						t.Fatalf("%s: device-filter on a one-model node", name)
					}
				}
			}
			for _, name := range d.Names {
				reqs, _, err := d.Resolve(name, gpus)
				if err != nil || slices.ContainsFunc(reqs, func(r Request) bool { return Validate(gpus[r.GPU], r) != nil }) {
					continue
				}
				if _, ok := gen.Configs[name]; !ok {
					t.Fatalf("NVIDIA's %s fits but is not generated", name)
				}
			}
			for _, p := range m.Catalogue.Profiles {
				n, _ := profiles.Parse(p.Name)
				if _, ok := gen.Configs["all-"+n.ConfigSuffix()]; !ok {
					t.Fatalf("no config for %s", p.Name)
				}
			}
			out, err := gen.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if back, err := Parse(out); err != nil || !reflect.DeepEqual(back, gen) {
				t.Fatalf("round trip: %v\n%s", err, out)
			}
		})
	}
}

func TestGenerateH200(t *testing.T) {
	gen := Generate(append(node(t, "h200", 2), l40s(2)))
	want := []string{"all-disabled", "all-enabled", "all-balanced", "all-1g.18gb", "all-1g.18gb.me", "all-1g.35gb",
		"all-2g.35gb", "all-3g.71gb", "all-4g.71gb", "all-7g.141gb"}
	if !reflect.DeepEqual(gen.Names, want) {
		t.Fatalf("names %v", gen.Names)
	}
	for name, c := range map[string]DeviceCount{"all-1g.18gb.me": {"1g.18gb+me", 1}, "all-1g.35gb": {"1g.35gb", 4}, "all-1g.18gb": {"1g.18gb", 7}} {
		if e := gen.Configs[name]; len(e) != 1 || !reflect.DeepEqual(e[0].MigDevices, []DeviceCount{c}) || !e[0].Devices.All {
			t.Fatalf("%s: %+v", name, e)
		}
	}
	if e := gen.Configs["all-balanced"][0].MigDevices; !reflect.DeepEqual(e, dc("1g.18gb=2", "2g.35gb=1", "3g.71gb=1")) {
		t.Fatalf("balanced %v", e)
	}
}

// TestGenerateSeveralModels: with two MIG models every entry but
// all-disabled's carries one model's PCI id, and each model gets its own
// counts. The second model is every other known MIG model in turn, or an
// H200 under another PCI id while profiles knows only one.
func TestGenerateSeveralModels(t *testing.T) {
	h := modelGPU(t, "h200", 0)
	var others []GPU
	for _, m := range migModels() {
		if m.Key != "h200" {
			others = append(others, gpuOf(m, 1))
		}
	}
	if len(others) == 0 {
		twin := h
		twin.Index, twin.PCIDeviceID, twin.Name = 1, 0x233B10DE, "NVIDIA H200 NVL"
		others = append(others, twin)
	}
	for _, o := range others {
		gpus := []GPU{h, o, l40s(2)}
		gen := Generate(gpus)
		for _, name := range gen.Names {
			entries := gen.Configs[name]
			for _, e := range entries {
				if name != "all-disabled" && (len(e.DeviceFilter) != 1 || e.DeviceFilter[0] != pciID(h.PCIDeviceID) && e.DeviceFilter[0] != pciID(o.PCIDeviceID)) {
					t.Fatalf("%s: %s entry %+v", o.Name, name, e)
				}
			}
			reqs, _, err := gen.Resolve(name, gpus)
			if err != nil {
				t.Fatalf("%s: %s: %v", o.Name, name, err)
			}
			for _, r := range reqs {
				if r.GPU == 2 {
					t.Fatalf("%s: %s touches the L40S", o.Name, name)
				}
				single := Generate([]GPU{gpus[r.GPU]})
				want, _, err := single.Resolve(name, []GPU{gpus[r.GPU]})
				if err != nil || !reflect.DeepEqual(counts(want)[r.GPU], counts([]Request{r})[r.GPU]) {
					t.Fatalf("%s: %s on GPU %d: %v vs one-model %v (%v)", o.Name, name, r.GPU, r, want, err)
				}
			}
		}
		if n := len(gen.Configs["all-balanced"]); n != 2 {
			t.Fatalf("%s: all-balanced has %d entries", o.Name, n)
		}
	}
}

func TestGenerateNoMIG(t *testing.T) {
	gen := Generate([]GPU{l40s(0)})
	if !reflect.DeepEqual(gen.Names, []string{"all-disabled", "all-enabled"}) {
		t.Fatalf("names %v", gen.Names)
	}
	if _, err := gen.Marshal(); err != nil {
		t.Fatal(err)
	}
}

package geometry

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/profiles"
)

// TestPackMigParted: compute-instance entries share GPU instances as
// nvidia-mig-parted's SetMigConfig (pkg/mig/config/config.go) walks them:
// MigConfig.Flatten (pkg/types/mig_config.go) sorts the entries by G, then
// C, then attributes, all descending; each entry reuses the GPU instance
// created last while it has the same GPU instance profile and the compute
// instance still fits, else opens a new one; iteratePermutationsUntilSuccess
// tries the next ordering when one fails. Each want is what that walk
// creates, derived by hand in the comment of the row.
func TestPackMigParted(t *testing.T) {
	a30GPU := modelGPU(t, "a30", 0)
	h200, a30 := h200Cat(t), &a30GPU.Catalogue
	tests := []struct {
		name    string
		cat     *profiles.Catalogue
		devices []DeviceCount
		want    string // layout, or "" when it must fail
		errHas  string
	}{
		// Identical entries fill one GPU instance.
		{"7×1c.7g: one 7g holding seven", h200, dc("1c.7g.141gb=7"), "7×1c.7g.141gb@0", ""},
		{"2×1c.3g: one 3g holding two (not two 3g)", h200, dc("1c.3g.71gb=2"), "2×1c.3g.71gb@0", ""},
		{"3×1c.3g: one 3g, full", h200, dc("1c.3g.71gb=3"), "3×1c.3g.71gb@0", ""},
		{"2×2c.7g: one 7g", h200, dc("2c.7g.141gb=2"), "2×2c.7g.141gb@0", ""},
		// Counts that overflow one GPU instance open the next one.
		{"4×1c.3g: 3 + 1", h200, dc("1c.3g.71gb=4"), "3×1c.3g.71gb@0 1c.3g.71gb@4", ""},
		{"6×1c.3g: 3 + 3", h200, dc("1c.3g.71gb=6"), "3×1c.3g.71gb@0 3×1c.3g.71gb@4", ""},
		{"7×1c.3g: a third 3g does not exist", h200, dc("1c.3g.71gb=7"), "", "3g.71gb{3×1c.3g.71gb} + 3g.71gb{3×1c.3g.71gb} + 1c.3g.71gb: needs 9 compute slices of 7"},
		{"3×1c.2g: 2 + 1", h200, dc("1c.2g.35gb=3"), "2×1c.2g.35gb@0 1c.2g.35gb@2", ""},
		{"2×2c.3g: 2c fits once in a 3g (max count 1)", h200, dc("2c.3g.71gb=2"), "2c.3g.71gb@0 2c.3g.71gb@4", ""},
		{"8×1c.7g: more compute slices than the GPU", h200, dc("1c.7g.141gb=8"), "", "needs 8 compute slices of 7"},
		{"1c.7g + 1c.3g: a 7g and a 3g in every order", h200, dc("1c.7g.141gb=1", "1c.3g.71gb=1"), "", "needs GPU instances of 10 compute slices of 7"},
		// Mixed C values: Flatten puts larger C first, the smaller fill up.
		{"2c.3g + 1c.3g: one 3g", h200, dc("1c.3g.71gb=1", "2c.3g.71gb=1"), "2c.3g.71gb+1c.3g.71gb@0", ""},
		{"3×2c.7g + 1c.7g: one 7g", h200, dc("1c.7g.141gb=1", "2c.7g.141gb=3"), "3×2c.7g.141gb+1c.7g.141gb@0", ""},
		{"4c.7g + 3c.7g: one 7g", h200, dc("3c.7g.141gb=1", "4c.7g.141gb=1"), "4c.7g.141gb+3c.7g.141gb@0", ""},
		{"2c.4g + 2×1c.4g: one 4g", h200, dc("1c.4g.71gb=2", "2c.4g.71gb=1"), "2c.4g.71gb+2×1c.4g.71gb@0", ""},
		// Sorted order [2c,2c,1c,1c] walks to 2c | 2c+1c | 1c, three 3g that do
		// not exist; the next permutation, [2c,1c,2c,1c], gives 2c+1c twice.
		{"2×2c.3g + 2×1c.3g: the second permutation", h200, dc("2c.3g.71gb=2", "1c.3g.71gb=2"),
			"2c.3g.71gb+1c.3g.71gb@0 2c.3g.71gb+1c.3g.71gb@4", ""},
		// A full compute instance never shares: the reuse attempt finds no room.
		{"3g + 1c.3g: two 3g", h200, dc("3g.71gb=1", "1c.3g.71gb=1"), "3g.71gb@0 1c.3g.71gb@4", ""},
		{"2×3g: two 3g", h200, dc("3g.71gb=2"), "3g.71gb@0 3g.71gb@4", ""},
		// Different GPU instance profiles never share, even in one run of G.
		{"1c.4g + 3×1c.3g", h200, dc("1c.3g.71gb=3", "1c.4g.71gb=1"), "1c.4g.71gb@0 3×1c.3g.71gb@4", ""},
		{"1g + 1c.3g + 1c.2g", h200, dc("1g.18gb=1", "1c.3g.71gb=1", "1c.2g.35gb=1"), "1c.3g.71gb@0 1c.2g.35gb@4 1g.18gb@6", ""},
		// +me variants are their own GPU instance profile: Flatten puts them
		// first among equal G and C, and they never share with plain ones.
		{"2×1c.2g+me: one 2g+me", a30, dc("1c.2g.12gb+me=2"), "2×1c.2g.12gb+me@0", ""},
		{"1c.2g+me + 1c.2g: two GPU instances", a30, dc("1c.2g.12gb=1", "1c.2g.12gb+me=1"), "1c.2g.12gb@0 1c.2g.12gb+me@2", ""},
		{"3×1c.2g+me: only one 2g+me exists", a30, dc("1c.2g.12gb+me=3"), "", "2 × 2g.12gb+me asked, the GPU offers at most 1"},
		{"1g+me + 1g: two", h200, dc("1g.18gb=1", "1g.18gb+me=1"), "1g.18gb@0 1g.18gb+me@1", ""},
		// Spellings of one profile are one entry.
		{"1c.1g = 1g", h200, dc("1c.1g.18gb=2", "1g.18gb=1"), "1g.18gb@0 1g.18gb@1 1g.18gb@2", ""},
		{"compute profile the GPU instance does not offer", h200, dc("3c.4g.71gb=1"), "", `compute profile "3c.4g.71gb" inside 4g.71gb`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Fit(tc.cat, tc.devices)
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("got %s, %v; want error containing %q", layout(got), err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if layout(got) != tc.want {
				t.Fatalf("got %s; want %s", layout(got), tc.want)
			}
			checkInstances(t, tc.cat, got)
			// What Fit packs, the GPU then holds: the plan from it is empty.
			g := GPU{Index: 0, Name: "test", MigCapable: true, ModeCurrent: true, ModePending: true, Catalogue: *tc.cat, Instances: got}
			p, err := PlanGPU(g, &Request{MigEnabled: true, Devices: tc.devices})
			if err != nil || p.Action != ActionUntouched {
				t.Fatalf("plan of what Fit packs: %+v, %v", p, err)
			}
		})
	}
}

// TestPackTieOrder: Flatten's sort leaves entries equal in G, C and
// positive attributes in Go map order; mig-agent keeps each GPU instance
// profile's entries together, so they pack into the fewest GPU instances.
func TestPackTieOrder(t *testing.T) {
	cat := &profiles.Catalogue{MemorySlices: 4, Profiles: []profiles.Profile{
		{Name: "2g.48gb", ID: 5, Index: profiles.Index2Slice, Slices: 2, MaxCount: 2, Placements: []profiles.Placement{{Start: 0, Size: 2}, {Start: 2, Size: 2}},
			ComputeProfiles: profiles.StandardComputeProfiles(profiles.Name{C: 2, G: 2, GB: 48})},
		{Name: "2g.48gb-me", ID: 67, Index: profiles.Index2SliceNoME, Slices: 2, MaxCount: 2, Placements: []profiles.Placement{{Start: 0, Size: 2}, {Start: 2, Size: 2}},
			ComputeProfiles: profiles.StandardComputeProfiles(profiles.Name{C: 2, G: 2, GB: 48, NegAttrs: []string{"me"}})},
		{Name: "4g.96gb", ID: 0, Index: profiles.Index4Slice, Slices: 4, MaxCount: 1, Placements: []profiles.Placement{{Start: 0, Size: 4}}},
	}}
	for _, devices := range [][]DeviceCount{
		dc("1c.2g.48gb=1", "1c.2g.48gb-me=2", "1c.2g.48gb=1"),
		dc("1c.2g.48gb-me=2", "1c.2g.48gb=2"),
	} {
		got, err := Fit(cat, devices)
		if err != nil {
			t.Fatal(err)
		}
		if want := "2×1c.2g.48gb@0 2×1c.2g.48gb-me@2"; layout(got) != want {
			t.Fatalf("%v: got %s; want %s", devices, layout(got), want)
		}
	}
}

// TestPermutationOrder: the orderings come in the order of mig-parted's
// iteratePermutationsUntilSuccess swap recursion, each distinct one once.
func TestPermutationOrder(t *testing.T) {
	a, b, c := &ciReq{name: "a"}, &ciReq{name: "b"}, &ciReq{name: "c"}
	for _, tc := range []struct {
		in   []*ciReq
		want string
	}{
		{[]*ciReq{a, a, b}, "aab aba baa"},
		{[]*ciReq{a, b, c}, "abc acb bac bca cba cab"},
		{[]*ciReq{a, a, b, b}, "aabb abab abba baab baba bbaa"},
	} {
		var got []string
		permutations(tc.in, func(o []*ciReq) bool {
			var s strings.Builder
			for _, x := range o {
				s.WriteString(x.name)
			}
			got = append(got, s.String())
			return false
		})
		if strings.Join(got, " ") != tc.want {
			t.Errorf("got %s; want %s", strings.Join(got, " "), tc.want)
		}
	}
}

func TestPackErrorsWrap(t *testing.T) {
	_, err := Fit(h200Cat(t), dc("1c.3g.71gb=7"))
	if !errors.Is(err, ErrDoesNotFit) {
		t.Fatalf("error %v", err)
	}
}

// randomComputeRequest draws 1 to 4 GPU instance or compute instance
// profiles with counts 1 to 3.
func randomComputeRequest(r *rand.Rand, cat *profiles.Catalogue) []DeviceCount {
	var names []string
	for _, p := range cat.Profiles {
		names = append(names, p.Name)
		for _, cp := range p.ComputeProfiles {
			if n, err := profiles.Parse(cp.Name); err == nil && n.IsCompute() {
				names = append(names, cp.Name)
			}
		}
	}
	var out []DeviceCount
	for range 1 + r.IntN(4) {
		name := names[r.IntN(len(names))]
		if !slices.ContainsFunc(out, func(d DeviceCount) bool { return d.Profile == name }) {
			out = append(out, DeviceCount{Profile: name, Count: 1 + r.IntN(3)})
		}
	}
	return out
}

// TestPlanComputeRandom walks every model through random geometries with
// shared GPU instances: each plan, applied, leaves nothing to do; a kept
// GPU instance ends with its compute instances less DestroyCompute plus
// CreateCompute.
func TestPlanComputeRandom(t *testing.T) {
	for _, m := range migModels() {
		r := rand.New(rand.NewPCG(11, uint64(m.PCIDeviceID)))
		g := gpuOf(m, 0)
		g.ModeCurrent, g.ModePending = true, true
		valid := 0
		for step := range 1500 {
			req := &Request{MigEnabled: true, Devices: randomComputeRequest(r, &g.Catalogue)}
			if Validate(g, *req) != nil {
				continue
			}
			valid++
			p, err := PlanGPU(g, req)
			if err != nil {
				t.Fatalf("%s step %d: %v", m.Key, step, err)
			}
			checkInstances(t, &g.Catalogue, p.Desired)
			before := map[giKey][]string{}
			for _, in := range g.Instances {
				before[giKey{canonical(in.Profile), in.Start}] = computeOf(in)
			}
			for _, k := range p.Keep {
				key := giKey{canonical(k.Profile), k.Start}
				cis := slices.Clone(before[key])
				for _, c := range p.DestroyCompute {
					if c.Start == k.Start && c.Profile == k.Profile {
						cis = minus(cis, []string{c.Compute})
					}
				}
				for _, c := range p.CreateCompute {
					if c.Start == k.Start && c.Profile == k.Profile {
						cis = append(cis, c.Compute)
					}
				}
				slices.SortFunc(cis, compareCI)
				if strings.Join(cis, " ") != strings.Join(computeOf(k), " ") {
					t.Fatalf("%s step %d: kept %s ends with %v", m.Key, step, k.Name(), cis)
				}
			}
			g = apply(g, p)
			again, err := PlanGPU(g, req)
			if err != nil || again.Action != ActionUntouched {
				t.Fatalf("%s step %d: after apply %+v, %v", m.Key, step, again, err)
			}
		}
		if valid < 100 {
			t.Fatalf("%s: only %d valid random requests", m.Key, valid)
		}
	}
}

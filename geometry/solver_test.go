package geometry

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/profiles"
)

func TestFitH200(t *testing.T) {
	cat := h200Cat(t)
	tests := []struct {
		name    string
		devices []DeviceCount
		want    string // layout, or "" when it must fail
		err     error
		errHas  string
	}{
		{"4g+3g: only 4g@0 + 3g@4", dc("3g.71gb=1", "4g.71gb=1"), "4g.71gb@0 3g.71gb@4", nil, ""},
		{"3g+3g", dc("3g.71gb=2"), "3g.71gb@0 3g.71gb@4", nil, ""},
		{"3g+3g+1g", dc("3g.71gb=2", "1g.18gb=1"), "", ErrDoesNotFit, "3g.71gb + 3g.71gb + 1g.18gb: needs 9 memory slices of 8"},
		{"4g+2g+1g", dc("1g.18gb=1", "2g.35gb=1", "4g.71gb=1"), "4g.71gb@0 2g.35gb@4 1g.18gb@6", nil, ""},
		{"7×1g", dc("1g.18gb=7"), "1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3 1g.18gb@4 1g.18gb@5 1g.18gb@6", nil, ""},
		{"8×1g", dc("1g.18gb=8"), "", ErrDoesNotFit, "8 × 1g.18gb: needs 8 compute slices of 7"},
		{"4×1g.35gb uses all memory", dc("1g.35gb=4"), "1g.35gb@0 1g.35gb@2 1g.35gb@4 1g.35gb@6", nil, ""},
		{"4×1g.35gb + 1g.18gb", dc("1g.35gb=4", "1g.18gb=1"), "", ErrDoesNotFit, "4 × 1g.35gb + 1g.18gb: needs 9 memory slices of 8"},
		{"3×2g + 1g", dc("2g.35gb=3", "1g.18gb=1"), "2g.35gb@0 2g.35gb@2 2g.35gb@4 1g.18gb@6", nil, ""},
		{"1g.35gb + 3×2g", dc("1g.35gb=1", "2g.35gb=3"), "2g.35gb@0 2g.35gb@2 2g.35gb@4 1g.35gb@6", nil, ""},
		{"3g + 2×2g", dc("3g.71gb=1", "2g.35gb=2"), "2g.35gb@0 2g.35gb@2 3g.71gb@4", nil, ""},
		{"balanced", dc("1g.18gb=2", "2g.35gb=1", "3g.71gb=1"), "2g.35gb@0 1g.18gb@2 1g.18gb@3 3g.71gb@4", nil, ""},
		{"4g+4g", dc("4g.71gb=2"), "", ErrDoesNotFit, "4g.71gb + 4g.71gb: needs 8 compute slices of 7"},
		{"7g alone", dc("7g.141gb=1"), "7g.141gb@0", nil, ""},
		{"7g + 1g", dc("7g.141gb=1", "1g.18gb=1"), "", ErrDoesNotFit, "7g.141gb + 1g.18gb: needs 8 compute slices of 7"},
		{"7g + 1g.18gb+me", dc("7g.141gb=1", "1g.18gb+me=1"), "", ErrDoesNotFit, "needs 8 compute slices of 7"},
		{"2×+me over max count", dc("1g.18gb+me=2"), "", ErrDoesNotFit, "2 × 1g.18gb+me asked, the GPU offers at most 1"},
		{"+me with 6×1g", dc("1g.18gb+me=1", "1g.18gb=6"), "1g.18gb@0 1g.18gb@1 1g.18gb@2 1g.18gb@3 1g.18gb@4 1g.18gb@5 1g.18gb+me@6", nil, ""},
		{"profile of another model", dc("1g.5gb=7"), "", ErrUnknownProfile, `"1g.5gb" (it offers 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb)`},
		{"unknown attribute", dc("1g.18gb+gfx=1"), "", ErrUnknownProfile, `"1g.18gb+gfx"`},
		{"compute profiles", dc("1c.3g.71gb=1", "3g.71gb=1"), "3g.71gb@0 1c.3g.71gb@4", nil, ""},
		{"compute profile of an unknown GI", dc("1c.3g.40gb=1"), "", ErrUnknownProfile, `"1c.3g.40gb"`},
		{"zero counts ignored", dc("7g.141gb=1", "1g.18gb=0"), "7g.141gb@0", nil, ""},
		{"nothing", nil, "", nil, ""},
		{"negative", dc("1g.18gb=-1"), "", ErrDoesNotFit, "negative count"},
		{"bad name", dc("1x.18gb=1"), "", profiles.ErrBadName, "1x.18gb"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Fit(cat, tc.devices)
			if tc.err != nil || tc.errHas != "" {
				if err == nil {
					t.Fatalf("fits as %s; want error %q", layout(got), tc.errHas)
				}
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %q; want %v containing %q", err, tc.err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if layout(got) != tc.want {
				t.Fatalf("got %s; want %s", layout(got), tc.want)
			}
			checkInstances(t, cat, got)
		})
	}
}

func TestFitCanonicalNames(t *testing.T) {
	// Attributes compare as sets; the result carries the catalogue's names.
	cat := &profiles.Catalogue{MemorySlices: 4, Profiles: []profiles.Profile{
		{Name: "1g.24gb+me,gfx", ID: 3, Slices: 1, MaxCount: 1, Placements: []profiles.Placement{{Start: 0, Size: 1}}},
		{Name: "4g.96gb", ID: 0, Slices: 4, MaxCount: 1, Placements: []profiles.Placement{{Start: 0, Size: 4}}},
	}}
	got, err := Fit(cat, dc("1g.24gb+gfx,me=1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Profile != "1g.24gb+me,gfx" || got[0].ProfileID != 3 || got[0].Size != 1 {
		t.Fatalf("got %+v", got)
	}
}

func TestFitPlacementOnly(t *testing.T) {
	// Counts and slice sums pass, but the placements collide.
	cat := &profiles.Catalogue{MemorySlices: 4, Profiles: []profiles.Profile{
		{Name: "1g.6gb", Slices: 1, MaxCount: 4, Placements: []profiles.Placement{{Start: 0, Size: 1}, {Start: 1, Size: 1}, {Start: 2, Size: 1}, {Start: 3, Size: 1}}},
		{Name: "2g.12gb", Slices: 2, MaxCount: 2, Placements: []profiles.Placement{{Start: 0, Size: 2}, {Start: 2, Size: 2}}},
		{Name: "2g.12gb+me", Index: profiles.Index2SliceRev1, Slices: 2, MaxCount: 1, Placements: []profiles.Placement{{Start: 1, Size: 2}}},
		{Name: "4g.24gb", Slices: 4, MaxCount: 1, Placements: []profiles.Placement{{Start: 0, Size: 4}}},
	}}
	_, err := Fit(cat, dc("2g.12gb+me=1", "2g.12gb=1"))
	want := "2g.12gb+me + 2g.12gb: no placement in 4 memory slices (2g.12gb+me starts at 1; 2g.12gb starts at 0,2)"
	if !errors.Is(err, ErrDoesNotFit) || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v; want %q", err, want)
	}
	got, err := Fit(cat, dc("1g.6gb=2", "2g.12gb+me=1"))
	if err != nil || layout(got) != "1g.6gb@0 2g.12gb+me@1 1g.6gb@3" {
		t.Fatalf("got %s, %v", layout(got), err)
	}
}

func TestValidate(t *testing.T) {
	h := modelGPU(t, "h200", 2)
	plain := GPU{Index: 5, Name: "NVIDIA L40S", PCIDeviceID: 0x26B910DE}
	tests := []struct {
		name   string
		gpu    GPU
		req    Request
		err    error
		errHas string
	}{
		{"ok", h, Request{GPU: 2, MigEnabled: true, Devices: dc("3g.71gb=2")}, nil, ""},
		{"disabled", h, Request{GPU: 2}, nil, ""},
		{"enabled, nothing", h, Request{GPU: 2, MigEnabled: true}, nil, ""},
		{"devices with mig off", h, Request{GPU: 2, Devices: dc("3g.71gb=1")}, nil, "GPU 2 (NVIDIA H200): MIG devices asked with mig-enabled false"},
		{"no MIG", plain, Request{GPU: 5, MigEnabled: true}, ErrNotMigCapable, "GPU 5 (NVIDIA L40S)"},
		{"no MIG, off", plain, Request{GPU: 5}, nil, ""},
		{"other model", h, Request{GPU: 2, MigEnabled: true, Devices: dc("3g.40gb=1")}, ErrUnknownProfile, `GPU 2 (NVIDIA H200): MIG profile not offered by this GPU: "3g.40gb" (it offers 1g.18gb`},
		{"unknown +me", h, Request{GPU: 2, MigEnabled: true, Devices: dc("4g.71gb=1", "4g.71gb+me=1")}, ErrUnknownProfile, "4g.71gb+me"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.gpu, tc.req)
			if tc.errHas == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errHas) || tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("error %v; want %v containing %q", err, tc.err, tc.errHas)
			}
		})
	}
}

// checkInstances checks a solution: catalogue placements, disjoint slices.
func checkInstances(t *testing.T, cat *profiles.Catalogue, in []Instance) {
	t.Helper()
	var used uint64
	for _, x := range in {
		n, err := profiles.Parse(x.Profile)
		if err != nil {
			t.Fatal(err)
		}
		p, ok := cat.ByName(n)
		if !ok || p.Name != x.Profile || p.ID != x.ProfileID {
			t.Fatalf("instance %+v not in catalogue", x)
		}
		found := false
		for _, pl := range p.Placements {
			found = found || pl.Start == x.Start && pl.Size == x.Size
		}
		m := uint64(1<<x.Size-1) << x.Start
		if !found || used&m != 0 {
			t.Fatalf("instance %+v: bad or overlapping placement in %s", x, layout(in))
		}
		used |= m
	}
}

// bruteFits decides feasibility the slow way: every GI tries every
// placement, no ordering, no pruning but overlap.
func bruteFits(cat *profiles.Catalogue, items []*profiles.Profile, used uint64) bool {
	if len(items) == 0 {
		return true
	}
	for _, pl := range items[0].Placements {
		m := uint64(1<<pl.Size-1) << pl.Start
		if used&m == 0 && bruteFits(cat, items[1:], used|m) {
			return true
		}
	}
	return false
}

// randomRequest draws 1 to 5 profiles with counts 1 to 3 from cat.
func randomRequest(r *rand.Rand, cat *profiles.Catalogue) []DeviceCount {
	var out []DeviceCount
	for range 1 + r.IntN(5) {
		p := cat.Profiles[r.IntN(len(cat.Profiles))]
		dup := false
		for _, d := range out {
			dup = dup || d.Profile == p.Name
		}
		if !dup {
			out = append(out, DeviceCount{Profile: p.Name, Count: 1 + r.IntN(3)})
		}
	}
	return out
}

// TestFitMatchesBruteForce compares the solver with brute force on random
// requests for every MIG model.
func TestFitMatchesBruteForce(t *testing.T) {
	for _, m := range migModels() {
		cat := &m.Catalogue
		r := rand.New(rand.NewPCG(1, uint64(m.PCIDeviceID)))
		fits := 0
		for range 3000 {
			req := randomRequest(r, cat)
			var items []*profiles.Profile
			countsOK := true
			for _, d := range req {
				n, _ := profiles.Parse(d.Profile)
				p, _ := cat.ByName(n)
				countsOK = countsOK && d.Count <= p.MaxCount
				for range d.Count {
					items = append(items, p)
				}
			}
			compute := 0
			for _, p := range items {
				compute += p.Slices
			}
			want := countsOK && compute <= ComputeSlices(cat) && bruteFits(cat, items, 0)
			got, err := Fit(cat, req)
			if (err == nil) != want {
				t.Fatalf("%s %v: Fit error %v, brute force fits=%v", m.Key, req, err, want)
			}
			if err == nil {
				fits++
				checkInstances(t, cat, got)
				if len(got) != len(items) {
					t.Fatalf("%s %v: %d instances, want %d", m.Key, req, len(got), len(items))
				}
			}
		}
		if fits == 0 {
			t.Fatalf("%s: no random request fits; the test tests nothing", m.Key)
		}
	}
}

package geometry

import (
	"fmt"
	"slices"
	"strings"

	"github.com/migagent/mig-agent/profiles"
)

// This file gives compute-instance entries ("1c.3g.71gb": 2) the meaning
// NVIDIA's nvidia-mig-parted gives them. Its SetMigConfig
// (pkg/mig/config/config.go) does not create one GPU instance per counted
// device: it flattens the mig-devices map into one entry per compute
// instance (MigConfig.Flatten, pkg/types/mig_config.go), sorted by G
// descending, then C descending, then the joined attributes descending,
// and walks that list creating compute instances. Each entry reuses the GPU
// instance created last when it has the same GPU instance profile and the
// compute instance can still be created in it; otherwise (another profile,
// or CreateComputeInstance fails for want of room) it creates a new GPU
// instance. A GPU instance left behind is never revisited. When an ordering
// fails, iteratePermutationsUntilSuccess (same file) clears the GPU and
// tries the next permutation of the list, in the order its swap recursion
// visits them, until one succeeds.
//
// mig-agent runs the same walk on the catalogue instead of the hardware:
// a compute instance fits in a GPU instance when the compute slices in use
// plus its own stay within the GPU instance's, and fewer than its profile's
// per-GPU-instance maximum are there already (what the driver checks; the
// simulator does the same). A permutation succeeds when every GPU instance
// it opens can be placed beside the others (the exact placement solver,
// where mig-parted's plain CreateGpuInstance leaves the choice to the
// driver). The first permutation that succeeds gives the GPU instances and
// the compute instances inside each.
//
// Where mig-parted's result depends on its own iteration order, mig-agent
// fixes one: Flatten's sort compares only G, C and the positive
// attributes, so entries that differ in memory or negative attributes
// only ("1c.2g.48gb" and "1c.2g.48gb-me") come out in Go map order, which
// changes from run to run; mig-agent keeps entries of one GPU instance
// profile together (more memory first, then the name), the order that
// packs them into the fewest GPU instances. Spellings of one profile
// ("1g.10gb" and "1c.1g.10gb", "+me,gfx" and "+gfx,me") are one entry.

// ciReq is one compute-instance profile a request asks for.
type ciReq struct {
	prof   *profiles.Profile // the GPU instance profile that holds it
	order  int               // position of prof in the catalogue
	name   string            // canonical name; the GI name for a full compute instance
	n      profiles.Name
	slices int // compute slices (the "c")
	max    int // at most this many in one GPU instance
	count  int
}

// giPack is one GPU instance of a walk and what it holds.
type giPack struct {
	prof  *profiles.Profile
	order int
	cis   []*ciReq
	used  int
}

// fits tells whether compute instance c can still be created in g: the
// same GPU instance profile, room in its compute slices, and fewer than
// c's per-GPU-instance maximum there already.
func (g *giPack) fits(c *ciReq) bool {
	if g.prof != c.prof || g.used+c.slices > g.prof.Slices {
		return false
	}
	n := 0
	for _, x := range g.cis {
		if x == c {
			n++
		}
	}
	return n < c.max
}

// lessFlatten is the order of MigConfig.Flatten, with mig-agent's rule for
// its ties (see above).
func lessFlatten(a, b *ciReq) bool {
	if a.n.G != b.n.G {
		return a.n.G > b.n.G
	}
	if a.n.C != b.n.C {
		return a.n.C > b.n.C
	}
	if x, y := strings.Join(a.n.Attrs, ","), strings.Join(b.n.Attrs, ","); x != y {
		return x > y
	}
	if a.prof != b.prof {
		if a.n.GB != b.n.GB {
			return a.n.GB > b.n.GB
		}
		return canonical(a.prof.Name) < canonical(b.prof.Name)
	}
	return a.name < b.name
}

// walk is SetMigConfig's loop over one ordering: reuse the last GPU
// instance while the next compute instance fits in it, else open a new one.
func walk(mps []*ciReq) []*giPack {
	var out []*giPack
	var last *giPack
	for _, c := range mps {
		if last == nil || !last.fits(c) {
			last = &giPack{prof: c.prof, order: c.order}
			out = append(out, last)
		}
		last.cis = append(last.cis, c)
		last.used += c.slices
	}
	return out
}

// permutations calls try with each distinct ordering of mps in the order
// iteratePermutationsUntilSuccess visits them (swap recursion, an entry
// not swapped into a position an identical entry already held), until try
// returns true.
func permutations(mps []*ciReq, try func([]*ciReq) bool) bool {
	var rec func(i int) bool
	rec = func(i int) bool {
		if i >= len(mps) {
			return try(mps)
		}
		for j := i; j < len(mps); j++ {
			if slices.Contains(mps[i:j], mps[j]) {
				continue
			}
			mps[i], mps[j] = mps[j], mps[i]
			if rec(i + 1) {
				return true
			}
			mps[i], mps[j] = mps[j], mps[i]
		}
		return false
	}
	return rec(0)
}

// ciRequests resolves devices against the catalogue, merging spellings of
// one profile, in the order of MigConfig.Flatten.
func ciRequests(cat *profiles.Catalogue, devices []DeviceCount) ([]*ciReq, error) {
	catNames := make([]profiles.Name, len(cat.Profiles))
	for i := range cat.Profiles {
		catNames[i], _ = profiles.Parse(cat.Profiles[i].Name)
	}
	var out []*ciReq
	for _, d := range devices {
		if d.Count < 0 {
			return nil, fmt.Errorf("%w: negative count %d of %q", ErrDoesNotFit, d.Count, d.Profile)
		}
		if d.Count == 0 {
			continue
		}
		n, err := profiles.Parse(d.Profile)
		if err != nil {
			return nil, err
		}
		at := slices.IndexFunc(catNames, func(c profiles.Name) bool { return c.G > 0 && c.Equal(n.GI()) })
		if at < 0 {
			return nil, fmt.Errorf("%w: %q (it offers %s)", ErrUnknownProfile, d.Profile, cat.Names())
		}
		prof := &cat.Profiles[at]
		name, slicesC, maxC := canonical(prof.Name), prof.Slices, 1
		if n.IsCompute() {
			if name, err = computeName(prof, n); err != nil {
				return nil, err
			}
			slicesC, maxC = n.C, prof.Slices/n.C
			if cp, ok := prof.Compute(n); ok && cp.MaxCount > 0 {
				maxC = cp.MaxCount
			}
		}
		if i := slices.IndexFunc(out, func(c *ciReq) bool { return c.name == name }); i >= 0 {
			out[i].count += d.Count
			continue
		}
		cn, _ := profiles.Parse(name)
		slices.Sort(cn.Attrs)
		out = append(out, &ciReq{prof: prof, order: at, name: name, n: cn, slices: slicesC, max: maxC, count: d.Count})
	}
	slices.SortStableFunc(out, func(a, b *ciReq) int {
		switch {
		case lessFlatten(a, b):
			return -1
		case lessFlatten(b, a):
			return 1
		}
		return 0
	})
	return out, nil
}

// pack gives the GPU instances a request asks for on a GPU with catalogue
// cat, each with the compute instances it holds, as nvidia-mig-parted's
// apply walk forms them (see the comment at the top of this file); Fit
// places them.
func pack(cat *profiles.Catalogue, devices []DeviceCount) ([]*group, error) {
	reqs, err := ciRequests(cat, devices)
	if err != nil {
		return nil, err
	}
	slots := memorySlices(cat)
	if slots <= 0 || slots > 64 {
		return nil, fmt.Errorf("%w: the GPU reports %d memory slices", ErrDoesNotFit, slots)
	}
	// Each compute instance needs a compute slice of its own: more than the
	// GPU has can never be packed, whatever the order (this also bounds the
	// permutations below to those of at most 8 entries).
	compute, total, shared := 0, ComputeSlices(cat), false
	var mps []*ciReq
	for _, c := range reqs {
		compute += c.count * c.slices
		shared = shared || c.slices < c.prof.Slices
		for range c.count {
			mps = append(mps, c)
		}
	}
	if compute > total {
		return nil, fmt.Errorf("%w: %s: needs %d compute slices of %d", ErrDoesNotFit, listCIs(reqs), compute, total)
	}
	// Each GPU instance profile asked for needs one GPU instance at least,
	// whatever the order: a bound that spares a hopeless permutation search.
	seen, least := map[*profiles.Profile]bool{}, 0
	for _, c := range reqs {
		if !seen[c.prof] {
			seen[c.prof] = true
			least += c.prof.Slices
		}
	}
	if least > total {
		return nil, fmt.Errorf("%w: %s: needs GPU instances of %d compute slices of %d", ErrDoesNotFit, listCIs(reqs), least, total)
	}
	var first error
	var found []*group
	tried := map[string]bool{}
	try := func(order []*ciReq) bool {
		gs := groupsOf(walk(order))
		key := signature(gs)
		if tried[key] {
			return false
		}
		tried[key] = true
		if err := checkGroups(cat, gs); err != nil {
			if first == nil {
				first = err
			}
			return false
		}
		if _, err := solve(cat, gs, false); err != nil {
			if first == nil {
				first = err
			}
			return false
		}
		found = gs
		return true
	}
	if !shared {
		try(mps) // one GPU instance per entry, whatever the order
	} else {
		permutations(mps, try)
	}
	if found == nil {
		return nil, first
	}
	return found, nil
}

// groupsOf merges identical GPU instances (same profile, same compute
// instances) of a walk into groups, most constrained first.
func groupsOf(gis []*giPack) []*group {
	var gs []*group
	for _, gi := range gis {
		cis := make([]string, len(gi.cis))
		for i, c := range gi.cis {
			cis[i] = c.name
		}
		slices.SortFunc(cis, compareCI)
		key := strings.Join(cis, "+")
		if i := slices.IndexFunc(gs, func(g *group) bool { return g.prof == gi.prof && g.key == key }); i >= 0 {
			gs[i].count++
			continue
		}
		gs = append(gs, &group{prof: gi.prof, order: gi.order, cis: cis, key: key, count: 1})
	}
	sortGroups(gs)
	return gs
}

// compareCI orders compute instance names inside a GPU instance: larger
// first (the order Flatten creates them in), then by name.
func compareCI(a, b string) int {
	na, ea := profiles.Parse(a)
	nb, eb := profiles.Parse(b)
	if ea == nil && eb == nil && na.C != nb.C {
		return nb.C - na.C
	}
	return strings.Compare(a, b)
}

// signature identifies the GPU instances of a walk whatever their order:
// an ordering that forms the same ones as one tried already is not checked
// again.
func signature(gs []*group) string {
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = fmt.Sprintf("%d×%s[%s]", g.count, g.prof.Name, g.key)
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// checkGroups checks counts and slice sums of the GPU instances of gs.
func checkGroups(cat *profiles.Catalogue, gs []*group) error {
	slots := memorySlices(cat)
	perProfile := map[*profiles.Profile]int{}
	var compute, memory int
	for _, g := range gs {
		if len(g.prof.Placements) == 0 {
			return fmt.Errorf("%w: %s has no placement on this GPU", ErrDoesNotFit, g.prof.Name)
		}
		for _, pl := range g.prof.Placements {
			if pl.Start < 0 || pl.Size <= 0 || pl.End() > slots {
				return fmt.Errorf("%w: %s has placement %s outside %d memory slices", ErrDoesNotFit, g.prof.Name, pl, slots)
			}
		}
		compute += g.count * g.prof.Slices
		memory += g.count * minSize(g.prof)
		perProfile[g.prof] += g.count
	}
	if total := ComputeSlices(cat); compute > total {
		return fmt.Errorf("%w: %s: needs %d compute slices of %d", ErrDoesNotFit, listGroups(gs), compute, total)
	}
	if memory > slots {
		return fmt.Errorf("%w: %s: needs %d memory slices of %d", ErrDoesNotFit, listGroups(gs), memory, slots)
	}
	for _, g := range gs {
		if c := perProfile[g.prof]; c > g.prof.MaxCount {
			return fmt.Errorf("%w: %d × %s asked, the GPU offers at most %d", ErrDoesNotFit, c, g.prof.Name, g.prof.MaxCount)
		}
	}
	return nil
}

// listCIs prints compute instances asked for: "8 × 1c.7g.141gb".
func listCIs(reqs []*ciReq) string {
	var parts []string
	for _, c := range reqs {
		if c.count > 2 {
			parts = append(parts, fmt.Sprintf("%d × %s", c.count, c.name))
			continue
		}
		for range c.count {
			parts = append(parts, c.name)
		}
	}
	return strings.Join(parts, " + ")
}

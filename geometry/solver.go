package geometry

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/migagent/mig-agent/profiles"
)

// Errors of Fit and Validate.
var (
	// ErrUnknownProfile: a profile the GPU does not offer (a profile of
	// another GPU model, or a misspelt one).
	ErrUnknownProfile = errors.New("MIG profile not offered by this GPU")
	// ErrDoesNotFit: the profiles are offered but cannot all be placed.
	ErrDoesNotFit = errors.New("MIG devices do not fit on this GPU")
)

// searchBudget bounds the placement search; real catalogues need a few
// hundred steps at most.
const searchBudget = 1 << 20

// group is one distinct (GPU instance profile, compute profile) of a request.
type group struct {
	prof    *profiles.Profile
	order   int    // position in the catalogue
	compute string // canonical compute profile name; "" for the full GPU instance
	count   int
	masks   []uint64 // memory slices of each placement
	keep    []bool   // per placement: an existing instance there would be kept
}

func (g *group) label() string {
	if g.compute != "" {
		return g.compute
	}
	return g.prof.Name
}

// ComputeSlices is the number of compute slices of a GPU: those of its
// largest profile (7 on A100, H100, H200, B200; 4 on A30).
func ComputeSlices(cat *profiles.Catalogue) int {
	n := 0
	for _, p := range cat.Profiles {
		n = max(n, p.Slices)
	}
	return n
}

// memorySlices is the size of the placement space.
func memorySlices(cat *profiles.Catalogue) int {
	if cat.MemorySlices > 0 {
		return cat.MemorySlices
	}
	n := 0
	for _, p := range cat.Profiles {
		for _, pl := range p.Placements {
			n = max(n, pl.End())
		}
	}
	return n
}

// Fit places devices on a GPU with catalogue cat, or says why it cannot.
//
// Each device is named by a GPU instance profile ("3g.71gb", "1g.18gb+me")
// or a compute instance profile ("1c.3g.71gb"); as in nvidia-mig-parted,
// each counted device is one GPU instance of that GPU instance profile
// holding one compute instance of the named compute profile (the full
// compute instance for a GPU instance profile). Names match the catalogue
// with attributes compared as sets. Counts are checked against each
// profile's MaxCount, the compute and memory slices against the GPU's,
// then an exact backtracking search gives every GPU instance one of its
// profile's placements, pairwise disjoint, most constrained profile first.
// The result is deterministic (lowest placements first) and sorted by start.
func Fit(cat *profiles.Catalogue, devices []DeviceCount) ([]Instance, error) {
	gs, err := groups(cat, devices)
	if err != nil {
		return nil, err
	}
	return solve(cat, gs, false)
}

// groups checks devices against the catalogue and returns them grouped,
// most constrained first.
func groups(cat *profiles.Catalogue, devices []DeviceCount) ([]*group, error) {
	slots := memorySlices(cat)
	if slots <= 0 || slots > 64 {
		return nil, fmt.Errorf("%w: the GPU reports %d memory slices", ErrDoesNotFit, slots)
	}
	var gs []*group
	perProfile := map[*profiles.Profile]int{}
	catNames := make([]profiles.Name, len(cat.Profiles))
	for i := range cat.Profiles {
		catNames[i], _ = profiles.Parse(cat.Profiles[i].Name)
	}
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
		// cat.ByName, with the catalogue's names parsed once.
		at := slices.IndexFunc(catNames, func(c profiles.Name) bool { return c.G > 0 && c.Equal(n.GI()) })
		if at < 0 {
			return nil, fmt.Errorf("%w: %q (it offers %s)", ErrUnknownProfile, d.Profile, cat.Names())
		}
		prof := &cat.Profiles[at]
		compute := ""
		if n.IsCompute() {
			if compute, err = computeName(prof, n); err != nil {
				return nil, err
			}
		}
		i := slices.IndexFunc(gs, func(g *group) bool { return g.prof == prof && g.compute == compute })
		if i < 0 {
			g := &group{prof: prof, order: at, compute: compute}
			for _, pl := range prof.Placements {
				if pl.Start < 0 || pl.Size <= 0 || pl.End() > slots {
					return nil, fmt.Errorf("%w: %s has placement %s outside %d memory slices", ErrDoesNotFit, prof.Name, pl, slots)
				}
				g.masks = append(g.masks, (1<<pl.Size-1)<<pl.Start)
			}
			gs = append(gs, g)
			i = len(gs) - 1
		}
		gs[i].count += d.Count
		perProfile[prof] += d.Count
	}
	var compute, memory int
	for _, g := range gs {
		if len(g.prof.Placements) == 0 {
			return nil, fmt.Errorf("%w: %s has no placement on this GPU", ErrDoesNotFit, g.prof.Name)
		}
		compute += g.count * g.prof.Slices
		memory += g.count * minSize(g.prof)
	}
	if total := ComputeSlices(cat); compute > total {
		return nil, fmt.Errorf("%w: %s: needs %d compute slices of %d", ErrDoesNotFit, listGroups(gs), compute, total)
	}
	if memory > slots {
		return nil, fmt.Errorf("%w: %s: needs %d memory slices of %d", ErrDoesNotFit, listGroups(gs), memory, slots)
	}
	for _, g := range gs {
		if c := perProfile[g.prof]; c > g.prof.MaxCount {
			return nil, fmt.Errorf("%w: %d × %s asked, the GPU offers at most %d", ErrDoesNotFit, c, g.prof.Name, g.prof.MaxCount)
		}
	}
	sort.SliceStable(gs, func(a, b int) bool {
		ga, gb := gs[a], gs[b]
		if la, lb := len(ga.prof.Placements), len(gb.prof.Placements); la != lb {
			return la < lb
		}
		if sa, sb := minSize(ga.prof), minSize(gb.prof); sa != sb {
			return sa > sb
		}
		if ga.order != gb.order {
			return ga.order < gb.order
		}
		return ga.compute < gb.compute
	})
	return gs, nil
}

// computeName checks that GPU instance profile prof offers compute profile
// n and returns its canonical name. Without a compute profile list (NVML
// lists them only once a GPU instance exists) any C below G is accepted
// and the driver has the last word.
func computeName(prof *profiles.Profile, n profiles.Name) (string, error) {
	if len(prof.ComputeProfiles) > 0 {
		cp, ok := prof.Compute(n)
		if !ok {
			return "", fmt.Errorf("%w: compute profile %q inside %s", ErrUnknownProfile, n.String(), prof.Name)
		}
		return canonical(cp.Name), nil
	}
	gi, err := profiles.Parse(prof.Name)
	if err != nil {
		return "", fmt.Errorf("%w: catalogue profile %q: %w", ErrUnknownProfile, prof.Name, err)
	}
	gi.C = n.C
	return canonical(gi.String()), nil
}

func minSize(p *profiles.Profile) int {
	s := 64
	for _, pl := range p.Placements {
		s = min(s, pl.Size)
	}
	return s
}

// listGroups prints the GPU instances asked for: "4g.71gb + 4g.71gb",
// "7 × 1g.18gb + 3g.71gb".
func listGroups(gs []*group) string {
	var parts []string
	for _, g := range gs {
		if g.count > 2 {
			parts = append(parts, fmt.Sprintf("%d × %s", g.count, g.label()))
			continue
		}
		for range g.count {
			parts = append(parts, g.label())
		}
	}
	return strings.Join(parts, " + ")
}

// solve runs the placement search over gs. With maximize, it returns the
// placement keeping the most instances marked in group.keep (ties: the
// first found, lowest placements first); otherwise the first placement found.
func solve(cat *profiles.Catalogue, gs []*group, maximize bool) ([]Instance, error) {
	var items []*group
	for _, g := range gs {
		for range g.count {
			items = append(items, g)
		}
	}
	s := searcher{items: items, place: make([]int, len(items)), maximize: maximize}
	s.run(0, 0, 0)
	if s.steps > searchBudget {
		return nil, fmt.Errorf("%w: %s: placement search too large", ErrDoesNotFit, listGroups(gs))
	}
	if s.best == nil {
		return nil, noPlacement(cat, gs)
	}
	out := make([]Instance, len(items))
	for k, g := range items {
		pl := g.prof.Placements[s.best[k]]
		out[k] = Instance{Profile: g.prof.Name, ProfileID: g.prof.ID, Start: pl.Start, Size: pl.Size, Compute: g.compute}
	}
	sortInstances(out)
	return out, nil
}

type searcher struct {
	items     []*group
	place     []int // placement index per item, while searching
	best      []int
	bestScore int
	steps     int
	maximize  bool
}

func (s *searcher) run(k int, used uint64, score int) {
	if s.steps++; s.steps > searchBudget {
		return
	}
	if k == len(s.items) {
		if s.best == nil || score > s.bestScore {
			s.best, s.bestScore = slices.Clone(s.place), score
		}
		return
	}
	if s.best != nil && (!s.maximize || score+len(s.items)-k <= s.bestScore) {
		return
	}
	g, from := s.items[k], 0
	if k > 0 && s.items[k-1] == g {
		from = s.place[k-1] + 1 // identical instances: increasing placements only
	}
	for pi := from; pi < len(g.masks); pi++ {
		if used&g.masks[pi] != 0 {
			continue
		}
		s.place[k] = pi
		gain := 0
		if g.keep != nil && g.keep[pi] {
			gain = 1
		}
		s.run(k+1, used|g.masks[pi], score+gain)
	}
}

func noPlacement(cat *profiles.Catalogue, gs []*group) error {
	var offers []string
	for _, g := range gs {
		starts := make([]string, len(g.prof.Placements))
		for i, pl := range g.prof.Placements {
			starts[i] = fmt.Sprint(pl.Start)
		}
		offers = append(offers, fmt.Sprintf("%s starts at %s", g.prof.Name, strings.Join(starts, ",")))
	}
	return fmt.Errorf("%w: %s: no placement in %d memory slices (%s)",
		ErrDoesNotFit, listGroups(gs), memorySlices(cat), strings.Join(offers, "; "))
}

func sortInstances(in []Instance) {
	sort.SliceStable(in, func(a, b int) bool {
		if in[a].Start != in[b].Start {
			return in[a].Start < in[b].Start
		}
		return in[a].Profile < in[b].Profile
	})
}

// canonical prints a profile name in one spelling per profile (attributes
// sorted), so names compare as strings; unparseable names stay as they are.
func canonical(s string) string {
	if s == "" {
		return s
	}
	n, err := profiles.Parse(s)
	if err != nil {
		return s
	}
	slices.Sort(n.Attrs) // Parse returns fresh slices
	slices.Sort(n.NegAttrs)
	return n.String()
}

// Validate checks req against gpu: MIG devices only with mig-enabled true
// and only on a MIG-capable GPU, and Fit on the GPU's catalogue. Errors
// name the GPU.
func Validate(gpu GPU, req Request) error {
	_, err := place(&gpu, &req, nil)
	return err
}

// place validates req on gpu and solves its placement; with existing, it
// keeps the most of those instances in place.
func place(gpu *GPU, req *Request, existing map[instKey]bool) ([]Instance, error) {
	who := fmt.Sprintf("GPU %d (%s)", gpu.Index, gpu.Name)
	asked := slices.ContainsFunc(req.Devices, func(d DeviceCount) bool { return d.Count != 0 })
	if !req.MigEnabled {
		if asked {
			return nil, fmt.Errorf("%s: MIG devices asked with mig-enabled false", who)
		}
		return nil, nil
	}
	if !gpu.MigCapable {
		return nil, fmt.Errorf("%s: %w (%s)", who, ErrNotMigCapable, pciID(gpu.PCIDeviceID))
	}
	gs, err := groups(&gpu.Catalogue, req.Devices)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	if existing != nil {
		for _, g := range gs {
			g.keep = make([]bool, len(g.prof.Placements))
			name := canonical(g.prof.Name)
			for i, pl := range g.prof.Placements {
				g.keep[i] = existing[instKey{name, pl.Start, g.compute}]
			}
		}
	}
	out, err := solve(&gpu.Catalogue, gs, existing != nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	return out, nil
}

// instKey identifies a GPU instance for keeping: GI profile, start and
// compute profile ("" for the full compute instance), names canonical.
type instKey struct {
	profile string
	start   int
	compute string
}

func keyOf(in Instance) instKey {
	c := ""
	if in.Compute != "" {
		if n, err := profiles.Parse(in.Compute); err != nil || n.IsCompute() {
			c = canonical(in.Compute)
		}
	}
	return instKey{canonical(in.Profile), in.Start, c}
}

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

// group is one distinct GPU instance of a request: its profile and the
// compute instances it holds, with how many such GPU instances are asked.
type group struct {
	prof  *profiles.Profile
	order int      // position in the catalogue
	cis   []string // canonical compute instance names, largest first; the GI name for a full one
	key   string   // cis joined with "+"
	count int
	masks []uint64 // memory slices of each placement
	gain  []int    // per placement: what putting one there keeps of the existing geometry
}

// label names the GPU instance in messages: "3g.71gb", "1c.3g.71gb",
// "3g.71gb{2c.3g.71gb+1c.3g.71gb}".
func (g *group) label() string {
	if len(g.cis) == 1 {
		return Instance{Profile: g.prof.Name, Compute: g.cis}.Name()
	}
	return g.prof.Name + "{" + Instance{Profile: g.prof.Name, Compute: g.cis}.Name() + "}"
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
// or a compute instance profile ("1c.3g.71gb"). As in nvidia-mig-parted, a
// count is a number of compute instances: a GPU instance profile asks for
// GPU instances holding one full compute instance each, and compute
// instance profiles of one GPU instance profile share GPU instances the
// way mig-parted's apply walk packs them (see pack.go): "1c.3g.71gb": 2 is
// one 3g.71gb GPU instance holding two 1-slice compute instances. Names
// match the catalogue with attributes compared as sets. Counts are checked
// against each profile's MaxCount, the compute and memory slices against
// the GPU's, then an exact backtracking search gives every GPU instance one
// of its profile's placements, pairwise disjoint, most constrained profile
// first. The result is deterministic (lowest placements first) and sorted
// by start.
func Fit(cat *profiles.Catalogue, devices []DeviceCount) ([]Instance, error) {
	gs, err := pack(cat, devices)
	if err != nil {
		return nil, err
	}
	return solve(cat, gs, false)
}

// sortGroups orders groups most constrained first (stable).
func sortGroups(gs []*group) {
	sort.SliceStable(gs, func(a, b int) bool {
		ga, gb := gs[a], gs[b]
		if la, lb := len(ga.prof.Placements), len(gb.prof.Placements); la != lb {
			return la < lb
		}
		if sa, sb := minSize(ga.prof), minSize(gb.prof); sa != sb {
			return sa > sb
		}
		return ga.order < gb.order // then the walk's order: the first created, the lowest placement
	})
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
		if g.masks == nil {
			for _, pl := range g.prof.Placements {
				g.masks = append(g.masks, (1<<pl.Size-1)<<pl.Start)
			}
		}
		for range g.count {
			items = append(items, g)
		}
	}
	// bound[k]: the most items k.. can still gain, for pruning.
	bound := make([]int, len(items)+1)
	for k := len(items) - 1; k >= 0; k-- {
		bound[k] = bound[k+1]
		if maximize {
			bound[k] += slices.Max(append([]int{0}, items[k].gain...))
		}
	}
	s := searcher{items: items, place: make([]int, len(items)), maximize: maximize, bound: bound}
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
		out[k] = Instance{Profile: g.prof.Name, ProfileID: g.prof.ID, Start: pl.Start, Size: pl.Size, Compute: slices.Clone(g.cis)}
	}
	sortInstances(out)
	return out, nil
}

type searcher struct {
	items     []*group
	place     []int // placement index per item, while searching
	bound     []int
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
	if s.best != nil && (!s.maximize || score+s.bound[k] <= s.bestScore) {
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
		if g.gain != nil {
			gain = g.gain[pi]
		}
		s.run(k+1, used|g.masks[pi], score+gain)
	}
}

func noPlacement(cat *profiles.Catalogue, gs []*group) error {
	var offers []string
	seen := map[*profiles.Profile]bool{}
	for _, g := range gs {
		if seen[g.prof] {
			continue
		}
		seen[g.prof] = true
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

// place validates req on gpu and solves its placement; with existing (the
// compute instances of each GPU instance there now), it keeps the most of
// them: first the most compute instances (each one kept is a MIG device
// whose pods keep running), then the most GPU instances.
func place(gpu *GPU, req *Request, existing map[giKey][]string) ([]Instance, error) {
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
	gs, err := pack(&gpu.Catalogue, req.Devices)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	if existing != nil {
		for _, g := range gs {
			g.gain = make([]int, len(g.prof.Placements))
			name := canonical(g.prof.Name)
			for i, pl := range g.prof.Placements {
				if have, ok := existing[giKey{name, pl.Start}]; ok {
					g.gain[i] = 1 + keepWeight*len(common(have, g.cis))
				}
			}
		}
	}
	out, err := solve(&gpu.Catalogue, gs, existing != nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	return out, nil
}

// keepWeight makes one kept compute instance worth more than every GPU
// instance of a GPU kept (at most 8).
const keepWeight = 16

// giKey identifies a GPU instance: GI profile (canonical name) and start.
type giKey struct {
	profile string
	start   int
}

// computeOf lists the compute instances of in, canonical names largest
// first; an instance built without them holds one full compute instance.
func computeOf(in Instance) []string {
	if in.Compute == nil {
		return []string{canonical(in.Profile)}
	}
	out := make([]string, len(in.Compute))
	for i, c := range in.Compute {
		out[i] = canonical(c)
	}
	slices.SortFunc(out, compareCI)
	return out
}

// common is the multiset intersection of a and b.
func common(a, b []string) []string {
	left := slices.Clone(b)
	var out []string
	for _, x := range a {
		if i := slices.Index(left, x); i >= 0 {
			out = append(out, x)
			left = slices.Delete(left, i, i+1)
		}
	}
	return out
}

// minus is the multiset difference a − b.
func minus(a, b []string) []string {
	left := slices.Clone(a)
	for _, x := range b {
		if i := slices.Index(left, x); i >= 0 {
			left = slices.Delete(left, i, i+1)
		}
	}
	return left
}

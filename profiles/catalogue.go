package profiles

import (
	"fmt"
	"strings"
)

// NVML GPU instance profile indices (nvmlGpuInstanceProfile constants); the
// index is portable across GPU families, the profile ID is not.
const (
	Index1Slice      = 0
	Index2Slice      = 1
	Index3Slice      = 2
	Index4Slice      = 3
	Index7Slice      = 4
	Index8Slice      = 5
	Index6Slice      = 6
	Index1SliceRev1  = 7 // +me
	Index2SliceRev1  = 8 // +me
	Index1SliceRev2  = 9 // 1 compute slice, 2 memory slices
	Index1SliceGfx   = 10
	Index2SliceGfx   = 11
	Index4SliceGfx   = 12
	Index1SliceNoME  = 13
	Index2SliceNoME  = 14
	Index1SliceAllME = 15
	Index2SliceAllME = 16
	Index3SliceGfx   = 17
)

// Architecture names as mig-agent reports them.
const (
	ArchAmpere    = "ampere"
	ArchHopper    = "hopper"
	ArchBlackwell = "blackwell"
	ArchAda       = "ada"
)

// Placement is where a GPU instance sits: the first memory slice it
// occupies and how many it occupies (nvmlGpuInstancePlacement_t).
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// End is one past the last memory slice of p.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps reports whether p and q share a memory slice.
func (p Placement) Overlaps(q Placement) bool { return p.Start < q.End() && q.Start < p.End() }

func (p Placement) String() string { return fmt.Sprintf("%d:%d", p.Start, p.Size) }

// ComputeProfile is a compute instance profile offered inside a GPU
// instance profile.
type ComputeProfile struct {
	Name  string `json:"name"`  // "1c.3g.40gb"; equal to the GI name for the full CI
	Index int    `json:"index"` // NVML compute instance profile index: what mig-agent creates by
	// ID is NVML's info.id. NVML lists compute profiles only through an
	// existing GPU instance, so discovery cannot read it beforehand: the
	// catalogue's is the one public captures show (equal to the index),
	// and creation reads the real one from NVML, never this field.
	ID       int `json:"id"`
	Slices   int `json:"slices"`
	MaxCount int `json:"maxCount"` // per GPU instance
}

// Profile is one GPU instance profile as a GPU offers it.
type Profile struct {
	Name            string           `json:"name"` // computed with MemoryGB, never read from NVML
	ID              int              `json:"id"`   // nvml info.Id: family specific
	Index           int              `json:"index"`
	Slices          int              `json:"slices"` // compute slices (the "g")
	MemoryMiB       uint64           `json:"memoryMiB"`
	MaxCount        int              `json:"maxCount"`
	Multiprocessors int              `json:"multiprocessors,omitempty"`
	CopyEngines     int              `json:"copyEngines,omitempty"`
	Decoders        int              `json:"decoders,omitempty"`
	Encoders        int              `json:"encoders,omitempty"`
	JPEGs           int              `json:"jpegs,omitempty"`
	OFAs            int              `json:"ofas,omitempty"`
	Placements      []Placement      `json:"placements"`
	ComputeProfiles []ComputeProfile `json:"computeProfiles,omitempty"`
}

// Catalogue is everything one GPU offers for MIG.
type Catalogue struct {
	// MemorySlices is the number of memory slices (8 on A100/H100/H200/B200,
	// 4 on A30): the size of the placement space.
	MemorySlices int       `json:"memorySlices"`
	Profiles     []Profile `json:"profiles"`
}

// ByName finds the GPU instance profile named n (attributes compared as sets).
func (c *Catalogue) ByName(n Name) (*Profile, bool) {
	gi := n.GI()
	for i := range c.Profiles {
		pn, err := Parse(c.Profiles[i].Name)
		if err == nil && pn.Equal(gi) {
			return &c.Profiles[i], true
		}
	}
	return nil, false
}

// ByID finds the GPU instance profile with NVML profile id.
func (c *Catalogue) ByID(id int) (*Profile, bool) {
	for i := range c.Profiles {
		if c.Profiles[i].ID == id {
			return &c.Profiles[i], true
		}
	}
	return nil, false
}

// ByIndex finds the GPU instance profile with NVML profile index.
func (c *Catalogue) ByIndex(idx int) (*Profile, bool) {
	for i := range c.Profiles {
		if c.Profiles[i].Index == idx {
			return &c.Profiles[i], true
		}
	}
	return nil, false
}

// Compute finds the compute profile named n inside GPU instance profile p.
// For a GPU instance name (C == G) it is the full compute profile.
func (p *Profile) Compute(n Name) (*ComputeProfile, bool) {
	for i := range p.ComputeProfiles {
		if p.ComputeProfiles[i].Slices == n.C {
			return &p.ComputeProfiles[i], true
		}
	}
	return nil, false
}

// Names lists the catalogue's GPU instance profile names, in catalogue order.
func (c *Catalogue) Names() string {
	names := make([]string, len(c.Profiles))
	for i, p := range c.Profiles {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// AttrsForIndex returns the name attributes NVIDIA derives from a GPU
// instance profile index (go-nvlib NewMigProfile): +me, +me.all, +gfx, -me.
func AttrsForIndex(index int) (attrs, neg []string) {
	switch index {
	case Index1SliceRev1, Index2SliceRev1:
		return []string{AttrMediaExtensions}, nil
	case Index1SliceAllME, Index2SliceAllME:
		return []string{AttrMediaExtensionsAll}, nil
	case Index1SliceGfx, Index2SliceGfx, Index4SliceGfx, Index3SliceGfx:
		return []string{AttrGraphics}, nil
	case Index1SliceNoME, Index2SliceNoME:
		return nil, []string{AttrMediaExtensions}
	}
	return nil, nil
}

// SlicesForIndex is the number of compute slices of a profile index, 0 if unknown.
func SlicesForIndex(index int) int {
	switch index {
	case Index1Slice, Index1SliceRev1, Index1SliceRev2, Index1SliceGfx, Index1SliceNoME, Index1SliceAllME:
		return 1
	case Index2Slice, Index2SliceRev1, Index2SliceGfx, Index2SliceNoME, Index2SliceAllME:
		return 2
	case Index3Slice, Index3SliceGfx:
		return 3
	case Index4Slice, Index4SliceGfx:
		return 4
	case Index6Slice:
		return 6
	case Index7Slice:
		return 7
	case Index8Slice:
		return 8
	}
	return 0
}

// ProfileName builds the canonical name of a GPU instance profile from its
// index, memory and the GPU's total memory in bytes.
func ProfileName(index int, memoryMiB, totalBytes uint64) string {
	g := SlicesForIndex(index)
	attrs, neg := AttrsForIndex(index)
	return Name{C: g, G: g, GB: MemoryGB(memoryMiB, totalBytes), Attrs: attrs, NegAttrs: neg}.String()
}

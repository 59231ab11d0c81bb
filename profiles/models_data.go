package profiles

func pl(size int, starts ...int) []Placement {
	out := make([]Placement, len(starts))
	for i, s := range starts {
		out[i] = Placement{Start: s, Size: size}
	}
	return out
}

// NVML compute instance profile indices (nvmlComputeInstanceProfile
// constants). The simulator uses the index as the compute profile id, as
// NVML does for the profiles it reports.
const (
	ciIndex1Slice = 0
	ciIndex2Slice = 1
	ciIndex3Slice = 2
	ciIndex4Slice = 3
	ciIndex7Slice = 4
	ciIndex8Slice = 5
	ciIndex6Slice = 6
)

// ciIndexForSlices maps a compute instance's slice count to its NVML
// compute instance profile index, -1 if NVML has none.
func ciIndexForSlices(s int) int {
	switch s {
	case 1:
		return ciIndex1Slice
	case 2:
		return ciIndex2Slice
	case 3:
		return ciIndex3Slice
	case 4:
		return ciIndex4Slice
	case 7:
		return ciIndex7Slice
	case 8:
		return ciIndex8Slice
	case 6:
		return ciIndex6Slice
	}
	return -1
}

// ciSlicesOffered lists the compute instance sizes NVIDIA offers inside a
// GPU instance of g compute slices (MIG user guide, "Compute instance
// profiles"; go-nvml's A100 mock): a 4g instance offers 1c, 2c and 4c, no 3c.
func ciSlicesOffered(g int) []int {
	switch g {
	case 1:
		return []int{1}
	case 2:
		return []int{1, 2}
	case 3:
		return []int{1, 2, 3}
	case 4:
		return []int{1, 2, 4}
	case 7:
		return []int{1, 2, 3, 4, 7}
	}
	return []int{1, g}
}

// StandardComputeProfiles is NVIDIA's set of compute instance profiles
// inside a GPU instance profile named gi: for a GI of g slices, one per
// offered size s with MaxCount g/s, named "<s>c.<gi>" ("1c.3g.71gb"), the
// full one named like the GI itself; the id is NVML's profile index. NVML
// lists compute profiles only through an existing GPU instance, so the
// catalogue and the real backend both take them from here.
func StandardComputeProfiles(gi Name) []ComputeProfile {
	var cps []ComputeProfile
	for _, s := range ciSlicesOffered(gi.G) {
		idx := ciIndexForSlices(s)
		if idx < 0 {
			continue
		}
		cn := gi
		cn.C = s
		cps = append(cps, ComputeProfile{Name: cn.String(), Index: idx, ID: idx, Slices: s, MaxCount: gi.G / s})
	}
	return cps
}

// withComputeProfiles fills every GPU instance profile's ComputeProfiles
// with StandardComputeProfiles.
func withComputeProfiles(m Model) Model {
	for i := range m.Catalogue.Profiles {
		p := &m.Catalogue.Profiles[i]
		if n, err := Parse(p.Name); err == nil { // models_test catches a bad name
			p.ComputeProfiles = StandardComputeProfiles(n)
		}
	}
	return m
}

// knownModels: the data behind Models. H200 is measured (shared fixture
// h200-nvml-probe.json, driver 580.159.04); the others follow MIG-FACTS.md §3
// and public `nvidia-smi mig -lgip` output, as noted per model. Memory sizes
// are NVML's memorySizeMB (MiB); names are what ProfileName computes from them.
var knownModels = []Model{
	// Measured: every number below is the probe's.
	withComputeProfiles(Model{
		Key: "h200", Name: "NVIDIA H200", PCIDeviceID: 0x233510DE, MemoryBytes: 150754820096,
		Architecture: ArchHopper, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.18gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 16384, MaxCount: 7, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.18gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 16384, MaxCount: 1, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.35gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 33280, MaxCount: 4, Multiprocessors: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.35gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 33280, MaxCount: 3, Multiprocessors: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.71gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 71424, MaxCount: 2, Multiprocessors: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, Placements: pl(4, 0, 4)},
			{Name: "4g.71gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 71424, MaxCount: 1, Multiprocessors: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, Placements: pl(4, 0)},
			{Name: "7g.141gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 143360, MaxCount: 1, Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, Placements: pl(8, 0)},
		}},
	}),
	// GH100 like the H200 (same ids, placements, SMs and engines); memory
	// from a public `nvidia-smi mig -lgip` of an H100 80GB HBM3 (9.75,
	// 19.62, 39.50, 79.25 GiB). Not measured here.
	withComputeProfiles(Model{
		Key: "h100-80gb", Name: "NVIDIA H100 80GB HBM3", PCIDeviceID: 0x233010DE, MemoryBytes: 85520809984,
		Architecture: ArchHopper, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.10gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 9984, MaxCount: 7, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.10gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 9984, MaxCount: 1, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.20gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 20096, MaxCount: 4, Multiprocessors: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.20gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 20096, MaxCount: 3, Multiprocessors: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.40gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 40448, MaxCount: 2, Multiprocessors: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, Placements: pl(4, 0, 4)},
			{Name: "4g.40gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 40448, MaxCount: 1, Multiprocessors: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, Placements: pl(4, 0)},
			{Name: "7g.80gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 81152, MaxCount: 1, Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, Placements: pl(8, 0)},
		}},
	}),
	// GA100 40GB: ids from GCP partition_gpu.go, placements, SMs and engines
	// from go-nvml's A100 mock, memory as MIG-FACTS §3.4 (4.75, 9.62, 19.50,
	// 39.25 GiB in -lgip). 1g.10gb (index 9) is offered by newer drivers.
	withComputeProfiles(Model{
		Key: "a100-40gb", Name: "NVIDIA A100-SXM4-40GB", PCIDeviceID: 0x20B010DE, MemoryBytes: 42949672960,
		Architecture: ArchAmpere, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.5gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 4864, MaxCount: 7, Multiprocessors: 14, CopyEngines: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.5gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 4864, MaxCount: 1, Multiprocessors: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.10gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 9856, MaxCount: 4, Multiprocessors: 14, CopyEngines: 1, Decoders: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.10gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 9856, MaxCount: 3, Multiprocessors: 28, CopyEngines: 2, Decoders: 1, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.20gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 19968, MaxCount: 2, Multiprocessors: 42, CopyEngines: 3, Decoders: 2, Placements: pl(4, 0, 4)},
			{Name: "4g.20gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 19968, MaxCount: 1, Multiprocessors: 56, CopyEngines: 4, Decoders: 2, Placements: pl(4, 0)},
			{Name: "7g.40gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 40192, MaxCount: 1, Multiprocessors: 98, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, Placements: pl(8, 0)},
		}},
	}),
	// GA100 80GB: as the 40GB; memory from a public -lgip (9.50, 19.50,
	// 39.25, 79.00 GiB).
	withComputeProfiles(Model{
		Key: "a100-80gb", Name: "NVIDIA A100-SXM4-80GB", PCIDeviceID: 0x20B210DE, MemoryBytes: 85899345920,
		Architecture: ArchAmpere, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.10gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 9728, MaxCount: 7, Multiprocessors: 14, CopyEngines: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.10gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 9728, MaxCount: 1, Multiprocessors: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.20gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 19968, MaxCount: 4, Multiprocessors: 14, CopyEngines: 1, Decoders: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.20gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 19968, MaxCount: 3, Multiprocessors: 28, CopyEngines: 2, Decoders: 1, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.40gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 40192, MaxCount: 2, Multiprocessors: 42, CopyEngines: 3, Decoders: 2, Placements: pl(4, 0, 4)},
			{Name: "4g.40gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 40192, MaxCount: 1, Multiprocessors: 56, CopyEngines: 4, Decoders: 2, Placements: pl(4, 0)},
			{Name: "7g.80gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 80896, MaxCount: 1, Multiprocessors: 98, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, Placements: pl(8, 0)},
		}},
	}),
	// GA100 A30: 4 compute and 4 memory slices. Ids, SMs, engines and memory
	// from a public -lgip (5.81, 11.69, 23.50 GiB); placements from go-nvml's
	// A30 mock (not verified on hardware). 2g.12gb+me (index 8, ≥R525):
	// its id 6 is UNVERIFIED (no public output shows it); engines per the mock.
	withComputeProfiles(Model{
		Key: "a30", Name: "NVIDIA A30", PCIDeviceID: 0x20B710DE, MemoryBytes: 25769803776,
		Architecture: ArchAmpere, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 4, Profiles: []Profile{
			{Name: "1g.6gb", ID: 14, Index: Index1Slice, Slices: 1, MemoryMiB: 5952, MaxCount: 4, Multiprocessors: 14, CopyEngines: 1, Decoders: 1, Placements: pl(1, 0, 1, 2, 3)},
			{Name: "1g.6gb+me", ID: 21, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 5952, MaxCount: 1, Multiprocessors: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3)},
			{Name: "2g.12gb", ID: 5, Index: Index2Slice, Slices: 2, MemoryMiB: 11968, MaxCount: 2, Multiprocessors: 28, CopyEngines: 2, Decoders: 2, Placements: pl(2, 0, 2)},
			{Name: "2g.12gb+me", ID: 6, Index: Index2SliceRev1, Slices: 2, MemoryMiB: 11968, MaxCount: 1, Multiprocessors: 28, CopyEngines: 2, Decoders: 2, JPEGs: 1, OFAs: 1, Placements: pl(2, 0, 2)},
			{Name: "4g.24gb", ID: 0, Index: Index4Slice, Slices: 4, MemoryMiB: 24064, MaxCount: 1, Multiprocessors: 56, CopyEngines: 4, Decoders: 4, JPEGs: 1, OFAs: 1, Placements: pl(4, 0)},
		}},
	}),
	// GB100 B200: ids, max counts, 1g/2g SMs and engines and memory (20.50,
	// 44.25 GiB) from the -lgip in mig-parted PR #187 (the driver that
	// added 4g.90gb). 3g/4g/7g memory is ESTIMATED (89.25, 178.25 GiB; no
	// public output seen) and their engines are left unset. Placements
	// follow the Hopper layout: UNVERIFIED.
	withComputeProfiles(Model{
		Key: "b200", Name: "NVIDIA B200", PCIDeviceID: 0x290110DE, MemoryBytes: 183359 << 20,
		Architecture: ArchBlackwell, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.23gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 20992, MaxCount: 7, Multiprocessors: 18, CopyEngines: 2, Decoders: 1, JPEGs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.23gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 20992, MaxCount: 1, Multiprocessors: 18, CopyEngines: 2, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.45gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 45312, MaxCount: 4, Multiprocessors: 30, CopyEngines: 2, Decoders: 1, JPEGs: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.45gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 45312, MaxCount: 3, Multiprocessors: 36, CopyEngines: 4, Decoders: 2, JPEGs: 2, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.90gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 91392, MaxCount: 2, Placements: pl(4, 0, 4)},
			{Name: "4g.90gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 91392, MaxCount: 1, Placements: pl(4, 0)},
			{Name: "7g.180gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 182528, MaxCount: 1, Placements: pl(8, 0)},
		}},
	}),
	// Grace Hopper GH200 with 96 GB of HBM3 (nvidia-smi names it after
	// the module's 480 GB of LPDDR5X): the GH100 of the H100 with 96 GB, so
	// the H100's ids, placements, SMs and engines (MIG user guide,
	// "Supported MIG Profiles", table "GH200 96GB": the H100 table's
	// profiles, memory fractions 1/8, 2/8, 4/8, 8/8, names from mig-parted's
	// config-default.yaml: 1g.12gb ... 7g.96gb). Total and per-profile
	// memory are ESTIMATED (the H100 80GB's MiB scaled to 96 GB; no public
	// -lgip seen) within the eighths the names need. Not measured.
	withComputeProfiles(Model{
		Key: "gh200", Name: "NVIDIA GH200 480GB", PCIDeviceID: 0x234210DE, MemoryBytes: 97871 << 20,
		Architecture: ArchHopper, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.12gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 11904, MaxCount: 7, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.12gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 11904, MaxCount: 1, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.24gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 24064, MaxCount: 4, Multiprocessors: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.24gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 24064, MaxCount: 3, Multiprocessors: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.48gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 48384, MaxCount: 2, Multiprocessors: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, Placements: pl(4, 0, 4)},
			{Name: "4g.48gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 48384, MaxCount: 1, Multiprocessors: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, Placements: pl(4, 0)},
			{Name: "7g.96gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 97024, MaxCount: 1, Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, Placements: pl(8, 0)},
		}},
	}),
	// Grace Hopper GH200 with 144 GB of HBM3e (0x234810DE): the H200's
	// GH100 layout, ids, SMs and engines (MIG user guide, "Supported MIG
	// Profiles", table "GH200 144GB"; names and the 1g's 17.50 GiB from
	// mig-parted PR #139: 1g.18gb ... 7g.144gb). The other memory sizes are
	// ESTIMATED within the eighths the names need. Not measured.
	withComputeProfiles(Model{
		Key: "gh200-144gb", Name: "NVIDIA GH200 144G HBM3e", PCIDeviceID: 0x234810DE, MemoryBytes: 146944 << 20,
		Architecture: ArchHopper, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.18gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 17920, MaxCount: 7, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.18gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 17920, MaxCount: 1, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.36gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 35840, MaxCount: 4, Multiprocessors: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.36gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 35840, MaxCount: 3, Multiprocessors: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.72gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 72704, MaxCount: 2, Multiprocessors: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, Placements: pl(4, 0, 4)},
			{Name: "4g.72gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 72704, MaxCount: 1, Multiprocessors: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, Placements: pl(4, 0)},
			{Name: "7g.144gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 145408, MaxCount: 1, Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, Placements: pl(8, 0)},
		}},
	}),
	// Grace Blackwell GB200's B200 GPU (0x294110DE): MIG user guide,
	// "Supported MIG Profiles", table "GB200 186GB" (memory fractions 1/8,
	// 2/8, 4/8, 8/8; up to 7 instances); names as current drivers report
	// them (1g.23gb; older ones said 1g.24gb: mig-parted #227/#228), ids
	// and max counts as the B200, 1g/2g SMs from gpu-operator PR #1303 (18,
	// 32, 38). Memory sizes are ESTIMATED within the eighths the names need
	// (total 189471 MiB); 3g/4g/7g engines left unset as for the B200;
	// placements follow the Hopper layout: UNVERIFIED.
	withComputeProfiles(Model{
		Key: "gb200", Name: "NVIDIA GB200", PCIDeviceID: 0x294110DE, MemoryBytes: 189471 << 20,
		Architecture: ArchBlackwell, MigCapable: true,
		Catalogue: Catalogue{MemorySlices: 8, Profiles: []Profile{
			{Name: "1g.23gb", ID: 19, Index: Index1Slice, Slices: 1, MemoryMiB: 21760, MaxCount: 7, Multiprocessors: 18, CopyEngines: 2, Decoders: 1, JPEGs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.23gb+me", ID: 20, Index: Index1SliceRev1, Slices: 1, MemoryMiB: 21760, MaxCount: 1, Multiprocessors: 18, CopyEngines: 2, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: pl(1, 0, 1, 2, 3, 4, 5, 6)},
			{Name: "1g.47gb", ID: 15, Index: Index1SliceRev2, Slices: 1, MemoryMiB: 46592, MaxCount: 4, Multiprocessors: 32, CopyEngines: 2, Decoders: 1, JPEGs: 1, Placements: pl(2, 0, 2, 4, 6)},
			{Name: "2g.47gb", ID: 14, Index: Index2Slice, Slices: 2, MemoryMiB: 46592, MaxCount: 3, Multiprocessors: 38, CopyEngines: 4, Decoders: 2, JPEGs: 2, Placements: pl(2, 0, 2, 4)},
			{Name: "3g.93gb", ID: 9, Index: Index3Slice, Slices: 3, MemoryMiB: 93696, MaxCount: 2, Placements: pl(4, 0, 4)},
			{Name: "4g.93gb", ID: 5, Index: Index4Slice, Slices: 4, MemoryMiB: 93696, MaxCount: 1, Placements: pl(4, 0)},
			{Name: "7g.186gb", ID: 0, Index: Index7Slice, Slices: 7, MemoryMiB: 188416, MaxCount: 1, Placements: pl(8, 0)},
		}},
	}),
	// AD102 L40S: no MIG.
	{
		Key: "l40s", Name: "NVIDIA L40S", PCIDeviceID: 0x26B910DE, MemoryBytes: 48305799168,
		Architecture: ArchAda, MigCapable: false,
	},
}

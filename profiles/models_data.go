package profiles

func pl(size int, starts ...int) []Placement {
	out := make([]Placement, len(starts))
	for i, s := range starts {
		out[i] = Placement{Start: s, Size: size}
	}
	return out
}

// knownModels: the data behind Models. H200 is measured (shared fixture
// h200-nvml-probe.json); other models follow MIG-FACTS.md.
var knownModels = []Model{
	{
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
	},
}

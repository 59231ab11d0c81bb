package profiles

// Model is a GPU model mig-agent knows: what the simulator reports for it,
// and the fallback catalogue for drivers that cannot list profiles while MIG
// is disabled (and for A30, whose NVML instance counts are wrong).
type Model struct {
	Key          string // simulator key: "h200", "a100-40gb", "l40s"
	Name         string // NVML device name: "NVIDIA H200"
	PCIDeviceID  uint32 // 0x233510DE
	MemoryBytes  uint64 // total memory as NVML reports it
	Architecture string // ArchAmpere, ArchHopper, ...
	MigCapable   bool
	Catalogue    Catalogue // empty when !MigCapable
}

// MemoryMiB is the total memory in MiB.
func (m *Model) MemoryMiB() uint64 { return m.MemoryBytes >> 20 }

// ModelByKey returns the model with simulator key k.
func ModelByKey(k string) (*Model, bool) {
	for i := range knownModels {
		if knownModels[i].Key == k {
			return &knownModels[i], true
		}
	}
	return nil, false
}

// ModelByPCIID returns the model with the given PCI device id.
func ModelByPCIID(id uint32) (*Model, bool) {
	for i := range knownModels {
		if knownModels[i].PCIDeviceID == id {
			return &knownModels[i], true
		}
	}
	return nil, false
}

// Models lists every known model.
func Models() []Model { return knownModels }

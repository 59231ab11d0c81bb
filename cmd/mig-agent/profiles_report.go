package main

import (
	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/profiles"
)

// ProfilesReport is the output of `mig-agent profiles` (docs/reference.md#command-line).
type ProfilesReport struct {
	GPUs    []GPUReport `json:"gpus"`
	Configs string      `json:"configs"`
}

// GPUReport describes one GPU in ProfilesReport.
type GPUReport struct {
	Index        int              `json:"index"`
	UUID         string           `json:"uuid"`
	Name         string           `json:"name"`
	PCIDeviceID  string           `json:"pciDeviceId"`
	PCIBusID     string           `json:"pciBusId"`
	MemoryMiB    uint64           `json:"memoryMiB"`
	Architecture string           `json:"architecture"`
	MigCapable   bool             `json:"migCapable"`
	MigMode      MigModeReport    `json:"migMode"`
	Profiles     []ProfileReport  `json:"profiles"`
	Instances    []InstanceReport `json:"instances"`
}

// MigModeReport is a GPU's MIG mode.
type MigModeReport struct {
	Current bool `json:"current"`
	Pending bool `json:"pending"`
}

// ProfileReport is one GPU instance profile in ProfilesReport.
type ProfileReport struct {
	Name       string               `json:"name"`
	ID         int                  `json:"id"`
	MaxCount   int                  `json:"maxCount"`
	MemoryMiB  uint64               `json:"memoryMiB"`
	Placements []profiles.Placement `json:"placements"`
}

// InstanceReport is one existing GPU instance in ProfilesReport.
type InstanceReport struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	UUID    string `json:"uuid"`
	Compute string `json:"compute,omitempty"`
}

// profilesReport builds ProfilesReport for the GPUs as read, with the
// generated configs.
func profilesReport(n *gpus.Inventory) (*ProfilesReport, error) {
	cfg, err := geometry.Generate(n.GPUs).Marshal()
	if err != nil {
		return nil, err
	}
	r := &ProfilesReport{GPUs: []GPUReport{}, Configs: string(cfg)}
	for i, d := range n.Devices {
		g := GPUReport{
			Index: d.Index, UUID: d.UUID, Name: d.Name, PCIDeviceID: d.PCIDeviceIDString(), PCIBusID: d.PCIBusID,
			MemoryMiB: d.MemoryMiB, Architecture: d.Architecture, MigCapable: d.MigCapable,
			MigMode:  MigModeReport{Current: d.MigMode.Current, Pending: d.MigMode.Pending},
			Profiles: []ProfileReport{}, Instances: []InstanceReport{},
		}
		for _, p := range d.Catalogue.Profiles {
			g.Profiles = append(g.Profiles, ProfileReport{Name: p.Name, ID: p.ID, MaxCount: p.MaxCount, MemoryMiB: p.MemoryMiB, Placements: p.Placements})
		}
		for _, gi := range n.Instances[i] {
			for _, ci := range gi.ComputeInstances {
				ir := InstanceReport{Profile: gi.Profile, Start: gi.Placement.Start, UUID: ci.UUID}
				if ci.Profile != gi.Profile {
					ir.Compute = ci.Profile
				}
				g.Instances = append(g.Instances, ir)
			}
		}
		r.GPUs = append(r.GPUs, g)
	}
	return r, nil
}

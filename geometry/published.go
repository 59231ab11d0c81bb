package geometry

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/migagent/mig-agent/profiles"
)

// Published is what a node's agent publishes of its GPUs, as NVML reported
// them (the ConfigMap <node>-mig-config, annotation migagent.io/gpus,
// beside the generated configs): each GPU's identity, its MIG profiles with their
// placements, its MIG mode and the instances it held when it was read. The
// planner plans a node from it, so it needs neither GPU Feature
// Discovery's labels nor a model in the built-in table.
type Published struct {
	// DiscoveredAt is when the agent read the GPUs (the instances may have
	// changed since: a change record newer than it tells the geometry).
	DiscoveredAt time.Time      `json:"discoveredAt"`
	GPUs         []PublishedGPU `json:"gpus"`
	// Unusable are the indices of the GPUs NVML counts but cannot open.
	Unusable []int `json:"unusable,omitempty"`
}

// PublishedGPU is one GPU of Published.
type PublishedGPU struct {
	Index          int    `json:"index"`
	UUID           string `json:"uuid"`
	Name           string `json:"name"`
	PCIDeviceID    string `json:"pciDeviceId"`              // "0x233510DE"
	PCISubsystemID string `json:"pciSubsystemId,omitempty"` // "0x18BF10DE"
	Architecture   string `json:"architecture"`
	MigCapable     bool   `json:"migCapable"`
	MigMode        struct {
		Current bool `json:"current"`
		Pending bool `json:"pending"`
	} `json:"migMode"`
	CanReset  bool                `json:"canReset"`
	Catalogue *profiles.Catalogue `json:"catalogue,omitempty"`
	Instances []Instance          `json:"instances"`
}

// MaxPublished bounds the document a planner reads (a ConfigMap holds at
// most 1 MiB).
const MaxPublished = 1 << 20

// Publish is the document of gpus, read at at.
func Publish(gpus []GPU, unusable []int, at time.Time) Published {
	out := Published{DiscoveredAt: at.UTC().Truncate(time.Second), GPUs: make([]PublishedGPU, 0, len(gpus)), Unusable: unusable}
	for _, g := range gpus {
		pg := PublishedGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, PCIDeviceID: fmt.Sprintf("0x%08X", g.PCIDeviceID),
			Architecture: g.Architecture, MigCapable: g.MigCapable, CanReset: g.CanReset, Instances: g.Instances}
		if g.PCISubsystemID != 0 {
			pg.PCISubsystemID = fmt.Sprintf("0x%08X", g.PCISubsystemID)
		}
		if pg.Instances == nil {
			pg.Instances = []Instance{}
		}
		pg.MigMode.Current, pg.MigMode.Pending = g.ModeCurrent, g.ModePending
		if g.MigCapable {
			cat := g.Catalogue
			pg.Catalogue = &cat
		}
		out.GPUs = append(out.GPUs, pg)
	}
	return out
}

// ParsePublished reads a Published document and the GPUs it describes, as
// the planner plans them (ProfileID filled from each GPU's catalogue).
func ParsePublished(data []byte) (*Published, []GPU, error) {
	if len(data) > MaxPublished {
		return nil, nil, fmt.Errorf("the published GPUs weigh %d bytes, more than %d", len(data), MaxPublished)
	}
	var p Published
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, nil, fmt.Errorf("the published GPUs: %w", err)
	}
	gpus := make([]GPU, 0, len(p.GPUs))
	for i, pg := range p.GPUs {
		if pg.Index != i {
			return nil, nil, fmt.Errorf("the published GPUs: entry %d has index %d", i, pg.Index)
		}
		g := GPU{Index: pg.Index, UUID: pg.UUID, Name: pg.Name, Architecture: pg.Architecture, MigCapable: pg.MigCapable,
			ModeCurrent: pg.MigMode.Current, ModePending: pg.MigMode.Pending, CanReset: pg.CanReset}
		var err error
		if g.PCIDeviceID, err = hex32(pg.PCIDeviceID); err != nil {
			return nil, nil, fmt.Errorf("the published GPU %d: pciDeviceId %q", i, pg.PCIDeviceID)
		}
		if pg.PCISubsystemID != "" {
			if g.PCISubsystemID, err = hex32(pg.PCISubsystemID); err != nil {
				return nil, nil, fmt.Errorf("the published GPU %d: pciSubsystemId %q", i, pg.PCISubsystemID)
			}
		}
		if pg.MigCapable {
			if pg.Catalogue == nil || len(pg.Catalogue.Profiles) == 0 {
				return nil, nil, fmt.Errorf("the published GPU %d: MIG-capable, with no profiles", i)
			}
			g.Catalogue = *pg.Catalogue
		}
		if g.Instances, err = g.located(pg.Instances); err != nil {
			return nil, nil, fmt.Errorf("the published GPU %d: %w", i, err)
		}
		gpus = append(gpus, g)
	}
	return &p, gpus, nil
}

// located checks each instance's profile against g's catalogue and fills
// its ProfileID and Size.
func (g GPU) located(ins []Instance) ([]Instance, error) {
	out := make([]Instance, 0, len(ins))
	for _, in := range ins {
		n, err := profiles.Parse(in.Profile)
		if err != nil {
			return nil, fmt.Errorf("instance %s@%d: %w", in.Profile, in.Start, err)
		}
		p, ok := g.Catalogue.ByName(n)
		if !ok {
			return nil, fmt.Errorf("instance %s@%d: no such profile on the GPU", in.Profile, in.Start)
		}
		in.ProfileID = p.ID
		if in.Size == 0 {
			for _, pl := range p.Placements {
				if pl.Start == in.Start {
					in.Size = pl.Size
				}
			}
		}
		out = append(out, in)
	}
	return out, nil
}

func hex32(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	return uint32(v), err
}

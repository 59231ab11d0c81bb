// Package geometry owns the MIG geometry: the nvidia-mig-parted v1 config
// format (parsed strictly), the resolution of a named config against a
// node's GPUs, validation with an exact placement solver, the per-GPU
// minimal-diff planner, and the generated named configs. It is pure: no
// clock, no I/O, no NVML, no Kubernetes.
package geometry

import (
	"fmt"
	"strings"

	"github.com/migagent/mig-agent/profiles"
)

// GPU is what the planner knows of one GPU: identity, catalogue, MIG mode
// and the GPU instances that exist now. Callers build it from nvmlx.
type GPU struct {
	Index        int
	UUID         string
	Name         string // "NVIDIA H200"
	PCIDeviceID  uint32 // 0x233510DE
	Architecture string // profiles.ArchAmpere, ...
	MigCapable   bool
	ModeCurrent  bool
	ModePending  bool
	// CanReset: this GPU can be reset on its own, so an Ampere mode change
	// takes effect without a reboot.
	CanReset  bool
	Catalogue profiles.Catalogue
	Instances []Instance

	// PCISubsystemID is the PCI subsystem id (0x18BF10DE), 0 when unknown;
	// only device-filters written with a subsystem ("0x233510DE:0x18BF10DE")
	// look at it, and they never match a GPU whose subsystem id is unknown.
	PCISubsystemID uint32
}

// Instance is a GPU instance (existing or planned) keyed the way mig-agent
// keys them: GI profile and placement, plus the compute instances inside.
type Instance struct {
	Profile   string `json:"profile"` // GI profile name: "3g.71gb"
	Start     int    `json:"start"`
	Size      int    `json:"size,omitempty"`
	ProfileID int    `json:"-"` // GI profile id on this GPU
	// Compute lists the compute instances it holds by compute profile
	// name, largest first ("2c.3g.71gb", "1c.3g.71gb"); a full compute
	// instance is named like the GPU instance ("3g.71gb"). Nil stands for
	// one full compute instance; empty (not nil) for none at all.
	Compute []string `json:"computeInstances"`
}

// Name prints the instance for people and audit records: "3g.71gb" (one
// full compute instance), "1c.3g.71gb" (one smaller one),
// "2c.3g.71gb+1c.3g.71gb", "3×1c.3g.71gb", "3g.71gb[none]".
func (in Instance) Name() string {
	cis := computeOf(in)
	switch {
	case len(cis) == 0:
		return in.Profile + "[none]"
	case len(cis) == 1:
		if cis[0] == canonical(in.Profile) {
			return in.Profile
		}
		return cis[0]
	}
	var parts []string
	for i := 0; i < len(cis); {
		j := i
		for j < len(cis) && cis[j] == cis[i] {
			j++
		}
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%d×%s", j-i, cis[i]))
		} else {
			parts = append(parts, cis[i])
		}
		i = j
	}
	return strings.Join(parts, "+")
}

// ComputeChange is one compute instance created or destroyed inside a GPU
// instance that stays.
type ComputeChange struct {
	Profile   string `json:"profile"` // the GPU instance's profile
	Start     int    `json:"start"`   // and placement start
	Compute   string `json:"compute"` // the compute instance's profile
	ProfileID int    `json:"-"`       // GI profile id on this GPU
}

// Request is what a config asks of one GPU.
type Request struct {
	GPU        int
	MigEnabled bool
	// Devices: profile name (GI or compute profile, as written in the
	// config) → count, in the config's order.
	Devices []DeviceCount
}

// DeviceCount is one "profile: count" line of mig-devices.
type DeviceCount struct {
	Profile string `json:"profile"`
	Count   int    `json:"count"`
}

// Action values of GPUPlan.Action.
const (
	ActionUntouched = "untouched"
	ActionChange    = "change"
)

// ModeChange values of GPUPlan.ModeChange.
const (
	ModeNone    = "none"
	ModeEnable  = "enable"
	ModeDisable = "disable"
)

// GPUPlan is the planned change on one GPU (docs/reference.md#command-line, plan -o json).
type GPUPlan struct {
	Index       int        `json:"index"`
	UUID        string     `json:"uuid,omitempty"`
	Action      string     `json:"action"`
	ModeChange  string     `json:"modeChange"`
	ResetNeeded bool       `json:"resetNeeded"`
	Destroy     []Instance `json:"destroy"`
	Create      []Instance `json:"create"`
	Keep        []Instance `json:"keep"`
	// DestroyCompute and CreateCompute are the compute instances destroyed
	// and created inside GPU instances that are kept (Keep lists those
	// with the compute instances they end with); the compute instances of
	// Destroy and Create go and come with their GPU instance.
	DestroyCompute []ComputeChange `json:"destroyCompute"`
	CreateCompute  []ComputeChange `json:"createCompute"`
	// Desired is the full geometry the GPU has once the plan is applied.
	Desired    []Instance `json:"-"`
	MigEnabled bool       `json:"migEnabled"`
	// Evict lists the pods ("namespace/name") the change would evict; only
	// callers that can see the node's pods fill it (`plan --node-name`).
	Evict []string `json:"evict,omitempty"`
}

// Plan is the planned change of a node.
type Plan struct {
	Config       string    `json:"config"`
	RebootNeeded bool      `json:"rebootNeeded"`
	GPUs         []GPUPlan `json:"gpus"`
	Warnings     []string  `json:"warnings,omitempty"`
	// Hash is the sha256 of the desired geometry (ConfigHash).
	Hash string `json:"configHash"`
	// Strategy is the MIG strategy (nvidia.com/mig.strategy) the plan was
	// checked against with CheckStrategy; empty when none was checked.
	Strategy string `json:"strategy,omitempty"`
}

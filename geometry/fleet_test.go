package geometry

import (
	"errors"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/profiles"
)

// TestGenerateMixedWithPlainGPU: a node of MIG GPUs and GPUs without MIG
// holds several GPU models, so every generated config but all-disabled
// carries the MIG model's device-filter (the text then means the same to
// nvidia-mig-parted), and no config touches the GPUs without MIG.
func TestGenerateMixedWithPlainGPU(t *testing.T) {
	gpus := append(node(t, "h100-80gb", 2), l40s(2), l40s(3))
	h100 := pciID(gpus[0].PCIDeviceID)
	gen := Generate(gpus)
	for _, name := range gen.Names {
		for i, e := range gen.Configs[name] {
			want := []string{h100}
			if name == "all-disabled" {
				want = nil
			}
			if strings.Join(e.DeviceFilter, ",") != strings.Join(want, ",") {
				t.Errorf("%s entry %d: device-filter %v, want %v", name, i, e.DeviceFilter, want)
			}
		}
		p, err := BuildPlan(gen, name, gpus)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, gp := range p.GPUs {
			if gp.Index >= 2 && gp.Action != ActionUntouched {
				t.Errorf("%s: GPU %d (L40S) %s", name, gp.Index, gp.Action)
			}
		}
	}
	// One model only: no filter, as before.
	for _, e := range Generate(node(t, "h100-80gb", 2)).Configs["all-balanced"] {
		if len(e.DeviceFilter) != 0 {
			t.Fatalf("one model: filter %v", e.DeviceFilter)
		}
	}
}

// TestFleetRules: one row per fleet rule of docs/reference.md (config file, Kubernetes) that the
// planner owns, on the node kinds a fleet has.
func TestFleetRules(t *testing.T) {
	mixed := append(node(t, "h100-80gb", 2), l40s(2))
	h100 := node(t, "h100-80gb", 2)
	spec := mustParse(t, `version: v1
mig-configs:
  l40s-by-index:
    - devices: [2]
      mig-enabled: true
      mig-devices: {"1g.10gb": 1}
  l40s-off-by-index:
    - devices: [0, 1, 2]
      mig-enabled: false
  other-gpu-profile:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
  a100-only:
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  beyond-the-node:
    - devices: [9]
      mig-enabled: false
`)
	gen := Generate(mixed)
	tests := []struct {
		name     string
		spec     *Spec
		config   string
		gpus     []GPU
		strategy string
		err      error
		errHas   string
	}{
		{"devices all skips the L40S", gen, "all-balanced", mixed, "", nil, ""},
		{"an L40S named for MIG", spec, "l40s-by-index", mixed, "", ErrNotMigCapable, "GPU 2 (NVIDIA L40S, 0x26B910DE) is named by index with mig-enabled true"},
		{"an L40S named with MIG off is left alone", spec, "l40s-off-by-index", mixed, "", nil, ""},
		{"a profile of another GPU", spec, "other-gpu-profile", h100, "", nil, "1g.18gb"},
		{"a config for other hardware", spec, "a100-only", mixed, "", ErrNoMatchingGPU, "2× NVIDIA H100 80GB HBM3 (0x233010DE) and 1× NVIDIA L40S (0x26B910DE, no MIG)"},
		{"only indices the node lacks", spec, "beyond-the-node", h100, "", ErrNoMatchingGPU, "selects none of"},
		{"single: balanced has three profiles", gen, "all-balanced", mixed, profiles.StrategySingle, ErrStrategy, "GPU 0 would hold 3 profiles (1g.10gb, 2g.20gb, 3g.40gb)"},
		{"single: one profile everywhere", gen, "all-1g.10gb", mixed, profiles.StrategySingle, nil, ""},
		{"single: MIG off everywhere", gen, "all-disabled", mixed, profiles.StrategySingle, nil, ""},
		{"mixed: balanced", gen, "all-balanced", mixed, profiles.StrategyMixed, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := BuildPlan(tc.spec, tc.config, tc.gpus)
			if err == nil && tc.strategy != "" {
				reqs, _, rerr := tc.spec.Resolve(tc.config, tc.gpus)
				if rerr != nil {
					t.Fatal(rerr)
				}
				err = CheckStrategy(tc.strategy, tc.gpus, reqs)
			}
			switch {
			case tc.errHas == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.errHas == "":
				for _, gp := range p.GPUs {
					if !gp.MigEnabled && gp.Index == 2 && gp.Action != ActionUntouched {
						t.Fatalf("L40S planned: %+v", gp)
					}
				}
			case err == nil:
				t.Fatalf("no error; want %q", tc.errHas)
			case !strings.Contains(err.Error(), tc.errHas) || tc.err != nil && !errors.Is(err, tc.err):
				t.Fatalf("error %q; want %v containing %q", err, tc.err, tc.errHas)
			}
		})
	}
}

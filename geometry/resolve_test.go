package geometry

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func mustParse(t testing.TB, y string) *Spec {
	t.Helper()
	s, err := Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func l40s(index int) GPU {
	return GPU{Index: index, Name: "NVIDIA L40S", PCIDeviceID: 0x26B910DE, Architecture: "ada"}
}

func TestResolve(t *testing.T) {
	h := node(t, "h200", 4)
	mixed := append(node(t, "h200", 2), l40s(2))
	sub := node(t, "h200", 2)
	sub[1].PCISubsystemID = 0x18BF10DE
	spec := mustParse(t, `version: v1
mig-configs:
  last-wins:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 7}
    - devices: [1, 9]
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
    - device-filter: ["0x20B710DE"]
      devices: [2]
      mig-enabled: false
  filtered:
    - device-filter: "0x233510de"
      devices: [0, 2]
      mig-enabled: false
  other-hardware:
    - device-filter: ["0x20B010DE", "0x20F110DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
  plain-by-index:
    - devices: [2]
      mig-enabled: true
      mig-devices: {}
  plain-off:
    - devices: all
      mig-enabled: false
    - devices: [2]
      mig-enabled: false
  subsystem:
    - device-filter: ["0x233510DE:0x18BF10DE"]
      devices: all
      mig-enabled: false
`)
	on7 := Request{MigEnabled: true, Devices: dc("1g.18gb=7")}
	at := func(r Request, i int) Request { r.GPU = i; return r }
	tests := []struct {
		name, config string
		gpus         []GPU
		want         []Request
		warn         string
		err          error
		errHas       string
	}{
		{"last entry wins, missing index warned", "last-wins", h,
			[]Request{at(on7, 0), {GPU: 1, MigEnabled: true, Devices: dc("3g.71gb=2")}, at(on7, 2), at(on7, 3)},
			`config "last-wins" entry 2: this node has no GPU 9 (it has GPUs 0-3); ignored`, nil, ""},
		{"device filter, case-insensitive", "filtered", h, []Request{{GPU: 0}, {GPU: 2}}, "", nil, ""},
		{"all skips a GPU without MIG", "last-wins", mixed, []Request{at(on7, 0), {GPU: 1, MigEnabled: true, Devices: dc("3g.71gb=2")}}, "no GPU 9 (it has GPUs 0-2)", nil, ""},
		{"mig off leaves a GPU without MIG alone", "plain-off", mixed, []Request{{GPU: 0}, {GPU: 1}}, "", nil, ""},
		{"GPU without MIG named for MIG", "plain-by-index", mixed, nil, "", ErrNotMigCapable,
			`config "plain-by-index" entry 1: GPU cannot do MIG: GPU 2 (NVIDIA L40S, 0x26B910DE) is named by index with mig-enabled true`},
		{"config for other hardware", "other-hardware", mixed, nil, "", ErrNoMatchingGPU,
			`config "other-hardware" selects none of this node's 2× NVIDIA H200 (0x233510DE) and 1× NVIDIA L40S (0x26B910DE, no MIG)`},
		{"only a GPU without MIG", "plain-off", []GPU{l40s(0)}, nil, "", ErrNoMatchingGPU, "1× NVIDIA L40S"},
		{"unknown config", "nope", h, nil, "", ErrUnknownConfig, `unknown MIG config "nope" (known: last-wins, filtered,`},
		{"subsystem filter", "subsystem", sub, []Request{{GPU: 1}}, "needs the PCI subsystem id of GPU 0, which is unknown", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, warnings, err := spec.Resolve(tc.config, tc.gpus)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("error %v; want %v containing %q", err, tc.err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
			if tc.warn == "" && len(warnings) > 0 || tc.warn != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], tc.warn)) {
				t.Fatalf("warnings %q; want %q", warnings, tc.warn)
			}
		})
	}
}

// TestResolveNVIDIADefaults resolves NVIDIA's own configs on each model:
// every config a model's GPUs can take resolves, validates and plans.
func TestResolveNVIDIADefaults(t *testing.T) {
	d := readSpec(t, "config-default.yaml")
	for _, m := range migModels() {
		gpus := node(t, m.Key, 8)
		ok := 0
		for _, name := range d.Names {
			reqs, _, err := d.Resolve(name, gpus)
			if err != nil {
				continue // filtered to other models
			}
			if len(reqs) != 8 {
				t.Fatalf("%s %s: %d requests", m.Key, name, len(reqs))
			}
			if Validate(gpus[0], reqs[0]) != nil {
				continue // a profile of another model
			}
			if _, err := BuildPlan(d, name, gpus); err != nil {
				t.Fatalf("%s %s: %v", m.Key, name, err)
			}
			ok++
		}
		if ok < 5 {
			t.Fatalf("%s: only %d NVIDIA configs apply", m.Key, ok)
		}
	}
}

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/testkit/simlibtest"
)

// captures: what a real GPU's driver answered (nvmlprobe run on a machine
// with the card, read-only), and the simulator's spec of the same model.
var captures = []struct{ file, spec string }{
	// One NVIDIA H100 80GB HBM3 (PCI 0x233010DE), driver 580.159.04, MIG
	// disabled, captured 2026-12-07 on the project's lent device machine.
	{"h100-80gb-hbm3-driver-580.159.04.json", "h100-80gbx1"},
}

// TestSimulatedLibraryMatchesCapture: the simulated libnvidia-ml.so.1
// answers the probe's calls as the real driver did for the same model:
// names, ids, memory (v1 and v2), the versioned profile structs (the
// driver leaves version 3's name empty), return codes and error strings.
// Only where the card sits on the PCI bus differs from machine to machine.
func TestSimulatedLibraryMatchesCapture(t *testing.T) {
	lib := simlibtest.Library(t)
	for _, c := range captures {
		raw, err := os.ReadFile(filepath.Join("testdata", c.file))
		if err != nil {
			t.Fatal(err)
		}
		var want Probe
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		t.Setenv("MIG_AGENT_SIM", c.spec)
		t.Setenv("MIG_AGENT_SIM_STATE", filepath.Join(t.TempDir(), "state.json"))
		t.Setenv("MIG_AGENT_SIM_QUIET", "1")
		got, err := probe(nvml.New(nvml.WithLibraryPath(lib)))
		if err != nil {
			t.Fatal(err)
		}
		if len(got.GPUs) != len(want.GPUs) {
			t.Fatalf("%s: %d GPUs, the capture %d", c.file, len(got.GPUs), len(want.GPUs))
		}
		for i := range want.GPUs {
			// Where the card sits: the machine's, not the model's.
			for _, g := range []*GPU{&got.GPUs[i], &want.GPUs[i]} {
				g.PciBus, g.PciDevice, g.PciDomain, g.PciBusID, g.PciBusIDLegacy = 0, 0, 0, "", ""
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the simulated library (spec %s) differs from the driver:\n%s", c.file, c.spec, diff(got, want))
		}
	}
}

// diff lists the fields of got and want that differ, as JSON paths.
func diff(got, want Probe) string {
	g, w := flatten(got), flatten(want)
	out := ""
	for k, wv := range w {
		if gv := g[k]; gv != wv {
			out += fmt.Sprintf("  %s: simulated %s, driver %s\n", k, gv, wv)
		}
	}
	for k, gv := range g {
		if _, ok := w[k]; !ok {
			out += fmt.Sprintf("  %s: simulated %s, driver none\n", k, gv)
		}
	}
	return out
}

func flatten(p Probe) map[string]string {
	raw, _ := json.Marshal(p)
	var v any
	_ = json.Unmarshal(raw, &v)
	out := map[string]string{}
	var walk func(string, any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		default:
			b, _ := json.Marshal(x)
			out[path] = string(b)
		}
	}
	walk("", v)
	return out
}

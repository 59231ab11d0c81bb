package geometry

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/profiles"
)

// modelGPU builds GPU index of a known model, MIG off, no instances.
func modelGPU(t testing.TB, key string, index int) GPU {
	t.Helper()
	m, ok := profiles.ModelByKey(key)
	if !ok {
		t.Fatalf("no model %q", key)
	}
	return gpuOf(m, index)
}

func gpuOf(m *profiles.Model, index int) GPU {
	return GPU{
		Index: index, UUID: fmt.Sprintf("GPU-%s-%d", m.Key, index), Name: m.Name,
		PCIDeviceID: m.PCIDeviceID, Architecture: m.Architecture, MigCapable: m.MigCapable,
		CanReset: true, Catalogue: m.Catalogue,
	}
}

// node builds n GPUs of one model.
func node(t testing.TB, key string, n int) []GPU {
	gpus := make([]GPU, n)
	for i := range gpus {
		gpus[i] = modelGPU(t, key, i)
	}
	return gpus
}

// migModels lists the MIG-capable models profiles knows.
func migModels() []*profiles.Model {
	var out []*profiles.Model
	for _, m := range profiles.Models() {
		if m.MigCapable {
			out = append(out, &m)
		}
	}
	return out
}

func h200Cat(t testing.TB) *profiles.Catalogue {
	g := modelGPU(t, "h200", 0)
	return &g.Catalogue
}

func readSpec(t testing.TB, file string) *Spec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return s
}

// layout prints instances as "3g.71gb@0 1c.3g.71gb@4 2×1c.3g.71gb@4".
func layout(in []Instance) string {
	parts := make([]string, len(in))
	for i, x := range in {
		parts[i] = fmt.Sprintf("%s@%d", x.Name(), x.Start)
	}
	return strings.Join(parts, " ")
}

// dc builds device counts from "name=count" pairs.
func dc(pairs ...string) []DeviceCount {
	out := make([]DeviceCount, 0, len(pairs))
	for _, p := range pairs {
		name, count, _ := strings.Cut(p, "=")
		var c int
		fmt.Sscan(count, &c)
		out = append(out, DeviceCount{Profile: name, Count: c})
	}
	return out
}

// apply simulates what the agent does with a plan on a GPU that can be
// reset: the mode becomes the planned one and the instances the desired ones.
func apply(g GPU, p GPUPlan) GPU {
	if p.ModeChange != ModeNone {
		g.ModePending = p.MigEnabled
		g.ModeCurrent = p.MigEnabled
	}
	g.Instances = append([]Instance(nil), p.Desired...)
	return g
}

package reconcile_test

import (
	"io"
	"log/slog"
	"testing"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newSim(t *testing.T, spec string, o nvmlx.SimOptions) *nvmlx.Sim {
	t.Helper()
	s, err := nvmlx.NewSim(spec, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func parseSpec(t *testing.T, y string) *gpus.ConfigFile {
	t.Helper()
	spec, err := geometry.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return &gpus.ConfigFile{Path: "test.yaml", SHA256: "x", Spec: spec}
}

// applyConfig plans config name on the sim and applies it.
func applyConfig(t *testing.T, g nvmlx.GPU, f *gpus.ConfigFile, name string, o gpus.ApplyOptions) (*gpus.Applied, error) {
	t.Helper()
	n, err := gpus.Discover(g)
	if err != nil {
		t.Fatal(err)
	}
	spec, _, err := gpus.Lookup(f, name, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := geometry.BuildPlan(spec, name, n.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	return gpus.ApplyAndVerify(g, n, plan, f, name, o)
}

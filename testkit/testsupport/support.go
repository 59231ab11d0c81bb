package testsupport

import (
	"io"
	"log/slog"
	"testing"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// Discard is a logger that writes nowhere.
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// NewSim is a simulated node for spec (nvmlx.NewSim); it fails the test
// when the simulator cannot start.
func NewSim(t testing.TB, spec string, o nvmlsim.Options) *nvmlx.Sim {
	t.Helper()
	s, err := nvmlx.NewSim(spec, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ParseSpec is a config file of the YAML y, as gpus.LoadConfigFile would
// give it (path test.yaml); it fails the test when y does not parse.
func ParseSpec(t testing.TB, y string) *gpus.ConfigFile {
	t.Helper()
	spec, err := geometry.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return &gpus.ConfigFile{Path: "test.yaml", SHA256: "x", Spec: spec}
}

// ApplyConfig plans config name of f on g, as discovered now, and applies
// it; planning failures fail the test, the apply's result is returned.
func ApplyConfig(t testing.TB, g nvmlx.GPU, f *gpus.ConfigFile, name string, o gpus.ApplyOptions) (*gpus.Applied, error) {
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

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/profiles"
)

var updateProfiles = flag.Bool("update-profiles", false, "rewrite testdata/profiles/*")

// The `profiles` output (JSON and YAML, the generated configs included) of
// every simulated model is pinned by a golden file.
func TestProfilesGolden(t *testing.T) {
	for _, m := range profiles.Models() {
		t.Run(m.Key, func(t *testing.T) {
			sim, err := nvmlx.NewSim(m.Key+"x2", nvmlsim.Options{})
			if err != nil {
				t.Fatal(err)
			}
			n, err := gpus.Discover(sim)
			if err != nil {
				t.Fatal(err)
			}
			r, err := profilesReport(n)
			if err != nil {
				t.Fatal(err)
			}
			js, err := json.MarshalIndent(r, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			ym, err := yaml.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			for ext, got := range map[string][]byte{".json": append(js, '\n'), ".yaml": ym} {
				path := filepath.Join("testdata", "profiles", m.Key+ext)
				if *updateProfiles {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, got, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update-profiles to create it)", err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s differs from the golden file (run with -update-profiles after checking the change):\n%s", path, got)
				}
			}
		})
	}
}

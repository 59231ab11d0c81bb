package geometry

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckStrategy(t *testing.T) {
	four := node(t, "h200", 4)
	withPlain := append(node(t, "h200", 2), l40s(2))
	on := make([]GPU, 4)
	for i := range on {
		on[i] = withInstances(t, four[i], "3g.71gb@0 3g.71gb@4")
	}
	all := func(mig bool, devices ...string) []Request {
		var rs []Request
		for i := range 4 {
			rs = append(rs, Request{GPU: i, MigEnabled: mig, Devices: dc(devices...)})
		}
		return rs
	}
	tests := []struct {
		name, strategy string
		gpus           []GPU
		reqs           []Request
		errHas         string
	}{
		{"mixed accepts a mix", "mixed", four, all(true, "1g.18gb=2", "2g.35gb=1"), ""},
		{"undeclared", "", four, all(true, "1g.18gb=2", "2g.35gb=1"), ""},
		{"none", "none", four, all(true, "1g.18gb=7"), ""},
		{"single, one profile", "single", four, all(true, "1g.18gb=7"), ""},
		{"single, all off", "single", four, all(false), ""},
		{"single ignores GPUs without MIG", "single", withPlain, all(true, "3g.71gb=2")[:2], ""},
		{"single, two profiles on a GPU", "single", four, all(true, "1g.18gb=2", "2g.35gb=1"),
			"strategy single: GPU 0 would hold 2 profiles (1g.18gb, 2g.35gb)"},
		{"single, compute profile counts apart", "single", four, all(true, "3g.71gb=1", "1c.3g.71gb=1"), "would hold 2 profiles"},
		{"single, MIG on without devices", "single", four, all(true), "GPU 0 would have MIG enabled with no MIG device"},
		{"single, one GPU changes profile", "single", on, []Request{{GPU: 2, MigEnabled: true, Devices: dc("1g.18gb=7")}},
			"GPU 1 would hold 3g.71gb and GPU 2 1g.18gb"},
		{"single, one GPU keeps the others' profile", "single", on, []Request{{GPU: 2, MigEnabled: true, Devices: dc("3g.71gb=1")}}, ""},
		{"single, some GPUs off", "single", on, []Request{{GPU: 3}},
			"GPUs 0-2 would have MIG enabled and GPU 3 not"},
		{"unknown", "double", four, nil, `unknown MIG strategy "double"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckStrategy(tc.strategy, tc.gpus, tc.reqs)
			if tc.errHas == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Fatalf("error %v; want %q", err, tc.errHas)
			}
			if tc.strategy == "single" && !errors.Is(err, ErrStrategy) {
				t.Fatalf("error %v does not wrap ErrStrategy", err)
			}
		})
	}
}

package geometry

import (
	"errors"
	"strings"
	"testing"
)

// The DRA driver's limit (nvlib.go getGpuInfo: only compute instances
// that fill their GPU instance): a GPU instance split into compute
// instances, or a smaller compute instance alone, is refused on the GPUs
// the plan changes; full instances, MIG off, and GPUs left untouched pass.
func TestCheckDRA(t *testing.T) {
	spec, err := Parse([]byte(`version: v1
mig-configs:
  full:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.71gb": 1
        "1g.18gb": 4
  split:
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1c.3g.71gb": 2
  small:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "2c.3g.71gb": 1
  off:
    - devices: all
      mig-enabled: false
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		config string
		want   string // "" passes
	}{
		{"full", ""},
		{"off", ""},
		{"split", "GPU 1: 2×1c.3g.71gb"},
		{"small", "GPU 0: 2c.3g.71gb"},
	} {
		plan, err := BuildPlan(spec, tc.config, node(t, "h200", 2))
		if err != nil {
			t.Fatalf("%s: %v", tc.config, err)
		}
		err = CheckDRA(plan)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.config, err)
		case tc.want != "" && (!errors.Is(err, ErrDRAUnannounced) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %s", tc.config, err, tc.want)
		}
	}
}

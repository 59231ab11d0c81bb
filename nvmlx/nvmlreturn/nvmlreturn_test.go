package nvmlreturn

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestByNameInvertsName(t *testing.T) {
	for _, n := range names {
		if got := Name(n.r); got != n.name {
			t.Errorf("Name(%d) = %q, want %q", n.r, got, n.name)
		}
		if r, ok := ByName(n.name); !ok || r != n.r {
			t.Errorf("ByName(%q) = %d %v, want %d", n.name, r, ok, n.r)
		}
	}
	if got := Name(nvml.Return(77)); got != "ERROR_CODE_77" {
		t.Errorf("Name(77) = %q", got)
	}
	for _, bad := range []string{"ERROR_CODE_77", "IN_USE", "error_in_use", ""} {
		if _, ok := ByName(bad); ok {
			t.Errorf("ByName(%q) found a return", bad)
		}
	}
}

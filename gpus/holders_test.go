package gpus

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/nvmlx"
)

func TestStrayReasonSaysWhatToDo(t *testing.T) {
	r := StrayReason([]string{"pid 12 (nv-hostengine) on GPU 0", "pid 13 (python) on GPU 1"})
	for _, want := range []string{"pid 12 (nv-hostengine) on GPU 0, pid 13 (python) on GPU 1", "--host-gpu-clients", "--gpu-client-selector"} {
		if !strings.Contains(r, want) {
			t.Errorf("reason %q lacks %q", r, want)
		}
	}
	if strings.Contains(StrayReason([]string{"pid 13 (python) on GPU 1"}), "DCGM") {
		t.Error("a DCGM hint for a python process")
	}
}

func TestHolderAdvice(t *testing.T) {
	dir := t.TempDir()
	old := procModules
	defer func() { procModules = old }()
	procModules = filepath.Join(dir, "modules")
	inUse := fmt.Errorf("GPU 0: reset: %w", nvmlx.ErrInUse)
	if err := os.WriteFile(procModules, []byte("nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := HolderAdvice(inUse).Error()
	if !errors.Is(HolderAdvice(inUse), nvmlx.ErrInUse) || !strings.Contains(got, "nvidia-smi -pm 0") || strings.Contains(got, "nvidia_drm") {
		t.Errorf("without nvidia_drm: %q", got)
	}
	if err := os.WriteFile(procModules, []byte("nvidia_drm 1 0 - Live 0x0\nnvidia 2 1 nvidia_drm, Live 0x0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := HolderAdvice(inUse).Error(); !strings.Contains(got, "rmmod nvidia_drm") {
		t.Errorf("with nvidia_drm: %q", got)
	}
	other := errors.New("GPU 0: ERROR_UNKNOWN")
	if HolderAdvice(other) != other {
		t.Error("advice added to an error that is not in use")
	}
}

package nvmlx

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
)

// The daemon holds no NVML session while idle: after each pass the counts
// of nvmlInit and nvmlShutdown in the state file are equal.
func TestSimSessionsCounted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s, err := newSimWith("h200x1", nvmlsim.Options{StatePath: path}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if i, d := s.Sessions(); i != 0 || d != 0 {
		t.Fatalf("idle open initialized NVML: %d/%d", i, d)
	}
	if _, err := s.Devices(); err != nil { // a call outside a session opens and closes
		t.Fatal(err)
	}
	if err := s.Begin(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetMigMode(0, true); err != nil {
		t.Fatal(err)
	}
	if i, d := s.Sessions(); i != 2 || d != 1 {
		t.Errorf("inside a pass: %d inits, %d shutdowns; want 2 and 1", i, d)
	}
	s.End()
	if i, d := s.Sessions(); i != 2 || d != 2 {
		t.Errorf("idle again: %d inits, %d shutdowns; want 2 and 2", i, d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if i, d := s.Sessions(); i != d {
		t.Errorf("after Close: %d inits, %d shutdowns", i, d)
	}
}

func TestOpen(t *testing.T) {
	g, err := Open(Options{Backend: "sim:a30x2"})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := g.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[1].Name != "NVIDIA A30" {
		t.Errorf("devices %+v", devs)
	}
	if _, err := Open(Options{Backend: "sim:a30x0"}); !errors.Is(err, nvmlsim.ErrBadSpec) {
		t.Errorf("bad spec: %v", err)
	}
	for _, b := range []string{"", "sim", "fake", "REAL"} {
		if _, err := Open(Options{Backend: b}); !errors.Is(err, ErrBadBackend) {
			t.Errorf("Open(%q): %v", b, err)
		}
	}
}

// A GPU whose handle answers NO_PERMISSION (nvml.h nvmlDeviceGetCount_v2
// counts it anyway) is reported, not fatal: Devices returns the others
// whole, and the error names the GPU and NVML's answer.
func TestDevicesLeavesUnopenableGPUs(t *testing.T) {
	s, err := NewSim("h200x3", nvmlsim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetHandleError(1, "ERROR_NO_PERMISSION"); err != nil {
		t.Fatal(err)
	}
	devs, err := s.Devices()
	var ue *UnusableError
	if !errors.As(err, &ue) || len(ue.GPUs) != 1 || ue.GPUs[0].Index != 1 || ue.GPUs[0].Return != "ERROR_NO_PERMISSION" {
		t.Fatalf("error %v, want an UnusableError for GPU 1 with ERROR_NO_PERMISSION", err)
	}
	if len(devs) != 2 || devs[0].Index != 0 || devs[1].Index != 2 || len(devs[1].Catalogue.Profiles) == 0 {
		t.Fatalf("devices %+v, want GPUs 0 and 2 with their catalogues", devs)
	}
	got, unusable, err := SplitUnusable(s.Devices())
	if err != nil || len(got) != 2 || len(unusable) != 1 {
		t.Fatalf("SplitUnusable: %d devices, %v unusable, %v", len(got), unusable, err)
	}
	// NVML itself gone is still an error of the whole call.
	if _, _, err := SplitUnusable(nil, ErrInUse); err == nil {
		t.Fatal("SplitUnusable dropped an error that is not about unusable GPUs")
	}
	if err := s.SetHandleError(1, ""); err != nil {
		t.Fatal(err)
	}
	if devs, err := s.Devices(); err != nil || len(devs) != 3 {
		t.Fatalf("after the permission came back: %d devices, %v", len(devs), err)
	}
	if err := s.SetHandleError(0, "ERROR_BOGUS"); err == nil {
		t.Fatal("SetHandleError took a name NVML has no return for")
	}
}

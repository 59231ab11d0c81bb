// Package simlibtest builds what `make simlib` builds, for tests: the
// simulator as NVIDIA's NVML library (libnvidia-ml.so.1) and sim-node,
// once per test binary, into a temporary directory. Go's build cache makes
// every build after the first a link.
package simlibtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	once sync.Once
	dir  string
	err  error
)

// Build returns a directory holding libnvidia-ml.so.1 and sim-node, built
// from this checkout; the test fails when they cannot be built.
func Build(t testing.TB) string {
	t.Helper()
	once.Do(func() { dir, err = build() })
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Library is Build's libnvidia-ml.so.1.
func Library(t testing.TB) string { return filepath.Join(Build(t), "libnvidia-ml.so.1") }

// SimNode is Build's sim-node.
func SimNode(t testing.TB) string { return filepath.Join(Build(t), "sim-node") }

func build() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out, err := os.MkdirTemp("", "mig-agent-simlib-")
	if err != nil {
		return "", err
	}
	// The same commands as the Makefile's simlib target.
	for _, args := range [][]string{
		{"build", "-buildmode=c-shared", "-ldflags", "-extldflags -Wl,-soname,libnvidia-ml.so.1",
			"-o", filepath.Join(out, "libnvidia-ml.so.1"), "./nvmlx/simlib"},
		{"build", "-o", filepath.Join(out, "sim-node"), "./nvmlx/simnode"},
	} {
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, lastLines(string(b), 20))
		}
	}
	return out, nil
}

func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the mig-agent module")
	}
	return filepath.Dir(mod), nil
}

// lastLines keeps the end of the compiler's output (go-nvml's header
// warnings come first).
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

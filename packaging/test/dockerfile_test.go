package test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// TestDockerfile parses packaging/Dockerfile with BuildKit's own parser (no
// Docker daemon here to build it) and checks what the image must be: a cgo
// build through `make build` on golang:1.26-bookworm, a glibc runtime base,
// no NVML inside, the NVIDIA toolkit variables, root, the binary as the
// entrypoint, the metrics port.
func TestDockerfile(t *testing.T) {
	const path = "../Dockerfile"
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("BuildKit cannot parse %s: %v", path, err)
	}
	for _, w := range res.Warnings {
		t.Errorf("parser warning: %s", w.Short)
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	args := map[string]string{}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				args[kv.Key] = *kv.Value
			}
		}
	}
	lex := shell.NewLex('\\')
	expand := func(s string) string {
		out, _, err := lex.ProcessWord(s, shell.EnvsFromSlice(envList(args)))
		if err != nil {
			t.Fatalf("expanding %q: %v", s, err)
		}
		return out
	}
	if len(stages) != 3 {
		t.Fatalf("want 3 stages (build, glibc, runtime), have %d", len(stages))
	}
	build, glibcStage, runtime := stages[0], stages[1], stages[2]
	if got := expand(build.BaseName); got != "golang:1.26-bookworm" || build.Name != "build" {
		t.Errorf("build stage %q FROM %s, want build FROM golang:1.26-bookworm", build.Name, got)
	}
	// The runtime is scratch plus the C library the glibc stage takes from
	// Debian's libc6 with packaging/release/rootfs.sh, the script `make
	// release` runs too (TestReleaseImage runs what it makes).
	if got := expand(runtime.BaseName); got != "scratch" {
		t.Errorf("runtime FROM %s, want scratch", got)
	}
	var rootfs bool
	for _, c := range glibcStage.Commands {
		if r, ok := c.(*instructions.RunCommand); ok && strings.Contains(strings.Join(r.CmdLine, " "), "apt-get download -q libc6") &&
			strings.Contains(strings.Join(r.CmdLine, " "), "/rootfs.sh /rootfs") {
			rootfs = true
		}
	}
	if glibcStage.Name != "glibc" || !rootfs {
		t.Errorf("stage %q does not make /rootfs from libc6 with packaging/release/rootfs.sh", glibcStage.Name)
	}

	var makeBuild bool
	for _, c := range build.Commands {
		if r, ok := c.(*instructions.RunCommand); ok && strings.Contains(strings.Join(r.CmdLine, " "), "make build") {
			makeBuild = true
		}
	}
	if !makeBuild {
		t.Error("the build stage does not run `make build` (the Makefile sets cgo and the version)")
	}
	if mk, err := os.ReadFile("../../Makefile"); err != nil || !strings.Contains(string(mk), "CGO_ENABLED := 1") {
		t.Errorf("the Makefile no longer builds with cgo (%v)", err)
	}

	env := map[string]string{}
	var entrypoint, user string
	var exposed []string
	var copied []string
	for _, c := range runtime.Commands {
		switch c := c.(type) {
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env[kv.Key] = kv.Value
			}
		case *instructions.EntrypointCommand:
			entrypoint = strings.Join(c.CmdLine, " ")
		case *instructions.UserCommand:
			user = c.User
		case *instructions.ExposeCommand:
			exposed = append(exposed, c.Ports...)
		case *instructions.CopyCommand:
			for _, src := range c.SourcePaths {
				copied = append(copied, c.From+":"+src)
				if c.From == "" {
					if _, err := os.Stat(filepath.Join("../..", src)); err != nil {
						t.Errorf("COPY %s: not in the repository: %v", src, err)
					}
				}
			}
		case *instructions.RunCommand:
			t.Errorf("the runtime stage runs %v: it should only copy the binary", c.CmdLine)
		}
	}
	if env["NVIDIA_VISIBLE_DEVICES"] != "all" || env["NVIDIA_DRIVER_CAPABILITIES"] != "utility" {
		t.Errorf("runtime env %v, want NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility", env)
	}
	if entrypoint != "/usr/bin/mig-agent" {
		t.Errorf("ENTRYPOINT %q, want /usr/bin/mig-agent", entrypoint)
	}
	if user != "0:0" && user != "0" && user != "root" {
		t.Errorf("USER %q: NVML mutations need root", user)
	}
	if !slices.Contains(exposed, "9478") {
		t.Errorf("EXPOSE %v, want the metrics port 9478", exposed)
	}
	if !slices.Contains(copied, "build:/src/bin/mig-agent") || !slices.Contains(copied, "glibc:/rootfs/") {
		t.Errorf("the runtime stage copies %v, not the binary from the build stage and the C library from the glibc stage", copied)
	}
	// No NVML or CUDA in the image: the toolkit injects the host's.
	raw, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(raw), "\n") {
		if code := strings.TrimSpace(line); !strings.HasPrefix(code, "#") {
			for _, bad := range []string{"libnvidia", "nvidia-utils", "cuda", "nvidia-ml"} {
				if strings.Contains(strings.ToLower(code), bad) {
					t.Errorf("the image must not bring its own NVML/CUDA: %s", code)
				}
			}
		}
	}
}

func envList(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

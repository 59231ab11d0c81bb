package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The real Dockerfile's runtime stage, as the release builds it.
func TestReadRecipeDockerfile(t *testing.T) {
	r, err := readRecipe("../..", map[string]string{"VERSION": "1.2.3", "COMMIT": "abc1234"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Labels["org.opencontainers.image.version"] != "1.2.3" || r.Labels["org.opencontainers.image.revision"] != "abc1234" ||
		r.Labels["org.opencontainers.image.source"] != "https://github.com/migagent/mig-agent" ||
		r.Labels["org.opencontainers.image.licenses"] != "Apache-2.0" {
		t.Errorf("labels %v", r.Labels)
	}
	if !slices.Equal(r.Env, []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"}) {
		t.Errorf("env %v", r.Env)
	}
	if !slices.Equal(r.Entrypoint, []string{"/usr/bin/mig-agent"}) || !slices.Equal(r.Cmd, []string{"run"}) || r.User != "0:0" || !slices.Equal(r.Ports, []string{"9478"}) {
		t.Errorf("recipe %+v", r)
	}
	var froms []string
	for _, c := range r.Copies {
		froms = append(froms, c.From)
	}
	if !slices.Equal(froms, []string{"glibc", "build", "", ""}) {
		t.Errorf("copies from %q", froms)
	}
}

// An instruction the builder cannot apply fails the release instead of
// being dropped: the image would differ from what Docker builds.
func TestReadRecipeRefuses(t *testing.T) {
	for _, stage := range []string{
		"FROM scratch\nRUN echo hi\n",
		"FROM scratch\nENTRYPOINT /usr/bin/mig-agent\n",
		"FROM scratch\nCOPY --chmod=700 a /a\n",
		"FROM debian:bookworm\nENV A=b\n",
		"FROM scratch\nHEALTHCHECK CMD [\"/x\"]\n",
	} {
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "packaging"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dockerfilePath), []byte(stage), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readRecipe(root, nil); !errors.Is(err, errRecipe) {
			t.Errorf("%q: error %v, want errRecipe", stage, err)
		}
	}
}

// packageChart replaces links by their files, sets both versions and
// honours .helmignore.
func TestPackageChart(t *testing.T) {
	src := filepath.Join(t.TempDir(), "c")
	shared := filepath.Join(t.TempDir(), "rbac.yaml")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "files"), 0o755))
	must(os.WriteFile(filepath.Join(src, "Chart.yaml"), []byte("apiVersion: v2\nname: c\nversion: 0.1.0\nappVersion: \"0.1.0\"\n"), 0o644))
	must(os.WriteFile(filepath.Join(src, ".helmignore"), []byte("# x\n*.bak\n"), 0o644))
	must(os.WriteFile(filepath.Join(src, "old.bak"), []byte("x"), 0o644))
	must(os.WriteFile(shared, []byte("kind: ClusterRole\n"), 0o644))
	must(os.Symlink(shared, filepath.Join(src, "files", "rbac.yaml")))
	out, err := packageChart(src, "2.0.0", t.TempDir())
	must(err)
	if filepath.Base(out) != "c-2.0.0.tgz" {
		t.Errorf("wrote %s", out)
	}
	f, err := os.Open(out)
	must(err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	must(err)
	tr := tar.NewReader(zr)
	got := map[string]string{}
	var order []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		if h.Typeflag != tar.TypeReg {
			t.Errorf("%s: type %c, want a regular file", h.Name, h.Typeflag)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(b)
		order = append(order, h.Name)
	}
	if !slices.Equal(order, []string{"c/Chart.yaml", "c/files/rbac.yaml"}) {
		t.Errorf("entries %v", order)
	}
	if !strings.Contains(got["c/Chart.yaml"], "version: 2.0.0\n") || !strings.Contains(got["c/Chart.yaml"], `appVersion: "2.0.0"`) {
		t.Errorf("Chart.yaml:\n%s", got["c/Chart.yaml"])
	}
	if got["c/files/rbac.yaml"] != "kind: ClusterRole\n" {
		t.Errorf("the link's file: %q", got["c/files/rbac.yaml"])
	}
}

// The SBOM of this test binary lists its main module and the stdlib.
func TestSBOM(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "x.spdx.json")
	if err := writeSBOM(exe, "1.0.0", dst); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(dst)
	for _, w := range []string{`"spdxVersion": "SPDX-2.3"`, `"name": "stdlib"`, `"SPDXRef-Binary-mig-agent"`, `"relationshipType": "DESCRIBES"`, `"licenseDeclared": "Apache-2.0"`} {
		if !strings.Contains(string(b), w) {
			t.Errorf("SBOM lacks %s", w)
		}
	}
}

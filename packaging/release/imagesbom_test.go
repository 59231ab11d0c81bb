package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
)

// The image SBOM names the Debian packages of the image's dpkg status
// entries with their versions and purls, and the agent binary.
func TestImageSBOM(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "var", "lib", "dpkg", "status.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := "Package: libc6\nStatus: install ok installed\nSource: glibc\nVersion: 2.36-9+deb12u14\nArchitecture: arm64\nDescription: GNU C Library: Shared libraries\n Contains the standard libraries.\n"
	if err := os.WriteFile(filepath.Join(dir, "libc6"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	debs, err := readStatusD(root)
	if err != nil || len(debs) != 1 || debs[0] != (debPackage{Name: "libc6", Version: "2.36-9+deb12u14", Arch: "arm64", Source: "glibc"}) {
		t.Fatalf("status entries %+v (%v)", debs, err)
	}
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "mig-agent")
	if err := os.WriteFile(bin, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(root, "sbom.json")
	if err := writeImageSBOM(img, "ghcr.io/migagent/mig-agent", "1.2.3", "arm64", bin, debs, dst); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(dst)
	for _, w := range []string{`"name": "libc6"`, `"versionInfo": "2.36-9+deb12u14"`, "pkg:deb/debian/libc6@2.36-9+deb12u14?arch=arm64",
		"pkg:golang/github.com/migagent/mig-agent@v1.2.3", "pkg:oci/mig-agent@sha256%3A", "/usr/share/doc/libc6/copyright", `"spdxVersion": "SPDX-2.3"`} {
		if !strings.Contains(string(data), w) {
			t.Errorf("the image SBOM lacks %s:\n%s", w, data)
		}
	}
}

package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The image's SBOM, one per platform (mig-agent_V_image_linux_ARCH.spdx.json):
// what the image carries that scanners and lawyers ask about. The agent
// binary (its Go modules are in the binary's own SBOM), and each Debian
// package its C library comes from, with its version and purl, read from
// the dpkg status entries rootfs.sh writes into the image
// (/var/lib/dpkg/status.d/PACKAGE, where the image also carries the
// package's copyright notice, /usr/share/doc/PACKAGE/copyright).

// debPackage is one dpkg status entry of the image.
type debPackage struct {
	Name, Version, Arch, Source string
}

// readStatusD reads the dpkg status entries under root/var/lib/dpkg/status.d.
func readStatusD(root string) ([]debPackage, error) {
	dir := filepath.Join(root, "var", "lib", "dpkg", "status.d")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("image: the dpkg status entries: %w", err)
	}
	var pkgs []debPackage
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		fields := map[string]string{}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ": "); ok && !strings.HasPrefix(k, " ") {
				fields[k] = v
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("image: %s: %w", e.Name(), err)
		}
		p := debPackage{Name: fields["Package"], Version: fields["Version"], Arch: fields["Architecture"], Source: fields["Source"]}
		if p.Name == "" || p.Version == "" || p.Arch == "" {
			return nil, fmt.Errorf("image: the dpkg status entry %s has no Package, Version or Architecture", e.Name())
		}
		pkgs = append(pkgs, p)
	}
	slices.SortFunc(pkgs, func(a, b debPackage) int { return strings.Compare(a.Name, b.Name) })
	return pkgs, nil
}

// debDistro is the purl qualifier of the distribution the Debian packages
// come from (apt-get download on the release host: its sources),
// "debian-12", from /etc/os-release; "" where it does not say.
func debDistro() string {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return ""
	}
	var id, ver string
	for l := range strings.Lines(string(data)) {
		k, v, _ := strings.Cut(strings.TrimSpace(l), "=")
		v = strings.Trim(v, `"`)
		switch k {
		case "ID":
			id = v
		case "VERSION_ID":
			ver = v
		}
	}
	if id != "debian" || ver == "" {
		return ""
	}
	return id + "-" + ver
}

// debPurl is a Debian package's purl (pkg:deb/debian/NAME@VERSION?arch=ARCH&distro=D).
func debPurl(p debPackage, distro string) string {
	q := url.Values{"arch": {p.Arch}}
	if distro != "" {
		q.Set("distro", distro)
	}
	return "pkg:deb/debian/" + p.Name + "@" + url.PathEscape(p.Version) + "?" + q.Encode()
}

// writeImageSBOM writes the SPDX 2.3 SBOM of one platform's image (img,
// pushed as repo) to dst: the image, the agent binary at bin, the Debian
// packages debs.
func writeImageSBOM(img v1.Image, repo, version, arch, bin string, debs []debPackage, dst string) error {
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	binSum := sha256.Sum256(data)
	name := fmt.Sprintf("mig-agent_%s_image_linux_%s", version, arch)
	imgID, binID := "SPDXRef-Image-mig-agent", "SPDXRef-Binary-mig-agent"
	doc := spdxDoc{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: name,
		DocumentNamespace: "https://github.com/migagent/mig-agent/spdx/" + name + "-" + digest.Hex[:16],
		CreationInfo:      spdxCreation{Created: sourceDate().UTC().Format(time.RFC3339), Creators: []string{"Tool: mig-agent packaging/release"}},
		DocumentDescribes: []string{imgID},
	}
	q := url.Values{"arch": {arch}, "repository_url": {repo}, "tag": {version}}
	doc.Packages = append(doc.Packages, spdxPackage{
		Name: "mig-agent image linux/" + arch, SPDXID: imgID, VersionInfo: version, DownloadLocation: "NOASSERTION",
		Checksums:    []spdxChecksum{{Algorithm: "SHA256", Value: digest.Hex}},
		ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:oci/mig-agent@" + strings.ReplaceAll(digest.String(), ":", "%3A") + "?" + q.Encode()}},
		Comment:      "the image's manifest digest",
	}, spdxPackage{
		Name: "mig-agent", SPDXID: binID, VersionInfo: version, DownloadLocation: "NOASSERTION", LicenseDeclared: projectLicense,
		Checksums:    []spdxChecksum{{Algorithm: "SHA256", Value: hex.EncodeToString(binSum[:])}},
		ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/github.com/migagent/mig-agent@v" + version}},
		Comment:      fmt.Sprintf("/usr/bin/mig-agent; its Go modules: mig-agent_%s_linux_%s.spdx.json", version, arch),
	})
	doc.Relationships = append(doc.Relationships,
		spdxRelationship{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: imgID},
		spdxRelationship{Element: imgID, Type: "CONTAINS", Related: binID})
	distro := debDistro()
	for _, p := range debs {
		id := "SPDXRef-Deb-" + strings.TrimPrefix(spdxID(p.Name+"-"+p.Arch), "SPDXRef-Package-")
		comment := fmt.Sprintf("Debian package; dpkg status /var/lib/dpkg/status.d/%s; copyright /usr/share/doc/%s/copyright", p.Name, p.Name)
		if p.Source != "" {
			comment += "; built from the source package " + p.Source
		}
		doc.Packages = append(doc.Packages, spdxPackage{
			Name: p.Name, SPDXID: id, VersionInfo: p.Version, DownloadLocation: "NOASSERTION", LicenseDeclared: "NOASSERTION",
			ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: debPurl(p, distro)}},
			Comment:      comment,
		})
		doc.Relationships = append(doc.Relationships, spdxRelationship{Element: imgID, Type: "CONTAINS", Related: id})
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // the purls' & as it is
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	return os.WriteFile(dst, out.Bytes(), 0o644)
}

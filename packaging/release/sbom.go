package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// SPDX 2.3 JSON (spdx.github.io/spdx-spec/v2.3), the fields this SBOM uses.
type spdxDoc struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreation       `json:"creationInfo"`
	DocumentDescribes []string           `json:"documentDescribes"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

// projectLicense is the SPDX identifier of the repository's LICENSE; the
// dependencies' licences are left unasserted (their modules state them).
const projectLicense = "Apache-2.0"

type spdxPackage struct {
	Name             string         `json:"name"`
	SPDXID           string         `json:"SPDXID"`
	VersionInfo      string         `json:"versionInfo"`
	DownloadLocation string         `json:"downloadLocation"`
	FilesAnalyzed    bool           `json:"filesAnalyzed"`
	LicenseDeclared  string         `json:"licenseDeclared,omitempty"`
	Checksums        []spdxChecksum `json:"checksums,omitempty"`
	ExternalRefs     []spdxRef      `json:"externalRefs,omitempty"`
	Comment          string         `json:"comment,omitempty"`
}

type spdxChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// spdxID makes an SPDX identifier (letters, digits, '.', '-') of s.
func spdxID(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return "SPDXRef-Package-" + b.String()
}

// writeSBOM writes an SPDX document of the Go modules linked into bin, as
// its build information lists them (what `go version -m` prints): the
// binary itself, the main module at the release version, every dependency
// with its version and go.sum hash, and the Go standard library.
func writeSBOM(bin, version, dst string) error {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("reading the build information of %s: %w", bin, err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	sum := sha256.Sum256(data)
	var goos, goarch string
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	name := fmt.Sprintf("mig-agent_%s_%s_%s", version, goos, goarch)
	epoch := time.Unix(0, 0).UTC()
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		var sec int64
		if _, err := fmt.Sscan(v, &sec); err == nil {
			epoch = time.Unix(sec, 0).UTC()
		}
	}
	binID := "SPDXRef-Binary-mig-agent"
	doc := spdxDoc{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: name,
		DocumentNamespace: "https://github.com/migagent/mig-agent/spdx/" + name + "-" + hex.EncodeToString(sum[:8]),
		CreationInfo:      spdxCreation{Created: epoch.Format(time.RFC3339), Creators: []string{"Tool: mig-agent packaging/release"}},
		DocumentDescribes: []string{binID},
	}
	doc.Packages = append(doc.Packages, spdxPackage{
		Name: filepath.Base(bin), SPDXID: binID, VersionInfo: version, DownloadLocation: "NOASSERTION",
		LicenseDeclared: projectLicense,
		Checksums:       []spdxChecksum{{Algorithm: "SHA256", Value: hex.EncodeToString(sum[:])}},
		Comment:         fmt.Sprintf("built with %s for %s/%s", info.GoVersion, goos, goarch),
	})
	add := func(path, ver, h1 string) {
		id := spdxID(path)
		p := spdxPackage{
			Name: path, SPDXID: id, VersionInfo: ver, DownloadLocation: "NOASSERTION",
			ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/" + path + "@" + ver}},
		}
		if h1 != "" {
			p.Comment = "go.sum " + h1
		}
		if path == info.Main.Path {
			p.LicenseDeclared = projectLicense
		}
		doc.Packages = append(doc.Packages, p)
		rel := "DEPENDS_ON"
		if path == info.Main.Path {
			rel = "CONTAINS"
		}
		doc.Relationships = append(doc.Relationships, spdxRelationship{Element: binID, Type: rel, Related: id})
	}
	doc.Relationships = append(doc.Relationships, spdxRelationship{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: binID})
	add(info.Main.Path, "v"+version, "")
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		add(d.Path, d.Version, d.Sum)
	}
	add("stdlib", info.GoVersion, "")
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	if err := os.WriteFile(dst, append(out, '\n'), 0o644); err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	return nil
}

package main

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestPushRelease: `make push` into a registry served in process (over
// plain HTTP on loopback, as a local registry is), then everything pulled
// back. The image: the index under the tag with the layout's digest, each
// platform pulled by its platform with the digest the index names and a
// config that reads as that platform's; no index wrapped in another. The
// chart: helm's media types, the .tgz byte for byte, its metadata in the
// config. With MIG_AGENT_DIST and MIG_AGENT_RELEASE_VERSION (make
// release-test) it pushes that release; otherwise one made here of random
// images and the repository's chart.
func TestPushRelease(t *testing.T) {
	dist, version := os.Getenv("MIG_AGENT_DIST"), os.Getenv("MIG_AGENT_RELEASE_VERSION")
	if dist == "" || version == "" {
		dist, version = t.TempDir(), "0.9.0"
		fakeRelease(t, dist, version)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(discardLogger())))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	p, err := pushRelease(dist, host, version)
	if err != nil {
		t.Fatal(err)
	}
	want, err := releaseIndex(filepath.Join(dist, "mig-agent_"+version+"_image.oci.tar"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wantDigest, _ := want.Digest()
	wantManifest, _ := want.IndexManifest()

	ref, err := name.ParseReference(ImageRef(host, version))
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != wantDigest || !desc.MediaType.IsIndex() || p.ImageDigest != wantDigest.String() {
		t.Fatalf("pulled %s (%s), want the layout's index %s", desc.Digest, desc.MediaType, wantDigest)
	}
	if len(wantManifest.Manifests) != 2 {
		t.Fatalf("the release's index has %d manifests, want amd64 and arm64", len(wantManifest.Manifests))
	}
	for _, m := range wantManifest.Manifests {
		if m.MediaType.IsIndex() || m.Platform == nil {
			t.Fatalf("index entry %s: %s, platform %v: an index in the index", m.Digest, m.MediaType, m.Platform)
		}
		img, err := remote.Image(ref, remote.WithPlatform(*m.Platform))
		if err != nil {
			t.Fatalf("pulling %s: %v", m.Platform, err)
		}
		d, _ := img.Digest()
		cf, err := img.ConfigFile()
		if d != m.Digest || err != nil || cf.Architecture != m.Platform.Architecture || cf.OS != "linux" {
			t.Errorf("%s: pulled %s, want %s; config %v: %s/%s", m.Platform, d, m.Digest, err, cf.OS, cf.Architecture)
		}
		layers, _ := img.Layers()
		for _, l := range layers {
			if err := pullLayer(l); err != nil {
				t.Errorf("%s: a layer does not pull: %v", m.Platform, err)
			}
		}
	}

	tgz, err := os.ReadFile(filepath.Join(dist, "mig-agent-"+version+".tgz"))
	if err != nil {
		t.Fatal(err)
	}
	cref, _ := name.ParseReference(ChartRef(host, version))
	if p.Chart != "oci://"+host+"/charts/mig-agent" {
		t.Errorf("chart pushed as %q", p.Chart)
	}
	chart, err := remote.Image(cref)
	if err != nil {
		t.Fatal(err)
	}
	m, err := chart.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != HelmConfigMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != HelmChartLayerMediaType ||
		m.MediaType != types.OCIManifestSchema1 {
		t.Fatalf("chart manifest %+v", m)
	}
	config, err := chart.RawConfigFile()
	if err != nil || !strings.Contains(string(config), `"name":"mig-agent"`) || !strings.Contains(string(config), `"version":"`+version+`"`) {
		t.Errorf("chart config %s (%v)", config, err)
	}
	layers, _ := chart.Layers()
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, tgz) {
		t.Errorf("the chart pulled back is %d bytes, not the release's .tgz (%d)", len(got), len(tgz))
	}
}

// pullLayer reads a pulled layer whole (go-containerregistry checks its
// digest at the end) and lets its connection go.
func pullLayer(l v1.Layer) error {
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	return err
}

// A REGISTRY with a scheme, and a release without its index, fail with
// what is wrong.
func TestPushReleaseRefuses(t *testing.T) {
	if _, err := pushRelease(t.TempDir(), "http://localhost:5000", "1.0.0"); err == nil || !strings.Contains(err.Error(), "no scheme") {
		t.Errorf("a registry with a scheme: %v", err)
	}
	if _, err := pushRelease(t.TempDir(), "localhost:5000", "1.0.0"); err == nil || !strings.Contains(err.Error(), "mig-agent_1.0.0_image.oci.tar") {
		t.Errorf("no release: %v", err)
	}
}

// fakeRelease writes what make push reads into dist: an OCI-layout tar of
// an index of two random images, laid out as buildImage lays it out, and
// the repository's chart packaged as make release packages it.
func fakeRelease(t *testing.T, dist, version string) {
	t.Helper()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := random.Image(512, 2)
		if err != nil {
			t.Fatal(err)
		}
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})); err != nil {
		t.Fatal(err)
	}
	if err := tarDir(dir, filepath.Join(dist, "mig-agent_"+version+"_image.oci.tar")); err != nil {
		t.Fatal(err)
	}
	if _, err := packageChart("../helm/mig-agent", version, dist); err != nil {
		t.Fatal(err)
	}
}

// discardLogger keeps the registry's request log out of the test output.
func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

package test

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"helm.sh/helm/v4/pkg/registry"
)

// TestReleasePush: `make push` (the release tool's push, as the Makefile
// runs it) into a registry served in process, then the chart pulled back by
// helm's own registry client, as `helm install oci://…` pulls it: the
// release's .tgz byte for byte, its name and version read from the
// artifact. (packaging/release's TestPushRelease pulls each image platform
// back.) The pulled chart is then installed into a real API server.
func TestReleasePush(t *testing.T) {
	dist, v := releaseDist(t)
	srv := httptest.NewServer(ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	out := run(t, filepath.Join(dist, ".build", "release-tool"), "push", "-dist", dist, "-registry", host, "-version", v)
	if want := fmt.Sprintf("pushed the chart oci://%s/charts/mig-agent --version %s", host, v); !strings.Contains(out, want) {
		t.Errorf("make push says:\n%s\nwant %q", out, want)
	}
	c, err := registry.NewClient(registry.ClientOptPlainHTTP())
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Pull(fmt.Sprintf("%s/charts/mig-agent:%s", host, v))
	if err != nil {
		t.Fatalf("helm's client pulling the chart: %v", err)
	}
	tgz, err := os.ReadFile(filepath.Join(dist, fmt.Sprintf("mig-agent-%s.tgz", v)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Chart.Data, tgz) || r.Chart.Meta == nil || r.Chart.Meta.Name != "mig-agent" || r.Chart.Meta.Version != v || r.Chart.Meta.AppVersion != v {
		t.Errorf("helm pulled %d bytes (the release's .tgz: %d), metadata %+v", len(r.Chart.Data), len(tgz), r.Chart.Meta)
	}
	installPulledChart(t, r.Chart.Data, v)
}

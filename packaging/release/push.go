package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// `make push REGISTRY=host:port VERSION=x.y.z` (release push): the release's
// image index as REGISTRY/mig-agent:VERSION, every platform and the index
// itself under the digests the OCI layout holds, and the chart as the OCI
// artifact `helm push` makes, REGISTRY/charts/mig-agent:VERSION, which
// `helm install oci://REGISTRY/charts/mig-agent --version VERSION` installs.
// go-containerregistry speaks the registry protocol (and its auth: the
// Docker config's credentials); a loopback registry is spoken to over
// plain HTTP, any other over HTTPS.

// Helm's media types for a chart in an OCI registry (helm's
// pkg/registry/constants.go).
const (
	HelmConfigMediaType     types.MediaType = "application/vnd.cncf.helm.config.v1+json"
	HelmChartLayerMediaType types.MediaType = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// errPush: what make push needs is missing or not what make release writes.
var errPush = errors.New("push")

// pushed is where push put the release: the references, by tag and by
// digest.
type pushed struct {
	Image, ImageDigest string
	Chart, ChartDigest string
}

// ImageRef and ChartRef are the references push writes for registry and
// version: REGISTRY/mig-agent:VERSION and REGISTRY/charts/mig-agent:VERSION.
func ImageRef(registry, version string) string { return registry + "/mig-agent:" + version }
func ChartRef(registry, version string) string { return registry + "/charts/mig-agent:" + version }

// pushRelease pushes the image index and the chart of the release in dist.
func pushRelease(dist, registry, version string, opts ...remote.Option) (pushed, error) {
	var p pushed
	if registry == "" || strings.Contains(registry, "://") || strings.HasSuffix(registry, "/") {
		return p, fmt.Errorf("%w: REGISTRY %q: want host[:port][/path], no scheme", errPush, registry)
	}
	opts = append([]remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	tmp, err := os.MkdirTemp("", "mig-agent-push-")
	if err != nil {
		return p, err
	}
	defer os.RemoveAll(tmp)
	idx, err := releaseIndex(filepath.Join(dist, "mig-agent_"+version+"_image.oci.tar"), tmp)
	if err != nil {
		return p, err
	}
	ref, err := name.ParseReference(ImageRef(registry, version))
	if err != nil {
		return p, fmt.Errorf("%w: %w", errPush, err)
	}
	if err := remote.WriteIndex(ref, idx, opts...); err != nil {
		return p, fmt.Errorf("%w: the image index to %s: %w", errPush, ref, err)
	}
	d, _ := idx.Digest()
	p.Image, p.ImageDigest = ref.String(), d.String()

	tgz, err := os.ReadFile(filepath.Join(dist, "mig-agent-"+version+".tgz"))
	if err != nil {
		return p, fmt.Errorf("%w: the chart: %w", errPush, err)
	}
	chart, err := chartArtifact(tgz)
	if err != nil {
		return p, err
	}
	cref, err := name.ParseReference(ChartRef(registry, version))
	if err != nil {
		return p, fmt.Errorf("%w: %w", errPush, err)
	}
	if err := remote.Write(cref, chart, opts...); err != nil {
		return p, fmt.Errorf("%w: the chart to %s: %w", errPush, cref, err)
	}
	cd, _ := chart.Digest()
	p.Chart, p.ChartDigest = "oci://"+cref.Context().String(), cd.String()
	return p, nil
}

// releaseIndex reads the image index out of the release's OCI-layout tar:
// the one manifest its index.json names (an image index of the platforms).
// That index is what is pushed, not the layout's index.json, which only
// points to it (pushing that one would wrap the index in another). The
// layout is unpacked into dir, where its blobs are read from while the
// index is used.
func releaseIndex(tarPath, dir string) (v1.ImageIndex, error) {
	if err := untar(tarPath, dir); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errPush, tarPath, err)
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not an OCI layout: %w", errPush, tarPath, err)
	}
	outer, err := lp.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errPush, tarPath, err)
	}
	m, err := outer.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errPush, tarPath, err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("%w: %s: index.json names %d manifests, want the one image index make release writes", errPush, tarPath, len(m.Manifests))
	}
	return outer.ImageIndex(m.Manifests[0].Digest)
}

// untar unpacks the regular files and directories of the tar at src into
// dir; any other entry, or a path that leaves dir, is an error.
func untar(src, dir string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		rel := path.Clean(h.Name)
		if rel == ".." || strings.HasPrefix(rel, "../") || path.IsAbs(rel) {
			return fmt.Errorf("entry %q leaves the layout", h.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			out, err := os.Create(dst)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if err2 := out.Close(); err == nil {
				err = err2
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q is not a file or a directory", h.Name)
		}
	}
}

// chartMeta are the Chart.yaml fields helm puts in the chart's OCI config
// (chart.Metadata as JSON), read from the packaged chart's top-level
// scalars.
var chartMetaRe = regexp.MustCompile(`(?m)^(apiVersion|name|version|appVersion|type|kubeVersion|home):[ \t]*(.*?)[ \t]*$`)

// chartArtifact is the chart .tgz as the OCI artifact helm pushes: a
// manifest with the config application/vnd.cncf.helm.config.v1+json (the
// chart's metadata) and one layer application/vnd.cncf.helm.chart.content.v1.tar+gzip
// (the .tgz, byte for byte).
func chartArtifact(tgz []byte) (v1.Image, error) {
	chartYAML, err := chartFile(tgz, "Chart.yaml")
	if err != nil {
		return nil, fmt.Errorf("%w: the chart: %w", errPush, err)
	}
	meta := map[string]string{}
	for _, m := range chartMetaRe.FindAllSubmatch(chartYAML, -1) {
		meta[string(m[1])] = strings.Trim(string(m[2]), `"'`)
	}
	if meta["name"] == "" || meta["version"] == "" {
		return nil, fmt.Errorf("%w: the chart's Chart.yaml has no name or version", errPush)
	}
	config, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	layer := static.NewLayer(tgz, HelmChartLayerMediaType)
	return partial.CompressedToImage(&chartImage{config: config, layer: layer, meta: meta})
}

// chartFile is the file NAME/file of the chart .tgz (NAME: its one top
// directory).
func chartFile(tgz []byte, file string) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("no %s in the archive", file)
		}
		if err != nil {
			return nil, err
		}
		if _, rest, ok := strings.Cut(h.Name, "/"); ok && rest == file {
			return io.ReadAll(tr)
		}
	}
}

// chartImage is the chart artifact for go-containerregistry
// (partial.CompressedImageCore): its raw config, its manifest, its layer.
type chartImage struct {
	config []byte
	layer  v1.Layer
	meta   map[string]string
}

var _ partial.CompressedImageCore = (*chartImage)(nil)

func (c *chartImage) RawConfigFile() ([]byte, error) { return c.config, nil }

func (c *chartImage) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

func (c *chartImage) manifest() (*v1.Manifest, error) {
	ld, err := c.layer.Digest()
	if err != nil {
		return nil, err
	}
	size, err := c.layer.Size()
	if err != nil {
		return nil, err
	}
	cd, csize, err := v1.SHA256(bytes.NewReader(c.config))
	if err != nil {
		return nil, err
	}
	return &v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        v1.Descriptor{MediaType: HelmConfigMediaType, Digest: cd, Size: csize},
		Layers:        []v1.Descriptor{{MediaType: HelmChartLayerMediaType, Digest: ld, Size: size}},
		Annotations: map[string]string{
			"org.opencontainers.image.title":   c.meta["name"],
			"org.opencontainers.image.version": c.meta["version"],
		},
	}, nil
}

func (c *chartImage) RawManifest() ([]byte, error) {
	m, err := c.manifest()
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func (c *chartImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if d, err := c.layer.Digest(); err == nil && d == h {
		return c.layer, nil
	}
	if cd, _, err := v1.SHA256(bytes.NewReader(c.config)); err == nil && cd == h {
		return static.NewLayer(c.config, HelmConfigMediaType), nil
	}
	return nil, fmt.Errorf("chart artifact: no blob %s", h)
}

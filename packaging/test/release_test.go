package test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
)

// The release tests run each artifact of a `make release` (make
// release-test builds one and points MIG_AGENT_DIST at it). Without a
// release to test they skip: building one takes minutes.
var releaseArches = []struct{ goarch, debArch, rpmArch, qemu string }{
	{"amd64", "amd64", "x86_64", ""},
	{"arm64", "arm64", "aarch64", "qemu-aarch64-static"},
}

// glibcFloor: the newest glibc symbol version a shipped binary may need
// (RHEL 8's glibc; Ubuntu 20.04 has 2.31, Debian 10 2.28).
const glibcFloor = "2.28"

func releaseDist(t *testing.T) (dist, version string) {
	t.Helper()
	dist, version = os.Getenv("MIG_AGENT_DIST"), os.Getenv("MIG_AGENT_RELEASE_VERSION")
	if dist == "" || version == "" {
		t.Skip("no release to test: make release-test sets MIG_AGENT_DIST and MIG_AGENT_RELEASE_VERSION")
	}
	return dist, version
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// TestReleaseArtifacts: dist/ holds every artifact under its name, and
// SHA256SUMS lists each with its digest.
func TestReleaseArtifacts(t *testing.T) {
	dist, v := releaseDist(t)
	want := []string{fmt.Sprintf("mig-agent_%s_image.oci.tar", v), fmt.Sprintf("mig-agent-%s.tgz", v)}
	for _, a := range releaseArches {
		want = append(want,
			fmt.Sprintf("mig-agent_%s_linux_%s.tar.gz", v, a.goarch),
			fmt.Sprintf("mig-agent_%s-1_%s.deb", v, a.debArch),
			fmt.Sprintf("mig-agent-%s-1.%s.rpm", v, a.rpmArch),
			fmt.Sprintf("mig-agent_%s_linux_%s.spdx.json", v, a.goarch),
			fmt.Sprintf("mig-agent_%s_image_linux_%s.spdx.json", v, a.goarch))
	}
	sums := map[string]string{}
	text, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(text)) {
		f := strings.Fields(l)
		if len(f) != 2 {
			t.Fatalf("SHA256SUMS line %q", l)
		}
		sums[f[1]] = f[0]
	}
	for _, name := range want {
		data, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Errorf("missing artifact: %v", err)
			continue
		}
		d := sha256.Sum256(data)
		if sums[name] != hex.EncodeToString(d[:]) {
			t.Errorf("SHA256SUMS has %q for %s, the file is %x", sums[name], name, d)
		}
		t.Logf("%-40s %9d bytes", name, len(data))
	}
	if len(sums) != len(want) {
		t.Errorf("SHA256SUMS lists %d files, want %d", len(sums), len(want))
	}
}

// extractTar unpacks a (gzipped) tar into dir as root would: modes,
// symlinks, no path leaving dir. It returns the entry names.
func extractTar(t *testing.T, r io.Reader, dir string) []string {
	t.Helper()
	tr := tar.NewReader(r)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+h.Name)))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode)&os.ModePerm); err != nil {
				t.Fatal(err)
			}
			_ = os.Chmod(p, os.FileMode(h.Mode)&os.ModePerm|modeSticky(h.Mode))
		case tar.TypeSymlink:
			_ = os.MkdirAll(filepath.Dir(p), 0o755)
			_ = os.Remove(p)
			if err := os.Symlink(h.Linkname, p); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			_ = os.MkdirAll(filepath.Dir(p), 0o755)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, os.FileMode(h.Mode)&os.ModePerm)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		default:
			t.Fatalf("%s: unexpected tar entry type %c", h.Name, h.Typeflag)
		}
	}
}

func modeSticky(m int64) os.FileMode {
	if m&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

func gunzip(t *testing.T, data []byte) io.Reader {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return zr
}

// glibcMax: the newest GLIBC_ symbol version among bin's dynamic symbols.
func glibcMax(t *testing.T, bin string) string {
	t.Helper()
	vs := regexp.MustCompile(`GLIBC_([0-9.]+)`).FindAllStringSubmatch(run(t, "llvm-objdump", "-T", bin), -1)
	if len(vs) == 0 {
		t.Fatalf("%s: no GLIBC_ symbols (not a dynamic glibc binary?)", bin)
	}
	max := "0"
	for _, m := range vs {
		if versionLess(max, m[1]) {
			max = m[1]
		}
	}
	return max
}

func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			fmt.Sscan(as[i], &x)
		}
		if i < len(bs) {
			fmt.Sscan(bs[i], &y)
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// ociImage is one platform's image read from the OCI-layout tar.
type ociImage struct {
	arch   string
	config struct {
		Architecture string `json:"architecture"`
		Config       struct {
			Env          []string            `json:"Env"`
			Entrypoint   []string            `json:"Entrypoint"`
			Cmd          []string            `json:"Cmd"`
			User         string              `json:"User"`
			Labels       map[string]string   `json:"Labels"`
			ExposedPorts map[string]struct{} `json:"ExposedPorts"`
		} `json:"config"`
	}
	annotations map[string]string
	layers      [][]byte
}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

// readOCI reads the layout tar: index.json → the image index (one entry,
// named by the version) → a manifest per platform → config and layers.
func readOCI(t *testing.T, file, version string) (map[string]string, []ociImage) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[h.Name] = data
	}
	if !strings.Contains(string(files["oci-layout"]), `"imageLayoutVersion"`) {
		t.Fatalf("%s: no oci-layout file", file)
	}
	blob := func(d ociDescriptor) []byte {
		data, ok := files["blobs/"+strings.Replace(d.Digest, ":", "/", 1)]
		if !ok {
			t.Fatalf("blob %s missing", d.Digest)
		}
		if sum := sha256.Sum256(data); "sha256:"+hex.EncodeToString(sum[:]) != d.Digest || int64(len(data)) != d.Size {
			t.Fatalf("blob %s: digest or size does not match", d.Digest)
		}
		return data
	}
	var top struct{ Manifests []ociDescriptor }
	if err := json.Unmarshal(files["index.json"], &top); err != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d entries (want 1)", err, len(top.Manifests))
	}
	if top.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" || top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != version {
		t.Errorf("index.json entry %+v: want an image index named %s", top.Manifests[0], version)
	}
	var idx struct {
		Manifests   []ociDescriptor
		Annotations map[string]string
	}
	if err := json.Unmarshal(blob(top.Manifests[0]), &idx); err != nil {
		t.Fatal(err)
	}
	var imgs []ociImage
	for _, md := range idx.Manifests {
		var m struct {
			Config      ociDescriptor
			Layers      []ociDescriptor
			Annotations map[string]string
		}
		if err := json.Unmarshal(blob(md), &m); err != nil || md.Platform == nil {
			t.Fatalf("manifest %s: %v (platform %v)", md.Digest, err, md.Platform)
		}
		img := ociImage{arch: md.Platform.Architecture, annotations: m.Annotations}
		if err := json.Unmarshal(blob(m.Config), &img.config); err != nil {
			t.Fatal(err)
		}
		for _, l := range m.Layers {
			if l.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
				t.Errorf("layer media type %s", l.MediaType)
			}
			img.layers = append(img.layers, blob(l))
		}
		imgs = append(imgs, img)
	}
	return idx.Annotations, imgs
}

// TestReleaseImage unpacks each platform's root file system from the OCI
// tar and runs its entrypoint there: `version`, then a standalone change
// on a simulated GH200 (amd64 by chroot, arm64 by chroot through qemu).
func TestReleaseImage(t *testing.T) {
	dist, v := releaseDist(t)
	if os.Getuid() != 0 {
		t.Skip("chroot needs root")
	}
	idxAnn, imgs := readOCI(t, filepath.Join(dist, fmt.Sprintf("mig-agent_%s_image.oci.tar", v)), v)
	commit := idxAnn["org.opencontainers.image.revision"]
	if idxAnn["org.opencontainers.image.version"] != v || commit == "" || idxAnn["org.opencontainers.image.source"] != "https://github.com/migagent/mig-agent" {
		t.Errorf("index annotations %v", idxAnn)
	}
	var arches []string
	for _, img := range imgs {
		arches = append(arches, img.arch)
	}
	slices.Sort(arches)
	if !slices.Equal(arches, []string{"amd64", "arm64"}) {
		t.Fatalf("image index platforms %v, want amd64 and arm64", arches)
	}
	for _, img := range imgs {
		t.Run(img.arch, func(t *testing.T) {
			c := img.config.Config
			if img.config.Architecture != img.arch || !slices.Equal(c.Entrypoint, []string{"/usr/bin/mig-agent"}) || !slices.Equal(c.Cmd, []string{"run"}) || c.User != "0:0" {
				t.Errorf("config %+v", img.config)
			}
			for _, e := range []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"} {
				if !slices.Contains(c.Env, e) {
					t.Errorf("Env %v lacks %s", c.Env, e)
				}
			}
			if _, ok := c.ExposedPorts["9478/tcp"]; !ok || c.Labels["org.opencontainers.image.version"] != v || img.annotations["org.opencontainers.image.revision"] != commit {
				t.Errorf("ports %v, labels %v, annotations %v", c.ExposedPorts, c.Labels, img.annotations)
			}
			root := t.TempDir()
			for _, l := range img.layers {
				extractTar(t, gunzip(t, l), root)
			}
			size := 0
			for _, l := range img.layers {
				size += len(l)
			}
			t.Logf("%s: %d layers, %d bytes compressed", img.arch, len(img.layers), size)
			for _, f := range []string{"usr/share/mig-agent/examples/config.yaml", "usr/share/doc/mig-agent/LICENSE", "etc/passwd", "tmp"} {
				if _, err := os.Stat(filepath.Join(root, f)); err != nil {
					t.Errorf("image: %v", err)
				}
			}
			if _, err := os.Stat(filepath.Join(root, "bin/sh")); err == nil {
				t.Errorf("the image has a shell")
			}
			// What it carries, said where scanners look: glibc's dpkg status
			// entry and its copyright notice; only the libraries it loads.
			status, err := os.ReadFile(filepath.Join(root, "var/lib/dpkg/status.d/libc6"))
			if err != nil || !strings.Contains(string(status), "Package: libc6\n") || !strings.Contains(string(status), "Architecture: "+img.arch+"\n") ||
				!strings.Contains(string(status), "Status: install ok installed\n") || !regexp.MustCompile(`(?m)^Version: 2\.\d+-`).Match(status) {
				t.Errorf("dpkg status of libc6 in the image (%v):\n%s", err, status)
			}
			if c, err := os.ReadFile(filepath.Join(root, "usr/share/doc/libc6/copyright")); err != nil || !strings.Contains(string(c), "GNU Lesser General Public") {
				t.Errorf("glibc's copyright notice in the image: %v", err)
			}
			var libs []string
			_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err == nil && strings.Contains(d.Name(), ".so") {
					libs = append(libs, d.Name())
				}
				return nil
			})
			for _, l := range libs {
				if strings.HasPrefix(l, "libmemusage") || strings.HasPrefix(l, "libpcprofile") || strings.HasPrefix(l, "libSegFault") || strings.HasPrefix(l, "libthread_db") {
					t.Errorf("the image carries %s, which the agent never loads", l)
				}
			}
			t.Logf("%s: shared objects %v", img.arch, libs)
			sbom, err := os.ReadFile(filepath.Join(dist, fmt.Sprintf("mig-agent_%s_image_linux_%s.spdx.json", v, img.arch)))
			if err != nil || !regexp.MustCompile(`pkg:deb/debian/libc6@2\.\d+-[^?"]+\?arch=`+img.arch).Match(sbom) ||
				!strings.Contains(string(sbom), "pkg:golang/github.com/migagent/mig-agent@v"+v) {
				t.Errorf("the %s image SBOM does not name libc6 and the agent (%v)", img.arch, err)
			}
			entry := append([]string{root}, c.Entrypoint...)
			if img.arch != runtime.GOARCH {
				q, err := exec.LookPath("qemu-aarch64-static")
				if err != nil {
					t.Fatalf("qemu-aarch64-static: %v (make release-test installs qemu-user-static)", err)
				}
				data, _ := os.ReadFile(q)
				if err := os.WriteFile(filepath.Join(root, "qemu-static"), data, 0o755); err != nil {
					t.Fatal(err)
				}
				entry = append([]string{root, "/qemu-static"}, c.Entrypoint...)
			}
			out := run(t, "chroot", append(entry, "version")...)
			if !strings.Contains(out, "mig-agent "+v+"\n") || !strings.Contains(out, "commit: "+commit+"\n") || !strings.Contains(out, "platform: linux/"+img.arch+"\n") {
				t.Errorf("version in the %s image:\n%s", img.arch, out)
			}
			sim := []string{"--nvml", "sim:gh200x1", "--sim-state", "/tmp/sim.json"}
			run(t, "chroot", append(append(entry, "apply", "-c", "all-1g.12gb"), sim...)...)
			got := run(t, "chroot", append(append(entry, "export"), sim...)...)
			if !regexp.MustCompile(`1g\.12gb"?:\s*7\b`).MatchString(got) {
				t.Errorf("after the change, export in the %s image says:\n%s", img.arch, got)
			}
		})
	}
}

// TestReleaseBinaries: each archive holds the binary, README and LICENSE; each
// binary needs no glibc newer than the floor, and the arm64 one, under
// qemu-user, reports the same GH200 profiles as the amd64 one.
func TestReleaseBinaries(t *testing.T) {
	dist, v := releaseDist(t)
	libs := t.TempDir()
	// The arm64 C library for qemu: the image's own root file system.
	_, imgs := readOCI(t, filepath.Join(dist, fmt.Sprintf("mig-agent_%s_image.oci.tar", v)), v)
	for _, img := range imgs {
		if img.arch == "arm64" {
			for _, l := range img.layers {
				extractTar(t, gunzip(t, l), libs)
			}
		}
	}
	profiles := map[string]string{}
	for _, a := range releaseArches {
		t.Run(a.goarch, func(t *testing.T) {
			name := fmt.Sprintf("mig-agent_%s_linux_%s", v, a.goarch)
			data, err := os.ReadFile(filepath.Join(dist, name+".tar.gz"))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			entries := extractTar(t, gunzip(t, data), dir)
			for _, e := range []string{name + "/mig-agent", name + "/README.md", name + "/LICENSE"} {
				if !slices.Contains(entries, e) {
					t.Errorf("archive %v lacks %s", entries, e)
				}
			}
			bin := filepath.Join(dir, name, "mig-agent")
			if g := glibcMax(t, bin); versionLess(glibcFloor, g) {
				t.Errorf("%s needs GLIBC_%s, newer than GLIBC_%s", name, g, glibcFloor)
			} else {
				t.Logf("%s: newest glibc symbol GLIBC_%s", name, g)
			}
			if s := run(t, "llvm-objdump", "-h", bin); strings.Contains(s, ".symtab") || strings.Contains(s, ".debug_info") {
				t.Errorf("%s is not stripped", name)
			}
			cmd := []string{bin}
			if a.qemu != "" {
				cmd = []string{a.qemu, "-L", libs, bin}
			}
			out := run(t, cmd[0], append(cmd[1:], "version")...)
			if !strings.HasPrefix(out, "mig-agent "+v+"\n") || !strings.Contains(out, "platform: linux/"+a.goarch) {
				t.Errorf("version:\n%s", out)
			}
			profiles[a.goarch] = run(t, cmd[0], append(cmd[1:], "profiles", "--nvml", "sim:gh200x1", "-o", "json")...)
		})
	}
	if profiles["amd64"] == "" || profiles["amd64"] != profiles["arm64"] {
		t.Errorf("profiles of sim:gh200x1 differ between amd64 and arm64:\n%s\n---\n%s", profiles["amd64"], profiles["arm64"])
	}
	if !strings.Contains(profiles["amd64"], "7g.96gb") {
		t.Errorf("profiles of sim:gh200x1 lack 7g.96gb:\n%s", profiles["amd64"])
	}
}

// TestReleaseChart: the packaged chart, copied alone into an empty
// directory, has no links, lints clean with warnings as errors (`helm lint
// --strict`), and renders the release's image by default.
func TestReleaseChart(t *testing.T) {
	dist, v := releaseDist(t)
	data, err := os.ReadFile(filepath.Join(dist, fmt.Sprintf("mig-agent-%s.tgz", v)))
	if err != nil {
		t.Fatal(err)
	}
	alone := t.TempDir()
	tgz := filepath.Join(alone, "chart.tgz")
	if err := os.WriteFile(tgz, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gunzip(t, data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg || !strings.HasPrefix(h.Name, "mig-agent/") {
			t.Errorf("chart entry %s (type %c): want regular files under mig-agent/", h.Name, h.Typeflag)
		}
	}
	chrt, err := loader.Load(tgz)
	if err != nil {
		t.Fatalf("loading %s alone: %v", tgz, err)
	}
	if chrt.Metadata.Version != v || chrt.Metadata.AppVersion != v {
		t.Errorf("chart version %s, appVersion %s, want %s", chrt.Metadata.Version, chrt.Metadata.AppVersion, v)
	}
	dir := t.TempDir()
	extractTar(t, gunzip(t, data), dir)
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	res := lint.RunAll(filepath.Join(dir, "mig-agent"), nil, "mig-agent", lint.WithKubeVersion(kv))
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint --strict: %v", m)
		}
	}
	opts := common.ReleaseOptions{Name: "mig-agent", Namespace: "mig-agent", Revision: 1, IsInstall: true}
	rv, err := util.ToRenderValuesWithSchemaValidation(chrt, nil, opts, capabilities(t), false)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		t.Fatalf("rendering the packaged chart: %v", err)
	}
	var all strings.Builder
	for _, body := range files {
		all.WriteString(body)
	}
	if !strings.Contains(all.String(), `image: "ghcr.io/migagent/mig-agent:`+v+`"`) {
		t.Errorf("the rendered DaemonSet does not run ghcr.io/migagent/mig-agent:%s", v)
	}
	for _, kind := range []string{"kind: ValidatingAdmissionPolicy", "kind: ClusterRole"} {
		if !strings.Contains(all.String(), kind) {
			t.Errorf("the packaged chart renders no %s (its files/ lost?)", kind)
		}
	}
}

// TestReleasePackages reads each .deb and .rpm back: architecture, the
// conflict with NVIDIA's MIG manager, the glibc dependency, the unit.
func TestReleasePackages(t *testing.T) {
	dist, v := releaseDist(t)
	for _, a := range releaseArches {
		t.Run(a.goarch, func(t *testing.T) {
			deb := filepath.Join(dist, fmt.Sprintf("mig-agent_%s-1_%s.deb", v, a.debArch))
			f := run(t, "dpkg-deb", "-f", deb, "Architecture", "Conflicts", "Depends", "Version")
			for _, w := range []string{"Architecture: " + a.debArch, "Conflicts: nvidia-mig-manager", "Depends: libc6 (>= ", "Version: " + v + "-1"} {
				if !strings.Contains(f, w) {
					t.Errorf("%s control lacks %q:\n%s", deb, w, f)
				}
			}
			if c := run(t, "dpkg-deb", "-c", deb); !strings.Contains(c, "./usr/lib/systemd/system/mig-agent.service") || !strings.Contains(c, "./usr/bin/mig-agent") || !strings.Contains(c, "./usr/share/doc/mig-agent/copyright") {
				t.Errorf("%s contents:\n%s", deb, c)
			}
			rpm := filepath.Join(dist, fmt.Sprintf("mig-agent-%s-1.%s.rpm", v, a.rpmArch))
			q := run(t, "rpm", "-qp", "--nosignature", "--queryformat", "%{ARCH} %{VERSION}\n[conflicts %{CONFLICTNAME}\n][requires %{REQUIRENAME}\n][file %{FILENAMES}\n]", rpm)
			for _, w := range []string{a.rpmArch + " " + v + "\n", "conflicts nvidia-mig-manager\n", "requires glibc\n", "file /usr/lib/systemd/system/mig-agent.service\n", "file /usr/bin/mig-agent\n", "file /usr/share/licenses/mig-agent/LICENSE\n"} {
				if !strings.Contains(q, w) {
					t.Errorf("%s lacks %q:\n%s", rpm, w, q)
				}
			}
		})
	}
}

// TestReleaseSBOM: each SPDX document describes its binary and lists the
// Go modules the binary's build information names.
func TestReleaseSBOM(t *testing.T) {
	dist, v := releaseDist(t)
	for _, a := range releaseArches {
		var doc struct {
			SPDXVersion string `json:"spdxVersion"`
			Packages    []struct {
				Name        string `json:"name"`
				VersionInfo string `json:"versionInfo"`
			} `json:"packages"`
		}
		data, err := os.ReadFile(filepath.Join(dist, fmt.Sprintf("mig-agent_%s_linux_%s.spdx.json", v, a.goarch)))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &doc); err != nil || doc.SPDXVersion != "SPDX-2.3" {
			t.Fatalf("%s SBOM: %v, version %q", a.goarch, err, doc.SPDXVersion)
		}
		found := map[string]string{}
		for _, p := range doc.Packages {
			found[p.Name] = p.VersionInfo
		}
		for _, m := range []string{"github.com/NVIDIA/go-nvml", "k8s.io/client-go", "stdlib"} {
			if found[m] == "" {
				t.Errorf("%s SBOM lacks %s", a.goarch, m)
			}
		}
		if found["github.com/migagent/mig-agent"] != "v"+v {
			t.Errorf("%s SBOM: main module at %q", a.goarch, found["github.com/migagent/mig-agent"])
		}
	}
}

package realnode

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Images the node holds: nothing can be pulled here, so they are built by
// the harness from testkit/realnode/pause and testkit/realnode/deviceplugin
// and imported into containerd's k8s.io namespace before the kubelet
// starts.
const (
	// PauseImage is containerd's sandbox image (sandbox_image).
	PauseImage = "mig-agent.test/pause:1"
	// SleepImage is for test pods: the same program (it sleeps until
	// SIGTERM and prints its arguments and REALNODE_* and NVIDIA_*
	// variables first). Pods must say imagePullPolicy Never or
	// IfNotPresent.
	SleepImage = "mig-agent.test/sleep:1"
	// PluginImage runs testkit/realnode/deviceplugin (entrypoint
	// /deviceplugin; args RESOURCE DEVICE-ID...).
	PluginImage = "mig-agent.test/device-plugin:1"
)

// ImageFile is one file of an image built by WriteImage.
type ImageFile struct {
	Path string // in the image, e.g. "/pause"
	Src  string // on this machine
	Mode int64
}

// WriteImage writes an OCI image layout archive (oci-layout, index.json,
// blobs/sha256) of a one-layer image holding files, with entrypoint, named
// ref for containerd (`ctr images import` reads the
// io.containerd.image.name annotation). Only the standard library: no
// daemon, no registry.
func WriteImage(out, ref string, entrypoint []string, files []ImageFile) error {
	layer, err := layerTar(files)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	blobs := map[string][]byte{}
	put := func(b []byte) map[string]any {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return map[string]any{"digest": d, "size": len(b)}
	}
	layerDesc := put(layer)
	layerDesc["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint, "Env": []string{"PATH=/"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []any{layerDesc["digest"]}},
	})
	if err != nil {
		return err
	}
	configDesc := put(config)
	configDesc["mediaType"] = "application/vnd.oci.image.config.v1+json"
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []any{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := put(manifest)
	manifestDesc["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
	manifestDesc["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	_, tag, _ := strings.Cut(ref[strings.LastIndex(ref, "/")+1:], ":")
	manifestDesc["annotations"] = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{manifestDesc},
	})
	if err != nil {
		return err
	}
	if err := writeArchive(out, index, blobs); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return nil
}

// epoch is every file's modification time: the same files give the same
// image.
var epoch = time.Unix(0, 0)

// layerTar is an uncompressed layer holding files and their parent
// directories.
func layerTar(files []ImageFile) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(filepath.Clean(f.Path), "/")
		var parents []string
		for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.Mode, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	err := tw.Close()
	return layer.Bytes(), err
}

// writeArchive writes the OCI layout (oci-layout, index.json, blobs) as a
// tar file.
func writeArchive(out string, index []byte, blobs map[string][]byte) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	aw := tar.NewWriter(f)
	add := func(name string, b []byte) error {
		if err := aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := aw.Write(b)
		return err
	}
	err = add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	if err == nil {
		err = add("index.json", index)
	}
	for d, b := range blobs {
		if err == nil {
			err = add("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), b)
		}
	}
	if err == nil {
		err = aw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// buildPrograms builds testkit/realnode/pause and
// testkit/realnode/deviceplugin, static, into dir. moduleRoot is the
// directory of the project's go.mod.
func buildPrograms(moduleRoot, dir string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+"/",
		"./testkit/realnode/pause", "./testkit/realnode/deviceplugin")
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./testkit/realnode/pause ./testkit/realnode/deviceplugin: %w\n%s", err, b)
	}
	return nil
}

// BinaryFiles returns the files of an image that runs the program bin as
// dst: bin itself and, for a dynamically linked program (a cgo one, such
// as NVIDIA's device plugin, which dlopens libnvidia-ml.so.1 through
// go-nvml), every shared library ldd resolves for it on this machine,
// dynamic loader included, each at the path ldd prints (the loader finds
// them there in the image: /lib/x86_64-linux-gnu is in glibc's default
// search path). A library loaded with dlopen is not in ldd's list: add it
// to the image (or mount it) yourself.
func BinaryFiles(bin, dst string) ([]ImageFile, error) {
	files := []ImageFile{{Path: dst, Src: bin, Mode: 0o755}}
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		// ldd exits 1 for a static program ("not a dynamic executable").
		if strings.Contains(string(out), "not a dynamic executable") || strings.Contains(string(out), "statically linked") {
			return files, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		var lib string
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			lib = f[2] // libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			lib = f[0] // /lib64/ld-linux-x86-64.so.2 (0x...)
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			return nil, fmt.Errorf("ldd %s: %s", bin, strings.TrimSpace(line))
		default:
			continue // linux-vdso.so.1 (0x...): the kernel's
		}
		files = append(files, ImageFile{Path: lib, Src: lib, Mode: 0o755})
	}
	return files, nil
}

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

// Images the node holds: nothing can be pulled here, so both are built by
// the harness from internal/realnode/pause and imported into containerd's
// k8s.io namespace before the kubelet starts.
const (
	// PauseImage is containerd's sandbox image (sandbox_image).
	PauseImage = "mig-agent.test/pause:1"
	// SleepImage is for test pods: the same program (it sleeps until
	// SIGTERM and prints its arguments and REALNODE_* variables first).
	// Pods must say imagePullPolicy Never or IfNotPresent.
	SleepImage = "mig-agent.test/sleep:1"
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
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	mtime := time.Unix(0, 0)
	for _, f := range files {
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		name := strings.TrimPrefix(filepath.Clean(f.Path), "/")
		for d := filepath.Dir(name); d != "."; d = filepath.Dir(d) {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.Mode, Size: int64(len(b)), ModTime: mtime}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	blobs := map[string][]byte{}
	put := func(b []byte) (string, int) {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return d, len(b)
	}
	layerDigest, layerSize := put(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint, "Env": []string{"PATH=/"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	configDigest, configSize := put(config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layerSize}},
	})
	if err != nil {
		return err
	}
	manifestDigest, manifestSize := put(manifest)
	_, tag, _ := strings.Cut(ref[strings.LastIndex(ref, "/")+1:], ":")
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    manifestDigest, "size": manifestSize,
			"platform":    map[string]string{"architecture": runtime.GOARCH, "os": "linux"},
			"annotations": map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
		}},
	})
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	aw := tar.NewWriter(f)
	add := func(name string, b []byte) error {
		if err := aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: mtime}); err != nil {
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
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return nil
}

// buildPause builds internal/realnode/pause, static, into dir and returns
// its path. moduleRoot is the directory of the project's go.mod.
func buildPause(moduleRoot, dir string) (string, error) {
	out := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./internal/realnode/pause")
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./internal/realnode/pause: %w\n%s", err, b)
	}
	return out, nil
}

package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// errRecipe: packaging/Dockerfile's runtime stage asks for something this
// builder does not do, so the two would build different images.
var errRecipe = errors.New("image recipe")

// The Dockerfile's stages whose output the builder supplies itself: the
// agent binary of the build stage, and the C library root the glibc stage
// makes with packaging/release/rootfs.sh.
const (
	dockerfilePath = "packaging/Dockerfile"
	rootfsScript   = "packaging/release/rootfs.sh"
	buildBinary    = "/src/bin/mig-agent"
	glibcRoot      = "/rootfs/"
)

type imageInput struct {
	Root, Version, Commit, Repo string
	Platforms                   []platformInput
}

// recipe is what the Dockerfile's last stage says the image is.
type recipe struct {
	Labels     map[string]string
	Env        []string
	User       string
	WorkingDir string
	Ports      []string
	Entrypoint []string
	Cmd        []string
	Copies     []copyStep
}

type copyStep struct {
	From string // "" (the build context), "build" or "glibc"
	Srcs []string
	Dest string
}

// readRecipe parses the Dockerfile with BuildKit's parser and reads its
// last stage, which must start FROM scratch: every instruction there is
// applied below, and one this builder does not know is an error.
func readRecipe(root string, args map[string]string) (*recipe, error) {
	f, err := os.Open(filepath.Join(root, dockerfilePath))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errRecipe, err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errRecipe, dockerfilePath, err)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil || len(stages) == 0 {
		return nil, fmt.Errorf("%w: %s: no stages (%v)", errRecipe, dockerfilePath, err)
	}
	st := stages[len(stages)-1]
	if st.BaseName != "scratch" {
		return nil, fmt.Errorf("%w: the last stage starts FROM %s, not scratch", errRecipe, st.BaseName)
	}
	env := map[string]string{}
	lex := shell.NewLex('\\')
	expand := func(s string) (string, error) {
		var kv []string
		for k, v := range env {
			kv = append(kv, k+"="+v)
		}
		out, _, err := lex.ProcessWord(s, shell.EnvsFromSlice(kv))
		return out, err
	}
	r := &recipe{Labels: map[string]string{}}
	for _, c := range st.Commands {
		var err error
		switch c := c.(type) {
		case *instructions.ArgCommand:
			for _, a := range c.Args {
				if v, ok := args[a.Key]; ok {
					env[a.Key] = v
				} else if a.Value != nil {
					env[a.Key] = *a.Value
				}
			}
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				if r.Labels[kv.Key], err = expand(kv.Value); err != nil {
					return nil, fmt.Errorf("%w: LABEL %s: %w", errRecipe, kv.Key, err)
				}
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				v, err := expand(kv.Value)
				if err != nil {
					return nil, fmt.Errorf("%w: ENV %s: %w", errRecipe, kv.Key, err)
				}
				env[kv.Key] = v
				r.Env = append(r.Env, kv.Key+"="+v)
			}
		case *instructions.CopyCommand:
			if c.Chmod != "" || c.Chown != "" || c.Link || len(c.ExcludePatterns) > 0 || c.Parents {
				return nil, fmt.Errorf("%w: COPY options other than --from are not supported: %s", errRecipe, c.String())
			}
			r.Copies = append(r.Copies, copyStep{From: c.From, Srcs: c.SourcePaths, Dest: c.DestPath})
		case *instructions.UserCommand:
			r.User = c.User
		case *instructions.WorkdirCommand:
			r.WorkingDir = c.Path
		case *instructions.ExposeCommand:
			r.Ports = append(r.Ports, c.Ports...)
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				return nil, fmt.Errorf("%w: ENTRYPOINT must be the exec (JSON) form: the image has no shell", errRecipe)
			}
			r.Entrypoint = c.CmdLine
		case *instructions.CmdCommand:
			if c.PrependShell {
				return nil, fmt.Errorf("%w: CMD must be the exec (JSON) form: the image has no shell", errRecipe)
			}
			r.Cmd = c.CmdLine
		default:
			return nil, fmt.Errorf("%w: %T in the runtime stage is not supported by packaging/release", errRecipe, c)
		}
	}
	return r, nil
}

// fileSpec is one entry of a layer: its path in the image and where its
// content comes from (a regular file, a directory walked whole, or nothing
// for a bare directory).
type fileSpec struct {
	dst, src string
}

// buildImage writes the OCI image index of in.Platforms to out, an
// OCI-layout tar whose index.json names the index with the version as its
// ref (docker load, skopeo copy oci-archive:, make push), and beside it
// each platform's image SBOM (writeImageSBOM).
func buildImage(in imageInput, out string) error {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	annotations := map[string]string{}
	for _, p := range in.Platforms {
		args := map[string]string{"VERSION": in.Version, "COMMIT": in.Commit, "TARGETOS": p.OS, "TARGETARCH": p.Arch, "TARGETPLATFORM": p.OS + "/" + p.Arch}
		r, err := readRecipe(in.Root, args)
		if err != nil {
			return err
		}
		img, debs, err := platformImage(in, p, r)
		if err != nil {
			return err
		}
		maps := map[string]string{}
		for k, v := range r.Labels {
			if strings.HasPrefix(k, "org.opencontainers.image.") {
				maps[k] = v
				annotations[k] = v
			}
		}
		withAnn, ok := mutate.Annotations(img, maps).(v1.Image)
		if !ok {
			return fmt.Errorf("%w: annotating the %s image", errRecipe, p.Arch)
		}
		plat := &v1.Platform{OS: p.OS, Architecture: p.Arch}
		if p.Arch == "arm64" {
			plat.Variant = "v8"
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: withAnn, Descriptor: v1.Descriptor{Platform: plat, Annotations: maps}})
		sbom := filepath.Join(filepath.Dir(out), fmt.Sprintf("mig-agent_%s_image_%s_%s.spdx.json", in.Version, p.OS, p.Arch))
		if err := writeImageSBOM(withAnn, in.Repo, in.Version, p.Arch, p.Binary, debs, sbom); err != nil {
			return err
		}
	}
	idxAnn, ok := mutate.Annotations(idx, annotations).(v1.ImageIndex)
	if !ok {
		return fmt.Errorf("%w: annotating the index", errRecipe)
	}
	dir, err := os.MkdirTemp("", "mig-agent-oci-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	ref := map[string]string{
		"org.opencontainers.image.ref.name": in.Version,
		"io.containerd.image.name":          in.Repo + ":" + in.Version,
	}
	if err := lp.AppendIndex(idxAnn, layout.WithAnnotations(ref)); err != nil {
		return fmt.Errorf("image: writing the layout: %w", err)
	}
	return tarDir(dir, out)
}

// platformImage makes one platform's image: a layer per COPY of the
// recipe, the recipe's config.
func platformImage(in imageInput, p platformInput, r *recipe) (v1.Image, []debPackage, error) {
	var layers []v1.Layer
	var debs []debPackage
	for _, c := range r.Copies {
		var specs []fileSpec
		switch c.From {
		case "glibc":
			if len(c.Srcs) != 1 || c.Srcs[0] != glibcRoot || c.Dest != "/" {
				return nil, nil, fmt.Errorf("%w: COPY --from=glibc must copy %s to /", errRecipe, glibcRoot)
			}
			dir, err := os.MkdirTemp("", "mig-agent-rootfs-")
			if err != nil {
				return nil, nil, fmt.Errorf("image: %w", err)
			}
			defer os.RemoveAll(dir)
			root := filepath.Join(dir, "rootfs")
			cmd := exec.Command("bash", append([]string{filepath.Join(in.Root, rootfsScript), root}, p.Debs...)...)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return nil, nil, fmt.Errorf("image: %s for %s: %w", rootfsScript, p.Arch, err)
			}
			if debs, err = readStatusD(root); err != nil {
				return nil, nil, err
			}
			specs = append(specs, fileSpec{dst: "/", src: root})
		case "build":
			if len(c.Srcs) != 1 || c.Srcs[0] != buildBinary {
				return nil, nil, fmt.Errorf("%w: COPY --from=build copies only %s", errRecipe, buildBinary)
			}
			specs = append(specs, fileSpec{dst: c.Dest, src: p.Binary})
		case "":
			for _, s := range c.Srcs {
				dst := c.Dest
				if strings.HasSuffix(dst, "/") {
					dst = path.Join(dst, path.Base(s))
				}
				specs = append(specs, fileSpec{dst: dst, src: filepath.Join(in.Root, s)})
			}
		default:
			return nil, nil, fmt.Errorf("%w: COPY --from=%s: no such stage output in packaging/release", errRecipe, c.From)
		}
		data, err := layerTar(specs)
		if err != nil {
			return nil, nil, err
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, nil, fmt.Errorf("image: %w", err)
		}
		layers = append(layers, l)
	}
	cfg := &v1.ConfigFile{
		Architecture: p.Arch, OS: p.OS, Created: v1.Time{Time: sourceDate()},
		Config: v1.Config{
			Env: r.Env, User: r.User, WorkingDir: r.WorkingDir, Labels: r.Labels,
			Entrypoint: r.Entrypoint, Cmd: r.Cmd,
		},
	}
	if p.Arch == "arm64" {
		cfg.Variant = "v8"
	}
	if len(r.Ports) > 0 {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, port := range r.Ports {
			if !strings.Contains(port, "/") {
				port += "/tcp"
			}
			cfg.Config.ExposedPorts[port] = struct{}{}
		}
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(base, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("image: %w", err)
	}
	img, err = mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, nil, fmt.Errorf("image: %w", err)
	}
	// AppendLayers records a history entry per layer; keep the config's
	// created time the source date.
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	for i := range cf.History {
		cf.History[i].Created = v1.Time{Time: sourceDate()}
		cf.History[i].CreatedBy = "packaging/release from " + dockerfilePath
	}
	img, err = mutate.ConfigFile(img, cf)
	return img, debs, err
}

// sourceDate is SOURCE_DATE_EPOCH (the commit's time, set by release.sh),
// or the Unix epoch: the same inputs make the same image.
func sourceDate() time.Time {
	if v, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return time.Unix(v, 0).UTC()
	}
	return time.Unix(0, 0).UTC()
}

// layerTar writes specs as a layer tar: owned by root, the source date as
// every mtime, every parent directory present, entries sorted.
func layerTar(specs []fileSpec) ([]byte, error) {
	type ent struct {
		name string
		hdr  *tar.Header
		src  string
	}
	ents := map[string]ent{}
	addDirs := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			n := strings.TrimPrefix(d, "/") + "/"
			if _, ok := ents[n]; !ok {
				ents[n] = ent{name: n, hdr: &tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: 0o755}}
			}
		}
	}
	for _, s := range specs {
		err := filepath.WalkDir(s.src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(s.src, p)
			dst := path.Join(s.dst, filepath.ToSlash(rel))
			if dst == "/" {
				return nil
			}
			name := strings.TrimPrefix(dst, "/")
			info, err := os.Lstat(p)
			if err != nil {
				return err
			}
			hdr := &tar.Header{Name: name, Mode: int64(info.Mode().Perm())}
			if info.Mode()&fs.ModeSticky != 0 {
				hdr.Mode = int64(info.Mode().Perm()) | 0o1000
			}
			switch {
			case info.IsDir():
				hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			case info.Mode()&fs.ModeSymlink != 0:
				t, err := os.Readlink(p)
				if err != nil {
					return err
				}
				hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, t
			case info.Mode().IsRegular():
				hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
			default:
				return fmt.Errorf("%w: %s is not a file, directory or link", errRecipe, p)
			}
			addDirs(dst)
			ents[hdr.Name] = ent{name: hdr.Name, hdr: hdr, src: p}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
	}
	names := make([]string, 0, len(ents))
	for n := range ents {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := sourceDate()
	for _, n := range names {
		e := ents[n]
		e.hdr.ModTime, e.hdr.Uid, e.hdr.Gid, e.hdr.Format = mtime, 0, 0, tar.FormatPAX
		if err := tw.WriteHeader(e.hdr); err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		if e.hdr.Typeflag == tar.TypeReg {
			data, err := os.ReadFile(e.src)
			if err != nil {
				return nil, fmt.Errorf("image: %w", err)
			}
			if _, err := tw.Write(data); err != nil {
				return nil, fmt.Errorf("image: %w", err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return buf.Bytes(), nil
}

// tarDir writes the OCI layout in dir as the tar out (files only, sorted,
// as `docker save` and `skopeo copy oci-archive:` read it).
func tarDir(dir, out string) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			names = append(names, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	slices.Sort(names)
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	tw := tar.NewWriter(f)
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			f.Close()
			return fmt.Errorf("image: %w", err)
		}
		hdr := &tar.Header{Name: n, Mode: 0o644, Size: int64(len(data)), ModTime: sourceDate(), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			f.Close()
			return fmt.Errorf("image: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			f.Close()
			return fmt.Errorf("image: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("image: %w", err)
	}
	return f.Close()
}

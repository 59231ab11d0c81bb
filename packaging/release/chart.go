package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// errChart: the chart cannot be packaged as it is.
var errChart = errors.New("chart")

var (
	chartNameRe    = regexp.MustCompile(`(?m)^name:\s*(\S+)\s*$`)
	chartVersionRe = regexp.MustCompile(`(?m)^version:.*$`)
	chartAppRe     = regexp.MustCompile(`(?m)^appVersion:.*$`)
)

// packageChart writes NAME-VERSION.tgz into outDir, as `helm package
// --version V --app-version V` lays it out (every file under NAME/,
// Chart.yaml first, .helmignore honoured), with two differences: a symlink
// is replaced by the file it points to, so the archive stands alone (the
// chart's files/ share packaging/kubernetes in the repository), and a link
// to anything but a regular file is refused. The chart's image tag defaults
// to its appVersion, so the packaged chart runs the release's image.
func packageChart(src, version, outDir string) (string, error) {
	chartYAML, err := os.ReadFile(filepath.Join(src, "Chart.yaml"))
	if err != nil {
		return "", fmt.Errorf("%w: %w", errChart, err)
	}
	m := chartNameRe.FindSubmatch(chartYAML)
	if m == nil || !chartVersionRe.Match(chartYAML) || !chartAppRe.Match(chartYAML) {
		return "", fmt.Errorf("%w: %s/Chart.yaml needs name, version and appVersion lines", errChart, src)
	}
	name := string(m[1])
	chartYAML = chartVersionRe.ReplaceAll(chartYAML, []byte("version: "+version))
	chartYAML = chartAppRe.ReplaceAll(chartYAML, []byte(`appVersion: "`+version+`"`))

	ignore, err := readHelmignore(filepath.Join(src, ".helmignore"))
	if err != nil {
		return "", err
	}
	type entry struct {
		rel  string
		data []byte
	}
	var files []entry
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." {
			return nil
		}
		if ignored(ignore, rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		st, err := os.Stat(p) // follows a symlink
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%w: %s is not a regular file", errChart, p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == "Chart.yaml" {
			data = chartYAML
		}
		files = append(files, entry{filepath.ToSlash(rel), data})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("%w: %w", errChart, err)
	}
	slices.SortFunc(files, func(a, b entry) int {
		if (a.rel == "Chart.yaml") != (b.rel == "Chart.yaml") {
			if a.rel == "Chart.yaml" {
				return -1
			}
			return 1
		}
		return strings.Compare(a.rel, b.rel)
	})
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	mtime := sourceDate()
	for _, f := range files {
		hdr := &tar.Header{Name: path.Join(name, f.rel), Mode: 0o644, Size: int64(len(f.data)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", fmt.Errorf("%w: %w", errChart, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", fmt.Errorf("%w: %w", errChart, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("%w: %w", errChart, err)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("%w: %w", errChart, err)
	}
	out := filepath.Join(outDir, fmt.Sprintf("%s-%s.tgz", name, version))
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("%w: %w", errChart, err)
	}
	return out, nil
}

// readHelmignore reads the chart's .helmignore patterns (Helm's
// pkg/ignore: shell globs per line, '#' comments, a trailing '/' for
// directories only); .helmignore itself is always left out, as Helm does.
func readHelmignore(p string) ([]string, error) {
	pats := []string{".helmignore"}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return pats, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errChart, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			return nil, fmt.Errorf("%w: %s: negated pattern %q is not supported", errChart, p, l)
		}
		pats = append(pats, l)
	}
	return pats, sc.Err()
}

func ignored(pats []string, rel string, dir bool) bool {
	base := filepath.Base(rel)
	for _, p := range pats {
		if strings.HasSuffix(p, "/") {
			if !dir {
				continue
			}
			p = strings.TrimSuffix(p, "/")
		}
		target := base
		if strings.Contains(p, "/") {
			target = rel
		}
		if ok, _ := filepath.Match(p, target); ok {
			return true
		}
	}
	return false
}

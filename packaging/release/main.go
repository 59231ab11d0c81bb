// Command release makes the artifacts of `make release` that need more than
// a shell: the OCI image index (image.go), the packaged Helm chart
// (chart.go) and the SPDX SBOMs (sbom.go). packaging/release/release.sh
// runs it; it is a module of its own so that go-containerregistry and
// BuildKit's Dockerfile parser stay out of the agent's module graph.
//
//	release image -root DIR -version V -commit C -repo R -o OUT.tar -platform linux/ARCH=BINARY,DEB[,DEB...]...
//	release chart -src CHARTDIR -version V -o DIR
//	release sbom -version V BINARY=OUT.spdx.json...
//	release push -dist DIR -version V -registry HOST[:PORT]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// errUsage: the command line is wrong.
var errUsage = errors.New("usage: release image|chart|sbom|push [flags]")

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// platformFlag collects repeated -platform linux/ARCH=BINARY,DEB... values.
type platformFlag []platformInput

type platformInput struct {
	OS, Arch string
	Binary   string
	Debs     []string
}

func (p *platformFlag) String() string { return fmt.Sprint(len(*p)) }

func (p *platformFlag) Set(s string) error {
	plat, files, ok := strings.Cut(s, "=")
	osName, arch, ok2 := strings.Cut(plat, "/")
	parts := strings.Split(files, ",")
	if !ok || !ok2 || len(parts) < 2 {
		return fmt.Errorf("%w: -platform %q: want linux/ARCH=BINARY,DEB[,DEB...]", errUsage, s)
	}
	*p = append(*p, platformInput{OS: osName, Arch: arch, Binary: parts[0], Debs: parts[1:]})
	return nil
}

func run(args []string) error {
	if len(args) == 0 {
		return errUsage
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	version := fs.String("version", "", "release version x.y.z")
	out := fs.String("o", "", "output file (image) or directory (chart)")
	switch args[0] {
	case "image":
		root := fs.String("root", ".", "repository root (the Dockerfile's build context)")
		commit := fs.String("commit", "unknown", "source revision")
		repo := fs.String("repo", "ghcr.io/migagent/mig-agent", "image repository named in the layout's ref annotation")
		var plats platformFlag
		fs.Var(&plats, "platform", "linux/ARCH=BINARY,DEB... (repeatable)")
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if *version == "" || *out == "" || len(plats) == 0 {
			return fmt.Errorf("%w: image needs -version, -o and -platform", errUsage)
		}
		return buildImage(imageInput{Root: *root, Version: *version, Commit: *commit, Repo: *repo, Platforms: plats}, *out)
	case "chart":
		src := fs.String("src", "", "chart directory")
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if *version == "" || *out == "" || *src == "" {
			return fmt.Errorf("%w: chart needs -src, -version and -o", errUsage)
		}
		path, err := packageChart(*src, *version, *out)
		if err == nil {
			fmt.Println(path)
		}
		return err
	case "push":
		dist := fs.String("dist", "dist", "the release's directory (make release)")
		registry := fs.String("registry", "", "the registry, host[:port][/path]")
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if *version == "" || *registry == "" {
			return fmt.Errorf("%w: push needs -version and -registry", errUsage)
		}
		p, err := pushRelease(*dist, *registry, *version)
		if err != nil {
			return err
		}
		fmt.Printf("pushed the image index %s (%s)\n", p.Image, p.ImageDigest)
		fmt.Printf("pushed the chart %s --version %s (%s)\n", p.Chart, *version, p.ChartDigest)
		return nil
	case "sbom":
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if *version == "" || fs.NArg() == 0 {
			return fmt.Errorf("%w: sbom needs -version and BINARY=OUT pairs", errUsage)
		}
		for _, pair := range fs.Args() {
			bin, dst, ok := strings.Cut(pair, "=")
			if !ok {
				return fmt.Errorf("%w: %q is not BINARY=OUT", errUsage, pair)
			}
			if err := writeSBOM(bin, *version, dst); err != nil {
				return err
			}
		}
		return nil
	}
	return errUsage
}

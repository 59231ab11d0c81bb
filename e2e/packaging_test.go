package e2e

// Tests of the Linux packages (`make package`): packaging/build-packages.sh
// builds the .deb and .rpm of the binary under test with nfpm; the .deb is
// installed into a scratch root with the real dpkg, its maintainer scripts
// run, the installed binary runs, the conffile survives an upgrade and a
// purge removes it; the .rpm's header is read back (files, modes,
// %config(noreplace), scriptlets). The systemd unit is checked with
// systemd-analyze verify where that tool exists.

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pkgRoot is the repository root (the tests run in e2e/).
func pkgRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// pkgFiles is what the package must install: path, mode, source in the tree.
var pkgFiles = []struct {
	path string
	mode os.FileMode
	src  string // "" for the binary
}{
	{"/usr/bin/mig-agent", 0o755, ""},
	{"/usr/lib/systemd/system/mig-agent.service", 0o644, "packaging/systemd/mig-agent.service"},
	{"/etc/mig-agent/settings.yaml", 0o644, "packaging/settings.yaml"},
	{"/usr/share/mig-agent/examples/config.yaml", 0o644, "packaging/examples/config.yaml"},
	{"/usr/share/doc/mig-agent/install.md", 0o644, "docs/install.md"},
	{"/usr/share/doc/mig-agent/install-systemd.md", 0o644, "docs/install-systemd.md"},
}

const pkgConffile = "/etc/mig-agent/settings.yaml"

// pkgBuild runs packaging/build-packages.sh for formats on the binary
// under test into a temporary dist directory; it returns the package paths.
func pkgBuild(t *testing.T, formats ...string) map[string]string {
	t.Helper()
	dist := t.TempDir()
	cmd := exec.Command("bash", append([]string{filepath.Join(pkgRoot(t), "packaging/build-packages.sh")}, formats...)...)
	cmd.Env = append(os.Environ(), "MIG_AGENT_BIN="+binary(), "DIST="+dist)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("build-packages.sh %v: %v\n%s", formats, err, errb.String())
	}
	t.Logf("build-packages.sh: %s", strings.TrimSpace(errb.String()))
	pkgs := map[string]string{}
	for _, line := range strings.Fields(out.String()) {
		if _, err := os.Stat(line); err != nil {
			t.Fatalf("build-packages.sh printed %q: %v", line, err)
		}
		pkgs[strings.TrimPrefix(filepath.Ext(line), ".")] = line
	}
	for _, f := range formats {
		if pkgs[f] == "" {
			t.Fatalf("build-packages.sh made no .%s; it printed %q", f, out.String())
		}
	}
	return pkgs
}

func pkgNeedTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (Debian: apt-get install dpkg)", tool)
		}
	}
}

func pkgExec(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func pkgMustExec(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := pkgExec(t, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// pkgScratchDpkg makes an empty dpkg root and returns dpkg's options for it.
// Maintainer scripts run outside a chroot (the root has no shell) with
// DPKG_ROOT set, as dpkg does for --root installs.
func pkgScratchDpkg(t *testing.T) (root string, opts []string) {
	t.Helper()
	root = t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/log"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts = []string{"--root=" + root, "--force-script-chrootless", "--force-depends", "--force-confold"}
	if os.Geteuid() != 0 {
		opts = append(opts, "--force-not-root")
	}
	return root, opts
}

func TestPackageDeb(t *testing.T) {
	pkgNeedTools(t, "dpkg", "dpkg-deb", "dpkg-query")
	deb := pkgBuild(t, "deb")["deb"]
	root := pkgRoot(t)

	// Control fields and the archive's table of contents.
	fields := pkgMustExec(t, nil, "dpkg-deb", "-f", deb, "Package", "Version", "Architecture", "Depends", "Conflicts")
	for _, want := range []string{"Package: mig-agent", "Depends: libc6 (>= 2.", "Conflicts: nvidia-mig-manager"} {
		if !strings.Contains(fields, want) {
			t.Errorf("control fields lack %q:\n%s", want, fields)
		}
	}
	if m := regexp.MustCompile(`(?m)^Version: ([0-9][^\s]*)$`).FindStringSubmatch(fields); m == nil {
		t.Errorf("no dpkg version starting with a digit:\n%s", fields)
	}
	contents := pkgMustExec(t, nil, "dpkg-deb", "-c", deb)
	for _, p := range pkgFiles {
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(pkgMode(p.mode)) + ` root/root .* \.` + regexp.QuoteMeta(p.path) + `$`)
		if !re.MatchString(contents) {
			t.Errorf("the .deb lacks %s with mode %s owned by root:\n%s", p.path, pkgMode(p.mode), contents)
		}
	}
	if cf := pkgMustExec(t, nil, "dpkg-deb", "-I", deb, "conffiles"); strings.TrimSpace(cf) != pkgConffile {
		t.Errorf("conffiles = %q, want %q", cf, pkgConffile)
	}

	// Install into a scratch root; the scripts enable and start nothing.
	dir, opts := pkgScratchDpkg(t)
	out := pkgMustExec(t, nil, "dpkg", append(opts, "-i", deb)...)
	if !strings.Contains(out, "nothing was enabled or started") || !strings.Contains(out, "systemctl enable --now mig-agent.service") {
		t.Errorf("postinst did not say how to enable the service:\n%s", out)
	}
	for _, p := range pkgFiles {
		got, err := os.ReadFile(filepath.Join(dir, p.path))
		if err != nil {
			t.Errorf("installed file: %v", err)
			continue
		}
		src := binary()
		if p.src != "" {
			src = filepath.Join(root, p.src)
		}
		if want, _ := os.ReadFile(src); !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s", p.path, src)
		}
	}
	if status := pkgMustExec(t, nil, "dpkg-query", "--admindir="+filepath.Join(dir, "var/lib/dpkg"), "-W", "-f=${Status} ${Conffiles}", "mig-agent"); !strings.HasPrefix(status, "install ok installed") ||
		!strings.Contains(status, pkgConffile+" ") {
		t.Errorf("dpkg status of mig-agent: %q, want installed with conffile %s", status, pkgConffile)
	}

	// The installed binary runs, and its example files are valid.
	bin := filepath.Join(dir, "usr/bin/mig-agent")
	if v := pkgMustExec(t, nil, bin, "version"); !strings.HasPrefix(v, "mig-agent ") || !strings.Contains(v, "go: go1.") {
		t.Errorf("installed mig-agent version printed %q", v)
	}
	pkgMustExec(t, nil, bin, "validate", "-f", filepath.Join(dir, "usr/share/mig-agent/examples/config.yaml"))
	pkgCheckSettings(t, bin, filepath.Join(dir, pkgConffile))

	// An upgrade keeps the edited conffile (--force-confold as apt would
	// with unattended upgrades; the packaged file did not change).
	edited := append(pkgRead(t, filepath.Join(dir, pkgConffile)), []byte("log-level: debug\n")...)
	if err := os.WriteFile(filepath.Join(dir, pkgConffile), edited, 0o644); err != nil {
		t.Fatal(err)
	}
	out = pkgMustExec(t, nil, "dpkg", append(opts, "-i", deb)...)
	if !strings.Contains(out, "mig-agent upgraded") {
		t.Errorf("postinst on upgrade did not say so:\n%s", out)
	}
	if got := pkgRead(t, filepath.Join(dir, pkgConffile)); !bytes.Equal(got, edited) {
		t.Errorf("upgrade replaced the edited %s", pkgConffile)
	}

	// Remove keeps the conffile; purge deletes it and the state directory.
	if err := os.MkdirAll(filepath.Join(dir, "var/lib/mig-agent"), 0o700); err != nil {
		t.Fatal(err)
	}
	pkgMustExec(t, nil, "dpkg", append(opts, "--remove", "mig-agent")...)
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Errorf("remove left %s (%v)", bin, err)
	}
	if _, err := os.Stat(filepath.Join(dir, pkgConffile)); err != nil {
		t.Errorf("remove deleted the conffile: %v", err)
	}
	pkgMustExec(t, nil, "dpkg", append(opts, "--purge", "mig-agent")...)
	for _, p := range []string{pkgConffile, "var/lib/mig-agent"} {
		if _, err := os.Stat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("purge left %s (%v)", p, err)
		}
	}
}

// TestPackageScripts runs the maintainer scripts with the arguments rpm
// gives them (dpkg's are covered by TestPackageDeb). DPKG_ROOT keeps them
// off this machine's systemd.
func TestPackageScripts(t *testing.T) {
	dir := filepath.Join(pkgRoot(t), "packaging/nfpm")
	env := []string{"DPKG_ROOT=" + t.TempDir()}
	for _, tc := range []struct {
		script, arg, want string
	}{
		{"postinstall.sh", "1", "nothing was enabled or started"},
		{"postinstall.sh", "2", "mig-agent upgraded"},
		{"postinstall.sh", "configure", "nothing was enabled or started"},
		{"preremove.sh", "0", ""},
		{"preremove.sh", "1", ""},
		{"postremove.sh", "0", ""},
		{"postremove.sh", "1", ""},
	} {
		out := pkgMustExec(t, env, "sh", filepath.Join(dir, tc.script), tc.arg)
		if tc.want != "" && !strings.Contains(out, tc.want) {
			t.Errorf("%s %s printed %q, want %q", tc.script, tc.arg, out, tc.want)
		}
		if strings.Contains(out, "enable --now") && tc.want == "" {
			t.Errorf("%s %s: %q", tc.script, tc.arg, out)
		}
	}
	// No script enables or starts the unit by itself.
	for _, s := range []string{"postinstall.sh", "preremove.sh", "postremove.sh"} {
		for i, line := range strings.Split(string(pkgRead(t, filepath.Join(dir, s))), "\n") {
			code := strings.TrimSpace(line)
			if strings.HasPrefix(code, "#") || strings.HasPrefix(code, "echo") {
				continue
			}
			if regexp.MustCompile(`systemctl .*\b(enable|start|restart|reboot)\b`).MatchString(code) {
				t.Errorf("%s:%d enables or starts something: %s", s, i+1, code)
			}
		}
	}
}

func TestPackageRPM(t *testing.T) {
	rpm := pkgBuild(t, "rpm")["rpm"]
	h, err := readRPMHeader(rpm)
	if err != nil {
		t.Fatal(err)
	}
	if name := h.String(rpmTagName); name != "mig-agent" {
		t.Errorf("rpm name %q", name)
	}
	if v := h.String(rpmTagVersion); !regexp.MustCompile(`^[0-9][0-9A-Za-z.+~]*$`).MatchString(v) {
		t.Errorf("rpm version %q is not a valid rpm version", v)
	}
	files := h.Files()
	for _, p := range pkgFiles {
		f, ok := files[p.path]
		if !ok {
			t.Errorf("the .rpm lacks %s (has %v)", p.path, pkgKeys(files))
			continue
		}
		if os.FileMode(f.Mode&0o7777) != p.mode || f.Mode&0o170000 != 0o100000 {
			t.Errorf("%s: mode %o, want regular file %o", p.path, f.Mode, p.mode)
		}
		if f.User != "root" || f.Group != "root" {
			t.Errorf("%s: owner %s:%s, want root:root", p.path, f.User, f.Group)
		}
		wantFlags := uint32(0)
		if p.path == pkgConffile {
			wantFlags = rpmFileConfig | rpmFileNoReplace
		}
		if f.Flags&(rpmFileConfig|rpmFileNoReplace) != wantFlags {
			t.Errorf("%s: file flags %#x, want config|noreplace bits %#x", p.path, f.Flags, wantFlags)
		}
	}
	dir := filepath.Join(pkgRoot(t), "packaging/nfpm")
	for tag, script := range map[int]string{rpmTagPostIn: "postinstall.sh", rpmTagPreUn: "preremove.sh", rpmTagPostUn: "postremove.sh"} {
		if got, want := strings.TrimSpace(h.String(tag)), strings.TrimSpace(string(pkgRead(t, filepath.Join(dir, script)))); got != want {
			t.Errorf("rpm scriptlet %d is not %s:\n%s", tag, script, got)
		}
	}
	if c := h.Strings(rpmTagConflictName); !slices.Contains(c, "nvidia-mig-manager") {
		t.Errorf("rpm conflicts %v, want nvidia-mig-manager", c)
	}
	if req := h.Strings(rpmTagRequireName); !slices.Contains(req, "glibc") {
		t.Errorf("rpm requires %v, want glibc", req)
	}
}

// TestSystemdUnit checks the packaged unit with systemd-analyze verify,
// against a copy whose ExecStart names the binary under test (verify
// insists that the executable exists).
func TestSystemdUnit(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed; the unit is not verified here")
	}
	unit := pkgRead(t, filepath.Join(pkgRoot(t), "packaging/systemd/mig-agent.service"))
	if !bytes.Contains(unit, []byte("/usr/bin/mig-agent")) {
		t.Fatalf("the unit does not pkgExec /usr/bin/mig-agent:\n%s", unit)
	}
	if !bytes.Contains(unit, []byte("/etc/mig-agent/settings.yaml")) {
		t.Errorf("the unit does not read the pkgFiles settings /etc/mig-agent/settings.yaml")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "mig-agent.service")
	if err := os.WriteFile(path, bytes.ReplaceAll(unit, []byte("/usr/bin/mig-agent"), []byte(binary())), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := pkgExec(t, []string{"SYSTEMD_LOG_LEVEL=notice"}, "systemd-analyze", "verify", "--man=no", path)
	if err != nil {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// verify exits 0 on what it ignores (unknown keys, bad values): those
	// are failures here too. Lines about other units of this machine are not.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(line, "mig-agent.service") {
			t.Errorf("systemd-analyze verify: %s", line)
		} else if line != "" {
			t.Logf("systemd-analyze verify (not about the unit): %s", line)
		}
	}
}

// pkgCheckSettings checks the example settings: every key, uncommented,
// is one the binary knows (it refuses unknown keys), and every flag of
// `mig-agent run` is documented in it.
func pkgCheckSettings(t *testing.T, bin, path string) {
	t.Helper()
	raw := pkgRead(t, path)
	key := regexp.MustCompile(`^# ([a-z][a-z0-9-]*): `)
	var uncommented bytes.Buffer
	documented := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		if m := key.FindStringSubmatch(line); m != nil {
			documented[m[1]] = true
			uncommented.WriteString(strings.TrimPrefix(line, "# ") + "\n")
		}
	}
	if len(documented) == 0 {
		t.Fatalf("%s documents no pkgKeys", path)
	}
	tmp := filepath.Join(t.TempDir(), "settings.yaml")
	if err := os.WriteFile(tmp, uncommented.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// Flags win over the file: the simulator instead of the real NVML.
	if out, err := pkgExec(t, nil, bin, "profiles", "--settings", tmp, "--nvml", "sim:h200x1", "-o", "json"); err != nil {
		t.Errorf("the settings example, uncommented, is refused: %v\n%s", err, out)
	}
	help := pkgMustExec(t, nil, bin, "run", "--help")
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(help, -1) {
		if flag := m[1]; flag != "help" && flag != "settings" && flag != "debug" && !documented[flag] {
			t.Errorf("flag --%s is not in %s", flag, path)
		}
	}
}

func pkgRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pkgMode renders a regular file's mode as tar -tv does (-rwxr-xr-x).
func pkgMode(m os.FileMode) string { return "-" + m.Perm().String()[1:] }

func pkgKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

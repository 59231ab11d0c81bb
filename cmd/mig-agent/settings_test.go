package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/settings"
	"github.com/spf13/cobra"
)

// settingsFor parses args for `run` and loads the settings as the daemon would.
func settingsFor(t *testing.T, args ...string) (*settings.Settings, error) {
	t.Helper()
	root := newRoot()
	var got *settings.Settings
	var loadErr error
	for _, c := range root.Commands() {
		if c.Name() == "run" {
			c.RunE = func(cmd *cobra.Command, _ []string) error {
				got, loadErr = loadSettings(cmd)
				return nil
			}
		}
	}
	root.SetArgs(append([]string{"run"}, args...))
	if err := root.ExecuteContext(context.Background()); err != nil {
		return nil, err
	}
	return got, loadErr
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "settings.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSettingsPrecedence(t *testing.T) {
	file := writeFile(t, "node-name: from-file\ndrain-timeout: 7m\nmax-concurrent: 3\nhost-gpu-clients: [a.service, b.service]\ntaint: false\n")
	t.Setenv("NODE_NAME", "")
	// default < file
	s, err := settingsFor(t, "--settings", file)
	if err != nil {
		t.Fatal(err)
	}
	if s.NodeName != "from-file" || s.DrainTimeout != 7*time.Minute || s.MaxConcurrent != 3 || s.Taint ||
		strings.Join(s.HostGPUClients, ",") != "a.service,b.service" || s.MetricsAddress != ":9478" {
		t.Fatalf("file: %+v", s)
	}
	// file < environment
	t.Setenv("MIG_AGENT_NODE_NAME", "from-env")
	t.Setenv("MIG_AGENT_DRAIN_TIMEOUT", "90s")
	s, _ = settingsFor(t, "--settings", file)
	if s.NodeName != "from-env" || s.DrainTimeout != 90*time.Second {
		t.Fatalf("env: %+v", s)
	}
	// environment < flag
	s, _ = settingsFor(t, "--settings", file, "--node-name", "from-flag", "--drain-timeout", "1s")
	if s.NodeName != "from-flag" || s.DrainTimeout != time.Second {
		t.Fatalf("flag: %+v", s)
	}
}

func TestSettingsNodeNameDefault(t *testing.T) {
	t.Setenv("NODE_NAME", "downward-api")
	s, err := settingsFor(t)
	if err != nil || s.NodeName != "downward-api" {
		t.Fatalf("%+v %v", s, err)
	}
}

func TestSettingsBadInput(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"node-nmae: x\n", "unknown keys node-nmae"},
		{"drain-timeout: soon\n", "not a duration"},
		{"max-concurrent: many\n", "not an integer"},
		{"taint: maybe\n", "not a boolean"},
		{"[not a map\n", "settings file"},
	} {
		_, err := settingsFor(t, "--settings", writeFile(t, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.body, err, tc.want)
		}
	}
}

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: maybe\n"), 0o600)
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", filepath.Join(dir, "s.json")}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"version"}, exitOK},
		{[]string{"no-such-command"}, exitBadInput},
		{[]string{"plan", "--bogus"}, exitBadInput},
		{[]string{"plan", "-Z"}, exitBadInput},                     // unknown shorthand
		{[]string{"run", "--drain-timeout", "soon"}, exitBadInput}, // invalid argument
		{[]string{"version", "extra"}, exitBadInput},               // a positional argument
		{[]string{"sim", "reboot", "extra"}, exitBadInput},         // the same, one level down
		{[]string{"verison"}, exitBadInput},                        // unknown, with a suggestion
		{[]string{}, exitOK},                                       // help
		{append([]string{"validate", "-f", bad}, sim...), exitBadInput},
		{append([]string{"plan", "-c", "no-such-config"}, sim...), exitBadInput},
		{append([]string{"plan", "-c", "all-balanced"}, sim...), exitOK},
		{[]string{"profiles", "--nvml", "sim:nosuchgpux1"}, exitBadInput},
		{[]string{"profiles", "--nvml", "sim:gh200x1"}, exitOK},
		{[]string{"profiles", "--nvml", "sim:gb200x2,gh200-144gbx1"}, exitOK},
		{[]string{"run", "--nvml", "sim:h200x1", "--reboot-method", "teleport", "--node-name", "n"}, exitBadInput},
	} {
		if got := run(context.Background(), tc.args); got != tc.want {
			t.Errorf("%v: exit %d, want %d", tc.args, got, tc.want)
		}
	}
}

func TestApplyRebootExitCode(t *testing.T) {
	state := filepath.Join(t.TempDir(), "s.json")
	args := []string{"apply", "-c", "all-balanced", "--nvml", "sim:a100-40gbx1", "--sim-state", state, "--sim-no-reset"}
	if got := run(context.Background(), args); got != exitReboot {
		t.Fatalf("exit %d, want %d (reboot required)", got, exitReboot)
	}
}

// TestVersionOutput: `mig-agent version` names the version and commit the
// build stamped, the Go release and the platform it was built for (the
// release checks each archive's binary by these lines).
func TestVersionOutput(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "0.9.0", "abc1234"
	var out strings.Builder
	root := newRoot()
	root.SetArgs([]string{"version"})
	root.SetOut(&out)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	want := "mig-agent 0.9.0\ncommit: abc1234\ngo: " + runtime.Version() + "\nplatform: " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if out.String() != want {
		t.Errorf("version printed\n%s\nwant\n%s", out.String(), want)
	}
}

func TestSettingsStartupTaints(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	s, err := settingsFor(t, "--startup-taint", "migagent.io/geometry-pending=true:NoSchedule", "--startup-taint", "example.com/wait:NoExecute")
	if err != nil || strings.Join(s.StartupTaints, ",") != "migagent.io/geometry-pending=true:NoSchedule,example.com/wait:NoExecute" || s.Validate() != nil {
		t.Fatalf("flags: %+v %v", s, err)
	}
	s, err = settingsFor(t, "--settings", writeFile(t, "startupTaints: [a.io/b=c:NoSchedule]\n"))
	if err != nil || strings.Join(s.StartupTaints, ",") != "a.io/b=c:NoSchedule" {
		t.Fatalf("file: %+v %v", s, err)
	}
	if _, err := settingsFor(t, "--settings", writeFile(t, "startupTaints: [a:NoSchedule]\nstartup-taint: [b:NoSchedule]\n")); err == nil {
		t.Fatal("both startupTaints and startup-taint accepted")
	}
	for _, bad := range []string{"nokey", "a=b", "a:Sometimes", "-a:NoSchedule", "a=b c:NoSchedule", "migagent.io/reconfiguring=true:NoSchedule", ":NoSchedule"} {
		s, err := settingsFor(t, "--startup-taint", bad)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "startup-taint") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if tt, err := settings.ParseTaint("k8s.io/x:PreferNoSchedule"); err != nil || tt != (settings.Taint{Key: "k8s.io/x", Effect: "PreferNoSchedule"}) {
		t.Errorf("%+v %v", tt, err)
	}
}

func TestSettingsOperandSelectors(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	s, err := settingsFor(t)
	if err != nil || len(s.PluginSelectors) != 0 || len(s.OperandSelectors) != 0 {
		t.Fatalf("defaults: %v %v %v", s.OperandSelectors, s.PluginSelectors, err)
	}
	s, err = settingsFor(t, "--settings", writeFile(t, "plugin-selector: ['app=my-reader', 'app=x,tier=gpu']\n"+
		"operand-selector: ['device-plugin=app=my-plugin', 'dcgm-exporter=app.kubernetes.io/name=dcgm-exporter,tier=gpu']\n"))
	if err != nil || strings.Join(s.PluginSelectors, ";") != "app=my-reader;app=x,tier=gpu" ||
		strings.Join(s.OperandSelectors, ";") != "device-plugin=app=my-plugin;dcgm-exporter=app.kubernetes.io/name=dcgm-exporter,tier=gpu" {
		t.Fatalf("file: %v %v %v", s.OperandSelectors, s.PluginSelectors, err)
	}
	t.Setenv("MIG_AGENT_OPERAND_SELECTOR", "dcgm=app=my-dcgm")
	if s, err = settingsFor(t); err != nil || strings.Join(s.OperandSelectors, ";") != "dcgm=app=my-dcgm" {
		t.Fatalf("env: %v %v", s.OperandSelectors, err)
	}
	if s, err = settingsFor(t, "--operand-selector", "validator=app=v", "--operand-selector", "validator=app=w"); err != nil ||
		strings.Join(s.OperandSelectors, ";") != "validator=app=v;validator=app=w" {
		t.Fatalf("flags: %v %v", s.OperandSelectors, err)
	}
	for _, bad := range [][]string{{"--plugin-selector", "app in (("}, {"--operand-selector", "dcgm-exportr=app=x"}, {"--operand-selector", "dcgm="}} {
		if _, err := settingsFor(t, bad...); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

func TestSettingsRebootKured(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	s, err := settingsFor(t, "--reboot-method", "kured")
	if err != nil || s.RebootSentinel != "/var/run/reboot-required" || s.Validate() != nil {
		t.Fatalf("%+v %v", s, err)
	}
	s, _ = settingsFor(t, "--reboot-method", "kured", "--reboot-sentinel", "relative/file")
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "--reboot-sentinel") {
		t.Fatalf("relative sentinel: %v", err)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const twoConfigs = `version: v1
mig-configs:
  balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  shared:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 3, "3g.71gb": 1}
  off:
    - devices: all
      mig-enabled: false
`

// runOut runs the CLI in process and returns the exit code and what it
// printed to stdout and stderr.
func runOut(t *testing.T, args ...string) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	root := newRoot()
	root.SetOut(w)
	code := run(context.Background(), args)
	os.Stdout, os.Stderr = oldOut, oldErr
	w.Close()
	return code, <-done
}

func writeConfig(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// assert exits 0 when the GPUs hold the config, 1 when they do not and 2 on
// bad input (nvidia-mig-parted assert has no 2: its main.go log.Fatal exits
// 1); --valid-config (-a) checks only the file and the name.
func TestAssertExitCodes(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, twoConfigs)
	sim := []string{"--nvml", "sim:h200x2", "--sim-state", filepath.Join(dir, "s.json"), "--log-level", "error"}
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("version: v1\nmig-configs: {x: [{devices: all, mig-enabled: maybe}]}\n"), 0o600)
	steps := []struct {
		args []string
		want int
	}{
		{[]string{"assert", "-f", cfg, "-c", "balanced"}, exitFailed},       // MIG off: not applied
		{[]string{"assert", "-f", cfg, "-c", "off"}, exitOK},                // MIG off is what it asks
		{[]string{"assert", "-f", cfg, "-c", "balanced", "-m"}, exitFailed}, // not even the mode
		{[]string{"apply", "-f", cfg, "-c", "balanced"}, exitOK},
		{[]string{"assert", "-f", cfg, "-c", "balanced"}, exitOK},
		{[]string{"assert", "-f", cfg, "-c", "shared", "--mode-only"}, exitOK}, // the mode matches
		{[]string{"assert", "-f", cfg, "-c", "shared"}, exitFailed},
		{[]string{"assert", "-c", "all-balanced"}, exitOK}, // a generated config, no file
		{[]string{"apply", "-f", cfg, "-c", "shared"}, exitOK},
		{[]string{"assert", "-f", cfg, "-c", "shared"}, exitOK},
		{[]string{"assert", "-f", cfg, "-c", "no-such"}, exitBadInput},
		{[]string{"assert", "-f", cfg}, exitBadInput}, // three configs: -c needed
		{[]string{"assert", "-f", bad, "-c", "x"}, exitBadInput},
		{[]string{"assert", "-f", filepath.Join(dir, "missing.yaml"), "-c", "x"}, exitBadInput},
		{[]string{"assert", "--no-such-flag"}, exitBadInput},
		{[]string{"assert", "-f", cfg, "-c", "balanced", "--valid-config"}, exitOK},
		{[]string{"assert", "-f", cfg, "-c", "no-such", "-a"}, exitBadInput},
		{[]string{"assert", "-f", bad, "-c", "x", "-a"}, exitBadInput},
	}
	for i, s := range steps {
		if got, out := runOut(t, append(s.args, sim...)...); got != s.want {
			t.Fatalf("step %d %v: exit %d, want %d\n%s", i, s.args, got, s.want, out)
		}
	}
}

// -f and -c of the offline commands come from flag, MIG_AGENT_* variable,
// nvidia-mig-parted's variable or the settings file alike, with the flag
// first; a file with one config needs no -c.
func TestOfflineConfigFromEnvAndSettings(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, twoConfigs)
	one := filepath.Join(dir, "one.yaml")
	_ = os.WriteFile(one, []byte("version: v1\nmig-configs:\n  only:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"7g.141gb\": 1}\n"), 0o600)
	state := filepath.Join(dir, "s.json")
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", state, "--log-level", "error"}
	settings := filepath.Join(dir, "settings.yaml")
	_ = os.WriteFile(settings, []byte("config-file: "+cfg+"\nselected-config: balanced\n"), 0o600)

	if code, out := runOut(t, append([]string{"apply", "--settings", settings}, sim...)...); code != 0 {
		t.Fatalf("apply from the settings file: %d\n%s", code, out)
	}
	if code, _ := runOut(t, append([]string{"assert", "--settings", settings}, sim...)...); code != 0 {
		t.Fatal("assert from the settings file: not applied")
	}
	// The environment over the settings file.
	t.Setenv("MIG_AGENT_SELECTED_CONFIG", "shared")
	if code, _ := runOut(t, append([]string{"assert", "--settings", settings}, sim...)...); code != exitFailed {
		t.Fatalf("MIG_AGENT_SELECTED_CONFIG=shared: exit %d, want 1", code)
	}
	// The flag over the environment.
	if code, _ := runOut(t, append([]string{"assert", "--settings", settings, "-c", "balanced"}, sim...)...); code != 0 {
		t.Fatal("-c balanced over the environment: not applied")
	}
	os.Unsetenv("MIG_AGENT_SELECTED_CONFIG")

	// mig-parted's variables, where the native ones are not given, with a
	// warning naming the native one.
	t.Setenv("MIG_PARTED_CONFIG_FILE", one)
	code, out := runOut(t, append([]string{"apply"}, sim...)...)
	if code != 0 || !strings.Contains(out, "MIG_AGENT_CONFIG_FILE") {
		t.Fatalf("MIG_PARTED_CONFIG_FILE with one config: %d\n%s", code, out)
	}
	t.Setenv("MIG_PARTED_CONFIG_FILE", cfg)
	t.Setenv("MIG_PARTED_SELECTED_CONFIG", "balanced")
	if code, out := runOut(t, append([]string{"plan", "-o", "json"}, sim...)...); code != 0 || !strings.Contains(out, `"config": "balanced"`) {
		t.Fatalf("plan from MIG_PARTED_*: %d\n%s", code, out)
	}
	t.Setenv("MIG_AGENT_SELECTED_CONFIG", "shared")
	if code, out := runOut(t, append([]string{"plan", "-o", "json"}, sim...)...); code != 0 || !strings.Contains(out, `"config": "shared"`) {
		t.Fatalf("MIG_AGENT_* over MIG_PARTED_*: %d\n%s", code, out)
	}
}

// export --config-name names the config it writes (default current).
func TestExportConfigName(t *testing.T) {
	dir := t.TempDir()
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", filepath.Join(dir, "s.json"), "--log-level", "error"}
	if code, out := runOut(t, append([]string{"apply", "-c", "all-balanced"}, sim...)...); code != 0 {
		t.Fatal(out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "current"},
		{[]string{"--config-name", "gpu-pool-a"}, "gpu-pool-a"},
		{[]string{"-l", "label"}, "label"},
	} {
		code, out := runOut(t, append(append([]string{"export", "-o", "json"}, tc.args...), sim...)...)
		var doc struct {
			Configs map[string]json.RawMessage `json:"mig-configs"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || len(doc.Configs) != 1 || doc.Configs[tc.want] == nil {
			t.Fatalf("%v: %d\n%s", tc.args, code, out)
		}
	}
	if code, _ := runOut(t, append([]string{"export", "--config-name", ""}, sim...)...); code != exitBadInput {
		t.Fatalf("empty --config-name: exit %d", code)
	}
}

// hookScript records each hook's name and exported environment in LOG.
const hookScript = `printf 'hook %s\n' "$1" >> "$LOG"; export -p >> "$LOG"`

func hooksFile(t *testing.T, dir, log string, fail string) string {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("version: v1\nhooks:\n")
	for _, h := range []string{"apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"} {
		script := hookScript
		if h == fail {
			script += `; echo "boom from ` + h + `"; exit 3`
		}
		b.WriteString("  " + h + ":\n    - command: /bin/sh\n      args: [\"-c\", " + jsonString(script) + ", \"sh\", \"" + h + "\"]\n")
		b.WriteString("      workdir: " + dir + "\n      envs: {LOG: " + log + ", MIG_PARTED_SELECTED_CONFIG: not-this}\n")
	}
	p := filepath.Join(dir, "hooks.yaml")
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

// hookRecord parses LOG: hook names in order, and per hook the variables
// it saw (shell bookkeeping like PWD left out).
func hookRecord(t *testing.T, log string) ([]string, []map[string]string) {
	t.Helper()
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var envs []map[string]string
	for _, line := range strings.Split(string(data), "\n") {
		if name, ok := strings.CutPrefix(line, "hook "); ok {
			names = append(names, name)
			envs = append(envs, map[string]string{})
			continue
		}
		kv, ok := strings.CutPrefix(line, "export ")
		if !ok || len(envs) == 0 {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		if k == "PWD" || k == "OLDPWD" || k == "SHLVL" || k == "_" {
			continue
		}
		envs[len(envs)-1][k] = strings.Trim(v, `'"`)
	}
	return names, envs
}

// apply -k runs nvidia-mig-parted's hook points in its order
// (ApplyMigConfigWithHooks, cmd/nvidia-mig-parted/apply/apply.go), each with
// only its own envs and mig-parted's five variables over them
// (GetHooksEnvsMap; HookSpec.Run sets the whole environment).
func TestApplyHooks(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, twoConfigs)
	log := filepath.Join(dir, "hooks.log")
	hooks := hooksFile(t, dir, log, "")
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", filepath.Join(dir, "s.json"), "--log-level", "error"}
	t.Setenv("SECRET_OF_THE_CALLER", "must-not-leak")

	if code, out := runOut(t, append([]string{"apply", "-f", cfg, "-c", "balanced", "-k", hooks}, sim...)...); code != 0 {
		t.Fatalf("apply: %d\n%s", code, out)
	}
	names, envs := hookRecord(t, log)
	if want := []string{"apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"}; !slices.Equal(names, want) {
		t.Fatalf("hooks ran %v, want %v", names, want)
	}
	want := map[string]string{
		"LOG": log, "MIG_PARTED_CONFIG_FILE": cfg, "MIG_PARTED_SELECTED_CONFIG": "balanced",
		"MIG_PARTED_HOOKS_FILE": hooks, "MIG_PARTED_SKIP_RESET": "false", "MIG_PARTED_MODE_CHANGE_ONLY": "false",
	}
	for i, env := range envs {
		if len(env) != len(want) {
			t.Errorf("%s saw %v, want exactly %v", names[i], env, want)
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("%s: %s=%q, want %q", names[i], k, env[k], v)
			}
		}
	}

	// A MIG-devices-only change: no pre-apply-mode.
	os.Remove(log)
	if code, out := runOut(t, append([]string{"apply", "-f", cfg, "-c", "shared", "-k", hooks}, sim...)...); code != 0 {
		t.Fatalf("apply shared: %d\n%s", code, out)
	}
	if names, _ := hookRecord(t, log); !slices.Equal(names, []string{"apply-start", "pre-apply-config", "apply-exit"}) {
		t.Fatalf("devices-only change ran %v", names)
	}
	// Already applied: only apply-start and apply-exit.
	os.Remove(log)
	if code, _ := runOut(t, append([]string{"apply", "-f", cfg, "-c", "shared", "-k", hooks}, sim...)...); code != 0 {
		t.Fatal("second apply failed")
	}
	if names, _ := hookRecord(t, log); !slices.Equal(names, []string{"apply-start", "apply-exit"}) {
		t.Fatalf("applied config ran %v", names)
	}
	// --mode-only and --skip-reset reach the hooks through the variables.
	os.Remove(log)
	if code, out := runOut(t, append([]string{"apply", "-f", cfg, "-c", "off", "-k", hooks, "-m", "-s"}, sim...)...); code != 0 {
		t.Fatalf("mode-only: %d\n%s", code, out)
	}
	names, envs = hookRecord(t, log)
	if !slices.Equal(names, []string{"apply-start", "pre-apply-mode", "apply-exit"}) ||
		envs[0]["MIG_PARTED_MODE_CHANGE_ONLY"] != "true" || envs[0]["MIG_PARTED_SKIP_RESET"] != "true" {
		t.Fatalf("mode-only ran %v with %v", names, envs)
	}
	// The same from mig-parted's variables (MIG_PARTED_MODE_ONLY beside
	// the MIG_PARTED_MODE_CHANGE_ONLY mig-parted reads).
	os.Remove(log)
	t.Setenv("MIG_PARTED_MODE_ONLY", "true")
	t.Setenv("MIG_PARTED_SKIP_RESET", "true")
	if code, out := runOut(t, append([]string{"apply", "-f", cfg, "-c", "balanced", "-k", hooks}, sim...)...); code != 0 || !strings.Contains(out, "MIG_AGENT_MODE_ONLY") {
		t.Fatalf("mode-only from MIG_PARTED_MODE_ONLY: %d\n%s", code, out)
	}
	names, envs = hookRecord(t, log)
	if !slices.Equal(names, []string{"apply-start", "pre-apply-mode", "apply-exit"}) ||
		envs[0]["MIG_PARTED_MODE_CHANGE_ONLY"] != "true" || envs[0]["MIG_PARTED_SKIP_RESET"] != "true" {
		t.Fatalf("mode-only from the environment ran %v with %v", names, envs)
	}
}

// A failing hook fails the change with its output; apply-exit still runs,
// and what comes after the failing hook does not.
func TestApplyHookFails(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, twoConfigs)
	log := filepath.Join(dir, "hooks.log")
	hooks := hooksFile(t, dir, log, "pre-apply-config")
	state := filepath.Join(dir, "s.json")
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", state, "--log-level", "error"}
	code, out := runOut(t, append([]string{"apply", "-f", cfg, "-c", "balanced", "-k", hooks}, sim...)...)
	if code != exitFailed || !strings.Contains(out, "pre-apply-config hook") || !strings.Contains(out, "boom from pre-apply-config") {
		t.Fatalf("exit %d, want 1 with the hook's output\n%s", code, out)
	}
	if names, _ := hookRecord(t, log); !slices.Equal(names, []string{"apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"}) {
		t.Fatalf("hooks ran %v", names)
	}
	if code, _ := runOut(t, append([]string{"assert", "-f", cfg, "-c", "balanced"}, sim...)...); code != exitFailed {
		t.Fatal("the MIG devices were created though pre-apply-config failed")
	}
	// apply-start failing stops everything, apply-exit included (mig-parted
	// defers apply-exit only after apply-start passed).
	os.Remove(log)
	hooks = hooksFile(t, dir, log, "apply-start")
	if code, _ := runOut(t, append([]string{"apply", "-f", cfg, "-c", "off", "-k", hooks}, sim...)...); code != exitFailed {
		t.Fatalf("apply-start failing: exit %d", code)
	}
	if names, _ := hookRecord(t, log); !slices.Equal(names, []string{"apply-start"}) {
		t.Fatalf("hooks ran %v", names)
	}
	// A hooks file with a misspelt hook point is bad input.
	badHooks := filepath.Join(dir, "bad-hooks.yaml")
	_ = os.WriteFile(badHooks, []byte("version: v1\nhooks:\n  pre-apply-modes:\n    - command: /bin/true\n"), 0o600)
	if code, out := runOut(t, append([]string{"apply", "-f", cfg, "-c", "off", "-k", badHooks}, sim...)...); code != exitBadInput || !strings.Contains(out, "pre-apply-modes") {
		t.Fatalf("misspelt hook point: exit %d\n%s", code, out)
	}
}

// plan -o json keeps destroy and create for GPU instances and lists the
// compute instances that change inside kept ones in destroyCompute and
// createCompute.
func TestPlanJSONComputeInstances(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, twoConfigs)
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", filepath.Join(dir, "s.json"), "--log-level", "error"}
	extra := filepath.Join(dir, "two.yaml")
	_ = os.WriteFile(extra, []byte("version: v1\nmig-configs:\n  two:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1c.3g.71gb\": 2, \"3g.71gb\": 1}\n"), 0o600)
	if code, out := runOut(t, append([]string{"apply", "-f", extra}, sim...)...); code != 0 {
		t.Fatal(out)
	}
	code, out := runOut(t, append([]string{"plan", "-f", cfg, "-c", "shared", "-o", "json"}, sim...)...)
	var plan struct {
		GPUs []struct {
			Action  string            `json:"action"`
			Destroy []json.RawMessage `json:"destroy"`
			Create  []json.RawMessage `json:"create"`
			Keep    []struct {
				Profile string   `json:"profile"`
				Start   int      `json:"start"`
				CIs     []string `json:"computeInstances"`
			} `json:"keep"`
			DestroyCompute []json.RawMessage `json:"destroyCompute"`
			CreateCompute  []struct {
				Profile string `json:"profile"`
				Start   int    `json:"start"`
				Compute string `json:"compute"`
			} `json:"createCompute"`
		} `json:"gpus"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil || len(plan.GPUs) != 1 {
		t.Fatalf("plan: %d\n%s", code, out)
	}
	g := plan.GPUs[0]
	if g.Action != "change" || g.Destroy == nil || len(g.Destroy) != 0 || g.Create == nil || len(g.Create) != 0 ||
		len(g.DestroyCompute) != 0 || len(g.CreateCompute) != 1 || g.CreateCompute[0].Compute != "1c.3g.71gb" ||
		g.CreateCompute[0].Profile != "3g.71gb" || len(g.Keep) != 2 {
		t.Fatalf("plan:\n%s", out)
	}
	held := false
	for _, k := range g.Keep {
		held = held || k.Start == g.CreateCompute[0].Start && slices.Equal(k.CIs, []string{"1c.3g.71gb", "1c.3g.71gb", "1c.3g.71gb"})
	}
	if !held {
		t.Fatalf("keep does not show the GPU instance with its three compute instances:\n%s", out)
	}
	code, out = runOut(t, append([]string{"plan", "-f", cfg, "-c", "shared"}, sim...)...)
	if code != 0 || !strings.Contains(out, "create  compute instance 1c.3g.71gb in 3g.71gb@") {
		t.Fatalf("plan text:\n%s", out)
	}
}

// nvidia-mig-parted's long flag names: export --output-format and
// --config-label, and the global -d/--debug.
func TestMigPartedFlagNames(t *testing.T) {
	dir := t.TempDir()
	sim := []string{"--nvml", "sim:h200x1", "--sim-state", filepath.Join(dir, "s.json")}
	code, out := runOut(t, append([]string{"export", "--output-format", "json", "--config-label", "mine", "--log-level", "error"}, sim...)...)
	if code != exitOK || !strings.Contains(out, `"mine"`) || !strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Fatalf("export with mig-parted's names: exit %d\n%s", code, out)
	}
	code, out = runOut(t, append([]string{"profiles", "-d"}, sim...)...)
	if code != exitOK || !strings.Contains(out, "level=DEBUG") {
		t.Fatalf("-d: exit %d, no debug line\n%s", code, out)
	}
}

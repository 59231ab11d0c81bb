package test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestStartupTaints: startupTaints reach the agent's settings as
// startup-taint, and the agent's pod tolerates each of them (it runs on
// the node it lifts them from), beside the chart's tolerations; a taint
// that is not key[=value]:effect, or the setting under settings, is
// refused.
func TestStartupTaints(t *testing.T) {
	vals := map[string]any{"startupTaints": []any{"migagent.io/geometry-pending=true:NoSchedule", "example.com/wait:NoExecute"}}
	objs := objects(t, mustRender(t, cases[0], vals))
	cm := one(t, objs, "ConfigMap")
	var settings map[string]any
	if err := yaml.Unmarshal([]byte(get(cm, "data", "settings.yaml").(string)), &settings); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(settings["startup-taint"]); got != "[migagent.io/geometry-pending=true:NoSchedule example.com/wait:NoExecute]" {
		t.Errorf("settings startup-taint %s", got)
	}
	tols := get(one(t, objs, "DaemonSet"), "spec", "template", "spec", "tolerations").([]any)
	want := []any{
		map[string]any{"key": "nvidia.com/gpu", "operator": "Exists"},
		map[string]any{"key": "migagent.io/reconfiguring", "operator": "Exists"},
		map[string]any{"key": "migagent.io/geometry-pending", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
		map[string]any{"key": "example.com/wait", "operator": "Exists", "effect": "NoExecute"},
	}
	if !reflect.DeepEqual(tols, want) {
		t.Errorf("tolerations %v, want %v", tols, want)
	}
	for values, msg := range map[string]string{
		"startupTaints: [nokey]":                    "startupTaints",
		"startupTaints: ['a=b:Sometimes']":          "startupTaints",
		"settings: {startup-taint: [a:NoSchedule]}": "set by the chart from startupTaints",
		"settings: {startupTaints: [a:NoSchedule]}": "set by the chart from startupTaints",
	} {
		v := map[string]any{}
		if err := yaml.Unmarshal([]byte(values), &v); err != nil {
			t.Fatal(err)
		}
		if _, err := render(t, "mig-agent", "mig-agent", v); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: error %v, want %q", values, err, msg)
		}
	}
}

// TestKuredRebootMethod: rebootMethod kured mounts the directory of
// kured's sentinel (kured.sentinel, a host path) and points the agent at
// the file there; no D-Bus.
func TestKuredRebootMethod(t *testing.T) {
	vals := map[string]any{"rebootMethod": "kured", "kured": map[string]any{"sentinel": "/run/kured/reboot-required"}}
	objs := objects(t, mustRender(t, cases[0], vals))
	var settings map[string]any
	if err := yaml.Unmarshal([]byte(get(one(t, objs, "ConfigMap"), "data", "settings.yaml").(string)), &settings); err != nil {
		t.Fatal(err)
	}
	if settings["reboot-method"] != "kured" || settings["reboot-sentinel"] != "/kured-sentinel/reboot-required" {
		t.Errorf("settings %v", settings)
	}
	pod := get(one(t, objs, "DaemonSet"), "spec", "template", "spec")
	vols, mounts := fmt.Sprint(get(pod, "volumes")), fmt.Sprint(get(pod, "containers", 0, "volumeMounts"))
	if !strings.Contains(vols, "hostPath:map[path:/run/kured type:Directory] name:kured-sentinel") ||
		!strings.Contains(mounts, "mountPath:/kured-sentinel name:kured-sentinel") || strings.Contains(vols, "dbus") {
		t.Errorf("volumes %s\nmounts %s", vols, mounts)
	}
	v := map[string]any{"rebootMethod": "kured", "kured": map[string]any{"sentinel": "reboot-required"}}
	if _, err := render(t, "mig-agent", "mig-agent", v); err == nil || !strings.Contains(err.Error(), "sentinel") {
		t.Errorf("relative sentinel: %v", err)
	}
	v = map[string]any{"settings": map[string]any{"reboot-sentinel": "/x"}}
	if _, err := render(t, "mig-agent", "mig-agent", v); err == nil || !strings.Contains(err.Error(), "set by the chart from kured.sentinel") {
		t.Errorf("reboot-sentinel in settings: %v", err)
	}
}

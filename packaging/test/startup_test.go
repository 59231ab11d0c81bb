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

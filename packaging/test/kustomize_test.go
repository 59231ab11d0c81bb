package test

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// gpuOperatorOverlay is the plain manifests' counterpart of
// values-gpu-operator.yaml.
const gpuOperatorOverlay = "../kubernetes-gpu-operator"

// kustomizeBuild renders a kustomization as `kubectl apply -k` does, with
// kustomize's own Go packages.
func kustomizeBuild(t *testing.T, dir string) []map[string]any {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []map[string]any
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestGPUOperatorOverlay: `kubectl apply -k packaging/kubernetes-gpu-operator`
// creates what the chart renders with values-gpu-operator.yaml (but the
// Namespace, which Helm leaves to --create-namespace), apart from Helm's
// labels and annotations; and the base builds into the directory's
// manifests.
func TestGPUOperatorOverlay(t *testing.T) {
	if base, plain := kustomizeBuild(t, plainDir), readPlain(t); len(base) != len(plain) {
		t.Errorf("kustomize builds %d objects from %s, the directory holds %d", len(base), plainDir, len(plain))
	}
	sameAsChart(t, gpuOperatorCase(), gpuOperatorOverlay)
}

// draOverlay is the plain manifests' counterpart of values-dra.yaml.
const draOverlay = "../kubernetes-dra"

// TestDRAOverlay: `kubectl apply -k packaging/kubernetes-dra` creates what
// the chart renders with values-dra.yaml, as TestGPUOperatorOverlay.
func TestDRAOverlay(t *testing.T) {
	for _, c := range cases {
		if c.name == "dra" {
			sameAsChart(t, c, draOverlay)
			return
		}
	}
	t.Fatal("no dra case")
}

// sameAsChart compares the overlay's objects with the chart's render of c.
func sameAsChart(t *testing.T, c renderCase, overlayDir string) {
	t.Helper()
	chart := objects(t, mustRender(t, c, readValues(t, c.name)))
	overlay := kustomizeBuild(t, overlayDir)
	key := func(o map[string]any) string {
		return fmt.Sprintf("%s/%v/%v", o["kind"], get(o, "metadata", "namespace"), get(o, "metadata", "name"))
	}
	byKey := map[string]map[string]any{}
	for _, o := range chart {
		byKey[key(o)] = o
	}
	seen := map[string]bool{}
	for _, o := range overlay {
		if o["kind"] == "Namespace" {
			continue
		}
		k := key(o)
		seen[k] = true
		ch, ok := byKey[k]
		if !ok {
			t.Errorf("the overlay creates %s, which the chart does not render", k)
			continue
		}
		if o["kind"] == "ConfigMap" {
			var os, cs map[string]any
			if err := yaml.Unmarshal([]byte(get(o, "data", "settings.yaml").(string)), &os); err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal([]byte(get(ch, "data", "settings.yaml").(string)), &cs); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(os, cs) {
				t.Errorf("settings: overlay %v, chart %v", os, cs)
			}
			continue
		}
		if ps, cs := normalize(stripMeta(o)), normalize(stripMeta(ch)); !reflect.DeepEqual(ps, cs) {
			pb, _ := yaml.Marshal(ps)
			cb, _ := yaml.Marshal(cs)
			t.Errorf("%s differs:\n%s", k, diffNamed("overlay", "chart", string(pb), string(cb)))
		}
	}
	for _, o := range chart {
		if k := key(o); !seen[k] {
			t.Errorf("the chart renders %s, which the overlay lacks", k)
		}
	}
}

// normalize drops what differs between the two without a difference in
// meaning: the order of a pod's volumes and of a container's mounts (none
// is nested in another here; kustomize's strategic merge puts the patch's
// new entries first), and the line breaks in CEL expressions (kustomize's
// YAML round trip adds a newline where a folded scalar has more-indented
// lines; CEL ignores whitespace).
func normalize(obj map[string]any) map[string]any {
	byName := func(l []any) {
		sort.SliceStable(l, func(i, j int) bool { return fmt.Sprint(get(l[i], "name")) < fmt.Sprint(get(l[j], "name")) })
	}
	pod := get(obj, "spec", "template", "spec")
	byName(asList(get(pod, "volumes")))
	for _, key := range []string{"containers", "initContainers"} {
		for _, c := range asList(get(pod, key)) {
			byName(asList(get(c, "volumeMounts")))
		}
	}
	for _, key := range []string{"variables", "validations", "matchConditions"} {
		for _, v := range asList(get(obj, "spec", key)) {
			if m, ok := v.(map[string]any); ok {
				if e, ok := m["expression"].(string); ok {
					m["expression"] = strings.Join(strings.Fields(e), " ")
				}
			}
		}
	}
	return obj
}

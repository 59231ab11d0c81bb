package test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden renders in testdata")

const (
	chartDir = "../helm/mig-agent"
	plainDir = "../kubernetes"
	// kubeVersion is the API server version of the project's tests.
	kubeVersion = "v1.37.2"
)

// renderCase is one release of the chart: its values file (values, else
// testdata/NAME.values.yaml, if any) is rendered into testdata/NAME.yaml.
type renderCase struct {
	name, release, namespace string
	values                   string // a values file, relative to this directory
}

var cases = []renderCase{
	// The defaults: the same objects as packaging/kubernetes.
	{"default", "mig-agent", "mig-agent", ""},
	// Every option on, another release name and namespace.
	{"full", "gpu-mig-agent", "gpu-system", ""},
	// The values file the chart ships for clusters that run the GPU
	// Operator, as docs/install-gpu-operator.md installs it.
	{"gpu-operator", "mig-agent", "mig-agent", gpuOperatorValues},
	// The values file the chart ships for clusters whose GPUs NVIDIA's DRA
	// driver serves, as docs/install-dra.md installs it.
	{"dra", "mig-agent", "mig-agent", draValues},
	// The OpenShift SecurityContextConstraints.
	{"openshift", "mig-agent", "mig-agent", ""},
}

// gpuOperatorValues is the chart's values file for GPU Operator clusters.
const gpuOperatorValues = chartDir + "/values-gpu-operator.yaml"

// draValues is the chart's values file for clusters served by the NVIDIA
// DRA driver.
const draValues = chartDir + "/values-dra.yaml"

func (c renderCase) valuesFile() string {
	if c.values != "" {
		return c.values
	}
	return filepath.Join("testdata", c.name+".values.yaml")
}

func readValues(t *testing.T, name string) map[string]any {
	t.Helper()
	for _, c := range cases {
		if c.name == name {
			return readValuesFile(t, c.valuesFile())
		}
	}
	return readValuesFile(t, filepath.Join("testdata", name+".values.yaml"))
}

func readValuesFile(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return map[string]any{}
	}
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return vals
}

func capabilities(t testing.TB) *common.Capabilities {
	t.Helper()
	return capabilitiesAt(t, kubeVersion)
}

func capabilitiesAt(t testing.TB, version string) *common.Capabilities {
	t.Helper()
	caps := common.DefaultCapabilities.Copy()
	kv, err := common.ParseKubeVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	caps.KubeVersion = *kv
	return caps
}

// render renders the chart as `helm template` does (with the values
// schema checked) and returns the manifests in template order, each
// headed by its source, NOTES.txt left out.
func render(t testing.TB, release, namespace string, vals map[string]any) (string, error) {
	t.Helper()
	return renderAt(t, kubeVersion, release, namespace, vals)
}

// renderAt renders as `helm template --kube-version version` does, the
// chart's kubeVersion constraint included.
func renderAt(t testing.TB, version, release, namespace string, vals map[string]any) (string, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	caps := capabilitiesAt(t, version)
	// As Helm's install action does before rendering (pkg/action/action.go).
	if !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", chrt.Metadata.KubeVersion, caps.KubeVersion.String())
	}
	opts := common.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := util.ToRenderValuesWithSchemaValidation(chrt, vals, opts, caps, false)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(files[name]) == "" {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		body := strings.TrimSpace(files[name])
		body = strings.TrimPrefix(body, "---\n")
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", name, body)
	}
	return b.String(), nil
}

func mustRender(t testing.TB, c renderCase, vals map[string]any) string {
	t.Helper()
	out, err := render(t, c.release, c.namespace, vals)
	if err != nil {
		t.Fatalf("rendering %s: %v", c.name, err)
	}
	return out
}

// objects splits a multi-document YAML text into objects (empty documents
// dropped).
func objects(t testing.TB, text string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		obj := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("parsing %q: %v", doc, err)
		}
		if len(obj) > 0 {
			out = append(out, obj)
		}
	}
	return out
}

func find(objs []map[string]any, kind string) []map[string]any {
	var out []map[string]any
	for _, o := range objs {
		if o["kind"] == kind {
			out = append(out, o)
		}
	}
	return out
}

func one(t testing.TB, objs []map[string]any, kind string) map[string]any {
	t.Helper()
	f := find(objs, kind)
	if len(f) != 1 {
		t.Fatalf("want one %s, have %d", kind, len(f))
	}
	return f[0]
}

// get walks a path of map keys and list indices.
func get(obj any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := obj.(map[string]any)
			if !ok {
				return nil
			}
			obj = m[k]
		case int:
			l, ok := obj.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			obj = l[k]
		}
	}
	return obj
}

func TestLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := lint.RunAll(chartDir, readValues(t, c.name), c.namespace, lint.WithKubeVersion(kv))
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %v", m)
				} else {
					t.Logf("helm lint: %v", m)
				}
			}
		})
	}
}

func TestGolden(t *testing.T) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := mustRender(t, c, readValues(t, c.name))
			path := filepath.Join("testdata", c.name+".yaml")
			if *update {
				header := fmt.Sprintf("# Generated by `go test -run TestGolden -update` in packaging/test: the chart\n"+
					"# rendered as release %q in namespace %q (values: %s).\n", c.release, c.namespace, filepath.ToSlash(c.valuesFile()))
				if err := os.WriteFile(path, []byte(header+got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestGolden -update)", err)
			}
			if _, body, _ := strings.Cut(string(want), "\n---\n"); "---\n"+body != got {
				t.Errorf("the render of %s differs from %s (go test -run TestGolden -update rewrites it):\n%s",
					c.name, path, diff("---\n"+body, got))
			}
		})
	}
}

// diff names the first differing line.
func diff(want, got string) string { return diffNamed("golden", "render", want, got) }

func diffNamed(wantName, gotName, want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  %s: %q\n  %s: %q", i+1, wantName, wl, gotName, gl)
		}
	}
	return "(equal)"
}

// stripMeta drops metadata.labels and metadata.annotations (the chart
// adds Helm's labels and a checksum) from a copy of obj. Selectors stay:
// they are immutable, so they must be equal for a move between the plain
// manifests and the chart.
func stripMeta(obj map[string]any) map[string]any {
	raw, _ := yaml.Marshal(obj)
	cp := map[string]any{}
	_ = yaml.Unmarshal(raw, &cp)
	for _, md := range []any{cp["metadata"], get(cp, "spec", "template", "metadata")} {
		if m, ok := md.(map[string]any); ok {
			delete(m, "labels")
			delete(m, "annotations")
		}
	}
	return cp
}

func readPlain(t *testing.T) []map[string]any {
	t.Helper()
	var all []map[string]any
	paths, err := filepath.Glob(filepath.Join(plainDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if filepath.Base(p) == "kustomization.yaml" {
			continue
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, objects(t, string(raw))...)
	}
	return all
}

// TestDefaultsMatchPlainManifests: with default values the chart renders
// what packaging/kubernetes holds (but the Namespace, which Helm leaves to
// --create-namespace), apart from Helm's labels and annotations.
func TestDefaultsMatchPlainManifests(t *testing.T) {
	chart := objects(t, mustRender(t, cases[0], nil))
	plain := readPlain(t)
	key := func(o map[string]any) string {
		return fmt.Sprintf("%s/%s/%v", o["kind"], get(o, "metadata", "namespace"), get(o, "metadata", "name"))
	}
	byKey := map[string]map[string]any{}
	for _, o := range chart {
		byKey[key(o)] = o
	}
	seen := map[string]bool{}
	for _, p := range plain {
		k := key(p)
		if p["kind"] == "Namespace" {
			continue
		}
		seen[k] = true
		c, ok := byKey[k]
		if !ok {
			t.Errorf("the chart does not render %s", k)
			continue
		}
		if p["kind"] == "ConfigMap" {
			// The settings text: same keys and values, comments aside.
			var ps, cs map[string]any
			if err := yaml.Unmarshal([]byte(get(p, "data", "settings.yaml").(string)), &ps); err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal([]byte(get(c, "data", "settings.yaml").(string)), &cs); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(ps, cs) {
				t.Errorf("settings: plain %v, chart %v", ps, cs)
			}
			continue
		}
		if ps, cs := stripMeta(p), stripMeta(c); !reflect.DeepEqual(ps, cs) {
			pb, _ := yaml.Marshal(ps)
			cb, _ := yaml.Marshal(cs)
			t.Errorf("%s differs:\n%s", k, diffNamed("plain", "chart", string(pb), string(cb)))
		}
		// The plain pod template carries the selector's labels too.
		if sel, ok := get(p, "spec", "selector", "matchLabels").(map[string]any); ok {
			for lk, lv := range sel {
				if get(p, "spec", "template", "metadata", "labels", lk) != lv {
					t.Errorf("%s: the pod template lacks the selector's label %s=%v", k, lk, lv)
				}
			}
		}
	}
	for _, o := range chart {
		if k := key(o); !seen[k] {
			t.Errorf("the chart renders %s, which packaging/kubernetes lacks", k)
		}
	}
}

func TestFullOptions(t *testing.T) {
	c := cases[1]
	objs := objects(t, mustRender(t, c, readValues(t, c.name)))
	ds := one(t, objs, "DaemonSet")
	pod := get(ds, "spec", "template", "spec")
	if got := get(pod, "runtimeClassName"); got != "nvidia" {
		t.Errorf("runtimeClassName %v", got)
	}
	args := fmt.Sprint(get(pod, "containers", 0, "args"))
	if !strings.Contains(args, "--metrics-address=:9100") || get(pod, "containers", 0, "ports", 0, "containerPort") != float64(9100) {
		t.Errorf("metrics port 9100 not used: args %s, ports %v", args, get(pod, "containers", 0, "ports"))
	}
	// rebootMethod none, no host GPU clients: no D-Bus socket mounted.
	if vols := fmt.Sprint(get(pod, "volumes")); strings.Contains(vols, "dbus") {
		t.Errorf("D-Bus mounted with rebootMethod none: %s", vols)
	}
	cm := one(t, objs, "ConfigMap")
	var settings map[string]any
	if err := yaml.Unmarshal([]byte(get(cm, "data", "settings.yaml").(string)), &settings); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"max-concurrent": float64(2), "pause-gpu-operator": true, "default-config": "all-balanced",
		"reboot-method": "none", "config-file": "/etc/mig-agent/config.yaml", "drain-timeout": "10m"}
	for k, v := range want {
		if settings[k] != v {
			t.Errorf("settings %s = %v, want %v (all: %v)", k, settings[k], v, settings)
		}
	}
	if get(cm, "data", "config.yaml") == nil {
		t.Error("migConfig is not in the ConfigMap")
	}
	vap := named(t, objs, "ValidatingAdmissionPolicy", "-node-scope")
	if got := get(vap, "spec", "matchConditions", 0, "expression"); got != "request.userInfo.username == 'system:serviceaccount:gpu-system:gpu-mig-agent'" {
		t.Errorf("policy matches %v", got)
	}
	for _, v := range get(vap, "spec", "variables").([]any) {
		if get(v, "name") == "pauseGpuOperator" && get(v, "expression") != "true" {
			t.Errorf("pauseGpuOperator variable %v with pauseGpuOperator: true", get(v, "expression"))
		}
	}
	if b := named(t, objs, "ValidatingAdmissionPolicyBinding", "-node-scope"); get(b, "spec", "policyName") != get(vap, "metadata", "name") {
		t.Errorf("binding names policy %v, the policy is %v", get(b, "spec", "policyName"), get(vap, "metadata", "name"))
	}
	for _, kind := range []string{"Service", "ServiceMonitor", "PodMonitor"} {
		one(t, objs, kind)
	}
	// planner.enabled: its Deployment runs `mig-agent planner` on the
	// chart's MIG config file, with the allowed configs.
	plan := one(t, objs, "Deployment")
	planArgs := fmt.Sprint(get(plan, "spec", "template", "spec", "containers", 0, "args"))
	for _, want := range []string{"planner", "--allowed-configs=all-disabled,inference", "--max-concurrent=2", "--hold-time=5m", "--config-file=/mig-parted-config/config.yaml", "--namespace=gpu-system"} {
		if !strings.Contains(planArgs, want) {
			t.Errorf("planner args %s lack %s", planArgs, want)
		}
	}
	// The planner's policy: its ServiceAccount, the allowed configs.
	pvap := named(t, objs, "ValidatingAdmissionPolicy", "-planner-scope")
	if got := get(pvap, "spec", "matchConditions", 0, "expression"); got != "request.userInfo.username == 'system:serviceaccount:gpu-system:gpu-mig-agent-planner'" {
		t.Errorf("planner policy matches %v", got)
	}
	for _, v := range get(pvap, "spec", "variables").([]any) {
		if get(v, "name") == "allowedConfigs" && get(v, "expression") != "['all-disabled', 'inference']" {
			t.Errorf("planner policy allowedConfigs %v", get(v, "expression"))
		}
	}
	if got := fmt.Sprint(get(plan, "spec", "template", "spec", "containers", 0, "env")); !strings.Contains(got, "name:NVIDIA_VISIBLE_DEVICES value:void") {
		t.Errorf("planner env %s: want NVIDIA_VISIBLE_DEVICES=void (the planner gets no GPU)", got)
	}
	if got := get(plan, "spec", "template", "spec", "volumes", 0, "configMap", "name"); got != "gpu-mig-agent-settings" {
		t.Errorf("planner mounts ConfigMap %v, want the chart's settings (migConfig)", got)
	}
	for _, o := range objs {
		if ns := get(o, "metadata", "namespace"); ns != nil && ns != c.namespace {
			t.Errorf("%s %v in namespace %v, want %s", o["kind"], get(o, "metadata", "name"), ns, c.namespace)
		}
		for _, s := range asList(get(o, "subjects")) {
			if get(s, "kind") == "ServiceAccount" && (get(s, "namespace") != c.namespace || get(s, "name") != "gpu-mig-agent" && get(s, "name") != "gpu-mig-agent-planner") {
				t.Errorf("%s %v binds %v", o["kind"], get(o, "metadata", "name"), s)
			}
		}
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// TestValuesRefused: values the chart cannot honour fail the render with a
// message that says what to do.
func TestValuesRefused(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"typed value in settings", "settings: {max-concurrent: 3}", "set by the chart from maxConcurrent"},
		{"chart-owned flag in settings", "settings: {node-name: x}", "settings.node-name: set by the chart"},
		{"misspelt value", "maxconcurrent: 3", "maxconcurrent"},
		{"unknown reboot method", "rebootMethod: sim", "rebootMethod"},
		{"negative slots", "maxConcurrent: -1", "maxConcurrent"},
		{"no service account", "serviceAccount: {create: false}", "serviceAccount.name is required"},
		{"NVML library in settings", "settings: {nvml-library: /usr/lib}", "set by the chart from driver.root"},
		{"relative driver root", "driver: {root: run/nvidia/driver}", "/driver/root"},
		{"two config files", "{migConfig: 'version: v1', migConfigMap: {name: cfg}}", "migConfig and migConfigMap.name both"},
		{"ConfigMap name", "migConfigMap: {name: My_Config}", "/migConfigMap/name"},
		{"gate without a tag", "toolkitReadyGate: {enabled: true, image: {repository: busybox, tag: \"\"}}", "/toolkitReadyGate/image/tag"},
		{"misspelt SCC value", "openshift: {scc: {enabled: true}}", "enabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{}
			if err := yaml.Unmarshal([]byte(tc.values), &vals); err != nil {
				t.Fatal(err)
			}
			_, err := render(t, "mig-agent", "mig-agent", vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render with %s: error %v, want one containing %q", tc.values, err, tc.want)
			}
		})
	}
}

// TestDBusMount: the host's D-Bus socket is mounted exactly when the agent
// needs it.
func TestDBusMount(t *testing.T) {
	for _, tc := range []struct {
		values string
		want   bool
	}{
		{"{}", true},
		{"rebootMethod: none", false},
		{"rebootMethod: systemctl", true},
		{"{rebootMethod: none, settings: {host-gpu-clients: [nvidia-dcgm.service]}}", true},
	} {
		vals := map[string]any{}
		if err := yaml.Unmarshal([]byte(tc.values), &vals); err != nil {
			t.Fatal(err)
		}
		ds := one(t, objects(t, mustRender(t, cases[0], vals)), "DaemonSet")
		vols, _ := yaml.Marshal(get(ds, "spec", "template", "spec", "volumes"))
		mounts, _ := yaml.Marshal(get(ds, "spec", "template", "spec", "containers", 0, "volumeMounts"))
		if got := bytes.Contains(vols, []byte("system_bus_socket")); got != tc.want || bytes.Contains(mounts, []byte("dbus")) != tc.want {
			t.Errorf("values %s: D-Bus volume %v, want %v", tc.values, got, tc.want)
		}
	}
}

// TestNotes: the text `helm install` prints renders for each case, with no
// missing value.
func TestNotes(t *testing.T) {
	for _, c := range cases {
		chrt, err := loader.Load(chartDir)
		if err != nil {
			t.Fatal(err)
		}
		opts := common.ReleaseOptions{Name: c.release, Namespace: c.namespace, Revision: 1, IsInstall: true}
		rv, err := util.ToRenderValuesWithSchemaValidation(chrt, readValues(t, c.name), opts, capabilities(t), false)
		if err != nil {
			t.Fatal(err)
		}
		files, err := engine.Render(chrt, rv)
		if err != nil {
			t.Fatal(err)
		}
		notes := files["mig-agent/templates/NOTES.txt"]
		if !strings.Contains(notes, "nvidia.com/mig.config=") || strings.Contains(notes, "<no value>") || !strings.Contains(notes, c.namespace) {
			t.Errorf("%s: NOTES.txt:\n%s", c.name, notes)
		}
	}
}

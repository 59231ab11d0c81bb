package test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// What the GPU Operator's own MIG manager DaemonSet holds, as read from
// NVIDIA/gpu-operator assets/state-mig-manager/0600_daemonset.yaml (the same
// in v25.3.4, v25.10.1, v26.3.3 and v26.7.0) and controllers/object_controls.go
// (TransformMIGManager, setRuntimeClassName). The chart's GPU Operator values
// must give the agent the same view of the node.
const (
	// The initContainer toolkit-validation waits for this file ...
	operatorToolkitReady = "/run/nvidia/validations/toolkit-ready"
	// ... on this host directory (volume run-nvidia-validations).
	operatorValidationsDir = "/run/nvidia/validations"
	// Volume cdi-root: the host's CDI specs, at the same path inside.
	operatorCDIDir = "/var/run/cdi"
	// nodeSelector of the DaemonSet: the node label the operator sets on
	// every MIG-capable node (controllers/state_manager.go,
	// addGPUStateLabels) and its driver manager pauses for driver upgrades.
	operatorDeployLabel = "nvidia.com/gpu.deploy.mig-manager"
	// operator.runtimeClass in deployments/gpu-operator/values.yaml
	// (DefaultRuntimeClass), set on the operands by setRuntimeClassName.
	operatorRuntimeClass = "nvidia"
	// k8s-driver-manager (NVIDIA/k8s-driver-manager cmd/driver-manager/main.go,
	// maybeSetPaused) sets the deploy label to this while it reloads the
	// driver.
	driverUpgradePaused = "paused-for-driver-upgrade"
)

func gpuOperatorCase() renderCase {
	for _, c := range cases {
		if c.name == "gpu-operator" {
			return c
		}
	}
	panic("no gpu-operator case")
}

func settingsOf(t *testing.T, objs []map[string]any) map[string]any {
	t.Helper()
	cm := named(t, objs, "ConfigMap", "-settings")
	var settings map[string]any
	if err := yaml.Unmarshal([]byte(get(cm, "data", "settings.yaml").(string)), &settings); err != nil {
		t.Fatal(err)
	}
	return settings
}

// volumeByName returns the pod's volume and the container's mount of that
// name (nil where there is none).
func volumeByName(pod any, container int, name string) (vol, mount map[string]any) {
	for _, v := range asList(get(pod, "volumes")) {
		if get(v, "name") == name {
			vol, _ = v.(map[string]any)
		}
	}
	for _, m := range asList(get(pod, "containers", container, "volumeMounts")) {
		if get(m, "name") == name {
			mount, _ = m.(map[string]any)
		}
	}
	return vol, mount
}

// hostPathMount finds the container's mount of the host path hostPath.
func hostPathMount(pod any, container string, hostPath string) (vol, mount map[string]any) {
	var list []any
	switch container {
	case "init":
		list = asList(get(pod, "initContainers", 0, "volumeMounts"))
	default:
		list = asList(get(pod, "containers", 0, "volumeMounts"))
	}
	for _, v := range asList(get(pod, "volumes")) {
		if get(v, "hostPath", "path") != hostPath {
			continue
		}
		for _, m := range list {
			if get(m, "name") == get(v, "name") {
				vol, _ = v.(map[string]any)
				mount, _ = m.(map[string]any)
			}
		}
	}
	return vol, mount
}

// TestGPUOperatorValues: the chart with values-gpu-operator.yaml renders
// what the operator's own MIG manager has: the toolkit-ready gate, the CDI
// spec directory, the RuntimeClass, the deploy-label nodeSelector; and the
// operator's defaults for pausing operands and rebooting.
func TestGPUOperatorValues(t *testing.T) {
	c := gpuOperatorCase()
	objs := objects(t, mustRender(t, c, readValues(t, c.name)))
	ds := one(t, objs, "DaemonSet")
	pod := get(ds, "spec", "template", "spec")

	if got := get(pod, "runtimeClassName"); got != operatorRuntimeClass {
		t.Errorf("runtimeClassName %v, want %s", got, operatorRuntimeClass)
	}
	if got := get(pod, "nodeSelector", operatorDeployLabel); got != "true" {
		t.Errorf("nodeSelector %v lacks %s: \"true\"", get(pod, "nodeSelector"), operatorDeployLabel)
	}

	// The gate: an initContainer that waits for toolkit-ready on the
	// validations directory of the host.
	inits := asList(get(pod, "initContainers"))
	if len(inits) != 1 {
		t.Fatalf("initContainers %v, want the toolkit-ready gate", inits)
	}
	script := fmt.Sprint(get(inits[0], "command"), get(inits[0], "args"))
	if !strings.Contains(script, "until [ -f "+operatorToolkitReady+" ]") {
		t.Errorf("the gate runs %s, which does not wait for %s", script, operatorToolkitReady)
	}
	if img := fmt.Sprint(get(inits[0], "image")); !strings.HasPrefix(img, "nvcr.io/nvidia/gpu-operator:v") {
		t.Errorf("the gate's image %s is not the operator's validator image", img)
	}
	if vol, mount := hostPathMount(pod, "init", operatorValidationsDir); vol == nil || get(mount, "mountPath") != operatorValidationsDir ||
		get(mount, "mountPropagation") != "HostToContainer" {
		t.Errorf("the gate does not see the host's %s (HostToContainer): volumes %v, mounts %v", operatorValidationsDir,
			get(pod, "volumes"), get(inits[0], "volumeMounts"))
	}

	// CDI: the host's spec directory at the same path.
	if vol, mount := hostPathMount(pod, "agent", operatorCDIDir); vol == nil || get(mount, "mountPath") != operatorCDIDir {
		t.Errorf("%s is not mounted at %s: volumes %v", operatorCDIDir, operatorCDIDir, get(pod, "volumes"))
	}

	// NVML: the library the NVIDIA runtime injects (the RuntimeClass above),
	// so no driver root of the chart's choosing.
	settings := settingsOf(t, objs)
	if _, ok := settings["nvml-library"]; ok {
		t.Errorf("settings name an NVML library %v; the GPU Operator values rely on the runtime's injection", settings["nvml-library"])
	}
	env := map[string]any{}
	for _, e := range asList(get(pod, "containers", 0, "env")) {
		env[fmt.Sprint(get(e, "name"))] = get(e, "value")
	}
	if env["NVIDIA_VISIBLE_DEVICES"] != "all" || env["NVIDIA_DRIVER_CAPABILITIES"] != "utility" {
		t.Errorf("env %v: the runtime injects NVML only with NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility", env)
	}

	// The operator's MIG manager pauses the operands during a change and
	// does not reboot (WITH_REBOOT false): pause-gpu-operator on, reboot
	// method none, so no D-Bus socket either. An unlabelled MIG-capable node
	// gets all-disabled, as the operator labels it (migManager.config.default,
	// controllers/nodelabeling_controller.go) while its manager is on.
	want := map[string]any{"pause-gpu-operator": true, "reboot-method": "none", "default-config": "all-disabled"}
	for k, v := range want {
		if settings[k] != v {
			t.Errorf("settings %s = %v, want %v", k, settings[k], v)
		}
	}
	if vol, _ := volumeByName(pod, 0, "dbus"); vol != nil {
		t.Errorf("D-Bus mounted with reboot method none: %v", vol)
	}
	// The policy lets the agent pause the operands.
	vap := named(t, objs, "ValidatingAdmissionPolicy", "-node-scope")
	for _, v := range asList(get(vap, "spec", "variables")) {
		if get(v, "name") == "pauseGpuOperator" && get(v, "expression") != "true" {
			t.Errorf("the policy's pauseGpuOperator is %v with pauseGpuOperator: true", get(v, "expression"))
		}
	}
}

// TestDeployLabelPause: the driver manager's pause of the deploy label
// takes the node out of the DaemonSet's node set (the DaemonSet controller
// then deletes the agent's pod there), and its restore brings it back. A
// nodeSelector matches a label only with exactly its value.
func TestDeployLabelPause(t *testing.T) {
	c := gpuOperatorCase()
	ds := one(t, objects(t, mustRender(t, c, readValues(t, c.name))), "DaemonSet")
	sel, _ := get(ds, "spec", "template", "spec", "nodeSelector").(map[string]any)
	matches := func(labels map[string]string) bool {
		for k, v := range sel {
			if got, ok := labels[k]; !ok || got != v {
				return false
			}
		}
		return true
	}
	// The labels the operator gives a MIG-capable node (state_manager.go:
	// nvidia.com/gpu.present from its GPU node discovery, the deploy labels).
	node := map[string]string{"nvidia.com/gpu.present": "true", operatorDeployLabel: "true",
		"nvidia.com/gpu.deploy.device-plugin": "true"}
	if !matches(node) {
		t.Fatalf("the DaemonSet (nodeSelector %v) does not run on a MIG-capable node of the operator: %v", sel, node)
	}
	node[operatorDeployLabel] = driverUpgradePaused
	if matches(node) {
		t.Errorf("the DaemonSet (nodeSelector %v) stays on a node whose driver is being upgraded: %v", sel, node)
	}
	// maybeSetPaused appends to a value that is neither true nor false.
	node[operatorDeployLabel] = "true_" + driverUpgradePaused
	if matches(node) {
		t.Errorf("nodeSelector %v matches %v", sel, node)
	}
	node[operatorDeployLabel] = "true" // maybeSetTrue after the upgrade
	if !matches(node) {
		t.Errorf("the DaemonSet does not come back after the driver upgrade: %v", node)
	}
	delete(node, operatorDeployLabel) // a node without MIG
	if matches(node) {
		t.Errorf("the DaemonSet runs on a node the operator does not mark MIG-capable: %v", node)
	}
}

// TestGPUOperatorValuesOnlyAdd: the GPU Operator values change the default
// render only where they mean to: the pod spec gains the gate, the CDI
// mount, the RuntimeClass and the deploy label, and loses the D-Bus socket
// (no reboots); everything else is the default render's.
func TestGPUOperatorValuesOnlyAdd(t *testing.T) {
	c := gpuOperatorCase()
	def := one(t, objects(t, mustRender(t, cases[0], nil)), "DaemonSet")
	op := one(t, objects(t, mustRender(t, c, readValues(t, c.name))), "DaemonSet")
	dp, _ := get(stripMeta(def), "spec", "template", "spec").(map[string]any)
	opod, _ := get(stripMeta(op), "spec", "template", "spec").(map[string]any)
	changed := map[string]bool{"runtimeClassName": true, "initContainers": true, "nodeSelector": true, "volumes": true, "containers": true}
	for k := range merged(dp, opod) {
		if !changed[k] && !reflect.DeepEqual(dp[k], opod[k]) {
			t.Errorf("pod spec %s: default %v, GPU Operator values %v", k, dp[k], opod[k])
		}
	}
	// The container: only its mounts differ.
	dc, _ := get(dp, "containers", 0).(map[string]any)
	oc, _ := get(opod, "containers", 0).(map[string]any)
	for k := range merged(dc, oc) {
		if k != "volumeMounts" && !reflect.DeepEqual(dc[k], oc[k]) {
			t.Errorf("container %s: default %v, GPU Operator values %v", k, dc[k], oc[k])
		}
	}
	// Every default volume but D-Bus is still there, unchanged.
	for _, v := range asList(dp["volumes"]) {
		name := get(v, "name")
		ov, om := volumeByName(opod, 0, fmt.Sprint(name))
		if name == "dbus" {
			if ov != nil || om != nil {
				t.Errorf("D-Bus still mounted: %v", ov)
			}
			continue
		}
		if !reflect.DeepEqual(v, any(ov)) {
			t.Errorf("volume %v: default %v, GPU Operator values %v", name, v, ov)
		}
	}
	if ns, ok := opod["nodeSelector"].(map[string]any); !ok || ns["nvidia.com/gpu.present"] != "true" {
		t.Errorf("nodeSelector %v dropped the default nvidia.com/gpu.present", opod["nodeSelector"])
	}
}

func merged(a, b map[string]any) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// TestDriverRoot: driver.root mounts that host directory read-only at
// /driver-root, with the host's later mounts (a driver container that
// starts after the agent) propagated, and points --nvml-library there;
// without it nothing is mounted and the injected library is used.
func TestDriverRoot(t *testing.T) {
	for _, root := range []string{"", "/run/nvidia/driver", "/"} {
		t.Run("root="+root, func(t *testing.T) {
			objs := objects(t, mustRender(t, cases[0], map[string]any{"driver": map[string]any{"root": root}}))
			pod := get(one(t, objs, "DaemonSet"), "spec", "template", "spec")
			vol, mount := volumeByName(pod, 0, "driver-root")
			lib, hasLib := settingsOf(t, objs)["nvml-library"]
			if root == "" {
				if vol != nil || mount != nil || hasLib {
					t.Errorf("driver root mounted without driver.root: %v %v, nvml-library %v", vol, mount, lib)
				}
				return
			}
			if get(vol, "hostPath", "path") != root || get(vol, "hostPath", "type") != "DirectoryOrCreate" {
				t.Errorf("volume %v, want hostPath %s (DirectoryOrCreate)", vol, root)
			}
			if get(mount, "mountPath") != "/driver-root" || get(mount, "readOnly") != true || get(mount, "mountPropagation") != "HostToContainer" {
				t.Errorf("mount %v, want /driver-root read-only with HostToContainer propagation", mount)
			}
			if lib != "/driver-root" {
				t.Errorf("nvml-library %v, want /driver-root", lib)
			}
		})
	}
}

// TestMigConfigMap: a config file from an existing ConfigMap, mounted
// where the operator's MIG manager reads it and named as the config file.
func TestMigConfigMap(t *testing.T) {
	objs := objects(t, mustRender(t, cases[0], map[string]any{"migConfigMap": map[string]any{"name": "custom-mig-parted-config"}}))
	pod := get(one(t, objs, "DaemonSet"), "spec", "template", "spec")
	vol, mount := volumeByName(pod, 0, "mig-config")
	wantVol := map[string]any{"name": "mig-config", "configMap": map[string]any{"name": "custom-mig-parted-config",
		"items": []any{map[string]any{"key": "config.yaml", "path": "config.yaml"}}}}
	if !reflect.DeepEqual(vol, wantVol) {
		t.Errorf("volume %v, want %v", vol, wantVol)
	}
	if get(mount, "mountPath") != "/mig-parted-config" || get(mount, "readOnly") != true {
		t.Errorf("mount %v", mount)
	}
	if got := settingsOf(t, objs)["config-file"]; got != "/mig-parted-config/config.yaml" {
		t.Errorf("config-file %v", got)
	}
	if cm := one(t, objs, "ConfigMap"); get(cm, "data", "config.yaml") != nil {
		t.Error("the settings ConfigMap holds a config file too")
	}
	// Another key of that ConfigMap.
	objs = objects(t, mustRender(t, cases[0], map[string]any{"migConfigMap": map[string]any{"name": "x", "key": "mig.yaml"}}))
	vol, _ = volumeByName(get(one(t, objs, "DaemonSet"), "spec", "template", "spec"), 0, "mig-config")
	if get(vol, "configMap", "items", 0, "key") != "mig.yaml" || get(vol, "configMap", "items", 0, "path") != "config.yaml" {
		t.Errorf("volume %v does not map key mig.yaml to config.yaml", vol)
	}
}

// TestNRIPlugin: with the operator's CDI NRI plugin the pod asks for the
// management CDI device by annotation, as the operator's operands do.
func TestNRIPlugin(t *testing.T) {
	ds := one(t, objects(t, mustRender(t, cases[0], map[string]any{"cdi": map[string]any{"nriPlugin": true}})), "DaemonSet")
	if got := get(ds, "spec", "template", "metadata", "annotations", "nvidia.cdi.k8s.io/container.mig-agent"); got != "management.nvidia.com/gpu=all" {
		t.Errorf("annotation %v", got)
	}
	ds = one(t, objects(t, mustRender(t, cases[0], nil)), "DaemonSet")
	if got := get(ds, "spec", "template", "metadata", "annotations", "nvidia.cdi.k8s.io/container.mig-agent"); got != nil {
		t.Errorf("annotation %v by default", got)
	}
}

// TestKubeVersion: Kubernetes 1.29 installs the chart with the admission
// policy off, and refuses it with the policy on, saying what to do; 1.28 is
// refused by Chart.yaml's kubeVersion.
func TestKubeVersion(t *testing.T) {
	off := map[string]any{"admissionPolicy": map[string]any{"enabled": false}}
	for _, tc := range []struct {
		version string
		vals    map[string]any
		want    string // "" = renders
	}{
		{"v1.29.4", off, ""},
		{"v1.29.4", nil, "admissionPolicy.enabled needs Kubernetes 1.30 or later"},
		{"v1.29.4-gke.1043004", nil, "set admissionPolicy.enabled=false"},
		{"v1.29.4-gke.1043004", off, ""},
		{"v1.30.0", nil, ""},
		{"v1.28.9", off, "incompatible with Kubernetes v1.28.9"},
	} {
		out, err := renderAt(t, tc.version, "mig-agent", "mig-agent", tc.vals)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %v: %v", tc.version, tc.vals, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %v: error %v, want one containing %q", tc.version, tc.vals, err, tc.want)
		case tc.want == "" && tc.vals != nil:
			if objs := objects(t, out); len(find(objs, "ValidatingAdmissionPolicy")) != 0 {
				t.Errorf("%s: the policy is rendered with admissionPolicy.enabled=false", tc.version)
			}
		}
	}
}

// TestSCC: the OpenShift SecurityContextConstraints admits the agent's pod
// for its ServiceAccount only, and allows what the pod spec asks for.
func TestSCC(t *testing.T) {
	if objs := objects(t, mustRender(t, cases[0], nil)); len(find(objs, "SecurityContextConstraints")) != 0 {
		t.Error("an SCC by default")
	}
	vals := readValues(t, "openshift")
	vals["fullnameOverride"] = "gpu-mig"
	objs := objects(t, mustRender(t, renderCase{"openshift", "rel", "gpu-system", ""}, vals))
	scc := one(t, objs, "SecurityContextConstraints")
	if got := get(scc, "metadata", "namespace"); got != nil {
		t.Errorf("the SCC is cluster-scoped, has namespace %v", got)
	}
	if got := asList(get(scc, "users")); len(got) != 1 || got[0] != "system:serviceaccount:gpu-system:gpu-mig" {
		t.Errorf("users %v, want the agent's ServiceAccount alone", got)
	}
	if len(asList(get(scc, "groups"))) != 0 {
		t.Errorf("groups %v", get(scc, "groups"))
	}
	pod := get(one(t, objs, "DaemonSet"), "spec", "template", "spec")
	if get(pod, "containers", 0, "securityContext", "privileged") == true && get(scc, "allowPrivilegedContainer") != true {
		t.Error("the pod is privileged, the SCC does not allow it")
	}
	allowed := map[string]bool{}
	for _, v := range asList(get(scc, "volumes")) {
		allowed[fmt.Sprint(v)] = true
	}
	for _, v := range asList(get(pod, "volumes")) {
		for _, kind := range []string{"hostPath", "configMap", "emptyDir", "projected", "secret", "downwardAPI"} {
			if get(v, kind) != nil && !allowed[kind] {
				t.Errorf("volume %v of kind %s, which the SCC does not allow", get(v, "name"), kind)
			}
		}
	}
	if get(scc, "allowHostDirVolumePlugin") != true {
		t.Error("host paths not allowed")
	}
	for _, ns := range []string{"hostPID", "hostIPC", "hostNetwork"} {
		if get(pod, ns) == true && get(scc, "allow"+strings.ToUpper(ns[:1])+ns[1:]) != true {
			t.Errorf("the pod sets %s, the SCC refuses it", ns)
		}
	}
	if get(scc, "allowHostPID") != false || get(scc, "allowHostNetwork") != false || get(scc, "allowHostIPC") != false {
		t.Error("the SCC allows host namespaces the agent does not use")
	}
}

package test

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func renderValues(t *testing.T, values string) ([]map[string]any, error) {
	t.Helper()
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	text, err := render(t, "mig-agent", "mig-agent", vals)
	if err != nil {
		return nil, err
	}
	return objects(t, text), nil
}

// TestOperatorValueNames: the GPU Operator's names (ClusterPolicy
// spec.migManager) map one to one as docs/install-gpu-operator.md says:
// migManager.config.name mounts that ConfigMap's config.yaml as the config
// file, migManager.config.default is the default config, and
// migManager.gpuClientsConfig.name is refused with what to do instead.
func TestOperatorValueNames(t *testing.T) {
	objs, err := renderValues(t, "migManager: {config: {name: custom-mig-parted-config, default: all-disabled}}")
	if err != nil {
		t.Fatal(err)
	}
	s := settingsOf(t, objs)
	if s["config-file"] != "/mig-parted-config/config.yaml" || s["default-config"] != "all-disabled" {
		t.Errorf("settings %v", s)
	}
	pod := get(one(t, objs, "DaemonSet"), "spec", "template", "spec")
	vol, mount := volumeByName(pod, 0, "mig-config")
	if get(vol, "configMap", "name") != "custom-mig-parted-config" || get(vol, "configMap", "items", 0, "key") != "config.yaml" ||
		get(mount, "mountPath") != "/mig-parted-config" {
		t.Errorf("mig-config volume %v, mount %v", vol, mount)
	}
	// The chart's own name wins where both are set.
	objs, err = renderValues(t, "{migConfigMap: {name: mine}, migManager: {config: {name: theirs}}, defaultConfig: all-balanced}")
	if err != nil {
		t.Fatal(err)
	}
	vol, _ = volumeByName(get(one(t, objs, "DaemonSet"), "spec", "template", "spec"), 0, "mig-config")
	if get(vol, "configMap", "name") != "mine" || settingsOf(t, objs)["default-config"] != "all-balanced" {
		t.Errorf("migConfigMap.name did not win: %v, %v", vol, settingsOf(t, objs))
	}
	_, err = renderValues(t, "migManager: {gpuClientsConfig: {name: default-gpu-clients}}")
	if err == nil || !strings.Contains(err.Error(), "settings.host-gpu-clients") {
		t.Errorf("gpuClientsConfig.name: error %v, want one naming settings.host-gpu-clients", err)
	}
}

// TestUsualChartKeys: securityContext, extraEnv, extraVolumes,
// extraVolumeMounts, and maxConcurrent as a count or a percentage.
func TestUsualChartKeys(t *testing.T) {
	objs, err := renderValues(t, `
securityContext: {privileged: true, runAsUser: 0, readOnlyRootFilesystem: true}
extraEnv: [{name: HTTPS_PROXY, value: "http://proxy:3128"}]
extraVolumes: [{name: extra, hostPath: {path: /opt/extra}}]
extraVolumeMounts: [{name: extra, mountPath: /opt/extra, readOnly: true}]
maxConcurrent: "25%"
`)
	if err != nil {
		t.Fatal(err)
	}
	pod := get(one(t, objs, "DaemonSet"), "spec", "template", "spec")
	if get(pod, "containers", 0, "securityContext", "readOnlyRootFilesystem") != true {
		t.Errorf("securityContext %v", get(pod, "containers", 0, "securityContext"))
	}
	if env := fmt.Sprint(get(pod, "containers", 0, "env")); !strings.Contains(env, "HTTPS_PROXY") || !strings.Contains(env, "NODE_NAME") {
		t.Errorf("env %s", env)
	}
	if vol, mount := volumeByName(pod, 0, "extra"); get(vol, "hostPath", "path") != "/opt/extra" || get(mount, "mountPath") != "/opt/extra" {
		t.Errorf("extra volume %v, mount %v", vol, mount)
	}
	if s := settingsOf(t, objs); s["max-concurrent"] != "25%" {
		t.Errorf("max-concurrent %v (%T), want 25%%", s["max-concurrent"], s["max-concurrent"])
	}
	// The default securityContext stays privileged root.
	objs, err = renderValues(t, "maxConcurrent: 3")
	if err != nil {
		t.Fatal(err)
	}
	sc := get(one(t, objs, "DaemonSet"), "spec", "template", "spec", "containers", 0, "securityContext")
	if get(sc, "privileged") != true || settingsOf(t, objs)["max-concurrent"] != float64(3) {
		t.Errorf("defaults: securityContext %v, settings %v", sc, settingsOf(t, objs))
	}
	for _, bad := range []string{`maxConcurrent: "0%"`, `maxConcurrent: "150%"`, `maxConcurrent: "a few"`} {
		if _, err := renderValues(t, bad); err == nil || !strings.Contains(err.Error(), "maxConcurrent") {
			t.Errorf("%s: error %v", bad, err)
		}
	}
}

// TestDevicePluginConfigRBAC: devicePluginConfig grants get on that one
// ConfigMap in its namespace, to the agent's ServiceAccount.
func TestDevicePluginConfigRBAC(t *testing.T) {
	objs, err := renderValues(t, "devicePluginConfig: {namespace: gpu-operator, name: time-slicing-config}")
	if err != nil {
		t.Fatal(err)
	}
	var role, binding map[string]any
	for _, o := range objs {
		if strings.HasSuffix(fmt.Sprint(get(o, "metadata", "name")), "-device-plugin-config") {
			switch o["kind"] {
			case "Role":
				role = o
			case "RoleBinding":
				binding = o
			}
		}
	}
	if get(role, "metadata", "namespace") != "gpu-operator" || fmt.Sprint(get(role, "rules", 0, "resourceNames")) != "[time-slicing-config]" ||
		fmt.Sprint(get(role, "rules", 0, "verbs")) != "[get]" {
		t.Errorf("role %v", role)
	}
	if get(binding, "subjects", 0, "name") != "mig-agent" || get(binding, "subjects", 0, "namespace") != "mig-agent" {
		t.Errorf("binding %v", binding)
	}
	if _, err := renderValues(t, "devicePluginConfig: {name: x}"); err == nil || !strings.Contains(err.Error(), "devicePluginConfig.namespace") {
		t.Errorf("no namespace: %v", err)
	}
}

// TestOperatorMigManagerEnv: migManager.env, the GPU Operator's environment
// for its MIG manager, is honoured or refused: WITH_REBOOT=false renders no
// reboot (reboot-method none, no D-Bus), true reboots through logind;
// CONFIG_FILE at the operator's path and DEFAULT_GPU_CLIENTS_NAMESPACE are
// what the chart does already; every other variable is refused with what
// to set instead, and so is a name NVIDIA's manager does not read.
func TestOperatorMigManagerEnv(t *testing.T) {
	objs, err := renderValues(t, `migManager: {env: [{name: WITH_REBOOT, value: "false"}, {name: CONFIG_FILE, value: /mig-parted-config/config.yaml}, {name: DEFAULT_GPU_CLIENTS_NAMESPACE, value: gpu-operator}]}`)
	if err != nil {
		t.Fatal(err)
	}
	pod := get(one(t, objs, "DaemonSet"), "spec", "template", "spec")
	if s := settingsOf(t, objs); s["reboot-method"] != "none" || strings.Contains(fmt.Sprint(get(pod, "volumes")), "dbus") {
		t.Errorf("WITH_REBOOT=false: settings %v, volumes %v", s, get(pod, "volumes"))
	}
	objs, err = renderValues(t, `{rebootMethod: none, migManager: {env: [{name: WITH_REBOOT, value: "true"}]}}`)
	if err != nil {
		t.Fatal(err)
	}
	if s := settingsOf(t, objs); s["reboot-method"] != "logind" || !strings.Contains(fmt.Sprint(get(one(t, objs, "DaemonSet"), "spec", "template", "spec", "volumes")), "dbus") {
		t.Errorf("WITH_REBOOT=true: settings %v", s)
	}
	for values, want := range map[string]string{
		`migManager: {env: [{name: WITH_REBOOT, value: maybe}]}`:                           "not a boolean",
		`migManager: {env: [{name: WITH_SHUTDOWN_HOST_GPU_CLIENTS, value: "true"}]}`:       "settings.host-gpu-clients",
		`migManager: {env: [{name: CONFIG_FILE, value: /etc/other.yaml}]}`:                 "migManager.config.name",
		`migManager: {env: [{name: CDI_ENABLED, value: "true"}]}`:                          "cdi.enabled=true",
		`migManager: {env: [{name: GPU_CLIENTS_FILE, value: /gpu-clients/clients.yaml}]}`:  "settings.host-gpu-clients",
		`migManager: {env: [{name: HOST_KUBELET_SYSTEMD_SERVICE, value: k3s.service}]}`:    "never stops the kubelet",
		`migManager: {env: [{name: NVIDIA_DRIVER_ROOT, value: /run/nvidia/driver}]}`:       "cdi.driverRoot",
		`migManager: {env: [{name: MY_OWN, value: x}]}`:                                    "not a variable of NVIDIA's MIG manager",
		`migManager: {env: [{value: x}]}`:                                                  "name",
		`migManager: {enabled: false}`:                                                     "enabled",
		`migManager: {config: {create: true, data: {config.yaml: "version: v1"}}}`:         "needs migManager.config.name",
		`migManager: {config: {name: c, create: true, data: {other.yaml: "version: v1"}}}`: "config.yaml",
	} {
		if _, err := renderValues(t, values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", values, err, want)
		}
	}
	if _, err := renderValues(t, `{migManager: {env: [{name: WITH_SHUTDOWN_HOST_GPU_CLIENTS, value: "true"}]}, settings: {host-gpu-clients: [nvsm.service]}}`); err != nil {
		t.Errorf("WITH_SHUTDOWN_HOST_GPU_CLIENTS with host-gpu-clients: %v", err)
	}
}

// TestOperatorMigManagerConfigCreate: migManager.config.create with data
// renders the ConfigMap the GPU Operator would create
// (templates/mig_config.yaml: name, data as given) and the agent reads its
// config.yaml.
func TestOperatorMigManagerConfigCreate(t *testing.T) {
	objs, err := renderValues(t, `migManager: {config: {name: custom-mig-parted-config, create: true, default: all-disabled, data: {config.yaml: "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	cm := named(t, objs, "ConfigMap", "custom-mig-parted-config")
	if data := fmt.Sprint(get(cm, "data", "config.yaml")); !strings.Contains(data, "mig-configs:") || get(cm, "metadata", "namespace") != "mig-agent" {
		t.Errorf("ConfigMap %v", cm)
	}
	vol, _ := volumeByName(get(one(t, objs, "DaemonSet"), "spec", "template", "spec"), 0, "mig-config")
	if get(vol, "configMap", "name") != "custom-mig-parted-config" || settingsOf(t, objs)["config-file"] != "/mig-parted-config/config.yaml" {
		t.Errorf("mig-config volume %v, settings %v", vol, settingsOf(t, objs))
	}
	// create without data creates nothing, as the operator's chart.
	objs, err = renderValues(t, `migManager: {config: {name: existing, create: true}}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o["kind"] == "ConfigMap" && get(o, "metadata", "name") == "existing" {
			t.Error("a ConfigMap without data was created")
		}
	}
}

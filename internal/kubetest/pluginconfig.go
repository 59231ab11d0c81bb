package kubetest

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// PluginConfig runs the device plugin stand-in with a config, as the GPU
// Operator does when devicePlugin.config.name is set.
type PluginConfig struct {
	// ConfigMap (in the plugin's namespace) holds the configs, one per key.
	ConfigMap string
	// Default is the key used when the node's
	// nvidia.com/device-plugin.config label is unset (DEFAULT_CONFIG).
	Default string
	// App is the plugin pods' "app" label ("": DevicePluginApp, as the GPU
	// Operator deploys it): another one plays a renamed or self-installed
	// plugin.
	App string
}

// The config-manager's wiring in the GPU Operator's device plugin
// DaemonSet (gpu-operator assets/state-device-plugin/0500_daemonset.yaml,
// controllers/object_controls.go transformDevicePlugin config handling).
const (
	pluginConfigLabel  = "nvidia.com/device-plugin.config"
	pluginConfigSrcDir = "/available-configs"
	pluginConfigDst    = "/config/config.yaml"
)

// configManagerSpec adds the config-manager sidecar, its env and the
// ConfigMap volume to the plugin's pod spec, and points the plugin at the
// file it writes.
func configManagerSpec(spec *corev1.PodSpec, cfg PluginConfig) {
	spec.ShareProcessNamespace = new(bool)
	*spec.ShareProcessNamespace = true
	spec.Containers[0].Env = append(spec.Containers[0].Env, corev1.EnvVar{Name: "CONFIG_FILE", Value: pluginConfigDst})
	spec.Containers = append(spec.Containers, corev1.Container{
		Name: "config-manager", Image: "nvcr.io/nvidia/k8s-device-plugin:v0.18.0", Command: []string{"config-manager"},
		Env: []corev1.EnvVar{
			{Name: "NODE_LABEL", Value: pluginConfigLabel},
			{Name: "CONFIG_FILE_SRCDIR", Value: pluginConfigSrcDir},
			{Name: "CONFIG_FILE_DST", Value: pluginConfigDst},
			{Name: "DEFAULT_CONFIG", Value: cfg.Default},
			{Name: "FALLBACK_STRATEGIES", Value: "empty"},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: "available-configs", MountPath: pluginConfigSrcDir}, {Name: "config", MountPath: "/config"}},
	})
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: "available-configs", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cfg.ConfigMap}}}},
		corev1.Volume{Name: "config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
}

// pluginSharing: resource → (replicas, advertised name).
type pluginSharing map[string]struct {
	replicas int64
	as       string
}

// sharingOf reads the config the way the config-manager picks it
// (k8s-device-plugin cmd/config-manager/main.go updateConfigName: the
// label's key, which must exist; else DEFAULT_CONFIG; else the fallback
// "empty") and parses its sharing section as the plugin does
// (api/config/v1: Sharing.ReplicatedResources prefers mps over
// timeSlicing; NewResourceName adds "nvidia.com/"; replicas >= 2;
// renameByDefault gives "<name>.shared", DisableResourceNamingInConfig
// drops any other rename).
func (p *DevicePlugin) sharingOf(ctx context.Context) (pluginSharing, error) {
	n, err := p.client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	cm, err := p.client.CoreV1().ConfigMaps(p.ns).Get(ctx, p.cfg.ConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	key := n.Labels[pluginConfigLabel]
	if key == "" {
		key = p.cfg.Default
	}
	if key == "" {
		return pluginSharing{}, nil // FALLBACK_STRATEGIES=empty
	}
	data, ok := cm.Data[key]
	if !ok {
		return nil, fmt.Errorf("specified config %v does not exist", key)
	}
	type rr struct {
		RenameByDefault bool `json:"renameByDefault"`
		Resources       []struct {
			Name     string `json:"name"`
			Replicas int64  `json:"replicas"`
		} `json:"resources"`
	}
	var c struct {
		Sharing struct {
			TimeSlicing *rr `json:"timeSlicing"`
			MPS         *rr `json:"mps"`
		} `json:"sharing"`
	}
	if err := yaml.Unmarshal([]byte(data), &c); err != nil {
		return nil, err
	}
	r := c.Sharing.TimeSlicing
	if c.Sharing.MPS != nil {
		r = c.Sharing.MPS
	}
	out := pluginSharing{}
	if r == nil {
		return out, nil
	}
	for _, res := range r.Resources {
		if res.Replicas < 2 {
			return nil, fmt.Errorf("number of replicas must be >= 2")
		}
		name := res.Name
		if !strings.Contains(name, "/") {
			name = "nvidia.com/" + name
		}
		as := name
		if r.RenameByDefault {
			as += ".shared"
		}
		out[name] = struct {
			replicas int64
			as       string
		}{res.Replicas, as}
	}
	return out, nil
}

// apply replicates each shared resource's devices under its advertised
// name (internal/rm/device_map.go updateDeviceMapWithReplicas: Replicas
// annotated devices per device; the original name is no longer served
// when renamed).
func (s pluginSharing) apply(adv map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for r, n := range adv {
		if sh, ok := s[r]; ok {
			out[sh.as] += n * sh.replicas
			continue
		}
		out[r] += n
	}
	return out
}

// Package sharing is the NVIDIA device plugin's sharing config — its
// time-slicing and MPS replicas and renames — as the node's plugin reads it:
// the config its config-manager picks from the mounted ConfigMap, and what
// the plugin then advertises.
package sharing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/migagent/mig-agent/drain/podresources"
	"github.com/migagent/mig-agent/internal/kclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// What NVIDIA's device plugin's config-manager reads to pick the plugin's
// config (k8s-device-plugin cmd/config-manager/main.go: the flags
// node-label, config-file-srcdir, default-config, fallback-strategies and
// their environment variables; DefaultConfigLabel). The GPU Operator
// (assets/state-device-plugin/0500_daemonset.yaml) and the plugin's Helm
// chart (deployments/helm/nvidia-device-plugin/templates/
// daemonset-device-plugin.yml) both run it as a container of the plugin's
// pod with these variables and the ConfigMap mounted at CONFIG_FILE_SRCDIR.
const (
	devicePluginConfigLabel = "nvidia.com/device-plugin.config"
	envNodeLabel            = "NODE_LABEL"
	envConfigSrcDir         = "CONFIG_FILE_SRCDIR"
	envDefaultConfig        = "DEFAULT_CONFIG"
	envFallbackStrategies   = "FALLBACK_STRATEGIES"
	// envConfigFile / argConfigFile: the plugin's own config file
	// (cmd/nvidia-device-plugin/main.go, flag config-file).
	envConfigFile = "CONFIG_FILE"
	argConfigFile = "--config-file"
	// The config-manager's fallback strategies (FallbackStrategy* there):
	// the key "default" (NamedConfigFallback), the only key, an empty config.
	fallbackNamed  = "named"
	fallbackSingle = "single"
	fallbackEmpty  = "empty"
	namedFallback  = "default"
	// sharedSuffix: renameByDefault advertises a shared resource as its
	// name plus this (api/config/v1 DefaultSharedResourceNameSuffix).
	sharedSuffix = podresources.SharedSuffix
)

// PodLister lists the pods on a node (drain.NodePods).
type PodLister func(ctx context.Context, client kclient.Interface, node string) ([]corev1.Pod, error)

// errNoNode: no node name to read the config for.
var errNoNode = errors.New("no node name")

// errUnknown: the device plugin's sharing config could not be
// known; the allocatable rule then accepts the plugin's documented forms.
var errUnknown = errors.New("the device plugin's sharing config is not known")

// ErrNoPluginPod: no device plugin pod runs on the node (now).
var ErrNoPluginPod = errors.New("no device plugin pod on the node")

// ErrReplicas: a shared resource's replicas are beyond
// maxReplicas. The plugin would make that many devices per device
// (k8s-device-plugin internal/rm/device_map.go
// updateDeviceMapWithReplicas), and what it advertises, that many times
// the devices, could not be checked: 2^62 × 4 devices is 0 in int64.
var ErrReplicas = errors.New("sharing replicas out of bounds")

// maxReplicas bounds a shared resource's replicas: far above any
// useful time-slicing or MPS sharing (MPS itself serves at most 48 clients
// per GPU), and low enough that replicas × devices never overflows.
const maxReplicas = 1 << 16

// Replicated is how the device plugin advertises one shared resource:
// Replicas devices per device, under the name As.
type Replicated struct {
	Replicas int64
	As       corev1.ResourceName
}

// Config is what the device plugin's sharing config does to the resources
// it advertises, keyed by the resource's name before sharing. A nil
// *Config means the config is not known.
type Config struct {
	Resources map[corev1.ResourceName]Replicated
	// Source says where it was read, for messages.
	Source string
}

// None: a plugin known to run without a sharing config.
var None = &Config{Source: "no sharing config"}

// Advertised is what the plugin advertises for want (resource → devices)
// under s: each shared resource Replicas times its devices, under its
// shared name (k8s-device-plugin internal/rm/device_map.go
// updateDeviceMapWithReplicas: Replicas annotated devices per device; a
// resource the config does not name passes unchanged).
func (s *Config) Advertised(want map[corev1.ResourceName]int64) map[corev1.ResourceName]int64 {
	out := make(map[corev1.ResourceName]int64, len(want))
	for r, n := range want {
		rep, shared := s.Resources[r]
		if !shared {
			out[r] += n
			continue
		}
		out[rep.As] += n * rep.Replicas
	}
	return out
}

// pluginConfig is the part of the device plugin's config file that shapes
// what it advertises (api/config/v1: Config.Sharing, ReplicatedResources,
// ReplicatedResource).
type pluginConfig struct {
	Version string `json:"version"`
	Sharing struct {
		TimeSlicing *replicatedResources `json:"timeSlicing"`
		MPS         *replicatedResources `json:"mps"`
	} `json:"sharing"`
}

type replicatedResources struct {
	RenameByDefault bool `json:"renameByDefault"`
	Resources       []struct {
		Name     string `json:"name"`
		Replicas *int64 `json:"replicas"`
	} `json:"resources"`
}

// Parse reads a device plugin config file (YAML or JSON) as the
// plugin does (api/config/v1 parseConfigFrom, then
// DisableResourceNamingInConfig): the MPS resources when sharing.mps is
// set, else the time-slicing ones (Sharing.ReplicatedResources); a name
// without a "/" gets "nvidia.com/" (NewResourceName); replicas must be at
// least 2 (ReplicatedResource.UnmarshalJSON); "rename" is ignored and
// renameByDefault renames every listed resource to "<name>.shared".
func Parse(data []byte) (map[corev1.ResourceName]Replicated, error) {
	var c pluginConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("device plugin config: %w", err)
	}
	rr := c.Sharing.TimeSlicing
	if c.Sharing.MPS != nil {
		rr = c.Sharing.MPS
	}
	out := map[corev1.ResourceName]Replicated{}
	if rr == nil {
		return out, nil
	}
	if len(rr.Resources) == 0 {
		return nil, errors.New("device plugin config: sharing lists no resources")
	}
	for _, r := range rr.Resources {
		if r.Name == "" {
			return nil, errors.New("device plugin config: a shared resource has no name")
		}
		if r.Replicas == nil || *r.Replicas < 2 {
			return nil, fmt.Errorf("device plugin config: resource %q: number of replicas must be >= 2", r.Name)
		}
		if *r.Replicas > maxReplicas {
			return nil, fmt.Errorf("device plugin config: resource %q: %w: %d replicas, at most %d", r.Name, ErrReplicas, *r.Replicas, maxReplicas)
		}
		name := r.Name
		if !strings.Contains(name, "/") {
			name = podresources.GPUResourcePrefix + name
		}
		as := corev1.ResourceName(name)
		if rr.RenameByDefault {
			as += sharedSuffix
		}
		out[corev1.ResourceName(name)] = Replicated{Replicas: *r.Replicas, As: as}
	}
	return out, nil
}

// configManager is where one device plugin pod's config-manager picks the
// plugin's config.
type configManager struct {
	namespace, configMap      string
	nodeLabel, defaultConfig  string
	fallbacks                 []string
	ownConfigFile, hasManager bool
}

// ReadNode finds the device plugin's sharing config for node as the
// plugin's config-manager picks it: the ConfigMap mounted at its
// CONFIG_FILE_SRCDIR, the key the node's nvidia.com/device-plugin.config
// label (its NODE_LABEL) names, else DEFAULT_CONFIG, else its fallback
// strategies (updateConfigName). A plugin pod with neither a config-manager
// nor a config file of its own shares nothing (None). Where the config
// cannot be known (no plugin pod, a config file on the host, a ConfigMap
// the agent may not read, a label naming a missing key: the config-manager
// then keeps the previous config), it returns nil and an error wrapping
// errUnknown. pods lists the node's pods, isPlugin picks the device
// plugin's (nil: IsPlugin).
func ReadNode(ctx context.Context, client kclient.Interface, node string, pods PodLister, isPlugin func(*corev1.Pod) bool) (*Config, error) {
	if node == "" {
		return nil, fmt.Errorf("read the device plugin's config: %w", errNoNode)
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: read node %s: %w", errUnknown, node, err)
	}
	return Read(ctx, client, n, pods, isPlugin)
}

// Read is ReadNode with the Node already read (the agent's
// watch of its Node holds the config label).
func Read(ctx context.Context, client kclient.Interface, n *corev1.Node, pods PodLister, isPlugin func(*corev1.Pod) bool) (*Config, error) {
	node := n.Name
	list, err := pods(ctx, client, node)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnknown, err)
	}
	if isPlugin == nil {
		isPlugin = IsPlugin
	}
	cm, found := pluginConfigManager(list, isPlugin)
	switch {
	case !found:
		return nil, fmt.Errorf("%w: %w %s", errUnknown, ErrNoPluginPod, node)
	case !cm.hasManager && !cm.ownConfigFile:
		return None, nil
	case !cm.hasManager || cm.configMap == "":
		return nil, fmt.Errorf("%w: the device plugin reads a config file the agent cannot see", errUnknown)
	}
	m, err := client.CoreV1().ConfigMaps(cm.namespace).Get(ctx, cm.configMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: read ConfigMap %s/%s: %w", errUnknown, cm.namespace, cm.configMap, err)
	}
	key, err := cm.pick(n.Labels, m)
	if err != nil {
		return nil, fmt.Errorf("%w: ConfigMap %s/%s: %w", errUnknown, cm.namespace, cm.configMap, err)
	}
	if key == "" {
		return &Config{Source: fmt.Sprintf("ConfigMap %s/%s: empty config", cm.namespace, cm.configMap)}, nil
	}
	res, err := Parse([]byte(configData(m, key)))
	if err != nil {
		return nil, fmt.Errorf("%w: ConfigMap %s/%s key %q: %w", errUnknown, cm.namespace, cm.configMap, key, err)
	}
	return &Config{Resources: res, Source: fmt.Sprintf("ConfigMap %s/%s key %q", cm.namespace, cm.configMap, key)}, nil
}

func configData(m *corev1.ConfigMap, key string) string {
	if v, ok := m.Data[key]; ok {
		return v
	}
	return string(m.BinaryData[key])
}

// pick is the config-manager's updateConfigName: the label's key (which
// must exist), else the default (which must exist), else the fallbacks in
// order; "" is the empty config.
func (cm *configManager) pick(labels map[string]string, m *corev1.ConfigMap) (string, error) {
	keys := map[string]bool{}
	for k := range m.Data {
		keys[k] = true
	}
	for k := range m.BinaryData {
		keys[k] = true
	}
	if len(keys) == 0 {
		return "", errors.New("no configuration files available")
	}
	if want := labels[cm.nodeLabel]; want != "" {
		if !keys[want] {
			return "", fmt.Errorf("specified config %s (label %s) does not exist", want, cm.nodeLabel)
		}
		return want, nil
	}
	if cm.defaultConfig != "" {
		if !keys[cm.defaultConfig] {
			return "", fmt.Errorf("specified default config %s does not exist", cm.defaultConfig)
		}
		return cm.defaultConfig, nil
	}
	for _, f := range cm.fallbacks {
		switch f {
		case fallbackNamed:
			if keys[namedFallback] {
				return namedFallback, nil
			}
		case fallbackSingle:
			if len(keys) == 1 {
				for k := range keys {
					return k, nil
				}
			}
		case fallbackEmpty:
			return "", nil
		}
	}
	return "", errors.New("no config selected by the fallback strategies")
}

// pluginConfigManager reads the config-manager of the first device plugin
// pod (by name) on the node; found is false where there is none. Pods on
// their way out count: they belong to the same DaemonSet as their
// successors.
func pluginConfigManager(pods []corev1.Pod, isPlugin func(*corev1.Pod) bool) (cm configManager, found bool) {
	pods = slices.Clone(pods) // the caller's list may be shared (NodePods)
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	for i := range pods {
		p := &pods[i]
		if !isPlugin(p) {
			continue
		}
		return readConfigManager(p), true
	}
	return configManager{}, false
}

// IsPlugin: a device plugin pod (not GPU Feature Discovery's) by the labels
// NVIDIA deploys it with, for callers with no selectors of their own.
func IsPlugin(p *corev1.Pod) bool {
	return p.Labels["app"] == "nvidia-device-plugin-daemonset" || p.Labels["app.kubernetes.io/name"] == "nvidia-device-plugin" &&
		!strings.Contains(p.Name, "gpu-feature-discovery")
}

func readConfigManager(p *corev1.Pod) configManager {
	cm := configManager{namespace: p.Namespace, nodeLabel: devicePluginConfigLabel}
	containers := append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	for _, c := range containers {
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if env[envConfigFile] != "" || hasArg(c.Args, argConfigFile) || hasArg(c.Command, argConfigFile) {
			cm.ownConfigFile = true
		}
		src, ok := env[envConfigSrcDir]
		if !ok || cm.hasManager {
			continue
		}
		cm.hasManager = true
		if v := env[envNodeLabel]; v != "" {
			cm.nodeLabel = v
		}
		cm.defaultConfig = env[envDefaultConfig]
		for _, f := range strings.Split(env[envFallbackStrategies], ",") {
			if f = strings.TrimSpace(f); f != "" {
				cm.fallbacks = append(cm.fallbacks, f)
			}
		}
		cm.configMap = mountedConfigMap(p, &c, src)
	}
	return cm
}

func hasArg(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || strings.HasPrefix(a, flag+"=") {
			return true
		}
	}
	return false
}

// mountedConfigMap names the ConfigMap c mounts at dir, or "".
func mountedConfigMap(p *corev1.Pod, c *corev1.Container, dir string) string {
	for _, m := range c.VolumeMounts {
		if strings.TrimSuffix(m.MountPath, "/") != strings.TrimSuffix(dir, "/") {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				return v.ConfigMap.Name
			}
		}
	}
	return ""
}

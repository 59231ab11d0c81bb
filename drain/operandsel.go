package drain

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The operands the agent restarts after a change or waits for while it
// pauses them, by the names --operand-selector takes.
const (
	OperandDevicePlugin = "device-plugin"
	OperandGFD          = "gpu-feature-discovery"
	OperandValidator    = "validator"
	OperandDRAPlugin    = "dra-kubelet-plugin"
	OperandDCGMExporter = "dcgm-exporter"
	OperandDCGM         = "dcgm"
)

// OperandNames are the names --operand-selector takes, in a fixed order.
var OperandNames = []string{OperandDevicePlugin, OperandGFD, OperandValidator, OperandDRAPlugin, OperandDCGMExporter, OperandDCGM}

// restartedOperands are read from the GPUs once, at their start, and so are
// restarted after a change:
//   - NVIDIA's device plugin enumerates the devices in startPlugins
//     (k8s-device-plugin cmd/nvidia-device-plugin/main.go) and again only on
//     SIGHUP or when the kubelet's socket is re-created; its resource
//     managers are built once from that walk
//     (internal/rm/nvml_manager.go NewNVMLResourceManagers);
//   - GPU Feature Discovery labels the node (nvidia.com/mig.strategy, the
//     nvidia.com/mig-* count labels) from the same walk;
//   - the GPU Operator's validator is restarted as NVIDIA's MIG manager
//     restarts it after every change, so that its validations (CUDA, device
//     plugin) run again on the new geometry (mig-parted
//     pkg/mig/reconfigure/reconfigure.go restartValidatorPod);
//   - NVIDIA's DRA driver kubelet plugin, without DynamicMIG, announces the
//     MIG devices that exist when it starts and never looks again
//     (publishResources in dra-driver-nvidia-gpu
//     cmd/gpu-kubelet-plugin/driver.go).
//
// The DCGM exporter and DCGM are only paused (--pause-gpu-operator).
var restartedOperands = []string{OperandDevicePlugin, OperandGFD, OperandValidator, OperandDRAPlugin}

// DefaultOperandSelectors are the labels NVIDIA deploys the operands with,
// as NAME=SELECTOR: the default of --operand-selector, of which naming an
// operand replaces that operand's defaults only.
//   - The GPU Operator labels its operands' pods "app" (gpu-operator
//     assets/state-device-plugin/0500_daemonset.yaml,
//     gpu-feature-discovery/0500_daemonset.yaml,
//     state-operator-validation/0500_daemonset.yaml,
//     state-dcgm-exporter/0800_daemonset.yaml, state-dcgm/0400_dcgm.yml).
//   - The device plugin's Helm chart labels both its device plugin and its
//     GFD pods app.kubernetes.io/name=nvidia-device-plugin
//     (deployments/helm/nvidia-device-plugin/templates/_helpers.tpl
//     templateLabels); its GFD DaemonSet is named
//     <fullname>-gpu-feature-discovery (daemonset-gfd.yml), which is how
//     roleOf tells the two apart.
//   - The DRA driver's chart labels its kubelet plugin pods
//     "<name>-component: kubelet-plugin", name being the chart's name or its
//     nameOverride (deployments/helm/dra-driver-nvidia-gpu/templates/
//     _helpers.tpl selectorLabels). Under another name the plugin is still
//     found by its DaemonSet (isDRAKubeletPlugin).
var DefaultOperandSelectors = []string{
	OperandDevicePlugin + "=app=nvidia-device-plugin-daemonset",
	OperandDevicePlugin + "=app.kubernetes.io/name=nvidia-device-plugin",
	OperandGFD + "=app=gpu-feature-discovery",
	OperandGFD + "=app.kubernetes.io/name=gpu-feature-discovery",
	OperandValidator + "=app=nvidia-operator-validator",
	OperandDRAPlugin + "=dra-driver-nvidia-gpu-component=kubelet-plugin",
	OperandDCGMExporter + "=app=nvidia-dcgm-exporter",
	OperandDCGM + "=app=nvidia-dcgm",
}

// Errors of ParseSelectors.
var (
	// errEmptySelector: a selector that selects every pod.
	errEmptySelector = errors.New("selects every pod of the node")
	// errUnknownOperand: an --operand-selector name that is no operand.
	errUnknownOperand = errors.New("unknown operand")
)

// Selectors are the parsed --operand-selector and --plugin-selector
// settings: which pod of the node is which operand.
type Selectors struct {
	// byOperand holds each operand's selectors: a pod matching one is it.
	byOperand map[string][]labels.Selector
	// extra are --plugin-selector's: other pods restarted after a change,
	// never taken for an operand.
	extra []labels.Selector
}

// parseSelector is labels.Parse (a test counts the calls).
var parseSelector = func(s string) (labels.Selector, error) { return labels.Parse(s) }

// ParseSelectors parses operand (NAME=SELECTOR items; an operand named
// there loses its DefaultOperandSelectors, the others keep theirs) and
// extra (label selectors of other pods restarted after a change). A
// selector that does not parse, selects every pod, or names no operand is
// an error.
func ParseSelectors(operand, extra []string) (*Selectors, error) {
	s := &Selectors{byOperand: map[string][]labels.Selector{}}
	given := map[string]bool{}
	add := func(items []string, user bool) error {
		for _, item := range items {
			name, sel, ok := strings.Cut(item, "=")
			name = strings.TrimSpace(name)
			if !ok || !slices.Contains(OperandNames, name) {
				return fmt.Errorf("operand-selector %q: %w (NAME=SELECTOR, NAME one of %s)", item, errUnknownOperand, strings.Join(OperandNames, ", "))
			}
			if !user && given[name] {
				continue
			}
			if user {
				given[name] = true
			}
			parsed, err := parseOne(sel)
			if err != nil {
				return fmt.Errorf("operand-selector %q: %w", item, err)
			}
			s.byOperand[name] = append(s.byOperand[name], parsed)
		}
		return nil
	}
	if err := add(operand, true); err != nil {
		return nil, err
	}
	if err := add(DefaultOperandSelectors, false); err != nil {
		return nil, err
	}
	for _, e := range extra {
		parsed, err := parseOne(e)
		if err != nil {
			return nil, fmt.Errorf("plugin-selector %q: %w", e, err)
		}
		s.extra = append(s.extra, parsed)
	}
	return s, nil
}

// parseOne parses one selector that selects some pods, not all.
func parseOne(sel string) (labels.Selector, error) {
	parsed, err := parseSelector(sel)
	if err != nil {
		return nil, err
	}
	if parsed.Empty() {
		return nil, errEmptySelector
	}
	return parsed, nil
}

// matches reports whether p is operand name by its selectors alone.
func (s *Selectors) matches(name string, p *corev1.Pod) bool {
	set := labels.Set(p.Labels)
	for _, sel := range s.byOperand[name] {
		if sel.Matches(set) {
			return true
		}
	}
	return false
}

// roleOf is the operand p is ("" none). The DRA kubelet plugin is also
// found by its DaemonSet (isDRAKubeletPlugin). A pod the device plugin's
// selectors select whose name says gpu-feature-discovery is GFD: the
// device plugin's chart gives both the same labels and names the GFD
// DaemonSet <fullname>-gpu-feature-discovery, whose pods take its name.
func (s *Selectors) roleOf(p *corev1.Pod) string {
	switch {
	case s.matches(OperandDRAPlugin, p) || isDRAKubeletPlugin(p):
		return OperandDRAPlugin
	case s.matches(OperandGFD, p):
		return OperandGFD
	case s.matches(OperandDevicePlugin, p) && strings.Contains(p.Name, "gpu-feature-discovery"):
		return OperandGFD
	}
	for _, name := range OperandNames {
		if name != OperandDRAPlugin && name != OperandGFD && s.matches(name, p) {
			return name
		}
	}
	return ""
}

// Is returns a test for operand name's pods, by roleOf.
func (s *Selectors) Is(name string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool { return s.roleOf(p) == name }
}

// restarted reports whether p is restarted after a change: one of
// restartedOperands, or a pod --plugin-selector selects.
func (s *Selectors) restarted(p *corev1.Pod) bool {
	if slices.Contains(restartedOperands, s.roleOf(p)) {
		return true
	}
	set := labels.Set(p.Labels)
	for _, sel := range s.extra {
		if sel.Matches(set) {
			return true
		}
	}
	return false
}

// draKubeletPluginBinary is the DRA driver's GPU kubelet plugin program
// (dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin), which its chart's
// kubelet plugin DaemonSet runs in the container "gpus" (command
// [bash, -c], the script ending in "gpu-kubelet-plugin -v
// $(LOG_VERBOSITY)": templates/kubeletplugin.yaml), under any nameOverride,
// fullnameOverride or selectorLabelsOverride.
const draKubeletPluginBinary = "gpu-kubelet-plugin"

// isDRAKubeletPlugin reports whether p is a pod of the DRA driver's kubelet
// plugin DaemonSet: its controller is a DaemonSet whose pod template runs
// draKubeletPluginBinary. The pod's spec is that template (the DaemonSet
// controller copies it into every pod it makes: pkg/controller/daemon
// util.CreatePodTemplate), so the pod alone tells, without reading the
// DaemonSet.
func isDRAKubeletPlugin(p *corev1.Pod) bool {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "DaemonSet" {
		return false
	}
	for _, c := range p.Spec.Containers {
		for _, s := range slices.Concat(c.Command, c.Args) {
			for _, word := range strings.Fields(s) {
				if path.Base(word) == draKubeletPluginBinary {
					return true
				}
			}
		}
	}
	return false
}

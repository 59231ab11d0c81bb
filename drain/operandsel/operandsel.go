// Package operandsel tells which pods of a node are which GPU operand (the
// device plugin, GPU Feature Discovery, the validator, the DRA kubelet
// plugin, the DCGM exporter, DCGM): --operand-selector, --plugin-selector
// and --operand-namespace, parsed once. An operand is what it claims only
// as a DaemonSet's pod in an operand namespace. It does no I/O: drain
// lists the pods and acts on them.
package operandsel

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
//     RoleOf tells the two apart.
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
	// ErrEmptySelector: a selector that selects every pod.
	ErrEmptySelector = errors.New("selects every pod of the node")
	// ErrUnknownOperand: an --operand-selector name that is no operand.
	ErrUnknownOperand = errors.New("unknown operand")
)

// DefaultOperandNamespaces are where NVIDIA's installers put the
// operands: the GPU Operator's documented namespace (helm install -n
// gpu-operator), the device plugin chart's (nvidia-device-plugin), the DRA
// driver chart's (nvidia-dra-driver-gpu), and kube-system, where the device
// plugin's static manifest (nvidia-device-plugin.yml) runs it. With the
// agent's own namespace they are --operand-namespace's default
// (OperandNamespaces).
var DefaultOperandNamespaces = []string{"gpu-operator", "nvidia-device-plugin", "nvidia-dra-driver-gpu", "kube-system"}

// OperandNamespaces is the namespaces the agent takes operands from: given
// (--operand-namespace), exactly those; else the agent's own namespace and
// DefaultOperandNamespaces.
func OperandNamespaces(given []string, own string) []string {
	if len(given) > 0 {
		return given
	}
	out := slices.Clone(DefaultOperandNamespaces)
	if own != "" && !slices.Contains(out, own) {
		out = append([]string{own}, out...)
	}
	return out
}

// Selectors are the parsed --operand-selector and --plugin-selector
// settings: which pod of the node is which operand.
type Selectors struct {
	// byOperand holds each operand's selectors: a pod matching one is it.
	byOperand map[string][]labels.Selector
	// extra are --plugin-selector's: other pods restarted after a change,
	// never taken for an operand.
	extra []labels.Selector
	// namespaces are where an operand may run (--operand-namespace, as
	// OperandNamespaces resolves it); nil: any (tests only).
	namespaces []string
}

// Within restricts s to operands in namespaces (OperandNamespaces) and
// returns s.
func (s *Selectors) Within(namespaces []string) *Selectors {
	s.namespaces = slices.Clone(namespaces)
	return s
}

// vet says why p, which a selector selects, is not taken for an operand
// ("" it is): an operand is a pod a DaemonSet controls (its controller
// ownerReference), in one of s.namespaces. Labels alone are anyone's: a
// tenant who may create pods in its own namespace could label one
// app=nvidia-device-plugin-daemonset and be restarted, waited for, or
// block a change with its own PodDisruptionBudget.
func (s *Selectors) vet(p *corev1.Pod) string {
	if s.namespaces != nil && !slices.Contains(s.namespaces, p.Namespace) {
		return "namespace " + p.Namespace + " is not an operand namespace (--operand-namespace: " + strings.Join(s.namespaces, ", ") + ")"
	}
	if ref := metav1.GetControllerOf(p); ref == nil || ref.Kind != "DaemonSet" {
		return "not controlled by a DaemonSet"
	}
	return ""
}

// selected is the operand p's labels (or, for the DRA kubelet plugin,
// its DaemonSet's program) make it ("" none), or "plugin-selector" where
// only --plugin-selector selects it; before vet.
func (s *Selectors) selected(p *corev1.Pod) string {
	if r := s.claimed(p); r != "" {
		return r
	}
	set := labels.Set(p.Labels)
	for _, sel := range s.extra {
		if sel.Matches(set) {
			return "plugin-selector"
		}
	}
	return ""
}

// Impostors are the pods of pods that a selector selects but vet refuses,
// as "namespace/name (selected as X; why)", sorted: the agent ignores them
// and warns, naming each.
func (s *Selectors) Impostors(pods []corev1.Pod) []string {
	var out []string
	for i := range pods {
		p := &pods[i]
		as := s.selected(p)
		if as == "" {
			continue
		}
		if why := s.vet(p); why != "" {
			out = append(out, fmt.Sprintf("%s/%s (selected as %s; %s)", p.Namespace, p.Name, as, why))
		}
	}
	slices.Sort(out)
	return out
}

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
				return fmt.Errorf("operand-selector %q: %w (NAME=SELECTOR, NAME one of %s)", item, ErrUnknownOperand, strings.Join(OperandNames, ", "))
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
	parsed, err := labels.Parse(sel)
	if err != nil {
		return nil, err
	}
	if parsed.Empty() {
		return nil, ErrEmptySelector
	}
	return parsed, nil
}

// Matches reports whether p is operand name by its selectors, and vet
// takes it.
func (s *Selectors) Matches(name string, p *corev1.Pod) bool {
	return s.labelled(name, p) && s.vet(p) == ""
}

// labelled reports whether p is operand name by its selectors alone.
func (s *Selectors) labelled(name string, p *corev1.Pod) bool {
	set := labels.Set(p.Labels)
	for _, sel := range s.byOperand[name] {
		if sel.Matches(set) {
			return true
		}
	}
	return false
}

// RoleOf is the operand p is ("" none). The DRA kubelet plugin is also
// found by its DaemonSet (isDRAKubeletPlugin). A pod the device plugin's
// selectors select whose name says gpu-feature-discovery is GFD: the
// device plugin's chart gives both the same labels and names the GFD
// DaemonSet <fullname>-gpu-feature-discovery, whose pods take its name.
func (s *Selectors) RoleOf(p *corev1.Pod) string {
	if s.vet(p) != "" {
		return ""
	}
	return s.claimed(p)
}

// claimed is RoleOf before vet: the operand p's labels (or its
// DaemonSet's program) say it is.
func (s *Selectors) claimed(p *corev1.Pod) string {
	switch {
	case s.labelled(OperandDRAPlugin, p) || isDRAKubeletPlugin(p):
		return OperandDRAPlugin
	case s.labelled(OperandGFD, p):
		return OperandGFD
	case s.labelled(OperandDevicePlugin, p) && strings.Contains(p.Name, "gpu-feature-discovery"):
		return OperandGFD
	}
	for _, name := range OperandNames {
		if name != OperandDRAPlugin && name != OperandGFD && s.labelled(name, p) {
			return name
		}
	}
	return ""
}

// Is returns a test for operand name's pods, by RoleOf.
func (s *Selectors) Is(name string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool { return s.RoleOf(p) == name }
}

// Restarted reports whether p is restarted after a change: one of
// restartedOperands, or a pod --plugin-selector selects.
func (s *Selectors) Restarted(p *corev1.Pod) bool {
	if slices.Contains(restartedOperands, s.RoleOf(p)) {
		return true
	}
	if s.vet(p) != "" {
		return false
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

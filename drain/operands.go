package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/migagent/mig-agent/internal/apierr"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/record"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// PausedValue is what a paused operand's deploy label is set to, as NVIDIA's
// MIG manager does; the GPU Operator's DaemonSets then leave the node.
const PausedValue = record.OperandPaused

// errOperandsTimeout: operand pods were still on the node after the wait.
var errOperandsTimeout = errors.New("GPU Operator operand pods still on the node")

// operand is a GPU Operator operand: its node deploy label, and the
// operand name (OperandNames) whose selectors find its pods ("" when
// there is nothing to wait for).
type operand struct {
	Label   string
	Operand string
}

// Operands returns the operands that hold GPUs and are paused during a
// change: the ones NVIDIA's MIG manager pauses. Their pods are found by
// --operand-selector, whose defaults are the labels NVIDIA's manager waits
// on.
func Operands() []operand {
	return []operand{
		{Label: "nvidia.com/gpu.deploy.device-plugin", Operand: OperandDevicePlugin},
		{Label: "nvidia.com/gpu.deploy.gpu-feature-discovery", Operand: OperandGFD},
		{Label: "nvidia.com/gpu.deploy.dcgm-exporter", Operand: OperandDCGMExporter},
		{Label: "nvidia.com/gpu.deploy.dcgm", Operand: OperandDCGM},
		{Label: "nvidia.com/gpu.deploy.nvsm", Operand: ""},
		// GPU client DaemonSets select on it (GPU Operator v26.7 sets it,
		// controllers/state_manager.go gpuStateLabels); NVIDIA's MIG
		// manager pauses it only where present, as Paused does for all.
		{Label: "nvidia.com/gpu.deploy.client", Operand: ""},
	}
}

// savedLabels holds the operand labels' values before a pause: label → value,
// nil where the label was absent. It is plain JSON ({"label": "true",
// "other": null}), for the caller's journal.
type savedLabels map[string]*string

// Paused lists, sorted, the labels that pauseOperands sets to PausedValue:
// those present with a value other than "false". An absent label means the
// operator does not deploy that operand here, and "false" means someone
// turned it off on purpose; both are left exactly as they are.
func (s savedLabels) Paused() []string {
	var out []string
	for l, v := range s {
		if v != nil && *v != "false" {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

// readOperands reads the operand labels of node. Journal the result, then
// call pauseOperands with it, so that a crash between the two leaves a
// record of what to restore. A label already at PausedValue (left by an
// interrupted change) is saved as "true", what NVIDIA's manager restores.
func readOperands(ctx context.Context, client kclient.Interface, node string) (savedLabels, error) {
	if node == "" {
		return nil, fmt.Errorf("read operand labels: %w", errNoNode)
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read operand labels of node %s: %w", node, err)
	}
	return operandsOf(n), nil
}

// operandsOf is what readOperands saves, from a Node already read (the
// agent's watch of its Node).
func operandsOf(n *corev1.Node) savedLabels {
	saved := savedLabels{}
	for _, op := range Operands() {
		v, ok := n.Labels[op.Label]
		switch {
		case !ok:
			saved[op.Label] = nil
		case v == PausedValue:
			saved[op.Label] = ptr.To("true")
		default:
			saved[op.Label] = ptr.To(v)
		}
	}
	return saved
}

// pauseOperands sets the labels of saved.Paused() to PausedValue and waits
// up to wait (0: no wait) for the operands' pods (as sels finds them) to
// leave node. A label whose value changed since readOperands is left alone
// and logged. On errOperandsTimeout (or any error) the caller restores
// with saved.
func pauseOperands(ctx context.Context, client kclient.Interface, log *slog.Logger, node string, saved savedLabels,
	sels *Selectors, wait time.Duration) error {
	if node == "" {
		return fmt.Errorf("pause operands: %w", errNoNode)
	}
	toPause := saved.Paused()
	if len(toPause) == 0 {
		return nil
	}
	var paused []string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		paused = nil
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		changed := false
		for _, l := range toPause {
			cur, ok := n.Labels[l]
			switch {
			case ok && cur == PausedValue:
				paused = append(paused, l)
			case !ok || cur != *saved[l]:
				log.Warn("operand label changed since it was read; left alone", "label", l, "value", cur, "present", ok)
			default:
				n.Labels[l] = PausedValue
				paused = append(paused, l)
				changed = true
			}
		}
		if !changed {
			return nil
		}
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("pause operands on node %s: %w", node, err)
	}
	log.Info("operands paused", "labels", paused)
	var ops []operand
	for _, op := range Operands() {
		if op.Operand != "" && slices.Contains(paused, op.Label) {
			ops = append(ops, op)
		}
	}
	if wait <= 0 || len(ops) == 0 {
		return nil
	}
	return waitOperandsGone(ctx, client, log, node, ops, sels, wait)
}

// leaving lists the pods of pods that pausing ops sends away: those an
// operand's selectors select whose spec names its deploy label in its
// node selector, as the GPU Operator's operand DaemonSets do (nodeSelector
// "nvidia.com/gpu.deploy.<operand>": "true", gpu-operator
// assets/state-*/…_daemonset.yaml). The DaemonSet controller deletes the
// pods of a node its template's node selector no longer matches
// (pkg/controller/daemon NodeShouldRunDaemonPod); a pod with no such node
// selector (a device plugin installed by its own chart) stays however the
// label is set, and is not waited for.
func leaving(pods []corev1.Pod, ops []operand, sels *Selectors) []corev1.Pod {
	var out []corev1.Pod
	for i := range pods {
		p := &pods[i]
		for _, op := range ops {
			if _, ok := p.Spec.NodeSelector[op.Label]; ok && sels.Matches(op.Operand, p) {
				out = append(out, *p)
				break
			}
		}
	}
	return out
}

func waitOperandsGone(ctx context.Context, client kclient.Interface, log *slog.Logger, node string, ops []operand, sels *Selectors,
	timeout time.Duration) error {
	warned := false
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()}
	var left []string
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if apierr.Permanent(err) {
			return false, fmt.Errorf("wait for operand pods to leave node %s: %w", node, err)
		}
		if err != nil {
			lastErr = err // the API server is briefly away; keep trying
			return false, nil
		}
		if bad := sels.Impostors(list.Items); len(bad) > 0 && !warned {
			warned = true
			log.Warn("pods selected as operands are not operands: ignored (not waited for)", "pods", bad)
		}
		left = podNames(leaving(list.Items, ops, sels))
		return len(left) == 0, nil
	})
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("wait for operand pods to leave node %s: %w", node, ctx.Err())
	}
	if !wait.Interrupted(err) {
		return err // an answer no retry changes
	}
	if len(left) == 0 && lastErr != nil {
		return fmt.Errorf("wait for operand pods to leave node %s: %w", node, lastErr)
	}
	return fmt.Errorf("%w after %s: %s", errOperandsTimeout, timeout, strings.Join(left, ", "))
}

// restoreOperands puts back the values of saved: each label that is at
// PausedValue now gets its saved value (removed where it was absent). A
// label with any other value was not paused by us, or was changed since,
// and is left alone. Safe to repeat.
func restoreOperands(ctx context.Context, client kclient.Interface, log *slog.Logger, node string,
	saved savedLabels) error {
	if node == "" {
		return fmt.Errorf("restore operands: %w", errNoNode)
	}
	if len(saved) == 0 {
		return nil
	}
	var restored []string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		restored = nil
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for l, v := range saved {
			if cur, ok := n.Labels[l]; !ok || cur != PausedValue {
				continue
			}
			switch {
			case v == nil:
				delete(n.Labels, l)
			case *v == PausedValue:
				n.Labels[l] = "true"
			default:
				n.Labels[l] = *v
			}
			restored = append(restored, l)
		}
		if len(restored) == 0 {
			return nil
		}
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("restore operands on node %s: %w", node, err)
	}
	sort.Strings(restored)
	log.Info("operands restored", "labels", restored)
	return nil
}

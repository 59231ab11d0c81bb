package drain

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/migagent/mig-agent/drain/fresh"
	"github.com/migagent/mig-agent/drain/podresources"
	"github.com/migagent/mig-agent/drain/sharing"
	"github.com/migagent/mig-agent/internal/apierr"
	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/profiles"
)

// Resource names NVIDIA's device plugin advertises.
const (
	resourceGPU       = corev1.ResourceName(podresources.GPUResource)
	resourceMIGPrefix = podresources.MIGResourcePrefix
)

var (
	// errUnknownStrategy: not none, single or mixed.
	errUnknownStrategy = errors.New("unknown MIG strategy")
	// errResourcesTimeout: the node's allocatable did not show the expected
	// resources in time.
	errResourcesTimeout = errors.New("node allocatable did not show the expected resources")
)

// migResourceName is the mixed-strategy resource of a MIG profile:
// "nvidia.com/mig-1g.18gb"; a "+" becomes "." ("1g.18gb+me" →
// "nvidia.com/mig-1g.18gb.me"), as the device plugin names it.
func migResourceName(profile string) (corev1.ResourceName, error) {
	n, err := profiles.Parse(profile)
	if err != nil {
		return "", err
	}
	return corev1.ResourceName(resourceMIGPrefix + strings.ReplaceAll(n.String(), "+", ".")), nil
}

// expectedResources returns what NVIDIA's device plugin advertises under
// strategy (empty means none) for the GPUs: migMode has each GPU by UUID,
// true where its MIG mode is on; migDevices the MIG devices of those by UUID,
// each with its compute instance's profile as NVML names it ("1g.18gb",
// "1c.3g.71gb", "1g.18gb+me").
//   - none: nvidia.com/gpu = every GPU (MIG is ignored);
//   - single: nvidia.com/gpu = every MIG device + every GPU with MIG off;
//   - mixed: nvidia.com/mig-<profile> per MIG device profile, and
//     nvidia.com/gpu = every GPU with MIG off.
//
// Resources with a count of 0 are left out.
func expectedResources(strategy string, migMode map[string]bool, migDevices map[string]string) (map[corev1.ResourceName]int64, error) {
	out := map[corev1.ResourceName]int64{}
	switch strategy {
	case "", profiles.StrategyNone:
		out[resourceGPU] = int64(len(migMode))
	case profiles.StrategySingle, profiles.StrategyMixed:
		for _, on := range migMode {
			if !on {
				out[resourceGPU]++
			}
		}
		for _, uuid := range slices.Sorted(maps.Keys(migDevices)) {
			name, err := migResourceName(migDevices[uuid])
			if err != nil {
				return nil, fmt.Errorf("MIG device %s: %w", uuid, err)
			}
			if strategy == profiles.StrategySingle {
				name = resourceGPU
			}
			out[name]++
		}
	default:
		return nil, fmt.Errorf("%w %q: want %s, %s or %s", errUnknownStrategy, strategy, profiles.StrategyNone, profiles.StrategySingle, profiles.StrategyMixed)
	}
	for r, n := range out {
		if n == 0 {
			delete(out, r)
		}
	}
	return out, nil
}

// advertisesGPU reports whether node's capacity or allocatable lists any of
// the device plugin's GPU resources (isGPUResource), that is, whether a
// device plugin ever advertised one.
func advertisesGPU(node *corev1.Node) bool {
	for _, l := range []corev1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
		for r := range l {
			if isGPUResource(r) {
				return true
			}
		}
	}
	return false
}

// waitAllocatable waits up to timeout until node's allocatable shows exactly
// want: each resource of want with its count, and every other GPU resource
// (nvidia.com/gpu, nvidia.com/mig-*) at 0 or absent. A MIG resource the
// device plugin no longer advertises stays in the node's capacity for a while
// (the kubelet keeps it, unhealthy, for five minutes after its plugin went:
// endpointStopGracePeriod in k8s.io/kubernetes pkg/kubelet/cm/devicemanager),
// but its allocatable is 0 at once; a leftover above 0 means the plugin still
// advertises the old geometry. It returns (true, nil) at once when the node
// advertises no nvidia.com/ resource at all (no device plugin: nothing to
// wait for; advertisesGPU tells the two apart). When time runs out it returns
// false and an error wrapping errResourcesTimeout that names what is
// missing; other errors (ctx cancelled, node unreadable throughout) come
// with false too. A timeout <= 0 checks once.
//
// The wait is driven by a watch of that one Node (a list and a watch,
// selected by its name), not by reading it again and again: while the
// kubelet publishes nothing new, it sends the API server nothing. A watch the
// server ends (an outage, its timeout, a resourceVersion too old) is
// followed by a list and a new watch, after a jittered backoff where the
// server did not answer.
func waitAllocatable(ctx context.Context, client kclient.Interface, node string,
	want map[corev1.ResourceName]int64, timeout time.Duration) (bool, error) {
	return waitAdvertised(ctx, client, node, want, sharing.None, timeout)
}

// waitAdvertised is waitAllocatable for a device plugin that shares its
// devices as sharing says (sharing.ReadNode): want (devices per resource) is
// expected as sharing.Advertised(want), exactly. A nil sharing (the
// plugin's config is not known) accepts, per resource of want, the forms
// the plugin documents (matchShared).
func waitAdvertised(ctx context.Context, client kclient.Interface, node string,
	want map[corev1.ResourceName]int64, sharing *sharing.Config, timeout time.Duration) (bool, error) {
	return waitFresh(ctx, client, node, want, sharing, nil, timeout)
}

// waitFresh is waitAdvertised that, with fresh, takes the allocatable only
// once a plugin started after the change wrote it (fresh.Proof); the pods are
// read every freshPodPoll until a new plugin pod is Ready.
func waitFresh(ctx context.Context, client kclient.Interface, node string,
	want map[corev1.ResourceName]int64, sharing *sharing.Config, fresh *fresh.Proof, timeout time.Duration) (bool, error) {
	if node == "" {
		return false, fmt.Errorf("wait for allocatable: %w", errNoNode)
	}
	w := &allocatableWait{want: want, sharing: sharing, first: true, fresh: fresh}
	nodes := client.CoreV1().Nodes()
	sel := fields.OneTermEqualSelector("metadata.name", node).String()
	list := func(ctx context.Context) (*corev1.NodeList, error) {
		l, err := nodes.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(l.Items) == 0 {
			err = apierrors.NewNotFound(corev1.Resource("nodes"), node)
		}
		return l, err
	}
	if timeout <= 0 {
		l, err := list(ctx)
		if err != nil {
			return false, fmt.Errorf("wait for allocatable of node %s: %w", node, err)
		}
		if fresh != nil {
			if err := fresh.CheckPods(ctx); err != nil {
				return false, fmt.Errorf("wait for allocatable of node %s: %w", node, err)
			}
		}
		if w.done(&l.Items[0]) {
			return true, nil
		}
		return false, fmt.Errorf("%w on node %s within %s: %s", errResourcesTimeout, node, timeout, strings.Join(w.missing, ", "))
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	retries := backoff.API()
	for {
		err := w.listAndWatch(wctx, list, func(rv string) (watch.Interface, error) {
			return nodes.Watch(wctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv, AllowWatchBookmarks: true})
		})
		switch {
		case err == nil && w.ok:
			return true, nil
		case apierr.Permanent(err):
			return false, fmt.Errorf("wait for allocatable of node %s: %w", node, err)
		case err != nil && wctx.Err() == nil:
			w.lastErr = err // the API server is briefly away; keep trying
		}
		if ctx.Err() != nil {
			return false, fmt.Errorf("wait for allocatable of node %s: %w", node, ctx.Err())
		}
		if wctx.Err() != nil {
			if w.lastErr != nil && w.missing == nil {
				return false, fmt.Errorf("%w on node %s within %s: %w", errResourcesTimeout, node, timeout, w.lastErr)
			}
			return false, fmt.Errorf("%w on node %s within %s: %s", errResourcesTimeout, node, timeout, strings.Join(w.missing, ", "))
		}
		if err == nil {
			retries = backoff.API() // the watch ended normally: list again at once
			continue
		}
		select {
		case <-wctx.Done():
		case <-time.After(retries.Step()):
		}
	}
}

// allocatableWait is the state of one waitAllocatable.
type allocatableWait struct {
	want    map[corev1.ResourceName]int64
	sharing *sharing.Config // nil: not known
	fresh   *fresh.Proof    // nil: figures of any age count
	first   bool            // no read of the Node yet
	ok      bool
	missing []string
	lastErr error
	last    *corev1.Node // the last read, judged again as the pods change
}

// freshPodPoll: how often the node's pods are read while no plugin pod
// started after the change is Ready, and the last read of the Node is
// judged again (fresh.Proof counts time).
const freshPodPoll = time.Second

// done checks one read of the Node.
func (w *allocatableWait) done(n *corev1.Node) bool {
	if w.first && !advertisesGPU(n) {
		w.ok = true
		return true
	}
	w.first, w.lastErr, w.last = false, nil, n
	w.missing = matchShared(n.Status.Allocatable, w.want, w.sharing)
	w.ok = len(w.missing) == 0
	if w.fresh != nil {
		w.fresh.Observe(n, w.ok)
		w.judgeFresh()
	}
	return w.ok
}

// judgeFresh: figures that match count only when proven the new plugin's;
// figures that do not say also what the pods lack.
func (w *allocatableWait) judgeFresh() {
	if w.ok {
		if proven, why := w.fresh.Proven(); !proven {
			w.ok, w.missing = false, []string{why}
		}
		return
	}
	if !w.fresh.Ready() && w.fresh.Waiting() != "" {
		w.missing = append(w.missing, w.fresh.Waiting())
	}
}

// recheck reads the pods again (with fresh) and judges the last read of
// the Node again.
func (w *allocatableWait) recheck(ctx context.Context) (bool, error) {
	if w.fresh == nil || w.last == nil {
		return false, nil
	}
	if err := w.fresh.CheckPods(ctx); err != nil {
		return false, err
	}
	w.missing = matchShared(w.last.Status.Allocatable, w.want, w.sharing)
	w.ok = len(w.missing) == 0
	w.judgeFresh()
	return w.ok, nil
}

// listAndWatch lists the Node and follows its watch until the wait is done
// (nil, w.ok), the watch ends (nil) or a call fails (its error).
func (w *allocatableWait) listAndWatch(ctx context.Context, list func(context.Context) (*corev1.NodeList, error),
	watchFrom func(rv string) (watch.Interface, error)) error {
	l, err := list(ctx)
	if err != nil {
		return err
	}
	if w.fresh != nil {
		if err := w.fresh.CheckPods(ctx); err != nil {
			return err
		}
	}
	if w.done(&l.Items[0]) {
		return nil
	}
	wt, err := watchFrom(l.ResourceVersion)
	if err != nil {
		return err
	}
	defer wt.Stop()
	var tick <-chan time.Time
	if w.fresh != nil {
		t := time.NewTicker(freshPodPoll)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			if ok, err := w.recheck(ctx); ok || err != nil {
				return err
			}
		case ev, open := <-wt.ResultChan():
			if !open {
				return nil
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if n, isNode := ev.Object.(*corev1.Node); isNode && w.done(n) {
					return nil
				}
			case watch.Deleted:
				return apierrors.NewNotFound(corev1.Resource("nodes"), l.Items[0].Name)
			case watch.Error:
				if err := apierrors.FromObject(ev.Object); !apierrors.IsGone(err) && !apierrors.IsResourceExpired(err) {
					return err
				}
				return nil // too old a resourceVersion: list again
			}
		}
	}
}

// missingResources lists how have differs from exactly want (see
// waitAllocatable), one "resource: have N, want M" each, sorted.
func missingResources(have corev1.ResourceList, want map[corev1.ResourceName]int64) []string {
	var out []string
	for r, n := range want {
		q, ok := have[r]
		if got := q.Value(); !ok || got != n {
			out = append(out, fmt.Sprintf("%s: have %d, want %d", r, got, n))
		}
	}
	for r, q := range have {
		if _, wanted := want[r]; wanted || !isGPUResource(r) {
			continue
		}
		if got := q.Value(); got != 0 {
			out = append(out, fmt.Sprintf("%s: have %d, want 0", r, got))
		}
	}
	sort.Strings(out)
	return out
}

// isGPUResource: a resource NVIDIA's device plugin advertises for whole GPUs
// or MIG devices, shared ("nvidia.com/gpu.shared") or not; not another
// vendor's, nor NVIDIA's NICs' (podresources.IsGPUResource).
func isGPUResource(r corev1.ResourceName) bool { return podresources.IsGPUResource(string(r)) }

// matchShared lists how have differs from what the device plugin
// advertises for want (devices per resource) under sharing, sorted; empty
// is a match. A known sharing (non-nil) is exact: sharing.Advertised(want),
// every other GPU resource at 0 or absent. A nil sharing accepts, for each
// resource R of want with n devices, the forms NVIDIA's device plugin
// documents for its sharing config (k8s-device-plugin README "Shared Access
// to GPUs"; internal/rm/device_map.go updateDeviceMapWithReplicas):
//   - R at a whole multiple of n (replicas per device; 1 is no sharing),
//     R.shared at 0 or absent;
//   - R.shared (renameByDefault) at a whole multiple of n, R at 0 or absent.
//
// It stays exact about which resources exist: any other GPU resource,
// shared or not, must be 0 or absent.
func matchShared(have corev1.ResourceList, want map[corev1.ResourceName]int64, sharing *sharing.Config) []string {
	if sharing != nil {
		return missingResources(have, sharing.Advertised(want))
	}
	var out []string
	expected := map[corev1.ResourceName]bool{}
	for r, n := range want {
		shared := r + podresources.SharedSuffix
		expected[r], expected[shared] = true, true
		plain, renamed := have[r], have[shared]
		p, s := plain.Value(), renamed.Value()
		switch {
		case n <= 0:
			if p != 0 || s != 0 {
				out = append(out, fmt.Sprintf("%s: have %d, want 0", r, p+s))
			}
		case p > 0 && s > 0:
			out = append(out, fmt.Sprintf("%s: have %d and %s %d, want only one of them", r, p, shared, s))
		case p > 0 && p%n == 0, s > 0 && s%n == 0:
		case s > 0:
			out = append(out, fmt.Sprintf("%s: have %d, want %d or a whole multiple (sharing replicas)", shared, s, n))
		default:
			out = append(out, fmt.Sprintf("%s: have %d, want %d or a whole multiple (sharing replicas)", r, p, n))
		}
	}
	for r, q := range have {
		if expected[r] || !isGPUResource(r) {
			continue
		}
		if got := q.Value(); got != 0 {
			out = append(out, fmt.Sprintf("%s: have %d, want 0", r, got))
		}
	}
	sort.Strings(out)
	return out
}

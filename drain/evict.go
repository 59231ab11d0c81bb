package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/kclient"
)

// Sentinel errors of the package.
var (
	// errNoNode: a node name is required.
	errNoNode = errors.New("no node name")
	// errNotEvictable: a pod that holds a device of the change cannot be
	// evicted (a static pod), or may not be (a pod with no controller while
	// evictOptions.RefuseUnmanaged is set). Nothing was evicted.
	errNotEvictable = errors.New("pods that must leave cannot be evicted")
	// errDrainTimeout: pods were still on the node when the drain timeout
	// passed (a PodDisruptionBudget, or a pod slow to terminate).
	errDrainTimeout = errors.New("pods still on the node after the drain timeout")
	// errEvictionFailed: an eviction failed before the timeout with an error
	// that is not retried (not a 429), such as the API server going away.
	errEvictionFailed = errors.New("eviction failed")
)

// Defaults of evictOptions.
const (
	defaultDrainTimeout    = 5 * time.Minute
	defaultEvictRetryDelay = 5 * time.Second
)

// evictOptions tune evict.
type evictOptions struct {
	// Timeout bounds the whole drain: evictions retried while a
	// PodDisruptionBudget forbids them, and the wait for the pods to be gone.
	// 0 means defaultDrainTimeout.
	Timeout time.Duration
	// RetryDelay is the pause after an eviction answered 429 (a
	// PodDisruptionBudget) or refused in a terminating namespace before the
	// next try. 0 means defaultEvictRetryDelay.
	RetryDelay time.Duration
	// RefuseUnmanaged makes evict fail, before evicting anything, when a pod
	// has no controller (nothing would recreate it), naming the pods. The
	// default (false) evicts them too: they hold a device that goes away.
	RefuseUnmanaged bool
}

func (o evictOptions) withDefaults() evictOptions {
	if o.Timeout <= 0 {
		o.Timeout = defaultDrainTimeout
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = defaultEvictRetryDelay
	}
	return o
}

// evict evicts exactly pods through the Eviction API (policy/v1, so
// PodDisruptionBudgets hold), each pod with its own termination grace
// period, and waits until every one is gone, by UID (a new pod of the same
// name does not count). It returns "namespace/name" of the pods that are gone.
//
// It does what kubectl's drain helper (k8s.io/kubectl/pkg/drain, drain.go
// Helper.evictPods and waitForDelete) does with the pods it is given, all
// pods at once, each in its own goroutine:
//   - an eviction answered 429 Too Many Requests (a PodDisruptionBudget
//     allows no disruption now) is tried again after RetryDelay, until the
//     drain timeout;
//   - an eviction in a namespace being deleted (403 with cause
//     NamespaceTerminating) is tried again likewise, unless the pod is
//     already terminating: then it is only waited for;
//   - 404 means the pod is gone;
//   - any other answer ends that pod's eviction (the others go on);
//   - once evicted, the pod is read every second until it is gone: not
//     found, or found with another UID.
//
// Unlike kubectl, each eviction carries the pod's UID as a precondition, so
// a new pod that took the name since the pods were chosen is never evicted
// (the server answers 409, and the chosen pod counts as gone).
//
// Before evicting anything it refuses, with errNotEvictable, static (mirror)
// pods, which the kubelet owns and no eviction removes (kubectl's drain
// skips them and leaves them running; here they hold a device that goes
// away, so the change must not go on), and, with RefuseUnmanaged, pods that
// no controller owns (kubectl refuses them without --force). DaemonSet pods
// are evicted like any other pod, as kubectl's helper does with the pods it
// is handed (kubectl drain's --ignore-daemonsets filter only chooses which
// pods to hand it): they hold a device that is destroyed.
//
// Pods still present after Timeout give errDrainTimeout, naming each with
// why it stayed; an eviction error other than those retried ends the drain
// with errEvictionFailed, wrapping the API error, once the other pods are
// done. Either way the pods already gone are returned. evict is safe to call
// again with the same pods.
func evict(ctx context.Context, client kclient.Interface, log *slog.Logger, pods []corev1.Pod,
	opts evictOptions) ([]string, error) {
	opts = opts.withDefaults()
	if len(pods) == 0 {
		return nil, nil
	}
	if err := refuse(pods, opts); err != nil {
		return nil, err
	}
	start := time.Now()
	log.Info("evicting pods", "pods", podNames(pods), "timeout", opts.Timeout)
	dctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() { errs[i] = evictOne(dctx, client, log, &pods[i], opts.RetryDelay) })
	}
	wg.Wait()
	cancel()
	var failed []error // answers that are no reason to wait on
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			failed = append(failed, err)
		}
	}

	// Ask the server which pods are still there (by UID) and why.
	var gone []string
	var stay []string
	for i := range pods {
		p := &pods[i]
		key := p.Namespace + "/" + p.Name
		why, err := stillThere(context.WithoutCancel(ctx), client, p)
		if err != nil {
			return gone, fmt.Errorf("check pod %s after eviction: %w", key, err)
		}
		if why == "" {
			gone = append(gone, key)
			continue
		}
		stay = append(stay, key+" ("+why+")")
	}
	if len(stay) > 0 {
		log.Warn("drain incomplete", "remaining", stay, "evicted", gone, "errors", errors.Join(failed...))
		if ctx.Err() != nil {
			return gone, fmt.Errorf("drain interrupted: %w; still on the node: %s", ctx.Err(), strings.Join(stay, ", "))
		}
		if len(failed) > 0 {
			return gone, fmt.Errorf("%w after %s: %w; still on the node: %s", errEvictionFailed,
				time.Since(start).Round(time.Millisecond), errors.Join(failed...), strings.Join(stay, ", "))
		}
		return gone, fmt.Errorf("%w (%s): %s", errDrainTimeout, opts.Timeout, strings.Join(stay, ", "))
	}
	log.Info("pods evicted", "pods", gone, "duration", time.Since(start).Round(time.Millisecond))
	return gone, nil
}

// deletionPoll is how often a pod being evicted is read until it is gone
// (kubectl's drain helper: one second).
const deletionPoll = time.Second

// evictOne evicts pod, retrying as evict says, and waits until it is gone. It
// returns nil once it is gone, ctx's error when ctx ends first, or the
// eviction error that is not retried.
func evictOne(ctx context.Context, client kclient.Interface, log *slog.Logger, pod *corev1.Pod, retryDelay time.Duration) error {
	key := pod.Namespace + "/" + pod.Name
	uid := pod.UID
	// gone reads the pod: whether it is gone (not found, or another UID),
	// and whether it is terminating. Errors count as neither (the API server
	// may be away for a moment): the caller tries again.
	gone := func() (bool, bool) {
		cur, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && cur.UID != uid) {
			log.Info("pod gone", "pod", key)
			return true, false
		}
		return false, err == nil && cur.DeletionTimestamp != nil
	}
	pause := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	terminating := pod.DeletionTimestamp != nil
evicting:
	for {
		log.Info("evicting pod", "pod", key)
		err := client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
		})
		switch {
		case err == nil:
			break evicting
		case apierrors.IsNotFound(err):
			log.Info("pod gone", "pod", key)
			return nil
		case apierrors.IsConflict(err):
			// The UID precondition failed (the name is another pod's now),
			// or the server lost a race with another writer of the pod:
			// read it at once and, if it is still ours, evict again soon.
		case apierrors.IsTooManyRequests(err):
			log.Warn("eviction refused; retrying", "pod", key, "retryIn", retryDelay, "err", err)
		case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			if terminating {
				break evicting // on its way out: wait for it
			}
			log.Warn("eviction refused in a terminating namespace; retrying", "pod", key, "retryIn", retryDelay, "err", err)
		default:
			return fmt.Errorf("evict pod %s: %w", key, err)
		}
		if apierrors.IsConflict(err) {
			var done bool
			if done, terminating = gone(); done {
				return nil
			}
			if err := pause(deletionPoll); err != nil {
				return err
			}
			continue
		}
		if err := pause(retryDelay); err != nil {
			return err
		}
		var done bool
		if done, terminating = gone(); done {
			return nil
		}
	}
	for {
		if done, _ := gone(); done {
			return nil
		}
		if err := pause(deletionPoll); err != nil {
			return err
		}
	}
}

// refuse checks pods that evict must not or may not evict.
func refuse(pods []corev1.Pod, opts evictOptions) error {
	var static, unmanaged []string
	for i := range pods {
		p := &pods[i]
		key := p.Namespace + "/" + p.Name
		if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; ok {
			static = append(static, key)
			continue
		}
		if opts.RefuseUnmanaged && metav1.GetControllerOf(p) == nil {
			unmanaged = append(unmanaged, key)
		}
	}
	var parts []string
	if len(static) > 0 {
		parts = append(parts, "static pods, which only their manifest on the node removes: "+strings.Join(static, ", "))
	}
	if len(unmanaged) > 0 {
		parts = append(parts, "pods with no controller, which nothing would recreate (refused by setting): "+strings.Join(unmanaged, ", "))
	}
	if len(parts) > 0 {
		return fmt.Errorf("%w: %s", errNotEvictable, strings.Join(parts, "; "))
	}
	return nil
}

// stillThere returns "" when pod (by UID) is gone, else why it stayed.
func stillThere(ctx context.Context, client kclient.Interface, pod *corev1.Pod) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cur, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if cur.UID != pod.UID {
		return "", nil
	}
	if cur.DeletionTimestamp != nil {
		return fmt.Sprintf("terminating, grace period until %s", cur.DeletionTimestamp.UTC().Format(time.RFC3339)), nil
	}
	// Not evicted: a server-side dry run says why (a PodDisruptionBudget).
	err = client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}},
	})
	if err != nil {
		return "not evicted: " + err.Error(), nil
	}
	return "not evicted", nil
}

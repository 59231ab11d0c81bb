package drain

import (
	"bytes"
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
	"k8s.io/client-go/kubernetes"
	kubectldrain "k8s.io/kubectl/pkg/drain"
)

// Sentinel errors of the package.
var (
	// ErrNoNode: a node name is required.
	ErrNoNode = errors.New("no node name")
	// ErrNotEvictable: a pod that holds a device of the change cannot be
	// evicted (a static pod), or may not be (a pod with no controller while
	// EvictOptions.RefuseUnmanaged is set). Nothing was evicted.
	ErrNotEvictable = errors.New("pods that must leave cannot be evicted")
	// ErrDrainTimeout: pods were still on the node when the drain timeout
	// passed (a PodDisruptionBudget, or a pod slow to terminate).
	ErrDrainTimeout = errors.New("pods still on the node after the drain timeout")
	// ErrEvictionFailed: an eviction failed before the timeout with an error
	// that is not retried (not a 429), such as the API server going away.
	ErrEvictionFailed = errors.New("eviction failed")
)

// Defaults of EvictOptions.
const (
	DefaultDrainTimeout    = 5 * time.Minute
	DefaultEvictRetryDelay = 5 * time.Second
)

// EvictOptions tune Evict.
type EvictOptions struct {
	// Timeout bounds the whole drain: evictions retried while a
	// PodDisruptionBudget forbids them, and the wait for the pods to be gone.
	// 0 means DefaultDrainTimeout.
	Timeout time.Duration
	// RetryDelay is the pause after an eviction answered 429 (a
	// PodDisruptionBudget) before the next try. 0 means DefaultEvictRetryDelay.
	RetryDelay time.Duration
	// RefuseUnmanaged makes Evict fail, before evicting anything, when a pod
	// has no controller (nothing would recreate it), naming the pods. The
	// default (false) evicts them too: they hold a device that goes away.
	RefuseUnmanaged bool
}

func (o EvictOptions) withDefaults() EvictOptions {
	if o.Timeout <= 0 {
		o.Timeout = DefaultDrainTimeout
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = DefaultEvictRetryDelay
	}
	return o
}

// Evict evicts exactly pods through the Eviction API (policy/v1, so
// PodDisruptionBudgets hold; 429 answers are retried every RetryDelay) with
// the kubectl drain helper, each pod with its own termination grace period,
// and waits until every one is gone, by UID (a new pod of the same name does
// not count). It returns "namespace/name" of the pods that are gone.
//
// Before evicting anything it refuses, with ErrNotEvictable, static (mirror)
// pods, which the kubelet owns and no eviction removes, and, with
// RefuseUnmanaged, pods that no controller owns. DaemonSet pods are evicted
// like any other pod: they would hold a device that is destroyed.
//
// Pods still present after Timeout give ErrDrainTimeout, naming each with
// why it stayed; an eviction error other than 429 ends the drain earlier
// with ErrEvictionFailed. Either way the pods already gone are returned.
// Evict is safe to call again with the same pods.
func Evict(ctx context.Context, client kubernetes.Interface, log *slog.Logger, pods []corev1.Pod,
	opts EvictOptions) ([]string, error) {
	opts = opts.withDefaults()
	if len(pods) == 0 {
		return nil, nil
	}
	if err := refuse(pods, opts); err != nil {
		return nil, err
	}
	helper := &kubectldrain.Helper{
		Ctx:                  ctx,
		Client:               client,
		GracePeriodSeconds:   -1, // each pod's own terminationGracePeriodSeconds
		Timeout:              opts.Timeout,
		EvictErrorRetryDelay: opts.RetryDelay,
		// Only used by the helper's pod filters, which Evict does not use (it
		// chose the pods); set as a reminder of what Evict does.
		IgnoreAllDaemonSets: false,
		DeleteEmptyDirData:  true,
		Force:               !opts.RefuseUnmanaged,
		Out:                 &logWriter{log: log, level: slog.LevelInfo},
		ErrOut:              &logWriter{log: log, level: slog.LevelWarn},
		OnPodDeletionOrEvictionFinished: func(pod *corev1.Pod, _ bool, err error) {
			if err == nil {
				log.Info("pod gone", "pod", pod.Namespace+"/"+pod.Name)
			}
		},
	}
	start := time.Now()
	log.Info("evicting pods", "pods", podNames(pods), "timeout", opts.Timeout)
	// kubectl's helper sleeps out EvictErrorRetryDelay (time.Sleep, deaf to
	// ctx) after a 429 before it looks at ctx again: waiting for it would
	// hold a shutdown or a newer request for up to that delay. It evicts
	// nothing more once ctx is done (kubectl pkg/drain drain.go,
	// evictPods: ctx is checked before every EvictPod), so it is left to
	// end by itself.
	done := make(chan error, 1)
	go func() { done <- helper.DeleteOrEvictPods(pods) }()
	var helperErr error
	select {
	case helperErr = <-done:
	case <-ctx.Done():
		helperErr = ctx.Err()
	}

	// The helper's verdict is per pod and partly textual; ask the server
	// which pods are still there (by UID) and why.
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
		log.Warn("drain incomplete", "remaining", stay, "evicted", gone, "error", helperErr)
		if ctx.Err() != nil {
			return gone, fmt.Errorf("drain interrupted: %w; still on the node: %s", ctx.Err(), strings.Join(stay, ", "))
		}
		if took := time.Since(start); took < opts.Timeout {
			if helperErr == nil {
				helperErr = errors.New("the eviction helper returned early")
			}
			return gone, fmt.Errorf("%w after %s: %w; still on the node: %s", ErrEvictionFailed,
				took.Round(time.Millisecond), helperErr, strings.Join(stay, ", "))
		}
		return gone, fmt.Errorf("%w (%s): %s", ErrDrainTimeout, opts.Timeout, strings.Join(stay, ", "))
	}
	log.Info("pods evicted", "pods", gone, "duration", time.Since(start).Round(time.Millisecond))
	return gone, nil
}

// refuse checks pods that Evict must not or may not evict.
func refuse(pods []corev1.Pod, opts EvictOptions) error {
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
		return fmt.Errorf("%w: %s", ErrNotEvictable, strings.Join(parts, "; "))
	}
	return nil
}

// stillThere returns "" when pod (by UID) is gone, else why it stayed.
func stillThere(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) (string, error) {
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

// logWriter turns the kubectl helper's progress lines into log records.
type logWriter struct {
	log   *slog.Logger
	level slog.Level
	mu    sync.Mutex
	buf   []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimSpace(string(w.buf[:i])); line != "" {
			w.log.Log(context.Background(), w.level, "eviction progress", "detail", line)
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// cleanupTimeout bounds each cleanup call against the server.
const cleanupTimeout = 30 * time.Second

// CreateNode creates a Node with these labels and deletes it when the test
// ends. Unique names are the caller's job (NewName). The server's
// TaintNodesByCondition admission adds node.kubernetes.io/not-ready:NoSchedule.
func CreateNode(t testing.TB, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	c := Client(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	got, err := c.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("cleanup: delete node %s: %v", name, err)
		}
	})
	return got
}

// CreateNamespace creates a namespace. When the test ends its pods are
// force-deleted and the namespace is deleted (it stays Terminating: there is
// no namespace controller).
func CreateNamespace(t testing.TB, name string) *corev1.Namespace {
	t.Helper()
	c := Client(t)
	ns, err := c.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := c.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
			metav1.ListOptions{}); err != nil {
			t.Logf("cleanup: delete pods of %s: %v", name, err)
		}
		if err := c.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("cleanup: delete namespace %s: %v", name, err)
		}
	})
	return ns
}

// ServiceAccountToken creates the ServiceAccount ns/sa if needed and returns
// a token for it from the TokenRequest API (valid one hour). With boundPod
// the token is bound to that pod, so it carries the pod's and its node's
// names in its claims, as a projected token of a pod does.
func ServiceAccountToken(t testing.TB, ns, sa string, boundPod *corev1.Pod) string {
	t.Helper()
	c := Client(t)
	ctx := context.Background()
	_, err := c.CoreV1().ServiceAccounts(ns).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create serviceaccount %s/%s: %v", ns, sa, err)
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if boundPod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: boundPod.Name, UID: boundPod.UID,
		}
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token request for %s/%s: %v", ns, sa, err)
	}
	return tr.Status.Token
}

var envPIDLine = regexp.MustCompile(`(?m)^KUBE_TEST_APISERVER_PID=.*$`)

// RestartAPIServer stops kube-apiserver (etcd keeps running), waits down,
// and starts it again with the same command line and port, then waits for
// /readyz. It gets SIGTERM and, after 5 s, SIGKILL (it waits for open
// watches otherwise). Clients and watches see the outage as a real one. Tests that call
// it must not run in parallel with other tests of the package.
func RestartAPIServer(t testing.TB, down time.Duration) {
	t.Helper()
	skipIfDisabled(t)
	dir := StateDir()
	pidFile := filepath.Join(dir, "kube-apiserver.pid")
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("RestartAPIServer: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatalf("RestartAPIServer: pid file %s: %v", pidFile, err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatalf("RestartAPIServer: kube-apiserver pid %d: %v", pid, err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) < 2 || !strings.Contains(string(cmdline), dir) {
		t.Fatalf("RestartAPIServer: pid %d is not the kube-apiserver of %s: %q", pid, dir, args)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("RestartAPIServer: stop pid %d: %v", pid, err)
	}
	// kube-apiserver waits for open watches on SIGTERM; like a crash loop or
	// a node losing its control plane, it is killed after a short grace.
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(10 * time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("kube-apiserver (pid %d) stopped; down for %s", pid, down)
	time.Sleep(down)

	logf, err := os.OpenFile(filepath.Join(dir, "kube-apiserver.log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatalf("RestartAPIServer: %v", err)
	}
	defer logf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not killed by a ^C meant for go test
	if err := cmd.Start(); err != nil {
		t.Fatalf("RestartAPIServer: start %s: %v", args[0], err)
	}
	go func() { _ = cmd.Wait() }() // reap it whenever the harness stops it
	newPID := strconv.Itoa(cmd.Process.Pid)
	if err := os.WriteFile(pidFile, []byte(newPID+"\n"), 0o600); err != nil {
		t.Fatalf("RestartAPIServer: %v", err)
	}
	envFile := filepath.Join(dir, "env")
	if env, err := os.ReadFile(envFile); err == nil {
		env = envPIDLine.ReplaceAll(env, []byte("KUBE_TEST_APISERVER_PID="+newPID))
		if err := os.WriteFile(envFile, env, 0o600); err != nil {
			t.Fatalf("RestartAPIServer: %v", err)
		}
	}
	start := time.Now()
	if err := readyz(context.Background(), RestConfig(t), 60*time.Second); err != nil {
		t.Fatalf("RestartAPIServer: %v", err)
	}
	t.Logf("kube-apiserver restarted as pid %s, ready after %s", newPID, time.Since(start).Round(time.Millisecond))
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	state := s[i+2]
	return state != 'Z' && state != 'X'
}

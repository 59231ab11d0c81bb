package test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/kube"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// installPulledChart installs the chart helm pulled from the registry
// (tgz, as `helm install oci://…` does after its pull) into a real
// kube-apiserver started for the test (hack/kube-apiserver.sh, the
// binaries make test builds and caches), with helm's own install action
// and server-side apply, and checks that the API server admitted every
// object without a warning and that the DaemonSet runs the release's
// image.
func installPulledChart(t *testing.T, tgz []byte, version string) {
	t.Helper()
	kubeconfig := startAPIServer(t)
	var mu sync.Mutex
	var warnings []string
	rest.SetDefaultWarningHandler(warningRecorder(func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		warnings = append(warnings, msg)
	}))
	t.Cleanup(func() { rest.SetDefaultWarningHandler(rest.WarningLogger{}) })

	settings := cli.New()
	settings.KubeConfig = kubeconfig
	settings.SetNamespace("mig-agent")
	cfg := action.NewConfiguration()
	if err := cfg.Init(settings.RESTClientGetter(), "mig-agent", "secret"); err != nil {
		t.Fatal(err)
	}
	inst := action.NewInstall(cfg)
	inst.ReleaseName, inst.Namespace, inst.CreateNamespace = "mig-agent", "mig-agent", true
	inst.WaitStrategy = kube.HookOnlyStrategy // no kubelet here: nothing becomes ready
	chrt, err := loader.LoadArchive(bytes.NewReader(tgz))
	if err != nil {
		t.Fatalf("loading the pulled chart: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := inst.RunWithContext(ctx, chrt, nil); err != nil {
		t.Fatalf("helm install of the pulled chart: %v", err)
	}
	mu.Lock()
	for _, w := range warnings {
		t.Errorf("the API server warned: %s", w)
	}
	mu.Unlock()

	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := kubernetes.NewForConfigOrDie(rc)
	list, err := c.AppsV1().DaemonSets("mig-agent").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("DaemonSets in mig-agent after the install: %v, %v", list, err)
	}
	if img := list.Items[0].Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/migagent/mig-agent:"+version {
		t.Errorf("the installed DaemonSet runs %s, want the release's image", img)
	}
	if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("admission policies: %v", err)
	}
}

// startAPIServer starts etcd and kube-apiserver for the test and returns
// the admin kubeconfig; they stop when the test ends (or its process dies).
func startAPIServer(t *testing.T) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "hack", "kube-apiserver.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("bash", script, "cached").Run(); err != nil {
		t.Fatalf("the test API server is not built (make test builds it: bash hack/kube-apiserver.sh build): %v", err)
	}
	cmd := exec.Command("bash", script, "start", "--owner-pid", strconv.Itoa(os.Getpid()))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/kube-apiserver.sh start: %v", err)
	}
	kubeconfig := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("bash", script, "stop", kubeconfig).Run() })
	return kubeconfig
}

// warningRecorder is a rest.WarningHandler that hands each warning to f.
type warningRecorder func(string)

func (f warningRecorder) HandleWarningHeader(code int, agent, msg string) {
	if code == 299 && msg != "" {
		f(msg)
	}
}

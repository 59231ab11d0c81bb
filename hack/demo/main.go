// Command demo runs mig-agent's main job end to end on one machine with no
// GPU: a real etcd + kube-apiserver on loopback, a Node, the agent on eight
// simulated H200s, and two label changes, printing the state transitions,
// the audit record and a few metrics as they happen. `make demo` runs it.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/migagent/mig-agent/agent"
)

func main() {
	bin := flag.String("bin", "bin/mig-agent", "mig-agent binary")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(format string, a ...any) {
	fmt.Printf("\n==> "+format+"\n", a...)
}

func run(ctx context.Context, bin string) error {
	work, err := os.MkdirTemp("", "mig-agent-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	say("starting a real etcd + kube-apiserver on loopback (the first run builds them: ~10 min, then cached)")
	start := exec.CommandContext(ctx, "bash", "hack/kube-apiserver.sh", "start", "--owner-pid", fmt.Sprint(os.Getpid()))
	start.Stderr = os.Stderr
	out, err := start.Output()
	if err != nil {
		return fmt.Errorf("starting the API server: %w", err)
	}
	kubeconfig := strings.TrimSpace(string(out))
	defer exec.Command("bash", "hack/kube-apiserver.sh", "stop", kubeconfig).Run()

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	const node, ns = "gpu-node-1", "mig-agent"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	say("created Node %s; starting mig-agent on 8 simulated H200 GPUs (sim:h200x8)", node)
	simState := filepath.Join(work, "sim-state.json")
	agentLog, err := os.Create(filepath.Join(work, "agent.log"))
	if err != nil {
		return err
	}
	a := exec.Command(bin, "run", "--node-name", node, "--kubeconfig", kubeconfig, "--namespace", ns,
		"--nvml", "sim:h200x8", "--sim-state", simState, "--state-dir", filepath.Join(work, "state"),
		"--metrics-address", "127.0.0.1:19478", "--reboot-method", "none", "--resource-wait-timeout", "0",
		"--pod-resources-socket", filepath.Join(work, "no-kubelet.sock"))
	a.Stdout, a.Stderr = agentLog, agentLog
	if err := a.Start(); err != nil {
		return err
	}
	defer func() {
		_ = a.Process.Signal(syscall.SIGTERM)
		_ = a.Wait()
	}()

	w, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		return err
	}
	defer w.Stop()
	state := "" // the state label as last printed
	for _, config := range []string{"all-balanced", "all-1g.18gb"} {
		say("labelling the node %s=%s", agent.LabelConfig, config)
		t0 := time.Now()
		patch := fmt.Sprintf(`{"apiVersion":"v1","kind":"Node","metadata":{"name":%q,"labels":{%q:%q}}}`, node, agent.LabelConfig, config)
		force := true
		if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.ApplyPatchType, []byte(patch), metav1.PatchOptions{FieldManager: "platform-team", Force: &force}); err != nil {
			return err
		}
		rec, err := follow(ctx, w, config, t0, &state)
		if err != nil {
			return err
		}
		fmt.Printf("    audit record: result=%s gpusChanged=%v gpusUntouched=%v evictedPods=%v requestedBy=%s configHash=%.12s…\n",
			rec.Result, rec.GPUsChanged, rec.GPUsUntouched, rec.EvictedPods, rec.RequestedBy, rec.ConfigHash)
	}

	say("the node's migagent.io/last-change annotation")
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var pretty map[string]any
	_ = json.Unmarshal([]byte(n.Annotations[agent.AnnotationLastChange]), &pretty)
	b, _ := json.MarshalIndent(pretty, "    ", "  ")
	fmt.Println("    " + string(b))

	say("mig-agent status --node %s", node)
	st := exec.Command(bin, "status", "--node", node, "--kubeconfig", kubeconfig)
	st.Stdout, st.Stderr = os.Stdout, os.Stderr
	_ = st.Run()

	say("a few metrics from http://127.0.0.1:19478/metrics")
	if err := metrics("http://127.0.0.1:19478/metrics"); err != nil {
		return err
	}
	say("stopping the agent (SIGTERM) and the API server")
	_ = a.Process.Signal(syscall.SIGTERM)
	if err := a.Wait(); err != nil {
		return fmt.Errorf("agent exit: %w", err)
	}
	fmt.Println("    agent exited 0; done")
	return nil
}

// follow prints state transitions until the record for config is final;
// last is the state printed before.
func follow(ctx context.Context, w watch.Interface, config string, t0 time.Time, last *string) (agent.ChangeRecord, error) {
	timeout := time.After(60 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return agent.ChangeRecord{}, ctx.Err()
		case <-timeout:
			return agent.ChangeRecord{}, fmt.Errorf("no final state for %s within 60s", config)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return agent.ChangeRecord{}, fmt.Errorf("watch closed")
			}
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			state := n.Labels[agent.LabelState]
			if state != *last {
				fmt.Printf("    +%6dms  %s=%s\n", time.Since(t0).Milliseconds(), agent.LabelState, state)
				*last = state
			}
			var rec agent.ChangeRecord
			_ = json.Unmarshal([]byte(n.Annotations[agent.AnnotationLastChange]), &rec)
			if rec.Config == config && (rec.Result == agent.StateSuccess || rec.Result == agent.StateFailed) && state == rec.Result {
				return rec, nil
			}
		}
	}
}

func metrics(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	for sc.Scan() {
		l := sc.Text()
		for _, p := range []string{"migagent_state{", "migagent_applied_config_info", "migagent_reconfigurations_total", "migagent_gpu_instances{gpu=\"0\""} {
			if strings.HasPrefix(l, p) {
				fmt.Println("    " + l)
			}
		}
	}
	return sc.Err()
}

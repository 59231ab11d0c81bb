package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/published/status"
	"github.com/migagent/mig-agent/record"
)

func statusCmd() *cobra.Command {
	var nodeName, kubeconfig, namespace, format string
	c := &cobra.Command{
		Use:   "status [--node NAME]",
		Short: "Show a node's desired and applied MIG config, state, geometry and recent changes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodeName == "" {
				nodeName = os.Getenv("NODE_NAME")
			}
			if nodeName == "" {
				return badInput(errors.New("--node (or $NODE_NAME) is required"))
			}
			if format != "text" && format != "json" {
				return badInput(errors.New("-o must be text or json"))
			}
			client, err := statusClient(kubeconfig)
			if err != nil {
				return err
			}
			node, err := client.CoreV1().Nodes().Get(context.WithoutCancel(cmd.Context()), nodeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if namespace == "" {
				namespace = podNamespace()
			}
			st, err := statusOf(cmd.Context(), client, namespace, node)
			if err != nil {
				return err
			}
			held := heldNow(cmd.Context(), client, namespace, nodeName, st)
			if format == "json" {
				return output(cmd.OutOrStdout(), "json", statusWithAssignments{Status: st, Assignments: held})
			}
			if err := status.WriteText(cmd.OutOrStdout(), st); err != nil {
				return err
			}
			return writeHeld(cmd.OutOrStdout(), held)
		},
	}
	c.Flags().StringVar(&nodeName, "node", "", "node name (default $NODE_NAME)")
	c.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else in-cluster)")
	c.Flags().StringVar(&namespace, "namespace", "", "the agent's namespace, where the assignment trail's ConfigMap lives (default the pod's own, else mig-agent)")
	c.Flags().StringVarP(&format, "output", "o", "text", "text or json")
	return c
}

// statusOf reads the status of node with its history whole from the
// history ConfigMap where there is one; where it cannot be read, the
// Node's light records, and a note that says why.
func statusOf(ctx context.Context, client kclient.Interface, namespace string, node *corev1.Node) (*status.Status, error) {
	whole, bad, found, herr := published.ReadHistory(context.WithoutCancel(ctx), client, namespace, node.Name)
	var st *status.Status
	var err error
	if herr == nil && found {
		st, err = status.WithHistory(node, whole, record.FullRecordRef(namespace, node.Name))
	} else {
		st, err = status.FromNode(node)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case herr != nil:
		st.Notes = append(st.Notes, "history ConfigMap: "+herr.Error()+"; the history is the Node's")
	case !found:
		st.Notes = append(st.Notes, fmt.Sprintf("no history ConfigMap %s in namespace %s: the history is the Node's", record.HistoryConfigMapName(node.Name), namespace))
	}
	for _, b := range bad {
		st.Notes = append(st.Notes, fmt.Sprintf("%s: entry %d is not a valid change record: %v", record.FullRecordRef(namespace, node.Name), b.Index, b.Err))
	}
	return st, nil
}

// statusWithAssignments is `status -o json`: the node's status and the
// MIG devices held now.
type statusWithAssignments struct {
	*status.Status
	Assignments *heldDevices `json:"assignments,omitempty"`
}

// heldDevices is what `status` shows of the assignment trail: the open
// entries, and how long the history is.
type heldDevices struct {
	Held    []assign.Entry `json:"held"`
	Entries int            `json:"entries"`
	Dropped int            `json:"dropped,omitempty"`
}

// heldNow reads the node's assignment trail; where it cannot, a note in
// st says why and nil is returned.
func heldNow(ctx context.Context, client kclient.Interface, namespace, node string, st *status.Status) *heldDevices {
	h, err := assign.ReadConfigMap(context.WithoutCancel(ctx), client, namespace, node)
	if err != nil {
		st.Notes = append(st.Notes, "assignment trail: "+err.Error())
		return nil
	}
	out := &heldDevices{Held: []assign.Entry{}, Entries: len(h.Entries), Dropped: h.Dropped}
	for _, e := range h.Entries {
		if e.Open() {
			out.Held = append(out.Held, e)
		}
	}
	return out
}

// writeHeld writes the devices held now, for a person.
func writeHeld(w io.Writer, held *heldDevices) error {
	if held == nil {
		return nil
	}
	fmt.Fprintf(w, "\nMIG devices held now (%d; the trail holds %d assignments: mig-agent assignments):\n", len(held.Held), held.Entries)
	return assign.WriteText(w, &assign.History{Entries: held.Held})
}

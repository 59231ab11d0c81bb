package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kclient/restclient"
)

// assignmentsCmd reads a node's assignment trail: which container of which
// pod held which MIG device, from when to when, pods already gone
// included.
func assignmentsCmd() *cobra.Command {
	var nodeName, kubeconfig, namespace, format, at, device, file string
	c := &cobra.Command{
		Use:   "assignments --node-name NAME",
		Short: "Show a node's MIG device assignments: which pod held which MIG device, from when to when",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "text" && format != "json" {
				return badInput(errors.New("-o must be text or json"))
			}
			var when time.Time
			if at != "" {
				t, err := time.Parse(time.RFC3339, at)
				if err != nil {
					return badInput(fmt.Errorf("--at: %q is not an RFC 3339 time (like 2026-12-01T14:00:00Z)", at))
				}
				when = t
			}
			h, err := readAssignments(cmd.Context(), file, kubeconfig, namespace, nodeName)
			if err != nil {
				return err
			}
			if !when.IsZero() || device != "" {
				if when.IsZero() {
					when = time.Now()
				}
				h.Entries = h.At(when, device)
			}
			return writeAssignments(cmd.OutOrStdout(), format, h)
		},
	}
	c.Flags().StringVar(&nodeName, "node-name", "", "node name (default $NODE_NAME)")
	c.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else in-cluster)")
	c.Flags().StringVar(&namespace, "namespace", "", "the agent's namespace, where the ConfigMap <node>-mig-assignments lives (default the pod's own, else mig-agent)")
	c.Flags().StringVarP(&format, "output", "o", "text", "text or json")
	c.Flags().StringVar(&at, "at", "", "only the assignments that held at this time (RFC 3339)")
	c.Flags().StringVar(&device, "device", "", "only the assignments of this MIG device UUID")
	c.Flags().StringVar(&file, "file", "", "read a standalone agent's history file (<state-dir>/assignments.json) instead of the ConfigMap")
	return c
}

// readAssignments reads the history from a standalone agent's file, or
// from node's ConfigMap in namespace.
func readAssignments(ctx context.Context, file, kubeconfig, namespace, nodeName string) (*assign.History, error) {
	if file != "" {
		return assign.ReadFile(file)
	}
	if nodeName == "" {
		nodeName = os.Getenv("NODE_NAME")
	}
	if nodeName == "" {
		return nil, badInput(errors.New("--node-name (or $NODE_NAME) is required"))
	}
	if namespace == "" {
		namespace = podNamespace()
	}
	client, err := statusClient(kubeconfig)
	if err != nil {
		return nil, err
	}
	return assign.ReadConfigMap(context.WithoutCancel(ctx), client, namespace, nodeName)
}

// statusClient is the client of the read-only commands (status,
// assignments): kubeconfig, else $KUBECONFIG, else in-cluster.
func statusClient(kubeconfig string) (kclient.Interface, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	cfg, err := kubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	return restclient.New(cfg)
}

func writeAssignments(w io.Writer, format string, h *assign.History) error {
	if format == "json" {
		return output(w, "json", h)
	}
	return assign.WriteText(w, h)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/kube"
)

func statusCmd() *cobra.Command {
	var nodeName, kubeconfig, format string
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
			if kubeconfig == "" {
				kubeconfig = os.Getenv("KUBECONFIG")
			}
			cfg, err := kubeConfig(kubeconfig)
			if err != nil {
				return fmt.Errorf("kubernetes client config: %w", err)
			}
			client, err := kclient.New(cfg)
			if err != nil {
				return err
			}
			node, err := client.CoreV1().Nodes().Get(context.WithoutCancel(cmd.Context()), nodeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			st, err := kube.StatusFromNode(node)
			if err != nil {
				return err
			}
			if format == "json" {
				return output(cmd.OutOrStdout(), "json", st)
			}
			return writeStatusText(cmd.OutOrStdout(), st)
		},
	}
	c.Flags().StringVar(&nodeName, "node", "", "node name (default $NODE_NAME)")
	c.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else in-cluster)")
	c.Flags().StringVarP(&format, "output", "o", "text", "text or json")
	return c
}

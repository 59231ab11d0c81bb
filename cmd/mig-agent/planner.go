package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kclient/restclient"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/planner"
	"github.com/migagent/mig-agent/settings"
)

// plannerLease is the Lease the planner's replicas elect their leader on.
const plannerLease = "mig-agent-planner"

// plannerCmd is `mig-agent planner`: it reshapes opted-in, idle GPUs for
// the MIG devices pending pods ask for (package planner).
func plannerCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "planner -f FILE --allowed-configs a,b,...",
		Short: "Reshape opted-in, idle GPUs for the MIG devices pending pods ask for (one active replica)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := loadSettings(cmd)
			if err != nil {
				return err
			}
			p, err := newPlanner(s, cmd)
			if err != nil {
				return err
			}
			if s.DryRun {
				_, err := p.Round(cmd.Context())
				return err
			}
			return runPlanner(cmd.Context(), s, p)
		},
	}
	addPlannerFlags(c.Flags())
	return c
}

// newPlanner checks the settings and builds the planner.
func newPlanner(s *settings.Settings, cmd *cobra.Command) (*planner.Planner, error) {
	if s.ConfigFile == "" {
		return nil, badInput(errors.New("-f (--config-file) is required: the config file the agents use"))
	}
	if len(s.AllowedConfigs) == 0 {
		return nil, badInput(errors.New("--allowed-configs is required: the configs the planner may choose"))
	}
	if s.MaxConcurrentPercent > 0 {
		return nil, badInput(errors.New("--max-concurrent: the planner takes a number of nodes, not a percentage"))
	}
	data, err := gpus.ReadUserFile(s.ConfigFile, gpus.MaxUserFile)
	if err != nil {
		return nil, badInput(fmt.Errorf("reading -f: %w", err))
	}
	spec, err := geometry.Parse(data)
	if err != nil {
		return nil, badInput(fmt.Errorf("-f %s: %w", s.ConfigFile, err))
	}
	for _, a := range s.AllowedConfigs {
		if _, ok := spec.Configs[a]; !ok {
			return nil, badInput(fmt.Errorf("--allowed-configs: %q is not a config of %s", a, s.ConfigFile))
		}
	}
	if s.Namespace == "" {
		s.Namespace = podNamespace()
	}
	client, err := plannerClient(s.Kubeconfig)
	if err != nil {
		return nil, err
	}
	log := newLogger(s)
	klog.SetSlogLogger(log.With("component", "client-go"))
	host, _ := os.Hostname()
	return &planner.Planner{
		Client: client, Namespace: s.Namespace, Spec: spec, Interval: s.PlannerInterval, DryRun: s.DryRun,
		Out: cmd.OutOrStdout(), Log: log, Clock: clock.RealClock{}, Identity: host,
		Options: planner.Options{Allowed: slices.Clone(s.AllowedConfigs), MaxConcurrent: max(s.MaxConcurrent, 1), HoldTime: s.HoldTime,
			ActTimeout: s.NodeActTimeout},
	}, nil
}

// plannerClient is the planner's API client: its requests carry the user
// agent mig-agent-planner/VERSION, so that audit logs (and the bench) tell
// them from the agents'.
func plannerClient(kubeconfig string) (kclient.Interface, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	cfg, err := kubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "mig-agent-planner/" + version
	// As the agent's: client-go's default (5/s, burst 10) would hold a
	// round of many opted-in nodes (1 + 3 requests each) for seconds; the
	// rounds are spaced (planner.MinRoundGap) and the API server's
	// priority and fairness protects it.
	cfg.QPS, cfg.Burst = 50, 100
	return restclient.New(cfg)
}

// runPlanner serves the planner's metrics and plans while it holds the
// Lease.
func runPlanner(ctx context.Context, s *settings.Settings, p *planner.Planner) error {
	m := metrics.NewPlanner()
	p.Metrics = m
	if s.MetricsAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", m.Handler())
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		ln, err := net.Listen("tcp", s.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics address: %w", err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	p.Log.Info("planner starting", "version", version, "allowed", s.AllowedConfigs, "maxConcurrent", p.Options.MaxConcurrent, "holdTime", s.HoldTime, "nodeActTimeout", s.NodeActTimeout)
	e := &planner.Elector{
		Client: p.Client, Namespace: s.Namespace, Name: plannerLease, Identity: p.Identity + "-" + fmt.Sprint(os.Getpid()),
		LeaseDuration: s.LeaseDuration, RenewDeadline: s.LeaseDuration * 2 / 3, RetryPeriod: max(s.LeaseDuration/6, time.Second),
		Clock: p.Clock, Log: p.Log, Leading: m.Leading,
	}
	return e.Run(ctx, p.Run)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/cdi"
	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kclient/restclient"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/kube"
	"github.com/migagent/mig-agent/lease"
	"github.com/migagent/mig-agent/lease/nodelease"
	"github.com/migagent/mig-agent/metrics"
	"github.com/migagent/mig-agent/nvmlx"
	"github.com/migagent/mig-agent/nvmlx/nvmlsim"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/settings"
	"github.com/migagent/mig-agent/standalone"
	"github.com/migagent/mig-agent/systemd"
)

func runCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "run",
		Short: "The daemon: converge the node to the config its label names (or, --standalone, to -c NAME)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := loadSettings(cmd)
			if err != nil {
				return err
			}
			if err := s.Validate(); err != nil {
				return badInput(err)
			}
			log := newLogger(s)
			klog.SetSlogLogger(log.With("component", "client-go"))
			log.Info("starting", "version", version, "settings", fmt.Sprintf("%+v", *s))
			return runDaemon(cmd.Context(), s, log)
		},
	}
	addRunFlags(c.Flags())
	return c
}

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}

// drain.Disruptor is the daemon's reconcile.Disruptor (drain does not
// import the core, which links NVML).
var _ reconcile.Disruptor = (*drain.Disruptor)(nil)

// runDaemon wires the daemon and runs it: the settings' inputs (config
// file, hooks, journal), the metrics server, the GPUs, the host (reboots,
// D-Bus units, CDI) and, unless standalone, the cluster and the node Lease.
func runDaemon(ctx context.Context, s *settings.Settings, log *slog.Logger) (err error) {
	in, unlock, err := openInputs(s)
	if err != nil {
		return err
	}
	defer unlock()
	m := metrics.New(version)
	notifier := systemd.NewNotifier(log)
	d := newDaemon(s, log, notifier, m, in)
	stopMetrics, err := serveMetrics(s, log, m, d)
	if err != nil {
		return err
	}
	defer stopMetrics()
	go logHangups(ctx, log)
	go notifier.RunWatchdog(ctx, func() bool { return true })

	g, err := waitForNVML(ctx, s, log, m, notifier)
	if err != nil || g == nil {
		return err
	}
	defer g.Close()
	d.GPU = g
	if sim, ok := g.(*nvmlx.Sim); ok {
		d.BootID = func() string { return fmt.Sprintf("sim-boot-%d", sim.BootCount()) }
	}
	closeBus := wireHost(d, s, log)
	defer closeBus()
	if s.Standalone {
		stopTrail := startTrail(ctx, newHostTrail(s, log, m, g))
		defer stopTrail()
	}

	if !s.Standalone {
		// No := here: the deferred release below sets the named err.
		var client kclient.Interface
		var release func() error
		if client, err = wireCluster(d, s, log); err != nil {
			return err
		}
		ctx, release, err = holdNodeLease(ctx, d, client, s, log)
		if err != nil {
			return err
		}
		defer func() {
			if lerr := release(); lerr != nil && err == nil {
				err = lerr
			}
		}()
		stopTrail := startTrail(ctx, newTrail(s, log, m, g, client, d.Cluster.(*kube.Cluster).CachedNode))
		defer stopTrail()
	}
	err = d.Run(ctx)
	_ = notifier.Stopping()
	if errors.Is(err, reconcile.ErrExitAfterReboot) {
		log.Info("simulated reboot done; exiting as if the machine went down")
		return nil
	}
	return err
}

// inputs are what the daemon reads from the settings' files.
type inputs struct {
	file  *gpus.ConfigFile
	hooks gpus.Hooks
	jnl   *journal.Journal
}

// openInputs reads the config file and the hooks file and opens the
// journal, locked until unlock.
func openInputs(s *settings.Settings) (_ inputs, unlock func(), err error) {
	file, err := loadFile(s.ConfigFile)
	if err != nil {
		return inputs{}, nil, err
	}
	hooks, err := gpus.LoadHooks(s.HooksFile)
	if err != nil {
		return inputs{}, nil, badInput(err)
	}
	unlock, err = journal.Lock(s.StateDir)
	if err != nil {
		return inputs{}, nil, err
	}
	jnl, err := journal.Open(s.StateDir)
	if err != nil {
		unlock()
		if errors.Is(err, journal.ErrCorrupt) {
			return inputs{}, nil, badInput(err)
		}
		return inputs{}, nil, err
	}
	return inputs{file: file, hooks: hooks, jnl: jnl}, unlock, nil
}

// newDaemon is the daemon before its GPUs, host and cluster are wired:
// standalone, its Cluster is the -c NAME it holds.
func newDaemon(s *settings.Settings, log *slog.Logger, notifier *systemd.Notifier, m *metrics.Metrics, in inputs) *reconcile.Daemon {
	d := &reconcile.Daemon{
		S: s, Log: log, Notify: notifier, Metrics: metricsPort{m}, Journal: in.jnl, File: in.file,
		Clock: clock.RealClock{}, Version: version, BootID: bootID,
		Cluster: &standalone.Standalone{Config: s.SelectedConfig, Log: log},
	}
	if s.Standalone {
		// The hooks run around standalone changes only, as around
		// nvidia-mig-parted apply; the hooks file is checked either way.
		d.Hooks = in.hooks
	}
	return d
}

// serveMetrics serves /metrics, /healthz and /readyz on --metrics-address
// (nothing where it is empty) until stop.
func serveMetrics(s *settings.Settings, log *slog.Logger, m *metrics.Metrics, d *reconcile.Daemon) (stop func(), err error) {
	if s.MetricsAddress == "" {
		return func() {}, nil
	}
	// Listening before anything else: a taken port fails the start rather
	// than leaving an agent that no probe can see.
	l, err := net.Listen("tcp", s.MetricsAddress)
	if err != nil {
		return nil, fmt.Errorf("metrics address: %w", err)
	}
	srv := metrics.NewServer(s.MetricsAddress, m, d.Ready, d.Live)
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "address", s.MetricsAddress, "err", err)
		}
	}()
	return func() { _ = srv.Close() }, nil
}

// waitForNVML opens the GPU backend, retrying every 30 s while NVML is
// unavailable (the agent is not ready meanwhile); only a bad backend
// setting fails. NVML itself is opened per pass. nil, nil: ctx ended first.
func waitForNVML(ctx context.Context, s *settings.Settings, log *slog.Logger, m *metrics.Metrics, notifier *systemd.Notifier) (nvmlx.GPU, error) {
	g, err := openBackend(s, log, true)
	for err != nil {
		var in inputError
		if errors.As(err, &in) {
			return nil, err
		}
		m.SetNVMLUp(false)
		log.Error("NVML unavailable; retrying in 30s", "err", err)
		_ = notifier.Status("NVML unavailable: %v", err)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(30 * time.Second):
		}
		g, err = openBackend(s, log, true)
	}
	return g, nil
}

// wireHost gives the daemon its host side: the rebooter (and logind's
// inhibitor lock), the host GPU clients' systemd units and the CDI refresh,
// over the system bus where they need it. closeBus closes the bus.
func wireHost(d *reconcile.Daemon, s *settings.Settings, log *slog.Logger) (closeBus func()) {
	closeBus = func() {}
	switch s.RebootMethod {
	case settings.RebootSim:
		d.Reboot = simRebooter{path: s.SimState, log: log}
	case settings.RebootSystemctl:
		d.Reboot = systemd.NewSystemctlRebooter(nil)
	case settings.RebootNone:
		d.Reboot = noReboot{}
	case settings.RebootKured:
		r := &systemd.SentinelRebooter{Path: s.RebootSentinel, BootID: func() string { return d.BootID() }, Log: log}
		r.ClearStale()
		d.Reboot = r
	}
	var cdiUnits cdi.UnitStarter // standalone: the host's nvidia-cdi-refresh.service
	if s.RebootMethod == settings.RebootLogind || len(s.HostGPUClients) > 0 || s.Standalone && newCDI(s, log, nil) != nil {
		conn, err := systemd.ConnectSystemBus(s.DBusAddress)
		if err != nil {
			log.Warn("D-Bus unavailable: logind reboots and host GPU client control will fail", "err", err)
			if s.RebootMethod == settings.RebootLogind {
				d.Reboot = failingRebooter{err: err}
			}
		} else {
			closeBus = func() { _ = conn.Close() }
			if s.RebootMethod == settings.RebootLogind {
				lr := systemd.NewLogindRebooter(conn, log)
				d.Reboot, d.Inhibit = lr, lr
			}
			if len(s.HostGPUClients) > 0 {
				d.Units = systemd.NewUnits(conn, log)
			}
			if s.Standalone {
				cdiUnits = systemd.NewUnits(conn, log)
			}
		}
	}
	d.CDI = newCDI(s, log, cdiUnits)
	return closeBus
}

// wireCluster gives the daemon its Kubernetes side: the Node, the
// disruption of a change, the other MIG managers and operands, and the
// rollout slots where --max-concurrent asks for them.
func wireCluster(d *reconcile.Daemon, s *settings.Settings, log *slog.Logger) (kclient.Interface, error) {
	cfg, err := kubeConfig(s.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "mig-agent/" + version
	// client-go's default client-side limit (5/s, burst 10) turns the ~20
	// calls of one change into seconds of waiting; the API server's
	// priority and fairness protects it. The kubelet uses the same.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := restclient.New(cfg)
	if err != nil {
		return nil, err
	}
	cluster := &kube.Cluster{Client: client, Node: s.NodeName, Namespace: s.Namespace, Clock: clock.RealClock{},
		Component: "mig-agent", DefaultConfig: s.DefaultConfig, Log: log}
	for _, st := range s.StartupTaints {
		t, err := settings.ParseTaint(st) // validated with the settings
		if err != nil {
			return nil, err
		}
		cluster.StartupTaints = append(cluster.StartupTaints, corev1.Taint{Key: t.Key, Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
		d.Startup = cluster
	}
	d.Cluster = cluster
	d.Disrupt = newDisruptor(client, log, s, cluster.CachedNode)
	// The GPU Operator's ClusterPolicy is a custom resource: read it as
	// JSON into unstructured objects (no operator types in the agent).
	d.Others = &kube.Others{Client: client, Policies: kube.RESTClusterPolicies(client), Node: s.NodeName,
		Read: cluster.CachedNode}
	if s.MaxConcurrent > 0 || s.MaxConcurrentPercent > 0 {
		d.Slots = &lease.Slots{Client: client, Namespace: s.Namespace, Holder: s.NodeName, N: s.MaxConcurrent, Percent: s.MaxConcurrentPercent,
			Duration: s.LeaseDuration, Clock: clock.RealClock{}, Log: log}
	}
	return client, nil
}

// newDisruptor is the daemon's Disruptor on Node s.NodeName, built from the
// settings: the pods a change evicts (PodResources over
// s.PodResourcesSocket, the --gpu-client-selector pods) and how. plan
// --node-name previews with the same one (readNode nil: a GET).
func newDisruptor(client kclient.Interface, log *slog.Logger, s *settings.Settings,
	readNode func(context.Context) (*corev1.Node, error)) *drain.Disruptor {
	return &drain.Disruptor{Client: client, Log: log, Node: s.NodeName, Settings: s, OperandWait: 5 * time.Minute,
		ReadNode: readNode}
}

// holdNodeLease takes the node Lease, one agent per node across state dirs
// too (the journal lock covers one state dir), renewed while the agent
// runs; the daemon confirms it before every GPU-mutating step. Losing it
// cancels the context returned. release stops the renewal and returns the
// error that lost it, if any.
func holdNodeLease(ctx context.Context, d *reconcile.Daemon, client kclient.Interface, s *settings.Settings,
	log *slog.Logger) (_ context.Context, release func() error, err error) {
	ident, err := nodelease.NodeLeaseIdentity(s.StateDir)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	nl := &nodelease.NodeLease{Client: client, Namespace: s.Namespace, Node: s.NodeName, Identity: ident,
		Holder: fmt.Sprintf("host %s, pid %d, state dir %s, mig-agent %s", host, os.Getpid(), s.StateDir, version),
		Clock:  clock.RealClock{}, Log: log}
	if err := nl.Take(ctx); err != nil {
		return nil, nil, err
	}
	d.Owner = nl
	// The loss is the run's cause of cancellation: a change in progress
	// records it (reconcile's leaveIfLost), where a shutdown only parks.
	ctx, cancel := context.WithCancelCause(ctx)
	lost := make(chan error, 1)
	go func() {
		kerr := nl.Keep(ctx)
		if kerr != nil {
			log.Error("another agent holds this node; stopping", "err", kerr)
			cancel(kerr)
		}
		lost <- kerr
	}()
	return ctx, func() error { cancel(nil); return <-lost }, nil
}

// logHangups logs SIGHUP instead of dying of it (its default action): the
// settings are read at start, the config file at every pass, so there is
// nothing to reload.
func logHangups(ctx context.Context, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info("SIGHUP received: nothing to reload (settings are read at start, the config file at every pass)")
		}
	}
}

// bootID identifies this boot of the machine.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// simRebooter performs `sim reboot` on the state file (--reboot-method sim).
type simRebooter struct {
	path string
	log  *slog.Logger
}

func (r simRebooter) Reboot(_ context.Context, reason string) error {
	r.log.Info("simulated reboot", "reason", reason, "simState", r.path)
	return nvmlsim.Reboot(r.path)
}

// noReboot: --reboot-method none; someone else reboots.
type noReboot struct{}

func (noReboot) Reboot(context.Context, string) error { return nil }

type failingRebooter struct{ err error }

func (f failingRebooter) Reboot(context.Context, string) error {
	return fmt.Errorf("cannot reach logind over D-Bus: %w", f.err)
}

// newCDI is the CDI step of the daemon (nil: none). On simulated GPUs it
// runs only when asked for (--cdi=on): the host's CDI is not theirs.
func newCDI(s *settings.Settings, log *slog.Logger, units cdi.UnitStarter) reconcile.CDI {
	if s.CDI == cdi.ModeOff || strings.HasPrefix(s.NVML, "sim:") && s.CDI != cdi.ModeOn {
		return nil
	}
	mode := s.CDI
	if mode == "" {
		mode = cdi.ModeAuto
	}
	return &cdi.Refresher{Log: log, Mode: mode, SpecDir: s.CDISpecDir, DriverRoot: s.DriverRoot,
		DriverRootMount: s.DriverRootMount, ToolkitDirs: s.ToolkitDirs, HookPath: s.CDIHookPath, Units: units, Timeout: s.CommandTimeout}
}

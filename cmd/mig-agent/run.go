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
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/cdi"
	"github.com/migagent/mig-agent/drain"
	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/kube"
	"github.com/migagent/mig-agent/lease"
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

func runDaemon(ctx context.Context, s *settings.Settings, log *slog.Logger) (err error) {
	file, err := loadFile(s.ConfigFile)
	if err != nil {
		return err
	}
	hooks, err := gpus.LoadHooks(s.HooksFile)
	if err != nil {
		return badInput(err)
	}
	unlock, err := journal.Lock(s.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	jnl, err := journal.Open(s.StateDir)
	if errors.Is(err, journal.ErrCorrupt) {
		return badInput(err)
	}
	if err != nil {
		return err
	}
	m := metrics.New(version)
	notifier := systemd.NewNotifier(log)
	d := &reconcile.Daemon{
		S: s, Log: log, Notify: notifier, Metrics: metricsPort{m}, Journal: jnl, File: file,
		Clock: clock.RealClock{}, Version: version, BootID: bootID,
		Cluster: &standalone.Standalone{Config: s.SelectedConfig, Log: log},
	}
	if s.Standalone {
		// The hooks run around standalone changes only, as around
		// nvidia-mig-parted apply; the hooks file is checked either way.
		d.Hooks = hooks
	}
	var srv *http.Server
	if s.MetricsAddress != "" {
		// Listening before anything else: a taken port fails the start
		// rather than leaving an agent that no probe can see.
		l, err := net.Listen("tcp", s.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics address: %w", err)
		}
		srv = metrics.NewServer(s.MetricsAddress, m, d.Ready, d.Live)
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server failed", "address", s.MetricsAddress, "err", err)
			}
		}()
		defer srv.Close()
	}
	go logHangups(ctx, log)
	go notifier.RunWatchdog(ctx, func() bool { return true })

	// NVML is opened per pass (the daemon retries with backoff and is not
	// ready meanwhile); only a bad backend setting fails here.
	g, err := openBackend(s, log, true)
	for err != nil {
		var in inputError
		if errors.As(err, &in) {
			return err
		}
		m.SetNVMLUp(false)
		log.Error("NVML unavailable; retrying in 30s", "err", err)
		_ = notifier.Status("NVML unavailable: %v", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(30 * time.Second):
		}
		g, err = openBackend(s, log, true)
	}
	defer g.Close()
	d.GPU = g
	if sim, ok := g.(*nvmlx.Sim); ok {
		d.BootID = func() string { return fmt.Sprintf("sim-boot-%d", sim.BootCount()) }
	}

	switch s.RebootMethod {
	case settings.RebootSim:
		d.Reboot = simRebooter{path: s.SimState, log: log}
	case settings.RebootSystemctl:
		d.Reboot = systemd.NewSystemctlRebooter(nil)
	case settings.RebootNone:
		d.Reboot = noReboot{}
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
			defer conn.Close()
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

	var client kclient.Interface // nil standalone
	if !s.Standalone {
		cfg, err := kubeConfig(s.Kubeconfig)
		if err != nil {
			return fmt.Errorf("kubernetes client config: %w", err)
		}
		cfg.UserAgent = "mig-agent/" + version
		// client-go's default client-side limit (5/s, burst 10) turns the
		// ~20 calls of one change into seconds of waiting; the API server's
		// priority and fairness protects it. The kubelet uses the same.
		cfg.QPS, cfg.Burst = 50, 100
		client, err = kclient.New(cfg)
		if err != nil {
			return err
		}
		cluster := &kube.Cluster{Client: client, Node: s.NodeName, Namespace: s.Namespace, Clock: clock.RealClock{},
			Component: "mig-agent", DefaultConfig: s.DefaultConfig, Log: log}
		d.Cluster = cluster
		d.Disrupt = &drain.Disruptor{Client: client, Log: log, Node: s.NodeName, Settings: s, OperandWait: 5 * time.Minute,
			ReadNode: cluster.CachedNode}
		// The GPU Operator's ClusterPolicy is a custom resource: read it
		// as JSON into unstructured objects (no operator types in the agent).
		d.Others = &kube.Others{Client: client, Policies: kube.RESTClusterPolicies(client), Node: s.NodeName,
			Read: cluster.CachedNode}
		if s.MaxConcurrent > 0 || s.MaxConcurrentPercent > 0 {
			slots := &lease.Slots{Client: client, Namespace: s.Namespace, Holder: s.NodeName, N: s.MaxConcurrent, Percent: s.MaxConcurrentPercent,
				Duration: s.LeaseDuration, Clock: clock.RealClock{}, Log: log}
			d.Slots = slots
		}
	}
	if client != nil {
		// One agent per node across state dirs too (the lock above covers
		// one state dir): the node Lease, renewed while the agent runs.
		ident, ierr := lease.NodeLeaseIdentity(s.StateDir)
		if ierr != nil {
			return ierr
		}
		host, _ := os.Hostname()
		nl := &lease.NodeLease{Client: client, Namespace: s.Namespace, Node: s.NodeName, Identity: ident,
			Holder: fmt.Sprintf("host %s, pid %d, state dir %s, mig-agent %s", host, os.Getpid(), s.StateDir, version),
			Clock:  clock.RealClock{}, Log: log}
		if terr := nl.Take(ctx); terr != nil {
			return terr
		}
		d.Owner = nl // confirmed before every GPU-mutating step
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		lost := make(chan error, 1)
		go func() {
			kerr := nl.Keep(ctx)
			if kerr != nil {
				log.Error("another agent holds this node; stopping", "err", kerr)
				cancel()
			}
			lost <- kerr
		}()
		defer func() {
			cancel()
			if lerr := <-lost; lerr != nil && err == nil {
				err = lerr
			}
		}()
	}
	err = d.Run(ctx)
	_ = notifier.Stopping()
	if errors.Is(err, reconcile.ErrExitAfterReboot) {
		log.Info("simulated reboot done; exiting as if the machine went down")
		return nil
	}
	return err
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
		DriverRootMount: s.DriverRootMount, ToolkitDirs: s.ToolkitDirs, HookPath: s.CDIHookPath, Units: units}
}
